"""Video clips, evaluation: the centred clip (or N evenly spaced clips) of every video once, resized, centre-cropped.

::

    from dalistream.pipelines import video_clips_eval

    with video_clips_eval.loader("/data/val-{0000..0009}.tar", batch_size=8, frames=16, size=112) as loader:
        for batch in loader:
            logits = model(batch["video"])                  # (B, F, C, H, W)

    # clip-averaged: 5 clips a video at 8 fps, evenly spaced over it
    with video_clips_eval.loader("/data/val-{0000..0009}.tar", frames=16, fps=8, per_video=5) as loader:
        for batch in loader:
            clips = batch["video"]                          # (B, 5, F, C, H, W)
            logits = model(clips.flatten(0, 1)).unflatten(0, clips.shape[:2]).mean(dim=1)

:func:`~dalistream.pipelines.video_clips_train.loader` with ``train=False``: the clip centred in
each video (looped or padded as ``short`` says when the video is shorter; with ``per_video=N``,
N clips whose starts are evenly spaced from the first that fits to the last, laid out
``(B, N, F, C, H, W)``), its frames' shorter
side resized to ``resize`` (default ``size``), centre crop, normalize; no shuffle, policy
``exact`` (every sample once across ranks). Outputs as
:mod:`~dalistream.pipelines.video_clips_train`'s.
"""

from __future__ import annotations

from typing import Any

import dalistream

from .video_clips_train import FIELDS, clip_field, loader as _train_loader, pipeline

__all__ = ["FIELDS", "clip_field", "loader", "pipeline"]


def loader(sources: Any, **options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` of centred clips, every sample once (module doc); ``options``
    as :func:`dalistream.pipelines.video_clips_train.loader`'s."""
    options.setdefault("batch_size", 8)
    return _train_loader(sources, train=False, **options)
