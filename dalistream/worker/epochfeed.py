"""A worker's later epoch read at once, when it is small: :func:`read_epoch` and :class:`EpochFeed`.

A worker reading interleaved columns of a small data set reads every column's part of a later
epoch in its first round anyway (each part is one run). Through the columns (:class:`~.feed.Feed`)
each part then costs its column an opening, a numbering, a cut of its neighbours' read, items
through the column and slicings of its rows at every round: ~50 µs per column and epoch, which is
~2 µs a sample when 256 columns read 23 samples each. Here the same epoch is read by ranges: the
parts of a shard that lie end to end are one read (``sliced_runs``, the column path's own reader
and header check), every run is decoded together (:func:`~.rows.decode_runs`), each column's
rows are an index array over the decoded rows (less the plan's drops), and each step takes its
rows by index. What each step holds, in which order, is the column path's, byte for byte
(``tests/worker/test_epochfeed.py``).

Only the plain case is read this way, and the column path reads every other: the job's first
epoch (its first batch waits for short first runs, and a resumed epoch starts mid-way), one span
per worker (its one column pays nothing per column), a mix, the ``fixed`` policy (a column reads
its parts again), a part of a remote or unlaid-out shard, a part read twice, more than
:data:`EPOCH_BYTES` (or :data:`COPIED_BYTES` into the worker's buffers), and anything amiss in
the reading (a damaged or changed shard, a sample the decoder refuses): the column path then
reads the epoch from its start and meets the problem where it lies, in order, as it always does.
Nothing is given out before the whole epoch is read, so a fallback repeats no sample.
"""

from __future__ import annotations

import bisect
import operator
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DalistreamError
from ..io.stores import is_ranged
from ..io.streams import chunk_bytes
from ..plan import WorkerPlan
from ..tar.runs import Run
from .neighbours import TOGETHER_BYTES, range_runs
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
        return None  # (``fixed`` reads a column's parts again; without offsets no part has a layout)
    by_shard: Dict[int, List[Tuple[int, int]]] = {}
    for plan in plans:
        for index, first, stop in plan.parts:
            if stop is None or stop <= first:
                return None
            by_shard.setdefault(index, []).append((first, stop))
    ranges = []  # (index, first, stop, layout, bytes)
    total = copied = 0
    for index, parts in sorted(by_shard.items()):
        url = reader.data.urls[index]
        if is_ranged(url):
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
            if layout is None:
                return None
            g = reader.geometry(index)
            size = int(g.sample_start[stop] - g.sample_start[first])
            total += size
            copied += size if size <= TOGETHER_BYTES else 0
            if copied > COPIED_BYTES or total > EPOCH_BYTES:
                return None
            ranges.append((index, first, stop, layout, size))
    runs = _read(reader, ranges, stats)
    if runs is None:
        return None
    return _feed(reader, plans, takes, policy, runs)


def _read(reader: "PlanReader", ranges: Sequence[tuple], stats: WorkerStats) -> Optional[List[Tuple[int, Run]]]:
    """Each range's runs, decoded (``(shard, run)`` in order), or ``None`` where anything is amiss."""
    chunk = chunk_bytes(reader.config.storage_options)
    out: List[Tuple[int, Run]] = []
    try:
        for index, first, stop, layout, size in ranges:
            # (a range of up to half a buffer is one run in the arena; a longer one is cut out of the mapping)
            items = range_runs(reader, index, first, stop, layout, stats, chunk, (size,) if size <= TOGETHER_BYTES else ())
            if not all(isinstance(item, Run) for item in items) or sum(len(r) for r in items) != stop - first:
                return None
            out += [(index, run) for run in items]
    except (DalistreamError, OSError, EOFError):
        return None
    decode_runs(reader.rows, [(run, reader.source_name) for _, run in out])
    if any(run.decoded[1] for _, run in out):  # a sample the per-sample path must settle
        return None
    return out


def _feed(reader: "PlanReader", plans: Sequence[WorkerPlan], takes: np.ndarray, policy: ErrorPolicy,
          runs: Sequence[Tuple[int, Run]]) -> EpochFeed:
    """The feed of the decoded ``runs``: each column's rows, its parts' in its order, less its drops."""
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
    for c, plan in enumerate(plans):
        pieces = []
        for index, first, stop in plan.parts:
            firsts, spans = where[index]
            k = bisect.bisect_right(firsts, first) - 1
            while first < stop:  # (a part may span runs: a mapped range is cut into runs)
                s, n, a = spans[k]
                end = min(stop, s + n)
                pieces.append(np.arange(a + first - s, a + end - s, dtype=np.int64))
                first, k = end, k + 1
        own = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        if len(plan.drop):
            own = np.delete(own, np.asarray(plan.drop, np.int64))
        rows.append(own)
    return EpochFeed(flat, rows, takes, policy)
