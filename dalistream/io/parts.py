"""Parallel ranged reads of remote shards, reassembled into ordered streams.

A :class:`PartFetcher` fetches one or several *streams* of shards (:meth:`PartFetcher.add`: a
list of shards read in order by one reader; a worker reading interleaved columns adds one stream
per column to one fetcher). It cuts each stream's remote shards, in order, into parts of
``part_bytes`` and keeps ranged GETs open at once, each on its own thread; the reader takes a
stream's bytes in order, so it sees each shard as one sequential stream and the next shard's
parts are already arriving while it parses the end of the current one.

Memory: every part reserves its length when it is scheduled and releases bytes as the reader
takes them; a part of a stream is scheduled only while the bytes the stream holds (received and
not yet read, plus the reservations of its parts in flight) stay within its ``read_ahead_bytes``,
whatever the number and size of parts (so a fetcher holds at most the sum of its streams'
budgets: a worker's columns each get a share of the worker's, :func:`~.options.shared_budget`).
Within a stream, parts are scheduled in stream order, except that while a shard waits for its
first answer (its size) the first parts of the following shards may start, within
``read_ahead_bytes - part_bytes``: the part the reader needs next always fits once it has taken
the bytes reserved before it, so room always comes back. Across streams, the next part goes to
the stream with the fewest bytes ahead of its reader (in the order the streams were added when
they hold as many): the order a reader that takes a little of each stream in turn needs them.
Threads: ``parts_in_flight`` when given, the bound whatever is read; else
:data:`~.options.SPAN_IN_FLIGHT` for one stream, and for several one per stream (at least that,
at most :data:`~.options.MAX_IN_FLIGHT`), so that each column's first bytes are asked for at once: a first
batch waits for about one round trip, not one per column.

The first part of a shard learns the object's size and ETag; the following parts are pinned to
that ETag (``If-Match``), so two versions are never spliced; and so is every later stream of the
same object for the fetcher's life (a worker's next share or epoch of it): an object replaced
while a worker reads it is a ``changed`` error wherever that is met, never the new bytes read
as if the offsets counted at the start still held. Each part retries throttling and
5xx answers with backoff and resumes a cut transfer from its exact byte (:class:`RemoteRaw`).
An HTTP server that ignores ranges answers the first part with the whole object: that shard is
then read as one stream (still within the byte budget). A failed part is handed to the reader in
its place, after the bytes before it; the fetcher stops fetching that shard and goes on with the
next one.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import SourceError
from .counters import IOCounters
from .options import MAX_IN_FLIGHT, RemoteOptions
from .partstate import PartSlot, ShardState, StreamState
from .remote import RemoteRaw, is_ranged

Range = Tuple[int, Optional[int]]  # (start byte, end byte or None for the end of the object)
END = object()  # returned by :meth:`PartFetcher.take` at the end of a shard
IDLE_S = 30.0  # a thread of a fetcher open to more streams ends after this long with nothing to fetch


class PartFetcher:
    """Fetches streams of remote shards as parallel ranged parts (see the module doc).

    Made with ``urls``: one stream of them from index ``start`` on (``ranges[i]``, optional,
    limits shard ``i`` to bytes ``[start, end)``), and no other; made without, streams are added
    with :meth:`add` (a worker's columns). Entries that are not remote URLs are skipped.
    :meth:`take` gives the bytes of one shard in order (by its index in the fetcher's list);
    :meth:`cancel` drops a shard the reader closed early; :meth:`drop` a stream; :meth:`stop`
    ends every thread after its current chunk.
    """

    def __init__(self, urls: Sequence[str] = (), opts: Optional[RemoteOptions] = None,
                 counters: Optional[IOCounters] = None, ranges: Optional[Sequence[Range]] = None,
                 start: int = 0) -> None:
        lock = threading.RLock()
        self.cond = threading.Condition(lock)  # the reader and whole-object streams wait on it
        self.work = threading.Condition(lock)  # idle threads wait on it
        # (by index in the fetcher's list; a stream's entries go when it is dropped)
        self.shards: Dict[int, Optional[ShardState]] = {}
        self.owners: Dict[int, StreamState] = {}  # the stream of each shard
        # each object's ETag and size, as its first part learned them
        self.pinned: Dict[str, Tuple[str, Optional[int]]] = {}
        self.count = 0
        self.streams: List[StreamState] = []  # those still read
        self.held = 0
        self.in_flight = 0
        self.stopped = False
        self.threads: List[threading.Thread] = []
        self.open_to_more = not urls  # (a fetcher of one stream ends its threads once it is fetched)
        if urls and opts is not None:
            self.add(urls, opts, counters, ranges, start)

    def add(self, urls: Sequence[str], opts: RemoteOptions, counters: Optional[IOCounters] = None,
            ranges: Optional[Sequence[Range]] = None, start: int = 0) -> int:
        """A stream of ``urls`` (fetched from index ``start`` on, read with ``opts``, counted in
        ``counters``): its shards are this fetcher's ``base + i``; returns ``base``."""
        with self.cond:
            lo = self.count
            self.count += len(urls)
            stream = StreamState(lo, self.count, start, opts, counters)
            for i, url in enumerate(urls):
                shard = ShardState(url, *(ranges[i] if ranges is not None else (0, None))) if is_ranged(url) else None
                if shard is not None and url in self.pinned:
                    shard.etag = self.pinned[url][0]
                self.shards[lo + i] = shard
                self.owners[lo + i] = stream
            self.streams.append(stream)
            wanted = opts.in_flight if opts.parts_in_flight is not None or not self.open_to_more else \
                max(opts.in_flight, min(len(self.streams), MAX_IN_FLIGHT))  # (a number given is the bound)
            self.threads = [t for t in self.threads if t.is_alive()]
            for k in range(len(self.threads), wanted):
                thread = threading.Thread(target=self._work, name=f"dalistream-part-{lo}-{k}", daemon=True)
                self.threads.append(thread)
                thread.start()
            self.work.notify_all()
        return lo

    # -- bookkeeping (under self.cond) -----------------------------------------------------------

    def _charge(self, slot: PartSlot, amount: int) -> None:
        if slot.cancelled:
            return
        slot.charge += amount
        slot.owner.held += amount
        self.held += amount
        if amount > 0:
            for c in slot.owner.sinks:
                c.peak(peak_buffered_bytes=self.held)

    def _drop(self, slot: PartSlot) -> None:
        self._charge(slot, -slot.charge)
        slot.cancelled = True
        slot.chunks.clear()

    def _freed(self, stream: Optional[StreamState] = None) -> None:
        """Room came back (in ``stream``'s budget): the reader and whole-object streams may go
        on, an idle thread may start a part (one, if it has room for one now)."""
        self.cond.notify_all()
        if stream is None or not stream.held or stream.held + stream.part_bytes <= stream.budget:
            self.work.notify()

    def _next_part(self) -> Optional[PartSlot]:
        """Schedule the next part of the stream with the fewest bytes ahead of its reader that
        has one to fetch and room for it (see the module doc)."""
        for stream in sorted(self.streams, key=lambda s: s.held) if len(self.streams) > 1 else self.streams:
            slot = self._next_of(stream)
            if slot is not None:
                return slot
        return None

    def _next_of(self, stream: StreamState) -> Optional[PartSlot]:
        """The next part of ``stream`` in stream order, if it is known and fits the budget."""
        while stream.cursor < stream.hi:
            shard = self.shards[stream.cursor]
            if shard is None or shard.state == "done":
                self._advance(stream)
                continue
            if shard.state == "sizing":
                return self._first_part_ahead(stream)  # this shard's size is not known yet
            limit = shard.end if shard.state == "new" else shard.limit()
            if limit is not None and shard.next >= limit:
                shard.state = "done"
                self._advance(stream)
                continue
            length = stream.part_length(shard.next, limit)
            if stream.held and stream.held + length > stream.budget:
                return None
            return self._schedule(stream, stream.cursor, shard, length)
        return None

    def _advance(self, stream: StreamState) -> None:
        stream.cursor += 1
        self.cond.notify_all()  # a stream waiting as "ahead of the cursor" may now go on

    def _first_part_ahead(self, stream: StreamState) -> Optional[PartSlot]:
        """While the shard at the cursor waits for its size, start the first part of a later
        shard (small shards would otherwise cost one latency each), leaving room for one part:
        bytes reserved ahead of the cursor stay within ``budget - part_bytes``, so the part the
        reader needs next always fits once it has taken what is reserved before it."""
        for index in range(stream.cursor + 1, stream.hi):
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
            length = stream.part_length(shard.next, shard.end)
            if stream.held + length > stream.budget - stream.part_bytes:
                return None
            return self._schedule(stream, index, shard, length)
        return None

    def _schedule(self, stream: StreamState, index: int, shard: ShardState, length: int) -> PartSlot:
        slot = PartSlot(stream, shard, index, shard.next, length, first=shard.state == "new")
        shard.state = "sizing" if slot.first else shard.state
        shard.next += length
        at = len(stream.slots)
        while at and (stream.slots[at - 1].index, stream.slots[at - 1].offset) > (index, slot.offset):
            at -= 1
        stream.slots.insert(at, slot)  # the slots stay in stream order
        self._charge(slot, length)
        self.in_flight += 1
        for c in stream.sinks:
            c.add(parts=1)
            c.peak(peak_in_flight=self.in_flight)
        return slot

    # -- the fetching threads ------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self.cond:
                slot = None
                while slot is None:
                    if self.stopped or not (self.open_to_more or any(s.cursor < s.hi for s in self.streams)):
                        return
                    slot = self._next_part()
                    if slot is None and not self.work.wait(IDLE_S) and not any(s.cursor < s.hi for s in self.streams):
                        return  # (idle, nothing left: add() starts threads again)
                self.work.notify()  # another idle thread may find a part to fetch too
            self._fetch(slot)

    def _fetch(self, slot: PartSlot) -> None:
        shard, stream = slot.shard, slot.owner
        raw = None
        try:
            raw = RemoteRaw(shard.url, slot.offset, stream.opts, stream.sink, slot.offset + slot.length, shard.etag)
            if slot.first:
                self._sized(slot, shard, raw)
            if stream.warming:  # into the byte cache only: the reader reads it from there (passed() frees it)
                if not slot.cancelled:
                    raw.warm()
                return
            while True:
                n = self._room(slot)
                if n == 0:
                    break
                data = raw.read_chunk(n)
                with self.cond:
                    if slot.whole:
                        self._charge(slot, len(data) - n)  # the reservation made by _room, trued up
                    if not data or slot.cancelled or self.stopped:
                        break
                    slot.chunks.append(data)
                    slot.received += len(data)
                    self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the reader in the failed part's place
            with self.cond:
                if not stream.warming:  # (warming: the reader's own read of this part meets it, named)
                    slot.error = e
                shard.state = "done"  # nothing more of this shard: the reader stops at the error
        finally:
            if raw is not None:
                raw.close()
            with self.cond:
                slot.done = True
                self.in_flight -= 1
                if not slot.whole and not stream.warming:
                    self._charge(slot, -max(0, slot.length - slot.received))
                self._freed()

    def version(self, index: int) -> Optional[str]:
        """The version shard ``index`` is pinned to, once its first part has answered."""
        with self.cond:
            shard = self.shards.get(index)
            return shard.etag if shard is not None else None

    def passed(self, index: int, pos: int) -> None:
        """The reader (reading from the cache itself) is at byte ``pos`` of shard ``index``: the
        parts before are no longer ahead of it."""
        with self.cond:
            if index not in self.owners:
                return  # (a stream dropped)
            slots, freed = self.owners[index].slots, False
            while slots and (slots[0].index < index or (
                    slots[0].index == index and slots[0].offset + slots[0].length <= pos)):
                self._drop(slots.popleft())
                freed = True
            if freed:
                self._freed()

    def _sized(self, slot: PartSlot, shard: ShardState, raw: RemoteRaw) -> None:
        """The first part answered: the size and ETag of the object are known."""
        with self.cond:
            shard.size, shard.etag = raw.size, raw.etag
            if raw.etag is not None:
                _, size = self.pinned.setdefault(shard.url, (raw.etag, raw.size))
                if shard.size is None:  # (a pinned read through the cache states no size: the first one's)
                    shard.size = size
            if raw.ranged:
                shard.state = "known"
            else:  # the server sent the whole object: read it as one stream, charged as it arrives
                slot.whole = True
                raw.end = shard.end
                self._charge(slot, -slot.charge)
                shard.state = "done"
            self._freed()

    def _room(self, slot: PartSlot) -> int:
        """How many bytes to read next (0: stop). A whole object's stream waits for room in its
        budget: ahead of the cursor within ``budget - part_bytes`` (see :meth:`_first_part_ahead`);
        else unless it is the part the reader waits for and it has taken all it received (later
        reservations must not starve it)."""
        stream = slot.owner
        n = stream.opts.chunk_bytes
        with self.cond:
            if not slot.whole:
                return 0 if slot.cancelled or self.stopped else n
            n = min(n, stream.budget)

            def full() -> bool:
                if slot.index > stream.cursor:
                    return stream.held + n > stream.budget - stream.part_bytes
                if not slot.charge and stream.slots and stream.slots[0] is slot:
                    return False  # the reader waits for it: one chunk beyond the budget at most
                return stream.held + n > stream.budget

            while not (slot.cancelled or self.stopped) and full():
                self.cond.wait()
            if slot.cancelled or self.stopped:
                return 0
            self._charge(slot, n)  # reserved now: streams checking at the same time see it
            return n

    # -- the reader's side ---------------------------------------------------------------------

    def _cancel_through(self, stream: StreamState, index: int) -> None:
        while stream.slots and stream.slots[0].index <= index:
            self._drop(stream.slots.popleft())
        for i in range(stream.cursor, index + 1):
            shard = self.shards.get(i)
            if shard is not None:
                shard.state = "done"
        stream.cursor = max(stream.cursor, index + 1)
        self._freed()

    def take(self, index: int) -> object:
        """The next bytes of shard ``index`` in order, :data:`END` at its end; a failed part's
        error is raised in its place. Earlier shards of its stream are dropped (and no longer fetched)."""
        with self.cond:
            stream = self.owners.get(index)
            if stream is None:
                return END  # (a stream dropped: its reader closed it)
            if index > stream.lo and (stream.cursor < index or (stream.slots and stream.slots[0].index < index)):
                self._cancel_through(stream, index - 1)
            while True:
                if self.stopped:
                    raise SourceError("read-ahead was stopped while the shard was being read",
                                      url=self.shards[index].url if self.shards[index] else None)
                if stream.slots and stream.slots[0].index == index:
                    slot = stream.slots[0]
                    if slot.chunks:
                        data = slot.chunks.popleft()
                        self._charge(slot, -len(data))
                        self._freed(stream)
                        return data
                    if slot.error is not None:
                        self._drop(stream.slots.popleft())
                        raise slot.error
                    if slot.done:
                        self._drop(stream.slots.popleft())
                        self._freed()
                        continue
                elif stream.cursor > index or self.shards[index] is None or self.shards[index].state == "done":
                    return END
                self.cond.wait()

    def cancel(self, index: int) -> None:
        """The reader closed shard ``index`` early: drop its parts, fetch no more of it."""
        with self.cond:
            if index in self.owners:
                self._cancel_through(self.owners[index], index)

    def drop(self, base: int) -> None:
        """The stream added at ``base`` is read no more: drop its parts, fetch nothing more of it."""
        with self.cond:
            stream = self.owners.get(base)
            if stream is None:
                return  # (a stream of no shards, or dropped)
            self._cancel_through(stream, stream.hi - 1)
            self.streams.remove(stream)
            for i in range(stream.lo, stream.hi):
                del self.shards[i], self.owners[i]

    def stop(self) -> None:
        """Stop fetching; threads exit after their current chunk."""
        with self.cond:
            self.stopped = True
            for stream in self.streams:
                while stream.slots:
                    self._drop(stream.slots.popleft())
            self.cond.notify_all()
            self.work.notify_all()
