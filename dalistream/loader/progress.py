"""What a loader shows of itself while it runs: the training loop's side of the time (how long it
waited for batches, how long it spent between them), per epoch and in all, progress per epoch
(a bar on a terminal, plain lines in a file: :class:`Lines`), a one-line summary of a rank's
epoch, one warning when the loop waits for data most of the time (naming the likely stage), one
warning per epoch at its first empty batch when asked (``warn_empty``), and, when asked, the
rank's figures in a run folder that ``dalistream stats RUN_DIR`` lays side by side.

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
#: Progress written to a file or a pipe (stderr not a terminal: a Slurm job's log) is a plain line
#: when at least this many seconds *and* :data:`LINE_SHARE` of the epoch have passed since the
#: last line (the later of the two: at most one line per 30 s and at most 20 per epoch), and one
#: line at the epoch's end.
LINE_S = 30.0
#: The share of an epoch's batches between two progress lines in a file (see :data:`LINE_S`).
LINE_SHARE = 0.05
#: The training loop's own figures, per epoch and in all (:meth:`Watch.figures`).
TIMING = ("batches", "empty_batches", "samples", "wait_s", "step_s")
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


def _clock_text(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _is_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


class Lines:
    """Progress for a file or a pipe (a Slurm job's stderr, ``… 2> log``), where a redrawn bar
    would write every redraw: a plain line, prefixed with the rank and the epoch, at most as
    often as :data:`LINE_S` and :data:`LINE_SHARE` allow, and one at the epoch's end (or where
    the loop broke off). ``clock``: seconds, monotonic."""

    def __init__(self, file: Any, label: str, total: int, initial: int, clock: Callable[[], float]) -> None:
        self.file, self.label, self.total, self.clock = file, label, total, clock
        self.n = self._last_n = initial
        self.t0 = self._last_t = clock()

    def update(self, n: int, figures: str) -> None:
        """The loop stands at batch ``n``: a line if one is due."""
        self.n = n
        now = self.clock()
        if now - self._last_t >= LINE_S and n - self._last_n >= LINE_SHARE * self.total:
            self._last_t, self._last_n = now, n
            self._write(f"{self.label}: {n}/{self.total} batches ({n / max(1, self.total):.0%}) in "
                        f"{_clock_text(now - self.t0)}, {figures}")

    def close(self, figures: str) -> None:
        """The epoch's iteration ended: its last line."""
        said = "done" if self.n >= self.total else "stopped"
        self._write(f"{self.label} {said}: {self.n}/{self.total} batches in {_clock_text(self.clock() - self.t0)}, "
                    f"{figures}")

    def _write(self, line: str) -> None:
        try:
            self.file.write(line + "\n")
            self.file.flush()
        except (OSError, ValueError) as e:  # a closed or full log: progress never stops a job
            log.debug("progress line not written: %s", e)


class Watch:
    """A loader's figures and what shows them: the training loop's time (``batches``,
    ``empty_batches``, ``samples``, ``wait_s``, ``step_s``; in all and per epoch), progress, the
    warnings and the run folder.

    ``progress``: ``False``, ``True`` (on rank 0) or ``"all"`` (on every rank): a bar on a
    terminal, :class:`Lines` in a file or a pipe; ``warn_empty``: one warning per epoch at its first
    empty batch; ``counters()`` gives the rank's current :meth:`dalistream.Loader.stats` (read when
    a figure needs the workers' side); ``clock``: seconds, monotonic."""

    def __init__(self, *, progress: Union[bool, str] = False, wait_warning: Optional[float] = WAIT_WARNING,
                 warn_empty: bool = False, run_dir: Optional[str] = None, counters: Callable[[], Dict[str, Any]],
                 decodes: Callable[[], bool] = lambda: False, window: int = WINDOW, file: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if progress not in (False, True, "all"):
            raise ValueError(f"progress must be False, True (rank 0) or 'all' (every rank), got {progress!r}")
        if wait_warning is not None and not 0 < wait_warning <= 1:
            raise ValueError(f"wait_warning must be a share in (0, 1] or None, got {wait_warning!r}")
        if not isinstance(warn_empty, bool):
            raise ValueError(f"warn_empty must be True or False, got {warn_empty!r}")
        self.progress, self.wait_warning, self.warn_empty, self.run_dir = progress, wait_warning, warn_empty, run_dir
        self.counters, self.decodes, self.window, self.file, self.clock = counters, decodes, window, file, clock
        self.timing: Dict[str, Any] = _timing()
        self.by_epoch: Dict[int, Dict[str, Any]] = {}  # the same, per epoch (the set_epoch number)
        self.warned = False
        self._bar: Any = None  # a tqdm bar, or Lines
        self._win: Optional[Dict[str, Any]] = None  # the window being judged (_open_window)
        self._fresh = True  # the next batch is the first after a pipeline start
        self._published = 0.0
        self._publish_failed = False
        self._empty_said: set = set()  # the epochs whose empty batch was warned of
        self._place = (0, 1, 0, 0, 0)  # rank, world size, epoch, step, steps

    # -- hooks the loader calls --------------------------------------------------------------

    def started(self) -> None:
        """A pipeline (re)started: its first batch holds the workers' start."""
        self._fresh = True

    def epoch(self, rank: int, world_size: int, epoch: int, step: int, steps: int) -> None:
        """An epoch's iteration begins at ``step`` of ``steps``: open its bar (or its lines)."""
        self.pause()
        self._place = (rank, world_size, epoch, step, steps)
        if self.progress == "all" or (self.progress and rank == 0):
            from tqdm.auto import tqdm
            from tqdm.autonotebook import tqdm as chosen
            from tqdm.std import tqdm as console

            file = self.file or sys.stderr
            notebook = chosen is not console and file is sys.stderr  # Jupyter: a widget, redrawn in place
            if notebook or _is_terminal(file):
                desc = f"rank {rank} epoch {epoch}" if self.progress == "all" else f"epoch {epoch}"
                self._bar = tqdm(total=steps, initial=step, desc=desc, unit="batch", file=file,
                                 dynamic_ncols=True, leave=True)
            else:  # a file or a pipe: lines a person reads, not a redrawn bar
                self._bar = Lines(file, f"rank {rank} epoch {epoch}", steps, step, self.clock)

    def took(self, wait_s: float, samples: int, step: int, empty: bool = False) -> None:
        """A batch of ``samples`` arrived after ``wait_s`` seconds of waiting; the loader stands at
        ``step``; ``empty``: it holds no sample (yielded all the same)."""
        rank, world, epoch, _, steps = self._place
        self._place = (rank, world, epoch, step, steps)
        for t in (self.timing, self._epoch_timing(epoch)):
            t["batches"] += 1
            t["empty_batches"] += int(empty)
            t["samples"] += samples
            t["wait_s"] += wait_s
        if empty and self.warn_empty and epoch not in self._empty_said:
            self._empty_said.add(epoch)
            log.warning("rank %d, epoch %d, step %d of %d: an empty batch (no sample: policy 'exact' left this "
                        "rank none for its last step, or every sample of the batch was skipped); a DDP training "
                        "step still runs forward and backward on it, with a zero loss (the mean over no sample is "
                        "NaN), so that every rank joins the gradient all-reduce (this warning is given once per "
                        "epoch; stats()['by_epoch'][%d]['empty_batches'] counts them)", rank, epoch, step, steps,
                        epoch)
        if self._fresh:  # the workers' start is no measure of the stages: the window opens after it
            self._fresh, self._win = False, None
        elif self._win is not None:
            self._win["batches"] += 1
            self._win["wait"] += wait_s
        if isinstance(self._bar, Lines):
            self._bar.update(step, self._postfix(epoch))
        elif self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(1)

    def stepped(self, step_s: float) -> None:
        """The training loop came back for the next batch after ``step_s`` seconds."""
        self.timing["step_s"] += step_s
        self._epoch_timing(self._place[2])["step_s"] += step_s
        if self._win is None:
            self._open_window()
        else:
            self._win["step"] += step_s
            if self._win["batches"] >= self.window and self.clock() - self._win["t0"] >= MIN_WINDOW_S:
                self._judge()
        if self.run_dir and self.clock() - self._published >= PUBLISH_S:
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
        """Close the bar, or write the epoch's last line (an epoch ended or was broken off)."""
        bar, self._bar = self._bar, None
        if isinstance(bar, Lines):
            bar.close(self._postfix(self._place[2]))
        elif bar is not None:
            bar.close()

    # -- figures -----------------------------------------------------------------------------

    def _epoch_timing(self, epoch: int) -> Dict[str, Any]:
        timing = self.by_epoch.get(epoch)
        if timing is None:
            timing = self.by_epoch[epoch] = _timing()
        return timing

    def figures(self) -> Dict[str, Any]:
        """The training loop's side since the loader was made: ``batches`` and ``samples`` taken,
        ``empty_batches`` (batches without a sample, yielded all the same), ``wait_s`` (waiting
        for batches: the input pipeline was the limit; the first of each pipeline start includes
        the workers' start), ``step_s`` (between batches: the training step), ``samples_per_s``
        (over both) and ``wait_share`` (``wait_s`` over both); ``by_epoch[e]``: the same for the
        epoch numbered ``e`` by ``set_epoch``."""
        return {**_rates(self.timing), "by_epoch": {e: _rates(t) for e, t in sorted(self.by_epoch.items())}}

    def summary(self, stats: Dict[str, Any], epoch: int) -> str:
        """One line about this rank's ``epoch`` (the ``set_epoch`` number): the loop's figures of
        that epoch and, from ``stats["by_epoch"][epoch]`` (:meth:`dalistream.Loader.stats`), its
        skips and where its bytes came from: the store (bytes fetched remotely) and, through a
        byte cache, the cache. In an epoch that also fetched blocks, what it read from the cache
        includes blocks it fetched itself (a block is fetched whole; the reads after the fetch
        read its file, and count as hits): the line says so."""
        rank, _, now, step, steps = self._place
        f = _rates(self.by_epoch.get(epoch, _timing()))
        e = stats.get("by_epoch", {}).get(epoch, {})
        io = e.get("io", {})
        where = f"rank {rank}, epoch {epoch}" + (f" (step {step} of {steps} so far)" if epoch == now and step < steps
                                                  else " (read ahead, not entered)" if e.get("read_ahead") else "")
        text = (f"{where}: {f['samples']} samples in {f['batches']} batches"
                + (f" ({f['empty_batches']} empty)" if f["empty_batches"] else "")
                + f", {f['samples_per_s']:.1f} samples/s, data wait {f['wait_share']:.0%} of the loop's time, "
                f"{e.get('skipped_samples', 0)} samples and {e.get('skipped_shards', 0)} shards skipped")
        if io.get("requests") or io.get("cache_hits") or io.get("cache_misses"):  # read from a remote store
            text += f", {_size(io.get('bytes', 0))} from the store"
            if io.get("cache_hits") or io.get("cache_misses"):
                text += f", {_size(io.get('cache_bytes', 0))} from the cache"
                if io.get("cache_bytes") and io.get("cache_misses"):  # a block fetched whole, then read from its file
                    text += " (blocks this epoch fetched included)"
        return text

    def _postfix(self, epoch: Optional[int] = None) -> str:
        f = self.figures() if epoch is None else _rates(self.by_epoch.get(epoch, _timing()))
        text = f"{f['samples_per_s']:.0f} samples/s, wait {f['wait_share']:.0%}"
        return text + (f", {f['empty_batches']} empty" if epoch is not None and f["empty_batches"] else "")

    def _sums(self) -> Dict[str, Any]:
        try:
            return worker_sums(self.counters().get("workers", []))
        except Exception as e:  # noqa: BLE001 - figures never stop a job
            log.debug("worker counters unreadable: %s", e)
            return worker_sums([])

    def _open_window(self, sums: Optional[Dict[str, Any]] = None) -> None:
        judging = self.wait_warning is not None and not self.warned
        self._win = {"batches": 0, "wait": 0.0, "step": 0.0, "t0": self.clock(),
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
        self._published = self.clock()
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


def _timing() -> Dict[str, Any]:
    return {name: 0.0 if name.endswith("_s") else 0 for name in TIMING}


def _rates(timing: Dict[str, Any]) -> Dict[str, Any]:
    """``timing`` (:data:`TIMING`) with ``samples_per_s`` and ``wait_share``."""
    t = dict(timing)
    busy = t["wait_s"] + t["step_s"]
    t["samples_per_s"] = t["samples"] / busy if busy > 0 else 0.0
    t["wait_share"] = t["wait_s"] / busy if busy > 0 else 0.0
    return t


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
