"""What a loader shows of itself while it runs: the training loop's side of the time (how long it
waited for batches, how long it spent between them), a progress bar per epoch, a one-line
summary, one warning when the loop waits for data most of the time (naming the likely stage),
and, when asked, the rank's figures in a run folder that ``dalistream stats RUN_DIR`` lays side
by side.

Nothing here may stop a job: a figure that cannot be written is one warning.

The run folder (``Loader(stats_dir=RUN_DIR)``) holds one file per rank, ``rank-00003.json``,
written atomically by the rank's main process at most every :data:`PUBLISH_S` seconds while
batches flow, at the end of each epoch and at ``close()``: ``rank``, ``world_size``, ``host``,
``pid``, ``time`` (Unix seconds of the write), ``epoch``, ``step``, ``steps`` (of the epoch),
``loader`` (:meth:`Watch.figures`) and ``workers`` (the rank's workers summed:
:func:`worker_sums`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Union

from ..io.local import write_atomic

log = logging.getLogger(__name__)

#: The share of the training loop's time spent waiting for batches above which one warning is
#: given (``Loader(wait_warning=…)``; ``None`` turns it off).
WAIT_WARNING = 0.5
#: Batches per window over which the wait share is judged (the first batch after a pipeline
#: starts is left out: it holds the workers' start).
WINDOW = 50
#: At the end of an epoch's iteration a window of at least this many batches is judged too, so
#: that a run shorter than :data:`WINDOW` batches is warned as well.
FEW = 8
#: And at least this many seconds, so that every worker has written its counters in between.
MIN_WINDOW_S = 1.0
#: A worker busy (reading, parsing, batching) more than this share of its time is the limit.
BUSY = 0.75
#: Seconds between two writes of a rank's figures into the run folder while batches flow.
PUBLISH_S = 2.0
#: The summed worker counters :func:`worker_sums` keeps.
WORKER_SUMS = ("samples", "padded", "dropped", "bytes", "io_wait_s", "read_s", "batch_s", "wall_s")


def worker_sums(workers: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The counters of a rank's workers (:mod:`dalistream.worker.stats`) summed: :data:`WORKER_SUMS`,
    ``workers`` (how many wrote), ``skipped`` (samples and shards skipped), ``remote_bytes`` and
    ``requests`` (remote I/O), and ``cache_hits``/``cache_bytes`` where a cache counts them."""
    out: Dict[str, Any] = {name: 0 for name in WORKER_SUMS}
    out.update(workers=len(workers), skipped=0, remote_bytes=0, requests=0)
    for w in workers:
        for name in WORKER_SUMS:
            out[name] += w.get(name, 0) or 0
        out["skipped"] += sum((w.get("skipped") or {}).values())
        io = w.get("io") or {}
        out["remote_bytes"] += io.get("bytes", 0)
        out["requests"] += io.get("requests", 0)
        if io.get("cache_hits") or io.get("cache_misses"):  # a byte cache was read through
            for name in ("cache_hits", "cache_bytes"):
                out[name] = out.get(name, 0) + io.get(name, 0)
    return out


STAGES = ("store", "tar/worker", "merge/feed", "decode")


def likely_stage(before: Dict[str, Any], after: Dict[str, Any], decodes: bool) -> tuple:
    """``(stage, why)``: which stage most likely kept the training loop waiting between two
    :func:`worker_sums` snapshots. Workers busy most of their time are the limit — ``store`` when
    most of it was spent waiting for shard bytes, else ``tar/worker`` (parsing tar, checking and
    batching samples). Workers idle with their batches not taken point at the DALI graph in the
    main process: ``decode`` when it decodes images, else ``merge/feed`` (receiving and merging
    the workers' batches). ``(None, why)`` when the workers wrote no counters in between."""
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in ("io_wait_s", "read_s", "batch_s", "wall_s")}
    if delta["wall_s"] <= 0:
        return None, "no worker counters were written in the window"
    busy = min(1.0, (delta["read_s"] + delta["batch_s"]) / delta["wall_s"])
    if busy >= BUSY:
        waiting = delta["io_wait_s"] / delta["wall_s"]
        if delta["io_wait_s"] >= 0.5 * delta["read_s"]:
            return "store", (f"the workers were busy {busy:.0%} of their time, {waiting:.0%} of it waiting for shard "
                             "bytes: a closer or faster store, or more reading at once (storage_options "
                             "parts_in_flight, read_ahead_bytes), or more workers")
        return "tar/worker", (f"the workers were busy {busy:.0%} of their time reading tar and checking samples "
                              f"({waiting:.0%} waiting for bytes): more workers (workers=), if cores are free")
    if decodes:
        return "decode", (f"the workers were idle {1 - busy:.0%} of their time with batches ready: the DALI graph in "
                          "the main process (image decode and augmentation) is the limit: a GPU (device='gpu'), "
                          "lighter augmentation, or more DALI threads (num_threads: Loader(stream, pipeline, "
                          "num_threads=N), or dali_options={'num_threads': N} of a ready pipeline)")
    return "merge/feed", (f"the workers were idle {1 - busy:.0%} of their time with batches ready: receiving and "
                          "merging their batches in the main process is the limit: fewer workers (each adds a "
                          "batch of positions to merge), or a larger batch")


def rank_file(run_dir: str, rank: int) -> str:
    """Where rank ``rank`` writes its figures in the run folder."""
    return os.path.join(run_dir, f"rank-{rank:05d}.json")


class Watch:
    """A loader's figures and what shows them: the training loop's time (``batches``,
    ``samples``, ``wait_s``, ``step_s``), the bar, the wait warning and the run folder.

    ``progress``: ``False``, ``True`` (a bar on rank 0) or ``"all"`` (a bar on every rank);
    ``counters()`` gives the rank's current :meth:`dalistream.Loader.stats` (read when a figure
    needs the workers' side)."""

    def __init__(self, *, progress: Union[bool, str] = False, wait_warning: Optional[float] = WAIT_WARNING,
                 run_dir: Optional[str] = None, counters: Callable[[], Dict[str, Any]],
                 decodes: Callable[[], bool] = lambda: False, window: int = WINDOW, file: Any = None) -> None:
        if progress not in (False, True, "all"):
            raise ValueError(f"progress must be False, True (rank 0) or 'all' (every rank), got {progress!r}")
        if wait_warning is not None and not 0 < wait_warning <= 1:
            raise ValueError(f"wait_warning must be a share in (0, 1] or None, got {wait_warning!r}")
        self.progress, self.wait_warning, self.run_dir = progress, wait_warning, run_dir
        self.counters, self.decodes, self.window, self.file = counters, decodes, window, file
        self.timing: Dict[str, Any] = {"batches": 0, "empty_batches": 0, "samples": 0, "wait_s": 0.0, "step_s": 0.0}
        self.warned = False
        self._bar = None
        self._win: Optional[Dict[str, Any]] = None  # the window being judged (_open_window)
        self._fresh = True  # the next batch is the first after a pipeline start
        self._published = 0.0
        self._publish_failed = False
        self._place = (0, 1, 0, 0, 0)  # rank, world size, epoch, step, steps

    # -- hooks the loader calls --------------------------------------------------------------

    def started(self) -> None:
        """A pipeline (re)started: its first batch holds the workers' start."""
        self._fresh = True

    def epoch(self, rank: int, world_size: int, epoch: int, step: int, steps: int) -> None:
        """An epoch's iteration begins at ``step`` of ``steps``: open its bar."""
        self.pause()
        self._place = (rank, world_size, epoch, step, steps)
        if self.progress == "all" or (self.progress and rank == 0):
            from tqdm.auto import tqdm

            desc = f"rank {rank} epoch {epoch}" if self.progress == "all" else f"epoch {epoch}"
            self._bar = tqdm(total=steps, initial=step, desc=desc, unit="batch", file=self.file or sys.stderr,
                             dynamic_ncols=True, leave=True)

    def took(self, wait_s: float, samples: int, step: int) -> None:
        """A batch of ``samples`` arrived after ``wait_s`` seconds of waiting; the loader stands at ``step``."""
        t = self.timing
        t["batches"] += 1
        t["samples"] += samples
        t["wait_s"] += wait_s
        rank, world, epoch, _, steps = self._place
        self._place = (rank, world, epoch, step, steps)
        if self._fresh:  # the workers' start is no measure of the stages: the window opens after it
            self._fresh, self._win = False, None
        elif self._win is not None:
            self._win["batches"] += 1
            self._win["wait"] += wait_s
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(1)

    def stepped(self, step_s: float) -> None:
        """The training loop came back for the next batch after ``step_s`` seconds."""
        self.timing["step_s"] += step_s
        if self._win is None:
            self._open_window()
        else:
            self._win["step"] += step_s
            if self._win["batches"] >= self.window and time.monotonic() - self._win["t0"] >= MIN_WINDOW_S:
                self._judge()
        if self.run_dir and time.monotonic() - self._published >= PUBLISH_S:
            self.publish()

    def ended(self) -> None:
        """The epoch's iteration ended (its last batch taken, or the loop broke off): a window of
        :data:`FEW` batches or more is judged now."""
        self.pause()
        win = self._win
        if win is not None and win["batches"] >= FEW and time.monotonic() - win["t0"] >= MIN_WINDOW_S:
            self._judge()
        if self.run_dir:
            self.publish()

    def pause(self) -> None:
        """Close the bar (an epoch ended or was broken off)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # -- figures -----------------------------------------------------------------------------

    def figures(self) -> Dict[str, Any]:
        """The training loop's side: ``batches`` and ``samples`` taken, ``wait_s`` (waiting for
        batches: the input pipeline was the limit; the first of each pipeline start includes the
        workers' start), ``step_s`` (between batches: the training step), ``samples_per_s`` (over
        both) and ``wait_share`` (``wait_s`` over both)."""
        t = dict(self.timing)
        busy = t["wait_s"] + t["step_s"]
        t["samples_per_s"] = t["samples"] / busy if busy > 0 else 0.0
        t["wait_share"] = t["wait_s"] / busy if busy > 0 else 0.0
        return t

    def summary(self, stats: Dict[str, Any]) -> str:
        """One line from :meth:`figures` and the workers' counters in ``stats``."""
        f, sums = self.figures(), worker_sums(stats.get("workers", []))
        _, _, epoch, step, steps = self._place
        text = (f"epoch {epoch} step {step}/{steps}: {f['samples']} samples in {f['batches']} batches, "
                f"{f['samples_per_s']:.1f} samples/s, data wait {f['wait_share']:.0%} of the loop's time, "
                f"{stats.get('skipped_samples', 0)} samples and {stats.get('skipped_shards', 0)} shards skipped, "
                f"{_size(sums['remote_bytes'])} read remotely")
        if "cache_hits" in sums:
            text += f", {sums['cache_hits']} cache hits ({_size(sums.get('cache_bytes', 0))})"
        return text

    def _postfix(self) -> str:
        f = self.figures()
        return f"{f['samples_per_s']:.0f} samples/s, wait {f['wait_share']:.0%}"

    def _sums(self) -> Dict[str, Any]:
        try:
            return worker_sums(self.counters().get("workers", []))
        except Exception as e:  # noqa: BLE001 - figures never stop a job
            log.debug("worker counters unreadable: %s", e)
            return worker_sums([])

    def _open_window(self, sums: Optional[Dict[str, Any]] = None) -> None:
        judging = self.wait_warning is not None and not self.warned
        self._win = {"batches": 0, "wait": 0.0, "step": 0.0, "t0": time.monotonic(),
                     "sums": (sums or self._sums()) if judging else None}

    def _judge(self) -> None:
        win = self._win
        if win["sums"] is None:  # not judging (warned already, or no warning asked for)
            self._open_window()
            return
        now = self._sums()
        self._open_window(now)
        if self.warned or win["wait"] + win["step"] <= 0:
            return
        share = win["wait"] / (win["wait"] + win["step"])
        if share <= self.wait_warning:
            return
        self.warned = True
        stage, why = likely_stage(win["sums"], now, self.decodes())
        log.warning("the training loop waited for data %.0f%% of its time over the last %d batches (more than "
                    "wait_warning=%.0f%%): likely stage: %s; %s. Loader.summary() and Loader.stats() give the "
                    "figures (this warning is given once)", share * 100, win["batches"], self.wait_warning * 100,
                    stage or "unknown", why)

    def publish(self) -> None:
        """Write this rank's figures into the run folder now (one warning if it cannot)."""
        if not self.run_dir:
            return
        self._published = time.monotonic()
        rank, world, epoch, step, steps = self._place
        try:
            counters = self.counters()
            doc = {"rank": rank, "world_size": world, "host": socket.gethostname(), "pid": os.getpid(),
                   "time": time.time(), "epoch": epoch, "step": step, "steps": steps, "loader": self.figures(),
                   "workers": worker_sums(counters.get("workers", [])),
                   "skipped_samples": counters.get("skipped_samples", 0),
                   "skipped_shards": counters.get("skipped_shards", 0)}
            os.makedirs(self.run_dir, exist_ok=True)
            write_atomic(rank_file(self.run_dir, rank), lambda f: f.write(json.dumps(doc).encode()))
        except Exception as e:  # noqa: BLE001 - figures never stop a job (a full disk, a folder gone)
            if not self._publish_failed:
                self._publish_failed = True
                log.warning("rank %d: figures not written to the run folder %s (%s); training goes on",
                            rank, self.run_dir, getattr(e, "strerror", None) or e)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
