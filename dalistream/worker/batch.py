"""One worker's batch: pure functions from a slot's samples to the arrays DALI's worker ships.

:func:`assemble` lays out the *plain* batch: every field full size, the worker's slot holding
its samples and every other position the field's shared empty array (a zero in the dense array
of a scalar field), then ``valid``. :func:`pack` turns it into the *transfer* form, the one way
a byte field (``bytes``, ``meta``: one-dimensional ``uint8``) travels: a *blob*, one flat
array holding the batch's row lengths (``batch`` int32) and then the slot's rows end to end.
In the main process, before DALI feeds it, :func:`rows` cuts it back into one view per position
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

from typing import Any, List, Sequence, Tuple

import numpy as np

_EMPTY_ROW = np.zeros(0, np.uint8)
_EMPTY_ROW.flags.writeable = False


def byte_fields(fields: Sequence[Any]) -> Tuple[int, ...]:
    """Indices of the fields whose kind has them travel as blobs (:meth:`dalistream.kinds.Kind.travels`)."""
    return tuple(i for i, f in enumerate(fields) if f.spec.travels(f) == "blob")


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


def pack(plain: Sequence[Any], packed: Sequence[int], lo: int, hi: int) -> Tuple[Any, ...]:
    """The transfer form of a plain batch whose real samples lie in positions ``lo:hi``: the
    outputs of ``plain``, each byte field at ``packed`` as a blob (its ``batch`` row lengths as
    int32, then the rows ``lo:hi`` end to end; the other positions are empty)."""
    out = list(plain)
    batch_size = len(plain[-1])
    for i in packed:
        own = plain[i][lo:hi]
        lengths = np.zeros(batch_size, np.int32)
        lengths[lo:hi] = [len(a) for a in own]  # (1-D bytes: len is the size, for arrays and views alike)
        out[i] = np.frombuffer(bytearray().join([lengths.tobytes(), *own]), np.uint8)  # one copy, writable
    return tuple(out)


def with_placeholders(outputs: Sequence[Any], left_out: Sequence[int]) -> Tuple[Any, ...]:
    """``outputs`` with one placeholder inserted at each index of ``left_out`` (outputs of fields
    no graph output needs, which DALI prunes unfed): a dense array of zero bytes, one per position."""
    out = list(outputs)
    placeholder = np.zeros(len(outputs[-1]), np.uint8)
    for i in sorted(left_out):
        out.insert(i, placeholder)
    return tuple(out)


def rows(blob: np.ndarray, batch_size: int) -> List[np.ndarray]:
    """A blob cut into its ``batch_size`` rows: views of ``blob``, every empty row one shared
    empty array (the inverse of :func:`pack` for one field)."""
    head = 4 * batch_size
    if len(blob) < head:
        raise ValueError(f"blob of {len(blob)} bytes cannot hold {batch_size} lengths")
    bounds = np.concatenate([[0], np.cumsum(blob[:head].view(np.int32))]).tolist()
    if head + bounds[-1] != len(blob):
        raise ValueError(f"blob of {len(blob) - head} bytes for rows of {bounds[-1]}")
    body = blob[head:]
    return [body[a:b] if b > a else _EMPTY_ROW for a, b in zip(bounds[:-1], bounds[1:])]


def shm_hint(batch_size: int, slot: int, bytes_per_sample: float, n_fields: int) -> int:
    """``bytes_per_sample_hint`` for one worker's source: room for its largest transfer from the
    start, so that DALI never regrows the shared memory mid-run: the slot's rows at 4× the data
    set's mean sample (``bytes_per_sample`` from shard sizes, for batches of large samples),
    spread over the batch's positions, plus per-position lengths and metadata."""
    return int(4 * bytes_per_sample * slot / batch_size) + 68 * n_fields + 256
