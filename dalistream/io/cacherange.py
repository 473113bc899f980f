"""One object's range read through the byte cache (:mod:`.cache`), block by block: the stream
:meth:`~.cache.ByteCache.open` returns, what a block read gives (:class:`Piece`), and the reads
of a block's file that check every byte they give (:class:`CheckedReader`)."""

from __future__ import annotations

import io
import os
import zlib
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

from .cachefiles import CHUNK_BYTES, Block
from .cacheflight import Flight

#: ``(url, version, start, end, progress)`` -> bytes ``[start, end)``; ``progress`` (None, or a
#: function) may be given the bytes in order as they arrive
Fetch = Callable[[str, Optional[str], int, int, "Progress"], bytes]
Progress = Optional[Callable[[bytes], None]]
Count = Callable[[Dict[str, int]], None]  # receives the counters of one stream's reads
FAR_BYTES = 256 << 10  # a stream's first bytes this far from arriving in a block in flight are fetched directly,
DIRECT_BYTES = 1 << 20  # up to this many of them


class Piece(NamedTuple):
    """Bytes ``[base, base + length)`` of an object: a kept block's file (``block``, locked shared)
    or bytes in memory (``data``), or a block being fetched (``flight``: its bytes as they come,
    ``length`` the block's at most); ``short``: the object ends at ``base + length``; ``hit``:
    the block was there before this read."""

    base: int
    length: int
    short: bool
    block: Optional[Block]
    data: bytes
    hit: bool
    flight: Optional[Flight] = None


def intact(segments: Sequence[Tuple[int, Any]], first: int, stop: int, table: Sequence[int]) -> bool:
    """Whether the chunks of a block from index ``first`` to the one that ends at ``stop`` (a
    chunk's end, or the block's) match their CRC-32s in ``table``, their bytes given as
    ``(offset in the block, bytes)`` segments, in order, that cover them."""
    for k in range(first, -(-stop // CHUNK_BYTES)):
        lo, hi, crc = k * CHUNK_BYTES, min((k + 1) * CHUNK_BYTES, stop), 0
        for at, seg in segments:
            a, b = max(lo, at), min(hi, at + len(seg))
            if a < b:
                crc = zlib.crc32(seg[a - at:b - at], crc)
        if crc != table[k]:
            return False
    return True


class CheckedReader:
    """Reads of block files whose every byte is checked against its chunk's CRC-32 before it is
    given: a read is widened to whole chunks (the bytes before and after it in their chunks are
    read into a buffer of its own), the bytes checked are those in the caller's buffer, and the
    checked bytes after a read are kept for the next read from there (a stream reading on, as a
    parser does, checks each byte once)."""

    def __init__(self) -> None:
        self._buffer: Optional[memoryview] = None
        self._block: Optional[Block] = None  # the block the kept bytes are of
        self._kept_at = 0
        self._kept = memoryview(b"")

    def read(self, block: Block, at: int, view: memoryview) -> Optional[int]:
        """Bytes ``[at, at + len(view))`` of ``block`` (fewer at its end) into ``view``: how many;
        None when they do not match their checksums (or the file is shorter than its header says)."""
        n = max(0, min(len(view), block.length - at))
        done = 0
        if self._block is block and self._kept_at == at and len(self._kept):
            done = min(n, len(self._kept))
            view[:done] = self._kept[:done]
            self._kept, self._kept_at = self._kept[done:], at + done
        if done == n:
            return n
        pos, stop, c = at + done, at + n, CHUNK_BYTES
        first = pos // c
        end = min(-(-stop // c) * c, block.length)
        if self._buffer is None:
            self._buffer = memoryview(bytearray(2 * c))
        before, after = self._buffer[:pos - first * c], self._buffer[c:c + end - stop]
        parts = [p for p in (before, view[done:n], after) if len(p)]
        if os.preadv(block.fd, parts, block.at + first * c) != end - first * c:
            return None
        if not intact(((first * c, before), (pos, view[done:n]), (stop, after)), first, end, block.crcs):
            self._block = None
            return None
        self._block, self._kept_at, self._kept = block, stop, after
        return n


class CachedRange(io.RawIOBase):
    """Bytes ``[start, end)`` of one object through a :class:`~.cache.ByteCache`, block by block,
    from the functions it gives: ``piece(pos, fresh)`` (the :class:`Piece` that holds ``pos``;
    ``fresh``: not from a kept file, fetched or read and checked whole under the block's lock),
    ``direct(start, stop)`` (bytes straight from the store, not kept), ``add(**counters)`` and
    ``spoiled(piece)`` (a kept block found damaged: removed, counted). A kept block is read from
    its file into the caller's buffer (the file locked shared while the stream is on it), each
    byte checked (:class:`CheckedReader`: a block that fails is fetched again and read from
    there); a block being fetched in this process is read as its bytes arrive
    (:mod:`.cacheflight`), and a stream's first :data:`DIRECT_BYTES`, where they are far from
    arriving (the block is fetched from an earlier offset for another stream), are taken straight
    from the store (the first batch waits for a round trip per column, not for a block); bytes
    not kept are held in memory. Ends early at the object's end."""

    def __init__(self, start: int, end: Optional[int], piece: Callable[[int, bool], Piece],
                 direct: Callable[[int, int], bytes], add: Callable[..., None],
                 spoiled: Callable[[Piece], None]) -> None:
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad range [{start}, {end})")
        self._get, self._direct_fetch, self._add, self._spoiled = piece, direct, add, spoiled
        self.pos, self.end = int(start), end
        self._piece: Optional[Piece] = None
        self._direct = DIRECT_BYTES  # what its first reads may still take straight from the store
        self._checked = CheckedReader()

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
        fresh = False
        while True:
            p = self._piece
            if p is None or not p.base <= self.pos < p.base + p.length:
                if p is not None and p.short and self.pos >= p.base + p.length:
                    return 0  # the object ends here
                self._drop()
                p = self._piece = self._get(self.pos, fresh)
                if self.pos >= p.base + p.length:
                    return 0
            n = min(left, p.base + p.length - self.pos)
            if p.block is None:
                break
            got = self._checked.read(p.block, self.pos - p.base, view[:n])
            if got is not None:
                if p.hit:
                    self._add(cache_bytes=got)
                self.pos += got
                return got
            self._spoiled(p)
            self._drop()
            fresh = True  # (the block fetched again, or found whole in a file another process wrote since)
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
        self.pos += n
        return n

    def _drop(self) -> None:
        p, self._piece = self._piece, None
        if p is not None and p.block is not None:
            os.close(p.block.fd)
        if p is not None and p.flight is not None:
            p.flight.wait()  # a stream left behind is kept (or failed) when the stream moves on or closes

    def close(self) -> None:
        self._drop()
        super().close()
