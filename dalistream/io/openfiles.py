"""A process's open shard files: one table (:class:`FileTable`), the one place a worker keeps the
local files it reads open (shards, and the byte cache's blocks), within a budget of descriptors.

A worker reading interleaved columns reads a part of some shard for each of its batch positions
at once: 512 columns kept 512 files open, and as many again in the descriptors Python's ``mmap``
keeps of each file it maps (1,904 descriptors in one worker, measured), where many systems allow a
process 1,024 (``ulimit -n``: ``OSError: Too many open files``). Here every part of a file open
at once in the process shares one :class:`OpenFile` (one descriptor per file, not per column),
and the table keeps at most its ``limit`` of descriptors open: past that, the file read
least recently has its descriptor closed (its parts stay open) and is opened again when it is
next read — checked to be the same file (device and inode): one replaced or removed meanwhile is
a :class:`~dalistream.errors.SourceError` naming it (``reason="changed"``), never another file's
bytes. A file is closed with its last part. The byte cache's block files (:mod:`.cache`) are
read through the same table (:meth:`FileTable.adopt`), their descriptors locked shared (a block
open in a process is not evicted); a block's path that names another file, or none, when its
descriptor is opened again (evicted by another process meanwhile) is not an error there: the
stream takes the block again, from the cache (checked as a new block) or the store. Mappings keep no descriptor (:class:`Region`: libc's
``mmap``, not Python's, which holds a duplicate of the file's descriptor as long as it lives).

The budget (:func:`files_budget`): :data:`FILES_SHARE` of the process's soft limit of open files
(``RLIMIT_NOFILE``), the rest left to DALI's shared memory, pipes and sockets and to the user's
own; a worker raises its soft limit to the hard one first (:func:`raise_files_limit`, at its
entry point), where the system allows it.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import mmap
import os
import stat
import sys
import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DalistreamError, SourceError

log = logging.getLogger(__name__)

#: The share of the process's soft limit of open files (``RLIMIT_NOFILE``) its table of shard
#: files may hold open; the rest is left to DALI's shared memory, pipes and sockets and to the
#: user's own files
FILES_SHARE = 0.5
MIN_FILES = 8  # the table's budget whatever the limit (a process allowed fewer fails where it must)
#: A file's mapping gives out views of at most this many bytes, then a new one is made (:meth:`OpenFile.view`)
MAP_BYTES = 16 << 20


def local_path(url: str) -> str:
    """The file system path of a local shard URL: ``file://`` stripped, ``~`` expanded."""
    path = url[len("file://"):] if url.startswith("file://") else url
    return os.path.expanduser(path) if path.startswith("~") else path


def check_regular(path: str, st: os.stat_result) -> None:
    """Raise unless ``st`` is a regular file's: reading a FIFO, a socket or a device as a shard
    would block for ever or never end."""
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
        raise SourceError(f"not a regular file: {kind}", url=path, reason="not_regular",
                          hint="name tar shards (files); stream a pipe with a pipe: source, e.g. 'pipe:cat FIFO'")


def open_descriptor(url: str) -> int:
    """A new read-only descriptor of local shard ``url``: a :class:`SourceError` where it is
    missing, not a regular file, or unreadable."""
    path = local_path(url)
    try:
        check_regular(url, os.stat(path))  # (opening a FIFO would block until a writer comes)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SourceError("shard file does not exist", url=url, reason="missing",
                          hint="check the path and that every node sees the same files") from None
    except OSError as e:
        raise SourceError(f"cannot open shard: {e.strerror}", url=url) from None


# -- mappings that keep no descriptor ------------------------------------------------------------

_PROT_READ, _MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = 1, 1, 2, 0x10, 0x20, 0x4000
_libc: Any = None


def libc_mmap() -> Any:
    """libc (Linux), its ``mmap`` and ``munmap`` typed, or ``None`` where files are not mapped this way."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.mmap.restype = ctypes.c_void_p
                libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_long]
                libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                _libc = libc
            except (OSError, AttributeError):
                pass
    return _libc or None


def unmap(base: int, size: int) -> None:
    """``munmap`` of ``size`` bytes at ``base``."""
    libc = libc_mmap()
    if libc is not None:
        libc.munmap(base, size)


class Region:
    """Local files mapped read-only side by side in one address range reserved for ``capacity``
    bytes (at least what ``paths`` and ``files`` take): file ``k`` at ``offsets[k]`` of
    :attr:`buffer` (and :attr:`array`), each on a page of its own, and :attr:`place` ``[path]``:
    its ``(offset, size, identity)``. The one way a process maps its files: a share's shards
    (:class:`~dalistream.worker.mapped.ShareMaps`), a file's runs (:meth:`OpenFile.view`).
    :meth:`add` maps more where there is room, leaving what is mapped where it is (its pages stay
    mapped: a page mapped anew is a fault of its own at its first touch). :attr:`buffer` and
    every view of it keep the range mapped; it is unmapped with the last. Linux's ``mmap`` with
    ``MAP_FIXED`` into the range reserved first (Python's ``mmap`` cannot place a mapping, and
    keeps a descriptor of each file it maps). Raises ``OSError`` where a file cannot be mapped."""

    def __init__(self, paths: Sequence[str] = (), capacity: int = 0, files: Sequence["OpenFile"] = (),
                 known: Optional[Sequence[Tuple[int, int, int, int]]] = None) -> None:
        libc = libc_mmap()
        if libc is None:
            raise OSError("no mmap with MAP_FIXED here")
        known = [file_identity(file.stat()) for file in files] if known is None else known
        sizes = [os.stat(path).st_size for path in paths] + [size for _, _, size, _ in known]
        self.capacity = max(capacity, sum(_room(size) for size in sizes))
        base = libc.mmap(None, self.capacity, 0, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if base is None or base == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "address range not reserved")
        self.base, self.end = base, 0
        self.buffer = (ctypes.c_uint8 * self.capacity).from_address(base)
        # (never at exit: views of it may still be read while the interpreter ends)
        weakref.finalize(self.buffer, unmap, base, self.capacity).atexit = False
        self.array = np.frombuffer(self.buffer, np.uint8)
        self.array.flags.writeable = False  # (mapped read-only: a write would be a fault)
        self.place: Dict[str, Tuple[int, int, Tuple[int, int, int, int]]] = {}
        if not (self.add(paths) and self.add_files(files, known)):
            raise OSError("files grew while mapped")

    @property
    def offsets(self) -> np.ndarray:
        """Where each file mapped lies, in the order mapped."""
        return np.array([at for at, _, _ in self.place.values()], np.int64)

    @property
    def sizes(self) -> List[int]:
        """Each file's size, in the order mapped."""
        return [size for _, size, _ in self.place.values()]

    def add(self, paths: Sequence[str]) -> bool:
        """Map ``paths`` after what is mapped (a file mapped before and since replaced: anew, its
        place then the new one's); False, and nothing mapped, where they do not fit. Their
        descriptors are the process's table's (within its budget, however many files a share
        maps); a mapping keeps none."""
        if not paths:
            return True
        table = files_table()
        files: List[OpenFile] = []
        try:
            for path in paths:
                files.append(table.acquire(path))
            return self.add_files(files)
        except DalistreamError as e:  # (a file gone, or no longer a regular file: the columns meet it, named)
            raise OSError(str(e)) from None
        finally:
            for file in files:
                table.release(file)

    def add_files(self, files: Sequence["OpenFile"],
                  known: Optional[Sequence[Tuple[int, int, int, int]]] = None) -> bool:
        """:meth:`add` of files open in the table (each at its path's place; ``known``: their
        :func:`file_identity`, where the caller has it)."""
        if not files:
            return True
        libc = libc_mmap()
        # (what is mapped is what was opened)
        identity = [file_identity(file.stat()) for file in files] if known is None else known
        sizes = [size for _, _, size, _ in identity]
        if not all(sizes):
            raise OSError("an empty file")
        room = [_room(size) for size in sizes]  # (a page apart: never one file's bytes right after another's)
        if self.end + sum(room) > self.capacity:
            return False
        for file, size, known, take in zip(files, sizes, identity, room):
            at = self.end
            with file.descriptor() as fd:
                if file_identity(os.fstat(fd)) != known:
                    raise OSError("a file changed while it was mapped", file.path)
                if libc.mmap(self.base + at, size, _PROT_READ, _MAP_SHARED | _MAP_FIXED, fd, 0) != self.base + at:
                    raise OSError(ctypes.get_errno(), "not mapped", file.path)
            self.place[file.path] = (at, size, known)
            self.end = at + take
        return True


def _room(size: int) -> int:
    return -(-size // mmap.PAGESIZE) * mmap.PAGESIZE + mmap.PAGESIZE


def file_identity(st: os.stat_result) -> Tuple[int, int, int, int]:
    """A file's device, inode, size and modification time (of its ``stat``): a mapping of it
    serves while they hold."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def identities(paths: Sequence[str]) -> List[Tuple[int, int, int, int]]:
    """Each file's :func:`file_identity` as its path names it now."""
    return [file_identity(os.stat(path)) for path in paths]


# -- the table -----------------------------------------------------------------------------------

class OpenFile:
    """One local file as a process reads it (its parts share it: :class:`FileTable`): its path,
    which file it is (device, inode), the parts reading it (``users``), its descriptor while the
    table keeps one (``fd``), and its mapping."""

    __slots__ = ("path", "url", "identity", "locked", "users", "pins", "fd", "gzip", "mapping", "mapped_out",
                 "__weakref__")

    def __init__(self, path: str, url: str, fd: int, locked: bool = False) -> None:
        st = os.fstat(fd)
        self.path, self.url, self.identity, self.fd = path, url, (st.st_dev, st.st_ino), fd
        self.locked = locked  # a cache block's file: its descriptor holds a shared lock (kept from eviction)
        self.users = self.pins = 0
        self.gzip: Optional[bool] = None
        self.mapping: Any = None  # the file mapped (a Region of it), once a view is asked; False: it cannot be
        self.mapped_out = 0  # the bytes of views the mapping gave out

    def current(self) -> bool:
        """Whether the path still names this file."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    @contextmanager
    def descriptor(self) -> Iterator[int]:
        """This file's descriptor for the block (opened again where the table closed it; not closed
        by the table while the block runs)."""
        table = files_table()
        fd = table.pin(self)
        try:
            yield fd
        finally:
            table.unpin(self)

    def read_into(self, view: memoryview, at: int) -> int:
        """Bytes from ``at`` into ``view`` (a positional read): how many (fewer at the file's end)."""
        table = files_table()
        fd = table.pin(self)
        try:
            return os.preadv(fd, [view], at)
        finally:
            table.unpin(self)

    def read_if_same(self, view: memoryview, at: int) -> Optional[int]:
        """:meth:`read_into`, or ``None`` where the table had closed the descriptor and the path no
        longer names this file (a cache block evicted meanwhile: the caller fetches it again)."""
        table = files_table()
        fd = table.try_pin(self)
        if fd is None:
            return None
        try:
            return os.preadv(fd, [view], at)
        finally:
            table.unpin(self)

    def stat(self) -> os.stat_result:
        """``fstat`` of the file."""
        table = files_table()
        fd = table.pin(self)
        try:
            return os.fstat(fd)
        finally:
            table.unpin(self)

    def starts_gzip(self) -> bool:
        """Whether the file starts with the gzip magic (read once)."""
        if self.gzip is None:
            with self.descriptor() as fd:
                self.gzip = os.pread(fd, 2, 0) == b"\x1f\x8b"
        return self.gzip

    def view(self, at: int, n: int) -> Optional[memoryview]:
        """Bytes ``at`` to ``at + n`` of the file (fewer where it ends first) as a read-only view of
        its mapping (a :class:`Region` of this file), ``None`` where it cannot be mapped (an empty
        file; a file system that maps nothing: then never). A view keeps its mapping alive
        (unmapped with the last view of it), and a mapping gives out :data:`MAP_BYTES` of views
        at most, then a new one is made: what stays mapped is what the readers still hold, and
        not much more. Never past the file's end as it is now (a mapping of a file that grew or
        shrank since is made anew)."""
        if self.mapping is False:
            return None
        if n <= 0:
            return memoryview(b"")
        with self.descriptor() as fd:
            try:
                known = file_identity(os.fstat(fd))
                n = max(0, min(n, known[2] - at))
                if n and (self.mapping is None or self.mapped_out >= MAP_BYTES
                          or self.mapping.place[self.path][2] != known):
                    self.mapping, self.mapped_out = Region(files=[self], known=[known]), 0
            except (OSError, ValueError):
                self.mapping = False
                return None
        if not n:
            return memoryview(b"")
        self.mapped_out += n
        start = self.mapping.place[self.path][0] + at
        return memoryview(self.mapping.array)[start:start + n]


class FileTable:
    """A process's open local files (see the module doc): by path, the :class:`OpenFile` its parts
    read (:meth:`acquire`, :meth:`release`); of those, at most ``limit`` hold a descriptor, the
    least recently read closed first (:meth:`pin` opens one again). ``peak``: the most
    descriptors it held at once."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.lock = threading.Lock()
        self.files: Dict[str, OpenFile] = {}  # by path: the file it named when a part of it was opened last
        self.open: "OrderedDict[OpenFile, None]" = OrderedDict()  # those holding a descriptor, least recently read first
        self.released: List[OpenFile] = []  # parts let go of, not yet counted (list appends and pops are atomic)
        self.peak = 0

    def acquire(self, url: str) -> OpenFile:
        """The file ``url`` names, one part more reading it: the one open already where the path
        still names it, else opened (errors as :func:`open_descriptor`'s)."""
        path = local_path(url)
        with self.lock:
            entry = self.files.get(path)
            if entry is None or not entry.current():
                self._room(1)
                fd = open_descriptor(url)
                try:
                    entry = self.files[path] = OpenFile(path, url, fd)
                except BaseException:
                    os.close(fd)
                    raise
                self._holds(entry)
            entry.users += 1
        self.settle()  # (parts released while the lock was held)
        return entry

    def adopt(self, path: str, fd: int) -> OpenFile:
        """A cache block's file, opened by the caller (``fd``, locked shared), one part more reading
        it: where the table has the same file (device and inode) already, its entry, ``fd`` closed
        (or kept as the entry's descriptor where the table had closed it); else a new entry. Its
        descriptor, reopened after the table closed it, is locked shared again."""
        with self.lock:
            entry = self.files.get(path)
            st = os.fstat(fd)
            if entry is not None and entry.identity == (st.st_dev, st.st_ino):
                if entry.fd is None:
                    self._room(1)
                    entry.fd = fd
                else:
                    os.close(fd)
            else:
                self._room(1)
                try:
                    entry = self.files[path] = OpenFile(path, path, fd, locked=True)
                except BaseException:
                    os.close(fd)
                    raise
            self._holds(entry)
            entry.users += 1
        self.settle()
        return entry

    def release(self, entry: OpenFile) -> None:
        """One part less reads ``entry``: the file closes with the last. Counted when the lock is
        free (:meth:`settle`): a part closed while it is held — by the garbage collector
        finalizing a dropped reader inside :meth:`acquire`, in the same thread — must not wait
        for it (it would wait for ever), nor change the count under the holder's feet."""
        self.released.append(entry)
        self.settle()

    def settle(self) -> None:
        """Count the releases waiting, if the lock is free (else its holder counts them when it
        lets go), and close the files no part reads any more."""
        while self.released:
            if not self.lock.acquire(blocking=False):
                return
            try:
                while self.released:
                    entry = self.released.pop()
                    entry.users -= 1
                    if not entry.users:
                        if self.files.get(entry.path) is entry:
                            del self.files[entry.path]
                        self.open.pop(entry, None)
                        if entry.fd is not None:  # (in a forked child, its copy of a parent's file)
                            os.close(entry.fd)
                            entry.fd = None
                        entry.mapping = None  # (unmapped with the last view of it)
            finally:
                self.lock.release()

    def pin(self, entry: OpenFile) -> int:
        """``entry``'s descriptor, not closed until :meth:`unpin`: opened again where the table
        closed it, checked to be the same file (a :class:`SourceError` ``changed`` where the path
        names another file now, or none)."""
        fd = self.try_pin(entry)
        if fd is None:
            raise SourceError("shard file replaced or removed while it was read (its descriptor had been closed: "
                              "this worker read more files at once than it keeps open)", url=entry.url,
                              reason="changed", hint="do not overwrite shards while a job reads them (write a new "
                                                     "file and rename it over the old one between epochs)")
        return fd

    def try_pin(self, entry: OpenFile) -> Optional[int]:
        """:meth:`pin`, or ``None`` where the path names another file now, or none."""
        with self.lock:
            if entry.fd is None:
                self._room(1)
                fd = self._reopen(entry)
                if fd is None:
                    return None
                entry.fd = fd
            entry.pins += 1
            self._holds(entry)
            return entry.fd

    def unpin(self, entry: OpenFile) -> None:
        """:meth:`pin`'s use is over."""
        with self.lock:
            entry.pins -= 1

    def _holds(self, entry: OpenFile) -> None:
        """``entry`` (holding a descriptor) is the one read most recently."""
        try:
            self.open.move_to_end(entry)
        except KeyError:
            self.open[entry] = None
        self.peak = max(self.peak, len(self.open))

    def _room(self, more: int) -> None:
        """Descriptors closed, least recently read first, so that ``more`` can be opened within
        the limit (never one in use: :meth:`pin`)."""
        excess = len(self.open) + more - self.limit
        if excess <= 0:
            return
        idle = []
        for held in self.open:
            if not held.pins:
                idle.append(held)
                if len(idle) == excess:
                    break
        for held in idle:
            del self.open[held]
            os.close(held.fd)  # type: ignore[arg-type]
            held.fd = None

    def _reopen(self, entry: OpenFile) -> Optional[int]:
        """A new descriptor of ``entry``'s path if it still names the same file (a cache block's
        locked shared first: a block evicted between the open and the lock has no links), else None."""
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW if entry.locked else 0))
        except OSError:
            return None
        try:
            if entry.locked:
                fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if (st.st_dev, st.st_ino) == entry.identity and st.st_nlink:
            return fd
        os.close(fd)
        return None


def files_budget(soft: int) -> int:
    """The descriptors a process's table of shard files may hold, its soft limit of open files
    being ``soft``: :data:`FILES_SHARE` of it (at least :data:`MIN_FILES`)."""
    return max(MIN_FILES, int(soft * FILES_SHARE))


def _soft_limit() -> int:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    return soft if soft != getattr(resource, "RLIM_INFINITY", -1) and soft > 0 else 1 << 20


_table = FileTable(files_budget(_soft_limit()))


def files_table() -> FileTable:
    """This process's table of open files."""
    return _table


def raise_files_limit() -> Tuple[int, int]:
    """At a worker's entry point: its soft limit of open files raised to the hard one where the
    system allows it, and its table's budget set from the limit it has then (:func:`files_budget`);
    logged. ``(soft limit before, after)``."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0, 0
    raised = soft
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            raised = hard
        except (OSError, ValueError):  # (an infinite hard limit some systems refuse as a soft one, a sandbox)
            pass
    _table.limit = files_budget(_soft_limit())
    if raised != soft:
        log.info("open-file limit raised from %d to %d (the hard limit); this worker keeps at most %d shard files "
                 "open", soft, raised, _table.limit)
    else:
        log.debug("open-file limit %d; this worker keeps at most %d shard files open", soft, _table.limit)
    return soft, raised


def _forget_open_files() -> None:
    """In a process just forked (a DALI worker): a table of its own. The parent's parts are not the
    child's to count (those it inherited close their copies of the files), and a lock another
    thread held at the fork would never be released here."""
    global _table
    _table = FileTable(files_budget(_soft_limit()))


os.register_at_fork(after_in_child=_forget_open_files)
