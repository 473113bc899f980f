"""Samples to arrays: field decoding and the missing-field policy.

Nothing here touches DALI: a sample (``ext -> bytes`` dict from :mod:`dalistream.tar`) becomes a
tuple of numpy arrays, one per :class:`~dalistream.config.Field`, ready to be placed in a slot.
"""

from __future__ import annotations

import difflib
import gzip
import io
import warnings
import zlib
from typing import Optional, Sequence, Tuple

import numpy as np

from ..config import Field, is_image_ext
from ..errors import DalistreamError, SampleError


class FieldDecoder:
    """Decodes samples into one array per field, applying the missing-field policy.

    ``missing``: ``"error"`` raises :class:`SampleError` naming URL and key, ``"skip"`` returns
    ``None`` (the caller counts it), ``"empty"`` puts the field's empty value in its place.

    Raw-bytes fields read from an image extension (``jpg``, ``png``, …, see
    :data:`dalistream.config.IMAGE_EXTS`) are checked cheaply with :func:`image_problem` (known
    signature; JPEG end-of-image and PNG ``IEND`` markers; RIFF length of WebP), so that random
    bytes or a cut file fail here, as a :class:`SampleError` naming shard and key (reason
    ``"bad_image"``), instead of inside DALI's decoder, which kills the whole pipeline without
    saying which sample it was. To pass image bytes on unchecked, declare the field with
    ``kind="custom", decoder=lambda b: np.frombuffer(b, np.uint8)``.
    """

    def __init__(self, fields: Sequence[Field], missing: str = "error") -> None:
        self.fields = tuple(fields)
        self.missing = missing
        exts = {e for f in self.fields for e in f.exts}
        self.exts = frozenset(exts | {e + ".gz" for e in exts})
        # wants(ext): True if members with this extension are needed (others are skipped unread);
        # the set's own method, called once per tar member: no Python frame
        self.wants = self.exts.__contains__

    def decode(self, sample: dict) -> Optional[Tuple[np.ndarray, ...]]:
        """One array per field, or ``None`` when the sample is to be skipped."""
        out = []
        for field in self.fields:
            value = self._one(field, sample)
            if value is None:
                if self.missing == "error":
                    raise SampleError(self._missing(field, sample), url=sample.get("__url__"),
                                      member=sample.get("__key__"), reason="missing_field",
                                      hint=self._case_hint(field, sample) or self._typo_hint(field, sample)
                                      or "if some samples lack this member on purpose, use missing='skip' or "
                                         "missing='empty' to accept them")
                if self.missing == "skip":
                    return None
                value = field.empty
            out.append(value)
        return tuple(out)

    def describe_missing(self, sample: dict) -> str:
        """What a sample lacks (the first field without a member), with the ``lowercase_ext`` hint
        when a member differs from a wanted extension only in case."""
        for field in self.fields:
            if field.kind != "meta" and not any(sample.get(e) is not None or sample.get(e + ".gz") is not None
                                                for e in field.exts):
                hint = self._case_hint(field, sample)
                return f"{self._missing(field, sample)} in shard {sample.get('__url__')}" + (f": {hint}" if hint else "")
        return "a field is missing"

    @staticmethod
    def _missing(field: Field, sample: dict) -> str:
        wanted = "/".join("." + e for e in field.exts)
        present = sorted(k for k in sample if not k.startswith("__"))
        return f"sample {sample.get('__key__')!r} has no member for field {field.name!r} (looked for {wanted}; it has {present})"

    @staticmethod
    def _case_hint(field: Field, sample: dict) -> Optional[str]:
        wanted = {e.lower() for e in field.exts}
        other_case = sorted(k for k in sample if not k.startswith("__") and k.lower() in wanted and k not in field.exts)
        if not other_case:
            return None
        return (f"its member extension {', '.join('.' + k for k in other_case)} differs only in case: pass "
                "lowercase_ext=True to match extensions case-insensitively")

    @staticmethod
    def _typo_hint(field: Field, sample: dict) -> Optional[str]:
        """A member extension close to a wanted one (``jpg`` for ``jpeg``, ``cls`` for ``class``):
        most likely a typo in ``fields``, which no missing-policy would mend."""
        present = [k for k in sample if not k.startswith("__") and k]
        close = sorted({m for e in field.exts for m in difflib.get_close_matches(e, present, n=2, cutoff=0.6)})
        if not close:
            return None
        return (f"the sample has {', '.join('.' + k for k in close)}: if that is the member you mean, name it in "
                f"fields (e.g. {{{field.name!r}: {';'.join(close + list(field.exts))!r}}}) -- a typo in an extension "
                "misses every sample, and missing='skip' would skip them all")

    def _one(self, field: Field, sample: dict) -> Optional[np.ndarray]:
        if field.kind == "meta":
            name = field.exts[0]
            return np.frombuffer(str(sample[name]).encode("utf-8", "surrogateescape"), np.uint8)  # a key's own bytes
        for ext in field.exts:
            data = sample.get(ext)
            if data is None and sample.get(ext + ".gz") is not None:
                try:
                    data = gzip.decompress(sample[ext + ".gz"])
                except (OSError, EOFError, zlib.error) as e:
                    raise SampleError(f"cannot gunzip .{ext}.gz: {e}", url=sample.get("__url__"),
                                      member=f"{sample.get('__key__')}.{ext}.gz", reason="bad_value") from None
            if data is not None:
                try:
                    return convert(field, data, ext)
                except DalistreamError:
                    raise
                except _BadImage as e:
                    raise SampleError(f"field {field.name!r} is not a decodable image: {e}", reason="bad_image",
                                      url=sample.get("__url__"), member=f"{sample.get('__key__')}.{ext}",
                                      hint="re-encode or remove the image, or use on_error='skip'") from None
                except Exception as e:
                    raise SampleError(f"cannot decode field {field.name!r}: {type(e).__name__}: {e}",
                                      url=sample.get("__url__"), member=f"{sample.get('__key__')}.{ext}",
                                      reason="bad_value") from None
        return None


class _BadImage(ValueError):
    pass


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


def convert(field: Field, data: bytes, ext: str = "") -> np.ndarray:
    if field.kind == "bytes":
        if is_image_ext(ext):
            problem = image_problem(data)
            if problem is not None:
                raise _BadImage(problem)
        return np.frombuffer(data, np.uint8)
    if field.kind == "int":
        text = data.strip()
        try:
            return np.array(int(text), np.int64)
        except ValueError:
            raise ValueError(f"label {text[:40]!r} is not an integer") from None
    if field.kind == "npy":
        value = np.load(io.BytesIO(data), allow_pickle=False)
    else:
        value = np.asarray(field.decoder(data))  # type: ignore[misc]
    if value.ndim != field.ndim:
        raise ValueError(f"expected {field.ndim} dimensions, got shape {value.shape}")
    return fitted(value, np.dtype(field.dtype))


def fitted(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``value`` as ``dtype``, or a ``ValueError`` showing the value when the cast would change it:
    a fraction or an out-of-range number cast to an integer, an integer that overflows, a complex
    part dropped, a finite float that overflows. A float cast to a narrower float only rounds
    (float64 0.1 to float32): allowed."""
    if value.dtype == dtype:
        return np.ascontiguousarray(value)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (ComplexWarning: the check below reports it)
        cast = value.astype(dtype)
    if value.dtype.kind == "f" and dtype.kind == "f":
        lost = np.isfinite(value) & ~np.isfinite(cast)
    elif value.dtype.kind in "biuf" and dtype.kind in "biuf":
        back = cast.astype(value.dtype) if value.dtype.kind != "f" or dtype.kind == "f" else cast.astype(np.float64)
        lost = ~((back == value) | (np.isnan(value) & np.isnan(back) if value.dtype.kind == "f" else False))
        if value.dtype.kind == "f" and dtype.kind in "biu":
            lost |= ~np.isfinite(value)
    else:  # complex, strings, objects: equal after the cast, or refused
        try:
            lost = ~np.asarray(cast == value, dtype=bool)
        except (TypeError, ValueError):
            lost = np.ones(value.shape, dtype=bool)
    if np.any(lost):
        shown = np.array2string(value.ravel()[:6], threshold=6)
        raise ValueError(f"the decoder's {value.dtype} value {shown}{' …' if value.size > 6 else ''} does not fit the "
                         f"field's dtype {dtype} without loss (as {dtype}: "
                         f"{np.array2string(cast.ravel()[:6], threshold=6)})")
    return np.ascontiguousarray(cast)
