"""A worker's epoch in shares of its steps: :func:`read_epoch`, :class:`EpochShares` and
:class:`EpochFeed`, the one feed of every epoch's steps: each share's rows read at once where they
can be, else by the columns a round at a time (:class:`~.feed.ColumnRounds`, the column path:
:func:`read_by_columns`).

A worker reading interleaved columns reads every column's part of a share of the epoch's steps
in a round or two anyway. Through the columns each part then costs its
column an opening, a numbering, a cut of its neighbours' read, items through the column and
slicings of its rows at every round: ~50 µs per column and epoch, which is ~2 µs a sample when
256 columns read 23 samples each. Here a share's rows are read together (:func:`start_share`):
each column's part cut where the share's rows of it begin and end (:func:`_taken`: what
``even`` leaves out is not read). Where every shard of the share is local and has a member
layout, the share is read from one mapping of its shards (:class:`~.mapped.MappedShare`: one
header gather and one decode call per piece, whatever the number of shards and columns, no copy
and no buffer of the worker's own). Any other share (remote shards with offsets; shards without a
member layout: an index of offsets only, shards with folders, links or long names) is read by
ranges (:class:`ShareRead`): the parts of a shard that lie end to end are one range, the ranges of
consecutive such shares one sequence (:class:`RangeSequence`: remote ranges fetched ahead across
shares by the worker's read-ahead), each range read as a column reads a part (:func:`~.part.read_part`: cut by its
member layout, or found by header walk), its members copied into the worker's buffers, every run
decoded together (:func:`~.rows.decode_runs`).
Each column's rows are an index array over the decoded rows (less the plan's drops, an elastic
resume's included), and each step takes its rows by index. What each step holds, in which
order, is the column path's, byte for byte (``tests/worker/test_one_reader.py``).

The shares (:func:`share_bounds`): an epoch of at most :data:`WHOLE_BYTES` is one, its first
batch waiting for the whole read; a larger one is cut into a first of about
:data:`FIRST_SHARE_BYTES`, which its first batch waits for, then shares growing
:data:`GROWTH`-fold to :data:`SHARE_BYTES` (found by header walk: to :data:`WALKED_SHARE_BYTES`,
within what a share may copy). While a share is given out, the next is read from its mapping in
pieces, none at the share's first step (but a share of one step's), a few at each later one and
the last by the share's last step, as one span's reads fall between its batches (a share read
by ranges is read when its first step is taken): the job's first batch waits for a small first
share alone, its next ones for a piece of a small second share each. Each share is held until the next is taken.

An interleaved epoch is read at once, fresh or resumed mid-way (from its step: the rows before are
not read): of one data set, of a mix (each source's columns by its own reader,
:class:`SourceFeeds`), and a bucket plan's fresh epoch (its readers, :meth:`EpochShares.round_of`);
local or remote. The column path reads every other: one span per worker (its one column pays
nothing per column), a bucket plan's resumed epoch and a bucketed mix, the ``fixed`` policy (a
column reads its parts again), a part of a gzipped shard or of one without offsets, a part read
twice, a share over :data:`EPOCH_BYTES` (or ranges over :data:`COPIED_BYTES`), and anything amiss
in the reading (a damaged, cut or changed shard, a file that cannot be mapped, a sample the
decoder refuses, one the header walk leaves alone: too large for a run, or without a wanted
member): the column path then reads the epoch from the share's first step (as it reads one
resumed there; :meth:`EpochShares.by_columns`, its rounds the shares) and meets the problem where
it lies, in order, as it always does, and every later epoch of the worker too
(``ShareMaps.whole``, :class:`~.mapped.ShareMaps`: what stopped one read stays, and is not read
twice each epoch).
Nothing of a share is given out before the whole share is read, so a fallback repeats no
sample.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import operator
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DalistreamError
from ..io.local import local_path
from ..io.remote import is_ranged
from ..io.streams import ShardSequence, is_gzip_name, maps_parts, open_shard
from ..plan import WorkerPlan
from ..plan.bucketworker import KEY_SHIFT
from ..tar.runs import Run, concat_ranges
from .context import ReadContext
from .feed import ColumnRounds
from .mapped import MappedShare, ShareMaps
from .numbering import Numbering
from .part import read_part
from .policy import ErrorPolicy
from .rows import decode_runs, gather, less_drops
from .stats import WorkerStats

EPOCH_BYTES = 1 << 30  # a share read at once: at most this many bytes of a worker's shards (else the columns')
WHOLE_BYTES = 16 << 20  # an epoch of at most this many is one share (its first batch waits for the whole read)
FIRST_SHARE_BYTES = 4 << 20  # a larger epoch's first share (which its first batch waits for) …
SHARE_BYTES = 64 << 20  # … and each after it, read over the steps of the one before, …
GROWTH = 4  # … growing to it from the first this many times over at each share (a first batch's next ones small)
# a share read by ranges (remote, or found by header walk) is copied into the worker's buffers: at most this …
COPIED_BYTES = 64 << 20
WALKED_SHARE_BYTES = COPIED_BYTES // 2  # … so such an epoch's shares are of this (room for samples over the mean)
WALKED_RUN_BYTES = 4 << 20  # a range's runs found by header walk: at most this many bytes (half an arena buffer)


class EpochFeed:
    """Each step's slot (:meth:`take`) from a share of an epoch's decoded rows (its steps
    numbered from 0): ``flat``, one list per field; ``rows[c]``, column ``c``'s rows in ``flat``
    in its order, or, where the columns' rows lie in ``flat`` column after column (the column
    path's), how many each holds; ``takes[t, c]``, what step ``t`` takes of column ``c``.
    ``counted``: the rows taken are counted as samples that passed (the column path counts its
    own)."""

    def __init__(self, flat: List[list], rows: Union[Sequence[np.ndarray], np.ndarray], takes: np.ndarray,
                 policy: ErrorPolicy, counted: bool = True) -> None:
        laid = isinstance(rows, np.ndarray)
        held = rows if laid else np.array([len(r) for r in rows], np.int64)
        # a column that runs short (``exact``'s last step) gives what it holds: the step is padded at its end
        takes = np.diff(np.minimum(np.cumsum(takes, axis=0), held), axis=0, prepend=0) if len(held) else takes
        self.flat, self.takes, self.policy, self.counted = flat, takes, policy, counted
        self.order = None if laid else np.concatenate(list(rows)) if len(rows) else np.zeros(0, np.int64)
        self.base = np.concatenate([[0], np.cumsum(held)[:-1]]).astype(np.int64)
        self.before = np.cumsum(takes, axis=0) - takes  # rows each column gave before each step
        self.lattice = bool((takes == 1).all())  # one row of every column a step: no repeats
        # (laid out column after column, a row of each a step: step t's rows are every M-th from t)
        self.stride = len(takes) if laid and self.lattice and bool((held == len(takes)).all()) else 0

    def take(self, step: int) -> Tuple[List[list], int, np.ndarray]:
        """Step ``step``'s slot: one list per field, the number of rows, how many came from each column."""
        counts = self.takes[step]
        if self.stride:
            values = [column[step::self.stride] for column in self.flat]
            if self.counted:
                self.policy.passed += len(counts)
            return values, len(counts), counts
        index = self.base + step if self.lattice else concat_ranges(self.base + self.before[step], counts)
        at = (self.order[index] if self.order is not None else index).tolist()
        if self.counted:
            self.policy.passed += len(at)
        return gather(self.flat, at), len(at), counts


class EpochShares:
    """Each step's slot (:meth:`take`) from an epoch read in shares of its steps (``bounds``),
    each an :class:`EpochFeed`: read at once (:func:`share_bounds`), the next read while one is
    given out (:func:`start_share`); or by the columns (``columns(step)``, the column path from
    that step on, :class:`~.feed.ColumnRounds`: its rounds are the shares), from the first share
    that cannot be read at once (as a resume mid-way reads it) or from the start
    (:meth:`by_columns`)."""

    def __init__(self, ctx: Optional[ReadContext], maps: ShareMaps, plans: Sequence[WorkerPlan], takes: np.ndarray,
                 policy: ErrorPolicy, stats: Optional[WorkerStats], bounds: Sequence[int],
                 columns: Callable[[int], ColumnRounds]) -> None:
        self.ctx, self.plans, self.takes, self.policy, self.stats = ctx, plans, takes, policy, stats
        self.bounds, self.columns = list(bounds), columns
        self.rows = np.vstack([np.zeros((1, takes.shape[1]), np.int64), np.cumsum(takes, axis=0)])  # rows before each step
        self.share = -1
        self.start, self.stop = 0, 0  # the steps of the share held
        self.feed: Optional[EpochFeed] = None
        self.rounds: Optional[ColumnRounds] = None  # the column path, once a share could not be read at once
        self.next: Optional[Union[MappedShare, ShareRead]] = None  # the next share, read over this one's steps
        self.sequence: Optional[RangeSequence] = None  # the ranges of the shares read by ranges, fetched ahead
        self.maps = maps  # what a share hands on to the next

    def by_columns(self) -> "EpochShares":
        """Read the shares from the next on by the columns, their rounds the shares."""
        start = self.bounds[self.share + 1]
        self.close()  # (a next share started: not read so)
        self.rounds = self.columns(start)
        self.bounds[self.share + 1:] = self.rounds.bounds(start)
        return self

    def next_share(self) -> None:
        """Read the next share (what of it is not read yet): at once, or where it cannot be (or
        once one could not be), by the columns."""
        self.feed = None  # (the last share's rows freed before the next is taken)
        if self.rounds is None:
            read, self.next = self.next or self._start(self.share + 1, 1), None
            got = read.finish()
            if got is None:
                self.by_columns()
            else:
                self.share += 1
                self.start, self.stop = self.bounds[self.share], self.bounds[self.share + 1]
                self.feed = EpochFeed(got[0], got[1], self.takes[self.start:self.stop], self.policy)
                if self.share + 2 < len(self.bounds):
                    self.next = self._start(self.share + 1, self.stop - self.start - 1)
                return
        self.share += 1
        self.start, self.stop = self.bounds[self.share], self.bounds[self.share + 1]
        flat, held = self.rounds.read(self.start, self.stop)
        self.feed = EpochFeed(flat, held, self.takes[self.start:self.stop], self.policy, counted=False)

    def close(self) -> None:
        """Read no more: the shares' remote reads stopped now, in this thread."""
        read, self.next = self.next, None
        if isinstance(read, ShareRead):
            read.close()
        sequence, self.sequence = self.sequence, None
        if sequence is not None:
            sequence.close()

    def _start(self, share: int, pieces: int) -> Union[MappedShare, "ShareRead"]:
        if self.sequence is None or not self.sequence.holds(share):
            self.sequence = self._sequence(share)
        a, b = self.rows[self.bounds[share]], self.rows[self.bounds[share + 1]]
        return start_share(self.ctx, self.plans, a, b, self.stats, self.maps, max(1, pieces), self.sequence, share)

    def _sequence(self, share: int) -> Optional[RangeSequence]:
        """The ranges of the shares read by ranges from ``share`` on, up to the first that is not
        (or cannot be), as one sequence (:class:`RangeSequence`); ``None`` if ``share`` is not."""
        ranges: List[List[tuple]] = []
        for k in range(share, len(self.bounds) - 1):
            taken = share_taken(self.plans, self.rows[self.bounds[k]], self.rows[self.bounds[k + 1]])
            got = None if mapped(self.ctx, self.maps, taken) else share_ranges(self.ctx, taken)
            if got is None:
                break
            ranges.append(got)
        return RangeSequence(self.ctx, self.stats, share, ranges) if ranges else None

    def take(self, step: int) -> Tuple[List[list], int, np.ndarray]:
        """Step ``step``'s slot, as :meth:`EpochFeed.take` gives it; the next share's pieces read
        on the way, the last by the share's last step but one."""
        if step >= self.stop:
            self.next_share()
        read = self.next
        if read is not None and read.done < read.pieces:
            n = self.stop - self.start  # (none at a share's first step but a share of one step's)
            want = read.pieces if n == 1 else -(-read.pieces * (step - self.start) // (n - 1))
            while read.done < min(want, read.pieces) and not read.failed:
                read.piece()
        return self.feed.take(step - self.start)  # type: ignore[union-attr]

    def round_of(self, step: int) -> Tuple[int, int, List[list], np.ndarray]:
        """A keyed round (a bucket worker's): its steps ``t0 … t1 − 1``, their rows (one list per
        field, then each row's key: its column × ``KEY_SHIFT`` plus its place in the column) and
        how many rows each step read. A share read at once gives a round of one step; the
        columns' keyed rows (:class:`~.feed.ColumnRounds`), a round of the share's steps."""
        if step >= self.stop:
            self.next_share()
        feed = self.feed
        if self.rounds is not None:
            return self.start, self.stop, feed.flat, feed.takes.sum(axis=1)  # type: ignore[union-attr]
        values, n, counts = self.take(step)
        before = self.rows[self.start] + feed.before[step - self.start]  # type: ignore[union-attr]
        keys = concat_ranges(np.arange(len(counts), dtype=np.int64) * KEY_SHIFT + before, counts)
        return step, step + 1, values + [keys.tolist()], np.array([n], np.int64)


class SourceFeeds:
    """Each step's slot (:meth:`take`) from the feeds of a mix's sources
    (:class:`EpochShares`), each over its own columns, the columns laid out source after source:
    the step's rows as one feed over all the columns gives them."""

    def __init__(self, feeds: Sequence[EpochShares]) -> None:
        self.feeds = list(feeds)

    def close(self) -> None:
        """Read no more (:meth:`EpochShares.close`)."""
        for feed in self.feeds:
            feed.close()

    def take(self, step: int) -> Tuple[List[list], int, np.ndarray]:
        """Step ``step``'s slot: one list per field, the number of rows, how many came from each column."""
        parts = [feed.take(step) for feed in self.feeds]
        values = [list(itertools.chain.from_iterable(part[0][f] for part in parts)) for f in range(len(parts[0][0]))]
        return values, sum(part[1] for part in parts), np.concatenate([part[2] for part in parts])


def share_bounds(takes: np.ndarray, bytes_per_sample: Optional[float], whole: int = WHOLE_BYTES,
                 later: int = SHARE_BYTES, first: int = FIRST_SHARE_BYTES) -> List[int]:
    """Where an epoch's shares of steps (``takes``: rows per step and column) begin, and its end:
    one share where the epoch is at most ``whole`` bytes, or where the samples' size is not
    known; else a first of about ``first`` bytes of samples, then shares :data:`GROWTH` times the
    one before, up to ``later`` bytes: laid out, :data:`SHARE_BYTES` (each read in pieces over
    the steps of the one before); copied into the worker's buffers (found by header walk, or
    remote), :data:`WALKED_SHARE_BYTES` (within the bytes a share may copy). The first batch waits
    for the first share; the next few, for a piece of the next share each: small ones."""
    steps = len(takes)
    per_step = np.cumsum(takes.sum(axis=1)) * (bytes_per_sample or 0)
    if not bytes_per_sample or per_step[-1] <= whole:
        return [0, steps]
    bounds, want = [0], first
    while bounds[-1] < steps:
        before = per_step[bounds[-1] - 1] if bounds[-1] else 0.0
        stop = int(np.searchsorted(per_step, before + want, side="right"))
        bounds.append(min(steps, max(stop, bounds[-1] + 1)))
        want = min(later, want * GROWTH)
    return bounds


def read_epoch(ctx: ReadContext, maps: ShareMaps, plans: Sequence[WorkerPlan], takes: np.ndarray,
               policy: ErrorPolicy, stats: WorkerStats, columns: Callable[[int], ColumnRounds],
               start: int = 0) -> EpochShares:
    """The epoch of ``plans`` (one per column, all read with ``ctx``, a reader's; ``maps``: what
    its shares hand on to the next, :class:`~.mapped.ShareMaps`) from step ``start`` on (a resume
    mid-way: the rows before it are not read), its first share read now: at once in shares where
    it can be (:func:`at_once`, see the module doc), else by ``columns(step)``, the column path
    from ``step`` on."""
    bounds = at_once(ctx, maps, plans, takes, start)
    shares = EpochShares(ctx, maps, plans, takes, policy, stats, bounds or [start], columns)
    if bounds is None:
        shares.by_columns()
    if start < len(takes):
        shares.next_share()
    return shares


def read_by_columns(takes: np.ndarray, policy: ErrorPolicy, columns: Callable[[int], ColumnRounds],
                    start: int = 0) -> EpochShares:
    """The epoch of ``takes`` (rows per step and column) from step ``start`` on read by its
    columns (``columns(step)``, the column path from ``step`` on), its first round read now."""
    shares = EpochShares(None, ShareMaps(), (), takes, policy, None, [start], columns).by_columns()
    if start < len(takes):
        shares.next_share()
    return shares


def at_once(ctx: ReadContext, maps: ShareMaps, plans: Sequence[WorkerPlan], takes: np.ndarray,
            start: int = 0) -> Optional[List[int]]:
    """The shares in which the epoch of ``plans`` (``takes``: rows per step and column) is read at
    once from step ``start`` on (:func:`share_bounds`), or ``None`` where it cannot be: parts
    without a known place (no offsets, or no counts), a worker whose share of the epoch could not
    be read at once before (``maps.whole``). (A ``fixed`` column's plan is its passes unrolled:
    :func:`~.numbering.unrolled`.)"""
    data = ctx.data
    if start >= len(takes) or not plans or data.offsets is None or data.counts is None:
        return None
    if not maps.whole:
        return None
    if any(stop is None or stop <= first for plan in plans for _, first, stop in plan.parts):
        return None
    if not all(maps_parts(data.urls[index]) for plan in plans for index, _, _ in plan.parts):
        # remote: shares as large as a share may copy from the first, each column's range of one a
        # request or two (smaller ones would cost the far link a round trip for a few samples each;
        # the columns' first parts are as large)
        sizes = (WALKED_SHARE_BYTES,) * 3
    elif getattr(data.offsets, "members", None) is None:  # (no member layouts: every sample found by header walk)
        sizes = (FIRST_SHARE_BYTES, WALKED_SHARE_BYTES, FIRST_SHARE_BYTES)
    else:
        sizes = (WHOLE_BYTES, SHARE_BYTES, FIRST_SHARE_BYTES)
    return [start + b for b in share_bounds(takes[start:], data.bytes_per_sample, *sizes)]


def share_ranges(ctx: ReadContext,
                 taken: Sequence[Tuple[int, Sequence[Tuple[int, int, int]]]]) -> Optional[List[tuple]]:
    """The ranges a share's columns read (``taken``: what :func:`_taken` says of them), shard after
    shard in the order the columns first read them (a span's plan order: what a byte cache's
    eviction was planned for): each shard's parts that lie end to end as one range ``(shard,
    first, stop, start, end)``, its bytes
    ``start`` to ``end`` where the offsets place them; ``None`` where the share cannot be read by
    ranges (a gzip or ``pipe:`` shard, a part with no known place, one read twice, or over the
    bytes a share may copy)."""
    by_shard: Dict[int, List[Tuple[int, int]]] = {}
    for _, own in taken:
        for index, first, stop in own:
            by_shard.setdefault(index, []).append((first, stop))
    ranges = []
    total = 0
    for index, parts in by_shard.items():  # (the shards in the order the columns first read them: a span's plan order)
        url = ctx.data.urls[index]
        if is_gzip_name(url) or not (maps_parts(url) or is_ranged(url)):
            return None  # (no positions to read by)
        merged: List[List[int]] = []
        for first, stop in sorted(parts):
            if merged and merged[-1][1] == first:
                merged[-1][1] = stop
            elif merged and first < merged[-1][1]:
                return None  # (a part read twice: the column path's)
            else:
                merged.append([first, stop])
        for first, stop in merged:
            found = _range_bytes(ctx, index, first, stop)
            if found is None:
                return None
            start, end, size = found
            total += size
            if total > COPIED_BYTES or total > EPOCH_BYTES:
                return None
            ranges.append((index, first, stop, start, end))
    return ranges


class RangeSequence:
    """The ranges of consecutive shares read by ranges (``shares[k]``: share ``first + k``'s,
    :func:`share_ranges`) as one sequence (a :class:`~dalistream.io.streams.ShardSequence`): its
    remote ranges fetched ahead across the shares, within the worker's read-ahead, as a span's
    parts are (the fetch does not wait for a share to be taken); each share reads its own in turn."""

    def __init__(self, ctx: ReadContext, stats: WorkerStats, first: int, shares: Sequence[List[tuple]]) -> None:
        self.first, self.shares = first, list(shares)
        self.base = np.concatenate([[0], np.cumsum([len(r) for r in self.shares])]).astype(np.int64)
        flat = [r for ranges in self.shares for r in ranges]
        options = ctx.config.storage_options if ctx.share_options is None else ctx.share_options
        self.shards = ShardSequence([ctx.data.urls[r[0]] for r in flat], options, stats.io,
                                    ranges=[(r[3] or 0, r[4]) for r in flat], fetcher=ctx.fetcher)

    def holds(self, share: int) -> bool:
        """Whether share ``share``'s ranges are in this sequence."""
        return self.first <= share < self.first + len(self.shares)

    def last(self, share: int) -> bool:
        """Whether share ``share`` is the last of this sequence."""
        return share == self.first + len(self.shares) - 1

    def ranges(self, share: int) -> Tuple[List[tuple], int]:
        """Share ``share``'s ranges, and the place of its first in the sequence."""
        return self.shares[share - self.first], int(self.base[share - self.first])

    def close(self) -> None:
        """Stop fetching (its last share read, or not to be read)."""
        self.shards.close()


class ShareRead:
    """A share read by ranges (:func:`share_ranges`), in no pieces, when its first step is taken
    (:meth:`finish`): each range as a column reads a part (:func:`~.part.read_part`: cut by member
    layout or found by header walk, into the worker's buffers), every run decoded together; its
    ranges those of share ``share`` of ``sequence`` (fetched ahead with the shares before it), or
    of a sequence of its own."""

    pieces, done, failed = 0, 0, False

    def __init__(self, ctx: ReadContext, maps: ShareMaps, plans: Sequence[WorkerPlan],
                 taken: Sequence[Tuple[int, Sequence[Tuple[int, int, int]]]], stats: WorkerStats,
                 sequence: Optional[RangeSequence] = None, share: int = 0) -> None:
        self.ctx, self.maps, self.plans, self.taken, self.stats = ctx, maps, plans, taken, stats
        if sequence is None or not sequence.holds(share):
            ranges = share_ranges(ctx, taken)
            sequence, share = (RangeSequence(ctx, stats, 0, [ranges]) if ranges is not None else None), 0
        self.sequence, self.share = sequence, share

    def piece(self) -> None:
        """(no pieces)"""

    def finish(self) -> Optional[Tuple[List[list], List[np.ndarray]]]:
        """The decoded rows, one list per field, and each column's rows among them; ``None``
        where the share cannot be read so (see the module doc)."""
        sequence = self.sequence
        if sequence is None:
            return None
        ranges, base = sequence.ranges(self.share)
        runs = _read(self.ctx, sequence.shards, ranges, self.stats, base)
        if runs is None or sequence.last(self.share):
            sequence.close()
        if runs is None:
            self.maps.whole = False  # (what stopped it stays: later epochs go to the columns at once)
            return None
        self.stats.add(bytes=sum(run.nbytes for _, run in runs))  # (the columns count their runs' so)
        return _rows_of(self.ctx, self.plans, self.taken, runs)

    def close(self) -> None:
        """Stop fetching its sequence (the epoch ended before this share was read)."""
        if self.sequence is not None:
            self.sequence.close()


def share_taken(plans: Sequence[WorkerPlan], before: np.ndarray,
                after: np.ndarray) -> List[Tuple[int, List[Tuple[int, int, int]]]]:
    """What each column ``c`` reads for its rows ``before[c]`` to ``after[c]`` (:func:`_taken`)."""
    return [_taken(plan, int(lo), int(hi)) for plan, lo, hi in zip(plans, before.tolist(), after.tolist())]


def mapped(ctx: ReadContext, maps: ShareMaps, taken: Sequence[Tuple[int, Sequence[Tuple[int, int, int]]]]) -> bool:
    """Whether a share that reads ``taken`` is read from one mapping: every shard it reads local,
    with a member layout."""
    indices = sorted({index for _, own in taken for index, _, _ in own})
    data = ctx.data
    known = maps.shards is not None and maps.shards.shards == tuple(indices)  # (checked for the share before)
    return bool(indices) and (known or all(maps_parts(data.urls[i]) and ctx.layouts.layout(i, 0, data.counts[i], None)
                                           is not None for i in indices))


def start_share(ctx: ReadContext, plans: Sequence[WorkerPlan], before: np.ndarray, after: np.ndarray,
                stats: WorkerStats, maps: ShareMaps, pieces: int, sequence: Optional[RangeSequence] = None,
                share: int = 0) -> Union[MappedShare, ShareRead]:
    """The read of each column's rows ``before[c]`` to ``after[c]``: from one mapping of their
    shards, in up to ``pieces`` pieces (:class:`~.mapped.MappedShare`), where every shard read is
    local and has a member layout; else by ranges (:class:`ShareRead`, share ``share`` of
    ``sequence`` where it holds it). ``maps``: what the last share hands on."""
    taken = share_taken(plans, before, after)
    if not mapped(ctx, maps, taken):
        return ShareRead(ctx, maps, plans, taken, stats, sequence, share)
    indices = sorted({index for _, own in taken for index, _, _ in own})
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


def _read(ctx: ReadContext, shards: ShardSequence, ranges: Sequence[tuple], stats: WorkerStats,
          base: int = 0) -> Optional[List[Tuple[int, Run]]]:
    """Each range's runs (the range ``k`` at place ``base + k`` of ``shards``), decoded (``(shard,
    run)`` in order), or ``None`` where anything is amiss (a problem, a sample the walk leaves
    alone or the decoder refuses: the columns meet it)."""
    out: List[Tuple[int, Run]] = []
    position = base
    try:
        for index, group in itertools.groupby(ranges, key=operator.itemgetter(0)):
            url = ctx.data.urls[index]
            # a local shard's file held open across its ranges, one file at a time (a range's
            # opening shares its descriptor and what was checked of the file: open_range)
            with open_shard(url, 0, ctx.config.storage_options) if maps_parts(url) else contextlib.nullcontext():
                for _, first, stop, start, end in group:
                    numbering = Numbering(first, stop - first)
                    at = first
                    with contextlib.closing(read_part(ctx, shards, position, index, first, stop, start, end, stats,
                                                      numbering, run_bytes=WALKED_RUN_BYTES)) as items:
                        for item in items:
                            if not isinstance(item, Run) or item.first != at:
                                return None
                            at += len(item)
                            out.append((index, item))
                    if numbering.problem is not None or at != stop:
                        return None
                    position += 1
    except (DalistreamError, OSError, EOFError):
        return None
    decode_runs(ctx.rows, [(run, ctx.source_name) for _, run in out])
    if any(run.decoded[1] for _, run in out):  # a sample the per-sample path must settle
        return None
    return out


def _range_bytes(ctx: ReadContext, index: int, first: int,
                 stop: int) -> Optional[Tuple[Optional[int], Optional[int], int]]:
    """Where samples ``first … stop`` of shard ``index`` lie as its offsets place them (``start``,
    ``end``: :meth:`~.layouts.ShardLayouts.byte_range`) and their bytes (to the shard's end for its
    last: a local file's size, a remote one's as listed), or ``None`` where they are not known."""
    start, end = ctx.layouts.byte_range(index, first, stop)
    if (first and start is None) or (end is None and stop < ctx.data.counts[index]):
        return None
    if end is not None:
        return start, end, end - (start or 0)
    url, sizes = ctx.data.urls[index], ctx.data.sizes
    try:
        size = os.path.getsize(local_path(url)) if maps_parts(url) else sizes[index] if sizes is not None else None
    except OSError:
        return None
    return None if size is None else (start, end, size - (start or 0))


def _rows_of(ctx: ReadContext, plans: Sequence[WorkerPlan],
             parts: Sequence[Tuple[int, Sequence[Tuple[int, int, int]]]],
             runs: Sequence[Tuple[int, Run]]) -> Tuple[List[list], List[np.ndarray]]:
    """The decoded ``runs``' rows, one list per field, and each column's rows among them: its
    ``parts`` (:func:`_taken`: where they start in its raw positions, and the parts) in its
    order, less its plan's drops."""
    flat: List[list] = [[] for _ in ctx.config.fields]
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
    for plan, (start, own_parts) in zip(plans, parts):
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
        rows.append(less_drops(own, np.asarray(plan.drop, np.int64) - start))
    return flat, rows
