"""Manifest rows: a shard's URL, its number of samples, its stored size and (optionally) the tar
offset of every sample, its member layout (:mod:`.members`) and its samples' keys for buckets
(:mod:`.keys`: image width and height, member lengths) — one :class:`ShardInfo` each, or all of them as columns
(:class:`ShardRows`), which is how a manifest of 100,000 shards is read, matched and handed to the
plan without a Python object per row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import ManifestError
from .members import MemberLayout, Members
from .offsets import flat_offsets, running_starts


@dataclass(frozen=True)
class ShardInfo:
    """One manifest row: shard URL, number of samples, size in bytes (as stored), and optionally
    the tar offset of every sample and, for a regular shard, its member layout (its patterns,
    each sample's pattern, every member's size: :mod:`.members`) and per-sample keys (``keys``:
    column name → one integer per sample, ``-1`` unknown: :mod:`.keys`)."""

    url: str
    samples: int
    bytes: int
    offsets: Optional[Tuple[int, ...]] = None
    members: Optional[Members] = None
    keys: Optional[Dict[str, Tuple[int, ...]]] = None

    def __post_init__(self) -> None:
        if self.keys is not None:  # (from JSON: lists)
            object.__setattr__(self, "keys", {str(k): tuple(v) for k, v in self.keys.items()})
            wrong = next((k for k, v in self.keys.items() if len(v) != self.samples), None)
            if wrong is not None:
                raise ManifestError(f"manifest row has {len(self.keys[wrong])} values of key {wrong!r} for "
                                    f"{self.samples} samples", url=self.url)
        if self.members is not None:  # (from JSON: lists)
            patterns, kinds, sizes = self.members
            object.__setattr__(self, "members", (tuple((tuple(e), tuple(h)) for e, h in patterns), tuple(kinds), tuple(sizes)))
        if self.offsets is not None:
            object.__setattr__(self, "offsets", tuple(self.offsets))
            if len(self.offsets) != self.samples:
                raise ManifestError(f"manifest row has {len(self.offsets)} offsets for {self.samples} samples",
                                    url=self.url)


class ShardRows:
    """Rows as columns: ``urls``, ``samples`` and ``sizes`` (``int64``, ``-1`` unknown), and
    ``offsets``: every sample's tar offset in one flat ``int64`` array laid out by ``starts``
    (the running sum of ``samples``), ``-1`` for rows without offsets; ``None`` when no row has any;
    ``members``: the regular shards' member layouts (:class:`~.members.MemberLayout`), or ``None``;
    ``keys``: per-sample key columns (name → flat ``int64`` array laid out like ``offsets``, ``-1``
    unknown), or ``None`` when no row has any."""

    def __init__(self, urls: Sequence[str], samples: np.ndarray, sizes: np.ndarray,
                 offsets: Optional[np.ndarray] = None, members: Optional[MemberLayout] = None,
                 keys: Optional[Mapping[str, np.ndarray]] = None) -> None:
        self.urls = list(urls)
        self.samples = np.asarray(samples, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.starts = running_starts(self.samples)
        self.offsets = offsets
        self.members = members
        self.keys = dict(keys) if keys else None
        if offsets is not None and len(offsets) != self.starts[-1]:
            raise ValueError(f"{len(offsets)} offsets for {int(self.starts[-1])} samples")
        for name, column in (self.keys or {}).items():
            if len(column) != self.starts[-1]:
                raise ValueError(f"{len(column)} values of key {name!r} for {int(self.starts[-1])} samples")

    @classmethod
    def from_infos(cls, infos: Sequence[ShardInfo]) -> "ShardRows":
        samples = np.fromiter((i.samples for i in infos), dtype=np.int64, count=len(infos))
        sizes = np.fromiter((i.bytes for i in infos), dtype=np.int64, count=len(infos))
        offsets = None
        if any(i.offsets is not None for i in infos):
            offsets = flat_offsets(running_starts(samples), [i.offsets for i in infos])
        members = MemberLayout.from_rows([i.members for i in infos], samples)
        return cls([i.url for i in infos], samples, sizes, offsets, members, key_columns(infos, samples))

    def __len__(self) -> int:
        return len(self.urls)

    def info(self, i: int) -> ShardInfo:
        """Row ``i`` as a :class:`ShardInfo` (offsets ``None`` where unknown)."""
        offsets = None
        if self.offsets is not None:
            row = self.offsets[self.starts[i]:self.starts[i + 1]]
            if not (len(row) and row[0] < 0):
                offsets = tuple(row.tolist())
        members = self.members.row(i) if self.members is not None else None
        keys = None
        if self.keys is not None:
            a, b = int(self.starts[i]), int(self.starts[i + 1])
            keys = {name: tuple(column[a:b].tolist()) for name, column in self.keys.items()
                    if b > a and (column[a:b] >= 0).any()} or None
        return ShardInfo(self.urls[i], int(self.samples[i]), int(self.sizes[i]), offsets, members, keys)

    def infos(self) -> List[ShardInfo]:
        return [self.info(i) for i in range(len(self))]

    def take(self, index: np.ndarray) -> "ShardRows":
        """Rows ``index`` (any order, repeats allowed), offsets gathered without a loop over rows."""
        index = np.asarray(index, dtype=np.int64)
        if len(index) == len(self) and np.array_equal(index, np.arange(len(self))):
            return self
        samples = self.samples[index]
        picked = None
        if self.offsets is not None or self.keys is not None:
            shift = np.repeat(self.starts[:-1][index] - running_starts(samples)[:-1], samples)
            picked = np.arange(int(samples.sum()), dtype=np.int64) + shift  # the samples taken, in order
        offsets = self.offsets[picked] if self.offsets is not None else None
        keys = {name: column[picked] for name, column in self.keys.items()} if self.keys is not None else None
        members = self.members.take(index, samples) if self.members is not None else None
        return ShardRows([self.urls[i] for i in index.tolist()], samples, self.sizes[index], offsets, members, keys)


def key_columns(infos: Sequence[ShardInfo], samples: np.ndarray) -> Optional[Dict[str, np.ndarray]]:
    """The rows' keys as flat columns (``-1`` where a row lacks a column), or ``None`` when no
    row has keys."""
    names = sorted({name for info in infos if info.keys for name in info.keys})
    if not names:
        return None
    starts = running_starts(samples)
    out = {name: np.full(int(starts[-1]), -1, dtype=np.int64) for name in names}
    for s, info in enumerate(infos):
        for name, values in (info.keys or {}).items():
            out[name][starts[s]:starts[s + 1]] = values
    return out
