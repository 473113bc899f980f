"""A shard's member layout as a worker cuts its parts by it: :func:`shard_layout` says whether a
shard's samples can be cut out by the layout the manifest holds (else they are found by header
walk), and :class:`ShardLayout` keeps it, with its :class:`~dalistream.tar.runs.Geometry` once
worked out (:meth:`dalistream.worker.reader.PlanReader.geometry`)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..dataset import DataSet
from ..io.streams import is_gzip_name
from ..tar.runs import Geometry


class ShardLayout:
    """One shard's member layout as :meth:`~dalistream.worker.reader.PlanReader.layout` cuts parts
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
