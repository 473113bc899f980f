"""Who reads which samples, and how many steps an epoch has: pure functions of
(counts, layout, schedule, epoch).

**Balanced spans** (counts known). In epoch ``e`` the shard list is permuted by a generator
seeded with ``(seed, e)`` and the permuted shards are laid end to end as one sequence of ``T``
samples. Global worker ``g = rank × W + w`` owns one contiguous span of that sequence, sized by
its slot; where two spans meet inside a shard, the shard is cut into parts, each read
sequentially by its one owner from its first sample (a seek or a ranged GET to the sample's
offset; without offsets, by skipping headers). With ``C(g)`` the slots of the global workers
before ``g`` (``rank × B + slot offset of w``):

- ``even``: ``steps = ⌊T / (R·B)⌋``; ``L = T − steps·R·B`` samples (fewer than ``R·B``: at most
  one batch per rank) are left out of the epoch, drawn anew each epoch from anywhere in the
  sequence (:func:`left_out_positions`: one in each of ``L`` equal stretches, seeded by
  ``(seed, epoch)``). ``g`` owns ``[steps·C(g), steps·C(g+1))`` of the samples *kept*, in order: a
  stretch of the sequence read as usual, whose left-out samples are passed over, not delivered
  (:attr:`WorkerPlan.drop`).
- ``exact``: ``steps = ⌈T / (R·B)⌉``. Every step but the last is full; the last holds the
  ``k = T − (steps−1)·R·B`` samples left (``0 < k ≤ R·B``), dealt *position by position*: one to
  the first position of every rank's batch, then one to every rank's second position, and so on
  (rank ``r`` gets ``E_r = ⌈(k − r)/R⌉`` of them, at positions ``0 … E_r − 1`` of its batch, so
  in the slots of its first workers). ``g`` owns ``(steps−1)·slot`` samples plus those of the last
  step's positions that fall in its slot, as one contiguous span. So every sample is read once,
  padding costs at most one step per rank, and no rank's last batch is only padding unless
  ``k < R`` (fewer samples than ranks are left for the last step: ranks ``k … R−1`` then get an
  empty last batch, which the loader yields, so that every rank still yields ``steps`` batches).
  Interleaved, the same rule over the columns (``q = position·R + rank``) gives the last step's
  samples to columns ``0 … k−1``: ranks first, again.
- ``fixed`` with counts: spans ``[⌊T·C(g)/(R·B)⌋, ⌊T·C(g+1)/(R·B)⌋)``, re-read in a new order
  each pass until the fixed number of batches is filled.

**Interleaved reading** (counts known): the spans are planned over the layout's *columns*
(:attr:`~.layout.Layout.column_layout`), one per batch position of every rank; a worker reads the
columns of its slot at once, each sequentially, and takes one sample from each per step. A rank's
batch then draws from ``B`` places spread evenly over the epoch, where one span per worker draws
from ``W``: on data written in class order, that is the difference between a few classes per
batch and as many as a random order gives (``dalistream plan --shuffle-quality``).

**Whole shards** (``fixed`` without counts): global worker ``g`` owns shards ``g, g + R·W, …`` of
the permutation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import numpy.random  # noqa: F401  (numpy loads it at first use: in each forked DALI worker, on its first batch)

from ..errors import ConfigError, ManifestError
from ..manifest.offsets import running_starts
from . import seeds
from .layout import Layout, Schedule

Part = Tuple[int, int, Optional[int]]  # (shard index, first sample, stop sample or None = to the end)


def epoch_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True, source: int = 0) -> np.ndarray:
    """The permutation of shard indices used in ``epoch`` (identity when ``shuffle`` is off); of a
    mix's ``source``, in its pass ``epoch`` (source 0's: the unmixed epoch's, :func:`~.seeds.source_pass`)."""
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return np.random.default_rng(seeds.source_pass(seed, source, epoch)).permutation(num_shards).astype(np.int64)


def check_layout(num_shards: int, layout: Layout) -> None:
    """Raise if whole-shard ownership would leave a global worker without a shard."""
    if num_shards < layout.global_workers:
        raise ConfigError(
            f"{num_shards} shards cannot be split over {layout.world_size} ranks x {layout.workers} workers = "
            f"{layout.global_workers} global workers when shards are owned whole (policy 'fixed' without counts)",
            hint="give sample counts (a manifest) so shards can be cut, use fewer workers, or split the data set "
                 "into more shards",
        )


def _need_counts(counts: Optional[Sequence[int]], schedule: Schedule) -> None:
    if counts is None and schedule.policy != "fixed":
        raise ManifestError(f"policy {schedule.policy!r} needs per-shard sample counts (a manifest)",
                            hint="run `dalistream index` or use policy='fixed' with batches_per_epoch")


def epoch_steps(total: int, layout: Layout, schedule: Schedule) -> int:
    """Steps of an epoch of ``total`` samples, the same on every rank (``fixed``: its batches)."""
    if schedule.policy == "fixed":
        return int(schedule.batches_per_epoch)  # type: ignore[arg-type]
    per_step = layout.world_size * layout.batch_size
    return total // per_step if schedule.policy == "even" else -(-total // per_step)


def slot_starts(layout: Layout) -> np.ndarray:
    """``C(g)`` for g = 0 … R·W: the slots of all global workers before ``g`` (``C(R·W) = R·B``)."""
    c = np.empty(layout.global_workers + 1, dtype=np.int64)
    c[:-1] = (np.repeat(np.arange(layout.world_size, dtype=np.int64) * layout.batch_size, layout.workers)
              + np.tile(np.asarray(layout.slot_offsets, dtype=np.int64), layout.world_size))
    c[-1] = layout.world_size * layout.batch_size
    return c


def span_bounds(total: int, layout: Layout, schedule: Schedule) -> np.ndarray:
    """Where each global worker's span starts in the epoch's sample sequence: ``R·W + 1`` bounds,
    span ``g`` is ``[bounds[g], bounds[g+1])`` (see the module doc)."""
    c, steps = slot_starts(layout), epoch_steps(total, layout, schedule)
    per_step = layout.world_size * layout.batch_size
    if schedule.policy == "even":
        return steps * c
    if schedule.policy == "fixed":
        return (int(total) * c) // per_step
    if steps == 0:
        return np.zeros_like(c)
    last = int(total) - (steps - 1) * per_step  # the last step's samples: 0 < last <= R·B
    r = np.arange(layout.world_size, dtype=np.int64)
    ranks = np.maximum(0, (last - r + layout.world_size - 1) // layout.world_size)  # E_r: dealt position by position
    offsets = np.asarray(layout.slot_offsets, dtype=np.int64)
    extra = np.clip(ranks[:, None] - offsets[None, :], 0, np.asarray(layout.slots, dtype=np.int64)[None, :])
    bounds = (steps - 1) * c
    bounds[1:] += np.cumsum(extra.ravel())
    return bounds


def left_out_positions(total: int, layout: Layout, schedule: Schedule, epoch: int) -> np.ndarray:
    """The epoch positions ``even`` leaves out (sorted; none under the other policies): the
    ``L = T − steps·R·B`` left over, one drawn in each of ``L`` equal stretches of the sequence, so
    that they differ from epoch to epoch and lie anywhere in the shards, never in one place."""
    if schedule.policy != "even":
        return np.zeros(0, dtype=np.int64)
    left = int(total) - epoch_steps(int(total), layout, schedule) * layout.world_size * layout.batch_size
    return drawn_left_out([int(total)], [left], schedule.seed, epoch)


def drawn_left_out(totals: Sequence[int], left: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """Positions left out of groups of ``totals`` positions laid end to end, ``left[n]`` of group
    ``n``: one drawn in each of ``left[n]`` equal stretches of it, from one generator seeded by
    (seed, epoch), group after group (a node's part of the epoch: :mod:`.affinity`)."""
    rng = np.random.default_rng(seeds.left_out(seed, epoch))
    out, start = [np.zeros(0, dtype=np.int64)], 0
    for total, k in zip(totals, left):
        if k > 0:
            edges = (np.arange(k + 1, dtype=np.int64) * total) // k
            out.append(start + rng.integers(edges[:-1], edges[1:]).astype(np.int64))
        start += total
    return np.concatenate(out)


def kept_positions(left: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The positions of the ``kept``-th positions not in ``left`` (sorted), for an array ``kept``."""
    kept = np.asarray(kept, dtype=np.int64)
    if not len(left):
        return kept
    return kept + np.searchsorted(left - np.arange(len(left)), kept, side="right")


@dataclass(frozen=True)
class EpochLayout:
    """One epoch's sample sequence: the shard order and where each shard starts in it. The span
    ``bounds`` count the samples kept (all but ``left``, the positions ``even`` leaves out)."""

    order: np.ndarray   # shard indices in epoch order
    starts: np.ndarray  # starts[i]: first position of order[i]; starts[-1] = total
    bounds: np.ndarray  # span bounds per global worker (span_bounds), over the samples kept
    steps: int
    left: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # epoch positions left out, sorted

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def position(self, kept: np.ndarray) -> np.ndarray:
        """The epoch positions of the ``kept``-th samples kept (an array of them)."""
        return kept_positions(self.left, kept)

    @functools.cached_property
    def edges(self) -> np.ndarray:
        """Where each span's stretch of the epoch sequence starts (its first sample kept; the
        last: after the last sample kept): the spans' ``bounds`` as epoch positions."""
        if not len(self.left):
            return self.bounds
        kept = int(self.bounds[-1])
        out = self.position(np.minimum(self.bounds, max(kept - 1, 0)))
        return np.where(self.bounds >= kept, out + (kept > 0), out)

    def drops_of(self, spans: Sequence[int]) -> List[Tuple[int, ...]]:
        """Raw ordinals, over the samples of :meth:`parts_of` each span of ``spans``, of those left
        out (``left`` is sorted: a search each)."""
        g = np.asarray(spans, dtype=np.int64)
        if not len(self.left):
            return [()] * len(g)
        lo, hi = self.edges[g], self.edges[g + 1]
        a, b = np.searchsorted(self.left, lo, side="left"), np.searchsorted(self.left, hi, side="left")
        return [tuple((self.left[i:j] - x).tolist()) for i, j, x in zip(a.tolist(), b.tolist(), lo.tolist())]

    def parts_of(self, spans: Sequence[int]) -> List[List[Part]]:
        """The shard parts of each global worker's stretch of the sequence (``spans``: the global
        workers), in reading order (samples left out inside it are :meth:`drops_of`); all worked
        out together, in one pass of array operations (a worker reading interleaved plans hundreds
        of columns an epoch). An empty shard is a part ``(s, 0, 0)`` of the span it sits in (the
        last span's when it sits at the end), so that it is still opened once: a shard that has
        gained samples or is damaged shows."""
        g = np.asarray(spans, dtype=np.int64)
        lo, hi = self.edges[g], self.edges[g + 1]
        last = g == len(self.bounds) - 2
        heads = self.starts[:-1]
        i = np.searchsorted(heads, lo, side="left")  # first shard starting at or after lo
        i -= (i > 0) & (self.starts[i] > lo)  # the shard before it holds lo
        j = np.where(last, np.searchsorted(heads, hi, side="right"), np.searchsorted(heads, hi, side="left"))
        n = np.maximum(j - i, 0)  # shards starting before hi, each span's
        head = np.cumsum(n) - n  # where each span's candidates start among all
        k = np.repeat(i - head, n) + np.arange(int(n.sum()), dtype=np.int64)
        lo, hi, last = np.repeat(lo, n), np.repeat(hi, n), np.repeat(last, n)
        a, b, shard = self.starts[k], self.starts[k + 1], self.order[k]
        full = b > a
        keep = np.where(full, np.minimum(hi, b) > np.maximum(lo, a), (a >= lo) & ((a < hi) | last))
        first = np.where(full, np.maximum(lo, a) - a, 0)[keep]
        stop = np.where(full, np.minimum(hi, b) - a, 0)[keep]
        found = list(zip(shard[keep].tolist(), first.tolist(), stop.tolist()))
        kept = running_starts(keep)[np.append(head, len(keep))].tolist()  # each span's, among found
        return [found[x:y] for x, y in zip(kept[:-1], kept[1:])]


def laid_out(counts: Sequence[int], order: np.ndarray, bounds: Optional[np.ndarray] = None, steps: int = 0,
             left: Optional[np.ndarray] = None) -> EpochLayout:
    """An :class:`EpochLayout` of the shards ``counts`` laid end to end in ``order`` with the given
    span ``bounds`` (one more than the spans, so that its ``parts(g)`` cuts span g; default none)."""
    starts = running_starts(np.asarray(counts, dtype=np.int64)[order])
    bounds = np.zeros(2, dtype=np.int64) if bounds is None else np.asarray(bounds, dtype=np.int64)
    left = np.zeros(0, dtype=np.int64) if left is None else left
    return EpochLayout(np.asarray(order, dtype=np.int64), starts, bounds, int(steps), left)


def epoch_layout(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int) -> EpochLayout:
    """The epoch's order, shard starts and span bounds (cheap: O(shards + global workers))."""
    total = int(np.sum(np.asarray(counts, dtype=np.int64)))
    return laid_out(counts, epoch_order(len(counts), schedule.seed, epoch, schedule.shuffle_shards),
                    span_bounds(total, layout, schedule), epoch_steps(total, layout, schedule),
                    left_out_positions(total, layout, schedule, epoch))


def owned_shards(num_shards: int, layout: Layout, schedule: Schedule, epoch: int, rank: int, worker: int) -> List[int]:
    """Whole-shard ownership (``fixed`` without counts): shard indices global worker ``g`` reads."""
    check_layout(num_shards, layout)
    order = epoch_order(num_shards, schedule.seed, epoch, schedule.shuffle_shards)
    return [int(i) for i in order[layout.global_worker(rank, worker)::layout.global_workers]]


def owned_parts(counts: Optional[Sequence[int]], num_shards: int, layout: Layout, schedule: Schedule, epoch: int,
                rank: int, worker: int) -> List[Part]:
    """The parts (shard, first sample, stop sample) global worker ``rank × W + worker`` reads in
    ``epoch``: its span, or its whole shards when counts are unknown."""
    _need_counts(counts, schedule)
    if counts is None:
        return [(i, 0, None) for i in owned_shards(num_shards, layout, schedule, epoch, rank, worker)]
    return epoch_layout(counts, layout, schedule, epoch).parts_of([layout.global_worker(rank, worker)])[0]


def steps_per_epoch(counts: Optional[Sequence[int]], layout: Layout, schedule: Schedule, epoch: int, rank: int) -> int:
    """Batches rank ``rank`` yields in ``epoch`` (the same on every rank; see the module doc)."""
    _need_counts(counts, schedule)
    return epoch_steps(0 if counts is None else int(np.sum(np.asarray(counts, dtype=np.int64))), layout, schedule)


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker does in one epoch: which shard parts, how many batches, its slot."""

    rank: int
    worker: int
    epoch: int
    parts: Tuple[Part, ...]
    steps: int
    slot: int
    offset: int
    samples: Optional[int]  # samples owned this epoch (None when counts are unknown)
    global_worker: int
    left_out: int = 0  # samples of the epoch no one owns (``even``), counted by the job's last worker only
    drop: Tuple[int, ...] = ()  # raw ordinals over the parts' samples not delivered: left out (even), or delivered before an elastic resume (plan.resume)
    shuffle_seed: Optional[int] = None  # elastic resume: the segment's own sample shuffle seed

    @property
    def shards(self) -> Tuple[int, ...]:
        """The shards this worker reads from, in order."""
        return tuple(p[0] for p in self.parts)


def worker_plan(counts: Optional[Sequence[int]], num_shards: int, layout: Layout, schedule: Schedule, epoch: int,
                rank: int, worker: int) -> WorkerPlan:
    """The :class:`WorkerPlan` of one worker; identical on every machine for the same inputs."""
    if counts is not None:
        return span_plans(counts, num_shards, layout, schedule, epoch, [layout.global_worker(rank, worker)])[0]
    parts = owned_parts(None, num_shards, layout, schedule, epoch, rank, worker)  # (None: policy fixed, or raises)
    return WorkerPlan(rank, worker, epoch, tuple(parts), epoch_steps(0, layout, schedule), layout.slots[worker],
                      layout.slot_offsets[worker], None, layout.global_worker(rank, worker))


def worker_columns(counts: Sequence[int], num_shards: int, layout: Layout, schedule: Schedule, epoch: int,
                   rank: int, worker: int) -> Tuple[WorkerPlan, ...]:
    """Interleaved reading: one :class:`WorkerPlan` per column of (``rank``, ``worker``), in slot
    order (each of slot 1, planned over :attr:`~.layout.Layout.column_layout`)."""
    return tuple(span_plans(counts, num_shards, layout.column_layout, schedule, epoch, layout.columns(rank, worker)))


def span_plans(counts: Sequence[int], num_shards: int, planned: Layout, schedule: Schedule, epoch: int,
               spans: Sequence[int]) -> List[WorkerPlan]:
    """The plans of global workers ``spans`` of the ``planned`` layout (a column of an interleaved
    layout is one of slot 1), the epoch laid out once: a worker may read hundreds of columns."""
    if len(counts) != num_shards:
        raise ManifestError(f"{len(counts)} counts for {num_shards} shards")
    plan = epoch_layout(counts, planned, schedule, epoch)
    spans, last = list(spans), planned.global_workers - 1
    out = []
    for g, parts, drop in zip(spans, plan.parts_of(spans), plan.drops_of(spans)):
        samples = int(plan.bounds[g + 1] - plan.bounds[g])
        if schedule.policy == "fixed" and samples == 0:
            raise ConfigError(f"global worker {g} owns no sample: {plan.total} samples cannot fill a slot of every one "
                              f"of {planned.global_workers} global workers (a column: each position of each rank's "
                              "batch)", hint="use fewer workers or a smaller batch")
        rank, worker = divmod(g, planned.workers)
        out.append(WorkerPlan(rank, worker, epoch, tuple(parts), plan.steps, planned.slots[worker],
                              planned.slot_offsets[worker], samples, g, plan.total - int(plan.bounds[-1]) if g == last
                              else 0, drop))
    return out
