"""The versions of remote objects a process has stated, for the byte cache (:mod:`.cache`): a
block is served only for the version its object has now, so a stream reading through the cache
states its object first (a HEAD, or the store's metadata call). Each object is stated at most
once per ``version_check_s`` by a process however many streams want it at once (they wait for
the one request), and a worker states the objects it is about to read ahead, in parallel
(:func:`ahead`), so that its streams, opened one after the other, do not each wait for a round
trip. A version is trusted for ``version_check_s`` from the moment its statement was *asked*
(the answer describes the object at some time after that), never longer."""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable, Dict, Iterable, Optional, Tuple

Stated = Tuple[Optional[str], Optional[int]]  # (version, size)
AHEAD_THREADS = 16  # statements in flight at once for the read-ahead of versions


class _Entry:
    """One object's statement: pending until ``done`` is set, then its result (none: it failed)."""

    def __init__(self, asked: float, previous: Optional["_Entry"] = None) -> None:
        self.asked = asked
        self.done = threading.Event()
        self.result: Optional[Stated] = None
        self.previous = previous  # a statement ahead replaces this one, still trusted until it expires


_book: Dict[str, _Entry] = {}
_lock = threading.Lock()
_queue: "queue.Queue[Tuple[str, float, Callable[[], Stated]]]" = queue.Queue()
_threads: list = []


def stated(key: str, ttl: float, state: Callable[[], Stated]) -> Stated:
    """``(version, size)`` of the object ``key``: as stated by this process less than ``ttl``
    seconds ago (or being stated now: waited for), else by ``state()`` now. A statement that
    failed is not kept: the next call states the object again (and raises what it meets)."""
    while True:
        now = time.monotonic()
        with _lock:
            entry = _book.get(key)
            if entry is None or now - entry.asked >= ttl:  # (a failed statement is not in the book)
                entry = _book[key] = _Entry(now)
                mine = True
            else:
                mine = False
                old = entry.previous
                if not entry.done.is_set() and old is not None and old.result is not None and now - old.asked < ttl:
                    return old.result  # (being stated again ahead: the last statement still holds)
        if mine:
            return _run(key, entry, state)
        entry.done.wait()
        if entry.result is not None:
            return entry.result
        # (its statement failed: state it again, here, and meet the error if it persists)


def _run(key: str, entry: _Entry, state: Callable[[], Stated]) -> Stated:
    try:
        entry.result = state()
        entry.previous = None
        return entry.result
    except BaseException:
        with _lock:
            if _book.get(key) is entry:
                del _book[key]
        raise
    finally:
        entry.done.set()


def ahead(items: Iterable[Tuple[str, Callable[[], Stated]]], ttl: float) -> None:
    """Have the objects of ``items`` (``(key, state)`` each) stated in the background, in
    parallel (up to :data:`AHEAD_THREADS` at once), where this process holds no version younger
    than ``ttl``: a stream that wants one then waits for that statement alone. Errors are left
    to the streams (each states its object again and meets it)."""
    if ttl <= 0:
        return  # (every stream states its object itself)
    now = time.monotonic()
    for key, state in items:
        with _lock:
            entry = _book.get(key)
            if entry is not None and now - entry.asked < ttl / 2:
                continue  # known, or being stated (and fresh for a while yet)
            entry = _book[key] = _Entry(now, entry if entry is not None and entry.result is not None else None)
        _queue.put((key, entry, state))  # type: ignore[arg-type]
        _start_thread()


def _start_thread() -> None:
    with _lock:
        _threads[:] = [t for t in _threads if t.is_alive()]
        if len(_threads) >= AHEAD_THREADS or _queue.qsize() <= sum(1 for t in _threads if t.idle):
            return
        thread = _Stater()
        _threads.append(thread)
    thread.start()


class _Stater(threading.Thread):
    """A daemon thread stating the objects queued by :func:`ahead`; it ends when idle a while."""

    def __init__(self) -> None:
        super().__init__(name="dalistream-versions", daemon=True)
        self.idle = False

    def run(self) -> None:
        while True:
            self.idle = True
            try:
                key, entry, state = _queue.get(timeout=30)
            except queue.Empty:
                return
            self.idle = False
            try:
                _run(key, entry, state)  # type: ignore[arg-type]
            except BaseException:  # noqa: BLE001 - the stream that wants it states it again
                pass


def forget() -> None:
    """Drop every version this process holds, and the statements in flight: in a process just
    forked (a DALI worker), whose copies of them no thread would ever finish."""
    global _lock, _queue
    _lock = threading.Lock()
    _queue = queue.Queue()
    _book.clear()
    _threads.clear()


os.register_at_fork(after_in_child=forget)
