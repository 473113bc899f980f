"""The samples of one part of a worker's plan: each one's ordinal, and which are passed over on
a resume (a start position, an elastic resume's drops, a shuffle buffer's delivered window)."""

from __future__ import annotations

import bisect
from typing import AbstractSet, List, Optional, Sequence

from ..errors import DalistreamError


class Numbering:
    """The samples of one part, ``first`` to ``first + size`` of its shard (``size`` None: a whole
    shard of unknown count, ``first`` 0): each one's ordinal (:meth:`ordinal`), which are passed
    over (:meth:`skip`: an elastic resume's ``drop`` of raw positions, the part's first at raw
    position ``raw``; an ordinal before ``start`` or in ``gone``), how many at its head are (a
    part opens after them: ``head``), and how many the part held (``found``, set as it is read)."""

    def __init__(self, first: int, size: Optional[int], raw: int = 0, base: int = 0, drop: Sequence[int] = (),
                 start: int = 0, gone: AbstractSet[int] = frozenset()) -> None:
        self.first, self.base, self.start, self.gone = first, base, start, gone
        self.found = first
        self.problem: Optional[DalistreamError] = None  # the part's problem, met when it was read
        self.passed: AbstractSet[int] = frozenset()
        self._ordinals: Optional[List[int]] = None
        self.head = 0
        if size is None:
            self.skips = bool(start or gone)
            return
        dropped = [d - raw for d in drop[bisect.bisect_left(drop, raw):bisect.bisect_left(drop, raw + size)]]
        mine = [o for o in gone if base <= o < base + size] if gone else []
        self.skips = bool(dropped or mine or base < start)
        if not self.skips:
            return
        passed, ordinals, ordinal, dropped_set = set(), [], base, set(dropped)
        for i in range(size):
            ordinals.append(ordinal)
            if i in dropped_set:
                passed.add(first + i)
                continue
            if ordinal < start or ordinal in gone:
                passed.add(first + i)
            ordinal += 1
        while self.head < size and first + self.head in passed:
            self.head += 1
        self.passed, self._ordinals = passed, ordinals

    def skip(self, n: int) -> bool:
        """Whether the shard's sample ``n`` is passed over."""
        if not self.skips:
            return False
        if self._ordinals is None:
            o = self.base + n - self.first
            return o < self.start or o in self.gone
        return n in self.passed

    def ordinal(self, n: int) -> int:
        """The ordinal of the shard's sample ``n``."""
        if self._ordinals is None:
            return self.base + n - self.first
        return self._ordinals[n - self.first]


def between(sorted_values: Sequence[int], lo: int, hi: int) -> int:
    """How many of ``sorted_values`` lie in ``[lo, hi)``."""
    return bisect.bisect_left(sorted_values, hi) - bisect.bisect_left(sorted_values, lo)
