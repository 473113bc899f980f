"""Mixing weighted sources with buckets: each batch one source *and* one bucket.

A stratified mix (``per_batch="sample"``) puts about ``p_s·B`` samples of every source in every
batch. With buckets every batch must also hold one bucket, so each source would need its bucket
counts in the proportion of the weights in every bucket — the same bucket distribution in every
source, which real sources (web photos and book scans, say) do not have. Rather than pad or drop
whatever does not fit, that combination is refused (:func:`check_bucket_mix`).

With ``per_batch="source"`` the two hold together exactly: the mix deals whole batches to the
sources by Tijdeman's rule (:func:`~.mix.cumulative`: after any number of steps each source is
within one batch of its weight), and a source's batches are the batches of its own bucket plan
(:class:`~.buckets.BucketEpoch`, over its own samples, with the mix's layout), taken in its plan's
order. The epoch is the largest number of steps for which no source runs past its plan's steps
(the same on every rank); what a source's plan holds beyond its share is left out of the epoch.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from .buckets import BucketEpoch, BucketWorkerPlan
from .bucketseq import BucketIndex
from .layout import Layout, Schedule
from .mix import check_share, cumulative


def check_bucket_mix(per_batch: str, samples_per_epoch: Optional[int] = None) -> None:
    """Raise for a mix that cannot be bucketed (see the module doc)."""
    if per_batch == "sample":
        raise ConfigError("buckets with a stratified mix (per_batch='sample') cannot hold both: every batch would need "
                          "each source's share of samples and all of them of one bucket, which only sources with "
                          "the same bucket distribution have",
                          hint="use per_batch='source': each batch then holds one source and one bucket, and the "
                               "sources keep their weighted proportion of batches")
    if per_batch != "source":
        raise ConfigError(f"mix: per_batch must be 'sample' or 'source', got {per_batch!r}")
    if samples_per_epoch is not None:
        raise ConfigError("buckets with a mix plan default epochs only (no samples_per_epoch)",
                          hint="leave samples_per_epoch out: an epoch then ends when a source has given its share")


class BucketMix:
    """One epoch of a mix with buckets (``per_batch="source"``): ``plans[s]`` is source s's
    :class:`~.buckets.BucketEpoch` (laid out for ``ranks``, default all; ``indexes``: the
    sources' :class:`~.bucketseq.BucketIndex`, if made before); ``source[t]`` and
    ``source_step[t]`` say which source's batch step t is, and which of its plan's steps."""

    def __init__(self, counts: Sequence[Sequence[int]], ids: Sequence[np.ndarray], buckets: int,
                 weights: Sequence[float], layout: Layout, schedule: Schedule, epoch: int, per: str = "rank",
                 names: Optional[Sequence[str]] = None, per_batch: str = "source",
                 samples_per_epoch: Optional[int] = None, ranks: Optional[Sequence[int]] = None,
                 indexes: Optional[Sequence[BucketIndex]] = None) -> None:
        check_bucket_mix(per_batch, samples_per_epoch)
        if not (len(counts) == len(ids) == len(weights)):
            raise ConfigError(f"mix: {len(counts)} sources' counts, {len(ids)} sources' buckets, {len(weights)} weights")
        self.names = [f"source {i}" for i in range(len(weights))] if names is None else [str(n) for n in names]
        self.layout = layout
        totals = [int(np.sum(c)) for c in counts]
        check_share(weights, totals, layout.batch_size, "source", None, self.names)
        indexes = [None] * len(ids) if indexes is None else indexes
        self.plans: List[BucketEpoch] = [BucketEpoch(c, i, buckets, layout, schedule, epoch, per, ranks=ranks, index=x)
                                         for c, i, x in zip(counts, ids, indexes)]
        limits = np.array([p.steps for p in self.plans], dtype=np.int64)
        # the largest t whose dealt batches stay within every source's plan (dealt counts grow with t)
        lo, hi = 0, int(limits.sum())
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if np.all(cumulative(weights, mid) <= limits):
                lo = mid
            else:
                hi = mid - 1
        self.steps = lo
        if self.steps == 0:
            short = int(np.argmin(limits))
            raise ConfigError(f"mix with buckets: source {self.names[short]!r} has no batch of its own this epoch "
                              f"({totals[short]} samples)", hint="give it more samples or use fewer ranks")
        check_share(weights, totals, layout.batch_size, "source", self.steps, self.names)
        dealt = cumulative(weights, np.arange(self.steps + 1))  # (steps + 1, S)
        step = np.diff(dealt, axis=0)
        self.source = np.argmax(step, axis=1).astype(np.int64)
        self.source_step = dealt[:-1][np.arange(self.steps), self.source]
        self.used = dealt[-1]  # each source's plan steps used this epoch

    def bucket(self, rank: int) -> np.ndarray:
        """The bucket of each of rank ``rank``'s steps (``-1``: padding only)."""
        return np.array([self.plans[s].step_bucket[rank, j] for s, j in zip(self.source, self.source_step)],
                        dtype=np.int64)

    def rank_batches(self) -> np.ndarray:
        """``(ranks, steps, batch_size)`` of ``(source << 48) | epoch position`` (``-1`` padding)."""
        out = np.full((self.layout.world_size, self.steps, self.layout.batch_size), -1, dtype=np.int64)
        for s, plan in enumerate(self.plans):
            at = np.flatnonzero(self.source == s)
            table = plan.rank_batches()[:, self.source_step[at]]
            out[:, at] = np.where(table >= 0, (s << 48) | table, -1)
        return out

    def worker(self, rank: int, worker: int) -> Tuple[Tuple[BucketWorkerPlan, ...], np.ndarray, np.ndarray]:
        """Per source its :class:`~.buckets.BucketWorkerPlan` (its steps beyond ``used`` are not
        run this epoch), and per mix step the source and the source plan's step."""
        return tuple(p.worker(rank, worker) for p in self.plans), self.source.copy(), self.source_step.copy()
