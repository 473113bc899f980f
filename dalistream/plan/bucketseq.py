"""Where a bucket plan (:mod:`.buckets`, ``per="rank"``) cuts the ranks' stretches of the reading
order (:func:`cuts_of`), and the counts that decides it without laying the epoch out: what one
rank's plan needs, at the cost of its own samples and a few numbers per column rather than of the
whole epoch.

A rank's plan depends on the rest of the epoch only through counts: how many samples of each
bucket come before each rank's stretch (where the cuts fall), and which samples of each bucket
it owns. Those counts come from :class:`BucketIndex` (built once per data set: every shard's
bucket histogram, and a sorted key to count a shard's first ``x`` samples of each bucket) and
:func:`column_counts` (per epoch: each column's counts, ``R·C`` columns × buckets); samples are
laid out only for the columns a rank reads (:func:`gather`) or where a cut falls
(:func:`cut_before`). A resumed epoch's rest is indexed the same way, its positions still to
plan taken as one shard.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..manifest.offsets import running_starts
from .bucketworker import stable_argsort
from .layout import Layout


class BucketIndex:
    """Every sample's bucket (``ids``, written order) indexed per shard: ``hist[s, b]`` samples of
    bucket b in shard s, and :meth:`prefix` for the first samples of a shard."""

    def __init__(self, counts: Sequence[int], ids: np.ndarray, buckets: int) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.buckets = k = int(buckets)
        self.written = running_starts(self.counts)
        self.ids = np.asarray(ids)
        shard = np.repeat(np.arange(len(self.counts), dtype=np.int64), self.counts)
        group = shard * k + self.ids
        self.hist = np.bincount(group, minlength=len(self.counts) * k).reshape(len(self.counts), k)
        self.group_start = running_starts(self.hist.ravel())
        self.span = int(self.counts.max(initial=0)) + 1
        # (shard, bucket, offset) as one sorted number: a shard's first x samples of bucket b are
        # those of group s·k + b below offset x
        group *= self.span
        group += np.arange(len(self.ids), dtype=np.int64) - np.repeat(self.written[:-1], self.counts)
        group.sort()
        self.key = group

    def prefix(self, shard: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``(len(shard), buckets)``: samples of each bucket among the first ``x[i]`` of written
        shard ``shard[i]``."""
        g = np.asarray(shard, dtype=np.int64)[:, None] * self.buckets + np.arange(self.buckets)[None, :]
        wanted = (g * self.span + np.asarray(x, dtype=np.int64)[:, None]).ravel()
        order = np.argsort(wanted)  # (searched in order: each search starts where the last ended)
        found = np.empty(len(wanted), dtype=np.int64)
        found[order] = np.searchsorted(self.key, wanted[order])
        return found.reshape(g.shape) - self.group_start[g]


class ColumnCounts(NamedTuple):
    """One epoch's reading order in blocks: block ``j`` (rank ``j // C``'s ``j % C``-th column) is
    sequence ``[seq_start[j], seq_start[j] + size[j])``, from reading index ``read_start[j]``;
    ``cum[j, b]``: samples of bucket b in the blocks before j (``cum[-1]``: the totals)."""

    seq_start: np.ndarray
    size: np.ndarray
    read_start: np.ndarray
    cum: np.ndarray


def column_counts(index: BucketIndex, order: np.ndarray, starts: np.ndarray, ranks: int, columns: int) -> ColumnCounts:
    """The :class:`ColumnCounts` of the epoch whose shards are read in ``order`` (``starts``:
    their first sequence positions, one more than the shards): the sequence cut into ``ranks ·
    columns`` stretches as :class:`~.buckets.BucketEpoch` cuts it, column ``q = p·R + r`` read by
    rank r."""
    total = int(starts[-1])
    n_cols = ranks * columns
    edges = -(-np.arange(n_cols + 1, dtype=np.int64) * total // max(n_cols, 1))  # column q: [edges[q], edges[q+1])
    at = np.minimum(np.searchsorted(starts, edges, side="right") - 1, len(order) - 1)
    whole = np.zeros((len(order) + 1, index.buckets), dtype=np.int64)
    np.cumsum(index.hist[order], axis=0, out=whole[1:])
    before = whole[at] + index.prefix(order[at], edges - starts[at])  # samples of each bucket before each edge
    j = np.arange(n_cols, dtype=np.int64)
    q = (j % columns) * ranks + j // columns
    size = np.diff(edges)[q]
    cum = np.zeros((n_cols + 1, index.buckets), dtype=np.int64)
    np.cumsum(np.diff(before, axis=0)[q], axis=0, out=cum[1:])
    return ColumnCounts(edges[q], size, running_starts(size), cum)


class Gathered(NamedTuple):
    """Samples of some blocks, in reading order: each one's ``read`` index, sequence ``position``,
    ``column`` (the sequence's, ``q``), ``bucket``, written-order ``sample_id`` and ``nth``: how
    many samples of its bucket come before it in the reading order."""

    read: np.ndarray
    position: np.ndarray
    column: np.ndarray
    bucket: np.ndarray
    sample_id: np.ndarray
    nth: np.ndarray


def gather(index: BucketIndex, order: np.ndarray, starts: np.ndarray, blocks: ColumnCounts, ranks: int,
           columns: int, which: np.ndarray) -> Gathered:
    """The samples of blocks ``which`` (increasing)."""
    which = np.asarray(which, dtype=np.int64)
    size = blocks.size[which]
    first = np.repeat(blocks.seq_start[which] - np.cumsum(size) + size, size)
    local = np.arange(int(size.sum()), dtype=np.int64)
    position = first + local
    shard = np.searchsorted(starts, position, side="right") - 1
    sample_id = index.written[order[shard]] + position - starts[shard]
    bucket = index.ids[sample_id].astype(np.int64)
    block = np.repeat(which, size)
    read = np.repeat(blocks.read_start[which], size) + position - np.repeat(blocks.seq_start[which], size)
    # (the n-th of its bucket: those of earlier blocks, then its rank among its block's)
    key = np.repeat(np.arange(len(which), dtype=np.int64), size) * index.buckets + bucket
    by = stable_argsort(key)
    group_first = np.searchsorted(key[by], key[by], side="left")
    nth = np.empty(len(key), dtype=np.int64)
    nth[by] = np.arange(len(key)) - group_first
    nth += blocks.cum[block, bucket]
    column = (block % columns) * ranks + block // columns
    return Gathered(read, position, column, bucket, sample_id, nth)


def cut_before(index: BucketIndex, order: np.ndarray, starts: np.ndarray, blocks: ColumnCounts, ranks: int,
               columns: int, cap: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``(len(thresholds), buckets)``: for each threshold T, the samples of each bucket (at most
    ``cap``) before the shortest reading-order prefix holding T samples within their bucket's
    ``cap`` (see :func:`cuts_of`). Only the blocks where a prefix ends are laid out."""
    k = index.buckets
    run = np.minimum(blocks.cum, cap[None, :]).sum(axis=1)  # counted samples before each block
    nonempty = np.flatnonzero(blocks.size > 0)
    thresholds = np.asarray(thresholds, dtype=np.int64)
    at = np.minimum(np.searchsorted(run[nonempty + 1], thresholds, side="left"), len(nonempty) - 1)
    block = nonempty[at]  # the first block whose end counts T
    which = np.unique(block)
    got = gather(index, order, starts, blocks, ranks, columns, which)
    first = running_starts(blocks.size[which])
    # counted so far at each laid-out sample: nondecreasing over the blocks in reading order
    total = np.cumsum(got.nth < cap[got.bucket])
    size = blocks.size[which]
    counted = total + np.repeat(run[which] - np.r_[0, total][first[:-1]], size)
    stop = np.searchsorted(counted, thresholds, side="left")  # the sample ending each prefix
    seen = np.zeros((len(got.bucket) + 1, k), dtype=np.int64)
    np.cumsum(np.eye(k, dtype=np.int64)[got.bucket], axis=0, out=seen[1:])
    slot = np.searchsorted(which, block)
    within = seen[stop + 1] - seen[first[slot]]
    return np.minimum(blocks.cum[block] + within, cap[None, :])


# -- where the ranks' stretches are cut ----------------------------------------------------------

def _round_units(target: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Integers within ``[lo, hi]`` summing to ``total``, nearest ``target`` (largest remainders)."""
    v = np.clip(np.floor(target + 0.5).astype(np.int64), lo, hi)
    while int(v.sum()) < total:
        room = np.where(v < hi, target - v, -np.inf)
        v[int(np.argmax(room))] += 1
    while int(v.sum()) > total:
        room = np.where(v > lo, target - v, np.inf)
        v[int(np.argmin(room))] -= 1
    return v


def cuts_of(n: np.ndarray, units: np.ndarray, layout: Layout, policy: str,
            before: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """``(R + 1, k)``: units of each bucket before each rank (``per="rank"``; see the module doc)
    of buckets of ``n`` samples in ``units``. A sample counts when it is within its bucket's units
    (``cap``: the first ``min(n, units·B)`` of the bucket in reading order); the rank boundaries
    fall where the count reaches each rank's share of them: ``before(cap, thresholds)`` gives,
    for each threshold, the samples of each bucket (at most ``cap``) before the shortest reading
    prefix that counts it (:func:`cut_before`, from column counts); rounded to whole units by
    largest remainders, so that they add up."""
    r_count, b = layout.world_size, layout.batch_size
    cuts = np.zeros((r_count + 1, len(units)), dtype=np.int64)
    cuts[-1] = units
    total_units = int(units.sum())
    if r_count == 1 or total_units == 0:
        return cuts
    cap = np.minimum(n, units * b)
    cum_units = (np.arange(r_count + 1, dtype=np.int64) * total_units) // r_count if policy == "exact" else \
        np.arange(r_count + 1, dtype=np.int64) * (total_units // r_count)
    counts = before(cap, -(-cum_units[1:-1] * int(cap.sum()) // total_units))
    for i in range(1, r_count):
        target = counts[i - 1] / b
        s = target.sum()
        if s > 0:
            target = target * (cum_units[i] / s)
        cuts[i] = _round_units(target, int(cum_units[i]), cuts[i - 1], units)
    return cuts
