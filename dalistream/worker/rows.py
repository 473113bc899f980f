"""Decoded samples a block at a time: a run of a regular shard decoded with array operations.

:class:`RowDecoder` turns a :class:`~dalistream.tar.runs.Run` into one column per field, each
parsed by its kind (:meth:`dalistream.kinds.Kind.parse_run`): the rows of a byte field as views of
the run's bytes (images checked in bulk), integer labels parsed in one pass, keys and other
metadata per row. A sample that does not pass (a missing or gzipped
member, a damaged image, a label that is no plain decimal, a failing decoder) is named in ``bad``:
the reader settles it alone by the per-sample path, which raises, counts or skips it with the
same message as when it is read alone (``tests/worker/test_rows.py``: what a block delivers is
what the per-sample path delivers, value for value). :class:`Rows` is a decoded block.
"""

from __future__ import annotations

import operator
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

import numpy as np

from ..config import Field
from ..kinds import BULK_ROWS, Cells
from ..tar.runs import Run

__all__ = ["BULK_ROWS", "RowDecoder", "Rows", "decode_runs"]


class Rows:
    """Decoded samples, the one item type of a worker's stream: ``columns``, one list per field,
    each of ``n`` values; the samples are the consecutive ordinals from ``ordinal`` of their
    column (a lone sample is a block of one)."""

    __slots__ = ("columns", "n", "ordinal")

    def __init__(self, columns: List[list], n: int, ordinal: int = 0) -> None:
        self.columns = columns
        self.n = n
        self.ordinal = ordinal

    def __len__(self) -> int:
        return self.n


class RowDecoder:
    """Columns of decoded fields from a :class:`Run` (see the module doc); picklable."""

    def __init__(self, fields: Sequence[Field], lowercase: bool = False) -> None:
        self.fields = tuple(fields)
        self.kinds = tuple(f.spec for f in self.fields)
        self.lowercase = lowercase
        self.epoch = 0  # the epoch read now (set by the worker at each epoch's start): what a kind's values may depend on
        self._maps: Dict[int, tuple] = {}  # id of a pattern table's names: (names, members, flags)

    def member_maps(self, names: Sequence[Tuple[str, ...]]) -> Tuple[np.ndarray, np.ndarray]:
        """For a pattern table, per field and pattern: the member the field is read from (-1: the
        per-sample path reads it: a member missing or gzipped; 0 for a kind that reads no member),
        and the kind's :meth:`~dalistream.kinds.Kind.member_flag` of that member."""
        found = self._maps.get(id(names))
        if found is None or found[0] is not names:
            member = np.zeros((len(self.fields), len(names)), np.int64)
            flag = np.zeros((len(self.fields), len(names)), bool)
            for f, (field, kind) in enumerate(zip(self.fields, self.kinds)):
                for k, exts in enumerate(names):
                    if not kind.reads_members:
                        continue
                    member[f, k] = -1
                    for ext in field.exts:
                        if ext in exts:
                            member[f, k] = exts.index(ext)
                            flag[f, k] = kind.member_flag(field, ext)
                            break
                        if ext + ".gz" in exts:
                            break
            if len(self._maps) > 16:
                self._maps.clear()
            self._maps[id(names)] = found = (names, member, flag)
        return found[1], found[2]

    def decode(self, run: Run, source: str = "") -> Tuple[List[list], List[int]]:
        """One column per field of ``run``'s samples, and the samples the per-sample path must
        settle (their entries in the columns are placeholders), in order; ``source``: the name of
        the mix's source the run comes from (a ``__source__`` field's value)."""
        n = len(run)
        tables = getattr(run, "tables", None)  # runs decoded together: their tables end to end
        if tables is None:
            members, flags = self.member_maps(run.names)
        else:
            maps = [self.member_maps(t) for t in tables]
            members, flags = np.concatenate([m for m, _ in maps], axis=1), np.concatenate([f for _, f in maps], axis=1)
        kinds = run.kinds
        data = np.frombuffer(run.data, np.uint8)
        view = memoryview(run.data)
        bad = np.zeros(n, bool)
        lowercase = self.lowercase

        def meta(i: int, name: str) -> str:
            return run.key(i, lowercase) if name == "__key__" else run.url_of(i) if name == "__url__" else source

        columns: List[list] = []
        for f, (field, kind) in enumerate(zip(self.fields, self.kinds)):
            j = members[f][kinds]
            bad |= j < 0
            index = run.member_base[:-1] + np.maximum(j, 0)

            def ext(i: int, j=j) -> str:
                return run.names[kinds[i]][j[i]]

            cells = Cells(data, view, run.member_at[index], run.member_size[index], flags[f][kinds], bad, ext, meta, self.epoch)
            columns.append(kind.parse_run(field, cells))
        return columns, np.flatnonzero(bad).tolist()


class _Joined:
    """Runs laid end to end, as :meth:`RowDecoder.decode` reads a run: runs of one buffer (an
    Arena's) read where they lie (``data``: the buffer from ``lo``; each run at ``r.at - lo``),
    whatever their order or the bytes between them; runs of buffers of their own copied end to
    end. Their pattern tables are laid end to end too (``names``; each run's ``kinds`` shifted by
    its table's place), so runs of shards with different member layouts decode together."""

    def __init__(self, runs: Sequence[Run], shared: bool) -> None:
        self.runs = runs
        if shared:
            ats = [r.at for r in runs]
            lo = min(ats)
            self.data = memoryview(runs[0].buffer)[lo:max(r.at + len(r.data) for r in runs)]
            starts = np.array(ats, np.int64) - lo
        else:
            self.data = b"".join(r.data for r in runs)
            starts = np.cumsum([0] + [len(r.data) for r in runs])[:-1]
        self.names, self.tables, shift = joined_tables([r.names for r in runs])
        # (each run's arrays shifted by its place: one concatenation and one addition per array for
        # all the runs, not one per run: a worker's round decodes tens of short runs)
        rows = [len(r.kinds) for r in runs]
        members = [len(r.member_at) for r in runs]
        self.row_starts = np.cumsum([0] + rows)
        member_starts = np.cumsum([0] + members)
        self.kinds = np.concatenate([r.kinds for r in runs]) + np.repeat(shift, rows)
        self.member_at = np.concatenate([r.member_at for r in runs]) + np.repeat(starts, members)
        self.member_size = np.concatenate([r.member_size for r in runs])
        self.member_base = np.concatenate([r.member_base[:-1] for r in runs] + [np.zeros(1, np.int64)]) + \
            np.repeat(member_starts, rows + [1])

    def __len__(self) -> int:
        return len(self.kinds)

    def _run(self, i: int) -> Tuple[Run, int]:
        k = int(np.searchsorted(self.row_starts, i, side="right")) - 1
        return self.runs[k], i - int(self.row_starts[k])

    def key(self, i: int, lowercase: bool = False) -> str:
        run, j = self._run(i)
        return run.key(j, lowercase)

    def url_of(self, i: int) -> str:
        return self._run(i)[0].url


def joined_tables(tables: Sequence[Sequence[Tuple[str, ...]]]) -> Tuple[Tuple[Tuple[str, ...], ...],
                                                                        List[Sequence[Tuple[str, ...]]], List[int]]:
    """Pattern tables (of runs, or shards) laid end to end, each once however often it comes:
    their patterns' names, the tables in that order (as :meth:`RowDecoder.decode` reads them),
    and where each of ``tables`` starts among the names (what its patterns' numbers shift by)."""
    place: Dict[int, int] = {}  # id of a pattern table -> where its patterns start in names
    names: List[Tuple[str, ...]] = []
    once = []
    for table in tables:
        if id(table) not in place:
            place[id(table)] = len(names)
            names += table
            once.append(table)
    return tuple(names), once, [place[id(table)] for table in tables]


def decode_runs(decoder: RowDecoder, runs: Sequence[Tuple[Run, str]]) -> None:
    """Decode many runs together (their rows in one pass of array operations per field, which
    pays where each run alone holds few rows: a worker's many interleaved columns): each run's
    share of the result in ``run.decoded``; ``runs`` as ``(run, its source's name)``. Runs of one
    buffer (a worker's :class:`~dalistream.tar.runs.Arena`) are read where they lie, whatever
    shard (and member layout) they come from; others are copied end to end."""
    groups: Dict[Tuple[int, str], List[Run]] = {}
    for run, source in runs:
        if run.decoded is None:
            groups.setdefault((id(run.buffer), source), []).append(run)
    loose: Dict[str, List[Run]] = {}  # runs in buffers of their own, by source
    for (_, source), members in groups.items():
        if len(members) == 1 and members[0].buffer is members[0].data:
            loose.setdefault(source, []).append(members[0])
        elif len(members) == 1:
            members[0].decoded = decoder.decode(members[0], source)
        else:
            _decode_together(decoder, members, source, shared=True)
    for source, members in loose.items():
        if len(members) == 1:
            members[0].decoded = decoder.decode(members[0], source)
        else:
            _decode_together(decoder, members, source, shared=False)


def _decode_together(decoder: RowDecoder, members: Sequence[Run], source: str, shared: bool) -> None:
    joined = _Joined(members, shared)
    columns, bad = decoder.decode(joined, source)  # type: ignore[arg-type]
    for run, a in zip(members, joined.row_starts[:-1].tolist()):
        run.decoded = _share((columns, bad), a, len(run))


def _share(decoded: Tuple[List[list], List[int]], a: int, n: int) -> Tuple[List[list], List[int]]:
    """Rows ``a … a + n - 1`` of a decoded block: its columns' slice, its bad rows among them."""
    columns, bad = decoded
    b = a + n
    return [column[a:b] for column in columns], [i - a for i in bad if a <= i < b]


def last_waits(columns: List[list], n: int, ordinal: int, next_read: Callable[[bool], bool]) -> Iterator[Rows]:
    """``n`` decoded rows of consecutive ordinals from ``ordinal`` as blocks, the last given once
    ``next_read(True)`` has read the item after them (a run's last sample: see
    :meth:`~dalistream.worker.column.ColumnReader.next_read`)."""
    if n > 1:
        yield Rows([column[:n - 1] for column in columns], n - 1, ordinal)
    next_read(True)
    last = Rows([column[n - 1:] for column in columns], 1, ordinal + n - 1)
    # (a column may take no more rows for a while after this one: suspended at its last yield,
    # the generator does not hold the run's rows, which would keep its buffer from the arena)
    del columns, next_read
    yield last


def gather(flat: Sequence[list], at: List[int]) -> List[list]:
    """Rows ``at`` (in that order) of each field's values in ``flat``: a step's slot."""
    if not at:
        return [[] for _ in flat]
    if len(at) == 1:
        return [[values[at[0]]] for values in flat]
    pick = operator.itemgetter(*at)
    return [list(pick(values)) for values in flat]


def less_drops(rows: np.ndarray, drop: np.ndarray) -> np.ndarray:
    """A column's ``rows`` less its plan's drops, ``drop``: raw positions from its first row here
    (drops before or past what it reads here are not read: left alone)."""
    return np.delete(rows, drop[(drop >= 0) & (drop < len(rows))]) if len(drop) else rows
