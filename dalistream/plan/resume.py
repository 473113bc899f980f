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

The plan of the rest over the new layout is :class:`~.affinity.AffinePlan` without nodes (node
affinity is the same rule with each node's share of the sequence cut on its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import StateError
from ..manifest.offsets import running_starts
from .layout import Layout, Schedule
from .shuffle import emitted_indices
from .ownership import EpochLayout, Part, kept_positions

Segment = Tuple[int, ...]  # (world_size, workers, batch_size, steps run[, nodes, columns]: with node affinity)


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


def check_ran(k: int, segment: Sequence[int], planned: int, plan: str = "a plan", of: str = "this data set") -> None:
    """A :class:`~dalistream.errors.StateError` for segment ``k`` having run more steps than its
    layout's plan (of ``planned`` steps) holds: the state comes from other data."""
    if int(segment[3]) > planned:
        raise StateError(f"segment {k} ran {int(segment[3])} steps of {plan} of {planned} under {segment[0]} ranks x "
                         f"{segment[1]} workers x batch {segment[2]}", hint=f"the state does not come from {of}")


@lru_cache(maxsize=4096)
def _emitted(count: int, total: int, size: int, seed: int) -> Tuple[int, ...]:
    """Input ordinals (of ``total``) among the first ``count`` outputs of a buffer of ``size``, sorted."""
    return tuple(sorted(emitted_indices(count, total, size, seed)))


def kth_positions(runs: Sequence[Stretch], ks: Sequence[int]) -> List[int]:
    """Epoch positions of the ``ks``-th kept positions of ``runs`` (those past the runs' end left out)."""
    ks = np.asarray(ks, dtype=np.int64)
    cum = running_starts([r.size for r in runs])
    ks = ks[ks < cum[-1]]
    which = np.searchsorted(cum, ks, side="right") - 1
    out = np.empty(len(ks), dtype=np.int64)
    for j in np.unique(which).tolist():
        run, at = runs[j], which == j
        out[at] = run.start + kept_positions(np.asarray(run.drop, dtype=np.int64) - run.start, ks[at] - cum[j])
    return out.tolist()


class Remaining:
    """The sequence of an epoch left after some segments: ``total`` samples, and :meth:`runs`.
    Level 0 (made here): the whole epoch, ``left`` the epoch positions the first layout's plan
    left out (``even``), the sequence being the samples kept, in order, then those left out;
    each segment more: :meth:`after` (a chain of them: :func:`~.affinity.remaining_after`)."""

    def __init__(self, total: int, schedule: Schedule, epoch: int, shuffle: int, left: Sequence[int] = ()) -> None:
        self.schedule, self.epoch, self.shuffle, self.level = schedule, epoch, shuffle, 0
        self.prev, self.total, self.left = None, int(total), np.asarray(left, dtype=np.int64)

    @classmethod
    def after(cls, prev: "Remaining", bounds: np.ndarray, done: np.ndarray, seed_of) -> "Remaining":
        """The sequence left after one more segment whose global worker ``g`` owned
        ``[bounds[g], bounds[g+1])`` of ``prev`` and delivered the first ``done[g]`` outputs of its
        shuffle buffer, seeded ``seed_of(g)`` (a mix's source: its spans are sized by the takes)."""
        bounds = np.asarray(bounds, dtype=np.int64)
        done = np.minimum(np.diff(bounds), np.asarray(done, dtype=np.int64))
        left = (np.diff(bounds) - done).tolist() + [prev.total - int(bounds[-1])]  # last: no one's (even)
        out = cls(sum(left), prev.schedule, prev.epoch, prev.shuffle)
        out.level, out.prev, out.seed_of, out.bounds, out.done = prev.level + 1, prev, seed_of, bounds, done
        out.cum, out._window = running_starts(left), {}
        return out

    def window(self, g: int) -> Tuple[Tuple[int, ...], Tuple[int, ...], int]:
        """Global worker ``g`` of the last segment: (undelivered ordinals of its window, the
        window's delivered ordinals, where its untouched rest starts), ordinals in its span."""
        if g not in self._window:
            n, c = int(self.bounds[g + 1] - self.bounds[g]), int(self.done[g])  # (c <= n)
            gone = tuple(range(c)) if self.shuffle <= 1 else _emitted(c, n, self.shuffle, self.seed_of(g))
            rest = gone[-1] + 1 if gone else 0
            prefix = next((i for i, o in enumerate(gone) if o != i), len(gone))
            kept = tuple(sorted(set(range(prefix, rest)) - set(gone)))
            self._window[g] = (kept, gone[prefix:], rest)
        return self._window[g]

    def runs(self, lo: int, hi: int) -> List[Stretch]:
        """Positions ``[lo, hi)`` of this sequence as runs of epoch positions, in order."""
        if hi <= lo:
            return []
        if self.prev is None:  # the epoch's sequence: the samples kept, then those left out
            return kept_first_runs(lambda x, y: [Stretch(x, y)], self.total, self.left, lo, hi)
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
                    out += _with_drops(inner, holes)
                if b > len(kept):
                    out += self.prev.runs(base + rest + max(0, a - len(kept)), base + rest + b - len(kept))
            g += 1
        return merged_runs(out)


def kept_first_runs(runs: Callable[[int, int], List[Stretch]], total: int, left: np.ndarray, lo: int,
                    hi: int) -> List[Stretch]:
    """Positions ``[lo, hi)`` of a sequence of ``total`` positions reordered: those not in ``left``
    (sorted) in their order, then those of ``left``; ``runs(x, y)`` gives positions ``[x, y)`` of
    the sequence itself as runs. A stretch of kept positions reads the sequence from its first
    position up to the next kept one (or just past its last, at the end), the left-out positions
    inside as its drops: the stretches of :meth:`~.ownership.EpochLayout.parts_of`."""
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
        out += _with_drops(inner, holes)
    for h in left[max(lo, kept) - kept:max(hi, kept) - kept].tolist():
        out += runs(h, h + 1)
    return merged_runs(out)


def _with_drops(runs: List[Stretch], ordinals: Sequence[int]) -> List[Stretch]:
    """``runs`` passing over their ``ordinals``-th positions too (:func:`kth_positions`)."""
    if not len(ordinals):
        return runs
    pos = np.asarray(kth_positions(runs, ordinals), dtype=np.int64)
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
