"""One worker's batch: pure functions from a slot's samples to the arrays DALI's worker ships.

:func:`assemble` lays out the *plain* batch: every field full size, the worker's slot holding
its samples and every other position the field's shared empty array (a zero in the dense array
of a scalar field), then ``valid``. :func:`pack` turns it into the *transfer* form: each byte
field (``bytes``, ``meta``: one-dimensional ``uint8``) travels with its per-position lengths,
either as one padded dense block (batch × the slot's longest sample), as a *blob* (the slot's
rows end to end, one flat array), or as a list of arrays. A block and a blob are shipped by
DALI's worker in one piece instead of sample by sample. The graph cuts every row of a block back
to its length (:func:`dalistream.dali.graph.trim`); a blob is cut into its rows in the main
process before DALI feeds it (:func:`rows`, by :func:`dalistream.dali.graph.received_rows`),
so every form delivers the same bytes.

Why: DALI's parallel external source pays per shipped list element (here ~7.5 µs in the worker
and ~10 µs in the main process, even for an empty one), and every worker ships all B positions,
its dummies included. A blob costs one array in the worker and, in the main process, a view per
row (~1 µs for a dummy); a dense block costs a copy of its padding. The rule
(:func:`dense_is_cheaper`) picks the dense block while its padding stays small: ≤ 2 kB per
position against a blob, ≤ 16 kB against a list.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..config import is_image_ext

# DALI's per-sample cost of a list element, in bytes of dense block that cost the same time:
# a padded row shorter than this is cheaper than shipping the row as its own array
# (`dalistream bench --merge-only --merge-forms list,dense --merge-bytes N`, README).
DENSE_ROW_BYTES = 16 << 10
# the same against a blob (rows of 1-3 kB, half the positions dummies: dense and blob cost the same)
BLOB_ROW_BYTES = 2 << 10
# never a block above this (its shared memory is sized for it from the start, see shm_hint)
DENSE_MAX_BLOCK = 32 << 20

_EMPTY_BLOB = np.zeros(0, np.uint8)
_EMPTY_BLOB.flags.writeable = False


def byte_fields(fields: Sequence[Any]) -> Tuple[int, ...]:
    """Indices of the fields that travel with lengths (and may travel dense)."""
    return tuple(i for i, f in enumerate(fields) if f.kind in ("bytes", "meta") and f.ndim == 1
                 and np.dtype(f.dtype) == np.uint8)


def with_lengths(packed: Sequence[int], never_dense: Sequence[int]) -> Tuple[int, ...]:
    """The byte fields that have a lengths output, in the order of those outputs (after the
    fields and ``valid``): all of ``packed`` but the ``never_dense`` ones, whose blobs carry their
    own lengths (:func:`pack`)."""
    return tuple(i for i in packed if i not in never_dense)


def image_fields(fields: Sequence[Any]) -> Tuple[int, ...]:
    """Indices of the byte fields read only from image extensions. When blobs can be received they
    never travel dense, so the graph need not trim them: their rows are large and uneven, and a
    dense block would carry a row of padding for every dummy position."""
    return tuple(i for i in byte_fields(fields)
                 if all(is_image_ext(e) for e in fields[i].exts))


def templates(fields: Sequence[Any], batch_size: int) -> List[Any]:
    """The empty plain batch: a dense zero array per scalar field, shared empties otherwise,
    then ``valid``."""
    return [np.zeros(batch_size, f.dtype) if f.ndim == 0 else [f.empty] * batch_size
            for f in fields] + [np.zeros(batch_size, np.uint8)]


def assemble(empty: Sequence[Any], chunk: Sequence[Tuple[np.ndarray, ...]], lo: int) -> Tuple[Any, ...]:
    """The plain batch: ``empty`` (from :func:`templates`, left untouched) with ``chunk``'s
    samples (tuples of field values) at positions ``lo, lo + 1, …`` and ``valid`` set there."""
    outputs = tuple(t.copy() for t in empty)
    n = len(chunk)
    if n:
        for out, column in zip(outputs, zip(*chunk)):
            out[lo:lo + n] = column
        outputs[-1][lo:lo + n] = 1
    return outputs


def dense_is_cheaper(batch_size: int, longest: int, slot_bytes: int, row_bytes: int = DENSE_ROW_BYTES,
                     max_block: int = DENSE_MAX_BLOCK) -> bool:
    """The rule: a padded block (``batch_size`` rows of ``longest`` bytes) when its padding costs
    less than shipping the rows one by one: on average at most ``row_bytes`` of padding per
    position, and the block within ``max_block``."""
    if longest == 0:
        return False
    block = batch_size * longest
    return block <= max_block and block - slot_bytes <= batch_size * row_bytes


def pack(plain: Sequence[Any], packed: Sequence[int], lo: int, hi: int, row_bytes: Optional[int] = None,
         max_block: int = DENSE_MAX_BLOCK, blob: bool = False, never_dense: Sequence[int] = ()) -> Tuple[Any, ...]:
    """The transfer form of a plain batch whose real samples lie in positions ``lo:hi``: the
    outputs of ``plain`` (byte fields at ``packed`` as dense blocks where :func:`dense_is_cheaper`
    says so, otherwise as blobs when ``blob``, else as lists), then one ``(batch, 1)`` int32 array
    of lengths per packed field — except the fields in ``never_dense`` (``blob`` only): always a
    blob that carries its lengths ahead of its rows (:func:`headed_rows`), no lengths output, so
    that the graph has nothing to trim for them. ``row_bytes`` defaults to the rule's bound for the
    other form."""
    if never_dense and not blob:
        raise ValueError("never_dense needs blob: a list's rows would travel without their lengths")
    out = list(plain)
    batch_size = len(plain[-1])
    if row_bytes is None:
        row_bytes = BLOB_ROW_BYTES if blob else DENSE_ROW_BYTES
    lengths_out = []
    for i in packed:
        own = plain[i][lo:hi]
        lengths = np.zeros((batch_size, 1), np.int32)
        sizes = lengths[lo:hi, 0]
        sizes[:] = [a.size for a in own]
        if i in never_dense:
            out[i] = np.concatenate([lengths[:, 0].view(np.uint8), *own])
            continue
        longest = int(sizes.max()) if len(sizes) else 0
        total = int(sizes.sum())
        if dense_is_cheaper(batch_size, longest, total, row_bytes, max_block):
            block = np.zeros((batch_size, longest), np.uint8)
            # row-major order of the mask = the samples' concatenation order
            block[lo:hi][np.arange(longest) < sizes[:, None]] = np.concatenate(own)
            out[i] = block
        elif blob:
            out[i] = np.concatenate(own) if total else _EMPTY_BLOB
        lengths_out.append(lengths)
    return tuple(out) + tuple(lengths_out)


def shm_hint(batch_size: int, slot: int, bytes_per_sample: float, n_fields: int) -> int:
    """``bytes_per_sample_hint`` for one worker's source: room for its largest transfer from
    the start, so that DALI never regrows the shared memory mid-run: a dense block of up to
    :data:`DENSE_MAX_BLOCK` bytes, or the slot's bytes as a list (4× the data set's mean sample,
    ``bytes_per_sample`` from shard sizes, for batches of large samples), plus per-position metadata."""
    dense = min(DENSE_MAX_BLOCK, batch_size * (DENSE_ROW_BYTES + bytes_per_sample)) / batch_size
    listed = 4 * bytes_per_sample * slot / batch_size
    return int(max(dense, listed)) + 64 * n_fields + 256


def is_blob(value: Any) -> bool:
    """Whether a byte field's transfer form is a blob (one flat array; a dense block is 2-D)."""
    return isinstance(value, np.ndarray) and value.ndim == 1


def rows(blob: np.ndarray, lengths: np.ndarray) -> List[np.ndarray]:
    """A blob cut into its rows: views of ``blob``, one per position (``lengths``: ``(batch, 1)``),
    every empty row the same empty array."""
    sizes = lengths[:, 0].tolist()
    if len(sizes) and sum(sizes) != len(blob):
        raise ValueError(f"blob of {len(blob)} bytes for rows of {sum(sizes)}")
    out, start = [], 0
    for n in sizes:
        out.append(blob[start:start + n] if n else _EMPTY_BLOB)
        start += n
    return out


def headed_rows(blob: np.ndarray, batch_size: int) -> List[np.ndarray]:
    """A blob that carries its lengths (``batch_size`` int32 ahead of the rows) cut into its rows."""
    head = 4 * batch_size
    if len(blob) < head:
        raise ValueError(f"blob of {len(blob)} bytes cannot hold {batch_size} lengths")
    return rows(blob[head:], blob[:head].view(np.int32).reshape(batch_size, 1))


def unpacked(transfer: Sequence[Any], packed: Sequence[int], n_plain: int,
             never_dense: Sequence[int] = ()) -> Tuple[Any, ...]:
    """What the main process and the graph make of a transfer-form batch (the inverse of
    :func:`pack`): each packed field as a list of rows cut to their lengths."""
    out = list(transfer[:n_plain])
    batch_size = len(transfer[n_plain - 1])
    for i in never_dense:
        out[i] = headed_rows(transfer[i], batch_size)
    for i, lengths in zip(with_lengths(packed, never_dense), transfer[n_plain:]):
        value = rows(transfer[i], lengths) if is_blob(transfer[i]) else transfer[i]
        out[i] = [row[:n] for row, n in zip(value, lengths[:, 0])]
    return tuple(out)
