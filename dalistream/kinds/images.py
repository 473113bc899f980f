"""Encoded images checked without decoding: one at a time (:func:`image_problem`) or a run's rows
at once with array operations (:func:`images_bad`: the JPEG segment walk to the start of scan and
the end marker, PNG's ``IEND``; other formats one by one). What the ``bytes`` field kind does with
a member whose extension names an image (:data:`IMAGE_EXTS`)."""

from __future__ import annotations

from typing import List, Optional

import numpy as np

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "bmp", "tif", "tiff", "webp", "gif", "ppm", "pgm", "pbm", "pnm", "jp2"})
_JPEG_STEPS = 64  # segments walked in bulk before a row is checked alone
_QUAD = np.arange(4)
# by marker byte, how far the walk moves past a marker: fill bytes (0xFF) one, markers without a
# length (RSTn, SOI, EOI, TEM) two, the others two plus the length that follows them
_STEP = np.full(256, 2, np.int64)
_STEP[0xFF] = 1
_HAS_LENGTH = np.ones(256, np.int64)
_HAS_LENGTH[[*range(0xD0, 0xD9), 0x01, 0xFF]] = 0


def is_image_ext(ext: str) -> bool:
    """Whether a member extension names an image: its part after the last dot, case-insensitive,
    in :data:`IMAGE_EXTS` (``seg.PNG`` does)."""
    return ext.rsplit(".", 1)[-1].lower() in IMAGE_EXTS


JPEG_START, PNG_START, PNG_END = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"
_SIGNATURES = (  # formats DALI's image decoders read, besides JPEG and PNG
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\0", "TIFF"), (b"MM\0*", "TIFF"),
    (b"\0\0\0\x0cjP  \r\n\x87\n", "JPEG 2000"), (b"\xff\x4f\xff\x51", "JPEG 2000"),
)


def _jpeg_scan(data: bytes) -> int:
    """Where the image's first start-of-scan marker is (-1: none): the segments before it are
    passed over by their lengths, so a thumbnail inside an EXIF segment (a whole JPEG, with its
    own scan and end marker) is not taken for the image. Where the walk goes astray (bytes that
    are no marker, which decoders accept with a warning, or a length past the end) the marker is
    searched from there instead: damage inside is left to the decoder, as before."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xDA:
            return i
        if marker == 0xFF:  # fill byte
            step = 1
        elif 0xD0 <= marker <= 0xD8 or marker == 0x01:  # markers without a length
            step = 2
        else:
            step = 2 + int.from_bytes(data[i + 2:i + 4], "big")
        if i + step + 4 > n:
            break
        i += step
    return data.find(b"\xff\xda", i)


def image_problem(data: bytes) -> Optional[str]:
    """What is wrong with encoded image bytes, or ``None`` if they pass a cheap check.

    The check costs a few microseconds and never decodes: the data must start with the
    signature of a format DALI decodes (JPEG, PNG, GIF, BMP, TIFF, WebP, JPEG 2000, PNM) and,
    where the format has an end marker, contain it: JPEG needs an end-of-image marker after its
    first start-of-scan (a thumbnail's does not count; data after it, as in motion photos, is fine), PNG its ``IEND`` chunk,
    WebP as many bytes as its RIFF header announces. It catches random bytes, empty members
    and files cut short; damage inside the compressed data passes and is left to the decoder.
    """
    n = len(data)
    if n == 0:
        return "0 bytes"
    if data.startswith(JPEG_START):
        scan = _jpeg_scan(data)
        if scan < 0:
            return f"JPEG of {n} bytes without image data (no start-of-scan marker): cut short?"
        if data.rfind(b"\xff\xd9", scan) < 0:  # from the end, where it is: not a scan of the whole image
            return f"JPEG of {n} bytes without its end-of-image marker: cut short?"
        return None
    if data.startswith(PNG_START):
        if data.rfind(PNG_END, 8) < 0:
            return f"PNG of {n} bytes without its IEND chunk: cut short?"
        return None
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        announced = int.from_bytes(data[4:8], "little") + 8
        if n < announced:
            return f"WebP of {n} bytes whose header announces {announced}: cut short?"
        return None
    for magic, _name in _SIGNATURES:
        if data.startswith(magic):
            return None
    if n >= 3 and data[:1] == b"P" and data[1:2] in b"1234567" and data[2:3] in b" \t\r\n#":
        return None  # PNM
    return f"unknown image format ({n} bytes starting {data[:8]!r})"


def images_bad(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, check: np.ndarray,
               bulk: bool = True) -> List[int]:
    """Of the rows ``check`` marks (encoded images at ``data[starts[i]:][:lengths[i]]``), those
    :func:`image_problem` refuses: with ``bulk``, JPEG and PNG settled together where they surely
    pass, the rest checked one by one."""
    ok = ~check
    if not bulk:
        return [i for i in np.flatnonzero(check).tolist()
                if image_problem(data[starts[i]:starts[i] + lengths[i]].tobytes()) is not None]
    head = _bytes_at(data, starts, lengths, 8)
    is_jpeg = check & (lengths >= 4) & (head[:, :3] == np.frombuffer(JPEG_START, np.uint8)).all(axis=1)
    is_png = check & (lengths >= 16) & (head == np.frombuffer(PNG_START, np.uint8)).all(axis=1)
    if is_png.any():
        tail = _bytes_at(data, starts + np.maximum(lengths - 8, 0), np.minimum(lengths, 8), 8)
        ok |= is_png & (tail == np.frombuffer(PNG_END, np.uint8)).all(axis=1)
    if is_jpeg.any():
        ok |= jpeg_whole(data, starts, lengths, is_jpeg)
    bad = []
    for i in np.flatnonzero(~ok).tolist():
        if image_problem(data[starts[i]:starts[i] + lengths[i]].tobytes()) is not None:
            bad.append(i)
    return bad


def _bytes_at(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` bytes of each row (zeros past a row's end)."""
    inside = np.arange(width) < lengths[:, None]
    return np.where(inside, data[np.where(inside, starts[:, None] + np.arange(width), 0)], 0)


def jpeg_whole(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows that surely pass :func:`image_problem` as JPEG: the segment walk of
    :func:`_jpeg_scan`, run on all rows at once, reaches a start-of-scan
    marker, and the row ends with the end-of-image marker (after it, then). ``False`` is no
    verdict: those rows are checked alone."""
    ok = np.zeros(len(starts), bool)
    active = np.flatnonzero(rows)
    ends = starts[active] + lengths[active]
    whole = (data[ends - 2] == 0xFF) & (data[ends - 1] == 0xD9)
    # each walking row's next marker (absolute) and the last place a marker's 4 bytes fit; the
    # arrays shrink to the rows still walking, so a step costs the same few operations (their
    # count, not the rows', is what a call of a few hundred rows pays)
    active, at, last = active[whole], (starts[active] + 2)[whole], (ends - 4)[whole]
    walking = at <= last
    for _ in range(_JPEG_STEPS):
        if not walking.all():
            active, at, last = active[walking], at[walking], last[walking]
        if not len(active):
            break
        quad = data[at[:, None] + _QUAD]  # each row's marker and the segment length after it
        marker, is_marker = quad[:, 1], quad[:, 0] == 0xFF
        found = is_marker & (marker == 0xDA)
        ok[active[found]] = True
        at = at + _STEP[marker] + _HAS_LENGTH[marker] * (quad[:, 2].astype(np.int64) << 8 | quad[:, 3])
        walking = is_marker & ~found & (at <= last)
    return ok
