"""Samples to arrays: field decoding, the missing-field and error policies, the shuffle buffer.

Nothing here touches DALI: a sample (``ext -> bytes`` dict from :mod:`dalistream.tario`) becomes a
tuple of numpy arrays, one per :class:`~dalistream.config.Field`, ready to be placed in a slot.
"""

from __future__ import annotations

import gzip
import io
import logging
import random
import zlib
from collections import Counter
from typing import Callable, Iterable, Iterator, Optional, Sequence, Tuple, TypeVar

import numpy as np

from .config import Field
from .errors import DalistreamError, SampleError

log = logging.getLogger(__name__)
T = TypeVar("T")


class FieldDecoder:
    """Decodes samples into one array per field, applying the missing-field policy.

    ``missing``: ``"error"`` raises :class:`SampleError` naming URL and key, ``"skip"`` returns
    ``None`` (the caller counts it), ``"empty"`` puts the field's empty value in its place.
    """

    def __init__(self, fields: Sequence[Field], missing: str = "error") -> None:
        self.fields = tuple(fields)
        self.missing = missing
        self._exts = {e for f in self.fields for e in f.exts}
        self._exts |= {e + ".gz" for e in self._exts}

    def wants(self, ext: str) -> bool:
        """True if members with this extension are needed (others are skipped unread)."""
        return ext in self._exts

    def decode(self, sample: dict) -> Optional[Tuple[np.ndarray, ...]]:
        """One array per field, or ``None`` when the sample is to be skipped."""
        out = []
        for field in self.fields:
            value = self._one(field, sample)
            if value is None:
                if self.missing == "error":
                    wanted = "/".join("." + e for e in field.exts)
                    present = sorted(k for k in sample if not k.startswith("__"))
                    raise SampleError(
                        f"sample has no member for field {field.name!r} (looked for {wanted}; it has {present})",
                        url=sample.get("__url__"), member=sample.get("__key__"),
                        hint="use missing='skip' or missing='empty' to accept such samples",
                    )
                if self.missing == "skip":
                    return None
                value = field.empty
            out.append(value)
        return tuple(out)

    def _one(self, field: Field, sample: dict) -> Optional[np.ndarray]:
        if field.kind == "meta":
            name = field.exts[0]
            return np.frombuffer(str(sample[name]).encode("utf-8"), np.uint8)
        for ext in field.exts:
            data = sample.get(ext)
            if data is None and sample.get(ext + ".gz") is not None:
                try:
                    data = gzip.decompress(sample[ext + ".gz"])
                except (OSError, EOFError, zlib.error) as e:
                    raise SampleError(f"cannot gunzip .{ext}.gz: {e}", url=sample.get("__url__"),
                                      member=f"{sample.get('__key__')}.{ext}.gz") from None
            if data is not None:
                try:
                    return _convert(field, data)
                except DalistreamError:
                    raise
                except Exception as e:
                    raise SampleError(f"cannot decode field {field.name!r}: {type(e).__name__}: {e}",
                                      url=sample.get("__url__"), member=f"{sample.get('__key__')}.{ext}") from None
        return None


def _convert(field: Field, data: bytes) -> np.ndarray:
    if field.kind == "bytes":
        return np.frombuffer(data, np.uint8)
    if field.kind == "int":
        text = data.strip()
        try:
            return np.array(int(text), np.int64)
        except ValueError:
            raise ValueError(f"label {text[:40]!r} is not an integer") from None
    if field.kind == "npy":
        value = np.load(io.BytesIO(data), allow_pickle=False)
    else:
        value = np.asarray(field.decoder(data))  # type: ignore[misc]
    if value.ndim != field.ndim:
        raise ValueError(f"expected {field.ndim} dimensions, got shape {value.shape}")
    return np.ascontiguousarray(value, dtype=field.dtype)


class ErrorPolicy:
    """Applies ``on_error`` to a :class:`SampleError`: re-raise, or count and skip.

    ``on_error`` is ``"raise"``, ``"skip"`` or a callable ``f(error)`` that raises to stop or
    returns to skip. Skips are counted by reason in :attr:`skipped` and logged once per shard.
    """

    def __init__(self, on_error) -> None:
        self.on_error = on_error
        self.skipped: Counter = Counter()
        self._warned: set = set()

    def handle(self, error: DalistreamError, reason: str) -> None:
        if self.on_error == "raise":
            raise error
        if callable(self.on_error):
            self.on_error(error)
        self.skipped[reason] += 1
        if error.url not in self._warned:
            self._warned.add(error.url)
            log.warning("skipping bad data (further skips in this shard are counted, not logged): %s", error)


def shuffle_seed(seed: int, epoch: int, global_worker: int) -> int:
    """The shuffle-buffer seed of one global worker in one epoch."""
    return (int(seed) * 1_000_003 + int(epoch)) * 1_000_033 + int(global_worker)


def shuffled(items: Iterable[T], size: int, seed: int) -> Iterator[T]:
    """Shuffle through a buffer of ``size`` items, deterministically for a given ``seed``.

    The random draws depend only on the number of items, never on their content, so the
    emitted order of a stream can be computed from indices alone (see :func:`emitted_indices`).
    """
    if size <= 1:
        yield from items
        return
    rng = random.Random(seed)
    buffer: list = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        out, buffer[j] = buffer[j], item
        yield out
    while buffer:
        j = rng.randrange(len(buffer))
        buffer[j], buffer[-1] = buffer[-1], buffer[j]
        yield buffer.pop()


def emitted_indices(count: int, total: Optional[int], size: int, seed: int) -> set:
    """Input positions among the first ``count`` items :func:`shuffled` emits for a stream of
    ``total`` items (``None``: endless). Used to resume without reading those items."""
    import itertools

    source: Iterable[int] = range(total) if total is not None else itertools.count()
    return set(itertools.islice(shuffled(source, size, seed), count))
