"""The parallel external source of one worker: shards → samples → padded mini-batches.

:class:`WorkerSource` is the iterable given to ``fn.external_source(parallel=True, batch=True)``.
Each ``next()`` returns one full-size batch per output in which only this worker's slot holds
real samples; every other position holds the field's shared empty array (no per-slot Python
work). The extra ``valid`` output marks real samples (1) and padding (0).

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
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .config import StreamConfig
from .errors import DalistreamError, ManifestError, SampleError, ShardFormatError, SourceError
from .plan import WorkerPlan, epoch_order, worker_plan
from .samples import ErrorPolicy, FieldDecoder, emitted_indices, shuffle_seed, shuffled
from .streams import IOCounters, ShardSequence
from .tario import iter_samples

ONE = np.ones((), np.uint8)
ZERO = np.zeros((), np.uint8)
STATS_INTERVAL_S = 0.5


class WorkerSource:
    """Iterable of padded mini-batches for one worker; picklable, generators created lazily."""

    def __init__(
        self, config: StreamConfig, urls: Sequence[str], counts: Optional[Sequence[int]], worker: int, *,
        start_epoch: int = 0, start_step: int = 0, stats_path: Optional[str] = None,
    ) -> None:
        self.config = config
        self.urls = list(urls)
        self.counts = list(counts) if counts is not None else None
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

    def __next__(self) -> Tuple[List[np.ndarray], ...]:
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

    def epoch_batches(self, epoch: int, start_step: int = 0) -> Iterator[Tuple[List[np.ndarray], ...]]:
        """The padded batches of ``epoch`` from ``start_step`` on; earlier samples are skipped by
        tar header, never decoded."""
        c = self.config
        plan = self.plan(epoch)
        if self._stats is None:
            self._stats = _Stats(self.stats_path, c.rank, self.worker)
        stats = self._stats
        stats.epoch, stats.step = epoch, start_step
        policy = ErrorPolicy(c.on_error)
        policy.skipped = stats.skipped  # counters add up over epochs
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

        templates = [[f.empty] * c.batch_size for f in c.fields] + [[ZERO] * c.batch_size]
        lo, hi = plan.offset, plan.offset + plan.slot
        for step in range(start_step, plan.steps):
            t0 = time.perf_counter()
            chunk = [s for s in itertools.islice(stream, plan.slot)]
            stats.read_s += time.perf_counter() - t0
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
                outputs[-1][lo:lo + n] = [ONE] * n
            stats.step = step + 1
            stats.samples += n
            stats.padded += plan.slot - n
            stats.maybe_write()
            yield outputs
        if plan.samples is not None and c.policy == "even":
            stats.dropped += max(0, plan.samples - plan.steps * plan.slot - sum(policy.skipped.values()))
        stats.write()

    def _decoded(self, plan: WorkerPlan, keep, policy: ErrorPolicy, stats: "_Stats") -> Iterator:
        """Decoded samples of this worker's shards (endless, re-ordered per pass, for ``fixed``)."""
        c = self.config
        ordinal = 0
        passes = itertools.count() if c.policy == "fixed" else range(1)
        for n_pass in passes:
            order = list(plan.shards)
            if n_pass:
                perm = epoch_order(len(order), c.seed, plan.epoch * 1_000_003 + n_pass)
                order = [order[i] for i in perm]
            start = ordinal
            shards = ShardSequence([self.urls[i] for i in order], c.storage_options, stats.io)
            for position, index in enumerate(order):
                url = self.urls[index]
                base = ordinal
                count = self.counts[index] if self.counts is not None else None
                if count is not None and not any(keep(base + i) for i in range(count)):
                    ordinal += count  # resume: a shard consumed before the restart is not even opened
                    yield from itertools.repeat(None, count)
                    continue
                try:
                    with shards.open(position) as f:
                        for sample in iter_samples(
                            f, url, keep=lambda i: keep(base + i), want_ext=self.decoder.wants,
                            lowercase=c.lowercase_ext, max_member_bytes=c.max_member_bytes,
                        ):
                            ordinal += 1
                            if not keep(ordinal - 1):
                                yield None
                                continue
                            stats.bytes += sum(len(v) for k, v in sample.items() if v is not None and not k.startswith("__"))
                            try:
                                value = self.decoder.decode(sample)
                            except SampleError as e:
                                policy.handle(e.at(rank=c.rank, worker=self.worker), "samples")
                                continue
                            if value is None:
                                policy.skipped["missing_field"] += 1
                                continue
                            yield value
                except (ShardFormatError, SourceError) as e:
                    policy.handle(e.at(rank=c.rank, worker=self.worker), "shards")
                except DalistreamError as e:
                    raise e.at(rank=c.rank, worker=self.worker)
                except (OSError, EOFError) as e:  # zlib/gzip/network errors mid-stream
                    policy.handle(ShardFormatError(f"{type(e).__name__}: {e}", url=url, rank=c.rank, worker=self.worker),
                                  "shards")
            shards.close()
            if ordinal == start:
                raise SourceError("worker's shards hold no samples", url=self.urls[plan.shards[0]],
                                  rank=c.rank, worker=self.worker)


class _Stats:
    """Per-worker counters since the pipeline started, written as a small JSON file that the
    loader reads (throttled)."""

    def __init__(self, path: Optional[str], rank: int, worker: int) -> None:
        self.path = path
        self.rank, self.worker, self.epoch = rank, worker, 0
        self.step = self.samples = self.padded = self.bytes = self.dropped = 0
        self.read_s = 0.0
        self.io = IOCounters()  # remote requests, retries, resumes of this worker
        self.skipped: Counter = Counter()
        self._last = 0.0
        self._t0 = time.perf_counter()

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
            "read_s": round(self.read_s, 6), "wall_s": round(time.perf_counter() - self._t0, 6),
            "skipped": dict(self.skipped), "io": self.io.as_dict(),
        }
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, self.path)
