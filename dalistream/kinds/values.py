"""Values from member bytes: decimal labels parsed a run at a time (:func:`parse_ints`), and a
decoder's array fitted to its field's dtype without loss (:func:`fitted`)."""

from __future__ import annotations

import warnings
from typing import Tuple

import numpy as np

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_DIGITS = 18  # a longer label is parsed alone (int64 holds every 18-digit decimal)
_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True  # what bytes.strip() strips


def parse_ints(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The decimal integers at ``data[starts[i]:starts[i] + lengths[i]]`` (``int64``), and which
    rows are not plain digits followed by whitespace (0 here; to be read alone)."""
    n = len(starts)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    width = int(lengths.max())
    if width == 0 or width > 2 * MAX_DIGITS:  # (one long row: all read alone)
        return np.zeros(n, np.int64), np.ones(n, bool)
    columns = np.arange(width)
    inside = columns < lengths[:, None]
    text = np.where(inside, data[np.where(inside, starts[:, None] + columns, 0)], ord(" "))
    digit = (text >= ord("0")) & (text <= ord("9"))
    ndigits = np.where(digit.all(axis=1), width, np.argmin(digit, axis=1))
    trailing = (columns >= ndigits[:, None]) & ~_WHITESPACE[text]
    good = (ndigits >= 1) & (ndigits <= MAX_DIGITS) & ~trailing.any(axis=1)
    value = np.zeros(n, np.int64)
    for c in range(min(width, MAX_DIGITS)):
        value = np.where(c < ndigits, value * 10 + (text[:, c].astype(np.int64) - ord("0")), value)
    return np.where(good, value, 0), ~good


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
