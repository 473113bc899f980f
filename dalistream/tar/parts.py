"""A part of a shard as a tar of its own: the bytes ``[start, end)`` of a shard, closed by an
end-of-archive marker, so the member parser ends cleanly where the part ends (a span of samples
cut out of a shard by the plan). The marker is added only when all ``end - start`` bytes came:
a shard shorter than its offsets say still ends as a truncated tar, never as a clean end."""

from __future__ import annotations

import io
from typing import Any, BinaryIO

from ..io.local import END_OF_ARCHIVE, FileRange, copy_tail



class PartStream(io.RawIOBase):
    """At most ``length`` bytes of ``stream``, then :data:`END_OF_ARCHIVE` if all of them came."""

    def __init__(self, stream: BinaryIO, length: int) -> None:
        self._stream = stream
        self._left = length
        self._tail = memoryview(END_OF_ARCHIVE)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._left > 0:
            data = self._stream.read(min(len(view), self._left))
            if not data:  # the shard ended before the part did: no marker, the parser reports it
                self._left = -1
                self._tail = self._tail[:0]
                return 0
            view[:len(data)] = data
            self._left -= len(data)
            return len(data)
        n, self._tail = copy_tail(view, self._tail)
        return n

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            super().close()


def open_part(stream: BinaryIO, length: int, chunk: int = 1 << 20) -> BinaryIO:
    """``stream`` (positioned at the part's first header) limited to ``length`` bytes, as a tar,
    read ``chunk`` bytes at a time (a local file's range of that length reads into the parser's
    buffer itself, the marker its own)."""
    if isinstance(stream, FileRange) and stream.remaining == length:
        stream.marker = True
        return stream
    return io.BufferedReader(PartStream(stream, length), chunk)
