"""Read-ahead of one worker's remote shards: the reader's side of :class:`~.parts.PartFetcher`.

:class:`ReadAhead` opens the remote shards of a list in order as sequential streams. Behind them
one :class:`~.parts.PartFetcher` keeps ``parts_in_flight`` ranged GETs of ``part_bytes`` open,
running on from the end of one shard into the next, within ``read_ahead_bytes``: the next
shard's first-byte latency is hidden and one worker is not capped at one connection's speed.
A worker reading many columns has one fetcher for all of them: each column's sequence is one of
its streams, added when the column is made, so every column's first parts are asked for at once
and later ones in the order the columns need them, within the worker's budget.
A failure to fetch a shard is raised by the reader of that shard, and fetching goes on with the
next shard (so a skipped bad shard does not stop the worker). Through the node-local byte cache
the reader reads each shard from the cache in its own thread (a block there is a file read, as
for a local shard) while the fetcher only fills the cache ahead of it, within the same budget,
started at the first shard with a block missing (epochs read from the cache start no thread).
"""

from __future__ import annotations

import io
from typing import Any, List, Optional, Sequence

from .counters import IOCounters
from .local import CHUNK, copy_tail
from .options import remote_options
from .parts import END, PartFetcher, Range
from .remote import RemoteRaw, cache_key, is_ranged, state_ahead

STATE_AHEAD = 2  # shards after the one opened whose versions are stated ahead (through a cache)
HEAD_BYTES = 64 << 10  # what a cached shard's first read (its gzip check) asks for


class _Prefetched(io.RawIOBase):
    """The reader's side of one shard: its bytes, taken from the fetcher in order."""

    def __init__(self, fetcher: PartFetcher, index: int) -> None:
        self._fetcher = fetcher
        self._index = index
        self._view = memoryview(b"")
        self._done = False
        self._error: Optional[BaseException] = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._error is not None:
            raise self._error
        if not self._view:
            if self._done:
                return 0
            try:
                item = self._fetcher.take(self._index)
            except BaseException as e:
                self._done, self._error = True, e
                raise
            if item is END:
                self._done = True
                return 0
            self._view = memoryview(item)  # type: ignore[arg-type]
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n

    def close(self) -> None:
        if not self.closed and not self._done:
            self._fetcher.cancel(self._index)
        self._view = memoryview(b"")
        super().close()


class _Cached(io.RawIOBase):
    """The reader's side of one shard read through the byte cache: its bytes read from the cache
    (a block the read-ahead has not fetched yet is fetched here, or waited for), the read-ahead
    (if one runs) told how far the reader is. Unbuffered, as a local part is (:class:`~.local.FileRange`):
    reads go straight into the caller's buffer; :meth:`peek` holds the first bytes read for the
    gzip check."""

    def __init__(self, raw: RemoteRaw, fetcher: Optional[PartFetcher], index: int) -> None:
        self._raw, self._fetcher, self._index = raw, fetcher, index
        self._head = memoryview(b"")

    def readable(self) -> bool:
        return True

    def peek(self, n: int = 1) -> bytes:
        """The next bytes (at least ``n`` unless the range ends first, up to :data:`HEAD_BYTES`), not consumed."""
        if len(self._head) < n:
            buffer = bytearray(max(n, HEAD_BYTES))
            got = len(self._head)
            buffer[:got] = self._head
            while got < n:
                k = self._read(memoryview(buffer)[got:])
                if not k:
                    break
                got += k
            self._head = memoryview(buffer)[:got]
        return bytes(self._head)

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n, self._head = copy_tail(memoryview(buffer).cast("B"), self._head)
            return n
        return self._read(buffer)

    def _read(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)
        if self._fetcher is not None:
            self._fetcher.passed(self._index, self._raw.pos)
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            if self._fetcher is not None:
                self._fetcher.cancel(self._index)
        super().close()


class ReadAhead:
    """Opens the remote shards of ``urls`` (bytes ``ranges[i]`` of shard ``i`` if given) through
    one :class:`~.parts.PartFetcher` (see module doc): its own, made when a shard is first opened,
    or ``fetcher``, a worker's, shared by its columns' sequences, which fetches this one's parts
    with theirs from now on (through a byte cache, from the first shard with a block missing).

    ``open(i)`` is fast for increasing ``i``; re-opening an earlier or the same shard restarts
    the fetching there. ``close()`` stops it (its threads exit after their current chunk).
    """

    def __init__(self, urls: Sequence[str], options: Any = None, counters: Optional[IOCounters] = None,
                 ranges: Optional[Sequence[Range]] = None, fetcher: Optional[PartFetcher] = None) -> None:
        self.urls: List[str] = list(urls)
        self.ranges = list(ranges) if ranges is not None else None
        self.opts = remote_options(options)
        self.counters = counters
        self._shared = fetcher
        self._fetcher: Optional[PartFetcher] = None
        self._base = 0  # where this sequence's shards are in the fetcher's list
        self._last = -1
        if fetcher is not None and self.opts.cache is None:
            self._start(0)

    def _start(self, index: int) -> None:
        """Have this sequence's shards fetched from ``index`` on."""
        if self._shared is not None:
            self._fetcher = self._shared
            self._base = self._shared.add(self.urls, self.opts, self.counters, self.ranges, index)
        else:
            self._fetcher, self._base = PartFetcher(self.urls, self.opts, self.counters, self.ranges, index), 0

    def open(self, index: int) -> io.RawIOBase:
        """The raw (not decompressed) stream of remote shard ``urls[index]`` (its range, if given):
        buffered, or (through a byte cache) unbuffered with a :meth:`~_Cached.peek`."""
        if not is_ranged(self.urls[index]):
            raise ValueError(f"not a remote shard: index {index}")
        if self.opts.cache is not None:
            return self._cached(index)
        if self._fetcher is None or index <= self._last:
            self.close()
            self._start(index)
        self._last = index
        return io.BufferedReader(_Prefetched(self._fetcher, self._base + index), CHUNK)  # type: ignore[arg-type]

    def _cached(self, index: int) -> io.RawIOBase:
        """Through the byte cache: the shard's range read from the cache in this thread (a block
        being fetched is read as its bytes arrive); the read-ahead fills the cache ahead of it
        from the first shard one of whose blocks is missing on (shards read from the cache alone
        start no thread)."""
        if index <= self._last:
            self.close()
        self._last = index
        start, end = self.ranges[index] if self.ranges is not None else (0, None)
        version = self._fetcher.version(self._base + index) if self._fetcher is not None else None
        raw = RemoteRaw(self.urls[index], start, self.opts, self.counters, end, version)
        state_ahead(self.urls[index + 1:index + 1 + STATE_AHEAD], self.opts, self.counters)  # (opened after this)
        if self._fetcher is None and not self.opts.cache.holds(cache_key(raw.url), raw.etag, start, raw.limit()):
            self._start(index)
        return _Cached(raw, self._fetcher, self._base + index)

    def close(self) -> None:
        fetcher, self._fetcher = self._fetcher, None
        if fetcher is self._shared and fetcher is not None:
            fetcher.drop(self._base)  # (the worker's fetcher goes on with its other sequences)
        elif fetcher is not None:
            fetcher.stop()
