"""The parallel external source of one worker: shards → samples → padded mini-batches.

:class:`WorkerSource` is the iterable given to ``fn.external_source(parallel=True, batch=True)``.
:meth:`WorkerSource.epoch_batches` yields plain batches: one full-size batch per output in which
only this worker's slot holds real samples; every other position holds the field's shared empty
array, or a zero in the dense array of a scalar field. The extra ``valid`` output marks real
samples (1) and padding (0). Each ``next()`` gives DALI the same batch in transfer form: each
byte field as one flat blob holding its row lengths and rows, the other fields and ``valid`` as
they are (:mod:`.batch`).

What a worker reads (:meth:`WorkerSource.plans`): its span of the epoch, through the shuffle
buffer; or, reading interleaved (the default of training streams), the *columns* of its slot —
one span per batch position, all open at once, one sample of each per step — so every batch
draws from as many places of the epoch as it has positions (:mod:`dalistream.plan.ownership`).
A bucketed stream's worker executes its part of the bucket plan instead
(:class:`~.bucketfeed.BucketFeed`): its samples sit at positions that change from step to step,
and one more output carries the step's bucket.

Epochs: the loader builds sources with ``cycle="quiet"``; DALI's worker calls ``__iter__`` again
right after our ``StopIteration``, so the worker's epoch is ``start_epoch`` plus the number of
``__iter__`` calls it has seen. Every source of a rank yields exactly the plan's number of
steps per epoch, so all sources end together by construction (DALI silently desynchronises
parallel sources that end on different iterations: docs/internals.md, Invariants).

Profiling: with ``DALISTREAM_PROFILE=DIR`` in the environment when the sources are created, each
worker profiles its own ``next()`` calls (cProfile: reading, batching, packing; not DALI's
shipping, which is the worker's CPU less this) and writes ``DIR/worker-<rank>-<w>.pstats`` at the
end of every epoch.
"""

from __future__ import annotations

import cProfile
import gc
import os
import signal
import threading
import time
from functools import partial
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..config import StreamConfig
from ..dataset import DataSet
from ..errors import redact_client_logs
from ..plan import WorkerPlan, seeds
from ..plan.epochplan import Reading, epoch_plan
from ..tar.runs import Arena
from . import batch
from .policy import ErrorPolicy
from .bucketfeed import BucketFeed, bucket_column
from ..io.openfiles import raise_files_limit
from ..io.options import shared_budget
from ..io.parts import PartFetcher
from .epochfeed import EpochShares, SourceFeeds, read_epoch
from .column import ColumnReader
from .feed import Feed, shuffled_blocks
from .reader import PlanReader
from .rows import Rows
from ..plan.shuffle import emitted_indices
from .stats import WorkerStats

#: Environment variable: a directory where each worker writes a cProfile of its ``next()`` calls.
PROFILE_ENV = "DALISTREAM_PROFILE"
#: How a source introduces itself (its ``repr``, which DALI's messages about it quote)
SOURCE_NAME = "dalistream-worker-source"


class WorkerSource:
    """Iterable of padded mini-batches for one worker; picklable, generators created lazily."""

    def __init__(
        self, config: StreamConfig, data: DataSet, worker: int, *, start_epoch: int = 0, start_step: int = 0,
        stats_path: Optional[str] = None, resume: Sequence = (), mix: Any = None,
    ) -> None:
        self.config = config
        self.worker = worker
        self.data = data
        self.mix = mix  # several named data sets: one reader each (dalistream.mixing)
        layout = config.layout
        lo = layout.slot_offsets[worker]
        self._slot = (lo, lo + layout.slots[worker])  # this worker's positions in every batch
        self._span = self._slot  # where the batch being shipped holds its samples (a bucket plan's step: its own)
        self.left_out: Tuple[int, ...] = ()  # outputs no graph output needs: a placeholder ships (leave_out)
        self._readers()
        self.start_epoch = start_epoch
        self.start_step = start_step
        self.resume = tuple(resume)  # segments of start_epoch run under other layouts (plan.resume)
        self.stats_path = stats_path
        self._probe_pid: Optional[int] = None
        self._iters = 0
        self._gen: Optional[Iterator] = None
        self._stats: Optional[WorkerStats] = None
        self.epoch = start_epoch
        # read where the sources are made (the main process): the workers may not see its environment
        self.profile_dir = os.environ.get(PROFILE_ENV) or None
        self._profile: Optional[cProfile.Profile] = None
        self._arena: Optional[Arena] = None  # (made in the worker; its buffers serve every epoch)
        self._fetcher: Optional[PartFetcher] = None  # (made in the worker; its threads serve every epoch)

    def _readers(self) -> None:
        c = self.config
        # one reader per source (a single data set: one), its columns read at once sharing the
        # worker's read-ahead budget
        share = c.layout.slots[self.worker] if c.interleave else 1
        sources = ([(s.data, s.storage_options, s.name) for s in self.mix.sources] if self.mix is not None
                   else [(self.data, c.storage_options, "")])
        self.readers = tuple(PlanReader(c.replace(storage_options=shared_budget(options, share)), data, self.worker,
                                        source_name=name) for data, options, name in sources)
        self.names = tuple(name for _, _, name in sources)
        if not self.left_out:  # (the stream's fields: what the graph is defined on)
            self.transfer = batch.transfer(c.fields, c.buckets is not None)
        self._kept = [i for i in range(len(c.fields) + len(self.left_out)) if i not in self.left_out]
        #: the outputs that ship as blobs, cut into rows on receipt: one list, updated in place (the
        #: receiver holds it)
        if not hasattr(self, "blob_outputs"):
            self.blob_outputs: List[int] = []
        self.blob_outputs[:] = [i for i in self.transfer.blobs if i in self._kept]

    def leave_out(self, names: Sequence[str]) -> None:
        """Read no member for the fields ``names`` (no output of the graph depends on them): each
        of their outputs ships one placeholder array, which DALI prunes unfed. Before the source
        is shipped to its worker."""
        names = set(names)
        if not names:
            return
        fields = self.config.fields
        self.left_out = tuple(i for i, f in enumerate(fields) if f.name in names)
        self.config = self.config.replace(fields=tuple(f for f in fields if f.name not in names))
        self._readers()

    def __repr__(self) -> str:  # DALI's messages name a source by it
        return f"{SOURCE_NAME}(rank={self.config.rank}, worker={self.worker})"

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
        if self._iters == 0:  # first use in the DALI worker process
            redact_client_logs()  # the S3/HTTP reads happen here
            if self._probe_pid is not None:  # (handed to DALI: this is its worker process)
                # its columns read many shards at once: as many descriptors as the system lets it
                # have, its table of shard files within a share of them (dalistream.io.openfiles)
                raise_files_limit()
                # what the worker inherited or imported (the training script's modules, torch)
                # stays out of the collector's scans, which the many short-lived rows of
                # interleaved columns trigger often (a full scan of a forked heap costs tens of
                # ms; a collection first would cost as much, on the way to the first batch)
                gc.freeze()
            # a terminal's Ctrl-C reaches the whole process group: the main process stops the
            # workers; theirs would only print one more KeyboardInterrupt traceback each
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.epoch = self.start_epoch + self._iters
        skip = self.start_step if self._iters == 0 else 0
        self._iters += 1
        self._gen = None
        self._skip = skip
        return self

    def __next__(self) -> Tuple[Union[List[np.ndarray], np.ndarray], ...]:
        """The next batch in DALI's transfer form (:func:`dalistream.worker.batch.pack`)."""
        if self.profile_dir is None:
            return self._next()
        if self._profile is None:
            self._profile = cProfile.Profile()
        self._profile.enable()
        try:
            return self._next()
        except StopIteration:
            self._profile.disable()
            os.makedirs(self.profile_dir, exist_ok=True)
            self._profile.dump_stats(os.path.join(self.profile_dir, f"worker-{self.config.rank}-{self.worker}.pstats"))
            raise
        finally:
            self._profile.disable()

    def _next(self) -> Tuple[Union[List[np.ndarray], np.ndarray], ...]:
        if self._gen is None:
            if self._iters == 0:
                self.__iter__()
            self._gen = self.epoch_batches(self.epoch, self._skip)
        plain = next(self._gen)
        t0 = time.perf_counter()
        packed = batch.pack(plain, self.transfer, self._kept, *self._span)
        if self._stats is not None:
            self._stats.batch_s += time.perf_counter() - t0
        return packed

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_gen"] = None  # generators never travel to the worker
        state["_profile"] = None
        state["_arena"] = state["_fetcher"] = None
        return state

    # -- one epoch -------------------------------------------------------------------------

    def reading(self, epoch: int, first: int = 0) -> Reading:
        """What this worker reads in ``epoch`` (a bucket plan: executes from step ``first`` on):
        its part of the epoch's one plan (:func:`dalistream.plan.epochplan.epoch_plan`)."""
        resume = self.resume if epoch == self.start_epoch else ()
        return epoch_plan(self.config, self.data, self.mix, epoch, resume).for_worker(self.config.rank, self.worker,
                                                                                        first)

    def plans(self, epoch: int) -> Tuple[WorkerPlan, ...]:
        """The plans of this worker's columns in ``epoch`` (:meth:`reading`)."""
        return self.reading(epoch).plans

    def epoch_batches(self, epoch: int, start_step: int = 0) -> Iterator[Tuple[Union[List[np.ndarray], np.ndarray], ...]]:
        """The padded batches of ``epoch`` from ``start_step`` on; earlier samples are not read
        (a seek, or skipped by tar header), never decoded. Each step takes its slot from its
        columns (:class:`~.feed.Feed`: a span's whole slot, one sample of each interleaved
        column, each mix source's share). However it ends (its last step, an error, its consumer
        letting it go), its columns' parts are closed then, in this thread."""
        opened: List[ColumnReader] = []  # the epoch's columns, as they are made
        try:
            yield from self._batches(epoch, start_step, opened)
        finally:
            for column in opened:
                column.close()

    def _batches(self, epoch: int, start_step: int,
                 opened: List[ColumnReader]) -> Iterator[Tuple[Union[List[np.ndarray], np.ndarray], ...]]:
        c = self.config
        if self._stats is None:
            self._stats = WorkerStats(self.stats_path, c.rank, self.worker)
        stats = self._stats
        stats.epoch, stats.step = epoch, start_step
        policy = ErrorPolicy(c.on_error, c.max_skip_fraction, rank=c.rank, worker=self.worker)
        policy.skipped = stats.skipped_by_epoch.setdefault(epoch, policy.skipped)  # this epoch's skips
        if self._arena is None:  # the runs of all columns side by side: decoded together with no copy
            self._arena = Arena()
        if self._fetcher is None:  # the columns' remote parts, fetched together (no thread for local ones)
            self._fetcher = PartFetcher()
        for reader in self.readers:
            reader.arena, reader.fetcher = self._arena, self._fetcher
            reader.rows.epoch = reader.decoder.epoch = epoch  # (a video clip's frames are drawn by epoch)
        reading = self.reading(epoch, start_step)
        if reading.run is not None:
            yield from self._bucket_batches(epoch, start_step, reading, policy, stats, opened)
            stats.write()
            return
        columns = reading.columns
        steps = reading.steps
        self._state_ahead([plan for plan, _, _ in columns], [s for _, _, s in columns], stats)
        takes = np.stack([take for _, take, _ in columns], axis=1) if steps else np.zeros((0, len(columns)), np.int64)
        def by_columns(start: int, which: Optional[Sequence[int]] = None) -> Feed:
            """The column path from step ``start`` on, of the columns ``which`` (all by default)."""
            which = list(range(len(columns))) if which is None else list(which)
            streams = [self._stream(columns[k][0], int(columns[k][1][:start].sum()), policy, stats,
                                    self.readers[columns[k][2]], opened) for k in which]
            return Feed(streams, takes[:, which], len(c.fields), start, self.data.bytes_per_sample,
                        first_batch=epoch == self.start_epoch and start == start_step)

        feed: Union[Feed, EpochShares, SourceFeeds, None] = None
        if c.interleave:  # read at once, in shares, source by source
            t0 = time.perf_counter()
            feed = self._at_once(columns, takes, start_step, policy, stats, by_columns)
            stats.read_s += time.perf_counter() - t0
        if feed is None:
            feed = by_columns(start_step)
        # a mix counts what each step took of each source: columns summed by source
        by_source = np.zeros((len(columns), len(self.readers)), np.int64)
        by_source[np.arange(len(columns)), [source for _, _, source in columns]] = 1
        empty = batch.templates(c.fields, c.batch_size)
        lo, slot = self._slot[0], self._slot[1] - self._slot[0]
        for step in range(start_step, steps):
            t0 = time.perf_counter()
            values, n, counts = feed.take(step)
            if self.mix is not None:
                for name, k in zip(self.names, (counts @ by_source).tolist()):
                    stats.add_source(name, k)
            if step == steps - 1:
                policy.check(final=True)  # the epoch's skips judged before its last batch
            t1 = time.perf_counter()
            stats.read_s += t1 - t0
            outputs = batch.assemble(empty, values, lo, n)
            stats.step = step + 1
            stats.add(samples=n, padded=slot - n)
            stats.batch_s += time.perf_counter() - t1
            stats.maybe_write()
            yield outputs
        if c.policy == "even" and self.mix is None:  # a span is exactly steps x slot: only the job's tail is left out
            stats.add(dropped=reading.left_out)
        stats.write()

    def _at_once(self, columns: Sequence[Tuple[WorkerPlan, np.ndarray, int]], takes: np.ndarray, start: int,
                 policy: ErrorPolicy, stats: WorkerStats,
                 by_columns: Callable[..., Feed]) -> Union[EpochShares, SourceFeeds, None]:
        """An interleaved epoch from step ``start`` on read at once (:func:`~.epochfeed.read_epoch`),
        each source's columns by its own reader (a mix's sources side by side:
        :class:`~.epochfeed.SourceFeeds`, a source that cannot be read so by its columns); ``None``
        where no source can be."""
        groups = [[k for k, column in enumerate(columns) if column[2] == s] for s in range(len(self.readers))]
        groups = [g for g in groups if g]
        if [k for g in groups for k in g] != list(range(len(columns))):
            return None  # (columns not laid out source by source)
        readers = [self.readers[columns[g[0]][2]] for g in groups]
        read = [read_epoch(reader.context(), reader.maps, [columns[k][0] for k in g], takes[:, g], policy, stats,
                           partial(by_columns, which=g), start) for reader, g in zip(readers, groups)]
        if all(r is None for r in read):
            return None
        if len(read) == 1:
            return read[0]
        return SourceFeeds([r if r is not None else by_columns(start, g) for r, g in zip(read, groups)])

    def _state_ahead(self, plans: Sequence[WorkerPlan], sources: Sequence[int], stats: WorkerStats) -> None:
        """Through a byte cache: the versions of the objects ``plans`` read (each through reader
        ``sources[i]``) stated ahead (:meth:`~.reader.PlanReader.state_ahead`)."""
        for source, reader in enumerate(self.readers):
            reader.state_ahead([plan for plan, s in zip(plans, sources) if s == source], stats)

    def _bucket_batches(self, epoch: int, start_step: int, reading: Reading, policy: ErrorPolicy,
                        stats: WorkerStats,
                        opened: List[ColumnReader]) -> Iterator[Tuple[Union[List[np.ndarray], np.ndarray], ...]]:
        """The batches of ``epoch`` under its bucket plan from ``start_step`` on
        (:class:`~.bucketfeed.BucketFeed`): each step's samples at its own positions, then the
        bucket's index (:func:`~.bucketfeed.bucket_column`), then ``valid``; its columns added to
        ``opened``."""
        c = self.config
        run = reading.run
        self._state_ahead(run.readers, run.source, stats)

        def by_columns(start: int) -> Feed:  # the column path, from step ``start`` on
            read = run.reads[run.first:start].sum(axis=0)  # (each reader's rows before it: none gone)
            streams = [self.readers[run.source[g]].blocks(plan, policy, stats, start=run.start[g] + int(read[g]),
                                                          gone=run.gone[g])
                       for g, plan in enumerate(run.readers)]
            opened.extend(streams)
            return Feed(streams, run.reads, len(c.fields), start, self.data.bytes_per_sample,
                        first_batch=epoch == self.start_epoch and start == run.first, keyed=True)

        rows: Union[Feed, EpochShares, None] = None
        if start_step == run.first == 0 and self.mix is None and not any(run.start) and not any(run.gone):
            t0 = time.perf_counter()  # a fresh epoch whose readers read every sample: at once, in shares
            reader = self.readers[0]
            rows = read_epoch(reader.context(), reader.maps, list(run.readers), run.reads, policy, stats, by_columns)
            stats.read_s += time.perf_counter() - t0
        feed = BucketFeed(run, rows if rows is not None else by_columns(start_step), len(c.fields))
        empty = batch.templates(c.fields, c.batch_size)
        first = self.worker == 0
        # (per step: plain numbers, read once an epoch)
        offset, bucket, fill, source = (a.tolist() for a in (run.offset, run.bucket, run.fill, run.step_source))
        planned = np.diff(run.bounds).tolist()
        for step in range(start_step, run.steps):
            t0 = time.perf_counter()
            columns, n = feed.take(step)
            if self.mix is not None:
                stats.add_source(self.names[source[step]], n)
            if step == run.steps - 1:
                policy.check(final=True)  # the epoch's skips judged before its last batch
            t1 = time.perf_counter()
            stats.read_s += t1 - t0
            lo = offset[step]
            plain = batch.assemble(empty, columns, lo, n)
            self._span = (lo, lo + n)
            outputs = plain[:-1] + (bucket_column(bucket[step], c.batch_size, first),) + plain[-1:]
            stats.step = step + 1
            stats.add(samples=n, padded=planned[step] - n + (c.batch_size - fill[step] if first else 0))
            stats.batch_s += time.perf_counter() - t1
            stats.maybe_write()
            yield outputs
        if c.policy == "even" and self.mix is None and (c.rank, self.worker) == (c.world_size - 1, c.workers - 1):
            stats.add(dropped=reading.left_out)  # the job's last worker

    def _stream(self, plan: WorkerPlan, skip_count: int, policy: ErrorPolicy, stats: WorkerStats,
                reader: PlanReader, opened: List[ColumnReader]) -> Iterator[Rows]:
        """One plan's decoded samples (read by ``reader``) in delivery order after the first
        ``skip_count``: read, shuffled through the buffer (if any); those delivered before a
        resume are not read (a start position, and the buffer's delivered window passed over); its
        column added to ``opened``."""
        c = self.config
        if c.shuffle <= 1:
            opened.append(reader.blocks(plan, policy, stats, start=skip_count))
            return opened[-1]
        seed = plan.shuffle_seed if plan.shuffle_seed is not None else seeds.sample_shuffle(c.seed, plan.epoch, plan.global_worker)
        total = None if c.policy == "fixed" else plan.samples
        gone = emitted_indices(skip_count, total, c.shuffle, seed) if skip_count else set()
        start = 0
        while start in gone:
            start += 1
        blocks = reader.blocks(plan, policy, stats, start=start, gone=frozenset(o for o in gone if o > start))
        opened.append(blocks)
        return shuffled_blocks(blocks, c.shuffle, seed, total, skip_count)
