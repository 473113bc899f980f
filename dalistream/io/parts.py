"""Parallel ranged reads of one worker's remote shards, reassembled into one ordered stream.

A :class:`PartFetcher` cuts the remote shards of a list, in order, into parts of ``part_bytes``
and keeps up to ``parts_in_flight`` ranged GETs open at once, each on its own thread; the reader
takes the parts' bytes in order, so it sees each shard as one sequential stream and the next
shard's parts are already arriving while it parses the end of the current one.

Memory: every part reserves its length when it is scheduled and releases bytes as the reader
takes them; a part is scheduled only while the bytes held (received and not yet read, plus the
reservations of parts in flight) stay within ``read_ahead_bytes``, whatever the number and size
of parts. Parts are scheduled in stream order, except that while a shard waits for its first
answer (its size) the first parts of the following shards may start, within ``read_ahead_bytes
- part_bytes``: the part the reader needs next always fits once it has taken the bytes reserved
before it, so room always comes back.

The first part of a shard learns the object's size and ETag; the following parts are pinned to
that ETag (``If-Match``), so two versions are never spliced. Each part retries throttling and
5xx answers with backoff and resumes a cut transfer from its exact byte (:class:`RemoteRaw`).
An HTTP server that ignores ranges answers the first part with the whole object: that shard is
then read as one stream (still within the byte budget). A failed part is handed to the reader in
its place, after the bytes before it; the fetcher stops fetching that shard and goes on with the
next one.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

from ..errors import SourceError
from .counters import IOCounters
from .options import RemoteOptions
from .remote import TOTALS, RemoteRaw, is_ranged

Range = Tuple[int, Optional[int]]  # (start byte, end byte or None for the end of the object)
END = object()  # returned by :meth:`PartFetcher.take` at the end of a shard


def aligned_part(part_bytes: int, block_bytes: int) -> int:
    """The part size that keeps parts on a cache's block bounds: a multiple of the block (at most
    ``part_bytes``), or, for parts smaller than a block, a size that divides the block."""
    if part_bytes >= block_bytes:
        return part_bytes // block_bytes * block_bytes
    pieces = -(-block_bytes // part_bytes)
    while block_bytes % pieces:
        pieces += 1
    return block_bytes // pieces


class _Shard:
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


class _Slot:
    """One part: its place in the stream, the bytes received and not yet read, its budget charge."""

    def __init__(self, index: int, offset: int, length: int, first: bool) -> None:
        self.index, self.offset, self.length, self.first = index, offset, length, first
        self.chunks: Deque[bytes] = deque()
        self.received = 0
        self.charge = 0
        self.stream = False  # the server ignored the range: the rest of the object comes here
        self.done = False
        self.cancelled = False
        self.error: Optional[BaseException] = None


class PartFetcher:
    """Fetches the remote shards of ``urls`` from index ``start`` on as parallel ranged parts.

    ``ranges[i]`` (optional) limits shard ``i`` to bytes ``[start, end)``. Entries that are not
    remote URLs are skipped. :meth:`take` gives the bytes of one shard in order; :meth:`cancel`
    drops a shard the reader closed early; :meth:`stop` ends every thread after its current chunk.
    """

    def __init__(self, urls: Sequence[str], opts: RemoteOptions, counters: Optional[IOCounters] = None,
                 ranges: Optional[Sequence[Range]] = None, start: int = 0) -> None:
        self.opts = opts
        self.counters: List[IOCounters] = [TOTALS] + ([counters] if counters is not None else [])
        self._counters = counters
        self.shards: List[Optional[_Shard]] = [
            _Shard(url, *(ranges[i] if ranges is not None else (0, None))) if is_ranged(url) else None
            for i, url in enumerate(urls)]
        self.budget = max(opts.read_ahead_bytes, opts.chunk_bytes)  # at least one chunk
        if opts.cache is not None:  # what is fetched ahead waits in the cache: no more than a small share of it
            self.budget = max(opts.cache.block_bytes, min(self.budget, opts.cache.limit_bytes // 64))
        self.part_bytes = min(opts.part_bytes, self.budget)
        # through a byte cache, parts end on its blocks' bounds: no block is wanted by two parts at once;
        # and they are only fetched into it (warmed): the reader reads them from the cache itself
        self.align = aligned_part(self.part_bytes, opts.cache.block_bytes) if opts.cache is not None else 0
        self.warming = opts.cache is not None
        self.cond = threading.Condition()
        self.slots: Deque[_Slot] = deque()
        self.cursor = start
        self.held = 0
        self.in_flight = 0
        self.stopped = False
        self.threads = [threading.Thread(target=self._work, name=f"dalistream-part-{start}-{k}", daemon=True)
                        for k in range(opts.parts_in_flight)]
        for thread in self.threads:
            thread.start()

    # -- bookkeeping (under self.cond) -----------------------------------------------------------

    def _charge(self, slot: _Slot, amount: int) -> None:
        if slot.cancelled:
            return
        slot.charge += amount
        self.held += amount
        if amount > 0:
            for c in self.counters:
                c.peak(peak_buffered_bytes=self.held)

    def _drop(self, slot: _Slot) -> None:
        self._charge(slot, -slot.charge)
        slot.cancelled = True
        slot.chunks.clear()

    def _next_part(self) -> Optional[_Slot]:
        """Schedule the next part in stream order, if it is known and fits the budget."""
        while self.cursor < len(self.shards):
            shard = self.shards[self.cursor]
            if shard is None or shard.state == "done":
                self._advance()
                continue
            if shard.state == "sizing":
                return self._first_part_ahead()  # this shard's size is not known yet
            limit = shard.end if shard.state == "new" else shard.limit()
            if limit is not None and shard.next >= limit:
                shard.state = "done"
                self._advance()
                continue
            length = self._length(shard.next, limit)
            if self.held and self.held + length > self.budget:
                return None
            return self._schedule(self.cursor, shard, length)
        return None

    def _advance(self) -> None:
        self.cursor += 1
        self.cond.notify_all()  # a stream waiting as "ahead of the cursor" may now go on

    def _first_part_ahead(self) -> Optional[_Slot]:
        """While the shard at the cursor waits for its size, start the first part of a later
        shard (small shards would otherwise cost one latency each), leaving room for one part:
        bytes reserved ahead of the cursor stay within ``budget - part_bytes``, so the part the
        reader needs next always fits once it has taken what is reserved before it."""
        for index in range(self.cursor + 1, len(self.shards)):
            shard = self.shards[index]
            if shard is None or shard.state in ("done", "sizing"):
                continue
            if shard.state == "known":
                if shard.next < shard.limit():
                    return None  # its later parts come in order
                shard.state = "done"
                continue
            if shard.end is not None and shard.next >= shard.end:
                shard.state = "done"
                continue
            length = self._length(shard.next, shard.end)
            if self.held + length > self.budget - self.part_bytes:
                return None
            return self._schedule(index, shard, length)
        return None

    def _length(self, start: int, limit: Optional[int]) -> int:
        """The length of a part from ``start``: ``part_bytes``, or up to the next multiple of
        ``align``; none past ``limit``."""
        n = (start // self.align + 1) * self.align - start if self.align else self.part_bytes
        return n if limit is None else min(n, limit - start)

    def _schedule(self, index: int, shard: _Shard, length: int) -> _Slot:
        slot = _Slot(index, shard.next, length, first=shard.state == "new")
        shard.state = "sizing" if slot.first else shard.state
        shard.next += length
        at = len(self.slots)
        while at and (self.slots[at - 1].index, self.slots[at - 1].offset) > (index, slot.offset):
            at -= 1
        self.slots.insert(at, slot)  # the slots stay in stream order
        self._charge(slot, length)
        self.in_flight += 1
        for c in self.counters:
            c.add(parts=1)
            c.peak(peak_in_flight=self.in_flight)
        return slot

    # -- the fetching threads ------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self.cond:
                slot = None
                while slot is None:
                    if self.stopped or self.cursor >= len(self.shards):
                        return
                    slot = self._next_part()
                    if slot is None:
                        self.cond.wait()
            self._fetch(slot)

    def _fetch(self, slot: _Slot) -> None:
        shard = self.shards[slot.index]  # only remote shards are scheduled: never None
        raw = None
        try:
            raw = RemoteRaw(shard.url, slot.offset, self.opts, self._counters, slot.offset + slot.length, shard.etag)
            if slot.first:
                self._sized(slot, shard, raw)
            if self.warming:  # into the byte cache only: the reader reads it from there (passed() frees it)
                if not slot.cancelled:
                    raw.warm()
                return
            while True:
                n = self._room(slot)
                if n == 0:
                    break
                data = raw.read_chunk(n)
                with self.cond:
                    if slot.stream:
                        self._charge(slot, len(data) - n)  # the reservation made by _room, trued up
                    if not data or slot.cancelled or self.stopped:
                        break
                    slot.chunks.append(data)
                    slot.received += len(data)
                    self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the reader in the failed part's place
            with self.cond:
                if not self.warming:  # (warming: the reader's own read of this part meets it, named)
                    slot.error = e
                shard.state = "done"  # nothing more of this shard: the reader stops at the error
        finally:
            if raw is not None:
                raw.close()
            with self.cond:
                slot.done = True
                self.in_flight -= 1
                if not slot.stream and not self.warming:
                    self._charge(slot, -max(0, slot.length - slot.received))
                self.cond.notify_all()

    def version(self, index: int) -> Optional[str]:
        """The version shard ``index`` is pinned to, once its first part has answered."""
        with self.cond:
            shard = self.shards[index]
            return shard.etag if shard is not None else None

    def passed(self, index: int, pos: int) -> None:
        """The reader (reading from the cache itself) is at byte ``pos`` of shard ``index``: the
        parts before are no longer ahead of it."""
        with self.cond:
            freed = False
            while self.slots and (self.slots[0].index < index or (
                    self.slots[0].index == index and self.slots[0].offset + self.slots[0].length <= pos)):
                self._drop(self.slots.popleft())
                freed = True
            if freed:
                self.cond.notify_all()

    def _sized(self, slot: _Slot, shard: _Shard, raw: RemoteRaw) -> None:
        """The first part answered: the size and ETag of the object are known."""
        with self.cond:
            shard.size, shard.etag = raw.size, raw.etag
            if raw.ranged:
                shard.state = "known"
            else:  # the server sent the whole object: read it as one stream, charged as it arrives
                slot.stream = True
                raw.end = shard.end
                self._charge(slot, -slot.charge)
                shard.state = "done"
            self.cond.notify_all()

    def _room(self, slot: _Slot) -> int:
        """How many bytes to read next (0: stop). A stream waits for room in the budget: ahead
        of the cursor within ``budget - part_bytes`` (see :meth:`_first_part_ahead`); else
        unless it is the part the reader waits for and it has taken all it received (later
        reservations must not starve it)."""
        n = self.opts.chunk_bytes
        with self.cond:
            if not slot.stream:
                return 0 if slot.cancelled or self.stopped else n
            n = min(n, self.budget)

            def full() -> bool:
                if slot.index > self.cursor:
                    return self.held + n > self.budget - self.part_bytes
                if not slot.charge and self.slots and self.slots[0] is slot:
                    return False  # the reader waits for it: one chunk beyond the budget at most
                return self.held + n > self.budget

            while not (slot.cancelled or self.stopped) and full():
                self.cond.wait()
            if slot.cancelled or self.stopped:
                return 0
            self._charge(slot, n)  # reserved now: streams checking at the same time see it
            return n

    # -- the reader's side ---------------------------------------------------------------------

    def _cancel_through(self, index: int) -> None:
        while self.slots and self.slots[0].index <= index:
            self._drop(self.slots.popleft())
        for shard in self.shards[self.cursor:index + 1]:
            if shard is not None:
                shard.state = "done"
        self.cursor = max(self.cursor, index + 1)
        self.cond.notify_all()

    def take(self, index: int) -> object:
        """The next bytes of shard ``index`` in order, :data:`END` at its end; a failed part's
        error is raised in its place. Earlier shards are dropped (and no longer fetched)."""
        with self.cond:
            if index > 0 and (self.cursor < index or (self.slots and self.slots[0].index < index)):
                self._cancel_through(index - 1)
            while True:
                if self.stopped:
                    raise SourceError("read-ahead was stopped while the shard was being read",
                                      url=self.shards[index].url if self.shards[index] else None)
                if self.slots and self.slots[0].index == index:
                    slot = self.slots[0]
                    if slot.chunks:
                        data = slot.chunks.popleft()
                        self._charge(slot, -len(data))
                        self.cond.notify_all()
                        return data
                    if slot.error is not None:
                        self._drop(self.slots.popleft())
                        raise slot.error
                    if slot.done:
                        self._drop(self.slots.popleft())
                        self.cond.notify_all()
                        continue
                elif self.cursor > index or self.shards[index] is None or self.shards[index].state == "done":
                    return END
                self.cond.wait()

    def cancel(self, index: int) -> None:
        """The reader closed shard ``index`` early: drop its parts, fetch no more of it."""
        with self.cond:
            self._cancel_through(index)

    def stop(self) -> None:
        """Stop fetching; threads exit after their current chunk."""
        with self.cond:
            self.stopped = True
            while self.slots:
                self._drop(self.slots.popleft())
            self.cond.notify_all()
