"""The samples of one part of a worker's plan: each one's ordinal, and which are passed over on
a resume (a start position, an elastic resume's drops, a shuffle buffer's delivered window); and
the parts of each pass over a ``fixed`` plan (:func:`pass_parts`, :func:`unrolled`)."""

from __future__ import annotations

import bisect
import dataclasses
from typing import AbstractSet, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DalistreamError
from ..plan import WorkerPlan, seeds


class Numbering:
    """The samples of one part, ``first`` to ``first + size`` of its shard (``size`` None: a whole
    shard of unknown count, ``first`` 0): each one's ordinal (:meth:`ordinal`), which are passed
    over (:meth:`skip`, :meth:`passed`: an elastic resume's or ``even``'s ``drop`` of raw
    positions, the part's first at raw position ``raw``; an ordinal before ``start`` or in
    ``gone``), how many at its head are (a part opens after them: ``head``), and how many the part
    held (``found``, set as it is read). A dropped sample takes no ordinal: ordinals are counted
    by bisecting the part's drops, never by a walk over its samples."""

    def __init__(self, first: int, size: Optional[int], raw: int = 0, base: int = 0, drop: Sequence[int] = (),
                 start: int = 0, gone: AbstractSet[int] = frozenset()) -> None:
        self.first, self.base, self.start, self.gone = first, base, start, gone
        self.found = first
        self.problem: Optional[DalistreamError] = None  # the part's problem, met when it was read
        self.head = 0
        self._dropped: List[int] = []  # the part's dropped samples, from its first (sorted)
        if size is None:
            self.skips = bool(start or gone)
            return
        self._dropped = [d - raw for d in drop[bisect.bisect_left(drop, raw):bisect.bisect_left(drop, raw + size)]]
        mine = any(base <= o < base + size for o in gone) if gone else False
        self.skips = bool(self._dropped or mine or base < start)
        while self.skips and self.head < size and self.skip(first + self.head):
            self.head += 1

    def skip(self, n: int) -> bool:
        """Whether the shard's sample ``n`` is passed over."""
        if not self.skips:
            return False
        i = n - self.first
        dropped = self._dropped
        k = bisect.bisect_left(dropped, i) if dropped else 0
        if k < len(dropped) and dropped[k] == i:
            return True
        o = self.base + i - k
        return o < self.start or o in self.gone

    def ordinal(self, n: int) -> int:
        """The ordinal of the shard's sample ``n``."""
        i = n - self.first
        return self.base + i - (bisect.bisect_left(self._dropped, i) if self._dropped else 0)

    def passed(self, lo: int, hi: int) -> List[int]:
        """The shard's samples ``lo`` to ``hi`` passed over, in order."""
        if not self.skips:
            return []
        if not self.gone and self.start <= self.ordinal(lo):  # only drops here: bisected
            dropped = self._dropped
            a, b = bisect.bisect_left(dropped, lo - self.first), bisect.bisect_left(dropped, hi - self.first)
            return [self.first + i for i in dropped[a:b]]
        return [n for n in range(lo, hi) if self.skip(n)]


def between(sorted_values: Sequence[int], lo: int, hi: int) -> int:
    """How many of ``sorted_values`` lie in ``[lo, hi)``."""
    return bisect.bisect_left(sorted_values, hi) - bisect.bisect_left(sorted_values, lo)


def pass_parts(plan: WorkerPlan, n_pass: int, seed: int) -> List[Tuple[int, int, Optional[int]]]:
    """The parts of pass ``n_pass`` over ``plan``'s (``fixed`` reads them again and again): the
    first pass in plan order, each later one in an order of its own (``seed``: the stream's)."""
    parts = list(plan.parts)
    if n_pass:
        perm = np.random.default_rng(seeds.pass_order(seed, plan.epoch, n_pass)).permutation(len(parts))
        parts = [parts[int(i)] for i in perm]
    return parts


def unrolled(plan: WorkerPlan, rows: int, seed: int) -> Optional[WorkerPlan]:
    """``plan`` (a ``fixed`` column's) with the parts of as many passes as its first ``rows`` rows
    take (:func:`pass_parts`; its drops are the first pass's, as they are where its column reads
    them), or ``None`` where its parts' counts are unknown or hold no sample."""
    if any(stop is None for _, _, stop in plan.parts):
        return None
    per_pass = sum(stop - first for _, first, stop in plan.parts) - len(plan.drop)
    if per_pass <= 0:
        return None
    parts, n_pass, got = [], 0, 0
    while got < rows:
        parts += pass_parts(plan, n_pass, seed)
        got += per_pass
        n_pass += 1
    return dataclasses.replace(plan, parts=tuple(parts))
