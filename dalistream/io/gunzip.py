"""Gzip-compressed shards (``.tar.gz``, ``.tgz``, or any stream starting with the gzip magic),
decompressed on the fly, concatenated members included."""

from __future__ import annotations

import io
import zlib
from typing import BinaryIO

from ..errors import SourceError
from .local import CHUNK, GZIP_MAGIC, starts_gzip


def is_gzip(stream: BinaryIO) -> bool:
    """True if the stream starts with the gzip magic (peeked, not consumed)."""
    return stream.peek(2)[:2] == GZIP_MAGIC


def file_is_gzip(stream: BinaryIO) -> bool:
    """:func:`is_gzip` for a stream just opened at its start, by a 2-byte positional read of its
    file when it has one: a peek would fill the whole read buffer, which a worker reading a small
    part far into the file never needs."""
    try:
        return starts_gzip(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return is_gzip(stream)


def decompressed(stream: BinaryIO, url: str, offset: int = 0) -> BinaryIO:
    """``stream`` (raw shard bytes from the start) decompressed if gzip, then advanced to
    ``offset`` of the tar."""
    try:
        if is_gzip(stream):
            stream = _Gunzipped(stream)
        if offset:
            _discard(stream, offset)
    except OSError as e:
        stream.close()
        raise SourceError(f"cannot read shard: {e}", url=url) from None
    except BaseException:
        stream.close()
        raise
    return stream


class _Gunzipped(io.BufferedReader):
    """Decompressed view of a gzip stream; closing it closes the compressed stream too.

    Every byte that decompresses is delivered before a cut or corrupt stream raises
    (``EOFError``/``zlib.error``, which the tar reader reports as a damaged shard): Python's
    ``GzipFile`` drops what it decompressed in a read that then meets the end of a truncated file
    (up to its buffer size), so a ``.tar.gz`` cut at 800 kB would deliver no sample at all."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        super().__init__(_GunzipRaw(source), CHUNK)  # type: ignore[arg-type]

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._source.close()


class _GunzipRaw(io.RawIOBase):
    """Streaming gzip decoder (concatenated members too) as a raw stream."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._input = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        while not self._done:
            if self._zlib.eof:  # end of one gzip member: another may follow (padding zeros are ignored)
                rest = self._zlib.unused_data.lstrip(b"\0")  # (at the end, the unconsumed tail is the same)
                if not rest:
                    rest = self._source.read(CHUNK).lstrip(b"\0")
                    if not rest:
                        self._done = True
                        break
                self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._input = rest
            if not self._input:
                self._input = self._source.read(CHUNK)
                if not self._input:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            out = self._zlib.decompress(self._input, len(view))
            self._input = self._zlib.unconsumed_tail
            if out:
                view[:len(out)] = out
                return len(out)
        return 0


def _discard(stream: BinaryIO, n: int) -> None:
    while n > 0:
        got = stream.read(min(n, CHUNK))
        if not got:
            return
        n -= len(got)
