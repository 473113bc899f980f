"""A worker's batches under a bucket plan: each step's samples from its readers, held in the
look-ahead until the step that emits them.

:class:`BucketFeed` follows a :class:`~dalistream.plan.bucketworker.BucketRun`: its feed reads each
reader's rows as any column's (``reads[t]`` of each at step t: up to the last sample the step emits
from it, never further), keyed by reader and ordinal (:class:`~.epochfeed.EpochShares`: a step a
round where the epoch is read at once, a round of steps by the column path); the round's rows and
those held from earlier rounds form a pool in which every emission of the round is found at once, and each step
takes its samples from it in batch order, at positions ``offset[t]``, … . So a worker holds at most
the plan's look-ahead of decoded samples (besides the round the columns read ahead). A sample skipped
by the error policy is not there when its step comes: the step holds one sample fewer (padding at
its end).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from ..plan.bucketworker import BucketRun
from .epochfeed import EpochShares
from .rows import gather


class BucketFeed:
    """Each step's emitted samples of ``run`` from ``feed``'s keyed rounds (its readers' rows,
    :meth:`~.epochfeed.EpochShares.round_of`), ``n_fields`` per sample. ``held``: the keys of the samples
    read in earlier rounds and not yet emitted; ``most``: the most samples held at once, the
    step's own included (the plan's look-ahead bounds it).

    It works a round of the feed's steps at a time: the round's rows and those held from earlier
    rounds form a pool, every emission of the round is found in it at once (one sort and search
    of keys, not a dictionary's work per sample), and a step's samples are one gather per field."""

    def __init__(self, run: BucketRun, feed: EpochShares, n_fields: int) -> None:
        self.run = run
        self.feed = feed  # (keyed rounds)
        self.held: List[int] = []
        self._held_rows: List[list] = [[] for _ in range(n_fields)]
        self.most = 0
        self._t0 = self._t1 = run.first
        self._pool: List[list] = []
        self._index: List[int] = []
        self._bounds = np.zeros(1, np.int64)

    def take(self, step: int) -> Tuple[List[Sequence], int]:
        """Step ``step``'s samples (the steps are taken in order), one sequence per field, in
        batch order, and how many."""
        if step >= self._t1:
            self._next_round(step)
        lo, hi = int(self._bounds[step - self._t0]), int(self._bounds[step - self._t0 + 1])
        return gather(self._pool, self._index[lo:hi]), hi - lo

    def _next_round(self, step: int) -> None:
        run = self.run
        t0, t1, flat, reads = self.feed.round_of(step)
        keys = flat.pop()
        self._pool = [old + new for old, new in zip(self._held_rows, flat)]
        pool_keys = np.asarray(self.held + keys, dtype=np.int64)
        emitted = run.emit[run.bounds[t0]:run.bounds[t1]]
        by_key = np.argsort(pool_keys)
        at = np.minimum(np.searchsorted(pool_keys[by_key], emitted), max(len(pool_keys) - 1, 0))
        # (an emission not in the pool: skipped by the error policy; its step holds one fewer)
        found = pool_keys[by_key[at]] == emitted if len(pool_keys) else np.zeros(len(emitted), bool)
        index = by_key[at[found]]
        step_of = np.repeat(np.arange(t1 - t0), np.diff(run.bounds[t0:t1 + 1]))[found]
        self._bounds = np.searchsorted(step_of, np.arange(t1 - t0 + 1))
        self._index = index.tolist()
        # held at each step, its own included: those held before, the rows read up to it, less
        # those emitted before it
        self.most = max(self.most, int((len(self.held) + np.cumsum(reads) - self._bounds[:-1]).max(initial=0)))
        rest = np.ones(len(pool_keys), bool)
        rest[index] = False
        left = np.flatnonzero(rest).tolist()
        self.held = pool_keys[left].tolist()
        self._held_rows = [[values[i] for i in left] for values in self._pool]
        self._t0, self._t1 = t0, t1


def bucket_column(bucket: int, batch_size: int, filled: bool) -> np.ndarray:
    """What a worker ships of its step's ``bucket``: the index at every position of the batch when
    ``filled`` (one worker of the rank), zeros otherwise; summed over the workers in the graph,
    every position holds it, padding included (the graph reads the bucket's sizes off it)."""
    return np.full(batch_size, bucket if filled else 0, np.int32)
