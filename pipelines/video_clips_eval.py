"""Video clips, evaluation: the centred clip of every video once, resized, centre-cropped.

::

    from dalistream.pipelines import video_clips_eval

    with video_clips_eval.loader("/data/val-{0000..0009}.tar", batch_size=8, frames=16, size=112) as loader:
        for batch in loader:
            logits = model(batch["video"])                  # (B, F, C, H, W)

:func:`~dalistream.pipelines.video_clips_train.loader` with ``train=False``: the clip centred in
each video (looped or padded as ``short`` says when the video is shorter), its frames' shorter
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
