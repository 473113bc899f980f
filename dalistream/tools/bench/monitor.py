"""Memory of a process tree, sampled from ``/proc`` while a benchmark child runs (Linux only).

:func:`watch` starts a process, samples its whole tree (the child, DALI's worker processes,
DataLoader workers, the resource tracker) every ``interval`` seconds and returns the peaks:

- ``peak_rss_mb``: the largest sum of ``VmRSS`` over the tree (shared pages count once per
  process, so forked workers sharing libraries are over-counted);
- ``peak_pss_mb``: the largest sum of ``Pss`` (``smaps_rollup``: shared pages split between
  the processes that map them; the fairest "memory of the tree" figure);
- ``peak_shm_mb``: the largest total size of the shared-memory objects (``/dev/shm`` files,
  deleted or not, and ``memfd:`` objects) the tree holds open or mapped, each counted once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Dict, IO, List, Optional, Sequence, Tuple

MB = 1 << 20


def tree(pid: int) -> List[int]:
    """``pid`` and all its descendants (from ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return out


def _times(pid: int) -> Tuple[int, int]:
    """Clock ticks (user + system) of process ``pid`` itself and of the children it waited for
    (fields 14–17 of ``/proc/PID/stat``); ``(0, 0)`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    except (OSError, ValueError, IndexError):
        return 0, 0


def split_cpu_s(pid: int) -> Tuple[float, float]:
    """CPU seconds so far of the process ``pid`` alone and of its descendants (live ones, and the
    ones it or they have waited for), from one reading of ``pid``'s own counters: the second
    never includes the first's growth while the tree is read, so it never goes backwards."""
    own, reaped = _times(pid)
    below = sum(sum(_times(p)) for p in tree(pid) if p != pid)
    tick = os.sysconf("SC_CLK_TCK")
    return own / tick, (reaped + below) / tick


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by the tree under ``pid``: its live processes and
    the descendants they have waited for (a worker that exited mid-run still counts)."""
    return sum(sum(_times(p)) for p in tree(pid)) / os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _is_shm(target: str) -> bool:
    return target.startswith("/dev/shm/") or target.startswith("/memfd:") or target.startswith("memfd:")


def _shm_objects(pid: int, found: Dict[Tuple[int, int], int]) -> None:
    """Add ``(device, inode) -> size`` of the shared-memory objects ``pid`` has open or mapped."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        try:
            if not _is_shm(os.readlink(f"{fd_dir}/{fd}")):
                continue
            st = os.stat(f"{fd_dir}/{fd}")
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        found[key] = max(found.get(key, 0), st.st_size)
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not _is_shm(parts[5].strip()):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                key = (os.makedev(major, minor), int(parts[4]))  # sized by the largest mapping too
                found[key] = max(found.get(key, 0), hi - lo)
    except (OSError, ValueError):
        pass


def sample(pid: int) -> Dict[str, float]:
    """One reading of the tree under ``pid``: RSS, PSS and shared memory in MB, process count."""
    pids = tree(pid)
    shm: Dict[Tuple[int, int], int] = {}
    for p in pids:
        _shm_objects(p, shm)
    return {
        "rss_mb": sum(_status_kb(p, "VmRSS:") for p in pids) / 1024,
        "pss_mb": sum(_pss_kb(p) for p in pids) / 1024,
        "shm_mb": sum(shm.values()) / MB,
        "processes": len(pids),
    }


# A reading costs the monitor CPU (``smaps_rollup`` walks the page tables of every process: ~20 ms
# for a 500 MB DALI process) and holds the process's memory map lock meanwhile, which stalls the
# measured run. Readings are spaced so that they take at most this share of one core.
MONITOR_SHARE = 0.02


def watch(cmd: Sequence[str], *, interval: float = 0.05, timeout: Optional[float] = None,
          stdout: Optional[IO] = None, stderr: Optional[IO] = None,
          env: Optional[Dict[str, str]] = None) -> Dict[str, float]:
    """Run ``cmd``, sampling its process tree every ``interval`` s until it exits.

    Returns the return code, the peaks (``peak_rss_mb``, ``peak_pss_mb``, ``peak_shm_mb``,
    ``processes``), the wall time and ``cpu_s``, the CPU time of the child and the descendants
    it waited for, and ``monitor_cpu_s``, what the readings cost. Readings come every
    ``interval`` s or less often: at most :data:`MONITOR_SHARE` of a core goes to them. A child
    still running after ``timeout`` s is killed
    (``returncode`` then is ``-9``).
    """
    start = time.perf_counter()
    # its own process group: a terminal's Ctrl-C reaches this process alone, which then stops the
    # child's whole group (its DALI workers too, even once orphaned) and waits for it
    proc = subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, env=env, start_new_session=True)
    peaks: Dict[str, float] = {"peak_rss_mb": 0.0, "peak_pss_mb": 0.0, "peak_shm_mb": 0.0, "processes": 0}
    status, usage = None, None  # set once the child has been waited for
    spent = 0.0
    try:
        while True:
            done, status_now, usage_now = os.wait4(proc.pid, os.WNOHANG)  # (0, 0, …) while it runs
            if done:
                status, usage = status_now, usage_now
                break
            before = time.process_time()
            s = sample(proc.pid)
            cost = time.process_time() - before
            spent += cost
            for key in ("rss_mb", "pss_mb", "shm_mb"):
                peaks["peak_" + key] = max(peaks["peak_" + key], s[key])
            peaks["processes"] = max(peaks["processes"], s["processes"])
            if timeout is not None and time.perf_counter() - start > timeout:
                status, usage = stop_group(proc.pid, grace_s=0.0)
                break
            time.sleep(max(interval, cost / MONITOR_SHARE))
    finally:
        if status is None:  # interrupted (Ctrl-C) or failed: the child's group goes with us
            status, usage = stop_group(proc.pid)
    proc.returncode = os.waitstatus_to_exitcode(status)
    peaks["returncode"] = proc.returncode
    peaks["wall_s"] = time.perf_counter() - start
    # the child and every descendant it waited for (DALI and DataLoader workers are joined)
    peaks["cpu_s"] = usage.ru_utime + usage.ru_stime
    peaks["monitor_cpu_s"] = spent
    return peaks


def stop_group(pid: int, grace_s: float = 10.0) -> Tuple[int, Any]:
    """Stop the process group led by child ``pid`` and wait for all of it: SIGINT (the child shuts
    its DALI workers down as on a Ctrl-C), up to ``grace_s`` for every member to exit, then SIGKILL;
    returns the child's wait status and resource usage. Bounded: at most ``grace_s`` plus a kill."""
    def group_alive() -> bool:
        try:
            os.killpg(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def signal_group(sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except OSError:
            pass

    status = usage = None
    signal_group(signal.SIGINT if grace_s > 0 else signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if status is None:
            done, status_now, usage_now = os.wait4(pid, os.WNOHANG)
            if done:
                status, usage = status_now, usage_now
        if status is not None and not group_alive():
            return status, usage
        time.sleep(0.05)
    signal_group(signal.SIGKILL)
    if status is None:
        _, status, usage = os.wait4(pid, 0)
    for _ in range(200):  # orphaned members are reaped by init: wait (bounded) until they are gone
        if not group_alive():
            break
        time.sleep(0.05)
    return status, usage
