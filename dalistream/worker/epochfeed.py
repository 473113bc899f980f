"""A worker's epoch read at once, when it is small: :func:`read_epoch` and :class:`EpochFeed`.

A worker reading interleaved columns of a small data set reads every column's part of an epoch
in a round or two anyway (each part is a run or two). Through the columns (:class:`~.feed.Feed`)
each part then costs its column an opening, a numbering, a cut of its neighbours' read, items
through the column and slicings of its rows at every round: ~50 µs per column and epoch, which is
~2 µs a sample when 256 columns read 23 samples each. Here the same epoch is read by ranges:
the parts of a shard that lie end to end are one range, each column's parts cut where its last
step's rows end (:func:`_taken`: what ``even`` leaves out is not read). The shard's file is held
open across its ranges; the ranges that lie apart (with ``R`` ranks a worker's parts lie ``R``
spans apart) are read side by side into one buffer, a read each, their headers checked in one
gather (:func:`~dalistream.tar.runs.ranges_runs`); a long range, and the one that ends the shard
(its end-of-archive check), through ``sliced_runs``, the column path's own reader. A range of a
shard without a member layout (an index of offsets only, samples of differing members) is found
by header walk between its offsets, as a column finds it (:func:`walked_range`). Every run is
decoded together (:func:`~.rows.decode_runs`), each column's rows are an index array over the
decoded rows (less the plan's drops, an elastic resume's included), and each step takes its rows
by index. What each step holds, in which order, is the column path's, byte for byte
(``tests/worker/test_epochfeed.py``).

Only the plain case is read this way, and the column path reads every other: an epoch resumed
mid-way (its earlier samples are not read), one span per worker (its one column pays nothing per
column), a mix, the ``fixed`` policy (a column reads its parts again), a part of a remote or
gzipped shard or of one without offsets, a part read twice, more than :data:`EPOCH_BYTES` (or
:data:`COPIED_BYTES` into the worker's buffers), and anything amiss in the reading (a damaged or
changed shard, a sample the decoder refuses, one the header walk leaves alone: too large for a
run, or without a wanted member): the column path then reads the epoch from its start and meets
the problem where it lies, in order, as it always does, and every later epoch of the worker too
(``PlanReader.whole_epochs``: what stopped one read stays, and is not read twice each epoch).
Nothing is given out before the whole epoch is read, so a fallback repeats no sample, and the
epoch's first batch waits for the whole read (the job's first included: measured against the
columns' short first runs in ``docs/performance.md``).
"""

from __future__ import annotations

import bisect
import os
import itertools
import operator
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DalistreamError
from ..io.local import FileRange, local_path
from ..io.streams import chunk_bytes, maps_parts, open_shard
from ..plan import WorkerPlan
from ..tar.runs import Run, ranges_runs
from .neighbours import TOGETHER_BYTES, range_runs, walk_runs
from .policy import ErrorPolicy
from .rows import decode_runs
from .stats import WorkerStats

if TYPE_CHECKING:
    from .reader import PlanReader

EPOCH_BYTES = 256 << 20  # a worker's epoch read at once: at most this many bytes of its shards …
COPIED_BYTES = 64 << 20  # … of which this many copied into its buffers (a range of over half a buffer is mapped)


class EpochFeed:
    """Each step's slot (:meth:`take`, as :meth:`~.feed.Feed.take` gives it) from an epoch's
    decoded rows: ``flat``, one list per field; ``rows[c]``, column ``c``'s rows in ``flat`` in
    its order; ``takes[t, c]``, what step ``t`` takes of column ``c``."""

    def __init__(self, flat: List[list], rows: Sequence[np.ndarray], takes: np.ndarray, policy: ErrorPolicy) -> None:
        # a column that runs short (``exact``'s last step) gives what it holds: the step is padded at its end
        held = np.array([len(r) for r in rows], np.int64)
        takes = np.diff(np.minimum(np.cumsum(takes, axis=0), held), axis=0, prepend=0) if len(rows) else takes
        self.flat, self.takes, self.policy = flat, takes, policy
        self.all_rows = np.concatenate(list(rows)) if len(rows) else np.zeros(0, np.int64)
        self.base = np.concatenate([[0], np.cumsum([len(r) for r in rows])[:-1]]).astype(np.int64)
        self.before = np.cumsum(takes, axis=0) - takes  # rows each column gave before each step
        self.lattice = bool((takes == 1).all())  # one row of every column a step: no repeats

    def take(self, step: int) -> Tuple[List[list], int, np.ndarray]:
        """Step ``step``'s slot: one list per field, the number of rows, how many came from each column."""
        counts = self.takes[step]
        if self.lattice:
            index = self.all_rows[self.base + step]
        else:
            columns = np.repeat(np.arange(len(counts)), counts)
            within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            index = self.all_rows[self.base[columns] + self.before[step][columns] + within]
        at = index.tolist()
        self.policy.passed += len(at)
        if not at:
            return [[] for _ in self.flat], 0, counts
        if len(at) == 1:
            return [[values[at[0]]] for values in self.flat], 1, counts
        pick = operator.itemgetter(*at)
        return [list(pick(values)) for values in self.flat], len(at), counts


def read_epoch(reader: "PlanReader", plans: Sequence[WorkerPlan], takes: np.ndarray, policy: ErrorPolicy,
               stats: WorkerStats) -> Optional[EpochFeed]:
    """The epoch of ``plans`` (one per column, all read by ``reader``, a
    :class:`~.reader.PlanReader`) read at once (see the module doc), or ``None``: the column
    path is to read it."""
    data = reader.data
    if not len(takes) or not plans or reader.config.policy == "fixed" or data.offsets is None or data.counts is None:
        return None  # (``fixed`` reads a column's parts again; without offsets no part has a known place)
    if not reader.whole_epochs:
        return None
    if any(stop is None or stop <= first for plan in plans for _, first, stop in plan.parts):
        return None
    taken = [_taken(plan, int(take)) for plan, take in zip(plans, takes.sum(axis=0).tolist())]
    by_shard: Dict[int, List[Tuple[int, int]]] = {}
    for own in taken:
        for index, first, stop in own:
            by_shard.setdefault(index, []).append((first, stop))
    ranges = []  # (index, first, stop, layout, bytes)
    total = copied = 0
    for index, parts in sorted(by_shard.items()):
        if not maps_parts(reader.data.urls[index]):  # (a remote or gzip shard: no positions to read by)
            return None
        merged: List[List[int]] = []
        for first, stop in sorted(parts):
            if merged and merged[-1][1] == first:
                merged[-1][1] = stop
            elif merged and first < merged[-1][1]:
                return None  # (a part read twice: the column path's)
            else:
                merged.append([first, stop])
        for first, stop in merged:
            layout = reader.layout(index, first, stop, reader.data.offsets.at(index, first) if first else None)
            if layout is not None:
                starts = reader.geometry(index).sample_start
                size = int(starts[stop] - starts[first])
            else:  # (found by header walk: every member copied)
                size = _walked_bytes(reader, index, first, stop)
                if size is None:
                    return None
            total += size
            copied += size if size <= TOGETHER_BYTES or layout is None else 0
            if copied > COPIED_BYTES or total > EPOCH_BYTES:
                return None
            ranges.append((index, first, stop, layout, size))
    runs = _read(reader, ranges, stats)
    if runs is None:
        reader.whole_epochs = False  # (what stopped it stays: later epochs go to the columns at once)
        return None
    stats.add(bytes=sum(run.nbytes for _, run in runs))  # (the columns count their runs' so)
    return _feed(reader, plans, taken, takes, policy, runs)


def _taken(plan: WorkerPlan, rows: int) -> List[Tuple[int, int, int]]:
    """``plan``'s parts up to the sample that gives its ``rows``-th row (its drops passed over):
    what its column reads of them (under ``even`` the job's tail is left out; under ``exact`` a
    column that runs short reads them all)."""
    raw = rows
    for d in sorted(plan.drop):  # (raw positions: each before the end moves the end one on)
        if d >= raw:
            break
        raw += 1
    out = []
    for index, first, stop in plan.parts:
        if raw <= 0:
            break
        out.append((index, first, min(stop, first + raw)))
        raw -= out[-1][2] - first
    return out


def _read(reader: "PlanReader", ranges: Sequence[tuple], stats: WorkerStats) -> Optional[List[Tuple[int, Run]]]:
    """Each range's runs, decoded (``(shard, run)`` in order), or ``None`` where anything is amiss."""
    chunk = chunk_bytes(reader.config.storage_options)
    out: List[Tuple[int, Run]] = []
    try:
        for index, group in itertools.groupby(ranges, key=operator.itemgetter(0)):
            url, count = reader.data.urls[index], reader.data.counts[index]
            # the shard's file held open across its ranges (a range's opening shares its descriptor:
            # :func:`~dalistream.io.local.open_range`). A range longer than half a buffer (cut out of the
            # mapping) and the shard's last (its end-of-archive check) are read by ``range_runs``; the
            # others side by side into a buffer, half a buffer at a time, a read each (``ranges_runs``)
            with stats.io_clock.timed():
                whole = open_shard(url, 0, reader.config.storage_options)
            with whole:
                if not isinstance(whole, FileRange):  # (gzip content under a .tar name: no positions)
                    return None
                runs: List[Run] = []
                beside: List[List[Tuple[int, int, int]]] = []  # (shares of up to half a buffer)
                held = 0
                for _, first, stop, layout, size in group:
                    if layout is None or size > TOGETHER_BYTES or stop == count:
                        if layout is None:
                            items = walked_range(reader, index, first, stop, stats, chunk)
                        else:
                            items = range_runs(reader, index, first, stop, layout, stats, chunk,
                                               (size,) if size <= TOGETHER_BYTES else ())
                        if not _whole(items, first, stop):
                            return None
                        runs += items
                        continue
                    if not beside or held + size > TOGETHER_BYTES:
                        beside.append([])
                        held = 0
                    beside[-1].append((first, stop, layout[3]))
                    held += size
                for share in beside:
                    got = ranges_runs(whole, url, reader.geometry(index), share, reader.arena, stats.io_clock)
                    if got is None:
                        return None
                    runs += got
                out += [(index, run) for run in sorted(runs, key=operator.attrgetter("first"))]
    except (DalistreamError, OSError, EOFError):
        return None
    decode_runs(reader.rows, [(run, reader.source_name) for _, run in out])
    if any(run.decoded[1] for _, run in out):  # a sample the per-sample path must settle
        return None
    return out


def _walked_bytes(reader: "PlanReader", index: int, first: int, stop: int) -> Optional[int]:
    """The bytes of samples ``first … stop`` of local shard ``index`` as its offsets place them
    (to the file's end for its last), or ``None`` where they do not."""
    start, end = reader.byte_range(index, first, stop)
    if (first and start is None) or (end is None and stop < reader.data.counts[index]):
        return None
    try:
        return (os.path.getsize(local_path(reader.data.urls[index])) if end is None else end) - (start or 0)
    except OSError:
        return None


def walked_range(reader: "PlanReader", index: int, first: int, stop: int, stats: WorkerStats, chunk: int) -> list:
    """Samples ``first … stop`` of local shard ``index`` found by header walk
    (:func:`~.neighbours.walk_runs`), between the offsets of its first and its stop (to the end,
    checked, where ``stop`` is the shard's end): runs of up to :data:`TOGETHER_BYTES`, and
    sample dicts where anything is amiss. Raises what opening and reading raise."""
    url = reader.data.urls[index]
    start, end = reader.byte_range(index, first, stop)
    with stats.io_clock.timed():
        opened = open_shard(url, start or 0, reader.config.storage_options, end)
    with opened as f:
        return list(walk_runs(reader, f, url, first, lambda i: True, stats, chunk, TOGETHER_BYTES, ()))


def _whole(items: Sequence, first: int, stop: int) -> bool:
    """Whether ``items`` are runs of samples ``first`` to ``stop``, one after the other."""
    for item in items:
        if not isinstance(item, Run) or item.first != first:
            return False
        first += len(item)
    return first == stop


def _feed(reader: "PlanReader", plans: Sequence[WorkerPlan], parts: Sequence[Sequence[Tuple[int, int, int]]],
          takes: np.ndarray, policy: ErrorPolicy, runs: Sequence[Tuple[int, Run]]) -> EpochFeed:
    """The feed of the decoded ``runs``: each column's rows, its ``parts`` (:func:`_taken`) in its
    order, less its plan's drops."""
    flat: List[list] = [[] for _ in reader.config.fields]
    # shard -> its runs' first samples, and each run's (first sample, samples, first row in flat)
    where: Dict[int, Tuple[List[int], List[Tuple[int, int, int]]]] = {}
    at = 0
    for index, run in runs:
        for values, column in zip(flat, run.decoded[0]):
            values += column
        firsts, spans = where.setdefault(index, ([], []))
        firsts.append(run.first)
        spans.append((run.first, len(run), at))
        at += len(run)
    rows = []
    for plan, own_parts in zip(plans, parts):
        pieces = []
        for index, first, stop in own_parts:
            firsts, spans = where[index]
            k = bisect.bisect_right(firsts, first) - 1
            while first < stop:  # (a part may span runs: a mapped range is cut into runs)
                s, n, a = spans[k]
                end = min(stop, s + n)
                pieces.append(np.arange(a + first - s, a + end - s, dtype=np.int64))
                first, k = end, k + 1
        own = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        if len(plan.drop):
            drop = np.asarray(plan.drop, np.int64)
            own = np.delete(own, drop[drop < len(own)])  # (drops past what it reads: not read)
        rows.append(own)
    return EpochFeed(flat, rows, takes, policy)
