"""A share of an epoch whose shards all have member layouts, read from one mapping of its shards
(:class:`MappedShare`, for :mod:`.epochfeed`).

The share's local shard files are mapped side by side in one address range (:class:`Region`), so
the whole share is one buffer: its members' headers are checked in one gather and its rows
decoded in one call per piece, whatever the number of shards, columns and ranges (a shard with
a member over ``max_member_bytes`` anywhere is read by ranges, as is one without a member
layout: :func:`~.epochfeed.start_share`). Where each of its samples and members lies is worked
out with array operations over its shards' member layouts laid end to end (:class:`ShardSet`),
not per range, so a share costs about the same whatever it cuts: shares can be small and of
equal size, and each next one is read in pieces (:meth:`MappedShare.piece`) over the steps of
the share before (:class:`~.epochfeed.EpochShares`), as one span's reads fall between its
batches. What it gives is the column path's, byte for byte; where anything is amiss (a shard
shorter than what is read of it, a header that fails its check, a row the decoder refuses, no
mapping) it gives nothing and the columns read the share.

The mapping is the process's one way of mapping its files (:class:`~dalistream.io.openfiles.Region`,
the column path's runs' too): unmapped when nothing refers to the region's bytes any more.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..io.openfiles import Region, identities, local_path
from ..tar.headers import BLOCK
from ..tar.runs import Run, concat_ranges, headers_ok
from .context import ReadContext
from .rows import joined_tables, less_drops
from .stats import WorkerStats

PIECE_BYTES = 8 << 20  # a share is decoded in pieces of about this many bytes, over the steps of the share before
REGION_BYTES = 1 << 30  # the address range a worker maps its files in: up to this many bytes stay mapped …
# … (as a share could hold); files over it are mapped anew after this many bytes read

class ShardSet:
    """Shards' member layouts laid end to end (each sample numbered from ``sample_base[k]`` for the
    ``k``-th shard, each member from its sample's ``member_base``), members at their offsets in
    their files (:class:`~dalistream.tar.runs.Geometry`), their patterns' tables end to end as
    :class:`~dalistream.worker.rows.RowDecoder` reads runs of several shards."""

    def __init__(self, ctx: ReadContext, shards: Sequence[int]) -> None:
        self.shards = tuple(shards)
        self.where = {s: k for k, s in enumerate(self.shards)}
        self.urls = [ctx.data.urls[s] for s in self.shards]
        geometries = [ctx.layouts.geometry(s) for s in self.shards]
        self.names, self.tables, shift = joined_tables([g.names for g in geometries])
        kinds, bases, ats, sizes, checks, owners, ends, counts, wanted, spans, stops = ([] for _ in range(11))
        members = 0
        for k, (s, g) in enumerate(zip(self.shards, geometries)):
            first = ctx.data.offsets.at(s, 0) or 0  # (where its first sample's first header is)
            kinds.append(g.kinds + shift[k])
            bases.append(g.member_base[:-1] + members)
            ats.append(g.member_at + first)
            sizes.append(g.sizes)
            checks.append(g.checks)
            wanted.append(g.want_member)
            owners.append(np.full(len(g.kinds), k, np.int64))
            ends.append(first + int(g.sample_start[-1]))
            spans.append(np.diff(g.sample_start))
            stops.append(first + g.sample_start[1:])
            counts.append(len(g.kinds))
            members += len(g.sizes)
        self.kinds = np.concatenate(kinds)
        self.member_base = np.concatenate(bases + [np.array([members], np.int64)])
        self.member_at = np.concatenate(ats)  # in its file
        self.member_size = np.concatenate(sizes)
        self.checks = np.concatenate(checks)
        self.wanted = np.concatenate(wanted)  # members the fields read (their bytes are the share's count)
        self.owner = np.concatenate(owners)  # each sample's shard (its place in ``shards``)
        self.sample_bytes = np.concatenate(spans)  # each sample's bytes, headers included
        self.sample_end = np.concatenate(stops)  # where each sample ends in its file
        self.ends = np.array(ends, np.int64)  # each shard's last sample's end: its end-of-archive marker there
        self.sample_base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


class ShareMaps:
    """What a worker's shares hand on to the next, across epochs too: their shards' layouts end to
    end (:class:`ShardSet`, most often the same shards), and the mapping of their files (what
    stays mapped is what the shares touched): a file mapped serves while it is the same (the same
    inode, size and time); the files of later shares, and a file replaced since, are mapped after
    the others while the range has room (:data:`REGION_BYTES`), then in a new one. Files over
    that size are mapped anew once that many bytes are read from them. :attr:`whole`: whether the
    worker's epochs are still read at once (``False`` once a share met what the columns must
    settle: what stopped one read stays, and is not read twice each epoch)."""

    def __init__(self, whole: bool = True) -> None:
        self.shards: Optional[ShardSet] = None
        self.region: Optional[Region] = None
        self.given = 0
        self.whole = whole

    def shard_set(self, ctx: ReadContext, indices: Sequence[int]) -> ShardSet:
        """The layouts of shards ``indices`` end to end."""
        if self.shards is None or self.shards.shards != tuple(indices):
            self.shards = ShardSet(ctx, indices)
        return self.shards

    def region_of(self, paths: Sequence[str], nbytes: int) -> Region:
        """A region mapping ``paths`` as they are now, of which ``nbytes`` are read: the last one,
        with those it lacks added while there is room (a worker's shards change from epoch to
        epoch), else a new one."""
        region = self.region
        if region is not None and not (region.end > REGION_BYTES and self.given + nbytes > REGION_BYTES):
            missing = [p for p, known in zip(paths, identities(paths)) if region.place.get(p, (0, 0, None))[2] != known]
            if not missing or region.add(missing):
                self.given += nbytes
                return region
        self.region, self.given = None, nbytes  # (the last one's own views keep it mapped)
        self.region = Region(paths, REGION_BYTES)
        return self.region


class _Rows(Run):
    """A piece of a share's samples as :meth:`~dalistream.worker.rows.RowDecoder.decode` reads a
    run (their keys read as a run's, from the region's bytes)."""

    def __init__(self, region: Region, shards: ShardSet, samples: np.ndarray, member_base: np.ndarray,
                 member_at: np.ndarray, member_size: np.ndarray) -> None:
        self.data, self.names, self.tables = region.buffer, shards.names, shards.tables
        self.buffer, self.at = region.buffer, 0
        self.kinds = shards.kinds[samples]
        self.member_base, self.member_at, self.member_size = member_base, member_at, member_size
        self._owner, self._urls = shards.owner[samples], shards.urls

    def url_of(self, i: int) -> str:
        return self._urls[int(self._owner[i])]


class MappedShare:
    """A share's rows, read from one :class:`Region` of its shards in :attr:`pieces` pieces
    (:meth:`piece`), then :meth:`finish`: ``(flat, rows)`` as :class:`~.epochfeed.EpochFeed`
    takes them, or ``None`` where anything is amiss. ``parts``: each column's ``(index, first,
    stop)`` samples of the share, in its order; ``drops``: each column's plan's drops, as raw
    positions (drops counted) from its first raw sample in the share (:func:`~.epochfeed._taken`)."""

    def __init__(self, ctx: ReadContext, maps: ShareMaps, indices: Sequence[int],
                 parts: Sequence[Sequence[Tuple[int, int, int]]], drops: Sequence[np.ndarray], stats: WorkerStats,
                 max_pieces: int, budget: int) -> None:
        self.ctx, self.stats, self.maps = ctx, stats, maps
        self.shards = shards = maps.shard_set(ctx, indices)
        self.failed, self.done, self.nbytes = False, 0, 0
        self.flat: List[list] = []
        column, first, count = [], [], []
        for c, own in enumerate(parts):
            for index, a, b in own:
                column.append(c)
                first.append(int(shards.sample_base[shards.where[index]]) + a)
                count.append(b - a)
        first_, count_ = np.array(first, np.int64), np.array(count, np.int64)
        order = np.argsort(first_, kind="stable")
        if len(order) > 1 and (first_[order][1:] < (first_ + count_)[order][:-1]).any():
            self.failed = True  # (a sample read twice: the columns')
            return
        self.samples = concat_ranges(first_[order], count_[order])  # the share's samples, in the files' order
        size = int(shards.sample_bytes[self.samples].sum())
        if size > budget:
            self.failed = True  # (over the bytes a share may hold: the columns')
            return
        place = np.empty_like(order)
        place[order] = np.cumsum(count_[order]) - count_[order]
        taken = concat_ranges(place, count_)  # each column's rows among them, column after column
        per_column = np.bincount(np.array(column, np.int64), weights=count_, minlength=len(parts)).astype(np.int64)
        self.rows = [less_drops(own, drop) for own, drop in zip(np.split(taken, np.cumsum(per_column)[:-1]), drops)]
        used = sorted(set(shards.owner[self.samples].tolist()))
        member_first = shards.member_base[self.samples]
        self.members = shards.member_base[self.samples + 1] - member_first
        self.member_cut = np.concatenate([[0], np.cumsum(self.members)]).astype(np.int64)
        self.member_index = concat_ranges(member_first, self.members)
        paths = [local_path(shards.urls[k]) for k in used]
        try:
            with stats.io_clock.timed():
                self.region = maps.region_of(paths, size)
        except OSError:
            self.fail()
            return
        # each member's data in the region; every shard long enough for what is read of it (a file
        # cut short would fault), and where its last sample is read, its end-of-archive block
        place_of = np.zeros(len(shards.shards), np.int64)
        where = [self.region.place[path] for path in paths]
        place_of[used] = [at for at, _, _ in where]
        owner = shards.owner[self.samples]
        self.member_at = shards.member_at[self.member_index] + np.repeat(place_of[owner], self.members)
        size_of = np.zeros(len(shards.shards), np.int64)
        size_of[used] = [size for _, size, _ in where]
        last = np.zeros(len(shards.shards), bool)
        last[owner[self.samples + 1 == shards.sample_base[owner + 1]]] = True
        need = np.zeros(len(shards.shards), np.int64)  # the end of what is read of each shard
        group = np.flatnonzero(np.diff(owner, prepend=-1))  # (the samples are in the files' order)
        need[owner[group]] = np.maximum.reduceat(shards.sample_end[self.samples], group)
        need += BLOCK * last
        if (need[used] > size_of[used]).any():
            self.fail()
            return
        for k in np.flatnonzero(last).tolist():
            end = int(place_of[k] + shards.ends[k])
            if self.region.array[end:end + BLOCK].any():
                self.fail()
                return
        index = self.member_index
        self.nbytes = int(shards.member_size[index][shards.wanted[index]].sum())
        pieces = max(1, min(max_pieces, -(-int(shards.member_size[index].sum()) // PIECE_BYTES)))
        self.cuts = np.linspace(0, len(self.samples), pieces + 1).astype(np.int64).tolist()

    def fail(self) -> None:
        """Nothing of the share is given; the worker's later epochs go to the columns at once (what
        stopped this read stays: it is not read twice each epoch: ``ShareMaps.whole``)."""
        self.failed = True
        self.maps.region = self.maps.shards = None  # (never read again: nothing kept mapped for it)
        self.maps.given, self.maps.whole = 0, False

    @property
    def pieces(self) -> int:
        return 0 if self.failed else len(self.cuts) - 1

    def piece(self) -> None:
        """Check and decode the next piece of the share's samples."""
        if self.failed or self.done >= self.pieces:
            return
        a, b = self.cuts[self.done], self.cuts[self.done + 1]
        self.done += 1
        members = self.members[a:b]
        m0, m1 = int(self.member_cut[a]), int(self.member_cut[b])
        member_at, index = self.member_at[m0:m1], self.member_index[m0:m1]
        if not headers_ok(self.region.buffer, member_at, self.shards.checks[index]):
            self.fail()
            return
        rows = _Rows(self.region, self.shards, self.samples[a:b], np.concatenate([[0], np.cumsum(members)]),
                     member_at, self.shards.member_size[index])
        flat, bad = self.ctx.rows.decode(rows, self.ctx.source_name)  # type: ignore[arg-type]
        if bad:  # (a sample the per-sample path must settle)
            self.fail()
        elif not self.flat:
            self.flat = [list(values) for values in flat]
        else:
            for values, more in zip(self.flat, flat):
                values += more

    def finish(self) -> Optional[Tuple[List[list], List[np.ndarray]]]:
        """What the share gives (its pieces not read yet read now), or ``None``."""
        while not self.failed and self.done < self.pieces:
            self.piece()
        if self.failed:
            return None
        self.stats.add(bytes=self.nbytes)
        return self.flat, self.rows
