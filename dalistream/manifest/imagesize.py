"""An image's width and height from its header, without decoding it: JPEG (the frame header,
``SOF0``–``SOF15`` but ``DHT``/``JPG``/``DAC``, after any ``APPn`` segments such as EXIF or ICC),
PNG (``IHDR``) and WebP (``VP8 `` lossy, ``VP8L`` lossless, ``VP8X`` extended).

:func:`image_size` gives the size of the image *as decoded*: a JPEG whose EXIF orientation is 5 to
8 (turned a quarter) has its width and height swapped, as DALI's decoder (``adjust_orientation``,
its default) and ``PIL.ImageOps.exif_transpose`` turn it. An EXIF block that cannot be read leaves
the orientation at 1 (as decoders do). WebP and PNG orientation tags are not applied.

Bytes that are not one of these formats give ``None``; bytes that start like one of them but
whose header is damaged or cut short raise :class:`~dalistream.errors.SampleError` (reason
``"bad_image"``) saying what is wrong, with the shard URL and member when the caller gives them.
"""

from __future__ import annotations

import struct
from typing import Optional, Tuple

from ..errors import SampleError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# frame headers: every SOFn but C4 (DHT), C8 (JPG, reserved) and CC (DAC)
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_STANDALONE = frozenset({0x01, 0xD8} | set(range(0xD0, 0xD8)))  # markers without a length
_TURNED = frozenset({5, 6, 7, 8})  # EXIF orientations that swap width and height


def image_format(data: bytes) -> Optional[str]:
    """``"jpeg"``, ``"png"`` or ``"webp"`` from the first bytes, or ``None``."""
    if data[:2] == b"\xff\xd8":
        return "jpeg"
    if data[:8] == PNG_SIGNATURE:
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def image_size(data: bytes, *, oriented: bool = True, url: Optional[str] = None,
               member: Optional[str] = None) -> Optional[Tuple[int, int]]:
    """``(width, height)`` of the JPEG, PNG or WebP image ``data`` (its first bytes are enough
    when they hold the header; a JPEG's frame header comes after its ``APPn`` segments), or
    ``None`` when ``data`` is none of these formats. ``oriented``: apply a JPEG's EXIF
    orientation (the size as decoded). Raises :class:`SampleError` for a damaged or cut header."""
    kind = image_format(data)
    if kind is None:
        return None
    try:
        if kind == "jpeg":
            return _jpeg(data, oriented)
        if kind == "png":
            return _png(data)
        return _webp(data)
    except _Bad as e:
        raise SampleError(f"{kind.upper()} header: {e}", url=url, member=member, reason="bad_image",
                          hint="the image is damaged or cut short; re-encode it, or index with --on-error skip") from None


class _Bad(Exception):
    pass


def _need(data: bytes, end: int, what: str) -> None:
    if len(data) < end:
        raise _Bad(f"cut short in the {what} ({len(data)} bytes)")


def _positive(width: int, height: int, what: str) -> Tuple[int, int]:
    if width <= 0 or height <= 0:
        raise _Bad(f"the {what} gives a size of {width}x{height}")
    return width, height


def _jpeg(data: bytes, oriented: bool) -> Tuple[int, int]:
    i, n, orientation = 2, len(data), 1
    while True:
        _need(data, i + 1, "marker list")
        if data[i] != 0xFF:
            raise _Bad(f"expected a marker at byte {i}, found 0x{data[i]:02x}")
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
        _need(data, i + 1, "marker list")
        marker = data[i]
        i += 1
        if marker in _STANDALONE:
            continue
        if marker == 0xD9:
            raise _Bad("the image ends before its frame header")
        if marker == 0xDA:
            raise _Bad("a scan starts before the frame header")
        _need(data, i + 2, f"segment 0x{marker:02x}")
        length = (data[i] << 8) | data[i + 1]
        if length < 2:
            raise _Bad(f"segment 0x{marker:02x} at byte {i - 2} has length {length}")
        if marker in _SOF:
            _need(data, i + 7, "frame header")
            if length < 8:
                raise _Bad(f"frame header of length {length}")
            height, width = struct.unpack(">HH", data[i + 3:i + 7])
            width, height = _positive(width, height, "frame header")
            if oriented and orientation in _TURNED:
                return height, width
            return width, height
        _need(data, i + length, f"segment 0x{marker:02x}")
        if marker == 0xE1 and data[i + 2:i + 8] == b"Exif\0\0":
            orientation = _exif_orientation(data[i + 8:i + length])
        i += length


def _exif_orientation(tiff: bytes) -> int:
    """The orientation tag (0x0112) of IFD0 of an EXIF block's TIFF data; 1 when it is absent or
    cannot be read."""
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if tiff[:2] == b"II" else ">"
    magic, ifd = struct.unpack(order + "HI", tiff[2:8])
    if magic != 42 or ifd + 2 > len(tiff):
        return 1
    (entries,) = struct.unpack(order + "H", tiff[ifd:ifd + 2])
    for k in range(entries):
        at = ifd + 2 + 12 * k
        if at + 12 > len(tiff):
            return 1
        tag, kind, count = struct.unpack(order + "HHI", tiff[at:at + 8])
        if tag == 0x0112:
            if kind != 3 or count != 1:
                return 1
            (value,) = struct.unpack(order + "H", tiff[at + 8:at + 10])
            return value if 1 <= value <= 8 else 1
    return 1


def _png(data: bytes) -> Tuple[int, int]:
    _need(data, 24, "IHDR chunk")
    length, kind = struct.unpack(">I4s", data[8:16])
    if kind != b"IHDR" or length != 13:
        raise _Bad(f"the first chunk is {kind!r} of {length} bytes, not IHDR of 13")
    width, height = struct.unpack(">II", data[16:24])
    if width >= 1 << 31 or height >= 1 << 31:
        raise _Bad(f"IHDR gives a size of {width}x{height} (over 2^31 - 1)")
    return _positive(width, height, "IHDR chunk")


def _webp(data: bytes) -> Tuple[int, int]:
    _need(data, 16, "first chunk header")
    chunk = data[12:16]
    if chunk == b"VP8 ":
        _need(data, 30, "VP8 frame header")
        if data[20] & 1:
            raise _Bad("the VP8 frame is not a key frame")
        if data[23:26] != b"\x9d\x01\x2a":
            raise _Bad("the VP8 start code is missing")
        width, height = struct.unpack("<HH", data[26:30])
        return _positive(width & 0x3FFF, height & 0x3FFF, "VP8 frame header")
    if chunk == b"VP8L":
        _need(data, 25, "VP8L header")
        if data[20] != 0x2F:
            raise _Bad("the VP8L signature is missing")
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        _need(data, 30, "VP8X header")
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    raise _Bad(f"unknown first chunk {chunk!r} (expected 'VP8 ', 'VP8L' or 'VP8X')")
