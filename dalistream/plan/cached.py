"""The plans a process computes once and asks for again: the bucket plans of a few recent epochs
(and their per-bucket totals and index), the node-affine plan. Each is a pure function of its
inputs; the cache only keeps the last few, keyed by them (a bucket array by its ``id``, kept
alive beside the plan so that no other array takes that id). Made before DALI's workers fork,
they are shared with them."""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence, Tuple

from .affinity import AffinePlan, Nodes
from .bucketmix import BucketMix
from .bucketresume import resumed_bucket_plan
from .bucketseq import BucketIndex
from .buckets import BucketEpoch, bucket_steps, bucket_totals
from .layout import Layout, Schedule

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

    def make() -> tuple:
        if resume:
            return resumed_bucket_plan(data.counts, ids, len(b), config.layout, config.schedule, epoch, b.per, resume,
                                       b.lookahead), ids
        return BucketEpoch(data.counts, ids, len(b), config.layout, config.schedule, epoch, b.per,
                           lookahead=b.lookahead, ranks=None if rank is None else (rank,),
                           index=bucket_index(data, len(b)) if b.per == "rank" else None), ids

    return kept(key, make)


def bucket_mix(config: Any, mix: Any, epoch: int, rank: Optional[int] = None) -> BucketMix:
    """The bucket plan of a mix's ``epoch`` (``per_batch="source"``); ``rank``: laid out for that
    rank's workers only."""
    b = config.buckets
    ids = [s.data.buckets for s in mix.sources]
    key = ("mix", tuple(map(id, ids)), config.layout, config.schedule, int(epoch), b.per, b.lookahead, rank)
    indexes = [bucket_index(s.data, len(b)) for s in mix.sources] if b.per == "rank" else None
    return kept(key, lambda: (BucketMix([s.data.counts for s in mix.sources], ids, len(b),
                                        [s.weight for s in mix.sources], config.layout, config.schedule, epoch,
                                        b.per, mix.names, mix.per_batch, mix.samples_per_epoch,
                                        None if rank is None else (rank,), indexes), ids))


def fresh_bucket_steps(config: Any, data: Any) -> int:
    """Batches every rank yields in a fresh epoch of a bucketed data set, from its per-bucket
    totals alone (counted once, not at every ``len()`` of a loader)."""
    b, ids = config.buckets, data.buckets
    totals = kept(("totals", id(ids), len(ids), len(b)), lambda: (bucket_totals(ids, len(b)), ids))
    return bucket_steps(totals, config.layout, config.schedule, b.per)


def affine_plan(config: Any, counts: Optional[Sequence[int]], epoch: int,
                resume: Sequence = ()) -> Optional[AffinePlan]:
    """The node-affine plan (:mod:`dalistream.plan.affinity`) of ``epoch`` after ``resume``'s
    segments, where it applies: ``config.affinity == "node"``, or the rest of an epoch whose
    earlier segments ran with it (a resume onto no affinity); ``None`` otherwise. Computed once
    per (epoch, layout, segments) in a process."""
    if counts is None or (config.affinity is None and all(len(s) == 4 for s in resume)):
        return None
    return _affine(tuple(counts), config.layout, config.nodes, config.schedule, int(epoch), bool(config.interleave),
                   int(config.shuffle or 0), tuple(tuple(int(v) for v in s) for s in resume))


@lru_cache(maxsize=4)
def _affine(counts: Tuple[int, ...], layout: Layout, nodes: Optional[Nodes], schedule: Schedule, epoch: int,
            columns: bool, shuffle: int, segments: Tuple[Tuple[int, ...], ...]) -> AffinePlan:
    return AffinePlan(counts, layout, nodes, schedule, epoch, columns=columns, shuffle=0 if columns else shuffle,
                      segments=segments)

