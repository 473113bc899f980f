"""The byte cache's files (:mod:`.cache`): names, the checked block record, the locks that let
every process of a node share one folder, and the ledger that keeps the folder under its limit.

Everything lives in one folder of its own, ``<cache>/dalistream-bytes-v1/``; nothing outside it
is ever written or removed, and inside it only names of this module's forms are (a file a user
puts there is left alone; a symbolic link is never followed):

- ``KK/<key>-<block>.blk``: a block, a :data:`HEADER` (the block's name, length and CRC-32),
  then its bytes. ``key`` is a digest of (URL, version, block size), so a changed object has
  other names and is never served stale. A reader trusts a block only when its header names it
  and the file's length agrees (:func:`open_block`), and checks its CRC (:func:`intact`) the
  first time its process reads it; blocks are written to a ``.partial`` file and renamed into place.
- ``KK/<key>-<block>.<random>.partial``: a block being written.
- ``KK/<key>-<block>.lock``: exists while one process fetches the block; others wait on its
  ``flock`` and find the block when it goes away. It holds the room the fetch reserved in the
  ledger (8 bytes; none: nothing reserved). A writer that dies releases the lock with its life.
- ``usage``: the :class:`Ledger` (8 bytes, under ``flock``); ``evict.lock``: one evicting
  process at a time.

Sizes: :func:`parse_size` reads a limit (``"800GB"``); :func:`auto_limit` is the one taken when
none is given.

Readers hold a shared ``flock`` on a block while they read it; eviction removes a block only
with an exclusive one, taken without waiting, so a block being read is never removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import stat
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, List, NamedTuple, Optional, Tuple

from ..errors import ConfigError
from .cachesim import eviction_slack

NAMESPACE = "dalistream-bytes-v1"
HEADER = struct.Struct("<8s32sQI4x")  # magic, digest, length, CRC-32 of the bytes
MAGIC = b"DSBLOCK2"  # (DSBLOCK1 held the boot of its writer: such blocks are removed as not this block's)
TAG = b"Signature: 8a477f597d28d172789f06886806bc55\n# dalistream's byte cache (backup tools skip this folder)\n"
_BLOCK = re.compile(r"[0-9a-f]{40}-[0-9a-f]{8,}\.blk")
_PARTIAL = re.compile(r"([0-9a-f]{40}-[0-9a-f]{8,})\.[0-9a-f]{16}\.partial")
_LOCK = re.compile(r"([0-9a-f]{40}-[0-9a-f]{8,})\.lock")
_SUBDIR = re.compile(r"[0-9a-f]{2}")
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC
_COUNT = struct.Struct("<q")


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(value: Any, name: str = "cache_limit") -> int:
    """Bytes from an integer or a text like ``"800GB"``, ``"1.5 TB"``, ``"512MiB"`` (kB, MB, GB,
    TB are powers of 1000; KiB, MiB, GiB, TiB of 1024); a :class:`ConfigError` naming ``name``
    otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if match is None or match[2].lower() not in _UNITS:
        raise ConfigError(f"{name} must be a size in bytes, like 800GB or 512MiB, got {value!r}")
    return int(float(match[1]) * _UNITS[match[2].lower()])


def auto_limit(folder: str, held: int) -> int:
    """The limit when none is given: what the cache holds plus the free space of its file
    system, less a tenth of that file system (room for everything else on it)."""
    st = os.statvfs(folder)
    return max(0, held + st.f_bavail * st.f_frsize - st.f_blocks * st.f_frsize // 10)


def tag_folder(root: str) -> None:
    """Mark ``root`` as a cache (``CACHEDIR.TAG``: backup tools skip it), once; a failure is no error."""
    tag = os.path.join(root, "CACHEDIR.TAG")
    if not os.path.lexists(tag):
        try:
            fd = os.open(tag, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(TAG)
        except OSError:
            pass


def key_name(url: str, version: str, block_bytes: int) -> str:
    """The name part of an object's blocks."""
    return hashlib.sha256(f"{url}\n{version}\n{block_bytes}".encode()).hexdigest()[:40]


def block_digest(url: str, version: str, block_bytes: int, index: int) -> bytes:
    """What a block's header must hold to be trusted as block ``index`` of (url, version)."""
    return hashlib.sha256(f"{url}\n{version}\n{block_bytes}\n{index}".encode()).digest()


def is_ours(name: str) -> bool:
    """Whether a file name in a ``KK`` folder is one this module writes."""
    return bool(_BLOCK.fullmatch(name) or _PARTIAL.fullmatch(name) or _LOCK.fullmatch(name))


def real_folder(path: str) -> bool:
    """Create ``path`` (0700) if missing; True if it is a folder and not a symbolic link."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode)


# -- one block ---------------------------------------------------------------------------------

def block_size(length: int) -> int:
    """The size of the file of a block of ``length`` bytes (what the ledger counts for it)."""
    return HEADER.size + length


def length_of(size: int) -> int:
    """The length of the block whose file has ``size`` bytes (-1: no block's file has that size)."""
    return size - HEADER.size if size >= HEADER.size else -1


class Block(NamedTuple):
    """A block's file open for reading (``fd``, locked shared; its bytes from :data:`HEADER`'s
    end), trusted by its header and length; ``crc`` the CRC-32 its bytes had when written."""

    fd: int
    length: int
    crc: int
    path: str
    st: os.stat_result


def intact(block: Block, data: Any) -> bool:
    """Whether ``data`` (the block's bytes as read) are whole and match the CRC-32 written with them."""
    return len(data) == block.length and zlib.crc32(data) == block.crc


def write_partial(path: str, digest: bytes, data: bytes) -> Tuple[str, int]:
    """Write a block to a ``.partial`` beside ``path`` (created exclusively, never through a
    link), to be renamed into place when whole (:meth:`Ledger.settle`). Its time is now (the start
    of its LRU life). Returns the partial's path and its size; an ``OSError`` leaves no file."""
    partial = f"{path[:-4]}.{os.urandom(8).hex()}.partial"
    head = HEADER.pack(MAGIC, digest, len(data), zlib.crc32(data))
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
    with removed_on_error(partial):
        try:
            done = os.writev(fd, [head, data])  # (no copy of the block into one buffer)
            while done < len(head) + len(data):
                done += os.pwrite(fd, head[done:] if done < len(head) else memoryview(data)[done - len(head):], done)
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
        finally:
            os.close(fd)
    return partial, len(head) + len(data)


@contextlib.contextmanager
def removed_on_error(partial: str) -> Iterator[None]:
    """Remove ``partial`` if the block raises (any exception, a Ctrl-C included), then re-raise."""
    try:
        yield
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


def open_block(path: str, digest: bytes) -> Tuple[Optional[Block], Optional[str], Optional[os.stat_result]]:
    """Open a block to read it: ``(block, None, st)`` with a shared lock held (close its fd to
    release it), its time set to now; ``(None, None, None)`` when there is none; ``(None, why,
    st)`` when the file there is not to be trusted (the caller removes it: :meth:`Ledger.drop`)."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except (FileNotFoundError, NotADirectoryError):
        return None, None, None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, None, None  # a link where a block should be: never followed, never removed
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        st = os.fstat(fd)
        if st.st_nlink == 0:  # evicted between the open and the lock
            os.close(fd)
            return None, None, None
        why, crc = _check(fd, st, digest)
        if why is not None:
            os.close(fd)
            return None, why, st
        now = time.time_ns()
        os.utime(fd, ns=(now, now))  # the LRU's access time
        return Block(fd, length_of(st.st_size), crc, path, st), None, st
    except BaseException:
        os.close(fd)
        raise


def _check(fd: int, st: os.stat_result, digest: bytes) -> Tuple[Optional[str], int]:
    if not stat.S_ISREG(st.st_mode) or st.st_size < HEADER.size:
        return "not a block file", 0
    magic, found, length, crc = HEADER.unpack(os.pread(fd, HEADER.size, 0))
    if magic != MAGIC or found != digest:
        return "header does not name this block", 0
    if st.st_size != block_size(length):
        return f"{st.st_size} bytes where the header says {block_size(length)}", 0
    return None, crc


def remove_if_same(path: str, st: os.stat_result) -> bool:
    """Unlink ``path`` if it still names the file ``st`` describes."""
    try:
        now = os.lstat(path)
        if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
            os.unlink(path)
            return True
    except OSError:
        pass
    return False


# -- locks -------------------------------------------------------------------------------------

def lock_fetch(path: str) -> int:
    """Take the fetch lock of a block (waiting for a writer that holds it): the fd, to give to
    :func:`unlock_fetch`. The lock file is the one ``path`` names when the lock is granted (a
    writer removes it when done, so a waiter may have locked a file no longer there: it retries);
    it records no reservation yet (one a dead fetcher left there is gone)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            mine = os.fstat(fd)
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            if mine.st_size:
                os.ftruncate(fd, 0)
            return fd
        os.close(fd)


def unlock_fetch(fd: int, path: str) -> None:
    """Remove the lock file (still holding it: see :func:`lock_fetch`) and release it."""
    try:
        os.unlink(path)
    except OSError:
        pass
    os.close(fd)


def _record(fd: int, reserved: int) -> None:
    """Write in a held fetch lock the room its fetch has reserved in the ledger (under the ledger's lock)."""
    os.pwrite(fd, _COUNT.pack(reserved), 0)


def _recorded(fd: int) -> int:
    data = os.pread(fd, _COUNT.size, 0)
    return _COUNT.unpack(data)[0] if len(data) == _COUNT.size else 0


class FileLock:
    """An exclusive ``flock`` on a file of the cache folder, as a context manager; the file holds
    a number (the ledger: :meth:`value`, :meth:`set`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> "FileLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _OPEN, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
        self.fd = -1

    def value(self) -> int:
        data = os.pread(self.fd, 8, 0)
        return struct.unpack("<q", data)[0] if len(data) == 8 else 0

    def set(self, value: int) -> None:
        os.pwrite(self.fd, struct.pack("<q", max(0, int(value))), 0)


class Ledger:
    """The bytes of the folder, shared by every process of the node: the sizes of its blocks'
    files plus the room each fetch in flight has reserved (a whole block's file, from before its
    fetch until its file is in place), in the file ``usage`` under ``flock``. A fetch reserves room
    before it writes anything (evicting first if there is none: :meth:`reserve`), records what it
    reserved in its fetch lock, and renames its block into place under the ledger's lock
    (:meth:`settle`); every removal of a block is counted under it too. So the blocks' files,
    those being written included, never take more than what the ledger counts, and the ledger
    never passes the limit of the process that reserves. An eviction's scan sets it from the
    files and the reservations of the fetches alive (those of a process that died are dropped)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, "usage")
        self._evicting = os.path.join(root, "evict.lock")

    def usage(self) -> int:
        """Bytes counted now."""
        with FileLock(self.path) as ledger:
            return ledger.value()

    def reserve(self, lock_fd: int, n: int, limit: int) -> Tuple[bool, int, int]:
        """Reserve ``n`` bytes for the fetch holding ``lock_fd`` if they fit ``limit``, evicting the
        least recently used blocks if they do not: ``(reserved, blocks evicted, bytes evicted)``;
        not reserved when no room can be made (the blocks held are all being read)."""
        with FileLock(self.path) as ledger:
            used = ledger.value()
            if used + n <= limit:
                _record(lock_fd, n)
                ledger.set(used + n)
                return True, 0, 0
        with FileLock(self._evicting), FileLock(self.path) as ledger:
            used = ledger.value()
            if used + n <= limit:
                _record(lock_fd, n)
                ledger.set(used + n)
                return True, 0, 0
            held, total = scan(self.root)
            total, removed, removed_bytes = evict(held, total, limit - n - eviction_slack(limit, n))
            fits = total + n <= limit
            if fits:
                _record(lock_fd, n)
            ledger.set(total + n if fits else total)
            return fits, removed, removed_bytes

    def settle(self, lock_fd: int, n: int, partial: str, path: str, size: int) -> Optional[os.stat_result]:
        """Put a block written to ``partial`` in place, its file of ``size`` bytes counted instead
        of the ``n`` reserved: the placed file's stat (None if it cannot be had); an ``OSError``
        of the renaming removes the partial (the reservation is left to :meth:`release`)."""
        with FileLock(self.path) as ledger:
            with removed_on_error(partial):
                os.rename(partial, path)
            _record(lock_fd, 0)
            ledger.set(ledger.value() - (n - size))
            try:
                return os.stat(path)  # (no eviction removes it while the ledger is held)
            except OSError:
                return None

    def release(self, lock_fd: int, n: int) -> None:
        """Give back ``n`` bytes reserved by the fetch holding ``lock_fd`` (set right by the next scan on a failure)."""
        try:
            with FileLock(self.path) as ledger:
                _record(lock_fd, 0)
                ledger.set(ledger.value() - n)
        except OSError:
            pass

    def drop(self, path: str, st: os.stat_result, most: int) -> None:
        """Remove the block file ``st`` (found damaged) if ``path`` still names it, and its bytes
        from the ledger (``most`` at most: what a block's file was counted for)."""
        try:
            with FileLock(self.path) as ledger:
                if remove_if_same(path, st):
                    ledger.set(ledger.value() - min(st.st_size, most))
        except OSError:
            pass  # set right by the next scan

    def trim(self, limit: int) -> Tuple[int, int]:
        """Evict down to ``limit`` if the ledger is over it (a job opening a folder with a smaller
        limit than the one before): ``(blocks evicted, bytes evicted)``."""
        if self.usage() <= limit:
            return 0, 0
        with FileLock(self._evicting), FileLock(self.path) as ledger:
            held, total = scan(self.root)
            total, removed, removed_bytes = evict(held, total, limit)
            ledger.set(total)
            return removed, removed_bytes

    def rescan(self) -> None:
        """Set the ledger from the files (a new folder, or one whose ledger went missing)."""
        with FileLock(self._evicting), FileLock(self.path) as ledger:
            ledger.set(scan(self.root)[1])


# -- the folder as a whole ---------------------------------------------------------------------

@dataclass
class Held:
    """A block found by a scan."""

    path: str
    size: int
    time_ns: int


def scan(root: str) -> Tuple[List[Held], int]:
    """The blocks under ``root`` (the namespace folder), least recently used first, and the bytes
    to count in all: the blocks' files, plus the room each live fetch has reserved (recorded in
    its lock; to be called under the ledger's lock, where reservations change). Partials and lock
    files left by fetches that died are removed on the way."""
    held: List[Held] = []
    reserved = 0
    with os.scandir(root) as top:
        subdirs = [e.path for e in top if _SUBDIR.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    for sub in subdirs:
        with os.scandir(sub) as entries:
            listed = [e for e in entries if e.is_file(follow_symlinks=False)]
        partials: dict = {}
        fetches = set()
        for e in listed:
            if _BLOCK.fullmatch(e.name):
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                held.append(Held(e.path, st.st_size, st.st_mtime_ns))
            elif _PARTIAL.fullmatch(e.name):
                partials.setdefault(_PARTIAL.fullmatch(e.name)[1], []).append(e.path)
            elif _LOCK.fullmatch(e.name):
                fetches.add(_LOCK.fullmatch(e.name)[1])
        for base in fetches | set(partials):
            reserved += _fetch_alive(os.path.join(sub, base + ".lock"), partials.get(base, []))
    held.sort(key=lambda h: h.time_ns)
    return held, sum(h.size for h in held) + reserved


def _fetch_alive(lock: str, partials: List[str]) -> int:
    """The room reserved by the fetch that holds ``lock``; if none holds it, the fetch died (or
    ended): remove its partials and the lock file (under the lock, as :func:`unlock_fetch`), 0."""
    try:
        fd = os.open(lock, os.O_RDWR | _OPEN)
    except FileNotFoundError:
        fd = None
    except OSError:
        return 0  # not ours to judge (a link): leave it
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return _recorded(fd)
            finally:
                os.close(fd)
        if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != _ino(lock):
            os.close(fd)
            return 0  # replaced meanwhile: its fetch reserves nothing before this scan ends
    for path in partials:
        try:
            os.unlink(path)
        except OSError:
            pass
    if fd is not None:
        unlock_fetch(fd, lock)
    return 0


def _ino(path: str) -> Tuple[int, int]:
    try:
        st = os.lstat(path)
        return st.st_ino, st.st_dev
    except OSError:
        return -1, -1


def evict(held: List[Held], total: int, target: int) -> Tuple[int, int, int]:
    """Remove the least recently used blocks of ``held`` (a :func:`scan`) until ``total`` is at
    most ``target``, passing over blocks a reader holds: ``(total left, blocks removed, bytes
    removed)``."""
    removed = removed_bytes = 0
    for h in held:
        if total <= target:
            break
        try:
            fd = os.open(h.path, os.O_RDONLY | _OPEN)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being read
            if remove_if_same(h.path, os.fstat(fd)):
                total -= h.size
                removed += 1
                removed_bytes += h.size
        finally:
            os.close(fd)
    return total, removed, removed_bytes
