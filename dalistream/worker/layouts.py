"""A shard's member layout as a worker cuts its parts by it: :func:`shard_layout` says whether a
shard's samples can be cut out by the layout the manifest holds (else they are found by header
walk), and :class:`ShardLayout` keeps it, with its :class:`~dalistream.tar.runs.Geometry` once
worked out (:meth:`ShardLayouts.geometry`); :class:`ShardLayouts` looks them up for a reader and
its helpers (:class:`~.context.ReadContext`)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from ..dataset import DataSet
from ..io.streams import is_gzip_name
from ..tar.runs import Geometry


class ShardLayout:
    """One shard's member layout as :meth:`ShardLayouts.layout` cuts parts
    from it (the manifest's :meth:`~dalistream.manifest.members.MemberLayout.at`), and its
    :class:`Geometry` once worked out."""

    __slots__ = ("patterns", "kinds", "sizes", "member_starts", "geometry")

    def __init__(self, patterns: list, kinds: np.ndarray, sizes: np.ndarray, member_starts: np.ndarray) -> None:
        self.patterns, self.kinds, self.sizes, self.member_starts = patterns, kinds, sizes, member_starts
        self.geometry: Optional[Geometry] = None


def shard_layout(data: DataSet, index: int, lowercase: bool) -> Optional[ShardLayout]:
    """Shard ``index``'s member layout when its samples can be cut out by it: a regular, plain
    shard whose layout holds its counted samples, no two extensions equal once lowercased (the
    header walk names such a duplicate); else ``None``."""
    members = getattr(data.offsets, "members", None)
    if members is None or data.counts is None or is_gzip_name(data.urls[index]):
        return None
    found = members.at(index)
    if found is None or len(found[1]) != data.counts[index]:
        return None
    if lowercase and any(len({e.lower() for e in exts}) < len(exts) for exts, _ in found[0]):
        return None
    return ShardLayout(*found)


class ShardLayouts:
    """The member layouts of a data set's shards, each looked up once (:func:`shard_layout`), as a
    reader cuts its parts by them: ``lowercase``, ``max_member_bytes``: the config's; ``wants``:
    the members the fields read (a :class:`~.fields.FieldDecoder`'s ``wants``)."""

    def __init__(self, data: DataSet, lowercase: bool, max_member_bytes: int, wants) -> None:
        self.data, self.lowercase, self.max_member_bytes, self.wants = data, lowercase, max_member_bytes, wants
        self._shards: Dict[int, Optional[ShardLayout]] = {}  # shard index -> its ShardLayout, or None

    def byte_range(self, index: int, first: int, stop: Optional[int]) -> Tuple[Optional[int], Optional[int]]:
        """Where samples ``first`` to ``stop`` of shard ``index`` lie in its tar, as far as the
        offsets say: ``(start, end)``, ``None`` where unknown (from 0 / to the end)."""
        data = self.data
        if data.offsets is None:
            return None, None
        count = data.counts[index] if data.counts is not None else None
        start = data.offsets.at(index, first) if first else None
        end = data.offsets.at(index, stop) if stop is not None and count is not None and stop < count else None
        return start, end

    def layout(self, index: int, first: int, stop: Optional[int], start: Optional[int]) -> Optional[tuple]:
        """``(patterns, each sample's pattern, member sizes, offset of first)`` for samples ``first``
        to ``stop`` of shard ``index`` when they can be cut out by its member layout (a regular
        shard, its part opened at ``first``'s offset, no member over ``max_member_bytes``: that one
        the header path refuses by name, nor two extensions equal once lowercased); else ``None``."""
        shard = self.shard(index) if stop is not None else None
        offset = self.data.offsets.at(index, first) if shard is not None else None
        if shard is None or offset is None or offset != (start or 0):
            return None
        sizes = shard.sizes[shard.member_starts[first]:shard.member_starts[stop]]
        if sizes.size and int(sizes.max()) > self.max_member_bytes:
            return None
        return shard.patterns, shard.kinds[first:stop], sizes, offset

    def shard(self, index: int) -> Optional[ShardLayout]:
        """Shard ``index``'s member layout when its samples can be cut out by it (:func:`shard_layout`),
        looked up once per shard, not once per part: a worker reading interleaved opens a part of a
        shard for each of its columns."""
        if index not in self._shards:
            if len(self._shards) >= 1024:
                self._shards.clear()
            self._shards[index] = shard_layout(self.data, index, self.lowercase)
        return self._shards[index]

    def geometry(self, index: int) -> Geometry:
        """Where the members of shard ``index`` lie (its member layout worked out once)."""
        shard = self.shard(index)
        if shard is None:
            raise ValueError(f"shard {index} has no member layout to cut its samples by")
        if shard.geometry is None:
            shard.geometry = Geometry(shard.patterns, shard.kinds, shard.sizes, self.wants, self.lowercase)
        return shard.geometry
