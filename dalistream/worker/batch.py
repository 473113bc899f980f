"""One worker's batch: pure functions from a slot's samples to the arrays DALI's worker ships.

:func:`assemble` lays out the *plain* batch: every field full size, the worker's slot holding
its samples and every other position the field's shared empty array (a zero in the dense array
of a scalar field), then ``valid``. :func:`pack` turns it into the *transfer* form
(:func:`transfer` says which output each field takes): a byte field (``bytes``, ``meta``:
one-dimensional ``uint8``) travels as a *blob*, one flat array holding the batch's row lengths
(``batch`` int32) and then the slot's rows end to end; every other field, a bucketed stream's
bucket index and ``valid`` as they are. In the main process, before DALI feeds it,
:func:`row_bounds` finds a blob's non-empty rows, which become one view each
(:func:`dalistream.dali.graph.received_rows`), so the graph gets the exact bytes and trims
nothing.

Why one flat array: DALI's parallel external source pays per shipped list element (here ~7.5 µs
in the worker and ~10 µs in the main process, even for an empty one), and every worker ships all
B positions, its dummies included. A blob is one array in the worker, and in the main process a
view per row (the dummies one shared empty row). The padded dense block it replaced (B rows of
the slot's longest sample from every worker, trimmed in the graph) was faster only for rows of
tens of bytes at B=256 (by 0.3–0.7 ms a batch); from 1 kB rows on it cost more CPU, and 2–4.5×
the blob's time for rows of 100–200 kB (``dalistream bench --merge-only``, W = 1, 2, 4, B = 64 and 256).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import numpy as np

_EMPTY_ROW = np.zeros(0, np.uint8)
_EMPTY_ROW.flags.writeable = False


def templates(fields: Sequence[Any], batch_size: int) -> List[Any]:
    """The empty plain batch: a dense zero array per field that travels dense, shared empties
    otherwise, then ``valid``."""
    return [np.zeros(batch_size, f.dtype) if f.spec.travels(f) == "dense" else [f.empty] * batch_size
            for f in fields] + [np.zeros(batch_size, np.uint8)]


def assemble(empty: Sequence[Any], columns: Sequence[Sequence[Any]], lo: int, n: int) -> Tuple[Any, ...]:
    """The plain batch: ``empty`` (from :func:`templates`, left untouched) with ``n`` samples at
    positions ``lo, lo + 1, …`` and ``valid`` set there; ``columns``: one per field, its ``n``
    values (arrays or byte rows: anything with the buffer protocol; an array for a scalar field)."""
    outputs = tuple(t.copy() for t in empty)
    if n:
        for out, column in zip(outputs, columns):
            out[lo:lo + n] = column
        outputs[-1][lo:lo + n] = 1
    return outputs


@dataclass(frozen=True)
class Transfer:
    """How a worker's batch travels (:func:`transfer`): the stream's ``fields`` (a count), each an
    output of its own, in the stream's order (``blobs``: which of them are blobs); then a bucketed
    stream's bucket index (``bucket``: int32), then ``valid`` (uint8)."""

    fields: int
    blobs: Tuple[int, ...]
    bucket: bool

    @property
    def n_outputs(self) -> int:
        """Outputs a source ships: its fields', then the bucket index (bucketed), then ``valid``."""
        return self.fields + self.bucket + 1


def transfer(fields: Sequence[Any], bucketed: bool = False) -> Transfer:
    """The :class:`Transfer` of a stream's ``fields``: each ships as an output of its own (a byte
    field as a blob), then a bucketed stream's bucket index, then ``valid``. Nothing is packed
    into a wider array: cutting one into columns takes a DALI operator per column and batch,
    which cost the main process more than the outputs it saved (feed graph, ``-W 2`` and ``-W 4``:
    0.82–0.90× its CPU per sample without the packing)."""
    blobs = tuple(i for i, f in enumerate(fields) if f.spec.travels(f) == "blob")
    return Transfer(len(fields), blobs, bucketed)


def pack(plain: Sequence[Any], form: Transfer, kept: Sequence[int], lo: int, hi: int) -> Tuple[Any, ...]:
    """The transfer form (``form``) of a plain batch whose real samples lie in positions
    ``lo:hi``: ``plain`` holds the fields ``kept`` (indices into the stream's fields; the others
    are left out: no graph output needs them), then a bucketed stream's bucket index, then
    ``valid``. Each byte field becomes a blob (its ``batch`` row lengths as int32, then the rows
    ``lo:hi`` end to end; the other positions are empty), a left-out output one placeholder (a
    dense array of zero bytes, which DALI prunes unfed), the others as they are."""
    batch_size = len(plain[-1])
    placeholder = np.zeros(batch_size, np.uint8)
    out: List[Any] = [placeholder] * form.fields
    for value, i in zip(plain, kept):
        if i in form.blobs:
            own = value[lo:hi]
            lengths = np.zeros(batch_size, np.int32)
            lengths[lo:hi] = [len(a) for a in own]  # (1-D bytes: len is the size, for arrays and views alike)
            value = np.frombuffer(bytearray().join([lengths.tobytes(), *own]), np.uint8)  # one copy, writable
        out[i] = value
    tail = (np.asarray(plain[-2], np.int32),) if form.bucket else ()
    return tuple(out) + tail + (np.asarray(plain[-1], np.uint8),)


def row_bounds(blob: np.ndarray, batch_size: int) -> Tuple[np.ndarray, List[int], List[int], List[int]]:
    """A blob's rows (:func:`pack`, one field) as ``(body, positions, starts, ends)``: the
    positions of the non-empty rows and their bounds in ``body``; the other rows are empty."""
    head = 4 * batch_size
    if len(blob) < head:
        raise ValueError(f"blob of {len(blob)} bytes cannot hold {batch_size} lengths")
    lengths = blob[:head].view(np.int32)
    ends = np.cumsum(lengths)
    if batch_size and head + int(ends[-1]) != len(blob):
        raise ValueError(f"blob of {len(blob) - head} bytes for rows of {int(ends[-1])}")
    positions = np.flatnonzero(lengths)
    ends = ends[positions]
    return blob[head:], positions.tolist(), (ends - lengths[positions]).tolist(), ends.tolist()


def rows(blob: np.ndarray, batch_size: int) -> List[np.ndarray]:
    """A blob cut into its ``batch_size`` rows: views of ``blob``, every empty row one shared
    empty array (the inverse of :func:`pack` for one field)."""
    body, positions, starts, ends = row_bounds(blob, batch_size)
    out = [_EMPTY_ROW] * batch_size
    for i, a, b in zip(positions, starts, ends):
        out[i] = body[a:b]
    return out


def shm_hint(batch_size: int, slot: int, bytes_per_sample: float, n_fields: int) -> int:
    """``bytes_per_sample_hint`` for one worker's source: room for its largest transfer from the
    start, so that DALI never regrows the shared memory mid-run: the slot's rows at 4× the data
    set's mean sample (``bytes_per_sample`` from shard sizes, for batches of large samples),
    spread over the batch's positions, plus per-position lengths and metadata."""
    return int(4 * bytes_per_sample * slot / batch_size) + 68 * n_fields + 256
