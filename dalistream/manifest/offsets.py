"""Every sample's tar offset, for all shards: where a worker opens a shard it owns only a part of.

One flat ``int64`` array indexed by (shard, sample) through the counts (``-1`` where a shard's
offsets are unknown: that part is reached by skipping headers). When written to a file (the
cache directory, by :meth:`SampleOffsets.saved`), a worker memory-maps it instead of receiving
a pickled copy: the workers of a node share one page cache however large the data set is.
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional, Sequence

import numpy as np

from ..io.local import write_atomic


def running_starts(counts: Sequence[int]) -> np.ndarray:
    """Where each shard's samples start in one flat sequence: ``0``, then the running sum of ``counts``."""
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=starts[1:])
    return starts


def flat_offsets(starts: np.ndarray, rows: Sequence[Optional[Sequence[int]]]) -> np.ndarray:
    """Per-shard offset rows laid out by ``starts`` in one flat array, ``-1`` where a row is ``None``."""
    flat = np.full(int(starts[-1]), -1, dtype=np.int64)
    for s, row in enumerate(rows):
        if row is not None:
            flat[starts[s]:starts[s + 1]] = row
    return flat


class SampleOffsets:
    """Tar offset of sample ``i`` of shard ``s``: :meth:`at`; picklable (a path when saved)."""

    def __init__(self, counts: Sequence[int], rows: Sequence[Optional[Sequence[int]]]) -> None:
        self.starts = running_starts(counts)
        self._flat: Optional[np.ndarray] = flat_offsets(self.starts, rows)
        self.path: Optional[str] = None

    @classmethod
    def from_flat(cls, starts: np.ndarray, flat: np.ndarray) -> "SampleOffsets":
        """From the flat array itself (``-1`` unknown), laid out by ``starts`` (the running sum of counts)."""
        self = cls.__new__(cls)
        self.starts = np.asarray(starts, dtype=np.int64)
        self._flat = np.asanyarray(flat, dtype=np.int64)  # a memory map stays one
        self.path = None
        return self

    @property
    def flat(self) -> np.ndarray:
        if self._flat is None:
            self._flat = np.load(self.path, mmap_mode="r")
        return self._flat

    def at(self, shard: int, sample: int) -> Optional[int]:
        """Offset of the first header of ``sample`` in ``shard`` (``None``: unknown, or past the end)."""
        i = int(self.starts[shard]) + sample
        if sample < 0 or i >= int(self.starts[shard + 1]):
            return None
        value = int(self.flat[i])
        return value if value >= 0 else None

    def saved(self, directory: str) -> "SampleOffsets":
        """Write the array once under ``directory`` (named by its content) and map it from there;
        unchanged (kept in memory) if the directory cannot be written."""
        if isinstance(self._flat, np.memmap) and self._flat.filename and os.path.dirname(
                os.path.dirname(os.path.abspath(self._flat.filename))) == os.path.abspath(directory):
            self.path = self._flat.filename  # already a file of this cache (a parsed manifest's)
            return self
        flat = np.ascontiguousarray(self.flat)
        digest = hashlib.sha256(self.starts.tobytes() + flat.tobytes()).hexdigest()[:32]
        path = os.path.join(directory, "offsets", digest + ".npy")
        try:
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                write_atomic(path, lambda f: np.save(f, flat))
        except OSError:
            return self
        self.path = path
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.path is not None:
            state["_flat"] = None  # mapped again in the worker
        return state
