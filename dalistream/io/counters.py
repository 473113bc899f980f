"""I/O counters: remote requests, retries and resumes (:class:`IOCounters`), and the time a reader
spent blocked on its byte stream (:class:`ReadClock`)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Dict, Iterator


class IOCounters:
    """Counters of remote I/O: ``requests`` (GETs started), ``retries`` (requests repeated after
    throttling, 5xx answers or connection failures), ``resumes`` (ranged GETs that continued a
    transfer cut mid-object), ``resumed_bytes`` (bytes those resumed GETs delivered) and
    ``bytes`` (bytes received); of the parallel ranged reads (:mod:`.parts`): ``parts`` (parts
    fetched), ``peak_in_flight`` (most part GETs open at once) and ``peak_buffered_bytes`` (most
    bytes held at once: received and not yet read, plus room reserved for parts in flight, never
    above ``read_ahead_bytes``); of the node-local byte cache (:mod:`.cache`), where one is used:
    ``cache_hits`` and ``cache_misses`` (blocks), ``cache_bytes`` (bytes read from blocks already
    cached), ``cache_written_bytes`` (fetched and kept), ``cache_uncached_bytes`` (fetched and not
    kept), ``cache_no_room`` (blocks fetched and not kept: the limit had no room for them),
    ``cache_damaged`` (cached blocks that failed their checksum or length check, fetched again),
    ``cache_evictions`` and ``cache_evicted_bytes`` (the bytes fetched are ``bytes``).
    Thread-safe; :meth:`as_dict` gives a snapshot; :meth:`since` the additive ones since a snapshot."""

    FIELDS = ("requests", "retries", "resumes", "resumed_bytes", "bytes", "parts", "peak_in_flight",
              "peak_buffered_bytes", "cache_hits", "cache_misses", "cache_bytes", "cache_written_bytes",
              "cache_uncached_bytes", "cache_no_room", "cache_damaged", "cache_evictions", "cache_evicted_bytes")
    PEAKS = ("peak_in_flight", "peak_buffered_bytes")  # highs, not sums: they have no per-epoch share

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Dict[str, int] = dict.fromkeys(self.FIELDS, 0)

    def add(self, **amounts: int) -> None:
        """Add to some counters, e.g. ``add(retries=1)``."""
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def peak(self, **values: int) -> None:
        """Raise some counters to at least the given values, e.g. ``peak(peak_in_flight=3)``."""
        with self._lock:
            for name, value in values.items():
                if value > self._values[name]:
                    self._values[name] = value

    def as_dict(self) -> Dict[str, int]:
        """A snapshot of all counters."""
        with self._lock:
            return dict(self._values)

    def since(self, before: Dict[str, int]) -> Dict[str, int]:
        """The additive counters' growth since the snapshot ``before`` (an :meth:`as_dict`)."""
        now = self.as_dict()
        return {k: now[k] - before.get(k, 0) for k in self.FIELDS if k not in self.PEAKS}

    def __getattr__(self, name: str) -> int:
        if name in IOCounters.FIELDS:
            return self.as_dict()[name]
        raise AttributeError(name)

    def __getstate__(self) -> dict:
        return {"values": self.as_dict()}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self._values.update(state["values"])

    def __repr__(self) -> str:
        return "IOCounters(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"


class ReadClock:
    """Seconds spent waiting for a stream's bytes: the time a reader was blocked on I/O (for a
    remote stream, on its read-ahead), the opening of the stream included."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Count the time spent in the ``with`` block (opening a stream: a remote stream's first
        bytes, a gzip or ``pipe:`` stream's first chunk, peeked for the gzip magic)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0
