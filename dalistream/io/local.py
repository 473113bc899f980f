"""Local byte streams: shard files (positional reads, or views of the file's memory map) and
``pipe:CMD`` (a shell command's stdout, as in the webdataset library).

A local shard is mapped read-only while a worker reads runs of it (:meth:`FileRange.view`), as
DALI's own readers map the files they read: a shard cut short *in place* while it is read kills
the reading process with SIGBUS (the kernel's answer to a mapped page past the file's end; the
loader's error says so). Replace shards by writing a new file and renaming it over the old one
(what :mod:`dalistream.writer` does): a reader goes on with the file it opened."""

from __future__ import annotations

import io
import logging
import mmap
import os
import stat
import subprocess
import tempfile
import threading
from typing import Any, BinaryIO, Callable, Dict, List, Optional

from ..errors import SourceError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
#: A file's mapping gives out views of at most this many bytes, then a new one is made (:meth:`_Shared.view`)
MAP_BYTES = 16 << 20


def local_path(url: str) -> str:
    """The file system path of a local shard URL: ``file://`` stripped, ``~`` expanded."""
    path = url[len("file://"):] if url.startswith("file://") else url
    return os.path.expanduser(path) if path.startswith("~") else path


def new_file_mode() -> int:
    """The permissions ``open()`` gives a new file of this process (0666 less the umask)."""
    try:
        with open("/proc/self/status") as f:  # the umask without setting it (a set-and-restore races threads)
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = 0o022
    return 0o666 & ~umask


def write_atomic(path: str, write: Callable[[BinaryIO], object], mode: Optional[int] = None) -> None:
    """Write a file through ``write(f)`` into a temporary file beside it, then rename it into
    place: readers (other ranks, other workers) see the old file or the whole new one. ``mode``:
    its permissions (default: a temporary file's, 0600)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


_cache_warned: set = set()


def cache_write(path: str, write: Callable[[BinaryIO], object]) -> bool:
    """Write a cache file as :func:`write_atomic` does, in a folder created private (0700): True
    if written. A folder on the way that is a symbolic link (planted to redirect the writes) is
    never written through, and a full or failing disk is a warning and no cache (as a read-only
    one), never an error: the cache only saves time."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if os.path.islink(folder):
            raise OSError(f"{folder} is a symbolic link")
        write_atomic(path, write)
        return True
    except OSError as e:
        reason = e.strerror or str(e)
        if (reason, folder) not in _cache_warned:  # once per problem and folder
            _cache_warned.add((reason, folder))
            log.warning("cache not written (%s): %s; going on without it", reason, folder)
        return False


class PipeStream(io.RawIOBase):
    """stdout of a shell command; a non-zero exit at the end is an error naming the URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._proc = subprocess.Popen(url[len("pipe:"):], shell=True, stdout=subprocess.PIPE, bufsize=CHUNK)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._proc.stdout.readinto(buffer)
        if n == 0:
            code = self._proc.wait()
            if code != 0:
                raise SourceError(f"pipe command exited with status {code}", url=self.url)
        return n

    def close(self) -> None:
        if not self.closed and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        super().close()


def check_regular(path: str, st: os.stat_result) -> None:
    """Raise unless ``st`` is a regular file's: reading a FIFO, a socket or a device as a shard
    would block for ever or never end."""
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
        raise SourceError(f"not a regular file: {kind}", url=path, reason="not_regular",
                          hint="name tar shards (files); stream a pipe with a pipe: source, e.g. 'pipe:cat FIFO'")


END_OF_ARCHIVE = bytes(1024)  # two zero blocks: a tar's end
GZIP_MAGIC = b"\x1f\x8b"


def starts_gzip(fd: int) -> bool:
    """Whether the file open as ``fd`` starts with the gzip magic (a 2-byte positional read)."""
    return os.pread(fd, 2, 0) == GZIP_MAGIC


def copy_tail(view: memoryview, tail: memoryview) -> "tuple[int, memoryview]":
    """Copy the start of ``tail`` into ``view``: ``(bytes copied, what is left of tail)``."""
    n = min(len(view), len(tail))
    view[:n] = tail[:n]
    return n, tail[n:]


class FileRange(io.RawIOBase):
    """A part of a local shard as a tar of its own: bytes ``[start, end)`` of the file, read by
    positional reads straight into the caller's buffer, or given as views of the file's mapping
    (:meth:`view`; no buffer of its own and no copy, so a worker reading many parts at once,
    interleaved columns, holds nothing per part but this),
    then an end-of-archive marker when all of them came: a file shorter than the range stays a
    truncated tar. ``marker=False``: the bytes alone (a store's plain range; the rest of a whole
    shard, whose size is then ``file_size``, for the tar reader's checks). Closing it closes
    ``f``, or hands it back when it is ``shared`` (:func:`open_range`)."""

    def __init__(self, f: io.FileIO, start: int, end: int, marker: bool = True,
                 shared: Optional["_Shared"] = None, file_size: Optional[int] = None) -> None:
        self._f = f
        self._pos, self._end = start, max(start, end)
        self._tail = memoryview(b"")
        self._marker = marker
        self._shared = shared
        self.file_size = file_size  # the file's size, when the range is the rest of the file

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self._pos + offset if whence == 1 else self._end + offset
        before, self._pos = self._pos, min(max(target, 0), self._end)
        if before < self._pos:  # (passing over its last bytes, a member not wanted, reaches the end too)
            self._moved_on(read=False)
        return self._pos

    def _moved_on(self, read: bool) -> None:
        """At the range's end, the marker follows: where its last bytes came (``read``), or where
        the file holds the bytes a seek passed over (a file cut before the end stays truncated)."""
        if self._marker and self._pos == self._end and (read or os.fstat(self._f.fileno()).st_size >= self._end):
            self._tail = memoryview(END_OF_ARCHIVE)

    def fileno(self) -> int:
        return self._f.fileno()

    @property
    def remaining(self) -> int:
        """Bytes of the range not read yet."""
        return self._end - self._pos

    def view(self, n: int) -> Optional[memoryview]:
        """The next ``n`` bytes of the range (fewer where the file ends first) as a read-only view
        of the file's mapped bytes (:meth:`_Shared.view`), with no copy; ``None`` where the file
        cannot be mapped (then it is read by :meth:`readinto`)."""
        view = self._shared.view(self._pos, min(n, self._end - self._pos)) if self._shared is not None else None
        if view is not None:
            self._pos += len(view)
            if len(view):
                self._moved_on(read=True)
        return view

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self._end - self._pos)
        if n > 0:
            got = os.preadv(self._f.fileno(), [view[:n]], self._pos)
            self._pos += got
            if got:
                self._moved_on(read=True)
            return got  # 0: the file ended before the range did (a cut shard: no marker)
        n, self._tail = copy_tail(view, self._tail)
        return n

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._shared is not None:
                self._shared.release()
            else:
                self._f.close()
        finally:
            super().close()

    def is_gzip(self) -> bool:
        """Whether the file is gzip content (its first bytes; read once per shared file)."""
        if self._shared is None:
            return starts_gzip(self._f.fileno())
        if self._shared.gzip is None:
            self._shared.gzip = starts_gzip(self._f.fileno())
        return self._shared.gzip


class _Shared:
    """One open shard file (of :data:`_open_files`) and how many :class:`FileRange` s read it now."""

    __slots__ = ("path", "file", "identity", "users", "gzip", "mapping", "mapped_out")

    def __init__(self, path: str, f: io.FileIO, identity: tuple) -> None:
        self.path, self.file, self.identity, self.users = path, f, identity, 0
        self.gzip: Optional[bool] = None
        self.mapping: Any = None  # the file mapped (an mmap), once a view is asked; False: it cannot be
        self.mapped_out = 0  # the bytes of views the mapping gave out

    def view(self, at: int, n: int) -> Optional[memoryview]:
        """Bytes ``at`` to ``at + n`` of the file (fewer where it ends first) as a read-only view of
        its mapping, ``None`` where it cannot be mapped (an empty file; a file system that maps
        nothing: then never). A view keeps its mapping alive (unmapped with the last view of it),
        and a mapping gives out :data:`MAP_BYTES` of views at most, then a new one is made: what
        stays mapped is what the readers still hold, and not much more. Never past the file's end
        as it is now (a mapping of a file that grew or shrank since is made anew)."""
        if self.mapping is False:
            return None
        try:
            size = os.fstat(self.file.fileno()).st_size
            n = max(0, min(n, size - at))
            if n and (self.mapping is None or self.mapped_out >= MAP_BYTES or len(self.mapping) != size):
                self.mapping, self.mapped_out = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ), 0
        except (OSError, ValueError):
            self.mapping = False
            return None
        if not n:
            return memoryview(b"")
        self.mapped_out += n
        return memoryview(self.mapping)[at:at + n]

    def current(self) -> bool:
        """Whether the path still names this file."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def release(self) -> None:
        """One reader less: the file closes with the last. Counted when the table's lock is free
        (:func:`_settle`): a part closed while the lock is held — by the garbage collector
        finalizing a dropped reader inside :func:`open_range`, in the same thread — must not wait
        for it (it would wait for ever), nor change the count under the holder's feet."""
        _released.append(self)
        _settle()


_open_files: Dict[str, _Shared] = {}
_open_files_lock = threading.Lock()
_released: List[_Shared] = []  # readers let go of, not yet counted (list appends and pops are atomic)


def _settle() -> None:
    """Count the releases waiting, if the table's lock is free (else its holder counts them when
    it lets go), and close the files no part reads any more."""
    while _released:
        if not _open_files_lock.acquire(blocking=False):
            return
        unused = []
        try:
            while _released:
                shared = _released.pop()
                shared.users -= 1
                if not shared.users:
                    if _open_files.get(shared.path) is shared:
                        del _open_files[shared.path]
                    unused.append(shared)
        finally:
            _open_files_lock.release()
        for shared in unused:
            shared.file.close()
            shared.mapping = None  # (unmapped with the last view of it)


def _forget_open_files() -> None:
    """In a process just forked (a DALI worker): a table and a lock of its own. The parent's parts
    are not the child's to count (those it inherited close their copies of the files), and a lock
    another thread held at the fork would never be released here."""
    global _open_files, _open_files_lock, _released
    _open_files, _open_files_lock, _released = {}, threading.Lock(), []


os.register_at_fork(after_in_child=_forget_open_files)


def open_range(url: str, start: int, end: Optional[int] = None) -> FileRange:
    """Bytes ``[start, end)`` of a local shard as a :class:`FileRange` (errors as :func:`open_file`'s);
    ``end`` None: to the end of the file as it is now, with no end-of-archive marker of ours (a whole
    shard has its own; no buffer of a megabyte per shard opened, the bytes go straight where the
    reader wants them).

    The parts of one file open at once in a process share its descriptor: a worker's interleaved
    columns read many parts of each shard side by side, and an open, a check of its first bytes
    and a close for every one of them cost more than their reads (a worker reading 128 columns of
    8 shards opened 128 files an epoch, not 8). The file is closed with the last part that reads
    it; one replaced under the same path meanwhile (another inode) is opened anew."""
    path = local_path(url)
    with _open_files_lock:
        shared = _open_files.get(path)
        if shared is None or not shared.current():
            f = open_file(url, 0, 0)  # (its errors: missing, not a regular file, unreadable)
            st = os.fstat(f.fileno())
            shared = _open_files[path] = _Shared(path, f, (st.st_dev, st.st_ino))  # type: ignore[arg-type]
        shared.users += 1
    _settle()  # (parts released while the lock was held)
    if end is None:
        size = os.fstat(shared.file.fileno()).st_size
        return FileRange(shared.file, start, size, marker=False, shared=shared, file_size=size)
    return FileRange(shared.file, start, end, shared=shared)


def open_file(url: str, offset: int = 0, buffering: int = CHUNK) -> BinaryIO:
    """A local shard (a path or ``file://`` URL) opened at byte ``offset``, read ``buffering``
    bytes at a time."""
    path = local_path(url)
    try:
        check_regular(url, os.stat(path))  # (opening a FIFO would block until a writer comes)
        f = open(path, "rb", buffering=buffering)
    except FileNotFoundError:
        raise SourceError("shard file does not exist", url=url, reason="missing",
                          hint="check the path and that every node sees the same files") from None
    except OSError as e:
        raise SourceError(f"cannot open shard: {e.strerror}", url=url) from None
    if offset:
        f.seek(offset)
    return f
