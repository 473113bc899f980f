"""Where every member of a *regular* shard lies: enough to cut its samples out of the tar bytes
without parsing a header.

A shard is regular when each of its samples is a run of plain files named by their own headers,
with distinct extensions, each behind a fixed number of 512-byte header blocks (1, or 3 where a
pax header carries the mtime, as webdataset's ``TarWriter`` writes them), and nothing else between
them (no folders, links, or long names). The samples may differ in which members they have
(``jpg`` here, ``png`` there, a ``txt`` missing): each sample names its *pattern* (extensions and
header blocks, in tar order). Then member ``j`` of a sample has its data
``Σ_{m<j} (512 h_m + padded size_m) + 512 h_j`` bytes after the sample's offset, behind its own
header (the last of its ``h_j`` blocks). The scan (:func:`layout_of`) records this only for
shards where it holds exactly; the others are read by header.

A manifest row keeps its layout as ``(patterns, each sample's pattern, every member's size)``
(:data:`Members`). :class:`MemberLayout` holds all rows as columns: one table of patterns, every
sample's pattern in one flat ``int32`` array laid out like the samples' offsets (``-1``: its shard
is not regular), and every member's size in one flat ``int64`` array.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..tar.index import Headers
from .offsets import running_starts

BLOCK = 512

Pattern = Tuple[Tuple[str, ...], Tuple[int, ...]]  # a sample's extensions and header blocks, in tar order
Members = Tuple[Tuple[Pattern, ...], Tuple[int, ...], Tuple[int, ...]]  # a row's patterns, each sample's, member sizes


def padded(sizes: np.ndarray) -> np.ndarray:
    """Sizes rounded up to whole tar blocks."""
    return (np.asarray(sizes, dtype=np.int64) + (BLOCK - 1)) & -BLOCK


def layout_of(headers: Headers, offsets: np.ndarray, sample_of: np.ndarray,
              exts: Sequence[Optional[str]]) -> Optional[Members]:
    """The layout of a scanned shard, or ``None`` if it is not regular.

    ``headers``: its members (:func:`dalistream.tar.index.read_headers`); ``offsets``, ``sample_of``,
    ``exts``: where each sample starts, each member's sample and extension
    (:func:`dalistream.tar.index.group_samples`). Extensions are kept as written (a reader may
    lowercase them)."""
    n = len(headers.names)
    if not n or not len(offsets):
        return None
    following = np.append(headers.starts[1:], headers.end)
    ahead = headers.data - headers.starts  # each member's header blocks
    if not (headers.sliceable.all() and not headers.renamed.any() and (sample_of >= 0).all()
            and (ahead % BLOCK == 0).all() and (ahead >= BLOCK).all()
            and (following == headers.data + padded(headers.sizes)).all()) or "" in exts:
        return None
    blocks = (ahead // BLOCK).tolist()
    edges = [0] + (np.flatnonzero(np.diff(sample_of)) + 1).tolist() + [n]
    if len(edges) - 1 != len(offsets):
        return None
    table: dict = {}
    kinds = tuple(table.setdefault((tuple(exts[a:b]), tuple(blocks[a:b])), len(table))
                  for a, b in zip(edges, edges[1:]))
    return tuple(table), kinds, tuple(headers.sizes.tolist())


def pattern_problem(exts: Sequence[Any], headers: Sequence[Any]) -> Optional[str]:
    """What is wrong with one pattern (``None``: nothing): its extensions, its header blocks."""
    if not exts or not all(type(e) is str and e for e in exts) or len(set(exts)) != len(exts):
        return "each pattern's extensions must be distinct non-empty strings"
    if len(headers) != len(exts) or not all(type(h) is int and h >= 1 for h in headers):
        return "each pattern must give every extension a number of header blocks >= 1"
    return None


def check_members(members: Members, samples: int, offsets: Optional[Sequence[int]]) -> Optional[str]:
    """What is wrong with a row's layout (``None``: nothing): patterns, each sample's pattern,
    member sizes, and offsets that the sizes must reproduce."""
    patterns, kinds, sizes = members
    if not patterns:
        return "it has no patterns"
    for exts, headers in patterns:
        problem = pattern_problem(exts, headers)
        if problem:
            return problem
    if len(kinds) != samples or not all(type(k) is int and 0 <= k < len(patterns) for k in kinds):
        return f"it must name one of its {len(patterns)} patterns for each of its {samples} samples"
    if not all(type(s) is int and s >= 0 for s in sizes):
        return "its member sizes must be integers >= 0"
    expected = sum(len(patterns[k][0]) for k in kinds)
    if len(sizes) != expected:
        return f"it has {len(sizes)} member sizes where its samples' patterns have {expected} members"
    if offsets is None:
        return "member sizes need the samples' offsets"
    layout = MemberLayout.from_rows([members], [samples])
    if layout.first_mismatch(np.asarray(offsets, dtype=np.int64), running_starts([samples])) >= 0:
        return "its member sizes do not add up to the distance between its samples' offsets"
    return None


class MemberLayout:
    """All rows' layouts as columns (see the module doc); picklable, the arrays paths when saved."""

    def __init__(self, patterns: Sequence[Pattern], kind: np.ndarray, sizes: np.ndarray, samples: np.ndarray) -> None:
        self.patterns = [(tuple(e), tuple(int(b) for b in h)) for e, h in patterns]
        self.starts = running_starts(np.asarray(samples, dtype=np.int64))  # a shard's samples in ``kind``
        self._kind: Optional[np.ndarray] = np.asanyarray(kind, dtype=np.int32)
        self._sizes: Optional[np.ndarray] = np.asanyarray(sizes, dtype=np.int64)
        self.kind_path: Optional[str] = None
        self.sizes_path: Optional[str] = None
        if len(self._kind) != self.starts[-1]:
            raise ValueError(f"{len(self._kind)} sample patterns for {int(self.starts[-1])} samples")
        self._member_starts: Optional[np.ndarray] = None
        if len(self._sizes) != self.member_starts[-1]:
            raise ValueError(f"{len(self._sizes)} member sizes for {int(self.member_starts[-1])} members")

    def _members_per_sample(self, kind: np.ndarray) -> np.ndarray:
        k = np.array([len(e) for e, _ in self.patterns] + [0], dtype=np.int64)
        return k[np.where(kind >= 0, kind, len(self.patterns))]

    @classmethod
    def from_rows(cls, members: Sequence[Optional[Members]], samples: Sequence[int]) -> Optional["MemberLayout"]:
        """From per-row layouts (``None``: not regular); ``None`` when no row has one."""
        if all(m is None for m in members):
            return None
        table: dict = {}
        kinds, sizes = [], []
        for m, n in zip(members, samples):
            if m is None:
                kinds.append(np.full(n, -1, dtype=np.int32))
                continue
            local = np.array([table.setdefault((tuple(e), tuple(h)), len(table)) for e, h in m[0]], dtype=np.int32)
            kinds.append(local[np.asarray(m[1], dtype=np.int64)] if n else np.zeros(0, dtype=np.int32))
            sizes.append(np.asarray(m[2], dtype=np.int64))
        flat_kind = np.concatenate(kinds) if kinds else np.zeros(0, dtype=np.int32)
        flat_sizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
        return cls(list(table), flat_kind, flat_sizes, np.asarray(samples, dtype=np.int64))

    @property
    def member_starts(self) -> np.ndarray:
        """Where each sample's members start in ``sizes`` (8 bytes a sample: worked out where it is
        used, never shipped to a worker)."""
        if self._member_starts is None:
            self._member_starts = running_starts(self._members_per_sample(np.asarray(self.kind)))
        return self._member_starts

    @property
    def kind(self) -> np.ndarray:
        if self._kind is None:
            self._kind = np.load(self.kind_path, mmap_mode="r")
        return self._kind

    @property
    def sizes(self) -> np.ndarray:
        if self._sizes is None:
            self._sizes = np.load(self.sizes_path, mmap_mode="r")
        return self._sizes

    def at(self, shard: int) -> Optional[Tuple[List[Pattern], np.ndarray, np.ndarray, np.ndarray]]:
        """Shard ``shard``'s layout: the pattern table, each sample's pattern, its member sizes
        and where each sample's start in them (from 0); ``None`` when it is not regular."""
        a, b = int(self.starts[shard]), int(self.starts[shard + 1])
        kind = np.asarray(self.kind[a:b])
        if a == b or kind[0] < 0:
            return None
        m = self.member_starts[a:b + 1]
        return self.patterns, kind, np.asarray(self.sizes[m[0]:m[-1]]), m - m[0]

    def row(self, shard: int) -> Optional[Members]:
        """Shard ``shard``'s layout as a manifest row has it, or ``None``."""
        found = self.at(shard)
        if found is None:
            return None
        patterns, kind, sizes, _ = found
        used = sorted(set(kind.tolist()))
        local = {g: i for i, g in enumerate(used)}
        return tuple(patterns[g] for g in used), tuple(local[k] for k in kind.tolist()), tuple(sizes.tolist())

    def take(self, index: np.ndarray, samples: np.ndarray) -> "MemberLayout":
        """Rows ``index`` (any order, repeats allowed); ``samples``: their sample counts."""
        index = np.asarray(index, dtype=np.int64)
        counts = (self.starts[1:] - self.starts[:-1])[index]
        shift = np.repeat(self.starts[:-1][index] - running_starts(counts)[:-1], counts)
        picked = np.arange(int(counts.sum()), dtype=np.int64) + shift  # the samples taken, in order
        kind = np.asarray(self.kind)[picked]
        per = self.member_starts[picked + 1] - self.member_starts[picked]
        mshift = np.repeat(self.member_starts[picked] - running_starts(per)[:-1], per)
        sizes = np.asarray(self.sizes)[np.arange(int(per.sum()), dtype=np.int64) + mshift]
        return MemberLayout(self.patterns, kind, sizes, samples)

    def spans(self) -> np.ndarray:
        """Bytes each sample takes in the tar (0 where its shard is not regular)."""
        data = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(padded(self.sizes), out=data[1:])
        blocks = np.array([sum(h) for _, h in self.patterns] + [0], dtype=np.int64)
        kind = np.asarray(self.kind)
        return data[self.member_starts[1:]] - data[self.member_starts[:-1]] + BLOCK * blocks[np.where(kind >= 0, kind, -1)]

    def first_mismatch(self, offsets: Optional[np.ndarray], starts: np.ndarray) -> int:
        """The first regular shard whose member sizes do not add up to the distances between its
        samples' offsets (``offsets``: flat, laid out by ``starts``), or whose offsets are unknown; ``-1``: none."""
        kind = np.asarray(self.kind)
        regular = kind >= 0
        if not regular.any():
            return -1
        shard_of = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        if offsets is None:
            return int(shard_of[np.argmax(regular)])
        offsets = np.asarray(offsets, dtype=np.int64)
        wrong = regular & (offsets < 0)
        step = np.zeros(len(kind), dtype=bool)
        step[:-1] = (offsets[1:] - offsets[:-1]) != self.spans()[:-1]
        step[starts[1:] - 1] = False  # a shard's last sample: no next offset in its shard
        wrong |= regular & step
        return int(shard_of[np.argmax(wrong)]) if wrong.any() else -1

    def pattern_arrays(self) -> dict:
        """The pattern table as arrays, for ``np.savez`` beside ``kind`` and ``sizes`` (kept in
        their own files, to be memory-mapped): see :meth:`from_arrays`."""
        return {"member_exts": np.array(["\0".join(e) for e, _ in self.patterns], dtype=str),
                "member_headers": np.array(["\0".join(map(str, h)) for _, h in self.patterns], dtype=str)}

    @classmethod
    def from_arrays(cls, z, samples: np.ndarray, kind: np.ndarray, sizes: np.ndarray) -> "MemberLayout":
        """From :meth:`pattern_arrays` (``z``), each sample's pattern and every member's size."""
        patterns = [(tuple(e.split("\0")), tuple(int(b) for b in h.split("\0")))
                    for e, h in zip(z["member_exts"].tolist(), z["member_headers"].tolist())]
        return cls(patterns, kind, sizes, samples)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.kind_path is not None and self.sizes_path is not None:
            state["_kind"] = state["_sizes"] = state["_member_starts"] = None  # the worker maps the files
        return state
