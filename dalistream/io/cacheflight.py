"""A block of the byte cache (:mod:`.cache`) being fetched in this process, readable as its bytes
arrive: a stream that wants a block another thread of its process is fetching (the read-ahead's,
or one started for the stream itself) reads what has come so far and waits only for the bytes it
asks for, never for the whole block; so the first batch waits for a round trip per column, not
for a block per column, on a far link. Processes other than the fetching one wait for the whole
block on its file lock, then read its file."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional


class Flight:
    """One block being fetched, its first byte at ``base`` in the object, from ``entry`` on first
    (where the one that started it reads first: a stream's start inside the block), then the bytes
    before ``entry``: so a stream that starts in the middle of a block waits for its own bytes,
    not for the block's first ones. ``done`` once whole (the object may end in it) or failed
    (``error``)."""

    def __init__(self, base: int, entry: int) -> None:
        self.base, self.entry = base, entry
        self.head = bytearray()  # [base, entry)
        self.tail = bytearray()  # [entry, …)
        self.head_done = entry == base
        self.done = False
        self.hit = False  # another process fetched it while this one waited: its file was read
        self.error: Optional[BaseException] = None
        self._cond = threading.Condition()

    def add_tail(self, chunk: bytes) -> None:
        """More bytes from ``entry`` on, in order (the fetch's progress)."""
        with self._cond:
            self.tail += chunk
            self._cond.notify_all()

    def add_head(self, chunk: bytes) -> None:
        """More bytes from ``base`` on, in order, up to ``entry``."""
        with self._cond:
            self.head += chunk
            self.head_done = len(self.head) >= self.entry - self.base
            self._cond.notify_all()

    def finish(self, data: Optional[bytes] = None, error: Optional[BaseException] = None) -> None:
        """The block is whole (``data``: all of it from ``base``, where progress did not bring it) or failed."""
        with self._cond:
            if data is not None:
                split = self.entry - self.base
                self.head[:] = data[:split]
                self.tail[:] = data[split:]
            self.head_done = self.done = True
            self.error = error if error is not None else self.error
            self._cond.notify_all()

    def __len__(self) -> int:
        """Bytes of the block (its length once :attr:`done`)."""
        return len(self.head) + len(self.tail)

    def behind(self, at: int) -> int:
        """How many bytes are still to come before offset ``at`` of the block is there (0: it is)."""
        split = self.entry - self.base
        with self._cond:
            if self.done:
                return 0
            if at < split:
                return 0 if self.head_done else at + 1 - len(self.head)
            return max(0, at + 1 - split - len(self.tail))

    def read_into(self, view: memoryview, at: int) -> int:
        """Bytes of the block from offset ``at`` into ``view``, as soon as at least one is there:
        how many (0: the block, so the object, ends before ``at``). The fetch's error, if it failed."""
        split = self.entry - self.base
        with self._cond:
            if at < split:  # before the entry: the head, fetched second
                while len(self.head) <= at and not (self.head_done or self.done):
                    self._cond.wait()
                part, at, stop = self.head, at, split
            else:
                while len(self.tail) <= at - split and not self.done:
                    self._cond.wait()
                part, at, stop = self.tail, at - split, len(self.tail)
            if len(part) <= at and self.error is not None:
                raise self.error
            n = max(0, min(len(view), len(part) - at, stop - at))
            view[:n] = memoryview(part)[at:at + n]
            return n

    def wait(self) -> None:
        """Until the block is whole or failed."""
        with self._cond:
            while not self.done:
                self._cond.wait()


class Flights:
    """The blocks being fetched in this process, by their file's path: :meth:`join` gives the
    one in flight, or starts it (``fly(flight)`` fetches it: in a new thread, or in the caller's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: Dict[str, Flight] = {}

    def join(self, path: str, base: int, entry: int, fly: Callable[[Flight], Any],
             here: bool) -> Flight:
        """The flight of ``path``: the one in flight, or a new one (from ``entry`` first), fetched
        by ``fly`` in this thread (``here``, returning once it is done) or in a new daemon thread."""
        with self._lock:
            flight = self._flights.get(path)
            if flight is not None:
                return flight
            flight = self._flights[path] = Flight(base, entry)

        def run() -> None:
            try:
                fly(flight)
                flight.finish()
            except BaseException as e:  # noqa: BLE001 - the readers of the flight meet it
                flight.finish(error=e)
            finally:
                with self._lock:
                    if self._flights.get(path) is flight:
                        del self._flights[path]

        if here:
            run()
        else:
            threading.Thread(target=run, name="dalistream-block", daemon=True).start()
        return flight
