"""Image–caption pairs for CLIP-style training: images decoded on the device, captions as ``str``.

::

    from dalistream.pipelines import image_text

    with image_text.loader("s3://bucket/laion-{00000..09999}.tar", batch_size=256, size=224) as loader:
        for batch in loader:
            tokens = tokenizer(batch["text"])          # a list of Python str
            image_features = model.encode_image(batch["image"])

A batch may come empty (every output's first dimension 0: ``exact``'s last step of a rank no
sample is left for, or every sample of the batch skipped with ``on_error="skip"``). A training
step still takes it — forward, a zero loss that keeps the graph (``out.sum() * 0.0``: a mean over no
sample is NaN), backward — so that under DDP every rank joins the gradient all-reduce
(docs/guide/training.md, "An empty batch"; ``warn_empty=True`` warns at each epoch's first).

Graph: ``fn.decoders.image_random_crop`` with a mild random-resized-crop (area 0.9–1, as
OpenCLIP trains) → resize to ``size`` × ``size`` → normalize with CLIP's mean/std. With
``train=False``: full decode → shorter side to ``size`` → centre crop. The caption member
(``txt``, else ``json``) travels as raw bytes and is turned into ``str`` on the torch side by
:func:`captions_to_str`; a JSON member gives its ``caption`` (or ``text``) value.

Outputs (``B`` = samples in the batch, ``S`` = ``size``):

=========  =====================================  ================  =============================
name       dtype                                  shape             device
=========  =====================================  ================  =============================
``image``  ``torch.float32`` (``float16``: fp16)  ``(B, 3, S, S)``  CUDA on a GPU stream, else CPU
``text``   ``str``                                list of ``B``     Python (host)
``key``    ``str`` (only with ``keys=True``)      list of ``B``     Python (host)
=========  =====================================  ================  =============================
"""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, Mapping, Optional, Sequence

import dalistream
from dalistream.config import WORKERS
from dalistream import ops

from .fields import evaluation_order, loader_options, merged_fields, with_read_fields

#: OpenAI CLIP's normalization, on the 0–255 scale.
CLIP_MEAN = (0.48145466 * 255, 0.4578275 * 255, 0.40821073 * 255)
CLIP_STD = (0.26862954 * 255, 0.26130258 * 255, 0.27577711 * 255)

#: The fields read from each sample (override with ``image_exts``/``text_exts``).
FIELDS = {"image": "jpg;jpeg;png;webp", "text": "txt;json"}


@dalistream.pipeline_def
def pipeline(stream: "dalistream.Stream", size: int = 224, train: bool = True,
             random_area: Sequence[float] = (0.9, 1.0), fp16: bool = False,
             mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD,
             decoder_options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The image–text graph; ``stream`` needs fields ``image`` and ``text`` (bytes); its other fields
    (``key``, …) are returned as read."""
    device = stream.device
    data = dalistream.read(stream)
    if train:
        images = ops.decode_images(data["image"], data["valid"], device, random_crop=True,
                                   random_area=random_area, padded=stream.may_pad, decoder_options=decoder_options)
        images = ops.random_resized_crop(images, device, (size, size))
        images = ops.normalize(images, device, mean=mean, std=std, fp16=fp16)
    else:
        images = ops.decode_images(data["image"], data["valid"], device, padded=stream.may_pad,
                                   decoder_options=decoder_options)
        images = ops.resize_shorter(images, device, size)
        images = ops.normalize(images, device, crop=(size, size), mean=mean, std=std, fp16=fp16)
    outputs = {"image": images, "text": data["text"]}
    return with_read_fields(outputs, data)


def caption_text(raw: bytes, keys: Sequence[str] = ("caption", "text")) -> str:
    """One caption member as ``str``: UTF-8 text, or the first of ``keys`` in a JSON object."""
    text = raw.decode("utf-8", errors="replace")
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except ValueError:
            return text
        if isinstance(value, dict):
            for key in keys:
                if isinstance(value.get(key), str):
                    return value[key]
    return text


def captions_to_str(batch: Dict[str, Any], field: str = "text",
                    keys: Sequence[str] = ("caption", "text")) -> Dict[str, Any]:
    """Loader transform: replace the caption bytes of ``batch[field]`` by ``str`` (see :func:`caption_text`)."""
    batch[field] = [caption_text(raw, keys) for raw in batch[field]]
    return batch


def loader(sources: Any, *, batch_size: int = 64, size: int = 224, workers: int = WORKERS, device: str = "auto",
           train: bool = True, fp16: bool = False, keys: bool = False, image_exts: str = FIELDS["image"],
           text_exts: str = FIELDS["text"], caption_keys: Sequence[str] = ("caption", "text"),
           shuffle: Optional[int] = None, dali_options: Optional[Mapping[str, Any]] = None,
           decoder_options: Optional[Mapping[str, Any]] = None, **stream_options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` over ``sources`` yielding ``{"image", "text"[, "key"]}``.

    ``shuffle`` and ``interleave`` mix the samples as :class:`dalistream.StreamConfig` says when
    training, and are off otherwise (``train=False``); ``keys=True`` adds each sample's
    ``__key__``. ``stream_options`` (but the Loader's own ``progress``, ``stats_dir``, ``wait_warning``,
    ``warn_empty``) go to :meth:`dalistream.Stream.open`, ``dali_options`` to
    the DALI pipeline.
    ``decoder_options`` go to DALI's image decoder (``dalistream.ops.DECODER_OPTIONS``: e.g.
    ``hw_decoder_load``, ``device_memory_padding``, ``preallocate_width_hint``; GPU-only ones are
    left out on the CPU).
    ``fields`` (optional) is merged over the defaults: an entry named ``image`` or ``text``
    replaces that field's spec (as ``image_exts``/``text_exts`` do), any other entry is read too
    and returned as read (e.g. ``fields={"key": "__key__"}`` adds each sample's key).
    """
    shown = loader_options(stream_options)  # progress, stats_dir, wait_warning, warn_empty: the Loader's own
    fields = merged_fields({"image": image_exts, "text": text_exts}, stream_options.pop("fields", None))
    if keys:
        fields["key"] = "__key__"
    if not train:  # evaluation: the order the shards hold
        shuffle = evaluation_order(stream_options, shuffle, every_sample=False)
    stream = dalistream.Stream.open(sources, fields=fields, batch_size=batch_size, workers=workers, device=device,
                                    shuffle=shuffle, **stream_options)
    transform = functools.partial(captions_to_str, keys=tuple(caption_keys))
    return dalistream.Loader(stream, pipeline, **shown, transform=transform, size=size, train=train, fp16=fp16,
                             decoder_options=dict(decoder_options or {}), **dict(dali_options or {}))
