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
import subprocess
import time
from typing import Dict, IO, List, Optional, Sequence, Tuple

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
    proc = subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, env=env)
    peaks: Dict[str, float] = {"peak_rss_mb": 0.0, "peak_pss_mb": 0.0, "peak_shm_mb": 0.0, "processes": 0}
    status, usage = None, None
    spent = 0.0
    try:
        while True:
            done, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if done:
                break
            before = time.process_time()
            s = sample(proc.pid)
            cost = time.process_time() - before
            spent += cost
            for key in ("rss_mb", "pss_mb", "shm_mb"):
                peaks["peak_" + key] = max(peaks["peak_" + key], s[key])
            peaks["processes"] = max(peaks["processes"], s["processes"])
            if timeout is not None and time.perf_counter() - start > timeout:
                _kill_tree(proc.pid)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(max(interval, cost / MONITOR_SHARE))
    finally:
        if status is None:
            _kill_tree(proc.pid)
            _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    peaks["returncode"] = proc.returncode
    peaks["wall_s"] = time.perf_counter() - start
    # the child and every descendant it waited for (DALI and DataLoader workers are joined)
    peaks["cpu_s"] = usage.ru_utime + usage.ru_stime
    peaks["monitor_cpu_s"] = spent
    return peaks


def _kill_tree(pid: int) -> None:
    for p in reversed(tree(pid)):
        try:
            os.kill(p, 9)
        except OSError:
            pass
