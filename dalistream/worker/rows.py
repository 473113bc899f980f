"""Decoded samples a block at a time: a run of a regular shard decoded with array operations,
and a step's slot taken from such blocks.

:class:`RowDecoder` turns a :class:`~dalistream.tar.runs.Run` into one column per field: the rows
of a byte field as views of the run's bytes (images checked in bulk: the JPEG segment walk, the
PNG ``IEND``, as :func:`~dalistream.worker.fields.image_problem` checks one), integer labels parsed
in one pass, keys and other metadata per row. A sample that does not pass (a missing or gzipped
member, a damaged image, a label that is no plain decimal, a failing decoder) is named in ``bad``:
the reader settles it alone by the per-sample path, which raises, counts or skips it with the
same message as when it is read alone (``tests/worker/test_rows.py``: what a block delivers is
what the per-sample path delivers, value for value). :class:`Rows` is a decoded block;
:class:`Taker` takes a step's samples from a stream of blocks and single samples.
"""

from __future__ import annotations

import itertools
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..config import Field, is_image_ext
from ..tar.runs import Run
from .fields import JPEG_START, PNG_END, PNG_START, convert, image_problem

_BYTES, _INT, _META, _OTHER = range(4)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_DIGITS = 18  # a longer label is parsed alone (int64 holds every 18-digit decimal)
_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True  # what bytes.strip() strips
_JPEG_STEPS = 64  # segments walked in bulk before a row is checked alone
BULK_ROWS = 32  # fewer rows are checked one by one: array operations cost more than they save there


class Rows:
    """Decoded samples: ``columns``, one list per field, each of ``n`` values."""

    __slots__ = ("columns", "n")

    def __init__(self, columns: List[list], n: int) -> None:
        self.columns = columns
        self.n = n

    def __len__(self) -> int:
        return self.n


class RowDecoder:
    """Columns of decoded fields from a :class:`Run` (see the module doc); picklable."""

    def __init__(self, fields: Sequence[Field], lowercase: bool = False) -> None:
        self.fields = tuple(fields)
        self.lowercase = lowercase
        self._modes = tuple(_META if f.kind == "meta" else _INT if f.kind == "int" else
                            _BYTES if f.kind == "bytes" else _OTHER for f in self.fields)
        self._maps: Dict[int, tuple] = {}  # id of a pattern table's names: (names, members, images)

    def member_maps(self, names: Sequence[Tuple[str, ...]]) -> Tuple[np.ndarray, np.ndarray]:
        """For a pattern table, per field and pattern: the member the field is read from (-1: the
        per-sample path reads it: a member missing or gzipped; 0 for metadata), and whether it
        is an image to check."""
        found = self._maps.get(id(names))
        if found is None or found[0] is not names:
            member = np.zeros((len(self.fields), len(names)), np.int64)
            image = np.zeros((len(self.fields), len(names)), bool)
            for f, field in enumerate(self.fields):
                for k, exts in enumerate(names):
                    if field.kind == "meta":
                        continue
                    member[f, k] = -1
                    for ext in field.exts:
                        if ext in exts:
                            member[f, k] = exts.index(ext)
                            image[f, k] = field.kind == "bytes" and is_image_ext(ext)
                            break
                        if ext + ".gz" in exts:
                            break
            if len(self._maps) > 16:
                self._maps.clear()
            self._maps[id(names)] = found = (names, member, image)
        return found[1], found[2]

    def decode(self, run: Run) -> Tuple[List[list], List[int]]:
        """One column per field of ``run``'s samples, and the samples the per-sample path must
        settle (their entries in the columns are placeholders), in order."""
        n = len(run)
        members, images = self.member_maps(run.names)
        kinds = run.kinds
        data = np.frombuffer(run.data, np.uint8)
        view = memoryview(run.data)
        bad = np.zeros(n, bool)
        columns: List[list] = []
        for f, (field, mode) in enumerate(zip(self.fields, self._modes)):
            if mode == _META:
                columns.append([_meta(run, i, field.exts[0], self.lowercase) for i in range(n)])
                continue
            j = members[f][kinds]
            bad |= j < 0
            index = run.member_base[:-1] + np.maximum(j, 0)
            starts, lengths = run.member_at[index], run.member_size[index]
            if mode == _INT:
                values, wrong = parse_ints(data, starts, lengths) if n >= BULK_ROWS else (np.zeros(n, np.int64), np.ones(n, bool))
                column = values.tolist()
                where, size = starts.tolist(), lengths.tolist()
                for i in np.flatnonzero(wrong & ~bad).tolist():  # not plain decimal: int() as read alone, if it can
                    try:
                        value = int(bytes(view[where[i]:where[i] + size[i]]))
                    except ValueError:
                        value = None
                    if value is None or not _INT64_MIN <= value <= _INT64_MAX:
                        bad[i] = True  # (read alone, it is named)
                    else:
                        column[i] = value
                columns.append(column)
                continue
            rows = [view[a:a + m] for a, m in zip(starts.tolist(), lengths.tolist())]
            if mode == _BYTES:
                check = images[f][kinds] & ~bad
                if check.any():
                    bad[images_bad(data, starts, lengths, check, bulk=n >= BULK_ROWS)] = True
                if field.ndim != 1 or np.dtype(field.dtype) != np.uint8:  # not a blob: arrays, as decoded alone
                    rows = [np.frombuffer(r, np.uint8) for r in rows]
                columns.append(rows)
                continue
            column = []
            for i, row in enumerate(rows):
                value = None
                if not bad[i]:
                    try:
                        value = convert(field, bytes(row), run.names[kinds[i]][j[i]])
                    except Exception:
                        bad[i] = True
                column.append(value)
            columns.append(column)
        return columns, np.flatnonzero(bad).tolist()


def _meta(run: Run, i: int, name: str, lowercase: bool) -> np.ndarray:
    value = run.key(i, lowercase) if name == "__key__" else run.url if name == "__url__" else (run.source or "")
    return np.frombuffer(value.encode("utf-8", "surrogateescape"), np.uint8)


def parse_ints(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The decimal integers at ``data[starts[i]:starts[i] + lengths[i]]`` (``int64``), and which
    rows are not plain digits followed by whitespace (0 here; to be read alone)."""
    n = len(starts)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    width = int(lengths.max())
    if width == 0 or width > 2 * _MAX_DIGITS:  # (one long row: all read alone)
        return np.zeros(n, np.int64), np.ones(n, bool)
    columns = np.arange(width)
    inside = columns < lengths[:, None]
    text = np.where(inside, data[np.where(inside, starts[:, None] + columns, 0)], ord(" "))
    digit = (text >= ord("0")) & (text <= ord("9"))
    ndigits = np.where(digit.all(axis=1), width, np.argmin(digit, axis=1))
    trailing = (columns >= ndigits[:, None]) & ~_WHITESPACE[text]
    good = (ndigits >= 1) & (ndigits <= _MAX_DIGITS) & ~trailing.any(axis=1)
    value = np.zeros(n, np.int64)
    for c in range(min(width, _MAX_DIGITS)):
        value = np.where(c < ndigits, value * 10 + (text[:, c].astype(np.int64) - ord("0")), value)
    return np.where(good, value, 0), ~good


def images_bad(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, check: np.ndarray,
               bulk: bool = True) -> List[int]:
    """Of the rows ``check`` marks (encoded images at ``data[starts[i]:][:lengths[i]]``), those
    :func:`image_problem` refuses: with ``bulk``, JPEG and PNG settled together where they surely
    pass, the rest checked one by one."""
    ok = ~check
    if not bulk:
        return [i for i in np.flatnonzero(check).tolist()
                if image_problem(data[starts[i]:starts[i] + lengths[i]].tobytes()) is not None]
    head = _bytes_at(data, starts, lengths, 8)
    is_jpeg = check & (lengths >= 4) & (head[:, :3] == np.frombuffer(JPEG_START, np.uint8)).all(axis=1)
    is_png = check & (lengths >= 16) & (head == np.frombuffer(PNG_START, np.uint8)).all(axis=1)
    if is_png.any():
        tail = _bytes_at(data, starts + np.maximum(lengths - 8, 0), np.minimum(lengths, 8), 8)
        ok |= is_png & (tail == np.frombuffer(PNG_END, np.uint8)).all(axis=1)
    if is_jpeg.any():
        ok |= jpeg_whole(data, starts, lengths, is_jpeg)
    bad = []
    for i in np.flatnonzero(~ok).tolist():
        if image_problem(data[starts[i]:starts[i] + lengths[i]].tobytes()) is not None:
            bad.append(i)
    return bad


def _bytes_at(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` bytes of each row (zeros past a row's end)."""
    inside = np.arange(width) < lengths[:, None]
    return np.where(inside, data[np.where(inside, starts[:, None] + np.arange(width), 0)], 0)


def jpeg_whole(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows that surely pass :func:`image_problem` as JPEG: the segment walk of
    :func:`~dalistream.worker.fields._jpeg_scan`, run on all rows at once, reaches a start-of-scan
    marker, and the row ends with the end-of-image marker (after it, then). ``False`` is no
    verdict: those rows are checked alone."""
    ok = np.zeros(len(starts), bool)
    ends = starts + lengths
    active = np.flatnonzero(rows)
    active = active[(data[ends[active] - 2] == 0xFF) & (data[ends[active] - 1] == 0xD9)]
    i = np.full(len(active), 2, np.int64)
    for _ in range(_JPEG_STEPS):
        if not len(active):
            break
        n = lengths[active]
        live = i + 4 <= n
        at = starts[active] + np.where(live, i, 0)
        live &= data[at] == 0xFF
        marker = data[at + 1].astype(np.int64)
        found = live & (marker == 0xDA)
        ok[active[found]] = True
        no_length = ((marker >= 0xD0) & (marker <= 0xD8)) | (marker == 0x01)
        step = np.where(marker == 0xFF, 1, np.where(no_length, 2, 2 + data[at + 2].astype(np.int64) * 256 + data[at + 3]))
        live &= ~found & (i + step + 4 <= n)
        active, i = active[live], (i + step)[live]
    return ok


class Taker:
    """A step's samples from one stream of decoded samples: tuples (one sample) and
    :class:`Rows` (a block, taken across steps as needed)."""

    def __init__(self, items: Iterator, blocks: bool = True) -> None:
        self.items = items
        self.blocks = blocks  # False: the stream holds single samples only
        self.block: Optional[Rows] = None
        self.at = 0

    def take(self, k: int, columns: List[list]) -> int:
        """Append up to ``k`` samples to ``columns`` (one list per field); how many there were."""
        if not self.blocks:
            samples = list(itertools.islice(self.items, k))
            if samples:
                for column, values in zip(columns, zip(*samples)):
                    column.extend(values)
            return len(samples)
        got = 0
        while got < k:
            block = self.block
            if block is None:
                item = next(self.items, None)
                if item is None:
                    break
                if type(item) is not Rows:
                    for column, value in zip(columns, item):
                        column.append(value)
                    got += 1
                    continue
                block = self.block = item
                self.at = 0
            m = min(k - got, block.n - self.at)
            for column, values in zip(columns, block.columns):
                column.extend(values[self.at:self.at + m])
            self.at += m
            got += m
            if self.at == block.n:
                self.block = None
        return got
