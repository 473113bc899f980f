"""Training by aspect ratio: every batch one aspect bucket, its images resized to the bucket's size.

::

    import dalistream
    from dalistream.pipelines import aspect_bucket_train

    buckets = dalistream.AspectBuckets([(1024, 1024), (1152, 896), (896, 1152), (1344, 768), (768, 1344)])
    with aspect_bucket_train.loader("/data/train-{0000..1023}.tar", batch_size=32, buckets=buckets) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                images = batch["image"]        # (B, 3, H, W): (H, W) this batch's bucket

A batch may come empty (every output's first dimension 0: ``exact``'s last step of a rank no
sample is left for, or every sample of the batch skipped with ``on_error="skip"``). A training
step still takes it — forward, a zero loss that keeps the graph (``out.sum() * 0.0``: a mean over no
sample is NaN), backward — so that under DDP every rank joins the gradient all-reduce
(docs/guide/training.md, "An empty batch"; ``warn_empty=True`` warns at each epoch's first).

The shards need per-sample keys in their manifest (``dalistream index SOURCES --keys image``, or
shards written by ``dalistream write``). Graph (one switch, ``stream.device``; on a GPU the
decoder runs ``mixed``, the rest ``gpu``): ``fn.decoders.image`` → resize, keeping the aspect
ratio, to cover the batch's bucket (``bucket_height`` × ``bucket_width``, one per sample, the same
in the whole batch) times a random factor in ``scale`` → optional colour jitter →
``crop_mirror_normalize``: a crop of exactly the bucket's size at a random place, a random
horizontal flip, ImageNet mean/std, ``CHW``. An image is cropped by the gap between its aspect
ratio and its bucket's (a few percent: :mod:`dalistream.buckets`), never squashed.

Outputs (``B`` = samples in the batch, ``H`` × ``W`` = its bucket's size):

=================  =====================================  ================  =============================
name               dtype                                  shape             device
=================  =====================================  ================  =============================
``image``          ``torch.float32`` (``float16``: fp16)  ``(B, 3, H, W)``  CUDA on a GPU stream, else CPU
``label``          ``torch.int64`` (when read)            ``(B,)``          CUDA on a GPU stream, else CPU
``bucket``         ``torch.int32``                        ``(B,)``          CPU
``bucket_height``  ``torch.int32``: ``H``                 ``(B,)``          CPU
``bucket_width``   ``torch.int32``: ``W``                 ``(B,)``          CPU
=================  =====================================  ================  =============================
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import dalistream
from dalistream.config import WORKERS
from dalistream.errors import ConfigError
from dalistream import ops

from .fields import loader_options, merged_fields, with_read_fields

#: The fields read from each sample (override with ``image_exts``/``label_exts``; ``label_exts=None``
#: reads no label).
FIELDS = {"image": "jpg;jpeg;png;webp", "label": "cls"}


@dalistream.pipeline_def
def pipeline(stream: "dalistream.Stream", flip: bool = True, scale: Sequence[float] = (1.0, 1.1),
             color_jitter: bool = False, fp16: bool = False, mean: Sequence[float] = ops.IMAGENET_MEAN,
             std: Sequence[float] = ops.IMAGENET_STD, decoder_options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The training graph; ``stream`` must be opened with :class:`~dalistream.AspectBuckets` and
    have a field ``image`` (encoded bytes); a ``label`` (int) goes to the device, its other fields
    and the bucket's outputs are returned as read."""
    from nvidia.dali import fn

    device = stream.device
    data = dalistream.read(stream)
    height, width = ops.bucket_size(data)
    images = ops.decode_images(data["image"], data["valid"], device, padded=stream.may_pad,
                               decoder_options=decoder_options)
    factor = fn.random.uniform(range=list(scale)) if tuple(scale) != (1.0, 1.0) else None
    images = ops.resize_cover(images, device, height, width, factor)
    if color_jitter:
        images = ops.color_jitter(images, device)
    mirror = ops.coin_flip(0.5) if flip else None
    images = ops.normalize(images, device, crop=(height, width), random_crop=True, mirror=mirror, mean=mean,
                           std=std, fp16=fp16)
    outputs = {"image": images}
    if "label" in data:
        outputs["label"] = ops.to_device(data["label"], device)
    return with_read_fields(outputs, data)


def loader(sources: Any, *, batch_size: int = 32, workers: int = WORKERS, device: str = "auto",
           buckets: Optional["dalistream.AspectBuckets"] = None, flip: bool = True, scale: Sequence[float] = (1.0, 1.1),
           color_jitter: bool = False, fp16: bool = False, image_exts: str = FIELDS["image"],
           label_exts: Optional[str] = FIELDS["label"], dali_options: Optional[Mapping[str, Any]] = None,
           decoder_options: Optional[Mapping[str, Any]] = None, **stream_options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` over ``sources`` running :func:`pipeline`, batched by
    ``buckets`` (default ``AspectBuckets.auto(8)``: eight sizes of about a megapixel computed from
    the data set's aspect ratios).

    ``scale``: the range of the random factor the bucket's size is scaled by before the random
    crop of exactly that size (``(1, 1)``: the crop runs along the image's longer side only).
    ``stream_options`` (but the Loader's own ``progress``, ``stats_dir``, ``wait_warning``,
    ``warn_empty``) go to :meth:`dalistream.Stream.open` (``seed``, ``policy``, ``rank``, ``world_size``, ``manifest``,
    ``storage_options``, …; policy ``even`` by default, ``exact`` pads each bucket's last batch).
    ``dali_options`` go to the DALI pipeline (``num_threads``, ``prefetch_queue_depth``),
    ``decoder_options`` to DALI's image decoder (``dalistream.ops.DECODER_OPTIONS``).
    ``fields`` (optional) is merged over the defaults: an entry named ``image`` or ``label``
    replaces that field's spec, any other entry is read too and returned as read.
    """
    buckets = dalistream.AspectBuckets.auto(8) if buckets is None else buckets
    if not isinstance(buckets, dalistream.AspectBuckets):
        raise ConfigError(f"aspect_bucket_train: buckets must be a dalistream.AspectBuckets, got {buckets!r}",
                          hint="for lengths use dalistream.pipelines.caption_buckets")
    shown = loader_options(stream_options)  # progress, stats_dir, wait_warning, warn_empty: the Loader's own
    defaults = {"image": image_exts, **({"label": label_exts} if label_exts else {})}
    fields = merged_fields(defaults, stream_options.pop("fields", None))
    stream = dalistream.Stream.open(sources, fields=fields, batch_size=batch_size, workers=workers, device=device,
                                    buckets=buckets, **stream_options)
    return dalistream.Loader(stream, pipeline, **shown, flip=flip, scale=tuple(scale), color_jitter=color_jitter,
                             fp16=fp16, decoder_options=dict(decoder_options or {}), **dict(dali_options or {}))
