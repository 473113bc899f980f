"""Writing shards, in parallel processes that end with the writer.

Each shard is a plain ustar tar of ``KEY.<image ext>``, ``KEY.cls`` and ``KEY.txt`` (with a
caption) members, written to the path it is given (a temporary name: the commit renames it).
Every image is checked as the loader checks it (:func:`dalistream.kinds.image_problem`: a
known signature, the JPEG end-of-image and PNG ``IEND`` markers), so a 0-byte, cut or
mis-named file is never written as a sample: every bad one is named, as ``(source file,
problem)`` in :attr:`Written.bad`. With ``on_bad="skip"`` it is left out and counted; with
``"error"`` (the default) the shards are still checked to their end, so that the error names every
bad image at once, but a shard stops writing samples at its first (the writer keeps none of them).

The processes (:func:`run`) die with the writer, by any signal
(:func:`dalistream.lifetime.die_with_parent`), ignore Ctrl-C (the writer handles it once and
stops them) and stop at the next image once the writer gives up (an error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import sys
import tarfile
import threading
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..lifetime import die_with_parent
from ..kinds import image_problem
from .inputs import Item, image_ext

ON_BAD = ("error", "skip")


@dataclass
class Written:
    """One shard's outcome: its temporary path, ``(key, source path)`` of each sample written, and
    ``(source path, problem)`` of each bad image (left out)."""

    path: str
    samples: List[Tuple[str, str]] = field(default_factory=list)
    bad: List[Tuple[str, str]] = field(default_factory=list)


class Stopped(Exception):
    """The writer gave up (another shard failed, Ctrl-C, SIGTERM): this shard is not finished."""


_stop: Any = None  # the writer's stop event, in a child process


def _start_child(parent: int, main_thread: Optional[int], stop: Any) -> None:
    """A writer process's first call: end with the writer, leave Ctrl-C to it, see its stop event."""
    global _stop
    # the death signal follows the thread that forked: only the writer's main thread lives as long as it
    die_with_parent(parent, death_signal=main_thread is not None and threading.get_ident() == main_thread)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _stop = stop


def _image(item: Item) -> Tuple[Optional[bytes], Optional[str]]:
    """An item's bytes, or what is wrong with them."""
    try:
        with open(item.path, "rb") as f:
            data = f.read()
    except OSError as e:
        return None, f"cannot be read: {e.strerror or e}"
    problem = image_problem(data)
    return (None, problem) if problem else (data, None)


def write_shard(path: str, items: Sequence[Item], keys: Sequence[str], on_bad: str = "error") -> Written:
    """One shard at ``path``: for each item ``KEY.<image ext>``, ``KEY.cls`` and ``KEY.txt``; a bad
    image is left out and named in :attr:`Written.bad`. With ``on_bad="error"``, the items after
    the first bad one are only checked (the writer keeps no shard of a write that fails)."""
    done = Written(path)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, item in zip(keys, items):
            if _stop is not None and _stop.is_set():
                raise Stopped()
            image, problem = _image(item)
            if problem is not None:
                done.bad.append((item.path, problem))
                continue
            if on_bad == "error" and done.bad:
                continue  # checked: the error names it too if it is bad
            members = [(image_ext(item.path), image), ("cls", str(item.label).encode())]
            if item.caption is not None:
                members.append(("txt", item.caption.encode("utf-8")))
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
            done.samples.append((key, item.path))
    return done


Job = Tuple[str, Sequence[Item], Sequence[str], str]  # (path, items, keys, on_bad)


def run(jobs: Sequence[Job], processes: int, done: Optional[Callable[[Written], None]] = None) -> List[Written]:
    """Write every job's shard, in ``processes`` processes (1: here); the results in job order.
    ``done(written)`` is called here as each shard is finished, in the order they finish.

    The first failure (an error writing a shard, an error of ``done``),
    or an exception here (Ctrl-C, or SIGTERM turned into one), stops the others at their next
    image; the processes are gone when this returns or raises."""
    if processes <= 1:
        out = []
        for job in jobs:
            out.append(write_shard(*job))
            if done:
                done(out[-1])
        return out
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    stop = context.Event()
    main = threading.main_thread().ident if threading.current_thread() is threading.main_thread() else None
    pool = ProcessPoolExecutor(max_workers=processes, mp_context=context, initializer=_start_child,
                               initargs=(os.getpid(), main, stop))
    futures = []
    try:
        futures = [pool.submit(write_shard, *job) for job in jobs]
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in finished:
                error = future.exception()
                if error is not None:
                    raise error
                if done:
                    done(future.result())
        return [f.result() for f in futures]
    except BaseException:
        stop.set()
        for f in futures:
            f.cancel()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
