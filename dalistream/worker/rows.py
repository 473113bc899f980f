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

from typing import Dict, List, Optional, Sequence, Tuple

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
        members, flags = self.member_maps(run.names)
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

            cells = Cells(data, view, run.member_at[index], run.member_size[index], flags[f][kinds], bad, ext, meta)
            columns.append(kind.parse_run(field, cells))
        return columns, np.flatnonzero(bad).tolist()


class _Joined:
    """Runs of one pattern table laid end to end, as :meth:`RowDecoder.decode` reads a run: side
    by side in one buffer (``data``: from the first run's start, each run at ``starts[k]``) or,
    without, copied end to end."""

    def __init__(self, runs: Sequence[Run], data: Optional[memoryview] = None,
                 starts: Optional[Sequence[int]] = None) -> None:
        self.names = runs[0].names
        self.runs = runs
        if data is None:
            self.data = b"".join(r.data for r in runs)
            starts = np.cumsum([0] + [len(r.data) for r in runs])[:-1].tolist()
        else:
            self.data = data
        self.row_starts = np.cumsum([0] + [len(r) for r in runs])
        members = np.cumsum([0] + [len(r.member_at) for r in runs])
        self.kinds = np.concatenate([r.kinds for r in runs])
        self.member_at = np.concatenate([r.member_at + a for r, a in zip(runs, starts)])
        self.member_size = np.concatenate([r.member_size for r in runs])
        self.member_base = np.concatenate([r.member_base[:-1] + m for r, m in zip(runs, members[:-1])] + [members[-1:]])

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


def _side_by_side(runs: List[Run]) -> List[List[Run]]:
    """``runs`` in groups that lie end to end in one buffer (an Arena's), in buffer order."""
    groups: List[List[Run]] = []
    for run in sorted(runs, key=lambda r: (id(r.buffer), r.at)):
        last = groups[-1][-1] if groups else None
        if last is not None and last.buffer is run.buffer and last.at + len(last.data) == run.at:
            groups[-1].append(run)
        else:
            groups.append([run])
    return groups


def decode_runs(decoder: RowDecoder, runs: Sequence[Tuple[Run, str]]) -> None:
    """Decode many runs together (their rows in one pass of array operations per field, which
    pays where each run alone holds few rows: a worker's many interleaved columns): each run's
    share of the result in ``run.decoded``; ``runs`` as ``(run, its source's name)``. Runs side by
    side in one buffer (a worker's :class:`~dalistream.tar.runs.Arena`) are read where they
    lie; others are copied end to end."""
    by_table: Dict[Tuple[int, str], List[Run]] = {}
    for run, source in runs:
        by_table.setdefault((id(run.names), source), []).append(run)
    for (_, source), members in by_table.items():
        together = _side_by_side(members)
        loose = [g[0] for g in together if len(g) == 1]
        batches = [(g, memoryview(g[0].buffer)[g[0].at:g[-1].at + len(g[-1].data)], [r.at - g[0].at for r in g])
                   for g in together if len(g) > 1]
        if len(loose) > 1:
            batches.append((loose, None, None))
        elif loose:
            loose[0].decoded = decoder.decode(loose[0], source)
        for group, data, starts in batches:
            joined = _Joined(group, data, starts)
            columns, bad = decoder.decode(joined, source)  # type: ignore[arg-type]
            bad_rows = np.asarray(bad, dtype=np.int64)
            for run, a, b in zip(group, joined.row_starts[:-1].tolist(), joined.row_starts[1:].tolist()):
                mine = bad_rows[(bad_rows >= a) & (bad_rows < b)] - a
                run.decoded = ([column[a:b] for column in columns], mine.tolist())
