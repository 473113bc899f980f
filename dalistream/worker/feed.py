"""The column path: a worker's columns read a round of steps at a time (:class:`ColumnRounds`),
each through its own :class:`~.column.ColumnReader`, for the epoch's shares
(:class:`~.epochfeed.EpochShares`) that are not read at once.

A round's raw items of every column are read ahead and their runs decoded together
(:func:`~.rows.decode_runs`: one pass of array operations over all the round's rows), then the
columns' blocks (:class:`~.rows.Rows`) are pulled as needed and the round's rows of all columns
taken at once (:class:`_Queues`: a few operations over all the columns' heads, not a loop body
per column), laid end to end per field. So a worker reading 128 interleaved columns pays little
per column, and that once per round. A round's first is one step (the first batch waits for
little), then rounds double up to :data:`ROUND_BYTES` of samples, and at most half a run of
each of several columns. A column that runs short (skipped samples, ``exact``'s last step)
gives fewer rows: the step is padded at its end.

:func:`shuffled_blocks` is the shuffle buffer over a column's blocks: the emission order is
that of :func:`~dalistream.plan.shuffle.shuffled` over the column's ordinals (a pure function of
indices, which resume relies on), rows held until their turn.
"""

from __future__ import annotations

import itertools
from collections import deque
from itertools import chain
from operator import getitem
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..plan.bucketworker import KEY_SHIFT
from ..plan.shuffle import shuffled
from ..tar import runs
from .column import ColumnReader
from .rows import Rows, decode_runs

ROUND_BYTES = 4 << 20  # a round reads about this much (the columns' rows, all fields), and of each
# of several columns at most half a run: their next runs, out of step, are read a few per round, and
# no round reads much more than the others (a worker's batches cost about the same each)
MAX_ROUND_STEPS = 64
ROUND_ROWS = 2048  # when the bytes per sample are unknown, a round of at most this many samples …
COLUMN_ROUND_ROWS = 16  # … and of this many of each of several columns'
FIRST_RUN_BYTES = 32 << 10  # a column's first run, read for the job's first batch (its first epoch's)
SHUFFLED_BLOCK_ROWS = 64  # the shuffle buffer gives its rows in blocks of this many


class _Queues:
    """The blocks of every column not yet delivered, kept side by side so that a round takes its
    rows of all columns in a few operations over all of them, not a loop body per column (a
    worker reading 256 interleaved columns one row a step would pay that per sample): each
    column's *head* block (its first ``at`` rows gone, ``left`` to go; every field's list of
    it in ``heads[f][c]``), the blocks after it in ``rest``; ``queued``: the rows to go in all.
    ``keyed``: a row's key is ``c × KEY_SHIFT`` plus its ordinal (``origin``: the head's first)."""

    def __init__(self, streams: Sequence[Iterator[Rows]], n_fields: int, keyed: bool) -> None:
        n = len(streams)
        self.streams = list(streams)
        self.keyed = keyed
        self.heads: List[list] = [[_NONE] * n for _ in range(n_fields)]
        self.rest: List[deque] = [deque() for _ in range(n)]
        self.origin = np.arange(n, dtype=np.int64) * KEY_SHIFT
        self.at = np.zeros(n, np.int64)
        self.left = np.zeros(n, np.int64)
        self.queued = np.zeros(n, np.int64)
        self.done = [False] * n

    def fill(self, c: int, need: int) -> None:
        """Pull column ``c``'s blocks until ``need`` rows are queued or its stream ends."""
        queued, held = int(self.queued[c]), bool(self.left[c])
        stream, rest = self.streams[c], self.rest[c]
        while queued < need and not self.done[c]:
            block = next(stream, None)
            if block is None:
                self.done[c] = True
            elif block.n:
                queued += block.n
                if held:
                    rest.append(block)
                else:
                    self._head(c, block)
                    held = True
        self.queued[c] = queued

    def _head(self, c: int, block: Optional[Rows]) -> None:
        """Make ``block`` column ``c``'s head (``None``: it has none; the last one's rows, views
        of a run's buffer, are let go at once, for the arena to reuse it)."""
        for f, heads in enumerate(self.heads):
            heads[c] = block.columns[f] if block is not None else _NONE
        self.at[c] = 0
        self.left[c] = block.n if block is not None else 0
        if block is not None:
            self.origin[c] = c * KEY_SHIFT + block.ordinal

    def _next_head(self, c: int) -> None:
        """Column ``c``'s head is used up: the block after it is its head (none if none is queued)."""
        self._head(c, self.rest[c].popleft() if self.rest[c] else None)

    def take(self, need: np.ndarray) -> Tuple[List[list], np.ndarray]:
        """Up to ``need[c]`` rows of each column ``c``: one list per field (and the keys, when
        keyed), column after column, and how many each gave (fewer where a column ran out)."""
        for c in (self.queued < need).nonzero()[0].tolist():
            self.fill(c, int(need[c]))
        now = np.minimum(need, self.left)  # what each head gives
        end = self.at + now
        at = self.at.tolist()
        short = (now < need).nonzero()[0].tolist()  # (needs more than its head holds, or ran out)
        one = not short and bool((need == 1).all())  # one row of each: no slices
        if one:
            pieces = [list(map(getitem, heads, at)) for heads in self.heads]
        else:
            cuts = list(map(slice, at, end.tolist()))
            pieces = [list(map(getitem, heads, cuts)) for heads in self.heads]
        if self.keyed:
            first = self.origin + self.at
            pieces.append(first.tolist() if one else list(map(range, first.tolist(), (first + now).tolist())))
        self.at = end
        self.left -= now
        self.queued -= now
        for c in ((self.left == 0) & (now > 0)).nonzero()[0].tolist():  # heads used up
            self._next_head(c)
        if one:
            return pieces, now
        got = now.copy() if short else now
        for c in short:
            got[c] = self._more(c, int(now[c]), int(need[c]), pieces)
        return [list(chain.from_iterable(piece)) for piece in pieces], got

    def _more(self, c: int, k: int, need: int, pieces: List[list]) -> int:
        """Column ``c`` gave ``k`` rows, all its head held (the block after it is its head now):
        up to ``need`` in all from its next heads, added to its piece of each of ``pieces``;
        how many in all."""
        own = [[piece[c]] for piece in pieces]
        got = k
        while got < need and self.left[c]:
            at, left = int(self.at[c]), int(self.left[c])
            m = min(need - got, left)
            for parts, heads in zip(own, self.heads):
                parts.append(heads[c][at:at + m])
            if self.keyed:
                first = int(self.origin[c]) + at
                own[-1].append(range(first, first + m))
            got += m
            if m < left:
                self.at[c], self.left[c] = at + m, left - m
            else:
                self._next_head(c)
        for piece, parts in zip(pieces, own):
            piece[c] = chain.from_iterable(parts)  # (laid out with the others' pieces: one copy)
        self.queued[c] -= got - k
        return got


_NONE: list = []  # the head of a column that holds none


class ColumnRounds:
    """The column path's reads of an epoch: rounds of its steps (:meth:`bounds`), each column's
    rows of a round (``takes[t, c]`` at step ``t``) read from its ``streams[c]``, their runs read
    ahead and decoded together, the rows taken at once (:meth:`read`; see the module doc).
    ``bytes_per_sample`` (when known) sizes the rounds. ``first_batch``: the parts opened for the
    first batch start with a short run (:data:`FIRST_RUN_BYTES`), so it waits for little.
    ``keyed``: a round's rows come with one more list, each row's key ``c × KEY_SHIFT + ordinal``
    (``c`` its column, the ordinal its place in the column: a bucket plan's emissions name them)."""

    def __init__(self, streams: Sequence[Iterator[Rows]], takes: np.ndarray, n_fields: int,
                 bytes_per_sample: Optional[float] = None, first_batch: bool = False, keyed: bool = False) -> None:
        self.streams = list(streams)
        self.queues = _Queues(self.streams, n_fields, keyed)
        takes = np.asarray(takes, dtype=np.int64)
        # (a worker a bucket plan gives no sample has no column: its steps are padding)
        self.takes = takes.reshape(-1, len(streams)) if len(streams) else takes.reshape(len(takes), 0)
        # the columns' runs (a reader's: every source's reads through the same share of the budget)
        readers = {id(s.reader): s.reader for s in streams if isinstance(s, ColumnReader)}  # (one per source)
        self.run_bytes = max((reader.run_bytes for reader in readers.values()), default=runs.MIN_RUN_BYTES)
        self.max_steps = round_steps(self.takes, keyed, bytes_per_sample, self.run_bytes)
        self._first_batch = first_batch  # the first batch's columns start with short runs
        self._phased = [False] * len(streams)  # whether a column's first part is opened
        column_bytes = self.takes.sum(axis=0).max(initial=0) * (bytes_per_sample or 0)
        self._phase = len(streams) > 1 and column_bytes > 2 * self.run_bytes

    def bounds(self, start: int) -> List[int]:
        """Where the rounds from step ``start`` on begin, and the epoch's end: the first of one
        step (its batch waits for little), then each twice the one before, up to
        :func:`round_steps`."""
        bounds, size = [start], 1
        while bounds[-1] < len(self.takes):
            bounds.append(min(len(self.takes), bounds[-1] + size))
            size = min(self.max_steps, 2 * size)
        return bounds

    def read(self, t0: int, t1: int) -> Tuple[List[list], np.ndarray]:
        """The rows of steps ``t0 … t1 − 1`` (a round; the rounds are read in order): one list per
        field (and the keys), column after column, and how many each column gave (fewer than its
        takes where it ran out)."""
        need = self.takes[t0:t1].sum(axis=0)
        # the columns' runs for the round read first, then decoded together: one pass of array
        # operations over all their rows, not one per column's few
        pending, decoder = [], None
        for c in (need > self.queues.queued).nonzero()[0].tolist():
            stream = self.streams[c]
            if isinstance(stream, ColumnReader):
                decoder = stream.reader.rows  # (every source's reader decodes the same fields)
                ahead = int(need[c] - self.queues.queued[c])
                pending += [(run, stream.reader.source_name) for run in stream.read_ahead(ahead, self._first_runs(c))]
        self._first_batch = False
        if pending:
            decode_runs(decoder, pending)
        return self.queues.take(need)  # (pulls the columns' blocks: once per column per round)

    def _first_runs(self, c: int) -> Tuple[int, ...]:
        """The bytes of the first runs of the part column ``c`` opens now: the first batch waits
        for its round alone, so the parts it opens start with a short run; and where the columns
        read several runs each in an epoch, they start out of step, their first full run
        ``(c + 1) / C`` of a run long, so that later they need their next runs a few at a time,
        not all at one step (columns of a run or two each are read at once: cutting them would
        cost more runs than it spreads)."""
        first = (FIRST_RUN_BYTES,) if self._first_batch else ()
        if not self._phased[c]:
            self._phased[c] = True
            if self._phase:
                first += (max(1, self.run_bytes * (c + 1) // len(self.streams)),)
        return first


def round_steps(takes: np.ndarray, keyed: bool, bytes_per_sample: Optional[float], run_bytes: int) -> int:
    """The most steps a round of a feed reads (``takes[t, c]``: column ``c``'s rows at step ``t``;
    its first rounds are shorter, doubling up to it): about :data:`ROUND_BYTES` of rows, at most
    half a run (``run_bytes``) of any one of several columns, :data:`MAX_ROUND_STEPS` at most;
    without ``bytes_per_sample``, :data:`ROUND_ROWS` rows and :data:`COLUMN_ROUND_ROWS` of a
    column. A bucket plan's reads (``keyed``) are uneven, a few steps reading much, and its 2B
    columns read about B rows a step between them: they are sized by their means, a column's and
    a step's (sized by the columns, a bucket worker read a round a step)."""
    columns = takes.shape[1]
    if keyed and len(takes):
        per_column = max(1.0, float(takes.mean(axis=0).max(initial=1)))
        per_step = max(1.0, float(takes.sum(axis=1).mean()))
    else:
        per_column = max(1, int(takes.max(initial=1)))
        per_step = per_column * max(1, columns)
    several = columns > 1
    if bytes_per_sample:
        steps = ROUND_BYTES // (per_step * bytes_per_sample)
        if several:
            steps = min(steps, (run_bytes // 2) // (per_column * bytes_per_sample))
    else:
        steps = min(ROUND_ROWS // per_step, COLUMN_ROUND_ROWS // per_column if several else ROUND_ROWS)
    return int(max(1, min(MAX_ROUND_STEPS, steps)))


def shuffled_blocks(blocks: Iterator[Rows], size: int, seed: int, total: Optional[int],
                    skip: int = 0) -> Iterator[Rows]:
    """The rows of ``blocks`` (consecutive ordinals each, in order; ordinals absent where samples
    were skipped or left out) in the order a shuffle buffer of ``size`` emits the ordinals
    ``0 … total - 1`` (``None``: endless), after its first ``skip`` emissions (a resume: those
    ordinals were delivered, and are not in ``blocks``); emitted in blocks of :data:`SHUFFLED_BLOCK_ROWS`."""
    order = itertools.islice(shuffled(range(total) if total is not None else itertools.count(), size, seed), skip, None)
    held: dict = {}
    last = -1
    out: List[tuple] = []
    source = iter(blocks)
    ended = False
    for o in order:
        while o > last and not ended:
            block = next(source, None)
            if block is None:
                ended = True
                break
            for k, row in enumerate(zip(*block.columns)):
                held[block.ordinal + k] = row
            last = block.ordinal + block.n - 1
        row = held.pop(o, None)
        if row is not None:
            out.append(row)
            if len(out) >= SHUFFLED_BLOCK_ROWS:
                yield Rows([list(v) for v in zip(*out)], len(out))
                out = []
        if ended and not held:
            break
    if out:
        yield Rows([list(v) for v in zip(*out)], len(out))
