"""A worker's slot, step by step, from its columns' blocks of rows: what each step takes of each
column is the plan's (``take``: a span's whole slot, one sample of each interleaved column, a
mix source's share).

:class:`Feed` reads the columns a *round* of steps at a time: each column's raw items for the
round are read ahead and their runs decoded together (:func:`~.rows.decode_runs`: one pass of
array operations over all the round's rows), then each column's blocks (:class:`~.rows.Rows`)
are pulled in its order, the round's rows laid end to end per field, and each step's slot
gathered from them with one slice (or one index list) per field.
So a worker reading 128 interleaved columns pays per column once per round, not per step.
A round's first is one step (the first batch waits for little), then rounds double up to
:data:`ROUND_BYTES` of samples, and at most half a run of each of several columns. A column that
runs short (skipped samples, ``exact``'s last step) gives fewer rows: the step is padded at its end.

:func:`shuffled_blocks` is the shuffle buffer over a column's blocks: the emission order is
that of :func:`~dalistream.plan.shuffle.shuffled` over the column's ordinals (a pure function of
indices, which resume relies on), rows held until their turn.
"""

from __future__ import annotations

import itertools
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


class _Column:
    """One column's blocks not yet delivered (the first ``at`` rows of the first block are gone);
    ``key``: with keys, the first key of its rows (``column × KEY_SHIFT``; a row's key adds its ordinal)."""

    __slots__ = ("stream", "blocks", "at", "queued", "done", "key")

    def __init__(self, stream: Iterator[Rows], key: Optional[int] = None) -> None:
        self.stream = stream
        self.blocks: List[Rows] = []
        self.at = 0
        self.queued = 0
        self.done = False
        self.key = key

    def fill(self, need: int) -> None:
        while self.queued < need and not self.done:
            block = next(self.stream, None)
            if block is None:
                self.done = True
                break
            if block.n:
                self.blocks.append(block)
                self.queued += block.n

    def take(self, k: int, out: List[list]) -> int:
        """Move up to ``k`` rows into ``out`` (one list per field); how many."""
        got = 0
        while got < k and self.blocks:
            block = self.blocks[0]
            m = min(k - got, block.n - self.at)
            for dest, values in zip(out, block.columns):
                dest.extend(values[self.at:self.at + m])
            if self.key is not None:  # the keys: one more list after the fields'
                first = self.key + block.ordinal + self.at
                out[-1].extend(range(first, first + m))
            self.at += m
            got += m
            if self.at == block.n:
                self.blocks.pop(0)
                self.at = 0
        self.queued -= got
        return got


class Feed:
    """Each step's slot from ``streams`` (one per column), ``takes[t, c]`` rows of column ``c`` at
    step ``t``, from step ``start`` on (see the module doc). ``bytes_per_sample`` (when known)
    sizes the rounds. ``first_batch``: the parts opened for the first batch start with a short
    run (:data:`FIRST_RUN_BYTES`), so it waits for little. ``keyed``: every step's rows come with
    one more list, each row's key ``c × KEY_SHIFT + ordinal`` (``c`` its column, the ordinal its
    place in the column: a bucket plan's emissions name them)."""

    def __init__(self, streams: Sequence[Iterator[Rows]], takes: np.ndarray, n_fields: int, start: int = 0,
                 bytes_per_sample: Optional[float] = None, first_batch: bool = False, keyed: bool = False) -> None:
        self.columns = [_Column(s, c * KEY_SHIFT if keyed else None) for c, s in enumerate(streams)]
        takes = np.asarray(takes, dtype=np.int64)
        # (a worker a bucket plan gives no sample has no column: its steps are padding)
        self.takes = takes.reshape(-1, len(self.columns)) if self.columns else takes.reshape(len(takes), 0)
        self.n_fields = n_fields + keyed
        if keyed and len(self.takes):  # a bucket plan's reads are uneven (a few steps read much): by their mean
            per_column = max(1.0, float(self.takes.mean(axis=0).max(initial=1)))
        else:
            per_column = max(1, int(self.takes.max(initial=1)))
        several = len(self.columns) > 1
        # the columns' runs (a reader's: every source's reads through the same share of the budget)
        self.run_bytes = max((s.reader.run_bytes for s in streams if isinstance(s, ColumnReader)),
                             default=runs.MIN_RUN_BYTES)
        per_step = per_column * max(1, len(self.columns))
        if bytes_per_sample:
            steps = ROUND_BYTES // (per_step * bytes_per_sample)
            if several:
                steps = min(steps, (self.run_bytes // 2) // (per_column * bytes_per_sample))
        else:
            steps = min(ROUND_ROWS // per_step, COLUMN_ROUND_ROWS // per_column if several else ROUND_ROWS)
        self.max_steps = int(max(1, min(MAX_ROUND_STEPS, steps)))
        self.step = start
        self._round: Optional[Tuple[int, int, List[list], np.ndarray, np.ndarray, bool]] = None
        self._size = 1
        self._first_batch = first_batch  # the first batch's columns start with short runs
        self._phased = [False] * len(self.columns)  # whether a column's first part is opened
        column_bytes = self.takes.sum(axis=0).max(initial=0) * (bytes_per_sample or 0)
        self._phase = several and column_bytes > 2 * self.run_bytes

    def take(self, step: int) -> Tuple[List[list], int, np.ndarray]:
        """Step ``step``'s slot (the steps are taken in order): one list per field, the number of
        rows, and how many came from each column."""
        t0, t1, flat, lo, hi, lattice = self._round_at(step)
        r = step - t0
        counts = hi[r] - lo[r]
        if lattice:  # every column gave one row a step: step r's rows are every M-th row from r
            return [values[r::t1 - t0] for values in flat], len(self.columns), counts
        index = (np.arange(int(counts.sum())) + np.repeat(lo[r] - (np.cumsum(counts) - counts), counts)).tolist()
        return [[values[i] for i in index] for values in flat], len(index), counts

    def round_of(self, step: int) -> Tuple[int, int, List[list], np.ndarray]:
        """The round holding ``step`` (read now if it is the next; the steps are taken in order):
        its steps ``t0 … t1 − 1``, all its rows laid end to end per field, and how many of them
        each of its steps reads."""
        t0, t1, flat, lo, hi, _ = self._round_at(step)
        return t0, t1, flat, (hi - lo).sum(axis=1)

    def _round_at(self, step: int) -> Tuple[int, int, List[list], np.ndarray, np.ndarray, bool]:
        """The round holding ``step``, read first if it is the next."""
        if self._round is None or step >= self._round[1]:
            self._read_round(step)
        return self._round  # type: ignore[return-value]

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
                first += (max(1, self.run_bytes * (c + 1) // len(self.columns)),)
        return first

    def _read_round(self, t0: int) -> None:
        t1 = min(len(self.takes), t0 + self._size)
        self._size = min(self.max_steps, 2 * self._size)
        takes = self.takes[t0:t1]  # (M, K)
        need = takes.sum(axis=0)
        # the columns' runs for the round read first, then decoded together: one pass of array
        # operations over all their rows, not one per column's few
        pending, decoder = [], None
        for c, column in enumerate(self.columns):
            stream = column.stream
            if need[c] > column.queued and isinstance(stream, ColumnReader):
                decoder = stream.reader.rows  # (every source's reader decodes the same fields)
                stream.reader.first_runs = self._first_runs(c)
                pending += [(run, stream.reader.source_name) for run in stream.read_ahead(int(need[c] - column.queued))]
                stream.reader.first_runs = ()
        self._first_batch = False
        if pending:
            decode_runs(decoder, pending)
        flat: List[list] = [[] for _ in range(self.n_fields)]
        got = np.zeros(len(self.columns), np.int64)
        for c, column in enumerate(self.columns):  # once per column per round: pulls its blocks
            column.fill(int(need[c]))
            got[c] = column.take(int(need[c]), flat)
        base = np.concatenate([[0], np.cumsum(got)[:-1]])
        starts = np.cumsum(takes, axis=0) - takes
        lo = base + np.minimum(starts, got)
        hi = base + np.minimum(starts + takes, got)
        lattice = bool((takes == 1).all() and (got == len(takes)).all())
        self._round = (t0, t1, flat, lo, hi, lattice)


def shuffled_blocks(blocks: Iterator[Rows], size: int, seed: int, total: Optional[int], skip: int = 0,
                    rows_per_block: int = 64) -> Iterator[Rows]:
    """The rows of ``blocks`` (consecutive ordinals each, in order; ordinals absent where samples
    were skipped or left out) in the order a shuffle buffer of ``size`` emits the ordinals
    ``0 … total - 1`` (``None``: endless), after its first ``skip`` emissions (a resume: those
    ordinals were delivered, and are not in ``blocks``); emitted in blocks of ``rows_per_block``."""
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
            if len(out) >= rows_per_block:
                yield Rows([list(v) for v in zip(*out)], len(out))
                out = []
        if ended and not held:
            break
    if out:
        yield Rows([list(v) for v in zip(*out)], len(out))
