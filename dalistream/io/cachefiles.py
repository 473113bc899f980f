"""The byte cache's files (:mod:`.cache`): names, the checked block record, the locks that let
every process of a node share one folder, the ledger of bytes held, and eviction.

Everything lives in one folder of its own, ``<cache>/dalistream-bytes-v1/``; nothing outside it
is ever written or removed, and inside it only names of this module's forms are (a file a user
puts there is left alone; a symbolic link is never followed):

- ``KK/<key>-<block>.blk``: a block, a :data:`HEADER` then its bytes. ``key`` is a digest of
  (URL, version, block size), so a changed object has other names and is never served stale.
  The header repeats the digest with the block index, the length and a CRC-32; a reader trusts a
  block only when the digest and the file length agree, and checks the CRC once after each boot
  of the machine (a crash can leave a renamed file whose bytes never reached the disk; a killed
  process cannot: blocks are written to a ``.partial`` file and renamed into place).
- ``KK/<key>-<block>.<random>.partial``: a block being written.
- ``KK/<key>-<block>.lock``: exists while one process fetches the block; others wait on its
  ``flock`` and find the block when it goes away. A writer that dies releases it with its life.
- ``usage``: the bytes the blocks take (8 bytes, under ``flock``), kept by the writers and set
  right by every eviction's scan; ``evict.lock``: one evicting process at a time.

Sizes: :func:`parse_size` reads a limit (``"800GB"``); :func:`auto_limit` is the one taken when
none is given.

Readers hold a shared ``flock`` on a block while they read it; eviction removes a block only
with an exclusive one, taken without waiting, so a block being read is never removed.
"""

from __future__ import annotations

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
from typing import Any, List, Optional, Tuple

from ..errors import ConfigError

NAMESPACE = "dalistream-bytes-v1"
HEADER = struct.Struct("<8s32sQI16s4x")  # magic, digest, length, CRC-32, boot id of the writer
MAGIC = b"DSBLOCK1"
BOOT_AT = 8 + 32 + 8 + 4  # where the boot id sits in the header
TAG = b"Signature: 8a477f597d28d172789f06886806bc55\n# dalistream's byte cache (backup tools skip this folder)\n"
_BLOCK = re.compile(r"[0-9a-f]{40}-[0-9a-f]{8,}\.blk")
_PARTIAL = re.compile(r"([0-9a-f]{40}-[0-9a-f]{8,})\.[0-9a-f]{16}\.partial")
_LOCK = re.compile(r"[0-9a-f]{40}-[0-9a-f]{8,}\.lock")
_SUBDIR = re.compile(r"[0-9a-f]{2}")
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


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


def boot_id() -> bytes:
    """This boot of the machine (16 bytes; zeros where the system does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return bytes.fromhex(f.read().strip().replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)


BOOT = boot_id()


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

def write_block(path: str, digest: bytes, data: bytes) -> int:
    """Write a block: a ``.partial`` beside ``path`` (created exclusively, never through a
    link), renamed into place when whole. Its time is now (the start of its LRU life). Returns
    the file's size; an ``OSError`` leaves no file behind."""
    partial = f"{path[:-4]}.{os.urandom(8).hex()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
    try:
        try:
            head = HEADER.pack(MAGIC, digest, len(data), zlib.crc32(data), BOOT)
            done = os.writev(fd, [head, data])  # (no copy of the block into one buffer)
            while done < HEADER.size + len(data):
                done += os.pwrite(fd, (head + data)[done:] if done < HEADER.size else
                                  memoryview(data)[done - HEADER.size:], done)
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
        finally:
            os.close(fd)
        os.rename(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise
    return HEADER.size + len(data)


def open_block(path: str, digest: bytes) -> Tuple[Optional[int], int, Optional[str]]:
    """Open a block to read it: ``(fd, length, None)`` with a shared lock held (close the fd to
    release it), its time set to now; ``(None, 0, None)`` when there is none; ``(None, 0, why)``
    when the file there is not to be trusted (it is then removed)."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except (FileNotFoundError, NotADirectoryError):
        return None, 0, None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, 0, None  # a link where a block should be: never followed, never removed
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        st = os.fstat(fd)
        if st.st_nlink == 0:  # evicted between the open and the lock
            os.close(fd)
            return None, 0, None
        why = _check(fd, st, digest)
        if why is not None:
            os.close(fd)
            remove_if_same(path, st)
            return None, 0, why
        now = time.time_ns()
        os.utime(fd, ns=(now, now))  # the LRU's access time
        return fd, st.st_size - HEADER.size, None
    except BaseException:
        os.close(fd)
        raise


def _check(fd: int, st: os.stat_result, digest: bytes) -> Optional[str]:
    if not stat.S_ISREG(st.st_mode) or st.st_size < HEADER.size:
        return "not a block file"
    magic, found, length, crc, boot = HEADER.unpack(os.pread(fd, HEADER.size, 0))
    if magic != MAGIC or found != digest:
        return "header does not name this block"
    if st.st_size != HEADER.size + length:
        return f"{st.st_size - HEADER.size} bytes where the header says {length}"
    if boot != BOOT or BOOT == bytes(16):  # written before this boot: its bytes may not have reached the disk
        data = os.pread(fd, length, HEADER.size)
        if len(data) != length or zlib.crc32(data) != crc:
            return "checksum mismatch (written before the machine restarted)"
        if BOOT != bytes(16):
            try:
                _mark_checked(fd)
            except OSError:
                pass  # checked again next time
    return None


def _mark_checked(fd: int) -> None:
    """Record in the header that this boot has checked the block (its CRC need not be read again)."""
    wfd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.pwrite(wfd, BOOT, BOOT_AT)
    finally:
        os.close(wfd)


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
    writer removes it when done, so a waiter may have locked a file no longer there: it retries)."""
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
            return fd
        os.close(fd)


def unlock_fetch(fd: int, path: str) -> None:
    """Remove the lock file (still holding it: see :func:`lock_fetch`) and release it."""
    try:
        os.unlink(path)
    except OSError:
        pass
    os.close(fd)


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


# -- the folder as a whole ---------------------------------------------------------------------

@dataclass
class Held:
    """A block found by a scan."""

    path: str
    size: int
    time_ns: int


def scan(root: str, block_bytes: int) -> Tuple[List[Held], int]:
    """The blocks under ``root`` (the namespace folder), least recently used first, and the bytes
    held in all: blocks, plus a block's worth for each ``.partial`` a live writer holds. Partials
    and lock files left by writers that died are removed on the way."""
    held: List[Held] = []
    writing = 0
    with os.scandir(root) as top:
        subdirs = [e.path for e in top if _SUBDIR.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    for sub in subdirs:
        with os.scandir(sub) as entries:
            listed = [e for e in entries if e.is_file(follow_symlinks=False)]
        partials = {}
        for e in listed:
            if _BLOCK.fullmatch(e.name):
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                held.append(Held(e.path, st.st_size, st.st_mtime_ns))
            else:
                match = _PARTIAL.fullmatch(e.name)
                if match:
                    partials.setdefault(match[1], []).append(e.path)
        for base, paths in partials.items():
            if _writer_alive(os.path.join(sub, base + ".lock"), paths):
                writing += block_bytes + HEADER.size
    held.sort(key=lambda h: h.time_ns)
    return held, sum(h.size for h in held) + writing


def _writer_alive(lock: str, partials: List[str]) -> bool:
    """Whether a writer holds the lock of these partials; if none does, they are left by a
    writer that died: remove them (and the lock file, under the lock, as :func:`unlock_fetch`)."""
    try:
        fd = os.open(lock, os.O_RDWR | _OPEN)
    except FileNotFoundError:
        fd = None
    except OSError:
        return True  # not ours to judge (a link): leave it
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return True
        if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != _ino(lock):
            os.close(fd)
            return True  # replaced meanwhile: judged at the next scan
    for path in partials:
        try:
            os.unlink(path)
        except OSError:
            pass
    if fd is not None:
        unlock_fetch(fd, lock)
    return False


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
