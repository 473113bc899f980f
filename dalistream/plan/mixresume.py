"""Elastic resume of a mix: the rest of an epoch after *segments* that ran under other layouts
(``(world_size, workers, batch_size, steps)`` each, as for one data set). Pure functions of
(counts, weights, layouts, schedule, epoch, shuffle).

Per source the rule of :mod:`.resume`: a global worker of a past segment delivered the first
``d`` outputs of its shuffle buffer over its span of the source, ``d`` the samples of the source
its slot took in the steps it ran, so each source's remaining sequence is a
:class:`~.resume.Remaining` built from those counts. The composition goes on where it stood:
the rule (:func:`~.mix.cumulative`) continues after the units already dealt — ``n0 = Σ steps ×
B`` sample slots per rank, or ``Σ steps`` whole batches for ``per_batch="source"`` — in batches
of the new size, so every prefix of the epoch stays within one unit of the weights; the rest of the epoch is the largest number of steps for which no source runs
past its remaining samples. With ``samples_per_epoch`` the rule and the passes run on across
epochs, so level 0 is the epoch's range of each source's passes from its cursor, and a span may
cross a pass's end (its parts then come from two passes). Each new worker's span of each source's remaining sequence is sized
by what its slot takes of it, and read as parts minus the few positions already delivered.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import StateError
from . import seeds
from .layout import Layout, Schedule
from .mix import MixEpoch, cumulative, worker_take
from .mixcolumns import column_sizes, worker_columns
from .ownership import Part, WorkerPlan
from .resume import Remaining, Stretch, runs_to_parts, segment_layout


def continued_counts(weights: Sequence[float], n0: int, layout: Layout, steps: int, per_batch: str) -> np.ndarray:
    """``(steps, S)``: samples of each source in each rank batch of the continued rule, which has
    dealt ``n0`` units (sample slots, or whole batches for ``per_batch="source"``) so far."""
    b = layout.batch_size
    if per_batch == "sample":
        return np.diff(cumulative(weights, n0 + np.arange(steps + 1, dtype=np.int64) * b), axis=0)
    return np.diff(cumulative(weights, n0 + np.arange(steps + 1, dtype=np.int64)), axis=0) * b


def continued_steps(weights: Sequence[float], n0: int, layout: Layout, totals: Sequence[int],
                    per_batch: str = "sample") -> int:
    """The largest t for which no source's samples in the next t steps (on all ranks) exceed
    ``totals[s]``."""
    r, b = layout.world_size, layout.batch_size
    lo, hi = 0, (int(sum(totals)) // (r * b)) + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        used = r * continued_counts(weights, n0, layout, mid, per_batch).sum(axis=0)
        if np.all(used <= np.asarray(totals, dtype=np.int64)):
            lo = mid
        else:
            hi = mid - 1
    return lo


class MixResume:
    """The rest of ``epoch`` of a mix after ``segments``, planned over ``layout`` (computed once,
    then :meth:`worker` per (rank, worker)); ``steps`` every rank runs."""

    def __init__(self, counts: Sequence[Sequence[int]], weights: Sequence[float], names: Sequence[str],
                 per_batch: str, samples_per_epoch, layout: Layout, schedule: Schedule, epoch: int,
                 segments: Sequence[Sequence[int]], shuffle: int, interleave: bool = False) -> None:
        self.weights, self.names, self.layout, self.schedule, self.epoch = list(weights), list(names), layout, schedule, epoch
        self.per_batch, self.interleave = per_batch, bool(interleave)
        first = MixEpoch(counts, weights, segment_layout(segments[0]), schedule, epoch, names, per_batch,
                         samples_per_epoch, interleave)
        self._passes = first  # each source's shard order per pass
        # level 0, per source: the epoch's positions from its cursor (default epochs: the whole pass
        # from 0, its tail no one owned included; samples_per_epoch: the epoch's range of the passes)
        self.base = first.bounds[:, 0].copy()
        lengths = ([int(np.sum(c)) for c in counts] if samples_per_epoch is None
                   else (first.bounds[:, -1] - first.bounds[:, 0]).tolist())
        rem: List[Remaining] = [Remaining(int(n), schedule, epoch, (), shuffle) for n in lengths]
        # the rule's units dealt before this epoch: it runs on across epochs with samples_per_epoch
        dealt_steps = epoch * first.steps if samples_per_epoch is not None else 0
        n0 = dealt_steps * first.layout.batch_size if per_batch == "sample" else dealt_steps
        for level, segment in enumerate(segments):
            past, ran = segment_layout(segment), int(segment[3])
            if level == 0:
                bounds, take, planned = [b - b[0] for b in first.columns], first.take, first.steps
            else:
                bounds, take, planned = self._plan(rem, n0, past)
            if ran > planned:
                raise StateError(f"segment {level} ran {ran} steps of a plan of {planned} under {past.world_size} ranks "
                                 f"x {past.workers} workers x batch {past.batch_size}",
                                 hint="the state does not come from this mix")
            ks = [(len(b) - 1) // past.global_workers for b in bounds]
            done, _ = column_sizes(take[:ran], past, self.interleave, ks)  # per source: delivered per column
            rem = [Remaining.after(rem[s], bounds[s], done[s],
                                   lambda c, s=s, level=level: seeds.segment_source_shuffle(schedule.seed, epoch, level, s, c))
                   for s in range(len(rem))]
            n0 += ran * past.batch_size if per_batch == "sample" else ran  # units dealt: slots, or batches
        self.rest, self.level = rem, len(segments)
        self.columns, self.take, self.steps = self._plan(rem, n0, layout)
        self.bounds = np.stack([b[:layout.global_workers + 1] for b in self._plan(rem, n0, layout, False)[0]])

    def _plan(self, rem: Sequence[Remaining], n0: int, layout: Layout,
              interleave: Optional[bool] = None) -> Tuple[List[np.ndarray], np.ndarray, int]:
        """``(per source the bounds of its columns, take (steps, W, S), steps)`` of ``layout`` over
        ``rem`` from slot ``n0`` (the columns: the workers' spans, or interleaved,
        :func:`~.mix.column_sizes`)."""
        steps = continued_steps(self.weights, n0, layout, [r.total for r in rem], self.per_batch)
        take = worker_take(continued_counts(self.weights, n0, layout, steps, self.per_batch), layout)
        sizes, _ = column_sizes(take, layout, self.interleave if interleave is None else interleave)
        return [np.concatenate([[0], np.cumsum(z)]) for z in sizes], take, steps

    def _parts(self, s: int, runs: Sequence[Stretch]) -> Tuple[List[Part], List[int]]:
        """Parts and drops of ``runs`` (level-0 positions of source ``s``), over its passes: a run
        crossing the end of a pass reads the pass's last parts, then the next pass's first."""
        mix, total = self._passes, int(self._passes.totals[s])
        parts: List[Part] = []
        drop: List[int] = []
        raw = 0
        for run in runs:
            start, stop = run.start + int(self.base[s]), run.stop + int(self.base[s])
            holes = np.asarray(run.drop, dtype=np.int64) + int(self.base[s])
            while start < stop:
                n_pass, at = divmod(start, total)
                end = min(stop, start - at + total)
                piece = Stretch(at, at + end - start, tuple((holes[(holes >= start) & (holes < end)] - start + at).tolist()))
                got, dropped = runs_to_parts(mix.pass_layout(s, mix.first_pass(s) + n_pass), [piece])
                parts += got
                drop += [raw + d for d in dropped]
                raw += end - start
                start = end
        return parts, drop

    def worker_columns(self, rank: int, worker: int) -> List[Tuple[WorkerPlan, np.ndarray, int]]:
        """What (``rank``, ``worker``) reads of the rest of the epoch: per source, each of its
        columns as ``(plan, take per step, source)`` (parts, drops, its seed), sources in order."""
        layout = self.layout

        def plan(s: int, c: int) -> WorkerPlan:
            lo, hi = int(self.columns[s][c]), int(self.columns[s][c + 1])
            parts, drop = self._parts(s, self.rest[s].runs(lo, hi))
            return WorkerPlan(rank, worker, self.epoch, tuple(parts), self.steps, layout.slots[worker],
                              layout.slot_offsets[worker], hi - lo, layout.global_worker(rank, worker), 0, tuple(drop),
                              seeds.segment_source_shuffle(self.schedule.seed, self.epoch, self.level, s, c))

        return worker_columns(self.take, layout, rank, worker, self.interleave, plan)

    def worker(self, rank: int, worker: int) -> List[Tuple[WorkerPlan, np.ndarray]]:
        """Per source: the :class:`WorkerPlan` of (``rank``, ``worker``) (parts, drops, its seed)
        and what its slot takes of the source at each step."""
        layout = self.layout
        g = layout.global_worker(rank, worker)
        out = []
        for s in range(len(self.rest)):
            lo, hi = int(self.bounds[s, g]), int(self.bounds[s, g + 1])
            parts, drop = self._parts(s, self.rest[s].runs(lo, hi))
            plan = WorkerPlan(rank, worker, self.epoch, tuple(parts), self.steps, layout.slots[worker],
                              layout.slot_offsets[worker], hi - lo, g, 0, tuple(drop),
                              seeds.segment_source_shuffle(self.schedule.seed, self.epoch, self.level, s, g))
            out.append((plan, self.take[:, worker, s]))
        return out
