"""Objects read by ranged requests (object stores, HTTP), through the store of their scheme
(:mod:`.stores`), and the operations every store shares: list, stat, read, write, with retries.

One GET per range, read sequentially in large chunks. A transfer cut mid-object continues with
a ranged GET from the exact byte offset, pinned to the version of the first answer (an ETag or a
generation), so two versions of an object are never spliced. Throttling (SlowDown, 429, 503) and
other 5xx answers are retried with exponential backoff and full jitter, at most ``max_attempts``
times in a row without progress, then a :class:`SourceError`. Missing objects, 403s, unknown
buckets, DNS failures and refused connections fail at once with a :class:`SourceError` naming the
URL and where the credentials came from (credentials redacted; server messages, which may quote
request details, are never copied).

The node-local byte cache (``options.cache``, :mod:`.cache`) sits at one place: :meth:`RemoteRaw._connect`,
the one call that opens a range of an object. With a cache, a stream first states the object
(its version and size: one request, so a replaced object is seen; a process states an object at
most once per ``version_check_s``, :mod:`.versions`, and a worker states those it is about to
read ahead, in parallel: :func:`state_ahead`) unless its version is already pinned, then reads
its range through the cache, keyed by :func:`cache_key` and the version; the blocks the cache
lacks are fetched by ranged reads pinned to that version, with the retries and resumes above.
An object without a version is read without caching (said once).
"""

from __future__ import annotations

import dataclasses
import io
import random
import time
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..errors import SourceError
from .counters import IOCounters
from . import versions
from .options import remote_options
from .retry import Retry, call_with_retries, classify
from .stores import ObjectInfo, cache_name, is_ranged, store_for
from .stores.base import Answer, Data, read_all

TOTALS = IOCounters()  # every remote request of this process (see IOCounters)
PROGRESS_BYTES = 64 << 10  # the reads of a block being fetched for the cache, given out as they come
#: The cache's counters as the I/O counters name them (``remote_bytes`` is ``bytes`` already).
CACHE_COUNTERS = {"hits": "cache_hits", "misses": "cache_misses", "cache_bytes": "cache_bytes",
                  "written_bytes": "cache_written_bytes", "uncached_bytes": "cache_uncached_bytes",
                  "no_room": "cache_no_room", "damaged": "cache_damaged", "evictions": "cache_evictions",
                  "evicted_bytes": "cache_evicted_bytes"}


def cache_key(url: str) -> str:
    """The name of an object in the byte cache: ``url`` as the same object at any version its URL
    may name, however its URL is signed (:func:`~.stores.cache_name`)."""
    return cache_name(url)


class RemoteRaw(io.RawIOBase):
    """One remote object as a raw stream of bytes ``[offset, end)`` (``end`` None: to the end of
    the object); resumes cut transfers from the exact byte, pinned to ``etag`` (if given, else
    to the ETag of the first answer).

    ``size`` is the object's size in bytes (``None`` if the server does not say); ``ranged`` is
    False when an HTTP server ignored the range and sent the whole object (then the bytes before
    ``offset`` were read and dropped, and those after ``end`` are never read).
    """

    def __init__(self, url: str, offset: int = 0, options: Any = None, counters: Optional[IOCounters] = None,
                 end: Optional[int] = None, etag: Optional[str] = None) -> None:
        self.url = url
        self.opts = remote_options(options)
        self.store = store_for(url, self.opts)
        self._counters = [TOTALS] + ([counters] if counters is not None else [])
        self._sink = counters
        self._rng = random.Random()  # jitter only: never decides data
        self.cache = self.opts.cache
        self.pos = offset
        self.end = end
        self.size: Optional[int] = None
        self.etag: Optional[str] = etag
        self.ranged = True
        self._body: Any = None
        self._resumed = False
        self._connect(first=True)

    def _open(self) -> Answer:
        """Open the range from the current position at the store: the one place a range of an
        object is asked for (through a cache, the cache asks: :meth:`_connect`)."""
        self._add(requests=1)
        return self.store.open_range(self.url, self.pos, self.end, self.etag)

    def _version(self) -> "tuple[Optional[str], Optional[int]]":
        """The object's version and size, as this process stated it less than ``version_check_s``
        ago, or states it now (:mod:`.versions`: one statement however many streams want it)."""
        return versions.stated(cache_key(self.url), self.opts.version_check_s,
                               partial(state_object, self.url, self.opts, self._counters[1:]))

    def _fetch(self, url: str, version: Optional[str], start: int, stop: int,
               progress: Optional[Callable[[bytes], None]] = None) -> bytes:
        """Bytes ``[start, stop)`` of this object from the store (for the cache): ranged reads
        pinned to ``version``, retried and resumed as any stream's; ``progress`` is given them as
        they arrive, in reads of :data:`PROGRESS_BYTES` (a reader waiting for a block's first
        bytes waits for those alone)."""
        opts = dataclasses.replace(self.opts, cache=None)
        raw = RemoteRaw(self.url, start, opts, self._sink, end=stop, etag=version)
        out = bytearray()
        step = PROGRESS_BYTES if progress is not None else max(opts.chunk_bytes, 1 << 20)
        try:
            while True:
                data = raw.read_chunk(step)
                if not data:
                    return bytes(out)
                out += data
                if progress is not None:
                    progress(data)
        finally:
            raw.close()

    def _count(self, amounts: Dict[str, int]) -> None:
        self._add(**{CACHE_COUNTERS[k]: v for k, v in amounts.items() if k in CACHE_COUNTERS})

    def _connect(self, first: bool) -> None:
        if self.cache is not None:  # through the cache: a request only to state the object's version
            if self.etag is None:
                self.etag, self.size = self._version()
            # (to the object's end at most: a block is never asked for from a byte past it)
            self._body = self.cache.open(cache_key(self.url), self.etag, self.pos, self.limit(), self._fetch,
                                         self._count)
            return
        answer = call_with_retries(self._open, self.url, self.opts, self._counters, self._rng, first=first,
                                   store=self.store)
        self._body = answer.body
        self.size = answer.size if answer.size is not None else self.size
        self.etag = answer.version or self.etag
        self.ranged = self.ranged and answer.ranged

    def limit(self) -> Optional[int]:
        """The byte offset where this stream ends, if known."""
        if self.end is None:
            return self.size
        return self.end if self.size is None else min(self.end, self.size)

    def _add(self, **amounts: int) -> None:
        for c in self._counters:
            c.add(**amounts)

    def readable(self) -> bool:
        return True

    def read_chunk(self, n: int) -> bytes:
        """Up to ``n`` bytes (``b""`` only at the end of the object), resuming after cuts."""
        failures = 0
        while True:
            limit = self.limit()
            if limit is not None:
                if self.pos >= limit:
                    return b""
                n = min(n, limit - self.pos)
            try:
                data = self._body.read(n)
            except Exception as e:  # noqa: BLE001 - classified: fatal errors re-raised
                mapped = classify(e, self.url, first=False, store=self.store)
                if not isinstance(mapped, Retry):
                    raise mapped from None
                data = None
            if data:
                self.pos += len(data)
                if self.cache is None:  # (through a cache, the bytes fetched are counted as fetched)
                    self._add(bytes=len(data), resumed_bytes=len(data) if self._resumed else 0)
                return data
            if data is not None and limit is None:
                return b""  # no length announced: the end of the body is the end
            failures += 1  # cut before the announced end: continue with a ranged GET
            if failures >= self.opts.max_attempts:
                raise SourceError(f"transfer cut {failures} times at byte {self.pos} without progress", url=self.url)
            self._close_body()
            if failures > 1:
                time.sleep(self.opts.backoff(failures - 1, self._rng))
            self._add(resumes=1)
            self._resumed = True
            self._connect(first=False)

    def warm(self) -> bool:
        """With a cache: fetch this stream's range into it without reading it (:meth:`~.cache.ByteCache.warm`)."""
        return self.cache is not None and self.cache.warm(cache_key(self.url), self.etag, self.pos, self.limit(),
                                                          self._fetch, self._count)

    def readinto(self, buffer: Any) -> int:
        if self.cache is not None and self._body is not None:  # straight from the cache's files
            limit = self.limit()
            view = memoryview(buffer).cast("B")
            if limit is not None:
                if self.pos >= limit:
                    return 0
                view = view[:limit - self.pos]
            n = self._body.readinto(view)
            if n:
                self.pos += n
                return n
        data = self.read_chunk(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _close_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close
                pass

    def close(self) -> None:
        self._close_body()
        super().close()


def state_object(url: str, opts: Any, counters: Sequence[IOCounters] = ()) -> "tuple[Optional[str], Optional[int]]":
    """``(version, size)`` of the object ``url`` as its store states it now (one request, retried)."""
    def stat(store: Any) -> ObjectInfo:
        for c in [TOTALS, *counters]:
            c.add(requests=1)
        return store.stat(url)

    info = _retried(url, opts, stat, counters=counters)
    return info.version, info.size


def state_ahead(urls: Sequence[str], options: Any, counters: Optional[IOCounters] = None) -> None:
    """Through a byte cache: have the versions of the remote objects ``urls`` stated ahead, in
    parallel (:func:`.versions.ahead`), so that streams opened one after the other find them
    stated; nothing without a cache."""
    opts = remote_options(options)
    if opts.cache is None:
        return
    sinks = [counters] if counters is not None else []
    versions.ahead([(cache_key(url), partial(state_object, url, opts, sinks)) for url in dict.fromkeys(urls)
                    if is_ranged(url)], opts.version_check_s)


def open_remote(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None,
                counters: Optional[IOCounters] = None) -> io.BufferedReader:
    """Open ``url`` (an object read by ranged requests) as a buffered stream of its bytes from
    ``offset`` (one GET at a time; :class:`~dalistream.io.parts.PartFetcher` fetches parts in
    parallel)."""
    raw = RemoteRaw(url, offset, options, counters)
    return io.BufferedReader(raw, min(raw.opts.chunk_bytes, 8 << 20))


# -- listing, metadata, small objects: any store, with retries ----------------------------------

def _retried(url: str, options: Any, fn, what: str = "object", counters: Sequence[IOCounters] = ()) -> Any:
    opts = remote_options(options)
    store = store_for(url, opts)
    if store.local:  # nothing to retry, and no stall timer per call (a scan states every file)
        return fn(store)
    return call_with_retries(lambda: fn(store), url, opts, [TOTALS, *counters], random.Random(), what=what,
                             store=store)


def list_objects(prefix: str, options: Optional[Mapping[str, Any]] = None) -> List[ObjectInfo]:
    """Every object whose URL starts with ``prefix``, sorted by URL (all pages)."""
    def listing(store: Any) -> List[ObjectInfo]:
        TOTALS.add(requests=1)
        return store.list(prefix)

    return _retried(prefix, options, listing, "prefix")


def stat_object(url: str, options: Optional[Mapping[str, Any]] = None) -> ObjectInfo:
    """The size and version of an object (a :class:`SourceError` if it cannot be stated)."""
    def stat(store: Any) -> ObjectInfo:
        TOTALS.add(requests=1)
        return store.stat(url)

    return _retried(url, options, stat)


def read_bytes(url: str, options: Optional[Mapping[str, Any]] = None) -> bytes:
    """The whole content of a (small) object of any store, e.g. a manifest."""
    if is_ranged(url):  # (a manifest, not a shard: never through the byte cache)
        with open_remote(url, 0, dataclasses.replace(remote_options(options), cache=None)) as f:
            return f.read()

    def whole(store: Any) -> bytes:
        answer = store.open_range(url, 0, None, None)
        try:
            return read_all(answer.body)
        finally:
            answer.body.close()

    return _retried(url, options, whole)


def write_bytes(url: str, data: Data, options: Optional[Mapping[str, Any]] = None) -> None:
    """Store ``data`` (bytes, or a local file's path) as the object ``url`` of any store."""
    def write(store: Any) -> None:
        TOTALS.add(requests=1)
        store.write(url, data)

    _retried(url, options, write)


def delete_object(url: str, options: Optional[Mapping[str, Any]] = None) -> None:
    """Remove the object ``url`` of any store (none there is no error)."""
    def delete(store: Any) -> None:
        TOTALS.add(requests=1)
        store.delete(url)

    _retried(url, options, delete)
