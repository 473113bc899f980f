"""One plan of an epoch, whatever the data: the questions every plan answers, through one
interface, and the one factory that builds it (:func:`epoch_plan`).

An :class:`EpochPlan` answers:

- :attr:`~EpochPlan.steps`: the batches the config's rank yields in the epoch (its rest after a
  resume);
- :meth:`~EpochPlan.for_worker`: what worker ``worker`` of rank ``rank`` reads, as one
  :class:`Reading` (its columns, each ``(plan, take per step, source)``, or under a bucket plan
  the :class:`~.bucketworker.BucketRun` it executes);
- :meth:`~EpochPlan.state`: the segments a loader state saves at a step of it;
- :meth:`~EpochPlan.rest`: the rest of the epoch on another layout (elastic resume), one
  operation over any plan: the factory again, with the segments that ran.

The factory composes three choices, each made once, here: the data (one data set, or a mix of
named sources, :mod:`.mix`), the owners (balanced spans, :mod:`.ownership`; the rest of an epoch
after other layouts, or node affinity, :mod:`.affinity` over :mod:`.resume`'s sequence) and the
batches (each its samples in order, or each one bucket, :mod:`.buckets`). Callers
(``Stream.steps``, the worker, the checks of a new layout) ask the factory only. Pure functions
of (config, counts, mix, epoch, segments).

The plans a process computes once and asks for again are kept here: the bucket plans of a few
recent epochs (and their per-bucket totals and index), the affine plan. The cache keeps the last
few, keyed by their inputs (a bucket array by its ``id``, kept alive beside the plan so that no
other array takes that id). Made before DALI's workers fork, they are shared with them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, StateError, redact
from .affinity import AffinePlan
from .bucketseq import BucketIndex
from .buckets import BucketEpoch, BucketMix, bucket_steps, bucket_totals, resumed_bucket_plan
from .bucketworker import BucketRun, bucket_run
from .layout import Layout
from .mix import MixEpoch
from .ownership import WorkerPlan, steps_per_epoch, worker_columns, worker_plan
from .resume import Segment, continued, segment_head

#: One column of a worker's reading: ``(plan, samples taken at each step, source)``.
Column = Tuple[WorkerPlan, np.ndarray, int]


@dataclass(frozen=True)
class Reading:
    """What one worker reads of an epoch: ``steps`` batches; its ``columns`` (a span taking the
    whole slot a step, or one column per slot position taking one sample a step; a mix: each
    source's), or under a bucket plan the ``run`` it executes from a step on (its columns are
    then the run's readers, each with the rows it reads at each step); ``left_out``: samples of the epoch that no one reads and this
    worker counts (``even``: the job's tail, counted once)."""

    steps: int
    columns: Tuple[Column, ...]
    run: Optional[BucketRun] = None
    left_out: int = 0

    @property
    def plans(self) -> Tuple[WorkerPlan, ...]:
        """The plans of the worker's columns (of its run's readers under a bucket plan)."""
        return tuple(plan for plan, _, _ in self.columns)


class EpochPlan(ABC):
    """The plan of one epoch of ``config``'s stream over ``data`` (or ``mix``), after the
    segments ``resume`` ran under other layouts. Made by :func:`epoch_plan` only."""

    def __init__(self, config: Any, data: Any, mix: Any, epoch: int, resume: Tuple[Segment, ...]) -> None:
        self.config, self.data, self.mix, self.epoch, self.resume = config, data, mix, int(epoch), resume

    @property
    @abstractmethod
    def steps(self) -> int:
        """Batches the config's rank yields in the epoch (its rest after ``resume``)."""

    @abstractmethod
    def for_worker(self, rank: int, worker: int, first: int = 0) -> Reading:
        """What worker ``worker`` of rank ``rank`` reads (a bucket plan: executes from step ``first`` on)."""

    def state(self, step: int) -> Tuple[Segment, ...]:
        """The segments that say ``step`` batches of this epoch ran on this plan's layout (after
        ``resume``): what a loader state saved at ``step`` resumes from on another layout."""
        return continued(self.resume, plan_head(self.config, self.mix), step, ())[0]  # (): no layout's head

    def rest(self, config: Any, step: int) -> Tuple["EpochPlan", int]:
        """The rest of the epoch after ``step`` batches of it ran on this plan's layout, on
        ``config``'s layout: ``(plan, its first step)`` (the same layout goes on at ``step``)."""
        segments, first = continued(self.resume, plan_head(self.config, self.mix), step, plan_head(config, self.mix))
        return epoch_plan(config, self.data, self.mix, self.epoch, segments), first


def planned_layout(config: Any, mixed: bool, layout: Optional[Layout] = None) -> Layout:
    """The layout the plan splits an epoch over (``layout``, else the config's): a single data set
    read interleaved splits it over the layout's columns (:attr:`~.layout.Layout.column_layout`);
    a mix plans its columns within its own plan, over the layout itself; so does a bucket plan."""
    layout = config.layout if layout is None else layout
    if mixed or config.buckets is not None:
        return layout
    return layout.planned(bool(config.interleave))


def plan_head(config: Any, mix: Any, layout: Optional[Layout] = None, nodes: Any = ...) -> Segment:
    """What a segment says of ``layout`` (else the config's), all but its steps
    (:func:`~.resume.segment_head`), with node affinity over ``nodes`` nodes (else the config's)."""
    layout = config.layout if layout is None else layout
    if nodes is ...:
        nodes = config.nodes.count if config.nodes is not None else None
    return segment_head(layout, planned_layout(config, mix is not None, layout), nodes, bool(config.interleave))


def epoch_plan(config: Any, data: Any, mix: Any, epoch: int, resume: Sequence = ()) -> EpochPlan:
    """THE plan of ``epoch`` of ``config``'s stream over ``data`` (a mix: ``mix``, whose sources
    ``data`` lists end to end) after the segments ``resume`` ran under other layouts: the one
    place that chooses among the data, owner and batch layers (see the module doc). A bucketed
    mix resumes on its own layout only (a :class:`~dalistream.errors.StateError`)."""
    resume = tuple(tuple(int(v) for v in s) for s in resume) if resume else ()
    if config.buckets is not None:
        if mix is not None and resume:
            raise StateError("a mix with buckets resumes on the layout it was saved under only (the same ranks, "
                             "workers and batch size)", hint="resume with the saved layout, or start the epoch over")
        return _Bucketed(config, data, mix, epoch, resume)
    if mix is not None:
        return _Mixed(config, data, mix, epoch, resume)
    return _Spans(config, data, mix, epoch, resume)


def _whole(plans: Sequence[WorkerPlan]) -> Reading:
    """The reading of columns each taking its plan's slot at every step."""
    columns = tuple((plan, np.full(plan.steps, plan.slot), 0) for plan in plans)
    return Reading(columns[0][0].steps, columns, left_out=sum(plan.left_out for plan in plans))


class _Spans(EpochPlan):
    """One data set: a whole epoch over balanced spans (:mod:`.ownership`), or, after other layouts
    ran some of it or where each node reads its own shards, the rest of its sequence cut as
    :class:`~.affinity.AffinePlan` says (without nodes: spans)."""

    def __init__(self, config: Any, data: Any, mix: Any, epoch: int, resume: Tuple[Segment, ...]) -> None:
        super().__init__(config, data, mix, epoch, resume)
        self.affine = affine_plan(config, data.counts, epoch, resume)

    @property
    def steps(self) -> int:
        c = self.config
        if self.affine is not None:
            return self.affine.steps
        return steps_per_epoch(self.data.counts, c.plan_layout, c.schedule, self.epoch, c.rank)

    def for_worker(self, rank: int, worker: int, first: int = 0) -> Reading:
        c, counts, affine = self.config, self.data.counts, self.affine
        if affine is not None:
            return _whole(affine.plans(rank, worker))
        if c.interleave:
            return _whole(worker_columns(counts, len(self.data.urls), c.layout, c.schedule, self.epoch, rank, worker))
        return _whole([worker_plan(counts, len(self.data.urls), c.plan_layout, c.schedule, self.epoch, rank, worker)])


class _Mixed(EpochPlan):
    """A mix: each source's spans or columns, or after a resume its rest (:mod:`.mix`)."""

    def _plan(self) -> MixEpoch:
        c = self.config
        return self.mix.epoch(c.layout, c.schedule, self.epoch, c.interleave, self.resume, c.shuffle)

    @property
    def steps(self) -> int:
        return self._plan().steps

    def for_worker(self, rank: int, worker: int, first: int = 0) -> Reading:
        columns: List[Column] = self._plan().worker_columns(rank, worker)
        return Reading(columns[0][0].steps, tuple(columns))


class _Bucketed(EpochPlan):
    """Every batch one bucket (:mod:`.buckets`: a data set's plan, its rest after a resume, or a
    mix's)."""

    def _plan(self, rank: Optional[int] = None) -> Any:
        """The mix's :class:`~.buckets.BucketMix` or the data set's :class:`~.buckets.BucketEpoch`
        (laid out for ``rank``'s workers only, if given)."""
        if self.mix is not None:
            return bucket_mix(self.config, self.mix, self.epoch, rank)
        return bucket_epoch(self.config, self.data, self.epoch, self.resume, rank)

    @property
    def steps(self) -> int:
        c = self.config
        if self.mix is not None or self.resume:
            return self._plan().steps
        # a fresh epoch of a data set: from its per-bucket totals alone, counted once (not at every len())
        b, ids = c.buckets, self.data.buckets
        totals = kept(("totals", id(ids), len(ids), len(b)), lambda: (bucket_totals(ids, len(b)), ids))
        return bucket_steps(totals, c.layout, c.schedule, b.per)

    def for_worker(self, rank: int, worker: int, first: int = 0) -> Reading:
        c, plan = self.config, self._plan(rank)
        if self.mix is not None:
            plans, source, source_step = plan.worker(rank, worker)
            run, left_out = bucket_run(plans, first, source, source_step), 0
        else:
            run = bucket_run([plan.worker(rank, worker)], first)
            last = (rank, worker) == (c.world_size - 1, c.workers - 1)  # (the job's last worker counts them)
            left_out = plan.left_out_count if last and c.policy == "even" else 0
        columns = tuple((plan, run.reads[:, g], source) for g, (plan, source) in enumerate(zip(run.readers, run.source)))
        return Reading(run.steps, columns, run, left_out)


def check_buckets(config: Any, data: Any, mix: Any) -> None:
    """Plan the first epoch of a bucketed stream on ``config``'s layout, every rank's: a
    :class:`~dalistream.errors.ConfigError` when it holds no batch, or needs a worker to hold
    more than the buckets' ``lookahead``."""
    if _Bucketed(config, data, mix, 0, ())._plan().steps == 0:
        sets = [data] if mix is None else [s.data for s in mix.sources]
        totals = sum(bucket_totals(d.buckets, len(config.buckets)) for d in sets)
        raise ConfigError(f"batch_size {config.batch_size} gives no batch of one bucket: buckets of "
                          f"{totals.tolist()} samples over {config.world_size} ranks",
                          url=redact(config.sources[0]),
                          hint="use a smaller batch_size, fewer buckets, or policy='exact'")


# -- the plans a process keeps ---------------------------------------------------------------------

# a few recent epochs' plans, by their inputs: (plan, the buckets' arrays it was made of)
_PLANS: "OrderedDict[tuple, tuple]" = OrderedDict()
_KEEP = 4


def kept(key: tuple, make: Callable[[], tuple]) -> Any:
    """The plan of ``key``, made by ``make() -> (plan, arrays kept alive with it)`` if not kept."""
    found = _PLANS.get(key)
    if found is None:
        found = _PLANS[key] = make()
        while len(_PLANS) > _KEEP:
            _PLANS.popitem(last=False)
    _PLANS.move_to_end(key)
    return found[0]


def bucket_index(data: Any, buckets: int) -> BucketIndex:
    """The :class:`~.bucketseq.BucketIndex` of ``data``'s buckets (a data set with
    ``counts`` and ``buckets``), made once per process."""
    ids = data.buckets
    return kept(("index", id(ids), len(ids), buckets), lambda: (BucketIndex(data.counts, ids, buckets), ids))


def bucket_epoch(config: Any, data: Any, epoch: int, resume: Sequence = (),
                 rank: Optional[int] = None) -> BucketEpoch:
    """The bucket plan of ``epoch`` for every rank and worker (the rest of it after ``resume``'s
    segments ran under other layouts); ``rank``: laid out for that rank's workers only (what a
    worker needs: its cost is its rank's samples and the epoch's column counts, not the epoch)."""
    b, ids = config.buckets, data.buckets
    key = ("one", id(ids), len(ids), config.layout, config.schedule, int(epoch), b.per, tuple(map(tuple, resume)),
           b.lookahead, None if resume else rank)  # (a resumed plan lays out every rank: one for all)
    return kept(key, lambda: (resumed_bucket_plan(
        data.counts, ids, len(b), config.layout, config.schedule, epoch, b.per, resume, b.lookahead,
        None if resume or rank is None else (rank,), None if resume else bucket_index(data, len(b))), ids))


def bucket_mix(config: Any, mix: Any, epoch: int, rank: Optional[int] = None) -> BucketMix:
    """The bucket plan of a mix's ``epoch`` (``per_batch="source"``); ``rank``: laid out for that
    rank's workers only."""
    b = config.buckets
    ids = [s.data.buckets for s in mix.sources]
    key = ("mix", tuple(map(id, ids)), config.layout, config.schedule, int(epoch), b.per, b.lookahead, rank)
    indexes = [bucket_index(s.data, len(b)) for s in mix.sources]
    return kept(key, lambda: (BucketMix([s.data.counts for s in mix.sources], ids, len(b),
                                        [s.weight for s in mix.sources], config.layout, config.schedule, epoch,
                                        b.per, mix.names, mix.per_batch, mix.samples_per_epoch,
                                        None if rank is None else (rank,), indexes), ids))


def affine_plan(config: Any, counts: Optional[Sequence[int]], epoch: int,
                resume: Sequence = ()) -> Optional[AffinePlan]:
    """The node-affine plan (:mod:`dalistream.plan.affinity`) of ``epoch`` after ``resume``'s
    segments, where it applies: ``config.affinity == "node"``, or the rest of an epoch after
    segments (with or without affinity: without nodes, its spans); ``None`` otherwise (a fresh
    epoch without affinity, or no counts). Computed once per (epoch, layout, segments) in a process."""
    if counts is None or (config.affinity is None and not resume):
        return None
    counts, columns, segments = tuple(counts), bool(config.interleave), tuple(tuple(int(v) for v in s) for s in resume)
    shuffle = 0 if columns else int(config.shuffle or 0)
    key = ("affine", counts, config.layout, config.nodes, config.schedule, int(epoch), columns, shuffle, segments)
    return kept(key, lambda: (AffinePlan(counts, config.layout, config.nodes, config.schedule, int(epoch),
                                         columns=columns, shuffle=shuffle, segments=segments), None))
