"""Video clips, training: a clip per video drawn from (seed, epoch, key), resized, cropped at random, flipped.

::

    from dalistream.pipelines import video_clips_train

    with video_clips_train.loader("/data/clips-{0000..0099}.tar", batch_size=8, frames=16, stride=2,
                                  size=112) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                clips, captions = batch["video"], batch["text"]   # (B, F, C, H, W) float, list of str

Each clip is ``frames`` frames ``stride`` source frames apart, or ``fps``: at that frame rate
whatever each video's own (the frames shown at times ``1 / fps`` apart, from the video's time
stamps); its first frame is drawn in the worker from ``(seed, epoch, key)``
(:class:`dalistream.kinds.video.Clips`), so a resumed run, an elastic resume or another worker
count decode the same clips. ``per_video=N``: N clips a video, drawn from
``(seed, epoch, key, i)`` (evenly spaced for evaluation), cropped and flipped alike. A video
shorter than the clip's span is looped (``short="loop"``), padded with its last frame
(``"edge"``) or with black frames (``"black"``). ``decode`` says where frames are decoded: ``"dali"`` (``fn.decoders.video``:
``mixed``/NVDEC on a GPU, any codec it has; on the CPU, VP8/VP9/MJPEG only: other codecs are
named ``unsupported_codec`` errors), ``"worker"`` (PyAV in the DALI worker processes, any codec
FFmpeg decodes) or ``"auto"`` (``"dali"`` on a GPU, ``"worker"`` on the CPU).

Graph (one switch, ``stream.device``): decode the clip → resize every frame's shorter side to
``resize`` → crop ``size`` × ``size`` at one random place per clip, random horizontal flip per
clip, normalize (ImageNet mean/std on the 0–255 scale) → ``FCHW``.

Outputs (``B`` = samples in the batch, ``F`` = ``frames``, ``S`` = ``size``):

=========  =====================================  ===================  =============================
name       dtype                                  shape                device
=========  =====================================  ===================  =============================
``video``  ``torch.float32`` (``float16``: fp16)  ``(B, F, 3, S, S)``  CUDA on a GPU stream, else CPU
           (``per_video=N``: ``(B, N, F, 3, S, S)``)
``text``   ``str`` (the caption: ``txt``/``json``) list of ``B``        Python (host)
=========  =====================================  ===================  =============================
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Optional, Sequence

import dalistream
from dalistream import ops
from dalistream.config import WORKERS, StreamConfig
from dalistream.kinds.video import Clips

from .fields import evaluation_order, loader_options, merged_fields, with_read_fields
from .image_text import captions_to_str

#: The fields read from each sample (override with ``video_exts``/``text_exts``).
FIELDS = {"video": "mp4;webm;mkv;mov", "text": "txt;json"}
DECODE_PLACES = ("auto", "dali", "worker")


@dalistream.pipeline_def
def pipeline(stream: "dalistream.Stream", frames: int = 8, size: int = 112, resize: Optional[int] = None,
             train: bool = True, flip: bool = True, decode: str = "dali", fp16: bool = False,
             mean: Sequence[float] = ops.IMAGENET_MEAN, std: Sequence[float] = ops.IMAGENET_STD,
             per_video: int = 1) -> Dict[str, Any]:
    """The clip graph; ``stream`` must have a ``video`` field of :class:`Clips` (``frames``,
    ``decode``, ``per_video`` as here); its other fields are returned as read. ``train=False``:
    centre crop, no flip. ``per_video`` > 1: the video's clips decoded as one sequence, cropped
    and flipped alike, then laid out ``(N, F, C, H, W)``."""
    device = stream.device
    data = dalistream.read(stream)
    clips = ops.decode_clips(data["video"], data["valid"], device, per_video * frames, decode=decode,
                             padded=stream.may_pad)
    clips = ops.resize_clips(clips, device, resize or size)
    mirror = ops.coin_flip(0.5) if train and flip else None
    clips = ops.normalize_clips(clips, device, (size, size), random_crop=train, mirror=mirror, mean=mean, std=std,
                                fp16=fp16)
    if per_video > 1:
        clips = ops.split_clips(clips, per_video, frames, size)
    return with_read_fields({"video": clips}, data)


def clip_field(exts: str, clips: Clips) -> Dict[str, Any]:
    """A ``video`` field spec that reads clips as ``clips`` says."""
    return {"exts": exts, "kind": "video", "ndim": clips.ndim, "decoder": clips}


def loader(sources: Any, *, batch_size: int = 8, frames: int = 8, stride: int = 1, fps: Optional[float] = None,
           per_video: int = 1, size: int = 112,
           resize: Optional[int] = None, short: str = "loop", decode: str = "auto", train: bool = True,
           workers: int = WORKERS, device: str = "auto", flip: bool = True, fp16: bool = False,
           video_exts: str = FIELDS["video"], text_exts: Optional[str] = FIELDS["text"],
           caption_keys: Sequence[str] = ("caption", "text"), shuffle: Optional[int] = None,
           dali_options: Optional[Mapping[str, Any]] = None, **stream_options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` over ``sources`` yielding ``{"video"[, "text"]}`` (module doc).

    ``stride``: source frames between two taken, or ``fps``: the clip's frame rate (per video,
    from its frame times); ``per_video``: clips a video (``video`` then ``(B, N, F, C, H, W)``).
    ``resize``: the shorter side before the crop (default ``size``). ``text_exts=None`` reads no
    caption. ``train=False`` (what :mod:`~dalistream.pipelines.video_clips_eval` passes): centred
    clips, centre crop, no flip, no shuffle, policy ``exact`` unless given.
    ``stream_options`` (but the Loader's own ``progress``, ``stats_dir``, ``wait_warning``) go to
    :meth:`dalistream.Stream.open` (``seed``, ``policy``, ``on_error``, ``rank``, …),
    ``dali_options`` to the DALI pipeline. ``fields`` (optional) is merged over the defaults.
    """
    if decode not in DECODE_PLACES:
        raise dalistream.ConfigError(f"decode must be one of {DECODE_PLACES}, got {decode!r}")
    if resize is not None and resize < size:
        raise dalistream.ConfigError(f"resize {resize} is smaller than the crop size {size}")
    shown = loader_options(stream_options)  # progress, stats_dir, wait_warning: the Loader's own
    where, _ = ops.resolve_device(device, stream_options.get("device_id"))
    if decode == "auto":
        decode = "dali" if where == "gpu" else "worker"
    clips = Clips(frames=frames, stride=stride, fps=fps, per_video=per_video, train=train, short=short, decode=decode,
                  device=where, seed=stream_options.get("seed", StreamConfig.seed))
    defaults: Dict[str, Any] = {"video": clip_field(video_exts, clips)}
    if text_exts:
        defaults["text"] = text_exts
    fields = merged_fields(defaults, stream_options.pop("fields", None))
    if not train:  # evaluation: the order the shards hold, every clip once
        shuffle = evaluation_order(stream_options, shuffle)
    stream = dalistream.Stream.open(sources, fields=fields, batch_size=batch_size, workers=workers, device=where,
                                    shuffle=shuffle, **stream_options)
    transform = functools.partial(captions_to_str, keys=tuple(caption_keys)) if "text" in fields else None
    return dalistream.Loader(stream, pipeline, **shown, transform=transform, frames=frames, size=size, resize=resize,
                             train=train, flip=flip, decode=decode, fp16=fp16, per_video=per_video,
                             **dict(dali_options or {}))
