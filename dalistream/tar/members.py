"""Tar members from a byte stream: sequential, index-free, constant memory in shard size.

Handles ustar (with prefixes), GNU long names and pax headers. The stream is read in large
chunks and headers are parsed out of them in place; members whose data are not wanted are
passed over by header (with a seek when they lie beyond the chunk and the stream can seek), so
skipping never reads image bytes it does not have to. Every failure is a dalistream error naming
the shard (and member).

What is damage: a header whose checksum fails, a size that is not a number, negative, or larger
than the whole shard, a zero block followed by anything but zeros (only zeros up to the end are
the end-of-archive marker; GNU tar calls the other case "A lone zero block"). What is not
supported but valid: GNU sparse members (refused one by one, the shard goes on). Names keep
their bytes: anything that is not UTF-8 is decoded with ``surrogateescape``, so distinct byte
names stay distinct keys (:func:`dalistream.errors.printable` shows them as ``caf\\xe9``).
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Iterator, Optional, Tuple
from zlib import adler32

from ..errors import DalistreamError, SampleError, ShardFormatError
from ..io.counters import ReadClock
from .headers import (BLOCK, CHUNK, EXTENDED, REGULAR, SPARSE, SPECIAL, ZERO, Extended, StreamBuffer, checksum_ok,
                      damaged, header_name, header_size, losing, no_end_marker)

FILE, OTHER = 0, 1  # member kinds yielded: a regular file, a link/device/fifo (grouped, never read)

Entry = Tuple[str, int, int, Optional[bytes], Optional[DalistreamError], int]


def _cut_error(name: str, size: int, got: int, url: str) -> ShardFormatError:
    """The error of a member whose data (``size`` bytes) end after ``got`` bytes of data and padding."""
    text = f"member data cut after {got} of {size} bytes" if got < size else "cut in the padding after the member's data"
    return ShardFormatError(f"truncated tar: {text}", url=url, member=name, reason="truncated",
                            hint="re-write or re-upload the shard")


def _first_header_error(header: bytes, url: str) -> ShardFormatError:
    """A stream cut inside its first header, or a short file that is no tar at all."""
    looks_tar = b"\0" in header  # tar headers are NUL-padded; error pages and text are not
    return ShardFormatError(
        f"{'truncated tar' if looks_tar else 'not a tar shard'}: header cut after {len(header)} bytes "
        f"at offset 0 (the whole shard is {len(header)} bytes, starting {header[:16]!r})", url=url,
        reason="truncated" if looks_tar else "not_tar",
        hint="re-write or re-upload the shard" if looks_tar else "is this file really a tar shard?")


def walk(
    stream: BinaryIO, url: str, *, want: Callable[[str], bool] = lambda name: True,
    max_member_bytes: int = 256 << 20, mark_errors: bool = False, clock: Optional[ReadClock] = None,
    chunk: int = CHUNK,
) -> Iterator[Entry]:
    """The members of a tar stream as plain tuples ``(name, size, offset, data, error, kind)`` (no
    object per member): files, ``kind`` :data:`FILE`, and links, devices and fifos, ``kind``
    :data:`OTHER` (no data, never read); ``data`` is read only if ``want(name)``. ``chunk``:
    bytes per read (the buffer's size). (A scan reads a shard's headers at once instead:
    :mod:`.index`, which finds what this walk finds.)

    Handles ustar prefixes, GNU long names and pax ``path``/``size`` records. Raises
    :class:`ShardFormatError` for a stream that is empty, not a tar, damaged (bad checksum, a
    size that is no number, negative or larger than the shard, a lone zero block), cut
    mid-header or mid-member, or ends without the end-of-archive marker. A wanted member larger
    than ``max_member_bytes``, or of a type not supported (GNU sparse), is refused before
    anything is allocated: a :class:`SampleError`, or with ``mark_errors`` an entry carrying the
    error whose data were skipped unread. With ``mark_errors`` a wanted member whose data are cut
    is also yielded, carrying its :class:`ShardFormatError`, as the last entry (so the caller
    knows the member before it ended). ``clock``, if given, accumulates the time spent waiting
    for the stream's bytes."""
    r = StreamBuffer(stream, url, clock, chunk)
    pending = Extended()  # the extended headers before a member
    first = not r.base  # the shard's own first header (a read from a sample's offset meets none)
    while True:
        r.member = None  # between members: a read error here is the stream's, not a member's
        pos = r.pos
        if r.end - pos < BLOCK:
            r.fill(BLOCK)
            pos = r.pos
        offset = r.base + pos
        header = r.arr[pos:pos + BLOCK] if r.end - pos >= BLOCK else bytes(r.view[pos:r.end])
        if len(header) < BLOCK:
            if not header:
                if first:
                    raise ShardFormatError("empty shard (0 bytes)", url=url, reason="empty",
                                           hint="re-write or re-upload the shard, or remove it from the sources")
                raise no_end_marker(url)
            if first:
                raise _first_header_error(header, url)
            readable = header_name(header + bytes(BLOCK - len(header))) if len(header) >= 100 else None
            raise losing(ShardFormatError(f"truncated tar: header cut after {len(header)} bytes at offset {offset}",
                                          url=url, reason="truncated", hint="re-write or re-upload the shard"),
                         readable or None)
        r.pos = pos + BLOCK
        if header == ZERO:
            r.end_or_damage(offset)
            return
        text = header[148:154]
        if header[154] == 0 and text.isdigit():  # checksum_ok()'s usual case inline (calls: +4% a member)
            try:
                ok = int(text, 8) == ((adler32(header[:148]) & 0xFFFF) + (adler32(header[156:400]) & 0xFFFF)
                                      + (adler32(header[400:]) & 0xFFFF) + 253)
            except ValueError:
                ok = False
        else:
            ok = checksum_ok(header)
        if not ok:
            if first:
                raise ShardFormatError(f"not a tar stream: no valid tar header at offset 0 (starts {bytes(header[:16])!r})",
                                       url=url, reason="not_tar", hint="is this file really a tar shard?")
            named = header_name(header) or None  # (a damaged header: what its name field reads)
            raise losing(damaged(f"header checksum mismatch at offset {offset}"
                                 + (f" (its name field reads {named!r})" if named else ""), url), named)
        first = False
        kind = header[156]
        text = header[124:135]
        if header[135] in (0, 32) and text.isdigit():  # header_size()'s usual case inline (see above)
            try:
                size = int(text, 8)
            except ValueError:  # an 8 or a 9
                size = header_size(header, url, offset)
        else:
            size = header_size(header, url, offset)
        padded = (size + BLOCK - 1) & -BLOCK
        if kind in EXTENDED:
            pending.check(size, url, offset)
            data = r.take(padded)
            if len(data) < padded:
                raise ShardFormatError("truncated tar: extended header cut", url=url, reason="truncated")
            pending.add(kind, data[:size], url, offset)
            continue
        name = header_name(header)
        sparse = kind == SPARSE
        if pending.start is not None:  # (a resume opens the shard at the first: the member starts there)
            offset, name, size, pax_sparse = pending.apply(name, size, url)
            padded = (size + BLOCK - 1) & -BLOCK
            sparse = sparse or pax_sparse
        if r.size is not None and size > r.size:
            raise losing(damaged(f"member size of {size} bytes is larger than the whole shard ({r.size} bytes)", url,
                                 name), name)
        r.member = name  # its data are read next
        if kind in REGULAR and not sparse:
            if want(name):
                if size > max_member_bytes:
                    error = SampleError(
                        f"member of {size} bytes exceeds the limit of {max_member_bytes} bytes (max_member_bytes); "
                        "it was not read", url=url, member=name, reason="too_large",
                        hint="raise max_member_bytes if such members are expected",
                    )
                    if not mark_errors:
                        raise error
                    got = r.skip(padded)
                    if got < padded:
                        yield from _cut(name, size, offset, got, url, mark_errors, whole=(None, error))
                        return
                    yield name, size, offset, None, error, FILE
                    continue
                start = r.pos
                if r.end - start >= padded:  # the usual case: all in the chunk
                    r.pos = start + padded
                    yield name, size, offset, bytes(r.view[start:start + size]), None, FILE
                    continue
                data = r.take(size)
                if len(data) < size:
                    yield from _cut(name, size, offset, len(data), url, mark_errors)
                    return
                if r.skip(padded - size) < padded - size:
                    yield from _cut(name, size, offset, size, url, mark_errors, whole=(data, None))
                    return
                yield name, size, offset, data, None, FILE
                continue
            got = r.skip(padded)
            if got < padded:
                yield from _cut(name, size, offset, got, url, mark_errors, whole=(None, None))
                return
            yield name, size, offset, None, None, FILE
            continue
        if sparse and kind == SPARSE:  # old GNU sparse: the map goes on in extension blocks before the data
            extended = header[482]
            while extended:
                block = r.take(BLOCK)
                if len(block) < BLOCK:
                    raise ShardFormatError("truncated tar: sparse map cut", url=url, member=name, reason="truncated")
                extended = block[504]
        got = r.skip(padded)
        if got < padded:
            yield from _cut(name, size, offset, got, url, mark_errors)
            return
        if sparse:
            error = None
            if want(name):
                error = SampleError("unsupported member type: GNU sparse file (its data were not read)", url=url,
                                    member=name, reason="unsupported_member",
                                    hint="write the member as a regular file (tar without --sparse)")
                if not mark_errors:
                    raise error
            yield name, size, offset, None, error, FILE
        elif kind in SPECIAL:
            yield name, size, offset, None, None, OTHER


def _cut(name: str, size: int, offset: int, got: int, url: str, mark_errors: bool,
         whole: Optional[Tuple[Optional[bytes], Optional[DalistreamError]]] = None) -> Iterator[Entry]:
    """A member whose data end early: raise, or (``mark_errors``) yield it carrying the error, so
    that the caller knows the member before it ended (its header was whole). When only the padding
    after its data is cut (``got >= size``) and ``whole`` gives its ``(data, error)``, the member is
    yielded whole and the stream's error raised after it: the stream ended between members."""
    error = _cut_error(name, size, got, url)
    if whole is not None and got >= size:
        yield name, size, offset, whole[0], whole[1], FILE
        raise error  # only its padding: the stream ended between members, which proves no sample whole
    if not mark_errors:
        raise error
    yield name, size, offset, None, error, FILE
