"""A mix's weights as the exact fractions its rule follows (:func:`integer_weights`), and by how
much a weight too small to reach a batch must grow (:func:`raised_by`, for the hint that names it)."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import reduce
from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError

MAX_DENOMINATOR = 1 << 16


def integer_weights(weights: Sequence[float]) -> Tuple[int, ...]:
    """The weights as integers ``w_s`` with ``p_s = w_s / D``, ``D = Σ w_s`` (see the module doc)."""
    p = np.asarray(weights, dtype=np.float64)
    if p.ndim != 1 or len(p) == 0 or not np.all(np.isfinite(p)) or np.any(p <= 0):
        raise ConfigError(f"mix: weights must be finite numbers greater than 0, got {list(weights)!r}")
    p = p / p.sum()
    fractions = [Fraction(float(x)).limit_denominator(1000) for x in p]
    if sum(fractions) == 1 and all(f > 0 and abs(float(f) - x) <= 1e-9 for f, x in zip(fractions, p)):
        d = reduce(lambda a, b: a * b // math.gcd(a, b), (f.denominator for f in fractions), 1)
        if d <= MAX_DENOMINATOR:
            return tuple(int(f * d) for f in fractions)
    raw = p * MAX_DENOMINATOR
    w = np.maximum(np.floor(raw).astype(np.int64), 1)
    short = MAX_DENOMINATOR - int(w.sum())
    if short > 0:
        w[np.argsort(-(raw - np.floor(raw)), kind="stable")[:short]] += 1
    elif short < 0:  # only when tiny weights were raised to 1: take from the largest
        w[np.argsort(-w, kind="stable")[:-short]] -= 1
    g = reduce(math.gcd, w.tolist())
    return tuple(int(x) // g for x in w)


def raised_by(weights: Sequence[float], source: int, batch_size: int) -> Optional[float]:
    """By how much source ``source``'s weight must be multiplied (the others kept) for half a
    sample per batch (:func:`.mix.check_share`) after :func:`integer_weights`' rounding (3 digits, up);
    ``None`` when the others would then fall short (more sources than a batch holds halves of)."""
    p = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    factor = (1.0 - p[source]) / ((2 * batch_size - 1) * p[source])  # x / (x + others) = 1 / (2B)
    for _ in range(100):  # the rounding to 1/65,536 may cost a unit: the next 3-digit value until it passes
        step = 10.0 ** (math.floor(math.log10(factor)) - 2)
        factor = float(f"{math.ceil(factor / step - 1e-9) * step:.3g}")
        w = integer_weights(np.where(np.arange(len(p)) == source, p * factor, p))
        if 2 * w[source] * batch_size >= sum(w):
            return factor if all(2 * x * batch_size >= sum(w) for x in w) else None
        factor += step
    return None
