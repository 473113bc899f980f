"""Nothing outlives its parent: child processes that end with the process that started them, and
temporary folders that name their owner, so that the next run removes those of a dead one.

A process killed by a signal (SIGTERM from a scheduler, SIGKILL from the out-of-memory killer)
runs no clean-up of its own: its children (DALI's workers, the writer's processes) would wait
for ever on queues nobody feeds, and its temporary folders would stay. So each child watches
its parent (:func:`die_with_parent`): on Linux the kernel sends it SIGKILL when the parent dies
(``prctl(PR_SET_PDEATHSIG)``), and everywhere a daemon thread sees the parent gone within
:data:`WATCH_S` and ends the child. Temporary folders are made by :func:`temp_folder`, named
``dalistream-KIND-HOST.PID-XXXXXXXX``; :func:`reclaim_temp_folders` (called by every
:func:`temp_folder`) removes those whose owner, on this host, is no longer running.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from typing import List, Optional

log = logging.getLogger(__name__)

WATCH_S = 0.25  # how often a child looks whether its parent is still there
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_TEMP_NAME = re.compile(r"^dalistream-(?P<kind>[a-z]+)-(?P<host>[0-9a-f]{8})\.(?P<pid>\d+)-")


# -- child processes ---------------------------------------------------------------------------

def set_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when the thread that started it ends (its
    parent's main thread, for a process forked or spawned from it). False where not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def alive(pid: int) -> bool:
    """True while a process ``pid`` runs (one of another user counts; a zombie, dead but not yet
    reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): it exists


def die_with_parent(parent_pid: int, death_signal: bool = True) -> None:
    """In a child process: end it when ``parent_pid`` ends, by any signal, SIGKILL included.

    ``death_signal``: also ask the kernel for SIGKILL at the parent's death (Linux), which is
    right only when the thread that started this process lives as long as the parent process
    (its main thread): the kernel sends the signal when that *thread* ends. Either way a daemon
    thread watches the parent: gone (this process adopted by another) or no longer running, the
    child exits at once. A parent that is not this process's parent at all (a fork server
    started it) is watched by its pid."""
    direct = os.getppid() == parent_pid
    if death_signal and direct:
        set_death_signal()
    if not alive(parent_pid):
        os._exit(1)  # the parent died before the watch began
    thread = threading.Thread(target=_watch, args=(parent_pid, direct), name="dalistream-parent-watch", daemon=True)
    thread.start()


def _watch(parent_pid: int, direct: bool) -> None:
    stop = threading.Event()  # never set: a timed wait that signals cannot cut short for ever
    while True:
        stop.wait(WATCH_S)
        if (os.getppid() != parent_pid) if direct else not alive(parent_pid):
            os._exit(1)


# -- temporary folders ---------------------------------------------------------------------------

def host_tag() -> str:
    """8 hex digits for this host and process-id namespace: a folder of a process with the same
    pid on another machine sharing the temp folder, or in another container, is not judged here."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}|{namespace}".encode()).hexdigest()[:8]


def owner_tag(pid: Optional[int] = None) -> str:
    """``HOST.PID``, the owner part of a temporary folder's name."""
    return f"{host_tag()}.{os.getpid() if pid is None else pid}"


def temp_folder(kind: str, root: Optional[str] = None) -> str:
    """A new private temporary folder ``dalistream-KIND-HOST.PID-XXXXXXXX`` (in ``root``, by default
    the system's temp folder), after removing those of owners no longer running."""
    if not kind.isalpha() or not kind.islower():
        raise ValueError(f"a temporary folder's kind is lowercase letters, got {kind!r}")
    reclaim_temp_folders(root)
    return tempfile.mkdtemp(prefix=f"dalistream-{kind}-{owner_tag()}-", dir=root)


def reclaim_temp_folders(root: Optional[str] = None) -> List[str]:
    """Remove the temporary folders (any kind) whose owner on this host has ended: what a process
    killed by a signal left behind. Returns the folders removed. Folders of running processes,
    of other hosts, and names not made by :func:`temp_folder` are left alone."""
    root = root or tempfile.gettempdir()
    host = host_tag()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match is None or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or alive(pid):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
                removed.append(entry.path)
        except OSError as e:
            log.debug("could not remove %s, left by process %d: %s", entry.path, pid, e)
    if removed:
        log.info("removed %d temporary folders left by processes that ended: %s", len(removed), ", ".join(removed))
    return removed
