"""Writing shards, in parallel processes that end with the writer.

Each shard is a plain ustar tar of ``KEY.<ext>`` (the file's: an image, a video, an audio
file), ``KEY.cls`` and ``KEY.txt`` (with a caption) members, written to the path it is given (a
temporary name: the commit renames it). Every image is checked as the loader checks it
(:func:`dalistream.kinds.image_problem`: a known signature, the JPEG end-of-image and PNG
``IEND`` markers); every video is probed (:func:`dalistream.kinds.probe`: its container
demuxed, its codec, frames, size and rate read) and every audio file decoded whole
(:func:`dalistream.kinds.audio.probe_audio`), with PyAV (the ``video`` extra). So a 0-byte, cut,
unreadable or mis-named file is never written as a sample: every bad one is named, as ``(source
file, problem)`` in :attr:`Written.bad`. With ``on_bad="skip"`` it is left out and counted; with
``"error"`` (the default) the shards are still checked to their end, so that the error names every
bad file at once, but a shard stops writing samples at its first (the writer keeps none of them).

What the check read is each sample's manifest keys (:data:`KEYS`: an image's size, a video's
size, frames, duration, rate and codec, an audio file's duration, rate and channels, the
caption's length), collected in :attr:`Written.keys`: nothing is read twice.

The processes (:func:`run`) die with the writer, by any signal
(:func:`dalistream.lifetime.die_with_parent`), ignore Ctrl-C (the writer handles it once and
stops them) and stop at the next file once the writer gives up (an error, Ctrl-C, SIGTERM).
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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import SampleError
from ..kinds import AUDIO_EXTS, VIDEO_EXTS, image_problem
from ..lifetime import die_with_parent
from ..manifest.keys import IMAGE_EXTS, KeySpec, sample_keys
from .inputs import Item, file_kind, member_ext

ON_BAD = ("error", "skip")
#: The keys a written sample's manifest row records.
KEYS = KeySpec(IMAGE_EXTS, ("txt",), tuple(sorted(VIDEO_EXTS)), tuple(sorted(AUDIO_EXTS)))


@dataclass
class Written:
    """One shard's outcome: its temporary path, ``(key, source path)`` of each sample written,
    ``(source path, problem)`` of each bad file (left out), and the written samples' keys
    (:data:`KEYS`' columns, one value per sample, ``-1`` unknown)."""

    path: str
    samples: List[Tuple[str, str]] = field(default_factory=list)
    bad: List[Tuple[str, str]] = field(default_factory=list)
    keys: Dict[str, List[int]] = field(default_factory=lambda: {name: [] for name in KEYS.columns})


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


def _checked(item: Item, key: str) -> Tuple[Optional[bytes], Any]:
    """An item's bytes and its keys (:data:`KEYS`), or ``None`` and what is wrong with it."""
    try:
        with open(item.path, "rb") as f:
            data = f.read()
    except OSError as e:
        return None, f"cannot be read: {e.strerror or e}"
    kind, ext = file_kind(item.path), member_ext(item.path)
    problem = image_problem(data) if kind == "image" else None
    if problem:
        return None, problem
    sample = {"__key__": key, ext: data}
    if item.caption is not None:
        sample["txt"] = item.caption.encode("utf-8")
    try:
        return data, sample_keys(sample, KEYS)
    except SampleError as e:
        if kind != "image":  # a video or audio file that does not probe
            return None, e.message
        return data, sample_keys({k: v for k, v in sample.items() if k != ext}, KEYS)  # its size unknown (-1)


def write_shard(path: str, items: Sequence[Item], keys: Sequence[str], on_bad: str = "error") -> Written:
    """One shard at ``path``: for each item ``KEY.<ext>``, ``KEY.cls`` and ``KEY.txt``; a bad
    file is left out and named in :attr:`Written.bad`. With ``on_bad="error"``, the items after
    the first bad one are only checked (the writer keeps no shard of a write that fails)."""
    done = Written(path)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, item in zip(keys, items):
            if _stop is not None and _stop.is_set():
                raise Stopped()
            data, found = _checked(item, key)
            if data is None:
                done.bad.append((item.path, found))
                continue
            if on_bad == "error" and done.bad:
                continue  # checked: the error names it too if it is bad
            members = [(member_ext(item.path), data), ("cls", str(item.label).encode())]
            if item.caption is not None:
                members.append(("txt", item.caption.encode("utf-8")))
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
            done.samples.append((key, item.path))
            for name, values in done.keys.items():
                values.append(found[name])
    return done


Job = Tuple[str, Sequence[Item], Sequence[str], str]  # (path, items, keys, on_bad)


def run(jobs: Sequence[Job], processes: int, done: Optional[Callable[[Written], None]] = None) -> List[Written]:
    """Write every job's shard, in ``processes`` processes (1: here); the results in job order.
    ``done(written)`` is called here as each shard is finished, in the order they finish.

    The first failure (an error writing a shard, an error of ``done``),
    or an exception here (Ctrl-C, or SIGTERM turned into one), stops the others at their next
    file; the processes are gone when this returns or raises."""
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
