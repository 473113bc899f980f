"""What one worker executes of a bucket plan (:mod:`.buckets`): its *readers* — stretches of the
epoch sequence it reads at once, each front to back — and, at each step, which of their samples
go where in the batch. This is the interface the worker's reading loop follows:

- ``readers[j] = (parts, drop)``: shard parts in reading order and the raw ordinals (over those
  parts' samples) to skip without decoding or holding (another rank's, or already delivered);
  the samples kept are reader j's, numbered 0, 1, … in reading order;
- at step t the worker emits ``take[t]`` samples — reader ``emit_reader[i]``'s sample
  ``emit_index[i]`` for i in ``c[t] … c[t+1]−1`` (``c`` the running sum of ``take``) — into batch
  positions ``offset[t] … offset[t] + take[t] − 1``; every other position of its batch is padding;
- the step's bucket is ``bucket[t]`` (``-1``: a step of padding only), the same in all the
  rank's workers (and all ranks with ``per="global"``);
- ``lookahead``: the most samples it holds at once — read (up to the last one it has had to
  emit, reader by reader) and not yet emitted, the step's own included;
- ``fill[t]``: the samples of the rank's whole batch at step t (the rest of it is padding).

:func:`bucket_run` turns one worker's plans (one, or one per source of a mix) into what its
reading loop does from a step on (:class:`BucketRun`): each reader as a
:class:`~.ownership.WorkerPlan` read from its first ordinal still needed, passing over those
already emitted (a resume) or never emitted (a mix's steps past its epoch); how many rows each
reader gives at each step (its frontier: up to the last sample the step emits from it, no
further); and each step's emissions as keys ``reader << 40 | ordinal``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Optional, Sequence, Tuple

import numpy as np

from .ownership import Part, WorkerPlan

Reader = Tuple[Tuple[Part, ...], Tuple[int, ...]]  # (parts, drop)


@dataclass(frozen=True, eq=False)
class BucketWorkerPlan:
    """One worker's part of one epoch's bucket plan (see the module doc)."""

    rank: int
    worker: int
    epoch: int
    steps: int
    global_worker: int
    readers: Tuple[Reader, ...]
    emit_reader: np.ndarray
    emit_index: np.ndarray
    take: np.ndarray
    offset: np.ndarray
    bucket: np.ndarray
    lookahead: int
    fill: np.ndarray

    def reader(self, j: int) -> WorkerPlan:
        """Reader ``j`` as a :class:`~.ownership.WorkerPlan` (its parts and drops), which the
        worker's reader reads as any column."""
        parts, drop = self.readers[j]
        size = sum(int(stop) - int(first) for _, first, stop in parts)
        return WorkerPlan(self.rank, self.worker, self.epoch, parts, self.steps, 1, 0, size - len(drop),
                          self.global_worker, 0, drop)


KEY_SHIFT = 1 << 40  # a held sample's key: reader << 40 | ordinal


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")``, in linear time where the keys fit 16 bits (numpy
    sorts those by radix: the plans' owners, buckets and steps mostly do)."""
    keys = np.asarray(keys)
    if len(keys) and keys.dtype.kind in "iu" and -(1 << 15) <= int(keys.min()) and int(keys.max()) < (1 << 15):
        keys = keys.astype(np.int16)
    return np.argsort(keys, kind="stable")


@dataclass(frozen=True, eq=False)
class BucketRun:
    """What a worker's reading loop does from step ``first`` to ``steps`` (see the module doc).

    ``readers[g]`` is read from ordinal ``start[g]`` on, passing over the ordinals ``gone[g]``;
    ``reads[t, g]`` rows of it are read at step t; step t emits the samples ``emit[bounds[t]:
    bounds[t + 1]]`` (keys ``g << 40 | ordinal``) into batch positions ``offset[t]``, …, with
    bucket ``bucket[t]``; ``source[g]``/``step_source[t]``: a mix's source of a reader and of a
    step (0 for one data set); ``fill[t]``: samples of the rank's batch at step t."""

    first: int
    steps: int
    readers: Tuple[WorkerPlan, ...]
    source: Tuple[int, ...]
    start: Tuple[int, ...]
    gone: Tuple[FrozenSet[int], ...]
    reads: np.ndarray
    emit: np.ndarray
    bounds: np.ndarray
    offset: np.ndarray
    bucket: np.ndarray
    step_source: np.ndarray
    fill: np.ndarray


def bucket_run(plans: Sequence[BucketWorkerPlan], first: int = 0, source: Optional[np.ndarray] = None,
               source_step: Optional[np.ndarray] = None) -> BucketRun:
    """The :class:`BucketRun` of ``plans`` from step ``first`` on: one plan, whose steps are the
    run's, or a mix's (``plans[s]`` source s's, step t of the run being step ``source_step[t]``
    of ``plans[source[t]]``; a plan's steps not named are not run)."""
    if source is None:
        source, source_step = np.zeros(plans[0].steps, np.int64), np.arange(plans[0].steps)
    source, source_step = np.asarray(source, np.int64), np.asarray(source_step, np.int64)
    steps = len(source)
    readers, reader_source, keys, times = [], [], [], []
    for s, p in enumerate(plans):
        run_of = np.full(p.steps + 1, -1, np.int64)  # plan step -> run step (-1: not run)
        at = np.flatnonzero(source == s)
        run_of[source_step[at]] = at
        t = run_of[np.repeat(np.arange(p.steps), p.take)]
        mine = t >= first
        keys.append((p.emit_reader[mine] + len(readers)) * KEY_SHIFT + p.emit_index[mine])
        times.append(t[mine])
        readers += [p.reader(j) for j in range(len(p.readers))]
        reader_source += [s] * len(p.readers)
    key, time = (np.concatenate(keys), np.concatenate(times)) if keys else (np.zeros(0, np.int64),) * 2
    order = stable_argsort(time)  # a step's emissions keep their plan's (batch) order
    key, time = key[order], time[order]
    g, ordinal = key // KEY_SHIFT, key % KEY_SHIFT
    reached = frontier(g, ordinal, time, len(readers), steps)
    rows = np.zeros((len(readers), steps), np.int64)
    start, gone = [], []
    by_reader = stable_argsort(g)
    edges = np.searchsorted(g[by_reader], np.arange(len(readers) + 1))
    for r in range(len(readers)):
        needed = np.sort(ordinal[by_reader[edges[r]:edges[r + 1]]])
        rows[r] = np.searchsorted(needed, reached[r])
        lo = int(needed[0]) if len(needed) else 0
        hi = int(needed[-1]) + 1 if len(needed) else 0
        start.append(lo)
        gone.append(frozenset(np.setdiff1d(np.arange(lo, hi), needed).tolist()) if hi - lo > len(needed) else frozenset())
    reads = np.diff(rows, axis=1, prepend=0).T if steps else np.zeros((0, len(readers)), np.int64)

    def per_step(name: str) -> np.ndarray:
        return np.array([getattr(plans[s], name)[j] for s, j in zip(source.tolist(), source_step.tolist())],
                        dtype=np.int64)

    return BucketRun(int(first), steps, tuple(readers), tuple(reader_source), tuple(start), tuple(gone),
                     np.ascontiguousarray(reads), key, np.searchsorted(time, np.arange(steps + 1)),
                     per_step("offset"), per_step("bucket"), source, per_step("fill"))


def frontier(reader: np.ndarray, index: np.ndarray, step: np.ndarray, readers: int, steps: int) -> np.ndarray:
    """``(readers, steps)``: how far each reader is read at each step: up to the last sample
    emitted from it so far (``reader[i]``'s ordinal ``index[i]``, emitted at ``step[i]``), plus one."""
    last = np.full((readers, steps), -1, np.int64)
    np.maximum.at(last, (reader, step), index)
    return np.maximum.accumulate(last, axis=1) + 1 if steps else last


def holdings(reader: np.ndarray, index: np.ndarray, step: np.ndarray, steps: int) -> np.ndarray:
    """Samples a worker holds at each step: every reader read up to the last sample emitted from
    it so far, less the samples emitted at earlier steps. ``reader[i]``, ``index[i]``, ``step[i]``:
    reader, ordinal in it and step of each sample it emits."""
    if not len(step):
        return np.zeros(steps, dtype=np.int64)
    read = frontier(reader, index, step, int(reader.max()) + 1, steps).sum(axis=0)
    emitted = np.bincount(step, minlength=steps)[:steps]
    return read - (np.cumsum(emitted) - emitted)
