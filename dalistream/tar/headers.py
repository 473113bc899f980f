"""Tar blocks: the fields of a header (name, numbers, checksum, type flags, pax records), the
extended headers before a member (:class:`Extended`), the errors of a damaged shard, and
:class:`StreamBuffer`, the large reads of a tar stream into one reused buffer out of which
headers are parsed in place: what every reader of tar bytes parses them with (the sequential
walk, :mod:`.members`, and the scan's index, :mod:`.index`)."""

from __future__ import annotations

import io
import os
import time
import zlib
from typing import BinaryIO, Dict, Optional, Tuple

from ..errors import DalistreamError, ShardFormatError, SourceError, printable
from ..io.counters import ReadClock
from ..io.local import CHUNK

BLOCK = 512
ZERO = bytes(BLOCK)
REGULAR = frozenset(b"0\x007")  # the type flags of regular files
SPECIAL = frozenset(b"12346")  # hard link, symlink, char/block device, fifo (in no sample; directories are ignored)
EXTENDED = frozenset(b"LKxg")  # GNU long name / long link name, pax extended / global header
SPARSE = 83  # "S": GNU sparse file (old GNU format)
MAX_EXTENDED = 1 << 20  # an extended header's record of more bytes is damage


def header_name(buf, at: int = 0) -> str:
    """The name in the tar header at ``buf[at:]``, with its ustar prefix (``str``; bytes that are no
    UTF-8 kept by ``surrogateescape``). Long-name and pax records are the caller's. ``buf``: bytes,
    a bytearray, or any buffer (a file's mapping: its header block copied first)."""
    if not hasattr(buf, "find"):
        buf, at = bytes(memoryview(buf)[at:at + BLOCK]), 0
    end = buf.find(b"\0", at, at + 100)
    name = buf[at:end if end >= 0 else at + 100].decode("utf-8", "surrogateescape")
    if buf[at + 345] and buf[at + 257:at + 263] == b"ustar\0":  # POSIX prefix (old GNU headers keep times there)
        name = bytes(buf[at + 345:at + 500]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
    return name


def losing(error: DalistreamError, member: Optional[str]) -> DalistreamError:
    """``error`` marked with the member the damage took (``damaged_member``): the one whose header
    or data could not be read. The tar reader delivers the sample grouped before the damage only
    when that member is known and is not one of its own (:func:`dalistream.tar.samples.iter_samples`)."""
    error.damaged_member = member  # type: ignore[attr-defined]
    return error


def no_end_marker(url: str) -> ShardFormatError:
    """A tar whose bytes end where its end-of-archive marker should be: truncated."""
    return ShardFormatError("tar ends without its end-of-archive marker: truncated shard", url=url,
                            hint="re-write or re-upload the shard", reason="truncated")


def damaged(message: str, url: str, member: Optional[str] = None) -> ShardFormatError:
    """A :class:`ShardFormatError` of reason ``bad_tar``: the shard is damaged."""
    return ShardFormatError(f"corrupt tar: {message}", url=url, member=member, reason="bad_tar",
                            hint="the shard is damaged: re-write or re-upload it")


def header_size(header, url: str, offset: int) -> int:
    """The size field of the 512-byte ``header`` (at tar ``offset``): octal text, or GNU base-256
    (first byte 0x80; 0xff is negative)."""
    field = bytes(header[124:136])
    if field[0] & 0x80:
        if field[0] != 0x80:
            raise damaged(f"negative or malformed size field (base-256) in the header at offset {offset}", url)
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    if not text.isdigit() or b"8" in text or b"9" in text:
        raise damaged(f"bad size field {text[:20]!r} in the header at offset {offset}", url)
    return int(text, 8)


def checksum_ok(header: bytes) -> bool:
    """True if the 512-byte ``header`` carries its own (unsigned) checksum."""
    text = header[148:156].split(b"\0", 1)[0].strip()
    if not text.isdigit():
        return False
    try:
        stored = int(text, 8)
    except ValueError:  # an 8 or a 9
        return False
    # the byte sum with the checksum field as spaces; adler32's low half is 1 + the byte sum
    # modulo 65521, exact for runs under 257 bytes, and costs a fraction of sum() over 512 bytes
    adler = zlib.adler32
    total = ((adler(header[:148]) & 0xFFFF) + (adler(header[156:400]) & 0xFFFF) + (adler(header[400:]) & 0xFFFF)
             - 3 + 8 * 32)
    return stored == total


def parse_pax(data: bytes, url: str, offset: int) -> Dict[str, bytes]:
    """The records of a pax extended header (values as raw bytes)."""
    out: Dict[str, bytes] = {}
    pos = 0
    try:
        while pos < len(data) and data[pos] != 0:
            space = data.index(b" ", pos)
            length = int(data[pos:space])
            if length <= 0 or space >= pos + length:
                raise ValueError(length)
            key, eq, value = data[space + 1:pos + length - 1].partition(b"=")
            if not eq:
                raise ValueError(key)
            out[key.decode("utf-8", "surrogateescape")] = value
            pos += length
    except ValueError:
        raise damaged(f"malformed pax extended header at offset {offset}", url) from None
    return out


class Extended:
    """The extended headers before a member's own header (GNU long name, pax records), as every
    header walk reads them: :meth:`check` and :meth:`add` each, then :meth:`apply` them to the
    member's header.
    ``start``: the offset of the first (where the member starts), ``None`` while there are none."""

    __slots__ = ("start", "name", "pax")

    def __init__(self) -> None:
        self.start: Optional[int] = None
        self.name: Optional[str] = None
        self.pax: Optional[Dict[str, bytes]] = None

    def check(self, size: int, url: str, offset: int) -> None:
        """An extended header of ``size`` bytes at ``offset``, its record not read yet."""
        if size > MAX_EXTENDED:
            raise damaged(f"extended header of {size} bytes at offset {offset} is implausible", url)
        if self.start is None:
            self.start = offset

    def add(self, kind: int, record: bytes, url: str, offset: int) -> None:
        """The record of the extended header of type ``kind`` at ``offset`` (checked first)."""
        if kind == 76:  # "L"
            self.name = record.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind == 120:  # "x"
            self.pax = parse_pax(record, url, offset)

    def apply(self, name: Optional[str], size: int, url: str) -> Tuple[int, Optional[str], int, bool]:
        """The member whose own header (naming ``name``, of ``size`` bytes) follows: its start,
        name, size, and whether pax records make it a GNU sparse file; then none pending."""
        start, pax = self.start, self.pax
        if self.name is not None:
            name = self.name
        self.start = self.name = self.pax = None
        sparse = False
        if pax is not None:
            if "path" in pax:
                name = pax["path"].decode("utf-8", "surrogateescape")
            if "size" in pax:
                text = pax["size"]
                if not text.isdigit():
                    raise losing(damaged(f"bad size {text[:20]!r} in pax header at offset {start}", url, name), name)
                size = int(text)
            if any(k.startswith("GNU.sparse.") for k in pax):
                sparse = True
                if "GNU.sparse.name" in pax:
                    name = pax["GNU.sparse.name"].decode("utf-8", "surrogateescape")
        return start, name, size, sparse  # type: ignore[return-value]


def read_error(error: BaseException, url: str) -> DalistreamError:
    """A read error of the byte stream as a dalistream error: bad gzip data is the shard's fault,
    any other I/O error the source's."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, (EOFError, zlib.error)) or type(error).__name__ == "BadGzipFile":
        return ShardFormatError(f"corrupt or truncated gzip data ({text})", url=url, reason="bad_gzip",
                                hint="re-compress or re-upload the shard")
    return SourceError(f"read error ({text})", url=url, reason="read_error")


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
                member = header_name(header) if len(header) == BLOCK and checksum_ok(header) else None
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
