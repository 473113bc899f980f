"""Tar members to samples, streaming: sequential, index-free, constant memory in shard size.

A sample is a run of consecutive members sharing a key. As in WebDataset, the key is the
member path up to the first dot of its basename and the extension is the rest:
``a.b/c.seg.png`` has key ``a.b/c`` and extension ``seg.png``. Members whose data are not
wanted (other extensions, or samples skipped on resume) are passed over by header, with a
seek when the stream can seek, so skipping never reads or decodes image bytes.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import BinaryIO, Callable, Dict, Iterator, Optional, Tuple

from .errors import SampleError, ShardFormatError

BLOCK = 512
REGULAR = (b"0", b"\0", b"7")


@dataclass
class Member:
    """One tar member: its name, size, header offset in the tar and (if read) its data."""

    name: str
    size: int
    offset: int
    data: Optional[bytes]


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
                               hint="is this file really a tar shard?") from None


def _checksum_ok(header: bytes) -> bool:
    stored = header[148:156].split(b"\0", 1)[0].strip()
    try:
        expected = int(stored, 8)
    except ValueError:
        return False
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    return expected == unsigned


def _parse_pax(data: bytes) -> Dict[str, str]:
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


class _Reader:
    """Exact reads and skips over a stream, tracking the byte position."""

    def __init__(self, stream: BinaryIO, url: str) -> None:
        self.stream = stream
        self.url = url
        self.pos = 0
        try:
            self.seekable = stream.seekable()
            if self.seekable:
                self.pos = stream.tell()
        except (AttributeError, OSError):
            self.seekable = False

    def read(self, n: int) -> bytes:
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
        self.pos += len(data)
        return data

    def skip(self, n: int) -> int:
        if n <= 0:
            return 0
        if self.seekable:
            self.stream.seek(n, 1)
            self.pos += n
            return n  # a short file shows up as a short read of the next header
        left = n
        while left:
            chunk = self.stream.read(min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)
        self.pos += n - left
        return n - left


def iter_members(
    stream: BinaryIO, url: str, *, want: Callable[[str], bool] = lambda name: True,
    max_member_bytes: int = 256 << 20,
) -> Iterator[Member]:
    """Yield the regular-file members of a tar stream; ``data`` is read only if ``want(name)``.

    Handles ustar prefixes, GNU long names and pax ``path``/``size`` records. Raises
    :class:`ShardFormatError` for a stream that is not a tar, is cut mid-header or mid-member,
    or ends without the end-of-archive marker.
    """
    reader = _Reader(stream, url)
    long_name: Optional[str] = None
    pax: Dict[str, str] = {}
    first = True
    while True:
        offset = reader.pos
        header = reader.read(BLOCK)
        if not header:
            if first:
                raise ShardFormatError("empty shard (0 bytes)", url=url)
            raise ShardFormatError("tar ends without its end-of-archive marker: truncated shard", url=url,
                                   member=None, hint="re-write or re-upload the shard")
        if len(header) < BLOCK:
            raise ShardFormatError(f"truncated tar: header cut after {len(header)} bytes at offset {offset}", url=url)
        if header == b"\0" * BLOCK:
            return
        if not _checksum_ok(header):
            raise ShardFormatError(f"not a tar stream: header checksum mismatch at offset {offset}", url=url,
                                   hint="is this file really a tar shard (or a truncated one)?")
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
                raise ShardFormatError(f"extended header of {size} bytes is implausible", url=url)
            data = reader.read(padded)
            if len(data) < padded:
                raise ShardFormatError("truncated tar: extended header cut", url=url)
            if kind == b"L":
                long_name = data[:size].split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == b"x":
                pax = _parse_pax(data[:size])
            continue
        if long_name is not None:
            name, long_name = long_name, None
        if pax:
            name = pax.get("path", name)
            size = int(pax.get("size", size))
            padded = -(-size // BLOCK) * BLOCK
            pax = {}
        if kind not in REGULAR:
            if reader.skip(padded) < padded:
                raise ShardFormatError("truncated tar: member cut", url=url, member=name)
            continue
        if want(name):
            if size > max_member_bytes:
                raise SampleError(
                    f"member of {size} bytes exceeds the limit of {max_member_bytes} bytes", url=url, member=name,
                    hint="raise max_member_bytes if such members are expected",
                )
            data = reader.read(size)
            if len(data) < size:
                raise ShardFormatError(f"truncated tar: member data cut after {len(data)} of {size} bytes",
                                       url=url, member=name)
            if reader.skip(padded - size) < padded - size:
                raise ShardFormatError("truncated tar: member padding cut", url=url, member=name)
            yield Member(name, size, offset, data)
        else:
            if reader.skip(padded) < padded:
                raise ShardFormatError("truncated tar: member data cut", url=url, member=name)
            yield Member(name, size, offset, None)


def split_name(name: str, lowercase: bool = False) -> Tuple[str, str]:
    """``("a.b/c", "seg.png")`` for ``"a.b/c.seg.png"``: key up to the basename's first dot."""
    directory, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return name, ""
    key = f"{directory}/{stem}" if directory else stem
    return key, (ext.lower() if lowercase else ext)


Sample = Dict[str, object]


def iter_samples(
    stream: BinaryIO, url: str, *, keep: Callable[[int], bool] = lambda index: True,
    want_ext: Callable[[str], bool] = lambda ext: True, lowercase: bool = False,
    max_member_bytes: int = 256 << 20,
) -> Iterator[Sample]:
    """Group members into samples: dicts of ``ext -> bytes`` plus ``__key__``, ``__url__``,
    ``__index__`` (sample number in the shard) and ``__offset__`` (tar offset of its first member).

    ``keep(index)`` false: the sample is still yielded (with no data) so counts and positions
    stay right, but its members are skipped by header. Members without an extension are ignored.
    A key seen twice in a shard, or an extension twice in one sample, raises :class:`SampleError`.
    """
    current: Optional[Sample] = None
    index = -1
    seen_keys: set = set()
    state = {"read": True}

    def want(name: str) -> bool:
        key, ext = split_name(name, lowercase)
        if not ext:
            return False
        if current is None or key != current["__key__"]:
            state["read"] = keep(index + 1)
        return state["read"] and want_ext(ext)

    for member in iter_members(stream, url, want=want, max_member_bytes=max_member_bytes):
        key, ext = split_name(member.name, lowercase)
        if not ext:
            continue
        if current is None or key != current["__key__"]:
            if current is not None:
                yield current
            if key in seen_keys:
                raise SampleError("duplicate sample key in shard (members of one sample must be adjacent)",
                                  url=url, member=member.name)
            seen_keys.add(key)
            index += 1
            current = {"__key__": key, "__url__": url, "__index__": index, "__offset__": member.offset}
        if ext in current:
            raise SampleError(f"extension {ext!r} appears twice in sample {key!r}", url=url, member=member.name)
        if member.data is not None:
            current[ext] = member.data
        else:
            current[ext] = None
    if current is not None:
        yield current
