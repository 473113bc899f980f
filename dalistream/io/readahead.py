"""Read-ahead of one worker's remote shards: the reader's side of :class:`~.parts.PartFetcher`.

:class:`ReadAhead` opens the remote shards of a list in order as sequential streams. Behind them
one :class:`~.parts.PartFetcher` keeps ``parts_in_flight`` ranged GETs of ``part_bytes`` open,
running on from the end of one shard into the next, within ``read_ahead_bytes``: the next
shard's first-byte latency is hidden and one worker is not capped at one connection's speed.
A failure to fetch a shard is raised by the reader of that shard, and fetching goes on with the
next shard (so a skipped bad shard does not stop the worker). Through the node-local byte cache
the reader reads each shard from the cache in its own thread (a block there is a file read, as
for a local shard) while the fetcher only fills the cache ahead of it, within the same budget.
"""

from __future__ import annotations

import io
from typing import Any, List, Optional, Sequence

from .counters import IOCounters
from .local import CHUNK
from .options import remote_options
from .parts import END, PartFetcher, Range
from .remote import RemoteRaw, is_ranged


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
    told how far the reader is."""

    def __init__(self, raw: RemoteRaw, fetcher: PartFetcher, index: int) -> None:
        self._raw, self._fetcher, self._index = raw, fetcher, index

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)
        self._fetcher.passed(self._index, self._raw.pos)
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            self._fetcher.cancel(self._index)
        super().close()


class ReadAhead:
    """Opens the remote shards of ``urls`` (bytes ``ranges[i]`` of shard ``i`` if given) through
    one :class:`~.parts.PartFetcher` (see module doc).

    ``open(i)`` is fast for increasing ``i``; re-opening an earlier or the same shard restarts
    the fetcher there. ``close()`` stops the fetcher (its threads exit after their current chunk).
    """

    def __init__(self, urls: Sequence[str], options: Any = None, counters: Optional[IOCounters] = None,
                 ranges: Optional[Sequence[Range]] = None) -> None:
        self.urls: List[str] = list(urls)
        self.ranges = list(ranges) if ranges is not None else None
        self.opts = remote_options(options)
        self.counters = counters
        self._fetcher: Optional[PartFetcher] = None
        self._last = -1

    def open(self, index: int) -> io.BufferedReader:
        """The raw (not decompressed) stream of remote shard ``urls[index]`` (its range, if given)."""
        if not is_ranged(self.urls[index]):
            raise ValueError(f"not a remote shard: index {index}")
        if self._fetcher is None or index <= self._last:
            self.close()
            self._fetcher = PartFetcher(self.urls, self.opts, self.counters, self.ranges, index)
        self._last = index
        if self._fetcher.warming:  # read from the byte cache in this thread; the fetcher fills it ahead
            start, end = self.ranges[index] if self.ranges is not None else (0, None)
            raw = RemoteRaw(self.urls[index], start, self.opts, self.counters, end, self._fetcher.version(index))
            return io.BufferedReader(_Cached(raw, self._fetcher, index), CHUNK)  # type: ignore[arg-type]
        return io.BufferedReader(_Prefetched(self._fetcher, index), CHUNK)  # type: ignore[arg-type]

    def close(self) -> None:
        fetcher, self._fetcher = self._fetcher, None
        if fetcher is not None:
            fetcher.stop()
