"""What a :class:`~.parts.PartFetcher` knows of the streams, shards and parts it fetches: plain
state, changed under the fetcher's lock."""

from __future__ import annotations

from collections import deque
from typing import Deque, List, Optional

from .counters import IOCounters
from .options import RemoteOptions
from .remote import TOTALS


def aligned_part(part_bytes: int, block_bytes: int) -> int:
    """The part size that keeps parts on a cache's block bounds: a multiple of the block (at most
    ``part_bytes``), or, for parts smaller than a block, a size that divides the block."""
    if part_bytes >= block_bytes:
        return part_bytes // block_bytes * block_bytes
    pieces = -(-block_bytes // part_bytes)
    while block_bytes % pieces:
        pieces += 1
    return block_bytes // pieces


class StreamState:
    """One reader's shards ``lo … hi - 1`` of the fetcher's list: where its reader is (``cursor``),
    its parts in stream order, the bytes it holds, and its budget, part size and options."""

    def __init__(self, lo: int, hi: int, start: int, opts: RemoteOptions, counters: Optional[IOCounters]) -> None:
        self.lo, self.hi, self.cursor = lo, hi, lo + start
        self.opts, self.sink = opts, counters
        self.sinks: List[IOCounters] = [TOTALS] + ([counters] if counters is not None else [])
        self.slots: Deque[PartSlot] = deque()
        self.held = 0
        self.budget = max(opts.read_ahead_bytes, opts.chunk_bytes)  # at least one chunk
        cache = opts.cache
        if cache is not None:  # what is fetched ahead waits in the cache: no more than a small share of it
            self.budget = max(cache.block_bytes, min(self.budget, cache.limit_bytes // 64))
        self.part_bytes = min(opts.part_bytes, self.budget)
        # through a byte cache, parts end on its blocks' bounds: no block is wanted by two parts at once;
        # and they are only fetched into it (warmed): the reader reads them from the cache itself
        self.align = aligned_part(self.part_bytes, cache.block_bytes) if cache is not None else 0
        self.warming = cache is not None

    def part_length(self, start: int, limit: Optional[int]) -> int:
        """The length of a part from ``start``: ``part_bytes``, or up to the next multiple of
        ``align``; none past ``limit``."""
        n = (start // self.align + 1) * self.align - start if self.align else self.part_bytes
        return n if limit is None else min(n, limit - start)


class ShardState:
    """What the scheduler knows of one remote shard."""

    def __init__(self, url: str, start: int, end: Optional[int]) -> None:
        self.url, self.end = url, end
        self.size: Optional[int] = None
        self.etag: Optional[str] = None
        self.state = "new"  # new → sizing (first part in flight) → known → done (every part scheduled)
        self.next = start

    def limit(self) -> int:
        if self.size is None:
            return self.end if self.end is not None else self.next
        return self.size if self.end is None else min(self.end, self.size)


class PartSlot:
    """One part: its place in its stream, the bytes received and not yet read, its budget charge."""

    def __init__(self, owner: StreamState, shard: ShardState, index: int, offset: int, length: int, first: bool) -> None:
        self.owner, self.shard, self.index, self.offset, self.length, self.first = owner, shard, index, offset, length, first
        self.chunks: Deque[bytes] = deque()
        self.received = 0
        self.charge = 0
        self.whole = False  # the server ignored the range: the rest of the object comes here
        self.done = False
        self.cancelled = False
        self.error: Optional[BaseException] = None
