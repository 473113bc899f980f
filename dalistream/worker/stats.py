"""Worker counters: one schema, written by each worker as a small JSON file and read by
:meth:`dalistream.Loader.stats`, ``dalistream bench`` and ``dalistream keys``.

Per worker (see :data:`WORKER_FIELDS`): position (``epoch``, ``step``), ``samples`` delivered,
``padded`` slot positions, ``bytes`` of member data read, ``dropped`` samples (``even`` epochs: the tail of
the epoch that no one owns, counted by the job's last global worker, so the sum over the job is
what the epoch left out),
skips by ``"samples:<reason>"``/``"shards:<reason>"`` (all epochs, and per epoch in
``skipped_by_epoch``), the four totals per epoch too (``totals_by_epoch``: a worker reads a few
batches ahead, into the next epoch, and what it read there is counted there), remote I/O and
byte-cache counters (``io``, and per epoch ``io_by_epoch``), and seconds: ``io_wait_s`` blocked opening and reading shard bytes; ``read_s`` reading, parsing tar
and checking samples (includes ``io_wait_s``); ``batch_s`` assembling padded batches; ``wall_s``
since the worker started. ``wall_s - read_s - batch_s`` is time the worker was idle, its batches
not yet taken: the pipeline (decode) or the training step is the limit.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import threading
import time
from collections import Counter
from typing import Any, Dict, List, Optional

from ..io.counters import IOCounters, ReadClock
from ..io.local import write_atomic
from .policy import skip_totals

WORKER_FIELDS = ("rank", "worker", "epoch", "step", "samples", "padded", "bytes", "dropped", "io_wait_s", "read_s",
                 "batch_s", "wall_s", "skipped", "io", "skipped_by_epoch", "totals_by_epoch", "io_by_epoch")
IO_SUMS = tuple(k for k in IOCounters.FIELDS if k not in IOCounters.PEAKS)  # the I/O counters summed per epoch
TOTALS = ("samples", "padded", "bytes", "dropped")
WRITE_INTERVAL_S = 0.5  # counters are written at most this often while batches flow
SKIP_FLUSH_S = 0.05     # and soon after a skip, so the loader sees the skips of delivered batches
log = logging.getLogger(__name__)


class WorkerStats:
    """One worker's counters since its pipeline started (module doc), written to ``path``."""

    def __init__(self, path: Optional[str], rank: int, worker: int) -> None:
        self.path = path
        self.io = IOCounters()  # remote requests, retries, resumes, cache use of this worker
        self.io_by_epoch: Dict[int, Counter] = {}  # the additive ones per epoch, up to the current one's start
        self.rank, self.worker, self.epoch = rank, worker, 0
        self.step = self.samples = self.padded = self.bytes = self.dropped = 0
        self.read_s = self.batch_s = 0.0
        self.io_clock = ReadClock()
        self.skipped_by_epoch: Dict[int, Counter] = {}
        self.totals_by_epoch: Dict[int, Counter] = {}
        self._last = 0.0
        self._unwritten_skip = False
        self._write_failed = False
        self._lock = threading.Lock()
        self._timer: Optional[threading.Timer] = None
        self._t0 = time.perf_counter()

    @property
    def epoch(self) -> int:
        """The epoch being read; what the I/O counters grow by from now on is this epoch's."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        now = self.io.as_dict()
        if hasattr(self, "_epoch"):
            self.io_by_epoch.setdefault(self._epoch, Counter()).update(self.io.since(self._io_mark))
        self._epoch, self._io_mark = value, now

    def io_epochs(self) -> Dict[str, Dict[str, int]]:
        """The I/O counters of :data:`IO_SUMS` per epoch (the current one's so far)."""
        out = {e: Counter(c) for e, c in self.io_by_epoch.items()}
        out.setdefault(self._epoch, Counter()).update(self.io.since(self._io_mark))
        return {str(e): {k: c.get(k, 0) for k in IO_SUMS} for e, c in sorted(out.items()) if any(c.values())}

    @property
    def skipped(self) -> Counter:
        """Skips of all epochs together."""
        total: Counter = Counter()
        for counts in self.skipped_by_epoch.values():
            total.update(counts)
        return total

    def add(self, **amounts: int) -> None:
        """Add to the :data:`TOTALS` named, in all and in the current ``epoch``."""
        epoch = self.totals_by_epoch.get(self.epoch)
        if epoch is None:
            epoch = self.totals_by_epoch[self.epoch] = Counter()
        for name, value in amounts.items():
            setattr(self, name, getattr(self, name) + value)
            epoch[name] += value

    def add_source(self, name: str, n: int) -> None:
        """Count ``n`` samples of a mix's source ``name`` delivered in the current epoch."""
        self.totals_by_epoch.setdefault(self.epoch, Counter())[f"source:{name}"] += n

    def as_dict(self) -> Dict[str, Any]:
        """The counters as plain data, keyed by :data:`WORKER_FIELDS`."""
        return {
            "rank": self.rank, "worker": self.worker, "epoch": self.epoch, "step": self.step,
            "samples": self.samples, "padded": self.padded, "bytes": self.bytes, "dropped": self.dropped,
            "io_wait_s": round(self.io_clock.seconds, 6), "read_s": round(self.read_s, 6),
            "batch_s": round(self.batch_s, 6), "wall_s": round(time.perf_counter() - self._t0, 6),
            "skipped": dict(self.skipped), "io": self.io.as_dict(),
            "skipped_by_epoch": {str(e): dict(c) for e, c in self.skipped_by_epoch.items() if c},
            "totals_by_epoch": {str(e): dict(c) for e, c in self.totals_by_epoch.items() if c},
            "io_by_epoch": self.io_epochs(),
        }

    def maybe_write(self) -> None:
        """Write if the last write is older than :data:`WRITE_INTERVAL_S`, or a skip is unwritten
        (called once per batch); else within that interval, from a timer: a worker that then
        waits (its batches not yet taken) leaves no batch unwritten."""
        if not self._write_after(0.0 if self._unwritten_skip else WRITE_INTERVAL_S) and self.path:
            if self._timer is None or not self._timer.is_alive():
                self._timer = threading.Timer(max(0.01, self._last + WRITE_INTERVAL_S - time.perf_counter()),
                                              self._flush)
                self._timer.daemon = True
                self._timer.start()

    def _flush(self) -> None:
        try:
            self._last = time.perf_counter()
            self.write()
        except RuntimeError:  # a counter grew while copied (the worker's thread): again, soon
            self._timer = threading.Timer(SKIP_FLUSH_S, self._flush)
            self._timer.daemon = True
            self._timer.start()
        except OSError:  # the folder is gone (the loader closed): the worker's own next write says so
            pass

    def flush_skips(self) -> None:
        """Write soon after a skip (:data:`SKIP_FLUSH_S`); a skip met sooner is written with the
        batch it falls in (:meth:`maybe_write`), never left unwritten while the worker waits."""
        self._unwritten_skip = True
        self._write_after(SKIP_FLUSH_S)

    def _write_after(self, interval: float) -> bool:
        now = time.perf_counter()
        if self.path and now - self._last >= interval:
            self._last = now
            self.write()
            return True
        return False

    def write(self) -> None:
        """Write the counters now (atomically: readers never see half a file; one writer at a
        time, so a later snapshot is never overwritten by an earlier one). Counters never stop a
        job: a write that fails (the folder removed, a full disk) is one warning per worker, and
        the worker goes on, trying again at its next write."""
        if not self.path:
            return
        with self._lock:
            self._unwritten_skip = False
            try:
                write_atomic(self.path, lambda f: f.write(json.dumps(self.as_dict()).encode()))
            except OSError as e:
                if not self._write_failed:
                    self._write_failed = True
                    log.warning("rank %d worker %d: counters not written to %s (%s); the worker goes on, "
                                "Loader.stats() lacks its figures until a write succeeds", self.rank, self.worker,
                                self.path, e.strerror or e)


def stats_path(directory: str, worker: int) -> str:
    """Where worker ``worker`` writes its counters in ``directory``."""
    return os.path.join(directory, f"worker-{worker}.json")


def read_json_files(pattern: str) -> List[Dict[str, Any]]:
    """Every JSON file matching ``pattern``, by name; one that cannot be read (being replaced,
    removed, damaged) is left out."""
    found = []
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            continue
    return found


def read_workers(directory: str) -> List[Dict[str, Any]]:
    """The counters every worker has written to ``directory`` so far (sorted by worker)."""
    return sorted(read_json_files(os.path.join(directory, "worker-*.json")), key=lambda w: w.get("worker", 0))


def summarize(workers: List[Dict[str, Any]], through: int) -> Dict[str, Any]:
    """Sums over workers of the epochs up to ``through`` (the workers' read-ahead into later
    epochs left out): :data:`TOTALS`, skips (``skipped_samples``, ``skipped_shards``, ``skipped``
    by kind and reason), a mix's samples per source (``sources``) and the I/O counters of
    :data:`IO_SUMS` (``io``: remote requests and bytes, the byte cache's hits and bytes);
    ``by_epoch[e]`` holds the same for every epoch alone, with ``read_ahead``: ``True`` for an
    epoch after ``through``, which the workers read ahead into before the loader entered it (the
    caller may never start it); ``workers`` keeps each worker's own counters."""
    by_epoch: Dict[int, Counter] = {}
    io: Dict[int, Counter] = {}
    for w in workers:
        for key in ("skipped_by_epoch", "totals_by_epoch"):
            for epoch, counts in w.get(key, {}).items():
                by_epoch.setdefault(int(epoch), Counter()).update(counts)
        for epoch, counts in w.get("io_by_epoch", {}).items():
            io.setdefault(int(epoch), Counter()).update(counts)
            by_epoch.setdefault(int(epoch), Counter())

    def sums(counts: Counter, io_counts: Counter) -> Dict[str, Any]:
        return {**{k: counts.get(k, 0) for k in TOTALS}, **skip_totals(counts),
                "sources": {k.partition(":")[2]: v for k, v in counts.items() if k.startswith("source:")},
                "io": {k: io_counts.get(k, 0) for k in IO_SUMS}}

    delivered: Counter = Counter()
    delivered_io: Counter = Counter()
    for epoch, counts in by_epoch.items():
        if epoch <= through:
            delivered.update(counts)
            delivered_io.update(io.get(epoch, Counter()))
    return {"workers": workers, **sums(delivered, delivered_io),
            "by_epoch": {e: {**sums(c, io.get(e, Counter())), "read_ahead": e > through}
                         for e, c in sorted(by_epoch.items())}}
