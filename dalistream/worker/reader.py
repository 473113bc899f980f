"""One column of a worker: the samples a :class:`~dalistream.plan.WorkerPlan` names, read in plan
order and decoded, as blocks of rows (:class:`~.rows.Rows`): the one item type of the worker's
stream. A lone sample is a block of one.

:meth:`PlanReader.blocks` opens the plan's parts in sequence (:class:`~dalistream.io.ShardSequence`),
reads their samples a run at a time (cut out by the member layout, :mod:`dalistream.tar.runs`;
or found by header walk and gathered, :mod:`dalistream.tar.walked`), decodes them (a run by
:class:`~.rows.RowDecoder`, a sample alone by :class:`~.fields.FieldDecoder`) and applies the
error policy where a problem is found, in order. Nothing but rows comes out.

Samples are numbered in plan order by their *ordinal* (the parts' samples less the plan's
drops). A resume reads from ``start`` on: each part opens at its first sample still to read (a
seek to its offset, or header skipping without one); the ordinals in ``gone`` (a shuffle
buffer's delivered window) and the plan's drops (an elastic resume's) are passed over, never
decoded (:class:`~.numbering.Numbering`). Every block holds consecutive ordinals (``Rows.ordinal``
is its first).

A column's blocks come from a :class:`~.column.ColumnReader`, which reads the tar reader's raw items
ahead on request, so that :class:`~.feed.ColumnRounds` decodes the runs of all of a worker's columns
together (:func:`~.rows.decode_runs`) before each column turns its items into blocks, in its own
order: the problems of a shard are acted on before the sample read just before them. A column's
remote parts are fetched by the worker's read-ahead (``PlanReader.fetcher``, one for all its
columns), from the moment the column is made.
"""

from __future__ import annotations

import itertools
from typing import AbstractSet, Any, Callable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..config import StreamConfig
from ..dataset import DataSet
from ..errors import DalistreamError, SampleError, SourceError
from ..io.parts import PartFetcher
from ..io.remote import state_ahead
from ..io.streams import ShardSequence, chunk_bytes, maps_parts
from ..plan import WorkerPlan
from ..tar.runs import Arena, Run, run_length
from .fields import FieldDecoder
from .context import ReadContext
from .layouts import ShardLayouts
from .mapped import ShareMaps
from .policy import ErrorPolicy
from .numbering import Numbering, between as _between, pass_parts
from .part import read_part
from .column import ColumnReader, ReadItem
from .rows import last_waits, RowDecoder, Rows
from .stats import WorkerStats


class PartRead(NamedTuple):
    """A part of a plan's pass as a column reads it: samples ``first`` (where it opens, after
    those a resume passes over) to ``stop`` (``None``: the shard's end) of shard ``index``,
    numbered by ``numbering``; ``begin``, ``end``: its bytes where the offsets place them (a
    seek, or a ranged read; ``None``: unknown)."""

    index: int
    first: int
    stop: Optional[int]
    numbering: Numbering
    begin: Optional[int]
    end: Optional[int]


class PlanReader:
    """Reads the samples a :class:`WorkerPlan` names (see module doc); picklable. ``config``'s
    storage options are this column's share of the worker's budget; ``share_options``, those of
    the one stream that reads an epoch's share by ranges (its source's share of the worker's
    budget; default: ``config``'s)."""

    def __init__(self, config: StreamConfig, data: DataSet, worker: int, source_name: str = "",
                 share_options: Optional[Mapping[str, Any]] = None) -> None:
        self.config = config
        self.share_options = dict(config.storage_options if share_options is None else share_options)
        self.data = data  # the shards, their counts, offsets (a part opens where it starts) and count source
        self.worker = worker
        self.decoder = FieldDecoder(config.fields, config.missing)
        self.rows = RowDecoder(config.fields, config.lowercase_ext)
        self.source_name = source_name  # a mix's source name: what a ``__source__`` field holds
        self.layouts = ShardLayouts(data, config.lowercase_ext, config.max_member_bytes, self.decoder.wants)
        self.arena: Optional[Arena] = None  # where runs are read (a worker's, shared by its columns)
        self.fetcher: Optional[PartFetcher] = None  # the worker's read-ahead of remote parts (shared by its columns)
        self.maps = ShareMaps()  # what an epoch's shares read from one mapping hand on (:mod:`.mapped`)

    def __getstate__(self) -> dict:  # (the fetcher's threads stay in the process that made it; runs never travel)
        return dict(self.__dict__, fetcher=None, maps=ShareMaps(self.maps.whole))

    def context(self) -> ReadContext:
        """What this reader's helpers read with now (:class:`~.context.ReadContext`)."""
        return ReadContext(self.config, self.data, self.layouts, self.decoder.wants, self.rows, self.source_name,
                           self.arena, self.worker, self.fetcher, self.share_options)

    @property
    def run_bytes(self) -> int:
        """The bytes of the runs this reader reads (the runs of a regular shard's parts: longer
        for local files, whose runs are views of their mapped bytes)."""
        urls = self.data.urls
        return run_length(chunk_bytes(self.config.storage_options), bool(urls) and maps_parts(urls[0]))

    def blocks(self, plan: WorkerPlan, policy: ErrorPolicy, stats: WorkerStats, start: int = 0,
               gone: AbstractSet[int] = frozenset()) -> ColumnReader:
        """The plan's decoded samples from ordinal ``start`` on, less the ordinals ``gone``, as
        blocks (endless, the parts re-ordered per pass, for ``fixed``); the error policy applied
        where each problem is found (see the module doc). A
        :class:`ColumnReader`."""
        return ColumnReader(self, plan, policy, stats, start, gone)

    def items(self, plan: WorkerPlan, stats: WorkerStats, start: int = 0, gone: AbstractSet[int] = frozenset(),
              first_runs: Callable[[], Tuple[int, ...]] = tuple) -> Iterator[ReadItem]:
        """The tar reader's raw items of the plan (runs, single samples) as :class:`~.column.ReadItem`
        (the item, its part's :class:`Numbering`, its pass, the shard problems met before it, those
        met after it). A
        shard's problem, met at the end of its part, is acted on before the sample read just before
        it, as when samples are read one by one: a single sample is given out once the next is read
        (a problem met after it comes with it), a run at once, its last sample waiting in the
        column for the next item and the problems met before that (:meth:`item_blocks`); problems
        with no item left after them come with an item ``None``. The first pass's parts are
        handed to the worker's read-ahead (``fetcher``) now, fetched with the other columns'.
        ``first_runs()``: the bytes of the first runs of a part opened now
        (:func:`~dalistream.tar.runs.sliced_runs`), asked of the column as each part opens."""
        return self._items(plan, stats, start, gone, self._pass(plan, 0, 0, start, gone, stats), first_runs)

    def _pass(self, plan: WorkerPlan, n_pass: int, ordinal: int, start: int, gone: AbstractSet[int],
              stats: WorkerStats) -> Tuple[List[PartRead], ShardSequence, int]:
        """Pass ``n_pass`` over the plan's parts: their reads, their ``ShardSequence``, the ordinal after them."""
        parts = pass_parts(plan, n_pass, self.config.seed)
        drop = plan.drop if not n_pass else ()  # an elastic resume's raw positions (first pass only)
        reads = []
        raw = 0
        for index, first, stop in parts:
            size = None if stop is None else stop - first
            numbering = Numbering(first, size, raw, ordinal, drop, start, gone)
            if size is not None:
                ordinal += size - _between(drop, raw, raw + size)
                raw += size
            opened_at = first + numbering.head
            if stop is None or opened_at < stop or stop == first == 0:  # (an empty shard is opened: it is checked)
                begin, end = self.layouts.byte_range(index, opened_at, stop)
                reads.append(PartRead(index, opened_at, stop, numbering, begin, end))
        shards = ShardSequence([self.data.urls[r.index] for r in reads], self.config.storage_options, stats.io,
                               ranges=[(r.begin or 0, r.end) for r in reads], fetcher=self.fetcher)
        return reads, shards, ordinal

    def _items(self, plan: WorkerPlan, stats: WorkerStats, start: int, gone: AbstractSet[int],
               first: Tuple[List[PartRead], ShardSequence, int],
               first_runs: Callable[[], Tuple[int, ...]]) -> Iterator[ReadItem]:
        c = self.config
        ctx = self.context()
        reads, shards, ordinal = first
        passes = itertools.count() if c.policy == "fixed" else range(1)
        pass_first = 0  # the pass's first ordinal
        for n_pass in passes:
            if n_pass:
                pass_first = ordinal
                reads, shards, ordinal = self._pass(plan, n_pass, ordinal, start, gone, stats)
            held: Optional[ReadItem] = None  # the raw item read last: given out once the next one is read
            problems: List[DalistreamError] = []  # met before any item of this pass: they come with its first
            given = 0
            try:
                for position, (index, first, stop, numbering, begin, end) in enumerate(reads):
                    for item in read_part(ctx, shards, position, index, first, stop, begin, end, stats, numbering,
                                          first_runs()):
                        if held is not None:
                            given += 1
                            yield held
                            held = None
                        if isinstance(item, Run):  # at once: its last sample waits in the column
                            given += 1
                            yield ReadItem(item, numbering, n_pass, problems, [])
                            problems = []
                            continue
                        held, problems = ReadItem(item, numbering, n_pass, problems, []), []
                    if numbering.problem is not None:  # it overtakes the item held back (met after it)
                        (held.after if held is not None else problems).append(numbering.problem)
                    if stop is None:  # a whole shard of unknown count: its samples number the next
                        ordinal = numbering.base + numbering.found
                if held is not None:
                    given += 1
                    yield held
                if problems:
                    yield ReadItem(None, None, n_pass, problems, [])
            finally:
                shards.close()
            delivered = pass_first < ordinal <= start  # (a pass whose samples all came before a resume)
            if c.policy == "fixed" and not given and not delivered and not (n_pass == 0 and (start or gone)):
                raise self.no_samples(plan)

    def state_ahead(self, plans: Sequence[WorkerPlan], stats: WorkerStats) -> None:
        """Through a byte cache: the versions of the shards ``plans`` read stated ahead, in
        parallel (:func:`~dalistream.io.remote.state_ahead`), so that the columns, opened one after
        the other, do not each wait for a round trip."""
        state_ahead([self.data.urls[index] for plan in plans for index, _, _ in plan.parts],
                    self.config.storage_options, stats.io)

    def no_samples(self, plan: WorkerPlan) -> SourceError:
        """The error of a ``fixed`` worker whose pass over its parts gave no usable sample."""
        c = self.config
        return SourceError("worker's shards hold no usable samples: policy 'fixed' cannot fill its batches",
                           url=self.data.urls[plan.shards[0]] if plan.parts else None, rank=c.rank, worker=self.worker,
                           reason="no_samples", hint="check the shards (see the warnings), or use fewer workers")

    def item_blocks(self, item, numbering: "Numbering", policy: ErrorPolicy, stats: WorkerStats,
                    next_read: Callable[[bool], bool]) -> Iterator[Rows]:
        """A raw item of the tar reader (a :class:`Run`, or one sample) as blocks. A run's last
        sample waits for the item after it: ``next_read(read)`` says whether that item is read
        (reading it now if ``read``), the problems met before it acted on (the column's:
        :meth:`~.column.ColumnReader.next_read`)."""
        if isinstance(item, Run):
            return self._run_blocks(item, numbering, policy, stats, next_read)
        return self._sample_blocks(item, numbering, policy, stats)

    def _run_blocks(self, run: Run, numbering: "Numbering", policy: ErrorPolicy, stats: WorkerStats,
                    next_read: Callable[[bool], bool]) -> Iterator[Rows]:
        """A run's samples decoded together (or already, with other runs: ``run.decoded``), as
        blocks between the samples passed over and those that do not pass, which are settled one
        by one in their place: the error policy meets them in the order it would meet them read
        one by one (the last sample, once the next item is read)."""
        if run.nbytes:
            stats.add(bytes=run.nbytes)
        columns, bad = run.decoded if run.decoded is not None else self.rows.decode(run, self.source_name)
        run.decoded = None
        n = len(run)
        passed = [i - run.first for i in numbering.passed(run.first, run.first + n)]
        if not bad and not passed:  # (the usual case: the run is one block, or two while the next is not read)
            if next_read(False):
                return iter((Rows(columns, n, numbering.ordinal(run.first)),))
            return last_waits(columns, n, numbering.ordinal(run.first), next_read)
        return self._split_blocks(run, numbering, policy, stats, columns, bad, passed, next_read)

    def _split_blocks(self, run: Run, numbering: "Numbering", policy: ErrorPolicy, stats: WorkerStats,
                      columns: List[list], bad: List[int], passed: List[int],
                      next_read: Callable[[bool], bool]) -> Iterator[Rows]:
        """:meth:`_run_blocks` of a run with samples passed over or settled alone."""
        skip, n, first = numbering.skip, len(run), run.first
        lowercase, wants = self.config.lowercase_ext, self.decoder.wants
        begin = 0
        for i in (sorted(set(bad) | set(passed)) if passed else bad) + [n]:
            if i == n and begin < n:  # the last rows: the last waits for the next item
                waits = last_waits([column[begin:] for column in columns], n - begin,
                                   numbering.ordinal(first + begin), next_read)
                del columns, run, next_read  # (see last_waits)
                yield from waits
                return
            if i > begin:
                yield Rows([column[begin:i] for column in columns], i - begin, numbering.ordinal(first + begin))
            if i == n - 1:  # the last sample, passed over or settled alone, once the next item is read
                next_read(True)
            if i < n and not skip(first + i):
                sample = run.sample(i, lowercase, wants)
                if i == n - 1:
                    del columns, run, next_read  # (see last_waits)
                value = self.settle(sample, policy, stats)
                if value is not None:
                    yield Rows([[v] for v in value], 1, numbering.ordinal(first + i))
            begin = i + 1

    def _sample_blocks(self, sample: dict, numbering: "Numbering", policy: ErrorPolicy,
                       stats: WorkerStats) -> Iterator[Rows]:
        """One sample of the header walk as a block of one (nothing when it is passed over or skipped)."""
        index = sample["__index__"]
        if numbering.skip(index):
            return
        stats.add(bytes=sum(len(v) for k, v in sample.items() if v is not None and not k.startswith("__")))
        value = self.settle(sample, policy, stats)
        if value is not None:
            yield Rows([[v] for v in value], 1, numbering.ordinal(index))

    def settle(self, sample: dict, policy: ErrorPolicy, stats: WorkerStats) -> Optional[tuple]:
        """One raw sample decoded, or ``None`` when the error policy skipped it (counted; raised
        under ``on_error="raise"``): its tar reader's error, a field that does not decode, a
        missing field."""
        c = self.config
        error = sample.get("__error__")  # found by the tar reader
        if error is None:
            try:
                value = self.decoder.decode(sample, self.source_name)
            except SampleError as e:
                error = e
            else:
                if value is not None:
                    return value
                policy.count("samples", "missing_field", example=self.decoder.describe_missing(sample))
                stats.flush_skips()
                return None
        policy.handle(error.at(rank=c.rank, worker=self.worker), "samples")
        stats.flush_skips()
        return None
