"""Large reads of a tar stream into one reused buffer, out of which headers are parsed in place."""

from __future__ import annotations

import io
import os
import time
import zlib
from typing import BinaryIO, Optional

from ..errors import DalistreamError, printable
from ..io.counters import ReadClock
from .headers import BLOCK, checksum_ok, damaged, losing, read_error

CHUNK = 1 << 20  # bytes asked of the stream per read


class StreamBuffer:
    """Large reads of a stream into one reused buffer: ``arr[pos:end]`` is read and not yet
    parsed, ``base`` is the stream offset of ``arr[0]`` (the stream itself is at ``base + end``)."""

    def __init__(self, stream: BinaryIO, url: str, clock: Optional[ReadClock] = None, chunk: int = CHUNK) -> None:
        self.stream = stream
        self.url = url
        self.clock = clock
        # a worker reading many columns at once holds one buffer each: ``chunk`` sizes them
        self.chunk = max(int(chunk), 16 * BLOCK)
        self.arr = bytearray(self.chunk)
        self.view = memoryview(self.arr)
        self.pos = self.end = self.base = 0
        self.size: Optional[int] = None  # known for plain files: a seek past the end is a cut shard
        self.error: Optional[DalistreamError] = None  # met after bytes not yet parsed: raised at the next read
        self.member: Optional[str] = None  # the member whose data are being read: named by a read error
        # at most one read of the stream below each time: what arrived before an error is parsed first
        self.readinto = getattr(stream, "readinto1", None) or getattr(stream, "readinto", None)
        try:
            self.seekable = stream.seekable()
            if self.seekable:
                self.base = stream.tell()
                if isinstance(stream, io.BufferedReader) and isinstance(stream.raw, io.FileIO):
                    self.size = os.fstat(stream.fileno()).st_size
                else:  # the rest of a local shard read by positional reads (io.local.FileRange, buffered or not) knows it
                    self.size = getattr(getattr(stream, "raw", stream), "file_size", None)
        except (AttributeError, OSError, ValueError):
            self.seekable = False

    def _timed(self, read, *args):
        """One read of the stream below: its errors as the shard's, its wait on the clock."""
        if self.error is not None:
            raise self._located(self.error)
        t0 = time.perf_counter() if self.clock is not None else 0.0
        try:
            result = read(*args)
        except DalistreamError as e:
            raise self._located(e)
        except (OSError, EOFError, zlib.error) as e:
            raise self._located(read_error(e, self.url)) from None
        if self.clock is not None:
            self.clock.seconds += time.perf_counter() - t0
        return result

    def _located(self, error: DalistreamError) -> DalistreamError:
        """``error`` naming the member whose data were being read, if it names none."""
        if self.member is not None and error.member is None:
            error.member = self.member
            error.args = (error.render(),)
            losing(error, self.member)
        return error

    def read_into(self, view: memoryview) -> int:
        """One read of the stream into ``view`` (past the buffer: the caller keeps ``base`` right)."""
        if self.readinto is not None:
            return self._timed(self.readinto, view) or 0
        data = self._timed(self.stream.read, len(view))
        view[:len(data)] = data
        return len(data)

    def fill(self, n: int) -> int:
        """Make ``n`` bytes (at most the buffer's size) available at ``pos``, fewer only at the
        end of the stream; how many are."""
        avail = self.end - self.pos
        if avail >= n:
            return avail
        if self.pos:
            self.arr[:avail] = self.arr[self.pos:self.end]
            self.base += self.pos
            self.pos, self.end = 0, avail
        if n > len(self.arr):
            raise ValueError(n)  # (callers ask for at most one chunk)
        while self.end < n:
            try:
                got = self.read_into(self.view[self.end:])
            except DalistreamError as e:
                if self.end == avail:
                    raise
                self.error = e  # parse what came before it first
                break
            if not got:
                break
            self.end += got
        if self.end < n and self.error is not None:
            raise self.error  # the bytes asked for are not all there: the stream's error, not a cut
        return self.end

    def take(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the stream)."""
        if self.end - self.pos < n:
            if n > self.chunk // 2:  # a large member: read straight from the stream
                parts = [bytes(self.view[self.pos:self.end])]
                got = self.end - self.pos
                self.base += self.end
                self.pos = self.end = 0
                while got < n:
                    more = self._timed(self.stream.read, n - got)
                    if not more:
                        break
                    parts.append(more)
                    got += len(more)
                self.base += got - len(parts[0])
                return b"".join(parts)
            self.fill(n)
        data = bytes(self.view[self.pos:min(self.pos + n, self.end)])
        self.pos += len(data)
        return data

    def skip(self, n: int) -> int:
        """Pass over ``n`` bytes; how many there were (fewer only at the end of the stream)."""
        avail = self.end - self.pos
        if n <= avail:
            self.pos += n
            return n
        left = n - avail
        self.base += self.end
        self.pos = self.end = 0
        if self.seekable and self.error is None:
            if self.size is not None and self.base + left > self.size:
                left = max(0, self.size - self.base)
            self.stream.seek(left, 1)
            self.base += left
            return avail + left  # (for other streams, a short file shows up as a short read of the next header)
        got = 0
        while got < left:
            k = self.read_into(self.view[:min(left - got, len(self.view))])
            if not k:
                break
            got += k
        self.base += got
        return avail + got

    def end_or_damage(self, zero_at: int) -> None:
        """At a zero block (already consumed): the end of the archive if nothing but zeros
        follows to the end of the stream, else a lone zero block in the middle: damage."""
        while True:
            rest = self.arr[self.pos:self.end]
            data = rest.lstrip(b"\0")
            if data:
                at = self.base + self.pos + len(rest) - len(data)  # the first non-zero byte
                block = at - (at - zero_at) % BLOCK  # the tar block it lies in: a header, if anything
                lead = max(0, self.base + self.pos - block)  # its bytes before pos (zeros, all of them)
                self.pos = max(self.pos, block - self.base)
                self.fill(BLOCK - lead)
                header = bytes(lead) + bytes(self.view[self.pos:min(self.pos + BLOCK - lead, self.end)])
                member = None
                if len(header) == BLOCK and checksum_ok(header):
                    member = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                after = f"member {printable(member)} at offset {block}" if member else f"data at offset {at}"
                if block - zero_at >= 2 * BLOCK:  # a whole end-of-archive marker came first
                    what = ("a second archive appended after the first one's end (`cat a.tar b.tar`), or blocks "
                            "zeroed mid-shard" if member else "bytes that are no tar after the archive's end, or "
                            "blocks zeroed mid-shard")
                    raise damaged(
                        f"an end-of-archive marker (zero blocks) at offset {zero_at} is followed by {after}: {what}; "
                        "tar and webdataset stop at the marker and would silently drop what follows", self.url, member)
                raise damaged(f"a zero block at offset {zero_at} where a member header should be, followed by "
                               f"{after} (a lone zero block: part of the shard was zeroed or lost)", self.url, member)
            self.base += self.end
            self.pos = self.end = 0
            got = self.read_into(self.view)
            if not got:
                return
            self.end = got
