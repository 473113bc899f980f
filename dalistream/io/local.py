"""Local byte streams: shard files (positional reads, or views of the file's memory map) and
``pipe:CMD`` (a shell command's stdout, as in the webdataset library).

A local shard is mapped read-only while a worker reads runs of it (:meth:`FileRange.view`), as
DALI's own readers map the files they read: a shard cut short *in place* while it is read kills
the reading process with SIGBUS (the kernel's answer to a mapped page past the file's end; the
loader's error says so). Replace shards by writing a new file and renaming it over the old one
(what :mod:`dalistream.writer` does): a reader goes on with the file it opened (where a worker
reads more files at once than it keeps open, it opens them again: one replaced meanwhile is then
an error naming it, :mod:`.openfiles`)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import tempfile
from typing import BinaryIO, Callable, Optional

from ..errors import SourceError
from .openfiles import OpenFile, check_regular, files_table, local_path

log = logging.getLogger(__name__)

CHUNK = 1 << 20

__all__ = ["CHUNK", "END_OF_ARCHIVE", "FileRange", "GZIP_MAGIC", "PipeStream", "cache_write", "check_regular",
           "copy_tail", "local_path", "new_file_mode", "open_file", "open_range", "starts_gzip", "write_atomic"]


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
    shard, whose size is then ``file_size``, for the tar reader's checks). The file is ``file``,
    an :class:`~.openfiles.OpenFile` of the process's table, which the parts of a file open at once
    share (:func:`open_range`); closing the part hands it back."""

    def __init__(self, file: OpenFile, start: int, end: int, marker: bool = True,
                 file_size: Optional[int] = None) -> None:
        self._file = file
        self._pos, self._end = start, max(start, end)
        self._tail = memoryview(b"")
        self._marker = marker
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
        if self._marker and self._pos == self._end and (read or self._file.stat().st_size >= self._end):
            self._tail = memoryview(END_OF_ARCHIVE)

    @property
    def remaining(self) -> int:
        """Bytes of the range not read yet."""
        return self._end - self._pos

    def stat(self) -> os.stat_result:
        """``fstat`` of the file."""
        return self._file.stat()

    def view(self, n: int) -> Optional[memoryview]:
        """The next ``n`` bytes of the range (fewer where the file ends first) as a read-only view
        of the file's mapped bytes (:meth:`~.openfiles.OpenFile.view`), with no copy; ``None`` where
        the file cannot be mapped (then it is read by :meth:`readinto`)."""
        view = self._file.view(self._pos, min(n, self._end - self._pos))
        if view is not None:
            self._pos += len(view)
            if len(view):
                self._moved_on(read=True)
        return view

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self._end - self._pos)
        if n > 0:
            got = self._file.read_into(view[:n], self._pos)
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
            files_table().release(self._file)
        finally:
            super().close()

    def is_gzip(self) -> bool:
        """Whether the file is gzip content (its first bytes; read once per open file)."""
        return self._file.starts_gzip()


def open_range(url: str, start: int, end: Optional[int] = None, marker: bool = True) -> FileRange:
    """Bytes ``[start, end)`` of a local shard as a :class:`FileRange` (errors as
    :func:`~.openfiles.open_descriptor`'s); ``end`` None: to the end of the file as it is now, with
    no end-of-archive marker of ours (a whole shard has its own; no buffer of a megabyte per shard
    opened, the bytes go straight where the reader wants them); ``marker=False``: none either way.

    The parts of one file open at once in a process share it (:class:`~.openfiles.FileTable`): a
    worker's interleaved columns read many parts of each shard side by side, and an open, a check
    of its first bytes and a close for every one of them cost more than their reads (a worker
    reading 128 columns of 8 shards opened 128 files an epoch, not 8); and a worker reading more
    files at once than its budget of descriptors keeps those read last open. The file is closed
    with the last part that reads it; one replaced under the same path meanwhile (another inode)
    is opened anew."""
    file = files_table().acquire(url)
    if end is None:
        try:
            size = file.stat().st_size
        except BaseException:
            files_table().release(file)
            raise
        return FileRange(file, start, size, marker=False, file_size=size)
    return FileRange(file, start, end, marker=marker)


def open_file(url: str, offset: int = 0, buffering: int = CHUNK) -> BinaryIO:
    """A local shard (a path or ``file://`` URL) opened at byte ``offset``, read ``buffering``
    bytes at a time (0: unbuffered): the rest of the file (:func:`open_range`) (errors as
    :func:`~.openfiles.open_descriptor`'s)."""
    part = open_range(url, offset, None)
    return io.BufferedReader(part, buffering) if buffering else part  # type: ignore[arg-type,return-value]
