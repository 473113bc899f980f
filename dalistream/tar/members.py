"""Tar members from a byte stream: sequential, index-free, constant memory in shard size.

Handles ustar (with prefixes), GNU long names and pax headers. Members whose data are not
wanted are passed over by header, with a seek when the stream can seek, so skipping never
reads image bytes. Every failure is a dalistream error naming the shard (and member).
"""

from __future__ import annotations

import io
import os
import time
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Dict, Iterator, Optional

from ..errors import DalistreamError, SampleError, ShardFormatError, SourceError
from ..io.counters import ReadClock

BLOCK = 512
REGULAR = (b"0", b"\0", b"7")


@dataclass
class Member:
    """One tar member: its name, size, header offset in the tar and (if read) its data.

    ``error`` is set (and ``data`` is ``None``) for a member refused with ``mark_errors``: a
    :class:`SampleError` when it is larger than ``max_member_bytes`` (its data were skipped, never
    read), a :class:`ShardFormatError` when its data are cut (the last member of the stream)."""

    name: str
    size: int
    offset: int
    data: Optional[bytes]
    error: Optional[DalistreamError] = None


def _octal(field: bytes, url: str, what: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        value = 0
        for byte in field[1:]:
            value = (value << 8) | byte
        return value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ShardFormatError(f"not a tar stream: bad {what} field {text[:20]!r} in header", url=url,
                               hint="is this file really a tar shard?", reason="not_tar") from None


def _checksum_ok(header: bytes) -> bool:
    stored = header[148:156].split(b"\0", 1)[0].strip()
    try:
        expected = int(stored, 8)
    except ValueError:
        return False
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    return expected == unsigned


def _parse_pax(data: bytes, url: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    pos = 0
    try:
        while pos < len(data) and data[pos:pos + 1] not in (b"", b"\0"):
            space = data.index(b" ", pos)
            length = int(data[pos:space])
            if length <= 0:
                raise ValueError(length)
            key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
            pos += length
    except ValueError:
        raise ShardFormatError("corrupt tar: malformed pax extended header", url=url, reason="bad_tar",
                               hint="re-write the shard") from None
    return out


_GZIP_ERRORS = (EOFError, zlib.error)


def read_error(error: BaseException, url: str) -> DalistreamError:
    """A read error of the byte stream as a dalistream error: bad gzip data is the shard's fault,
    any other I/O error the source's."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, _GZIP_ERRORS) or type(error).__name__ == "BadGzipFile":
        return ShardFormatError(f"corrupt or truncated gzip data ({text})", url=url, reason="bad_gzip",
                                hint="re-compress or re-upload the shard")
    return SourceError(f"read error ({text})", url=url, reason="read_error")


class _Reader:
    """Exact reads and skips over a stream, tracking the byte position."""

    def __init__(self, stream: BinaryIO, url: str, clock: Optional[ReadClock] = None) -> None:
        self.stream = stream
        self.url = url
        self.clock = clock
        self.pos = 0
        self.size: Optional[int] = None  # known for plain files: a seek past the end is a cut shard
        try:
            self.seekable = stream.seekable()
            if self.seekable:
                self.pos = stream.tell()
                if isinstance(stream, io.BufferedReader) and isinstance(stream.raw, io.FileIO):
                    self.size = os.fstat(stream.fileno()).st_size
        except (AttributeError, OSError, ValueError):
            self.seekable = False

    def read(self, n: int) -> bytes:
        t0 = time.perf_counter() if self.clock is not None else 0.0
        try:
            data = self.stream.read(n)
            if len(data) < n:
                chunks = [data]
                got = len(data)
                while got < n:
                    more = self.stream.read(n - got)
                    if not more:
                        break
                    chunks.append(more)
                    got += len(more)
                data = b"".join(chunks)
        except DalistreamError:
            raise
        except (OSError, EOFError, zlib.error) as e:
            raise read_error(e, self.url) from None
        if self.clock is not None:
            self.clock.seconds += time.perf_counter() - t0
        self.pos += len(data)
        return data

    def skip(self, n: int) -> int:
        if n <= 0:
            return 0
        if self.seekable:
            if self.size is not None and self.pos + n > self.size:
                n = max(0, self.size - self.pos)
            self.stream.seek(n, 1)
            self.pos += n
            return n  # (for other streams, a short file shows up as a short read of the next header)
        left = n
        t0 = time.perf_counter() if self.clock is not None else 0.0
        try:
            while left:
                chunk = self.stream.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
        except DalistreamError:
            raise
        except (OSError, EOFError, zlib.error) as e:
            raise read_error(e, self.url) from None
        if self.clock is not None:
            self.clock.seconds += time.perf_counter() - t0
        self.pos += n - left
        return n - left


def iter_members(
    stream: BinaryIO, url: str, *, want: Callable[[str], bool] = lambda name: True,
    max_member_bytes: int = 256 << 20, mark_errors: bool = False, clock: Optional[ReadClock] = None,
) -> Iterator[Member]:
    """Yield the regular-file members of a tar stream; ``data`` is read only if ``want(name)``.

    Handles ustar prefixes, GNU long names and pax ``path``/``size`` records. Raises
    :class:`ShardFormatError` for a stream that is empty, not a tar, cut mid-header or
    mid-member, or ends without the end-of-archive marker. A wanted member larger than
    ``max_member_bytes`` is refused before anything is allocated: a :class:`SampleError`, or
    with ``mark_errors`` a :class:`Member` carrying the error whose data were skipped unread.
    With ``mark_errors`` a wanted member whose data are cut is also yielded, carrying its
    :class:`ShardFormatError`, as the last member (so the caller knows the member before it ended).
    ``clock``, if given, accumulates the time spent waiting for the stream's bytes.
    """
    reader = _Reader(stream, url, clock)
    long_name: Optional[str] = None
    pax: Dict[str, str] = {}
    first = True
    while True:
        offset = reader.pos
        header = reader.read(BLOCK)
        if not header:
            if first:
                raise ShardFormatError("empty shard (0 bytes)", url=url, reason="empty",
                                       hint="re-write or re-upload the shard, or remove it from the sources")
            raise ShardFormatError("tar ends without its end-of-archive marker: truncated shard", url=url,
                                   member=None, hint="re-write or re-upload the shard", reason="truncated")
        if len(header) < BLOCK:
            if first:  # a tar cut inside its first header, or a short file that is no tar at all
                looks_tar = b"\0" in header  # tar headers are NUL-padded; error pages and text are not
                raise ShardFormatError(
                    f"{'truncated tar' if looks_tar else 'not a tar shard'}: header cut after {len(header)} bytes "
                    f"at offset 0 (the whole shard is {len(header)} bytes, starting {header[:16]!r})", url=url,
                    reason="truncated" if looks_tar else "not_tar",
                    hint="re-write or re-upload the shard" if looks_tar else "is this file really a tar shard?")
            raise ShardFormatError(f"truncated tar: header cut after {len(header)} bytes at offset {offset}", url=url,
                                   reason="truncated", hint="re-write or re-upload the shard")
        if header == b"\0" * BLOCK:
            return
        if not _checksum_ok(header):
            if first:
                raise ShardFormatError(f"not a tar stream: no valid tar header at offset 0 (starts {header[:16]!r})",
                                       url=url, reason="not_tar", hint="is this file really a tar shard?")
            raise ShardFormatError(f"corrupt tar: header checksum mismatch at offset {offset}", url=url,
                                   reason="bad_tar", hint="the shard is damaged: re-write or re-upload it")
        first = False
        kind = header[156:157]
        size = _octal(header[124:136], url, "size")
        name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        if header[257:262] == b"ustar":
            prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
            if prefix:
                name = prefix + "/" + name
        padded = -(-size // BLOCK) * BLOCK
        if kind in (b"L", b"x", b"g"):
            if size > (1 << 20):
                raise ShardFormatError(f"corrupt tar: extended header of {size} bytes is implausible", url=url,
                                       reason="bad_tar")
            data = reader.read(padded)
            if len(data) < padded:
                raise ShardFormatError("truncated tar: extended header cut", url=url, reason="truncated")
            if kind == b"L":
                long_name = data[:size].split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == b"x":
                pax = _parse_pax(data[:size], url)
            continue
        if long_name is not None:
            name, long_name = long_name, None
        if pax:
            name = pax.get("path", name)
            try:
                size = int(pax.get("size", size))
            except ValueError:
                raise ShardFormatError("corrupt tar: bad size in pax header", url=url, member=name,
                                       reason="bad_tar") from None
            padded = -(-size // BLOCK) * BLOCK
            pax = {}
        if kind not in REGULAR:
            got = reader.skip(padded)
            if got < padded:
                raise _cut_error(name, size, got, url)
            continue
        if want(name):
            if size > max_member_bytes:
                error = SampleError(
                    f"member of {size} bytes exceeds the limit of {max_member_bytes} bytes (max_member_bytes); "
                    "it was not read", url=url, member=name, reason="too_large",
                    hint="raise max_member_bytes if such members are expected",
                )
                if not mark_errors:
                    raise error
                got = reader.skip(padded)
                if got < padded:
                    yield from _cut(name, size, offset, got, url, mark_errors)
                    return
                yield Member(name, size, offset, None, error)
                continue
            data = reader.read(size)
            if len(data) < size:
                yield from _cut(name, size, offset, len(data), url, mark_errors)
                return
            if reader.skip(padded - size) < padded - size:
                yield from _cut(name, size, offset, size, url, mark_errors)
                return
            yield Member(name, size, offset, data)
        else:
            got = reader.skip(padded)
            if got < padded:
                yield from _cut(name, size, offset, got, url, mark_errors)
                return
            yield Member(name, size, offset, None)


def _cut_error(name: str, size: int, got: int, url: str) -> ShardFormatError:
    """The error of a member whose data (``size`` bytes) end after ``got`` bytes of data and padding."""
    text = f"member data cut after {got} of {size} bytes" if got < size else "cut in the padding after the member's data"
    return ShardFormatError(f"truncated tar: {text}", url=url, member=name, reason="truncated",
                            hint="re-write or re-upload the shard")


def _cut(name: str, size: int, offset: int, got: int, url: str, mark_errors: bool) -> Iterator[Member]:
    """A member whose data end early: raise, or (``mark_errors``) yield it carrying the error, so
    that the caller knows the member before it ended (its header was whole)."""
    error = _cut_error(name, size, got, url)
    if not mark_errors:
        raise error
    yield Member(name, size, offset, None, error)
