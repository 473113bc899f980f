"""Image classification, evaluation: decode, resize the shorter side, centre crop, normalize.

::

    from dalistream.pipelines import classification_eval

    with classification_eval.loader("/data/val-{0000..0063}.tar", batch_size=100, size=224) as loader:
        for batch in loader:          # every sample exactly once (policy "exact")
            logits = model(batch["image"])

Graph: ``fn.decoders.image`` (``mixed`` on a GPU) → resize so the shorter side is ``resize``
(default ``size / 0.875``, 256 for 224) → ``crop_mirror_normalize`` (centre ``size`` × ``size``
crop, ImageNet mean/std, ``CHW``). The stream policy defaults to ``exact``: every sample is seen
once per epoch, across all ranks; the last batches of a rank can be smaller (padding is
trimmed by the loader), and ranks can get different numbers of batches.

Outputs (``B`` = samples in the batch, ``S`` = ``size``):

=========  =====================================  ================  =============================
name       dtype                                  shape             device
=========  =====================================  ================  =============================
``image``  ``torch.float32`` (``float16``: fp16)  ``(B, 3, S, S)``  CUDA on a GPU stream, else CPU
``label``  ``torch.int64``                        ``(B,)``          CUDA on a GPU stream, else CPU
=========  =====================================  ================  =============================
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import dalistream
from dalistream.config import WORKERS
from dalistream import ops

from .fields import loader_options, merged_fields, with_read_fields

#: The fields read from each sample (override with ``image_exts``/``label_exts``).
FIELDS = {"image": "jpg;jpeg;png;webp", "label": "cls"}


def default_resize(size: int) -> int:
    """The shorter side before the centre crop: ``size / 0.875`` (224 → 256)."""
    return int(round(size / 0.875))


@dalistream.pipeline_def
def pipeline(stream: "dalistream.Stream", size: int = 224, resize: Optional[int] = None, fp16: bool = False,
             mean: Sequence[float] = ops.IMAGENET_MEAN, std: Sequence[float] = ops.IMAGENET_STD,
             decoder_options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The evaluation graph; ``stream`` must have fields ``image`` (encoded bytes) and ``label`` (int);
    its other fields are returned as read."""
    device = stream.device
    shorter = default_resize(size) if resize is None else resize
    data = dalistream.read(stream)
    images = ops.decode_images(data["image"], data["valid"], device, padded=stream.may_pad,
                               decoder_options=decoder_options)
    images = ops.resize_shorter(images, device, shorter)
    images = ops.normalize(images, device, crop=(size, size), mean=mean, std=std, fp16=fp16)
    outputs = {"image": images, "label": ops.to_device(data["label"], device)}
    return with_read_fields(outputs, data)


def loader(sources: Any, *, batch_size: int = 64, size: int = 224, workers: int = WORKERS, device: str = "auto",
           resize: Optional[int] = None, fp16: bool = False, image_exts: str = FIELDS["image"],
           label_exts: str = FIELDS["label"], policy: str = "exact",
           dali_options: Optional[Mapping[str, Any]] = None, decoder_options: Optional[Mapping[str, Any]] = None,
           **stream_options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` over ``sources`` running :func:`pipeline` (no shuffling).

    ``stream_options`` (but the Loader's own ``progress``, ``stats_dir``, ``wait_warning``,
    ``warn_empty``) go to :meth:`dalistream.Stream.open` (``rank``, ``world_size``,
    ``storage_options``, ``manifest``, …); ``dali_options`` to the DALI pipeline.
    ``decoder_options`` go to DALI's image decoder (``dalistream.ops.DECODER_OPTIONS``: e.g.
    ``hw_decoder_load``, ``device_memory_padding``, ``preallocate_width_hint``; GPU-only ones are
    left out on the CPU).
    ``fields`` (optional) is merged over the defaults: an entry named ``image`` or ``label``
    replaces that field's spec (as ``image_exts``/``label_exts`` do), any other entry is read too
    and returned as read (e.g. ``fields={"key": "__key__"}`` adds each sample's key).
    """
    if resize is not None and resize < size:
        raise dalistream.ConfigError(f"resize {resize} is smaller than the crop size {size}")
    shown = loader_options(stream_options)  # progress, stats_dir, wait_warning, warn_empty: the Loader's own
    fields = merged_fields({"image": image_exts, "label": label_exts}, stream_options.pop("fields", None))
    stream = dalistream.Stream.open(sources, fields=fields,
                                    batch_size=batch_size, workers=workers, device=device, policy=policy,
                                    **stream_options)
    return dalistream.Loader(stream, pipeline, **shown, size=size, resize=resize, fp16=fp16,
                             decoder_options=dict(decoder_options or {}), **dict(dali_options or {}))
