"""The per-worker sample shuffle buffer, and the prediction of its output from indices alone:
the plan (resume) and the worker both use it, so it lives in the pure stage."""

from __future__ import annotations

import itertools
import random
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")


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
    source: Iterable[int] = range(total) if total is not None else itertools.count()
    return set(itertools.islice(shuffled(source, size, seed), count))
