"""A node-local cache of remote bytes, shared by every process of a node: a layer under any store.

A store reads a byte range of an object through :meth:`ByteCache.read` (or streams it through
:meth:`ByteCache.open`), giving the object's version and its own ranged read ``fetch(url,
version, start, end, progress) -> bytes`` (bytes ``[start, end)``, fewer at the object's end;
``progress``, when not None, may be given them as they arrive). The cache works in aligned
blocks of ``block_bytes``: a block it holds is read from the local disk; a missing one is
fetched whole, once per node however many processes want it at the same time (the others wait
on its lock and then read the file), written to the disk and read from there; a stream of the
fetching process reads it as its bytes arrive (:mod:`.cacheflight`).
Blocks are keyed by (URL, version): a changed object is never served stale. The files, their
checks and the locks are :mod:`.cachefiles`'s; the eviction rule (least recently used, by size)
is :mod:`.cachesim`'s model.

The cache only saves time, so it never stops a job: a limit below one block streams every read
without caching (said once); a block that finds no room (every block held by a reader) is read
without caching; a full or failing disk stops the writing of blocks (one warning) while blocks
already there are still read; an object without a version is never cached. ``counters()`` gives
``hits``, ``misses`` (blocks), ``remote_bytes`` (fetched), ``cache_bytes`` (read from blocks that
were there), ``written_bytes``, ``uncached_bytes`` (fetched and not kept), ``evictions`` and
``evicted_bytes``: a plain dict of this process's reads, to be summed over processes.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from typing import Dict, Optional, Tuple

from ..errors import ConfigError, redact
from . import cachefiles as files
from .cachefiles import auto_limit, parse_size
from .cachesim import eviction_slack
from .cacheflight import Flight, Flights
from .cacherange import CachedRange, Count, Fetch, Piece, Progress
from .folder import folder_problem

log = logging.getLogger(__name__)

BLOCK_BYTES = 4 << 20  # measured: hits as fast as at 8-16 MiB, half the over-fetch of 8 MiB without affinity
COUNTERS = ("hits", "misses", "remote_bytes", "cache_bytes", "written_bytes", "uncached_bytes", "evictions",
            "evicted_bytes")


class ByteCache:
    """Blocks of remote objects in ``folder`` (see the module doc), at most ``limit_bytes`` of
    them in all (``None``: :func:`auto_limit`). Refuses a folder another user could plant blocks
    in (:func:`~.folder.folder_problem`). Thread-safe; pickles as its settings (each process
    keeps its own counters)."""

    def __init__(self, folder: str, limit_bytes: Optional[int], block_bytes: int = BLOCK_BYTES) -> None:
        if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 4096:
            raise ConfigError(f"the cache's block size must be an integer >= 4096, got {block_bytes!r}")
        limit = None if limit_bytes is None else parse_size(limit_bytes)
        folder = os.fspath(folder)
        problem = folder_problem(folder)
        root = os.path.join(folder, files.NAMESPACE)
        if problem is None:
            try:
                problem = None if files.real_folder(root) else f"{root} is not a folder (a symbolic link?)"
                problem = problem or folder_problem(root)
            except OSError as e:
                problem = e.strerror or str(e)
        if problem is not None:
            raise ConfigError(f"cache {folder!r} cannot hold the byte cache: {problem}",
                              hint="pass a folder of your own on a local disk (cache=...), or cache=None")
        self.folder, self.block_bytes = folder, block_bytes
        self._start()
        files.tag_folder(self.root)
        if not os.path.exists(self._ledger):
            self._rescan()
        self.limit_bytes = auto_limit(root, self.usage()) if limit is None else limit
        if self.limit_bytes < block_bytes + files.HEADER.size:
            self._warn("small", f"the cache limit ({self.limit_bytes} bytes) is below one block ({block_bytes} "
                                f"bytes): reading without caching")

    def _start(self) -> None:
        self.root = os.path.join(self.folder, files.NAMESPACE)
        self._ledger = os.path.join(self.root, "usage")
        self._evict_lock = os.path.join(self.root, "evict.lock")
        self._lock = threading.Lock()
        self._counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._warned: set = set()
        self._writes_off: Optional[str] = None
        self._subdirs: set = set()
        self._local = threading.local()
        self._flights = Flights()  # blocks being fetched in this process, readable as they come

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "limit_bytes": self.limit_bytes, "block_bytes": self.block_bytes}

    def __setstate__(self, state: dict) -> None:
        self.folder, self.limit_bytes, self.block_bytes = state["folder"], state["limit_bytes"], state["block_bytes"]
        self._start()
        self._warned.add("small")  # said once, by the process that opened the cache

    def __repr__(self) -> str:
        return f"ByteCache({self.folder!r}, limit_bytes={self.limit_bytes}, block_bytes={self.block_bytes})"

    # -- the reading side ----------------------------------------------------------------------

    def open(self, url: str, version: Optional[str], start: int, end: Optional[int], fetch: Fetch,
             count: Optional[Count] = None) -> io.RawIOBase:
        """Bytes ``[start, end)`` of (url, version) as a raw stream (``end`` None: to the object's
        end); blocks are fetched as the stream reaches them. ``version`` None (a store that
        gives none): streamed without caching, since a change could not be seen. ``count``
        receives the counters (module doc) of this stream's reads, as they happen, beside the
        process's own :meth:`counters` (a reader's share of them)."""
        return CachedRange(self, url, version, start, end, fetch, count)

    def read(self, url: str, version: Optional[str], start: int, end: int, fetch: Fetch,
             count: Optional[Count] = None) -> bytes:
        """Bytes ``[start, end)`` of (url, version) (fewer at the object's end)."""
        out = bytearray(max(0, end - start))
        view = memoryview(out)
        got = 0
        with self.open(url, version, start, end, fetch, count) as stream:
            while got < len(out):
                n = stream.readinto(view[got:])
                if not n:
                    break
                got += n
        del view
        return bytes(out) if got == len(out) else bytes(out[:got])

    def holds(self, url: str, version: Optional[str], start: int, end: Optional[int]) -> bool:
        """Whether every block of ``[start, end)`` of (url, version) is in the cache, by its file
        (the reader checks each block when it reads it): a stream that finds them all needs no
        read-ahead. False for an object without a version, or a range of unknown end."""
        if version is None or end is None:
            return False
        pos = start // self.block_bytes * self.block_bytes
        try:
            while pos < end:
                held = self._held(self._paths(url, version, pos // self.block_bytes)[0])
                if held < 0:
                    return False
                if held < self.block_bytes:
                    return pos + held >= end  # the object ends in this block
                pos += self.block_bytes
        except OSError:
            return False
        return True

    def _held(self, path: str) -> int:
        """The length of the block in ``path`` as its file says (-1: not there)."""
        try:
            return os.stat(path).st_size - files.HEADER.size
        except FileNotFoundError:
            return -1

    def warm(self, url: str, version: Optional[str], start: int, end: Optional[int], fetch: Fetch,
             count: Optional[Count] = None) -> bool:
        """Fetch the blocks of ``[start, end)`` (``end`` None: to the object's end) the cache
        lacks, without reading them: the read-ahead of a reader that reads from the cache itself.
        Blocks already there are left as they are (not counted: the reader counts its reads).
        False when nothing can be kept (no version, no room, writing off)."""
        if version is None or not self.caching:
            return False
        self._local.count = count
        try:
            pos = start // self.block_bytes * self.block_bytes
            while (end is None or pos < end) and self.caching:
                index = pos // self.block_bytes
                path, digest = self._paths(url, version, index)
                held = self._held(path)  # (the reader checks it when it reads it)
                if held >= 0:
                    if held < self.block_bytes:
                        break  # the object ends in this block
                    pos += self.block_bytes
                    continue
                flight = self._flight(path, digest, url, version, index, max(pos, start), fetch, here=True)
                flight.wait()  # (fetched here, or by the stream that wanted it first)
                if flight.error is not None or len(flight) < self.block_bytes:
                    break  # the object ends in this block (a failed fetch: the reader meets it)
                pos += self.block_bytes
        except OSError as e:
            self._warn("paths", f"blocks not cached: {e.strerror or e}; they are read without caching")
            return False
        finally:
            self._local.count = None
        return True

    def counters(self) -> Dict[str, int]:
        """A snapshot of this process's counters (module doc)."""
        with self._lock:
            return dict(self._counters)

    def usage(self) -> int:
        """Bytes the blocks take, as the ledger has it."""
        with files.FileLock(self._ledger) as ledger:
            return ledger.value()

    def _add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._counters[name] += amount
        count = getattr(self._local, "count", None)  # the reading stream's (CachedRange sets it)
        if count is not None:
            count(amounts)

    def _warn(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("%s (cache %s)", message, self.folder)

    @property
    def caching(self) -> bool:
        """Whether a missing block is written (False below one block, or after a failing write)."""
        return self._writes_off is None and self.limit_bytes >= self.block_bytes + files.HEADER.size

    # -- one block -----------------------------------------------------------------------------

    def _paths(self, url: str, version: str, index: int) -> Tuple[str, bytes]:
        key = files.key_name(url, version, self.block_bytes)
        sub = os.path.join(self.root, key[:2])
        if sub not in self._subdirs:
            if not files.real_folder(sub):
                raise OSError(f"{sub} is not a folder (a symbolic link?)")
            self._subdirs.add(sub)
        return os.path.join(sub, f"{key}-{index:08x}.blk"), files.block_digest(url, version, self.block_bytes, index)

    def piece(self, url: str, version: Optional[str], pos: int, end: Optional[int], fetch: Fetch) -> Piece:
        """The bytes from ``pos`` on, up to the end of its block (and ``end``): the block's file
        when it is kept (fetched first if missing), else the bytes fetched."""
        index = pos // self.block_bytes
        if version is None:
            self._warn("unversioned", "a store gave no version for an object: it is read without caching")
            return self._uncached(url, None, pos, end, fetch)
        try:
            path, digest = self._paths(url, version, index)
        except OSError as e:
            self._warn("paths", f"blocks not cached: {e.strerror or e}; they are read without caching")
            return self._uncached(url, version, pos, end, fetch)
        got = self._hit(path, digest, index, True)
        if got is not None:
            return got
        if not self.caching:
            return self._uncached(url, version, pos, end, fetch)
        flight = self._flight(path, digest, url, version, index, pos, fetch, here=False)
        return Piece(index * self.block_bytes, self.block_bytes, False, None, b"", False, flight)

    def _flight(self, path: str, digest: bytes, url: str, version: str, index: int, entry: int, fetch: Fetch,
                here: bool) -> Flight:
        """The block's :class:`~.cacheflight.Flight` in this process: the one in flight, or one
        started (in this thread when ``here``, else in a new one) that fetches the block, its file
        lock held (so once per node), from ``entry`` on first, keeps it if there is room, and
        gives its bytes as they come: a block another process fetched meanwhile is read from its
        file."""
        count = getattr(self._local, "count", None)  # (the counters of the stream that wants it)

        def fly(flight: Flight) -> None:
            before, self._local.count = getattr(self._local, "count", None), count
            lock = path[:-4] + ".lock"
            lock_fd = files.lock_fetch(lock)
            try:
                got = self._hit(path, digest, index, True)  # fetched by another process while this one waited
                if got is None:
                    self._fill(path, digest, url, version, index, fetch, flight)
                else:
                    flight.hit = True
                    flight.finish(os.pread(got.fd, got.length, files.HEADER.size))
                    os.close(got.fd)  # type: ignore[arg-type]
            finally:
                files.unlock_fetch(lock_fd, lock)
                self._local.count = before

        return self._flights.join(path, index * self.block_bytes, entry, fly, here)

    def _hit(self, path: str, digest: bytes, index: int, count: bool) -> Optional[Piece]:
        try:
            fd, length, why = files.open_block(path, digest)
        except OSError as e:
            self._warn("read", f"a cached block could not be read ({e.strerror or e}): fetching it")
            return None
        if why is not None:
            self._warn("bad:" + why, f"a cached block was not trusted ({why}): removed and fetched again")
        if fd is None:
            return None
        if count:
            self._add(hits=1)
        return Piece(index * self.block_bytes, length, length < self.block_bytes, fd, b"", count)

    def _fill(self, path: str, digest: bytes, url: str, version: str, index: int, fetch: Fetch,
              flight: Flight) -> None:
        """Fetch a missing block (its lock held) into ``flight``, from its entry on first (its
        bytes given out as they come), and keep it if there is room."""
        room = self.block_bytes + files.HEADER.size
        kept = self._reserve(room)
        if not kept:
            self._warn("room", "the cache limit is full of blocks being read: some blocks are read without caching")
        start = index * self.block_bytes
        try:
            tail = self._fetch(url, version, flight.entry, start + self.block_bytes, fetch, flight.add_tail)
            head = b""
            if flight.entry > start:
                head = self._fetch(url, version, start, flight.entry, fetch, flight.add_head)
        except BaseException:
            if kept:
                self._release(room)
            raise
        data = head + tail
        # counted before the block's file is there: a reader that finds the file has the fetch's
        # counts (this thread may still be on the ledger when the reader is done)
        self._add(misses=1, **{"written_bytes" if kept else "uncached_bytes": len(data)})
        if kept:
            try:
                size = files.write_block(path, digest, data)
                self._release(room - size)
            except OSError as e:
                self._add(written_bytes=-len(data), uncached_bytes=len(data))
                self._release(room)
                self._writes_off = e.strerror or str(e)
                self._warn("write", f"byte cache turned off: a block could not be written ({self._writes_off}); "
                                    "reading on without caching")

    def _fetch(self, url: str, version: Optional[str], start: int, stop: int, fetch: Fetch,
               progress: Progress = None) -> bytes:
        given = [0]  # (bytes the fetch gave to progress as they came: the rest is given at its end)

        def step(chunk: bytes) -> None:
            given[0] += len(chunk)
            progress(chunk)  # type: ignore[misc]

        data = fetch(url, version, start, stop, step if progress is not None else None)
        if len(data) > stop - start:
            raise ValueError(f"the store returned {len(data)} bytes for a range of {stop - start}: {redact(url)}")
        self._add(remote_bytes=len(data))
        if progress is not None and given[0] < len(data):
            progress(bytes(data[given[0]:]))
        return data if isinstance(data, bytes) else bytes(data)

    def direct(self, url: str, version: Optional[str], start: int, stop: int, fetch: Fetch) -> bytes:
        """Bytes ``[start, stop)`` fetched straight from the store and not kept (a stream's first
        read that would wait long for a block in flight: :class:`~.cacherange.CachedRange`)."""
        data = self._fetch(url, version, start, stop, fetch)
        self._add(uncached_bytes=len(data))
        return data

    def _uncached(self, url: str, version: Optional[str], pos: int, end: Optional[int], fetch: Fetch) -> Piece:
        """Bytes from ``pos`` to the end of its block (or ``end``), fetched and not kept."""
        stop = (pos // self.block_bytes + 1) * self.block_bytes
        stop = stop if end is None else min(stop, end)
        data = self._fetch(url, version, pos, stop, fetch)
        self._add(misses=1, uncached_bytes=len(data))
        return Piece(pos, len(data), len(data) < stop - pos, None, data, False)

    # -- room ------------------------------------------------------------------------------------

    def _reserve(self, n: int) -> bool:
        """Count ``n`` more bytes in the ledger if they fit the limit, evicting the least recently
        used blocks if they do not; False when no room can be made (every block being read)."""
        try:
            with files.FileLock(self._ledger) as lock:
                used = lock.value()
                if used + n <= self.limit_bytes:
                    lock.set(used + n)
                    return True
            with files.FileLock(self._evict_lock), files.FileLock(self._ledger) as lock:
                used = lock.value()
                if used + n <= self.limit_bytes:
                    lock.set(used + n)
                    return True
                held, total = files.scan(self.root, self.block_bytes)
                target = self.limit_bytes - n - eviction_slack(self.limit_bytes, self.block_bytes)
                total, removed, removed_bytes = files.evict(held, total, target)
                self._add(evictions=removed, evicted_bytes=removed_bytes)
                fits = total + n <= self.limit_bytes
                lock.set(total + n if fits else total)
                return fits
        except OSError as e:
            self._writes_off = e.strerror or str(e)
            self._warn("write", f"byte cache turned off: its ledger could not be kept ({self._writes_off}); "
                                "reading on without caching")
            return False

    def _release(self, n: int) -> None:
        if n:
            try:
                with files.FileLock(self._ledger) as lock:
                    lock.set(lock.value() - n)
            except OSError:
                pass  # set right by the next scan

    def _rescan(self) -> None:
        """Set the ledger from the files (a new folder, or one whose ledger went missing)."""
        with files.FileLock(self._evict_lock), files.FileLock(self._ledger) as lock:
            lock.set(files.scan(self.root, self.block_bytes)[1])
