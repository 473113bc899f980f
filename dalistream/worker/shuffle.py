"""The per-worker sample shuffle buffer (its one implementation is :mod:`dalistream.plan.buffer`),
and the prediction of its output (for resume)."""

from __future__ import annotations

import itertools
from typing import Iterable, Optional

from ..plan.buffer import shuffled

__all__ = ["emitted_indices", "shuffled"]


def emitted_indices(count: int, total: Optional[int], size: int, seed: int) -> set:
    """Input positions among the first ``count`` items :func:`shuffled` emits for a stream of
    ``total`` items (``None``: endless). Used to resume without reading those items."""
    source: Iterable[int] = range(total) if total is not None else itertools.count()
    return set(itertools.islice(shuffled(source, size, seed), count))
