"""One object's range read through the byte cache (:mod:`.cache`), block by block: the stream
:meth:`~.cache.ByteCache.open` returns, and what a block read gives (:class:`Piece`)."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, NamedTuple, Optional

from . import cachefiles as files

if TYPE_CHECKING:
    from .cache import ByteCache

Fetch = Callable[[str, Optional[str], int, int], bytes]  # (url, version, start, end) -> bytes [start, end)
Count = Callable[[Dict[str, int]], None]  # receives the counters of one stream's reads


class Piece(NamedTuple):
    """Bytes ``[base, base + length)`` of an object: a kept block's file (``fd``, locked shared)
    or bytes in memory (``data``); ``short``: the object ends at ``base + length``; ``hit``: the
    block was there before this read."""

    base: int
    length: int
    short: bool
    fd: Optional[int]
    data: bytes
    hit: bool



class CachedRange(io.RawIOBase):
    """Bytes ``[start, end)`` of one object through a :class:`~.cache.ByteCache`, block by block: a kept
    block is read straight from its file into the caller's buffer (the file locked shared while
    the stream is on it); bytes not kept are held in memory. Ends early at the object's end."""

    def __init__(self, cache: ByteCache, url: str, version: Optional[str], start: int, end: Optional[int],
                 fetch: Fetch, count: Optional[Count] = None) -> None:
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad range [{start}, {end})")
        self.cache, self.url, self.version, self.fetch, self.count = cache, url, version, fetch, count
        self.pos, self.end = int(start), end
        self._piece: Optional[Piece] = None

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
        local = self.cache._local
        local.count = self.count
        try:
            return self._readinto(buffer)
        finally:
            local.count = None

    def _readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        left = len(view) if self.end is None else min(len(view), self.end - self.pos)
        if left <= 0:
            return 0
        p = self._piece
        if p is None or not p.base <= self.pos < p.base + p.length:
            if p is not None and p.short and self.pos >= p.base + p.length:
                return 0  # the object ends here
            self._drop()
            p = self._piece = self.cache.piece(self.url, self.version, self.pos, self.end, self.fetch)
            if self.pos >= p.base + p.length:
                return 0
        n = min(left, p.base + p.length - self.pos)
        if p.fd is not None:
            n = os.preadv(p.fd, [view[:n]], files.HEADER.size + self.pos - p.base)
            if p.hit:
                self.cache._add(cache_bytes=n)
        else:
            at = self.pos - p.base
            view[:n] = p.data[at:at + n]
        self.pos += n
        return n

    def _drop(self) -> None:
        p, self._piece = self._piece, None
        if p is not None and p.fd is not None:
            os.close(p.fd)

    def close(self) -> None:
        self._drop()
        super().close()
