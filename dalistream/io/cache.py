"""A node-local cache of remote bytes, shared by every process of a node: a layer under any store.

A store reads a byte range of an object through :meth:`ByteCache.read` (or streams it through
:meth:`ByteCache.open`), giving the object's version and its own ranged read ``fetch(url,
version, start, end, progress) -> bytes`` (bytes ``[start, end)``, fewer at the object's end;
``progress``, when not None, may be given them as they arrive). The cache works in aligned
blocks of ``block_bytes``: a block it holds is read from the local disk (checked whole against
the CRC-32 written with it the first time this process reads it: one that fails is removed and
fetched again); a missing one is fetched whole, once per node however many processes want it at the same time (the others
wait on its lock and then read the file), written to the disk and read from there; a stream of
the fetching process reads it as its bytes arrive (:mod:`.cacheflight`).
Blocks are keyed by (URL, version): a changed object is never served stale. The files, their
checks, the locks and the ledger that holds the folder under the limit are :mod:`.cachefiles`'s;
the eviction rule (least recently used, by size) is :mod:`.cachesim`'s model.

The limit bounds the folder at every moment, for every process of the node: a fetch reserves
its block's room in the shared ledger before it writes, evicting first when there is none
(:class:`~.cachefiles.Ledger`). The cache only saves time, so it never stops a job: a limit below
one block streams every read without caching (said once); a block that finds no room (the blocks
held all being read or fetched) is read without caching; a full or failing disk stops the writing
of blocks (one warning) while blocks already there are still read; an object without a version is
never cached. ``counters()`` gives ``hits``, ``misses`` (blocks), ``remote_bytes`` (fetched),
``cache_bytes`` (read from blocks that were there), ``written_bytes``, ``uncached_bytes`` (fetched
and not kept), ``no_room`` (blocks not kept for want of room), ``damaged`` (kept blocks that
failed their check, fetched again), ``evictions`` and ``evicted_bytes``: a plain dict of this
process's reads, to be summed over processes.
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
from .cacheflight import Flight, Flights
from .cacherange import CachedRange, Count, Fetch, Piece, Progress
from .folder import folder_problem
from .openfiles import files_table

log = logging.getLogger(__name__)

BLOCK_BYTES = 4 << 20  # measured: hits as fast as at 8-16 MiB, half the over-fetch of 8 MiB without affinity
COUNTERS = ("hits", "misses", "remote_bytes", "cache_bytes", "written_bytes", "uncached_bytes", "no_room",
            "damaged", "evictions", "evicted_bytes")


#: per cache folder, the block files this process checked whole or wrote (:func:`_trust_key`): it
#: trusts them from then on, whichever copy of its cache (unpickled in a worker) reads them
_TRUSTED: Dict[str, set] = {}


def _trust_key(path: str, st: os.stat_result) -> int:
    """A block file's name in the set of those a process trusts: its path and inode (a file put
    in its place since is another), hashed (a few bytes each, for the hundreds of thousands of a
    large cache)."""
    return hash((path, st.st_dev, st.st_ino))


class ByteCache:
    """Blocks of remote objects in ``folder`` (see the module doc), their files at most
    ``limit_bytes`` in all at every moment (``None``: :func:`auto_limit`); a folder over the
    limit (left by a job with a larger one) is brought under it when the cache is built. Refuses
    a folder another user could plant blocks in (:func:`~.folder.folder_problem`). Thread-safe;
    pickles as its settings (each process keeps its own counters)."""

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
        if not os.path.exists(self._ledger.path):
            self._ledger.rescan()
        self.limit_bytes = auto_limit(root, self.usage()) if limit is None else limit
        if not self.caching:
            self._warn("small", f"the cache limit ({self.limit_bytes} bytes) is below one block ({block_bytes} "
                                f"bytes): reading without caching")
        removed, removed_bytes = self._ledger.trim(self.limit_bytes)
        self._add(None, evictions=removed, evicted_bytes=removed_bytes)

    def _start(self) -> None:
        self.root = os.path.join(self.folder, files.NAMESPACE)
        self._ledger = files.Ledger(self.root)
        self._room = files.block_size(self.block_bytes)  # what a block's file takes at most
        self._lock = threading.Lock()
        self._counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._warned: set = set()
        self._writes_off: Optional[str] = None
        self._subdirs: set = set()
        self._flights = Flights()  # blocks being fetched in this process, readable as they come
        self._trusted = _TRUSTED.setdefault(self.root, set())  # (every copy of the cache in this process)

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

        def add(**amounts: int) -> None:
            self._add(count, **amounts)

        return CachedRange(start, end, lambda pos: self.piece(url, version, pos, end, fetch, count),
                           lambda a, b: self.direct(url, version, a, b, fetch, count), add)

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
        """The length of the block in ``path`` as its file's size says (-1: not there)."""
        try:
            return files.length_of(os.stat(path).st_size)
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
                flight = self._flight(path, digest, url, version, index, max(pos, start), fetch, count, here=True)
                flight.wait()  # (fetched here, or by the stream that wanted it first)
                if flight.error is not None or len(flight) < self.block_bytes:
                    break  # the object ends in this block (a failed fetch: the reader meets it)
                pos += self.block_bytes
        except OSError as e:
            self._warn("paths", f"blocks not cached: {e.strerror or e}; they are read without caching")
            return False
        return True

    def counters(self) -> Dict[str, int]:
        """A snapshot of this process's counters (module doc)."""
        with self._lock:
            return dict(self._counters)

    def usage(self) -> int:
        """Bytes the folder's blocks take, with the room reserved by the fetches in flight, as the ledger has it."""
        return self._ledger.usage()

    def _add(self, count: Optional[Count], **amounts: int) -> None:
        """Count in this process's counters and in ``count`` (a stream's, or None)."""
        with self._lock:
            for name, amount in amounts.items():
                self._counters[name] += amount
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
        return self._writes_off is None and self.limit_bytes >= self._room

    # -- one block -----------------------------------------------------------------------------

    def _paths(self, url: str, version: str, index: int) -> Tuple[str, bytes]:
        key = files.key_name(url, version, self.block_bytes)
        sub = os.path.join(self.root, key[:2])
        if sub not in self._subdirs:
            if not files.real_folder(sub):
                raise OSError(f"{sub} is not a folder (a symbolic link?)")
            self._subdirs.add(sub)
        return os.path.join(sub, f"{key}-{index:08x}.blk"), files.block_digest(url, version, self.block_bytes, index)

    def piece(self, url: str, version: Optional[str], pos: int, end: Optional[int], fetch: Fetch,
              count: Optional[Count] = None) -> Piece:
        """The bytes from ``pos`` on, up to the end of its block (and ``end``): the block's file
        when it is kept (fetched first if missing; its bytes checked, the first time, by
        :meth:`_hit`), else the bytes fetched."""
        index = pos // self.block_bytes
        if version is None:
            self._warn("unversioned", "a store gave no version for an object: it is read without caching")
            return self._uncached(url, None, pos, end, fetch, count)
        try:
            path, digest = self._paths(url, version, index)
        except OSError as e:
            self._warn("paths", f"blocks not cached: {e.strerror or e}; they are read without caching")
            return self._uncached(url, version, pos, end, fetch, count)
        got = self._hit(path, digest, index, count)
        if got is not None:
            return got
        if not self.caching:
            return self._uncached(url, version, pos, end, fetch, count)
        flight = self._flight(path, digest, url, version, index, pos, fetch, count, here=False)
        return Piece(index * self.block_bytes, self.block_bytes, False, None, b"", False, flight)

    def _flight(self, path: str, digest: bytes, url: str, version: str, index: int, entry: int, fetch: Fetch,
                count: Optional[Count], here: bool) -> Flight:
        """The block's :class:`~.cacheflight.Flight` in this process: the one in flight, or one
        started (in this thread when ``here``, else in a new one) that fetches the block, its file
        lock held (so once per node), from ``entry`` on first, keeps it if there is room, and
        gives its bytes as they come: a block another process fetched meanwhile is read from its
        file (:meth:`_hit`)."""

        def fly(flight: Flight) -> None:
            lock = path[:-4] + ".lock"
            lock_fd = files.lock_fetch(lock)
            try:
                got = self._hit(path, digest, index, count)  # fetched by another process while this one waited
                data: Optional[bytes] = None if got is None else got.data
                if got is not None and got.block is not None:
                    out = bytearray(got.length)
                    try:
                        n = got.block.read_if_same(memoryview(out), files.HEADER.size)  # (None: evicted since)
                    finally:
                        files_table().release(got.block)
                    data = None if n is None else bytes(out[:n])
                if data is None:
                    self._fill(path, digest, url, version, index, fetch, flight, lock_fd, count)
                else:
                    flight.hit = True
                    flight.finish(data)
            finally:
                files.unlock_fetch(lock_fd, lock)

        return self._flights.join(path, index * self.block_bytes, entry, fly, here)

    def _hit(self, path: str, digest: bytes, index: int, count: Optional[Count]) -> Optional[Piece]:
        """The kept block in ``path``: its file, or, the first time this process reads it, its
        bytes read whole and checked against their CRC-32 (given from memory, so the bytes given
        are the bytes checked); None when there is none, or the one there is not to be trusted
        (removed and counted: the caller fetches it)."""
        try:
            block, why, st = files.open_block(path, digest)
            if block is not None and _trust_key(path, block.st) not in self._trusted:
                try:
                    data = os.pread(block.fd, block.length, files.HEADER.size)
                finally:
                    os.close(block.fd)
                if files.intact(block, data):
                    self._trusted.add(_trust_key(path, block.st))
                    self._add(count, hits=1)
                    return Piece(index * self.block_bytes, block.length, block.length < self.block_bytes, None,
                                 data, True)
                block, why = None, "its bytes do not match their checksum"
        except OSError as e:
            self._warn("read", f"a cached block could not be read ({e.strerror or e}): fetching it")
            return None
        if why is not None and st is not None:
            self._ledger.drop(path, st, self._room)
            self._add(count, damaged=1)
            self._warn("bad:" + why, f"a cached block was not trusted ({why}): removed and fetched again")
        if block is None:
            return None
        self._add(count, hits=1)
        shared = files_table().adopt(path, block.fd)  # (one descriptor per block file in the process, within its budget)
        return Piece(index * self.block_bytes, block.length, block.length < self.block_bytes, shared, b"", True)

    def _fill(self, path: str, digest: bytes, url: str, version: str, index: int, fetch: Fetch,
              flight: Flight, lock_fd: int, count: Optional[Count]) -> None:
        """Fetch a missing block (its lock ``lock_fd`` held) into ``flight``, from its entry on
        first (its bytes given out as they come), and keep it if the ledger has room for it."""
        kept = self._reserve(lock_fd, count)
        start = index * self.block_bytes
        try:
            tail = self._fetch(url, version, flight.entry, start + self.block_bytes, fetch, count, flight.add_tail)
            head = b""
            if flight.entry > start:
                head = self._fetch(url, version, start, flight.entry, fetch, count, flight.add_head)
        except BaseException:
            if kept:
                self._ledger.release(lock_fd, self._room)
            raise
        data = head + tail
        # counted before the block's file is there: a reader that finds the file has the fetch's
        # counts (this thread may still be on the ledger when the reader is done)
        self._add(count, misses=1, no_room=0 if kept or not self.caching else 1,
                  **{"written_bytes" if kept else "uncached_bytes": len(data)})
        if kept:
            try:
                partial, size = files.write_partial(path, digest, data)
                st = self._ledger.settle(lock_fd, self._room, partial, path, size)
                if st is not None:
                    self._trusted.add(_trust_key(path, st))  # (its CRC-32 is of the bytes fetched)
            except OSError as e:
                self._add(count, written_bytes=-len(data), uncached_bytes=len(data))
                self._ledger.release(lock_fd, self._room)
                self._writes_off = e.strerror or str(e)
                self._warn("write", f"byte cache turned off: a block could not be written ({self._writes_off}); "
                                    "reading on without caching")

    def _reserve(self, lock_fd: int, count: Optional[Count]) -> bool:
        """Room for a block in the ledger (:meth:`~.cachefiles.Ledger.reserve`); False, said
        once, when there is none to be made, or the ledger cannot be kept (caching then off)."""
        try:
            kept, removed, removed_bytes = self._ledger.reserve(lock_fd, self._room, self.limit_bytes)
        except OSError as e:
            self._writes_off = e.strerror or str(e)
            self._warn("write", f"byte cache turned off: its ledger could not be kept ({self._writes_off}); "
                                "reading on without caching")
            return False
        self._add(count, evictions=removed, evicted_bytes=removed_bytes)
        if not kept:
            self._warn("room", f"the cache limit ({self.limit_bytes} bytes) has no room left for a block: all it holds "
                               "is being read or fetched; such blocks are read without caching (counted in "
                               "cache_no_room)")
        return kept

    def _fetch(self, url: str, version: Optional[str], start: int, stop: int, fetch: Fetch,
               count: Optional[Count], progress: Progress = None) -> bytes:
        given = [0]  # (bytes the fetch gave to progress as they came: the rest is given at its end)

        def step(chunk: bytes) -> None:
            given[0] += len(chunk)
            progress(chunk)  # type: ignore[misc]

        data = fetch(url, version, start, stop, step if progress is not None else None)
        if len(data) > stop - start:
            raise ValueError(f"the store returned {len(data)} bytes for a range of {stop - start}: {redact(url)}")
        self._add(count, remote_bytes=len(data))
        if progress is not None and given[0] < len(data):
            progress(bytes(data[given[0]:]))
        return data if isinstance(data, bytes) else bytes(data)

    def direct(self, url: str, version: Optional[str], start: int, stop: int, fetch: Fetch,
               count: Optional[Count] = None) -> bytes:
        """Bytes ``[start, stop)`` fetched straight from the store and not kept (a stream's first
        read that would wait long for a block in flight: :class:`~.cacherange.CachedRange`)."""
        data = self._fetch(url, version, start, stop, fetch, count)
        self._add(count, uncached_bytes=len(data))
        return data

    def _uncached(self, url: str, version: Optional[str], pos: int, end: Optional[int], fetch: Fetch,
                  count: Optional[Count]) -> Piece:
        """Bytes from ``pos`` to the end of its block (or ``end``), fetched and not kept."""
        stop = (pos // self.block_bytes + 1) * self.block_bytes
        stop = stop if end is None else min(stop, end)
        data = self._fetch(url, version, pos, stop, fetch, count)
        self._add(count, misses=1, uncached_bytes=len(data))
        return Piece(pos, len(data), len(data) < stop - pos, None, data, False)
