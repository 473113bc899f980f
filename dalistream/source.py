"""The parallel external source of one worker: shards → samples → padded mini-batches.

:class:`WorkerSource` is the iterable given to ``fn.external_source(parallel=True, batch=True)``.
Each ``next()`` returns one full-size batch per output in which only this worker's slot holds
real samples; every other position holds the field's shared empty array (no per-slot Python
work), or a zero in the dense array of a scalar field. The extra ``valid`` output marks real
samples (1) and padding (0).

Epochs: the loader builds sources with ``cycle="quiet"``; DALI's worker calls ``__iter__`` again
right after our ``StopIteration``, so the worker's epoch is ``start_epoch`` plus the number of
``__iter__`` calls it has seen. Every source of a rank yields exactly the plan's number of
steps per epoch, so all sources end together by construction (see DESIGN.md).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import Counter
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .config import StreamConfig
from .errors import DalistreamError, ManifestError, SampleError, ShardFormatError, SourceError
from .plan import WorkerPlan, epoch_order, worker_plan
from .samples import ErrorPolicy, FieldDecoder, emitted_indices, shuffle_seed, shuffled
from .streams import IOCounters, ShardSequence, open_shard
from .tario import ReadClock, _read_failed, iter_samples

STATS_INTERVAL_S = 0.5


class WorkerSource:
    """Iterable of padded mini-batches for one worker; picklable, generators created lazily."""

    def __init__(
        self, config: StreamConfig, urls: Sequence[str], counts: Optional[Sequence[int]], worker: int, *,
        start_epoch: int = 0, start_step: int = 0, stats_path: Optional[str] = None,
        offsets: Optional[Sequence[Sequence[int]]] = None,
    ) -> None:
        self.config = config
        self.urls = list(urls)
        self.counts = list(counts) if counts is not None else None
        self.offsets = offsets  # per shard, the tar offset of each sample: resume opens mid-shard
        self.worker = worker
        self.start_epoch = start_epoch
        self.start_step = start_step
        self.stats_path = stats_path
        self.decoder = FieldDecoder(config.fields, config.missing)
        self._probe_pid: Optional[int] = None
        self._iters = 0
        self._gen: Optional[Iterator] = None
        self._stats: Optional[_Stats] = None
        self.epoch = start_epoch

    def for_dali(self) -> "WorkerSource":
        """Mark this source as handed to DALI: ``iter()`` in this (the main) process is DALI's
        probe before pickling and must not start an epoch."""
        self._probe_pid = os.getpid()
        return self

    def __iter__(self) -> "WorkerSource":
        if self._probe_pid == os.getpid():
            return self
        if self._iters and self._gen is None:  # iter(iter(source)): this epoch has not started yet
            return self
        self.epoch = self.start_epoch + self._iters
        skip = self.start_step if self._iters == 0 else 0
        self._iters += 1
        self._gen = None
        self._skip = skip
        return self

    def __next__(self) -> Tuple[Union[List[np.ndarray], np.ndarray], ...]:
        if self._gen is None:
            if self._iters == 0:
                self.__iter__()
            self._gen = self.epoch_batches(self.epoch, self._skip)
        return next(self._gen)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_gen"] = None  # generators never travel to the worker
        return state

    # -- one epoch -------------------------------------------------------------------------

    def plan(self, epoch: int) -> WorkerPlan:
        """This worker's plan (shards, steps, slot) for ``epoch``."""
        c = self.config
        return worker_plan(self.counts, len(self.urls), c.seed, epoch, c.rank, c.world_size, c.workers,
                           self.worker, c.batch_size, c.policy, c.batches_per_epoch, c.shuffle_shards)

    def epoch_batches(self, epoch: int, start_step: int = 0) -> Iterator[Tuple[Union[List[np.ndarray], np.ndarray], ...]]:
        """The padded batches of ``epoch`` from ``start_step`` on; earlier samples are skipped by
        tar header, never decoded."""
        c = self.config
        plan = self.plan(epoch)
        if self._stats is None:
            self._stats = _Stats(self.stats_path, c.rank, self.worker)
        stats = self._stats
        stats.epoch, stats.step = epoch, start_step
        policy = ErrorPolicy(c.on_error)
        policy.skipped = stats.skipped_by_epoch.setdefault(epoch, policy.skipped)  # this epoch's skips
        skip_count = start_step * plan.slot
        seed = shuffle_seed(c.seed, epoch, plan.global_worker)
        if c.shuffle > 1 and skip_count:
            total = None if c.policy == "fixed" else plan.samples
            gone = emitted_indices(skip_count, total, c.shuffle, seed)
            keep = lambda o: o not in gone  # noqa: E731
        else:
            keep = lambda o: o >= skip_count  # noqa: E731
        stream = shuffled(self._decoded(plan, keep, policy, stats), c.shuffle, seed)
        stream = itertools.islice(stream, skip_count, None)

        # scalar fields (labels) and ``valid`` travel as one dense array each: DALI's worker
        # serializes a list sample by sample, an array in one piece
        templates = [np.zeros(c.batch_size, f.dtype) if f.ndim == 0 else [f.empty] * c.batch_size
                     for f in c.fields] + [np.zeros(c.batch_size, np.uint8)]
        lo = plan.offset
        for step in range(start_step, plan.steps):
            t0 = time.perf_counter()
            chunk = [s for s in itertools.islice(stream, plan.slot)]
            t1 = time.perf_counter()
            stats.read_s += t1 - t0
            n = len(chunk)
            if n < plan.slot and c.policy == "even" and not sum(policy.skipped.values()):
                raise ManifestError(
                    f"worker ran out of samples at step {step} of {plan.steps}: the shards hold fewer samples "
                    "than their counts say", url=self.urls[plan.shards[0]],
                    hint="the manifest is stale: rebuild it with `dalistream index`",
                ).at(rank=c.rank, worker=self.worker)
            outputs = tuple(t.copy() for t in templates)
            if n:
                columns = list(zip(*chunk))
                for out, column in zip(outputs, columns):
                    out[lo:lo + n] = column
                outputs[-1][lo:lo + n] = 1
            stats.step = step + 1
            stats.samples += n
            stats.padded += plan.slot - n
            stats.batch_s += time.perf_counter() - t1
            stats.maybe_write()
            yield outputs
        if plan.samples is not None and c.policy == "even":
            stats.dropped += max(0, plan.samples - plan.steps * plan.slot - sum(policy.skipped.values()))
        stats.write()

    def _decoded(self, plan: WorkerPlan, keep, policy: ErrorPolicy, stats: "_Stats") -> Iterator:
        """Decoded samples of this worker's shards (endless, re-ordered per pass, for ``fixed``),
        ``None`` for samples skipped on resume.

        The error policy is applied here: a bad sample (duplicate key or member, member too large,
        undecodable value or image, missing field) is raised, or counted and skipped, and its shard
        goes on; a shard that cannot be opened or read on is raised, or counted and skipped after
        the samples before the damage. Shard problems are met one raw sample early (see
        :func:`_problem_first`), so a worker that stops after its last planned sample has still
        met, counted and reported the damage right after it, and the unreadable shards after it.
        """
        c = self.config
        good = 0

        def skip(error: DalistreamError, kind: str) -> None:
            policy.handle(error.at(rank=c.rank, worker=self.worker), kind)
            _flush_skips(stats)

        for item in _problem_first(self._raw(plan, keep, stats)):
            if item is _PASS_END:
                if c.policy == "fixed" and not good:  # cycling over nothing would never end
                    raise SourceError("worker's shards hold no usable samples: policy 'fixed' cannot fill its batches",
                                      url=self.urls[plan.shards[0]], rank=c.rank, worker=self.worker,
                                      reason="no_samples", hint="check the shards (see the warnings), or use fewer workers")
                good = 0
                continue
            if item is None:
                good += 1
                yield None
                continue
            if isinstance(item, DalistreamError):  # per shard
                skip(item, "shards")
                continue
            error = item.get("__error__")  # per sample, found by the tar reader
            if error is not None:
                skip(error, "samples")
                continue
            stats.bytes += sum(len(v) for k, v in item.items() if v is not None and not k.startswith("__"))
            try:
                value = self.decoder.decode(item)
            except SampleError as e:
                skip(e, "samples")
                continue
            if value is None:
                policy.count("samples", "missing_field")
                _flush_skips(stats)
                continue
            good += 1
            yield value

    def _raw(self, plan: WorkerPlan, keep, stats: "_Stats") -> Iterator:
        """This worker's raw samples (``ext -> bytes`` dicts, numbered in plan order; ``None`` when
        ``keep`` rejects one), a shard's error in place of what follows its damage, and
        ``_PASS_END`` after each pass over the shards."""
        c = self.config
        ordinal = 0
        passes = itertools.count() if c.policy == "fixed" else range(1)
        for n_pass in passes:
            order = list(plan.shards)
            if n_pass:
                perm = epoch_order(len(order), c.seed, plan.epoch * 1_000_003 + n_pass)
                order = [order[i] for i in perm]
            shards = ShardSequence([self.urls[i] for i in order], c.storage_options, stats.io)
            for position, index in enumerate(order):
                url = self.urls[index]
                base = ordinal
                count = self.counts[index] if self.counts is not None else None
                first = next((i for i in range(count) if keep(base + i)), count) if count else 0
                if count and first == count:
                    ordinal += count  # resume: a shard consumed before the restart is not even opened
                    yield from itertools.repeat(None, count)
                    continue
                if first and self.offsets is None:
                    first = 0  # no offsets: the consumed samples are skipped by header
                ordinal += first
                yield from itertools.repeat(None, first)
                try:
                    opened = (open_shard(url, self.offsets[index][first], c.storage_options) if first
                              else shards.open(position))  # resume mid-shard: a seek or a ranged GET
                    with opened as f:
                        for sample in iter_samples(
                            f, url, keep=lambda i: keep(base + i), want_ext=self.decoder.wants,
                            lowercase=c.lowercase_ext, max_member_bytes=c.max_member_bytes, mark_errors=True,
                            first_index=first, clock=stats.io_clock,
                        ):
                            ordinal += 1
                            yield sample if keep(ordinal - 1) else None
                except (ShardFormatError, SourceError) as e:
                    yield e
                except DalistreamError as e:
                    raise e.at(rank=c.rank, worker=self.worker)
                except (OSError, EOFError) as e:  # I/O errors outside the tar reader (open, close)
                    yield _read_failed(e, url)
            shards.close()
            yield _PASS_END


SKIP_FLUSH_S = 0.05


_PASS_END = object()


def _problem_first(items: Iterator) -> Iterator:
    """``items`` one behind, except errors, which overtake the item held back.

    The reader yields a shard's last samples and then the error that ends it (or the errors of
    the unreadable shards after it). A worker stops reading once it has the samples its plan
    counted — for a damaged shard, counted up to the damage — so without this it would stop just
    before the error, and never count or report it."""
    held, holding = None, False
    for item in items:
        if isinstance(item, DalistreamError):
            yield item
            continue
        if holding:
            yield held
        held, holding = item, True
    if holding:
        yield held


def _flush_skips(stats: "_Stats") -> None:
    """Write the counters soon after a skip, so that the loader sees skips of delivered batches."""
    now = time.perf_counter()
    if now - stats._last > SKIP_FLUSH_S:
        stats._last = now
        stats.write()


class _Stats:
    """Per-worker counters since the pipeline started, written as a small JSON file that the
    loader reads (throttled).

    Times, in seconds: ``io_wait_s`` blocked reading shard bytes; ``read_s`` reading, parsing tar
    and checking samples (includes ``io_wait_s``); ``batch_s`` assembling padded batches;
    ``wall_s`` since the worker started. ``wall_s - read_s - batch_s`` is time the worker was
    idle, its batches not yet taken: the pipeline (decode) or the training step is the limit."""

    def __init__(self, path: Optional[str], rank: int, worker: int) -> None:
        self.path = path
        self.rank, self.worker, self.epoch = rank, worker, 0
        self.step = self.samples = self.padded = self.bytes = self.dropped = 0
        self.read_s = self.batch_s = 0.0
        self.io_clock = ReadClock()
        self.io = IOCounters()  # remote requests, retries, resumes of this worker
        self.skipped_by_epoch: Dict[int, Counter] = {}  # "samples:<reason>"/"shards:<reason>" -> n, per epoch
        self._last = 0.0
        self._t0 = time.perf_counter()

    @property
    def skipped(self) -> Counter:
        """Skips of all epochs together."""
        total: Counter = Counter()
        for counts in self.skipped_by_epoch.values():
            total.update(counts)
        return total

    def maybe_write(self) -> None:
        now = time.perf_counter()
        if self.path and now - self._last > STATS_INTERVAL_S:
            self._last = now
            self.write()

    def write(self) -> None:
        if not self.path:
            return
        payload = {
            "rank": self.rank, "worker": self.worker, "epoch": self.epoch, "step": self.step,
            "samples": self.samples, "padded": self.padded, "bytes": self.bytes, "dropped": self.dropped,
            "io_wait_s": round(self.io_clock.seconds, 6), "read_s": round(self.read_s, 6),
            "batch_s": round(self.batch_s, 6), "wall_s": round(time.perf_counter() - self._t0, 6),
            "skipped": dict(self.skipped), "io": self.io.as_dict(),
            "skipped_by_epoch": {str(e): dict(c) for e, c in self.skipped_by_epoch.items() if c},
        }
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, self.path)
