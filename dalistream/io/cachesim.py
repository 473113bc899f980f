"""What the node-local byte cache (:mod:`.cache`) should fetch, without files: a pure model of its
eviction rule over an access order, to compare a real run's remote bytes with.

The rule, which the cache implements and this module defines: a block is the unit of caching;
reading a block the cache holds is a hit and makes it the most recently used; a miss fetches it,
and when the blocks held plus the new one would pass the limit, the least recently used blocks
are evicted until the held bytes plus the new block are at most ``limit - slack``
(:func:`eviction_slack`: evicting a little more than needed at once keeps the folder scans of
the real cache rare at a large limit, and is zero at a small one). A block larger than the limit
is read without caching.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Hashable, Iterable, Iterator, Tuple


def eviction_slack(limit_bytes: int, block_bytes: int) -> int:
    """Bytes evicted beyond the need when the cache is full: a 32nd of the limit in whole
    blocks (0 below 32 blocks), so that a cache of 800 GB scans its folder once per 25 GB
    written, not once per block."""
    return (limit_bytes // 32 // block_bytes) * block_bytes


def blocks(start: int, end: int, block_bytes: int) -> range:
    """Indices of the blocks that hold bytes ``[start, end)`` of an object."""
    if end <= start:
        return range(start // block_bytes, start // block_bytes)
    return range(start // block_bytes, (end - 1) // block_bytes + 1)


class LRUModel:
    """The cache's eviction rule (module doc) over keys and sizes; counters as the cache's:
    ``hits``, ``misses``, ``remote_bytes`` (bytes of missed blocks), ``cache_bytes`` (bytes of
    blocks hit), ``evictions``, ``evicted_bytes``, ``uncached_bytes`` (blocks larger than the
    limit, never held)."""

    def __init__(self, limit_bytes: int, slack_bytes: int = 0) -> None:
        self.limit, self.slack = int(limit_bytes), int(slack_bytes)
        self.held: "OrderedDict[Hashable, int]" = OrderedDict()
        self.used = 0
        self.counters: Dict[str, int] = dict.fromkeys(
            ("hits", "misses", "remote_bytes", "cache_bytes", "evictions", "evicted_bytes", "uncached_bytes"), 0)

    def access(self, key: Hashable, size: int) -> bool:
        """Read block ``key`` of ``size`` bytes: True on a hit."""
        c = self.counters
        if key in self.held:
            self.held.move_to_end(key)
            c["hits"] += 1
            c["cache_bytes"] += size
            return True
        c["misses"] += 1
        c["remote_bytes"] += size
        if size > self.limit:
            c["uncached_bytes"] += size
            return False
        if self.used + size > self.limit:
            target = self.limit - size - self.slack
            while self.held and self.used > target:
                _, gone = self.held.popitem(last=False)
                self.used -= gone
                c["evictions"] += 1
                c["evicted_bytes"] += gone
        self.held[key] = size
        self.used += size
        return False

    def run(self, accesses: Iterable[Tuple[Hashable, int]]) -> Dict[str, int]:
        """Read every ``(key, size)`` in order; the counters of these reads alone."""
        before = dict(self.counters)
        for key, size in accesses:
            self.access(key, size)
        return {k: v - before[k] for k, v in self.counters.items()}


def epochs(model: LRUModel, orders: Iterable[Iterable[Tuple[Hashable, int]]]) -> Iterator[Dict[str, int]]:
    """The counters of each epoch's accesses, one epoch after the other on one ``model``."""
    for order in orders:
        yield model.run(order)
