"""A worker's interleaved epoch read at once, in shares of its steps: :func:`read_epoch`,
:class:`EpochShares` and :class:`EpochFeed`.

A worker reading interleaved columns reads every column's part of a share of the epoch's steps
in a round or two anyway. Through the columns (:class:`~.feed.Feed`) each part then costs its
column an opening, a numbering, items through the column and slicings of its rows at every
round: ~50 µs per column and epoch, which is ~2 µs a sample when 256 columns read 23 samples
each. Here a share's rows are read together (:func:`start_share`): each column's part cut where
the share's rows of it begin and end (:func:`_taken`: what ``even`` leaves out is not read), the
share read from one mapping of its shards (:class:`~.mapped.MappedShare`: one header gather and
one decode call per piece, whatever the number of shards and columns, no copy and no buffer of
the worker's own). Each column's rows are an index array over the decoded rows (less the plan's
drops, an elastic resume's included), and each step takes its rows by index. What each step
holds, in which order, is the column path's, byte for byte (``tests/worker/test_one_reader.py``).

The shares (:func:`share_bounds`): an epoch of at most :data:`WHOLE_BYTES` is one, its first
batch waiting for the whole read; a larger one is cut into a first of about
:data:`FIRST_SHARE_BYTES`, which its first batch waits for, then shares of :data:`SHARE_BYTES`.
While a share is given out, the next is read from its mapping in pieces, a few at each step and
the last by the share's last step but one, as one span's reads fall between its batches. Each
share is held until the next is taken.

Only the plain case is read this way, and the column path reads every other: an epoch resumed
mid-way (its earlier samples are not read), one span per worker (its one column pays nothing per
column), a mix, the ``fixed`` policy (a column reads its parts again), shards without member
layouts (the columns find their samples by header walk), a part of a remote or gzipped shard, a
part read twice, a share over :data:`EPOCH_BYTES`, and anything amiss in the reading (a damaged,
cut or changed shard, a file that cannot be mapped, a sample the decoder refuses): the column
path then reads the epoch from the share's first step (as it reads one resumed there) and meets
the problem where it lies, in order, as it always does, and every later epoch of the worker too
(``ShareMaps.whole``, :class:`~.mapped.ShareMaps`: what stopped one read stays, and is not read
twice each epoch). Nothing of a share is given out before the whole share is read, so a
fallback repeats no sample.
"""

from __future__ import annotations

import operator
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..io.streams import maps_parts
from ..plan import WorkerPlan
from .context import ReadContext
from .feed import Feed
from .mapped import MappedShare, ShareMaps
from .policy import ErrorPolicy
from .stats import WorkerStats

EPOCH_BYTES = 1 << 30  # a share read at once: at most this many bytes of a worker's shards (else the columns')
WHOLE_BYTES = 16 << 20  # an epoch of at most this many is one share (its first batch waits for the whole read)
FIRST_SHARE_BYTES = 16 << 20  # a larger epoch's first share (which its first batch waits for) …
SHARE_BYTES = 64 << 20  # … and each after it, read over the steps of the one before


class EpochFeed:
    """Each step's slot (:meth:`take`, as :meth:`~.feed.Feed.take` gives it) from a share of an
    epoch's decoded rows (its steps numbered from 0): ``flat``, one list per field; ``rows[c]``,
    column ``c``'s rows in ``flat`` in its order; ``takes[t, c]``, what step ``t`` takes of
    column ``c``."""

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


class EpochShares:
    """Each step's slot (:meth:`take`) from an epoch read at once in shares of its steps
    (:func:`share_bounds`), each an :class:`EpochFeed`, the next read while one is given out
    (:func:`start_share`). A share that cannot be read hands the rest of the epoch to
    ``columns(step)``, the column path from that step on (as a resume mid-way reads it)."""

    def __init__(self, ctx: ReadContext, maps: ShareMaps, plans: Sequence[WorkerPlan], takes: np.ndarray,
                 policy: ErrorPolicy, stats: WorkerStats, bounds: Sequence[int], columns: Callable[[int], Feed]) -> None:
        self.ctx, self.plans, self.takes, self.policy, self.stats = ctx, plans, takes, policy, stats
        self.bounds, self.columns = list(bounds), columns
        self.rows = np.vstack([np.zeros((1, takes.shape[1]), np.int64), np.cumsum(takes, axis=0)])  # rows before each step
        self.share = -1
        self.start, self.stop = 0, 0  # the steps of the share held
        self.feed: Optional[EpochFeed] = None
        self.rest: Optional[Feed] = None  # the column path, once a share could not be read
        self.next: Optional[MappedShare] = None  # the next share, read over this one's steps
        self.maps = maps  # what a share hands on to the next

    def next_share(self) -> bool:
        """Read the next share (what of it is not read yet); ``False``: it could not be (after the
        first, the columns then read the rest of the epoch from its first step)."""
        self.share += 1
        self.start, self.stop = self.bounds[self.share], self.bounds[self.share + 1]
        self.feed = None  # (the last share's rows freed before the next is taken)
        read, self.next = self.next or self._start(self.share, 1), None
        got = read.finish() if read is not None else None
        self.feed = EpochFeed(got[0], got[1], self.takes[self.start:self.stop], self.policy) if got else None
        if self.feed is None and self.share:
            self.rest = self.columns(self.start)
        if self.feed is not None and self.share + 2 < len(self.bounds):
            self.next = self._start(self.share + 1, self.stop - self.start - 1)
        return self.feed is not None

    def _start(self, share: int, pieces: int) -> Optional[MappedShare]:
        a, b = self.rows[self.bounds[share]], self.rows[self.bounds[share + 1]]
        return start_share(self.ctx, self.plans, a, b, self.stats, self.maps, max(1, pieces))

    def take(self, step: int) -> Tuple[List[list], int, np.ndarray]:
        """Step ``step``'s slot, as :meth:`EpochFeed.take` (or the columns') gives it; the next
        share's pieces read on the way, the last by the share's last step but one."""
        if self.rest is None and step >= self.stop:
            self.next_share()
        if self.rest is not None:
            return self.rest.take(step)
        read = self.next
        if read is not None and read.done < read.pieces:
            want = -(-read.pieces * (step - self.start + 1) // max(1, self.stop - self.start - 1))
            while read.done < min(want, read.pieces) and not read.failed:
                read.piece()
        return self.feed.take(step - self.start)  # type: ignore[union-attr]


def share_bounds(takes: np.ndarray, bytes_per_sample: Optional[float]) -> List[int]:
    """Where an epoch's shares of steps (``takes``: rows per step and column) begin, and its end:
    one share where the epoch is at most :data:`WHOLE_BYTES`, or where the samples' size is not
    known; else a first of about :data:`FIRST_SHARE_BYTES` of samples, then shares of
    :data:`SHARE_BYTES` (each read in pieces over the steps of the one before)."""
    steps = len(takes)
    per_step = np.cumsum(takes.sum(axis=1)) * (bytes_per_sample or 0)
    if not bytes_per_sample or per_step[-1] <= WHOLE_BYTES:
        return [0, steps]
    bounds, want = [0], FIRST_SHARE_BYTES
    while bounds[-1] < steps:
        before = per_step[bounds[-1] - 1] if bounds[-1] else 0.0
        stop = int(np.searchsorted(per_step, before + want, side="right"))
        bounds.append(min(steps, max(stop, bounds[-1] + 1)))
        want = SHARE_BYTES
    return bounds


def read_epoch(ctx: ReadContext, maps: ShareMaps, plans: Sequence[WorkerPlan], takes: np.ndarray,
               policy: ErrorPolicy, stats: WorkerStats, columns: Callable[[int], Feed]) -> Optional[EpochShares]:
    """The epoch of ``plans`` (one per column, all read with ``ctx``, a reader's; ``maps``: what
    its shares hand on to the next, :class:`~.mapped.ShareMaps`) read at once in shares (see the
    module doc), its first share read now; or ``None``: the column path is to read it.
    ``columns(step)``: the column path from ``step`` on, for the rest of an epoch whose later
    share cannot be read."""
    data = ctx.data
    if not len(takes) or not plans or ctx.config.policy == "fixed" or data.offsets is None or data.counts is None:
        return None  # (``fixed`` reads a column's parts again; without offsets no part has a known place)
    if not maps.whole:
        return None
    if any(stop is None or stop <= first for plan in plans for _, first, stop in plan.parts):
        return None
    if getattr(data.offsets, "members", None) is None:
        return None  # (no member layouts: the columns find every sample by header walk)
    bounds = share_bounds(takes, data.bytes_per_sample)
    shares = EpochShares(ctx, maps, plans, takes, policy, stats, bounds, columns)
    return shares if shares.next_share() else None


def start_share(ctx: ReadContext, plans: Sequence[WorkerPlan], before: np.ndarray, after: np.ndarray,
                stats: WorkerStats, maps: ShareMaps, pieces: int) -> Optional[MappedShare]:
    """The read of each column's rows ``before[c]`` to ``after[c]`` from one mapping of their
    shards, in up to ``pieces`` pieces (:class:`~.mapped.MappedShare`); ``None`` where a shard read
    is not local or has no member layout (the columns then read the share). ``maps``: what the
    last share hands on."""
    taken = [_taken(plan, int(lo), int(hi)) for plan, lo, hi in zip(plans, before.tolist(), after.tolist())]
    indices = sorted({index for _, own in taken for index, _, _ in own})
    data = ctx.data
    known = maps.shards is not None and maps.shards.shards == tuple(indices)  # (checked for the share before)
    if not indices or not (known or all(maps_parts(data.urls[i]) and ctx.layouts.layout(i, 0, data.counts[i], None)
                                        is not None for i in indices)):
        return None
    drops = [np.asarray(plan.drop, np.int64) - start for plan, (start, _) in zip(plans, taken)]
    return MappedShare(ctx, maps, indices, [own for _, own in taken], drops, stats, pieces, EPOCH_BYTES)


def _taken(plan: WorkerPlan, lo: int, hi: int) -> Tuple[int, List[Tuple[int, int, int]]]:
    """What ``plan``'s column reads for its rows ``lo`` to ``hi``: the raw position (its drops
    counted) of its ``lo``-th row, and its parts from there up to the sample that gives its
    ``hi``-th row (under ``even`` the job's tail is left out; under ``exact`` a column that runs
    short reads them all)."""
    start, end = _raw(plan, lo), _raw(plan, hi)
    out, at = [], 0
    for index, first, stop in plan.parts:
        if at >= end:
            break
        a, b = max(first, first + start - at), min(stop, first + end - at)
        if a < b:
            out.append((index, a, b))
        at += stop - first
    return start, out


def _raw(plan: WorkerPlan, rows: int) -> int:
    """The raw position in ``plan``'s parts after its first ``rows`` rows (its drops passed over)."""
    raw = rows
    for d in sorted(plan.drop):  # (raw positions: each before the end moves the end one on)
        if d >= raw:
            break
        raw += 1
    return raw
