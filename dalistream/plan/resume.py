"""Elastic resume: the rest of an epoch after one or more *segments* ran under other layouts,
planned over a new layout. Pure functions of (counts, layout, schedule, epoch, segments, shuffle).

A segment is ``(world_size, workers, batch_size, steps)``: a layout and the steps it ran in the
epoch. Segment 0 planned the whole epoch sequence (``T`` samples, :mod:`.ownership`); segment
``k`` plans the sequence *remaining* after segments ``0 … k-1`` the same way, as balanced spans
(:func:`~.ownership.span_bounds`). What a global worker of a past segment delivered is known from
indices alone: its span's first ``c = steps × slot`` outputs of the shuffle buffer (without a
buffer, the span's first ``c`` samples). So its span splits into a prefix fully delivered, a
*window* of at most (buffer) samples of which some were delivered (:func:`~.shuffle.emitted_indices` names them), and the untouched rest. What remains is, worker by worker, the
window's undelivered samples then the rest (for ``even``, then the tail no one owned).

A new worker's span of that remaining sequence maps back to :class:`Stretch` s of epoch positions,
each a range minus a few dropped positions (the window's delivered samples); its plan reads the
runs' shard parts in order and drops those positions without decoding them. Chains apply the same
rule again: the state stays a few integers per segment, never a list of samples.

``fixed`` with counts continues with the epoch's remaining *batches*: the new layout's spans of
the whole epoch, for ``batches_per_epoch`` minus the steps already run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import StateError
from . import seeds
from .layout import Layout, Schedule
from .shuffle import emitted_indices
from .ownership import (EpochLayout, Part, WorkerPlan, epoch_layout, epoch_steps, kept_positions, left_out_positions,
                        span_bounds)

Segment = Tuple[int, int, int, int]  # (world_size, workers, batch_size, steps run)


@dataclass(frozen=True)
class Stretch:
    """Epoch positions ``[start, stop)`` minus ``drop`` (sorted), in order."""

    start: int
    stop: int
    drop: Tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return self.stop - self.start - len(self.drop)


def segment_layout(segment: Sequence[int]) -> Layout:
    """The :class:`Layout` of a segment ``(world_size, workers, batch_size, steps)``."""
    return Layout(int(segment[0]), int(segment[1]), int(segment[2]))



@lru_cache(maxsize=4096)
def _emitted(count: int, total: int, size: int, seed: int) -> Tuple[int, ...]:
    return tuple(sorted(emitted_indices(count, total, size, seed)))


def delivered_ordinals(count: int, total: int, shuffle: int, seed: int) -> Tuple[int, ...]:
    """Input ordinals (of ``total``) among a worker's first ``count`` outputs, sorted."""
    count = min(count, total)
    if shuffle <= 1:
        return tuple(range(count))
    return _emitted(count, total, shuffle, seed)


def kth_positions(runs: Sequence[Stretch], ks: Sequence[int]) -> List[int]:
    """Epoch positions of the ``ks``-th kept positions of ``runs`` (those past the runs' end left out)."""
    ks = np.asarray(ks, dtype=np.int64)
    cum = np.zeros(len(runs) + 1, dtype=np.int64)
    np.cumsum([r.size for r in runs], out=cum[1:])
    ks = ks[ks < cum[-1]]
    which = np.searchsorted(cum, ks, side="right") - 1
    out = np.empty(len(ks), dtype=np.int64)
    for j in np.unique(which).tolist():
        run, at = runs[j], which == j
        i = ks[at] - cum[j]  # the i-th kept position of the run: start + i + (drops at or before it)
        drop = np.asarray(run.drop, dtype=np.int64)
        out[at] = run.start + i + np.searchsorted(drop - run.start - np.arange(len(drop)), i, side="right")
    return out.tolist()


class Remaining:
    """The sequence of an epoch left after ``segments``: ``total`` samples, and :meth:`runs`.
    ``left``: the epoch positions the first layout's plan left out (``even``): at level 0 the
    sequence is the samples kept, in order, then those left out."""

    def __init__(self, total: int, schedule: Schedule, epoch: int, segments: Sequence[Segment], shuffle: int,
                 left: Sequence[int] = ()) -> None:
        self.schedule, self.epoch, self.shuffle = schedule, epoch, shuffle
        self.level = len(segments)
        if not segments:
            self.prev, self.total, self.left = None, int(total), np.asarray(left, dtype=np.int64)
            return
        self.prev = Remaining(total, schedule, epoch, segments[:-1], shuffle, left)
        n_prev = self.prev.total
        layout, steps = segment_layout(segments[-1]), int(segments[-1][3])
        planned = epoch_steps(n_prev, layout, schedule)
        if steps > planned:
            raise StateError(f"segment {self.level - 1} ran {steps} steps of a plan of {planned} under "
                             f"{layout.world_size} ranks x {layout.workers} workers x batch {layout.batch_size}",
                             hint="the state does not come from this data set")
        bounds = span_bounds(n_prev, layout, schedule)
        slots = np.tile(np.asarray(layout.slots, dtype=np.int64), layout.world_size)
        self._split(bounds, np.minimum(np.diff(bounds), steps * slots))

    @classmethod
    def after(cls, prev: "Remaining", bounds: np.ndarray, done: np.ndarray, seed_of) -> "Remaining":
        """The sequence left after one more segment whose global worker ``g`` owned
        ``[bounds[g], bounds[g+1])`` of ``prev`` and delivered the first ``done[g]`` outputs of its
        shuffle buffer, seeded ``seed_of(g)`` (a mix's source: its spans are sized by the takes)."""
        out = cls.__new__(cls)
        out.schedule, out.epoch, out.shuffle = prev.schedule, prev.epoch, prev.shuffle
        out.level, out.prev, out.seed_of = prev.level + 1, prev, seed_of
        out._split(np.asarray(bounds, dtype=np.int64), np.asarray(done, dtype=np.int64))
        return out

    def _split(self, bounds: np.ndarray, done: np.ndarray) -> None:
        n_prev = self.prev.total
        self.bounds, self.done = bounds, np.minimum(np.diff(bounds), done)
        left = list((np.diff(bounds) - self.done).tolist()) + [n_prev - int(bounds[-1])]  # last: no one's (even)
        self.cum = np.zeros(len(left) + 1, dtype=np.int64)
        np.cumsum(left, out=self.cum[1:])
        self.total = int(self.cum[-1])
        self._window: dict = {}

    def _level_zero(self, lo: int, hi: int) -> List[Stretch]:
        return _level_zero_runs(self.left, self.total, lo, hi)

    def seed_of(self, g: int) -> int:
        """Global worker ``g``'s shuffle seed in this level's segment."""
        return seeds.segment_shuffle(self.schedule.seed, self.epoch, self.level - 1, g)

    def window(self, g: int) -> Tuple[Tuple[int, ...], Tuple[int, ...], int]:
        """Global worker ``g`` of the last segment: (undelivered ordinals of its window, the
        window's delivered ordinals, where its untouched rest starts), ordinals in its span."""
        if g not in self._window:
            n, c = int(self.bounds[g + 1] - self.bounds[g]), int(self.done[g])
            gone = delivered_ordinals(c, n, self.shuffle, self.seed_of(g))
            rest = gone[-1] + 1 if gone else 0
            prefix = next((i for i, o in enumerate(gone) if o != i), len(gone))
            kept = tuple(sorted(set(range(prefix, rest)) - set(gone)))
            self._window[g] = (kept, gone[prefix:], rest)
        return self._window[g]

    def runs(self, lo: int, hi: int) -> List[Stretch]:
        """Positions ``[lo, hi)`` of this sequence as runs of epoch positions, in order."""
        if hi <= lo:
            return []
        if self.prev is None:
            return self._level_zero(lo, hi)
        out: List[Stretch] = []
        g = int(np.searchsorted(self.cum, lo, side="right")) - 1
        while g < len(self.cum) - 1 and int(self.cum[g]) < hi:
            a, b = max(lo, int(self.cum[g])) - int(self.cum[g]), min(hi, int(self.cum[g + 1])) - int(self.cum[g])
            if g == len(self.cum) - 2:  # the tail no one owned (even): untouched
                base = int(self.bounds[-1])
                out += self.prev.runs(base + a, base + b)
            else:
                base = int(self.bounds[g])
                kept, gone, rest = self.window(g)
                if a < len(kept):
                    take = kept[a:min(b, len(kept))]
                    x, y = base + take[0], base + take[-1] + 1
                    inner = self.prev.runs(x, y)
                    holes = [o + base - x for o in gone if take[0] < o < take[-1]]
                    out += _with_drops(inner, kth_positions(inner, holes))
                if b > len(kept):
                    out += self.prev.runs(base + rest + max(0, a - len(kept)), base + rest + b - len(kept))
            g += 1
        return merged_runs(out)


def _level_zero_runs(left: np.ndarray, total: int, lo: int, hi: int) -> List[Stretch]:
    """Positions ``[lo, hi)`` of an epoch's sequence of the samples kept, then those ``left`` out,
    as runs of epoch positions (:func:`kept_first_runs` of the epoch sequence)."""
    return kept_first_runs(lambda x, y: [Stretch(x, y)], total, left, lo, hi)


def kept_first_runs(runs: Callable[[int, int], List[Stretch]], total: int, left: np.ndarray, lo: int,
                    hi: int) -> List[Stretch]:
    """Positions ``[lo, hi)`` of a sequence of ``total`` positions reordered: those not in ``left``
    (sorted) in their order, then those of ``left``; ``runs(x, y)`` gives positions ``[x, y)`` of
    the sequence itself as runs. A stretch of kept positions reads the sequence from its first
    position up to the next kept one (or just past its last, at the end), the left-out positions
    inside as its drops: the stretches of :meth:`~.ownership.EpochLayout.parts`."""
    if not len(left):
        return runs(lo, hi)
    kept = total - len(left)
    out: List[Stretch] = []
    if min(hi, kept) > lo:
        b = min(hi, kept)
        x, last = (int(p) for p in kept_positions(left, np.array([lo, b - 1])))
        y = int(kept_positions(left, np.array([b]))[0]) if b < kept else last + 1
        inner = runs(x, y)
        holes = left[(left > x) & (left < y)] - x  # ordinals over the sequence's positions [x, y)
        out += _with_drops(inner, kth_positions(inner, holes))
    for h in left[max(lo, kept) - kept:max(hi, kept) - kept].tolist():
        out += runs(h, h + 1)
    return merged_runs(out)


def _with_drops(runs: List[Stretch], positions: Sequence[int]) -> List[Stretch]:
    if not positions:
        return runs
    pos = np.asarray(positions, dtype=np.int64)
    out = []
    for r in runs:
        extra = pos[(pos >= r.start) & (pos < r.stop)].tolist()
        out.append(Stretch(r.start, r.stop, tuple(sorted(set(r.drop) | set(extra)))))
    return out


def merged_runs(runs: List[Stretch]) -> List[Stretch]:
    """``runs`` without empty ones, each joined to the one before it where they meet."""
    out: List[Stretch] = []
    for r in runs:
        if r.stop <= r.start:
            continue
        if out and out[-1].stop == r.start:
            out[-1] = Stretch(out[-1].start, r.stop, out[-1].drop + r.drop)
        else:
            out.append(r)
    return out


def check_segments(segments: Sequence[Sequence[int]]) -> Tuple[Segment, ...]:
    """Segments as tuples of integers, or a :class:`StateError` naming the bad one: 4 (world_size,
    workers, batch_size >= workers, steps >= 0), or 6 for a segment run with node affinity
    (:mod:`.affinity`: and the node count, dividing world_size, and 1 or 0, read interleaved or not)."""
    out = []
    for i, s in enumerate(segments):
        ok = (isinstance(s, (list, tuple)) and len(s) in (4, 6)
              and all(isinstance(v, int) and not isinstance(v, bool) for v in s)
              and s[0] >= 1 and s[1] >= 1 and s[2] >= s[1] and s[3] >= 0)
        if ok and len(s) == 6:
            ok = s[4] >= 1 and s[0] % s[4] == 0 and s[5] in (0, 1)
        if not ok:
            raise StateError(f"loader state: segment {i} must be [world_size, workers, batch_size, steps] or, with "
                             f"node affinity, [world_size, workers, batch_size, steps, nodes, interleaved], got {s!r}")
        out.append(tuple(int(v) for v in s))
    return tuple(out)  # type: ignore[return-value]


def segment_head(layout: Layout, planned: Layout, nodes: Optional[int], columns: bool) -> Tuple[int, ...]:
    """What a segment says of ``layout``, all but its steps: with node affinity over ``nodes``
    nodes, ``(world_size, workers, batch_size, nodes, columns)``; without (``nodes`` None), the
    ``planned`` layout the plan splits an epoch over."""
    if nodes is None:
        return (planned.world_size, planned.workers, planned.batch_size)
    return (layout.world_size, layout.workers, layout.batch_size, int(nodes), int(bool(columns)))


def continued(segments: Sequence[Segment], saved: Tuple[int, ...], step: int,
              current: Tuple[int, ...]) -> Tuple[Tuple[Segment, ...], int]:
    """Where a state saved at ``step`` of a layout whose segment head is ``saved`` (a segment
    without its steps: ranks, workers, batch size, and with node affinity the node count and
    whether it read interleaved), after ``segments``, goes on under the layout of head ``current``:
    ``(segments, step)``. The same layout goes on at its step; another one closes the saved
    layout's segment and starts its own at step 0."""
    if tuple(saved) == tuple(current):
        return tuple(segments), step
    if not step:  # the saved layout ran nothing of this epoch
        return tuple(segments), 0
    head = tuple(int(v) for v in saved)
    return tuple(segments) + (head[:3] + (int(step),) + head[3:],), 0


def resumed_steps(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int,
                  segments: Sequence[Segment], shuffle: int) -> int:
    """Steps every rank of ``layout`` runs for the rest of ``epoch`` after ``segments``."""
    if schedule.policy == "fixed":
        return max(0, int(schedule.batches_per_epoch) - sum(int(s[3]) for s in segments))  # type: ignore[arg-type]
    rest = Remaining(int(np.sum(np.asarray(counts, dtype=np.int64))), schedule, epoch, segments, shuffle)
    return epoch_steps(rest.total, layout, schedule)


class ResumePlan:
    """The rest of ``epoch`` after ``segments``, planned over ``layout`` (computed once, then
    :meth:`worker` per (rank, worker))."""

    def __init__(self, counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int,
                 segments: Sequence[Segment], shuffle: int) -> None:
        self.counts, self.layout, self.schedule, self.epoch = counts, layout, schedule, epoch
        self.segments, self.shuffle = tuple(segments), shuffle
        self.steps = resumed_steps(counts, layout, schedule, epoch, segments, shuffle)
        if schedule.policy != "fixed":
            self.epoch_layout = epoch_layout(counts, layout, schedule, epoch)
            first = segment_layout(segments[0]) if segments else layout  # the layout that planned level 0
            left = left_out_positions(self.epoch_layout.total, first, schedule, epoch)
            self.rest = Remaining(self.epoch_layout.total, schedule, epoch, segments, shuffle, left)
            self.bounds = span_bounds(self.rest.total, layout, schedule)

    def worker(self, rank: int, worker: int) -> WorkerPlan:
        """The :class:`WorkerPlan` of (``rank``, ``worker``): parts in reading order, ``drop`` the
        raw ordinals (over the parts' samples) not to deliver, ``samples`` what it delivers, and
        its segment's own shuffle seed."""
        from .ownership import worker_plan

        layout, schedule = self.layout, self.schedule
        g = layout.global_worker(rank, worker)
        seed = seeds.segment_shuffle(schedule.seed, self.epoch, len(self.segments), g)
        if schedule.policy == "fixed":
            plan = worker_plan(self.counts, len(self.counts), layout, schedule, self.epoch, rank, worker)
            return WorkerPlan(rank, worker, self.epoch, plan.parts, self.steps, plan.slot, plan.offset, plan.samples,
                              g, 0, (), seed)
        lo, hi = int(self.bounds[g]), int(self.bounds[g + 1])
        parts, drop = runs_to_parts(self.epoch_layout, self.rest.runs(lo, hi))
        left_out = self.rest.total - int(self.bounds[-1]) if g == layout.global_workers - 1 else 0
        return WorkerPlan(rank, worker, self.epoch, tuple(parts), self.steps, layout.slots[worker],
                          layout.slot_offsets[worker], hi - lo, g, left_out, tuple(drop), seed)


def runs_to_parts(ep: EpochLayout, runs: Sequence[Stretch]) -> Tuple[List[Part], List[int]]:
    """The shard parts of ``runs`` (epoch positions of ``ep``'s sequence) in reading order, and
    the raw ordinals over those parts' samples to drop."""
    parts: List[Part] = []
    drop: List[int] = []
    raw = 0
    for run in runs:
        i = int(np.searchsorted(ep.starts, run.start, side="right")) - 1
        drop += (np.asarray(run.drop, dtype=np.int64) - run.start + raw).tolist()
        while i < len(ep.order) and int(ep.starts[i]) < run.stop:
            a, b = int(ep.starts[i]), int(ep.starts[i + 1])
            first, stop = max(run.start, a) - a, min(run.stop, b) - a
            if stop > first:
                parts.append((int(ep.order[i]), first, stop))
            i += 1
        raw += run.stop - run.start
    return parts, drop



def remaining_summary(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int,
                      segments: Sequence[Segment], shuffle: int) -> dict:
    """What a resume leaves for ``layout``: samples delivered and left, steps per rank."""
    total = int(np.sum(np.asarray(counts, dtype=np.int64)))
    steps = resumed_steps(counts, layout, schedule, epoch, segments, shuffle)
    if schedule.policy == "fixed":
        return {"epoch": epoch, "samples": total, "delivered": None, "remaining": None, "steps": steps,
                "segments": [list(s) for s in segments]}
    rest = Remaining(total, schedule, epoch, segments, shuffle)
    return {"epoch": epoch, "samples": total, "delivered": total - rest.total, "remaining": rest.total,
            "steps": steps, "left_out": rest.total - min(rest.total, steps * layout.world_size * layout.batch_size)
            if schedule.policy == "even" else 0, "segments": [list(s) for s in segments]}
