"""Elastic resume of a bucket plan: the rest of an epoch after *segments* that ran under other
layouts, planned over a new one. A segment is ``(world_size, workers, batch_size, steps)``, as
in :mod:`.resume`, so the loader's state stays a few integers per layout change.

What a segment delivered is known from the plan alone: the samples of its first ``steps``
batches on every rank (:meth:`~.buckets.BucketEpoch.rank_batches`). Segment 0 plans the whole
epoch sequence; segment ``k`` plans the positions left after segments ``0 … k-1`` (those it had
left out under ``even`` included) with the same rules (:class:`~.buckets.BucketEpoch` with
``positions``), so a chain of segments delivers every sample once under ``exact`` and none twice
under ``even``, and every batch of every segment is one bucket.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..errors import StateError
from .buckets import BucketEpoch
from .layout import Layout, Schedule
from .resume import Segment, check_segments, segment_layout


def remaining_positions(counts: Sequence[int], ids: np.ndarray, buckets: int, schedule: Schedule, epoch: int,
                        per: str, segments: Sequence[Segment]) -> Optional[np.ndarray]:
    """Epoch positions not delivered by ``segments`` (sorted), or ``None`` without segments."""
    positions: Optional[np.ndarray] = None
    for k, segment in enumerate(check_segments(segments)):
        layout, ran = segment_layout(segment), int(segment[3])
        plan = BucketEpoch(counts, ids, buckets, layout, schedule, epoch, per, positions)
        if ran > plan.steps:
            raise StateError(f"segment {k} ran {ran} steps of a bucket plan of {plan.steps} under {layout.world_size} "
                             f"ranks x {layout.workers} workers x batch {layout.batch_size}",
                             hint="the state does not come from this data set and these buckets")
        done = plan.rank_batches()[:, :ran]
        positions = np.setdiff1d(plan.positions, done[done >= 0])  # sorted
    return positions


def resumed_bucket_plan(counts: Sequence[int], ids: np.ndarray, buckets: int, layout: Layout, schedule: Schedule,
                        epoch: int, per: str, segments: Sequence[Segment],
                        lookahead: Optional[int] = None) -> BucketEpoch:
    """The rest of ``epoch`` after ``segments``, planned over ``layout`` (its ``steps`` are what
    every rank runs; :meth:`~.buckets.BucketEpoch.worker` gives each worker's plan)."""
    rest = remaining_positions(counts, ids, buckets, schedule, epoch, per, segments)
    return BucketEpoch(counts, ids, buckets, layout, schedule, epoch, per, rest, lookahead)
