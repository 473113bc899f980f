"""Tar header fields: numbers, checksums, pax records, and the errors of a damaged shard."""

from __future__ import annotations

import zlib
from typing import Dict, Optional

from ..errors import DalistreamError, ShardFormatError, SourceError

BLOCK = 512


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


def number(field: bytes, url: str, what: str, offset: int) -> int:
    """A numeric header field: octal text, or GNU base-256 (first byte 0x80; 0xff is negative)."""
    if field and field[0] & 0x80:
        if field[0] != 0x80:
            raise damaged(f"negative or malformed {what} field (base-256) in the header at offset {offset}", url)
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    if not text.isdigit() or b"8" in text or b"9" in text:
        raise damaged(f"bad {what} field {bytes(text[:20])!r} in the header at offset {offset}", url)
    return int(text, 8)


def checksum_ok(header: bytes) -> bool:
    """True if the 512-byte ``header`` carries its own (unsigned) checksum."""
    text = header[148:154]
    if header[154] == 0 and text.isdigit():  # the usual "%06o\0 " (fast path)
        try:
            stored = int(text, 8)
        except ValueError:  # an 8 or a 9
            return False
    else:
        text = header[148:156].split(b"\0", 1)[0].strip()
        if not text.isdigit():
            return False
        try:
            stored = int(text, 8)
        except ValueError:
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


_GZIP_ERRORS = (EOFError, zlib.error)


def read_error(error: BaseException, url: str) -> DalistreamError:
    """A read error of the byte stream as a dalistream error: bad gzip data is the shard's fault,
    any other I/O error the source's."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, _GZIP_ERRORS) or type(error).__name__ == "BadGzipFile":
        return ShardFormatError(f"corrupt or truncated gzip data ({text})", url=url, reason="bad_gzip",
                                hint="re-compress or re-upload the shard")
    return SourceError(f"read error ({text})", url=url, reason="read_error")
