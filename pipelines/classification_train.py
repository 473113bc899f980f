"""Image classification, training: random-resized-crop fused into the decode, flip, jitter, normalize.

::

    from dalistream.pipelines import classification_train

    with classification_train.loader("/data/train-{0000..1023}.tar", batch_size=64, size=224) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                images, labels = batch["image"], batch["label"]
                out = model(images)
                loss = criterion(out, labels) if len(labels) else out.sum() * 0.0   # an empty batch: below

A batch may come empty (every output's first dimension 0: ``exact``'s last step of a rank no
sample is left for, or every sample of the batch skipped with ``on_error="skip"``). A training
step still takes it — forward, a zero loss that keeps the graph (``out.sum() * 0.0``: a mean over no
sample is NaN), backward — so that under DDP every rank joins the gradient all-reduce
(docs/guide/training.md, "An empty batch"; ``warn_empty=True`` warns at each epoch's first).

Graph (one switch, ``stream.device``; on a GPU the decoder runs ``mixed``, the rest ``gpu``):
``fn.decoders.image_random_crop`` (only the random window is decoded) → resize to ``size`` ×
``size`` → optional colour jitter → ``crop_mirror_normalize`` (random horizontal flip, ImageNet
mean/std, ``CHW``).

Outputs (``B`` = samples in the batch, ``S`` = ``size``):

=========  =====================================  ================  =============================
name       dtype                                  shape             device
=========  =====================================  ================  =============================
``image``  ``torch.float32`` (``float16``: fp16)  ``(B, 3, S, S)``  CUDA on a GPU stream, else CPU
``label``  ``torch.int64``                        ``(B,)``          CUDA on a GPU stream, else CPU
=========  =====================================  ================  =============================

Images are RGB whatever the file holds (grayscale, CMYK, PNG), normalized as
``(pixel - mean) / std`` with ``mean``/``std`` on the 0–255 scale (default ImageNet's).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import dalistream
from dalistream.config import WORKERS
from dalistream import ops

from .fields import loader_options, merged_fields, with_read_fields

#: The fields read from each sample (override with ``image_exts``/``label_exts``).
FIELDS = {"image": "jpg;jpeg;png;webp", "label": "cls"}


@dalistream.pipeline_def
def pipeline(stream: "dalistream.Stream", size: int = 224, flip: bool = True, color_jitter: bool = False,
             fp16: bool = False, random_area: Sequence[float] = (0.08, 1.0),
             random_aspect_ratio: Sequence[float] = (3 / 4, 4 / 3),
             mean: Sequence[float] = ops.IMAGENET_MEAN, std: Sequence[float] = ops.IMAGENET_STD,
             decoder_options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The training graph; ``stream`` must have fields ``image`` (encoded bytes) and ``label`` (int);
    its other fields are returned as read."""
    device = stream.device
    data = dalistream.read(stream)
    images = ops.decode_images(data["image"], data["valid"], device, random_crop=True, random_area=random_area,
                               random_aspect_ratio=random_aspect_ratio, padded=stream.may_pad,
                               decoder_options=decoder_options)
    images = ops.random_resized_crop(images, device, (size, size))
    if color_jitter:
        images = ops.color_jitter(images, device)
    mirror = ops.coin_flip(0.5) if flip else None
    images = ops.normalize(images, device, mirror=mirror, mean=mean, std=std, fp16=fp16)
    outputs = {"image": images, "label": ops.to_device(data["label"], device)}
    return with_read_fields(outputs, data)


def loader(sources: Any, *, batch_size: int = 64, size: int = 224, workers: int = WORKERS, device: str = "auto",
           flip: bool = True, color_jitter: bool = False, fp16: bool = False,
           random_area: Sequence[float] = (0.08, 1.0), image_exts: str = FIELDS["image"],
           label_exts: str = FIELDS["label"], shuffle: Optional[int] = None,
           dali_options: Optional[Mapping[str, Any]] = None, decoder_options: Optional[Mapping[str, Any]] = None,
           **stream_options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` over ``sources`` running :func:`pipeline`.

    ``shuffle`` and ``interleave`` (in ``stream_options``) mix the samples as
    :class:`dalistream.StreamConfig` says (default: interleaved reading, no buffer, when counts are
    known). ``stream_options`` (but the Loader's own ``progress``, ``stats_dir``, ``wait_warning``,
    ``warn_empty``) go to :meth:`dalistream.Stream.open` (``seed``, ``policy``, ``rank``, ``world_size``,
    ``storage_options``, ``manifest``, …; policy ``even`` by default). ``dali_options`` go to the
    DALI pipeline (``num_threads``, ``prefetch_queue_depth``).
    ``decoder_options`` go to DALI's image decoder (``dalistream.ops.DECODER_OPTIONS``: e.g.
    ``hw_decoder_load``, ``device_memory_padding``, ``preallocate_width_hint``; GPU-only ones are
    left out on the CPU).
    ``fields`` (optional) is merged over the defaults: an entry named ``image`` or ``label``
    replaces that field's spec (as ``image_exts``/``label_exts`` do), any other entry is read too
    and returned as read (e.g. ``fields={"key": "__key__"}`` adds each sample's key).
    """
    shown = loader_options(stream_options)  # progress, stats_dir, wait_warning, warn_empty: the Loader's own
    fields = merged_fields({"image": image_exts, "label": label_exts}, stream_options.pop("fields", None))
    stream = dalistream.Stream.open(sources, fields=fields,
                                    batch_size=batch_size, workers=workers, device=device, shuffle=shuffle,
                                    **stream_options)
    return dalistream.Loader(stream, pipeline, **shown, size=size, flip=flip, color_jitter=color_jitter, fp16=fp16,
                             random_area=tuple(random_area), decoder_options=dict(decoder_options or {}),
                             **dict(dali_options or {}))
