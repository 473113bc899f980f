"""The per-worker sample shuffle buffer's order, as a pure function of the number of items and a
seed. The worker shuffles its samples through :func:`shuffled`; the plan's shuffle-quality measure
(:mod:`.quality`) feeds it indices to predict the same order without reading data."""

from __future__ import annotations

import random
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def shuffled(items: Iterable[T], size: int, seed: int) -> Iterator[T]:
    """Shuffle through a buffer of ``size`` items, deterministically for a given ``seed``.

    The random draws depend only on the number of items, never on their content, so the
    emitted order of a stream can be computed from indices alone.
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
