"""One object's range read through the byte cache (:mod:`.cache`), block by block: the stream
:meth:`~.cache.ByteCache.open` returns, and what a block read gives (:class:`Piece`)."""

from __future__ import annotations

import io
from typing import Any, Callable, Dict, NamedTuple, Optional

from .cachefiles import HEADER
from .cacheflight import Flight
from .openfiles import OpenFile, files_table

#: ``(url, version, start, end, progress)`` -> bytes ``[start, end)``; ``progress`` (None, or a
#: function) may be given the bytes in order as they arrive
Fetch = Callable[[str, Optional[str], int, int, "Progress"], bytes]
Progress = Optional[Callable[[bytes], None]]
Count = Callable[[Dict[str, int]], None]  # receives the counters of one stream's reads
FAR_BYTES = 256 << 10  # a stream's first bytes this far from arriving in a block in flight are fetched directly,
DIRECT_BYTES = 1 << 20  # up to this many of them


class Piece(NamedTuple):
    """Bytes ``[base, base + length)`` of an object: a kept block's file (``block``, in the
    process's table of open files: :class:`~.openfiles.FileTable`, its descriptor locked shared while the
    table keeps it open) or bytes in memory (``data``: fetched, or a kept block read and checked whole), or a block
    being fetched (``flight``: its bytes as they come, ``length`` the block's at most); ``short``:
    the object ends at ``base + length``; ``hit``: the block was there before this read."""

    base: int
    length: int
    short: bool
    block: Optional[OpenFile]
    data: bytes
    hit: bool
    flight: Optional[Flight] = None


class CachedRange(io.RawIOBase):
    """Bytes ``[start, end)`` of one object through a :class:`~.cache.ByteCache`, block by block,
    from the functions it gives: ``piece(pos)`` (the :class:`Piece` that holds ``pos``),
    ``direct(start, stop)`` (bytes straight from the store, not kept) and ``add(**counters)``. A
    kept block is read straight from its file into the caller's buffer (one descriptor per block
    file in the process, shared by the streams on it and locked shared, within the budget of the
    process's table of open files: a block evicted while the table had closed its descriptor is
    taken again, fetched and counted as a miss); a block being fetched in this process is read as its bytes arrive
    (:mod:`.cacheflight`), and a stream's first :data:`DIRECT_BYTES`, where they are far from
    arriving (the block is fetched from an earlier offset for another stream), are taken straight
    from the store (the first batch waits for a round trip per column, not for a block); bytes
    in memory (not kept, or a block checked whole) are copied from there. Ends early at the
    object's end."""

    def __init__(self, start: int, end: Optional[int], piece: Callable[[int], Piece],
                 direct: Callable[[int, int], bytes], add: Callable[..., None]) -> None:
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad range [{start}, {end})")
        self._get, self._direct_fetch, self._add = piece, direct, add
        self.pos, self.end = int(start), end
        self._piece: Optional[Piece] = None
        self._direct = DIRECT_BYTES  # what its first reads may still take straight from the store

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise io.UnsupportedOperation("a cached range seeks to absolute positions only")
        self.pos = max(0, int(offset))
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        left = len(view) if self.end is None else min(len(view), self.end - self.pos)
        if left <= 0:
            return 0
        p = self._piece
        while True:
            if p is None or not p.base <= self.pos < p.base + p.length:
                if p is not None and p.short and self.pos >= p.base + p.length:
                    return 0  # the object ends here
                self._drop()
                p = self._piece = self._get(self.pos)
                if self.pos >= p.base + p.length:
                    return 0
            if p.block is None or p.flight is not None:
                break
            n = p.block.read_if_same(view[:min(left, p.base + p.length - self.pos)], HEADER.size + self.pos - p.base)
            if n is not None:
                if p.hit:
                    self._add(cache_bytes=n)
                self.pos += n
                return n
            self._drop()  # evicted while the table had its descriptor closed: taken again (fetched, counted)
            p = None
        n = min(left, p.base + p.length - self.pos)
        if p.flight is not None:
            if self._direct and p.flight.behind(self.pos - p.base) > FAR_BYTES:
                data = self._direct_fetch(self.pos, self.pos + min(n, self._direct))
                n = len(data)  # (0: the object ends before pos)
                view[:n] = data
                self._direct -= n
            else:
                n = p.flight.read_into(view[:n], self.pos - p.base)  # (0: the object ends in the block, before pos)
                if p.flight.hit:
                    self._add(cache_bytes=n)
        else:
            at = self.pos - p.base
            view[:n] = p.data[at:at + n]
        if p.hit and p.flight is None:
            self._add(cache_bytes=n)
        self.pos += n
        return n

    def _drop(self) -> None:
        p, self._piece = self._piece, None
        if p is not None and p.block is not None:
            files_table().release(p.block)
        if p is not None and p.flight is not None:
            p.flight.wait()  # a stream left behind is kept (or failed) when the stream moves on or closes

    def close(self) -> None:
        self._drop()
        super().close()
