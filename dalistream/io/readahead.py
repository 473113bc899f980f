"""Background read-ahead of one worker's remote shards.

One daemon thread per :class:`ReadAhead` fetches the remote shards of a list in order, one GET
per shard, in ``chunk_bytes`` pieces, into a queue holding at most ``read_ahead_bytes`` across
shard boundaries (at least one chunk). The reader takes the chunks in the same order, so while
it parses shard ``i`` the thread is already receiving the rest of ``i`` and then ``i + 1``: the
next shard's first-byte latency is hidden and the network overlaps the parsing. A failure to
fetch a shard is handed to the reader of that shard, in its place, and the thread goes on with
the next shard (so a skipped bad shard does not stop the worker).
"""

from __future__ import annotations

import io
import threading
from collections import deque
from typing import Any, Deque, List, Optional, Sequence, Tuple, Union

from ..errors import SourceError
from .counters import IOCounters
from .local import CHUNK
from .options import RemoteOptions, remote_options
from .remote import RemoteRaw, is_fetched

_END = object()
Item = Union[bytes, BaseException, object]


class _Queue:
    """Chunks of consecutive shards, bounded in bytes; items are ``(shard index, item)``."""

    def __init__(self, budget: int) -> None:
        self.cond = threading.Condition()
        self.items: Deque[Tuple[int, Item]] = deque()
        self.held = 0
        self.budget = budget
        self.stopped = False
        self.cancelled = -1  # shards up to this index are no longer wanted

    def put(self, index: int, item: Item) -> bool:
        """Append (waiting for room); False once the queue is stopped."""
        size = len(item) if isinstance(item, bytes) else 0
        with self.cond:
            while (not self.stopped and index > self.cancelled and size and self.held
                   and self.held + size > self.budget):
                self.cond.wait()
            if self.stopped:
                return False
            if index > self.cancelled:
                self.items.append((index, item))
                self.held += size
                self.cond.notify_all()
            return True

    def _drop_through(self, index: int) -> None:
        while self.items and self.items[0][0] <= index:
            _, item = self.items.popleft()
            self.held -= len(item) if isinstance(item, bytes) else 0
        self.cond.notify_all()

    def take(self, index: int) -> Item:
        """The next item of shard ``index`` (earlier shards' leftovers are dropped)."""
        with self.cond:
            while True:
                self._drop_through(index - 1)
                if self.items:
                    found, item = self.items[0]
                    if found == index:
                        self.items.popleft()
                        self.held -= len(item) if isinstance(item, bytes) else 0
                        self.cond.notify_all()
                        return item
                    return _END  # the fetcher moved past this shard: it was cancelled
                if self.stopped:
                    raise SourceError("read-ahead was stopped while the shard was being read")
                self.cond.wait()

    def cancel(self, index: int) -> None:
        """The reader closed shard ``index`` early: drop its chunks, stop fetching it."""
        with self.cond:
            self.cancelled = max(self.cancelled, index)
            self._drop_through(index)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.items.clear()
            self.held = 0
            self.cond.notify_all()


def _fetch(queue: _Queue, urls: Sequence[str], start: int, opts: RemoteOptions, counters: Optional[IOCounters]) -> None:
    """The thread's body: fetch ``urls[start:]`` (remote ones) into ``queue`` in order."""
    for index in range(start, len(urls)):
        if not is_fetched(urls[index]):
            continue
        raw = None
        try:
            raw = RemoteRaw(urls[index], 0, opts, counters)
            while True:
                if queue.stopped:
                    return
                if index <= queue.cancelled:
                    break
                chunk = raw.read_chunk(opts.chunk_bytes)
                if not queue.put(index, chunk if chunk else _END):
                    return
                if not chunk:
                    break
        except BaseException as e:  # noqa: BLE001 - handed to the reader of this shard
            if not queue.put(index, e):
                return
        finally:
            if raw is not None:
                raw.close()


class _Prefetched(io.RawIOBase):
    """The reader's side of one shard: its chunks, taken from the queue in order."""

    def __init__(self, queue: _Queue, index: int) -> None:
        self._queue = queue
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
            item = self._queue.take(self._index)
            if item is _END:
                self._done = True
                return 0
            if isinstance(item, BaseException):
                self._done, self._error = True, item
                raise item
            self._view = memoryview(item)  # type: ignore[arg-type]
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n

    def close(self) -> None:
        if not self.closed and not self._done:
            self._queue.cancel(self._index)
        self._view = memoryview(b"")
        super().close()


class ReadAhead:
    """Opens the remote shards of ``urls`` through one background fetcher (see module doc).

    ``open(i)`` is fast for increasing ``i``; re-opening an earlier or the same shard restarts
    the fetcher there. ``close()`` stops the fetcher (it exits after its current chunk).
    """

    def __init__(self, urls: Sequence[str], options: Any = None, counters: Optional[IOCounters] = None) -> None:
        self.urls: List[str] = list(urls)
        self.opts = remote_options(options)
        self.counters = counters
        self._queue: Optional[_Queue] = None
        self._last = -1

    def open(self, index: int) -> io.BufferedReader:
        """The raw (not decompressed) stream of remote shard ``urls[index]``."""
        if not is_fetched(self.urls[index]):
            raise ValueError(f"not a remote shard: index {index}")
        if self._queue is None or index <= self._last:
            self._start(index)
        self._last = index
        return io.BufferedReader(_Prefetched(self._queue, index), CHUNK)  # type: ignore[arg-type]

    def _start(self, index: int) -> None:
        self.close()
        self._queue = _Queue(self.opts.read_ahead_bytes)
        threading.Thread(target=_fetch, args=(self._queue, self.urls, index, self.opts, self.counters),
                         name=f"dalistream-readahead-{index}", daemon=True).start()

    def close(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.stop()
