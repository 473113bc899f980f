"""Every sample's tar offset, for all shards: where a worker opens a shard it owns only a part of.

One flat ``int64`` array indexed by (shard, sample) through the counts (``-1`` where a shard's
offsets are unknown: that part is reached by skipping headers). When written to a file (the
cache directory, by :meth:`SampleOffsets.saved`), a worker memory-maps it instead of receiving
a pickled copy: the workers of a node share one page cache however large the data set is.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Optional, Sequence

import numpy as np

from ..io.local import cache_write


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

    def __init__(self, counts: Sequence[int], rows: Sequence[Optional[Sequence[int]]], members: Any = None) -> None:
        self.starts = running_starts(counts)
        self._flat: Optional[np.ndarray] = flat_offsets(self.starts, rows)
        self.path: Optional[str] = None
        self.members = members  # the regular shards' member layouts (a manifest.members.MemberLayout), or None

    @classmethod
    def from_flat(cls, starts: np.ndarray, flat: np.ndarray, members: Any = None) -> "SampleOffsets":
        """From the flat array itself (``-1`` unknown), laid out by ``starts`` (the running sum of
        counts); ``members``: a :class:`~.members.MemberLayout` of the same shards, or ``None``."""
        self = cls.__new__(cls)
        self.starts = np.asarray(starts, dtype=np.int64)
        self._flat = np.asanyarray(flat, dtype=np.int64)  # a memory map stays one
        self.path = None
        self.members = members
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
        """Write the array (and the member sizes) once under ``directory`` (named by content) and map
        it from there; unchanged (kept in memory) if the directory cannot be written."""
        if self.members is not None:
            self.members.kind_path = _saved_array(directory, self.members.kind, "members")
            self.members.sizes_path = _saved_array(directory, self.members.sizes, "members")
        self.path = _saved_array(directory, self.flat, "offsets") or self.path
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.path is not None:
            state["_flat"] = None  # mapped again in the worker
        return state


def _saved_array(directory: str, array: np.ndarray, kind: str) -> Optional[str]:
    """``array`` written once under ``directory/kind`` (named by its content): its path, or ``None``
    when it cannot be written. An array already mapped from that folder is its own file."""
    if isinstance(array, np.memmap) and array.filename and os.path.dirname(
            os.path.dirname(os.path.abspath(array.filename))) == os.path.abspath(directory):
        return array.filename
    array = np.ascontiguousarray(array)
    path = os.path.join(directory, kind, hashlib.sha256(array.tobytes()).hexdigest()[:32] + ".npy")
    if not os.path.exists(path) and not cache_write(path, lambda f: np.save(f, array)):
        return None
    return path
