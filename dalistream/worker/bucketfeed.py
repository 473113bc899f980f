"""A worker's batches under a bucket plan: each step's samples from its readers, held in the
look-ahead until the step that emits them.

:class:`BucketFeed` follows a :class:`~dalistream.plan.bucketworker.BucketRun`: the one
:class:`~.feed.Feed` reads each reader's rows as any column's (``reads[t]`` of each at step t:
up to the last sample the step emits from it, never further), keyed by reader and ordinal; the
rows wait in the feed's ``held`` samples until their step, which emits them in batch order at
positions ``offset[t]``, … . So a worker holds at most the plan's look-ahead of decoded samples
(besides the round the Feed reads ahead). A sample skipped by the error policy is not there when
its step comes: the step holds one sample fewer (padding at its end).
"""

from __future__ import annotations

from itertools import repeat
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..plan.bucketworker import BucketRun
from .feed import Feed
from .rows import Rows


class BucketFeed:
    """Each step's emitted samples of ``run`` from ``streams`` (one per reader, read from its
    ``start`` passing over ``gone``), ``n_fields`` per sample. ``most``: the most samples held at
    once, the step's own included (the plan's look-ahead bounds it)."""

    def __init__(self, run: BucketRun, streams: Sequence[Iterator[Rows]], n_fields: int,
                 bytes_per_sample: Optional[float] = None, first_batch: bool = False) -> None:
        self.run = run
        self.n_fields = n_fields
        self.feed = Feed(streams, run.reads, n_fields, run.first, bytes_per_sample, first_batch, keyed=True)
        self.held: dict = {}
        self.most = 0

    def take(self, step: int) -> Tuple[List[Sequence], int]:
        """Step ``step``'s samples (the steps are taken in order), one sequence per field, in
        batch order, and how many."""
        values, _, _ = self.feed.take(step)
        keys = values.pop()
        held = self.held
        held.update(zip(keys, zip(*values)))
        self.most = max(self.most, len(held))
        rows = [row for row in map(held.pop, self.run.emitted(step).tolist(), repeat(None)) if row is not None]
        if not rows:
            return [() for _ in range(self.n_fields)], 0
        return list(zip(*rows)), len(rows)


def bucket_column(bucket: int, batch_size: int, filled: bool) -> np.ndarray:
    """What a worker ships of its step's ``bucket``: the index at every position of the batch when
    ``filled`` (one worker of the rank), zeros otherwise; summed over the workers in the graph,
    every position holds it, padding included (the graph reads the bucket's sizes off it)."""
    return np.full(batch_size, bucket if filled else 0, np.int32)
