"""A mix of named data sets, resolved: each source's shards, counts and offsets, its weight, and
how batches are composed (:mod:`dalistream.plan.mix` plans it; :class:`dalistream.Stream` carries
it; each DALI worker reads every source's share of its slot).

``Stream.open({"web": ("s3://a/web-{0000..8191}.tar", 0.7), "clean": ("/data/clean", 0.3)}, …)``
lists and counts each source like a single data set (its own ``manifest`` and ``storage_options``
when given), then checks the mix before any worker starts: weights, a source with no samples, a
share that rounds to nothing (each a :class:`~dalistream.errors.ConfigError` naming the source).
A mix reads every source interleaved, as a single data set does: a worker's share of each
source is cut into columns, one per position of its share, each a span of the source's sequence
spread over it (:func:`dalistream.plan.mix.column_sizes`); ``interleave=False`` reads each
source's span per worker through the shuffle buffer instead. A shard listed by two sources is
refused (:func:`check_disjoint`). The composition is the mix's own, stratified per batch. On
another layout mid-epoch it goes on by
:mod:`dalistream.plan.mixresume` (default epochs, ``per_batch="sample"``).

**Buckets** (``buckets=``): :func:`bucketed` is the last step of the resolution: the buckets are
resolved from the manifests' per-sample keys (``AspectBuckets.auto`` from every source's), every
sample's bucket is kept in its data set (:attr:`~dalistream.dataset.DataSet.buckets`), and the
first epoch is planned once, so that a layout the plan refuses fails before any worker starts.
A mix is bucketed with ``per_batch="source"`` only (:mod:`dalistream.plan.bucketmix`). The plans
(:mod:`dalistream.plan.buckets`, after an elastic resume :mod:`~dalistream.plan.bucketresume`)
are kept for the few calls that ask for them again; :func:`worker_run` is what one worker
executes of them (:func:`~dalistream.plan.bucketworker.bucket_run`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .buckets import missing_keys
from .config import SHUFFLE_BUFFER
from .dataset import DataSet
from .errors import ConfigError, StateError, redact
from .io.local import local_path
from .io.stores import any_remote
from .manifest import SampleOffsets, count_samples
from .manifest.files import manifest_reader, manifest_urls
from .plan import Layout, MixEpoch, ResumePlan, Schedule, WorkerPlan, parse_mix, worker_plan
from .plan import worker_columns as plan_columns
from .plan.affinity import AffinePlan, Nodes
from .plan.mix import check_options
from .plan.bucketmix import BucketMix, check_bucket_mix
from .plan.bucketresume import resumed_bucket_plan
from .plan.bucketseq import BucketIndex
from .plan.buckets import BucketEpoch, bucket_steps, bucket_totals
from .plan.bucketworker import BucketRun, bucket_run
from .plan.mixresume import MixResume
from .sources import expand_sources, is_remote

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixedSource:
    """One source of a mix, listed and counted: its name, weight, resolved data set (always
    counted) and the storage options its shards are read with."""

    name: str
    weight: float
    data: DataSet
    storage_options: Mapping[str, Any]


@dataclass(frozen=True)
class Mix:
    """The sources of a mix and its two choices: ``per_batch`` (``"sample"``: every batch holds
    each source's share; ``"source"``: each batch comes whole from one source) and
    ``samples_per_epoch`` (``None``: the longest epoch in which no source repeats a sample)."""

    sources: Tuple[MixedSource, ...]
    per_batch: str = "sample"
    samples_per_epoch: Optional[int] = None

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def epoch(self, layout: Layout, schedule: Schedule, epoch: int, interleave: bool = False) -> MixEpoch:
        """The plan of ``epoch`` for every worker of ``layout`` (each source's spans, or its columns)."""
        return MixEpoch([s.data.counts for s in self.sources], [s.weight for s in self.sources], layout, schedule, epoch,
                        self.names, self.per_batch, self.samples_per_epoch, interleave)

    def resumed(self, layout: Layout, schedule: Schedule, epoch: int, segments: Sequence, shuffle: int,
                interleave: bool = False) -> MixResume:
        """The rest of ``epoch`` after ``segments`` ran under other layouts (elastic resume)."""
        return MixResume([s.data.counts for s in self.sources], [s.weight for s in self.sources], self.names,
                         self.per_batch, self.samples_per_epoch, layout, schedule, epoch, segments, shuffle, interleave)

    def identity(self, of: Any) -> dict:
        """What the sources are, for a loader state: ``of(urls, counts, sizes)`` per source name,
        with the weights and choices (a state resumes only the same mix)."""
        return {"mix": {s.name: {**of(s.data.urls, s.data.counts, s.data.sizes), "weight": s.weight} for s in self.sources},
                "per_batch": self.per_batch, "samples_per_epoch": self.samples_per_epoch}


def worker_columns(config: Any, data: DataSet, mix: Optional[Mix], epoch: int, worker: int,
                   resume: Sequence = ()) -> List[Tuple[WorkerPlan, np.ndarray, int]]:
    """What worker ``worker`` of ``config``'s rank reads in ``epoch`` (after ``resume``'s segments,
    if any, ran under other layouts), whatever the data: its columns, each ``(plan, take per
    step, source)``. A single data set's: its span (taking the whole slot a step) or, read
    interleaved, one column per slot position (one sample a step), planned by
    :mod:`dalistream.plan.ownership` (or :mod:`~dalistream.plan.resume`; with node affinity
    :func:`affine_plan`); a mix's: each source's
    span or columns by :mod:`dalistream.plan.mix` (or :mod:`~dalistream.plan.mixresume`). The
    worker reads them all one way (:class:`dalistream.worker.feed.Feed`)."""
    c = config
    if mix is not None:
        if resume:
            return mix.resumed(c.layout, c.schedule, epoch, resume, c.shuffle, c.interleave).worker_columns(c.rank, worker)
        return mix.epoch(c.layout, c.schedule, epoch, c.interleave).worker_columns(c.rank, worker)
    counts, shards, layout = data.counts, len(data.urls), c.plan_layout
    owners = c.layout.columns(c.rank, worker) if c.interleave else ()
    affine = affine_plan(c, counts, epoch, resume)
    if affine is not None:
        plans = affine.columns_of(c.rank, worker) if c.interleave else (affine.worker(c.rank, worker),)
    elif resume and counts is not None:
        resumed = ResumePlan(counts, layout, c.schedule, epoch, resume, c.shuffle)
        plans = tuple(resumed.worker(q, 0) for q in owners) if c.interleave else (resumed.worker(c.rank, worker),)
    elif c.interleave:
        plans = plan_columns(counts, shards, c.layout, c.schedule, epoch, c.rank, worker)
    else:
        plans = (worker_plan(counts, shards, layout, c.schedule, epoch, c.rank, worker),)
    return [(plan, np.full(plan.steps, plan.slot), 0) for plan in plans]


def affine_plan(config: Any, counts: Optional[Sequence[int]], epoch: int,
                resume: Sequence = ()) -> Optional[AffinePlan]:
    """The node-affine plan (:mod:`dalistream.plan.affinity`) of ``epoch`` after ``resume``'s
    segments, where it applies: ``config.affinity == "node"``, or the rest of an epoch whose
    earlier segments ran with it (a resume onto no affinity); ``None`` otherwise (the plans of
    :mod:`~dalistream.plan.ownership` and :mod:`~dalistream.plan.resume`). Computed once per
    (epoch, layout, segments) in a process."""
    resume = tuple(tuple(int(v) for v in s) for s in resume)
    if counts is None or (config.affinity is None and all(len(s) == 4 for s in resume)):
        return None
    return _affine(tuple(counts), config.layout, config.nodes, config.schedule, int(epoch), bool(config.interleave),
                   int(config.shuffle or 0), resume)


@lru_cache(maxsize=4)
def _affine(counts: Tuple[int, ...], layout: Layout, nodes: Optional[Nodes], schedule: Schedule, epoch: int,
            columns: bool, shuffle: int, segments: Tuple[Tuple[int, ...], ...]) -> AffinePlan:
    return AffinePlan(counts, layout, nodes, schedule, epoch, columns=columns, shuffle=0 if columns else shuffle,
                      segments=segments)


def resolve_source(sources: Any, config: Any, *, manifest: Optional[str],
                   storage_options: Optional[Mapping[str, Any]] = None) -> DataSet:
    """One data set resolved: its shards listed and their samples counted, with offsets and
    member layouts where a manifest or a scan has them (cached in ``config.cache_dir``), shard
    sizes and bytes per sample, and (with ``config.buckets``) the manifest's per-sample keys. The
    one way every data set is resolved, a mix's sources and a single set alike (``config``: its
    policy, cache, scan limit, error policy; ``manifest`` the source's, ``storage_options`` its
    own, else the config's). ``fixed`` without a manifest
    counts nothing (workers own whole shards)."""
    options = dict(config.storage_options if storage_options is None else storage_options)
    read = manifest_reader(config.cache_dir, options)  # (the listing and the counts read the manifest once)
    urls = expand_sources([sources] if isinstance(sources, str) else list(sources), options,
                          named=lambda folder: manifest_urls(folder, read))
    if not manifest and config.policy == "fixed":
        return DataSet(tuple(urls))
    # skip: a bad shard counts the samples before its problem (what a worker delivers)
    counted = count_samples(urls, manifest=manifest, cache_dir=config.cache_dir, options=options,
                            lowercase=config.lowercase_ext, tolerant=config.on_error != "raise",
                            scan_limit_bytes=config.scan_limit_bytes, read=read)
    rows = counted.rows
    per_sample = None
    sized = rows.sizes >= 0
    if sized.any() and rows.samples[sized].sum():
        per_sample = float(rows.sizes[sized].sum() / rows.samples[sized].sum())
    offsets = None
    if rows.offsets is not None:
        offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
        if config.cache_dir:
            offsets = offsets.saved(config.cache_dir)
    sizes = tuple(rows.sizes.tolist()) if bool(sized.all()) else None
    keys = rows.keys if config.buckets is not None else None  # (bucketed() uses and checks them)
    return DataSet(tuple(urls), tuple(rows.samples.tolist()), offsets, count_source=counted.source,
                   bytes_per_sample=per_sample, sizes=sizes, keys=keys)


def reading_order_for(config: Any, data: Sequence[DataSet]) -> Tuple[Any, str]:
    """The reading order of ``config`` once its data sets are known, and why: the config's rule
    (:func:`~dalistream.config.reading_order`), except that remote shards whose counts came
    without sample offsets read one span per worker through a buffer (each column would fetch
    its shard from byte 0 up to its part); a bucket plan reads its own columns."""
    if config.buckets is not None:
        return config, "buckets: every batch one bucket, formed as the buckets fill from columns read at once"
    remote = any(d.counts is not None and d.offsets is None and any_remote(d.urls) for d in data)
    if config.interleave and remote:
        log.warning("interleaved reading needs every sample's offset for remote shards (%s has counts only): "
                    "each worker reads one span through a shuffle buffer of %d instead; write a manifest "
                    "with offsets (`dalistream index SOURCE`) to read interleaved",
                    next(d.count_source for d in data if d.offsets is None) or "the manifest", SHUFFLE_BUFFER)
        return (config.replace(interleave=False, shuffle=config.shuffle or SHUFFLE_BUFFER),
                "remote shards without sample offsets: one span per worker through a shuffle buffer")
    if config.interleave:
        return config, "interleaved: every batch position reads its own span of the epoch"
    if config.shuffle > 1:
        return config, f"one span per worker through a shuffle buffer of {config.shuffle}"
    return config, "one span per worker, in order"


def open_mix(mapping: Mapping[str, Any], config: Any, per_batch: str = "sample",
             samples_per_epoch: Optional[int] = None, interleave_asked: bool = False) -> Mix:
    """Resolve every source of ``mapping`` (see the module doc) for ``config``
    (:func:`resolve_source`: its storage options, cache, scan limit and error policy apply to
    every source without its own) and check the mix."""
    check_options(per_batch, samples_per_epoch)  # (before any source is listed)
    if config.policy != "even":
        raise ConfigError(f"a mix's epoch is set by its weights (or samples_per_epoch), not by policy {config.policy!r}",
                          hint="leave policy unset (even) for a mix")
    if interleave_asked:
        raise ConfigError("a mix sets its own reading order: it reads interleaved columns of every source unless "
                          "interleave=False (one span per worker through the shuffle buffer)",
                          hint="leave interleave unset")
    out = []
    owners: dict = {}  # shard -> the source that lists it
    for item in parse_mix(mapping):
        options = dict(item.storage_options if item.storage_options is not None else config.storage_options)
        if config.storage_options.get("cache") is not None:  # the node's byte cache, for every source
            options.setdefault("cache", config.storage_options["cache"])
        data = resolve_source(item.source, config, manifest=item.manifest, storage_options=options)
        check_disjoint(item.name, data.urls, owners)
        if not sum(data.counts or ()):
            raise ConfigError(f"mix: source {item.name!r} holds no samples", url=data.urls[0] if data.urls else None)
        out.append(MixedSource(item.name, item.weight, data, options))
    mix = Mix(tuple(out), per_batch, samples_per_epoch)
    mix.epoch(config.layout, config.schedule, 0)  # every share, the epoch's steps: checked before any worker starts
    return mix


def shard_key(url: str) -> str:
    """One name per shard: a local file's absolute normal path, a remote URL without its query."""
    return url.split("?", 1)[0] if is_remote(url) else os.path.normpath(os.path.abspath(local_path(url)))


def check_disjoint(name: str, urls: Sequence[str], owners: dict) -> None:
    """Refuse a shard that an earlier source of the mix lists too (``owners``: shard -> source,
    updated). Each source is planned as a sequence of its own: a shard in two is read twice an
    epoch, under two names, and the weights no longer say what a batch holds."""
    for url in urls:
        key = shard_key(url)
        first = owners.setdefault(key, name)
        if first != name:
            raise ConfigError(f"mix: sources {first!r} and {name!r} both list this shard: its samples would be read "
                              "twice every epoch, and the weights would not say what a batch holds", url=url,
                              hint="list each shard in one source only; to read some shards more often, give them a "
                                   "source of their own with a larger weight")


def concatenated(sources: Sequence[MixedSource]) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    """All sources' shard URLs and counts end to end (the stream's own view, for sizing and messages)."""
    return (tuple(u for s in sources for u in s.data.urls), tuple(c for s in sources for c in s.data.counts))


# -- buckets ------------------------------------------------------------------------------------

# a few recent epochs' plans, by their inputs: (plan, the buckets' arrays it was made of, kept
# alive so that no other array takes their id)
_PLANS: "OrderedDict[tuple, tuple]" = OrderedDict()
_KEEP = 4


def _kept(key: tuple, make) -> Any:
    found = _PLANS.get(key)
    if found is None:
        found = _PLANS[key] = make()
        while len(_PLANS) > _KEEP:
            _PLANS.popitem(last=False)
    _PLANS.move_to_end(key)
    return found[0]


def bucketed(config: Any, data: DataSet, mix: Any) -> Tuple[Any, DataSet, Any]:
    """``(config, data, mix)`` with the buckets resolved and every sample's bucket known (see
    the module doc); a data set without the keys its buckets need is a
    :class:`~dalistream.errors.ManifestError` that names the ``dalistream index … --keys``
    command to run."""
    buckets = config.buckets
    kind = type(buckets).__name__
    if mix is not None:
        check_bucket_mix(mix.per_batch, mix.samples_per_epoch)
    sets = [(None, data)] if mix is None else [(s.name, s.data) for s in mix.sources]
    for name, d in sets:
        if not d.keys or any(c not in d.keys for c in buckets.columns):
            what = kind + (f" (mix source {name!r})" if name is not None else "")
            raise missing_keys(buckets.columns, d.keys, what, d.urls[0] if d.urls else None)
    every = {c: np.concatenate([d.keys[c] for _, d in sets]) for c in buckets.columns}
    resolved = buckets.resolve(every)
    config = config.replace(buckets=resolved)
    assigned = []
    for _, d in sets:
        starts = np.concatenate([[0], np.cumsum(d.counts)])
        assigned.append(d.with_buckets(resolved.assign(d.keys, d.urls, starts)))
    if mix is None:
        data = assigned[0]
    else:
        mix = dataclasses.replace(mix, sources=tuple(dataclasses.replace(s, data=d)
                                                     for s, d in zip(mix.sources, assigned)))
    check_buckets(config, data, mix)
    return config, data, mix


def check_buckets(config: Any, data: DataSet, mix: Any) -> None:
    """Plan the first epoch of a bucketed stream on ``config``'s layout: a
    :class:`~dalistream.errors.ConfigError` when it holds no batch, or needs a worker to hold
    more than the buckets' ``lookahead``."""
    steps = (bucket_mix(config, mix, 0) if mix is not None else bucket_epoch(config, data, 0)).steps
    if steps == 0:
        sets = [data] if mix is None else [s.data for s in mix.sources]
        totals = sum(bucket_totals(d.buckets, len(config.buckets)) for d in sets)
        raise ConfigError(f"batch_size {config.batch_size} gives no batch of one bucket: buckets of "
                          f"{totals.tolist()} samples over {config.world_size} ranks",
                          url=redact(config.sources[0]),
                          hint="use a smaller batch_size, fewer buckets, or policy='exact'")


def bucket_index(data: DataSet, buckets: int) -> BucketIndex:
    """The :class:`~.plan.bucketseq.BucketIndex` of ``data``'s buckets, made once per process
    (before DALI's workers fork, they share the main process's)."""
    ids = data.buckets
    return _kept(("index", id(ids), len(ids), buckets), lambda: (BucketIndex(data.counts, ids, buckets), ids))


def bucket_epoch(config: Any, data: DataSet, epoch: int, resume: Sequence = (),
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

    return _kept(key, make)


def bucket_mix(config: Any, mix: Any, epoch: int, rank: Optional[int] = None) -> BucketMix:
    """The bucket plan of a mix's ``epoch`` (``per_batch="source"``); ``rank``: laid out for that
    rank's workers only."""
    b = config.buckets
    ids = [s.data.buckets for s in mix.sources]
    key = ("mix", tuple(map(id, ids)), config.layout, config.schedule, int(epoch), b.per, b.lookahead, rank)
    indexes = [bucket_index(s.data, len(b)) for s in mix.sources] if b.per == "rank" else None
    return _kept(key, lambda: (BucketMix([s.data.counts for s in mix.sources], ids, len(b),
                                         [s.weight for s in mix.sources], config.layout, config.schedule, epoch,
                                         b.per, mix.names, mix.per_batch, mix.samples_per_epoch,
                                         None if rank is None else (rank,), indexes), ids))


def bucketed_steps(config: Any, data: DataSet, mix: Any, epoch: int, resume: Sequence = ()) -> int:
    """Batches every rank yields in ``epoch`` (its rest after ``resume``'s segments), from the
    per-bucket counts alone where no resume is involved."""
    b = config.buckets
    if mix is not None:
        if resume:
            raise StateError("a mix with buckets resumes on the layout it was saved under only (the same ranks, "
                             "workers and batch size)", hint="resume with the saved layout, or start the epoch over")
        return bucket_mix(config, mix, epoch).steps
    if resume:
        return bucket_epoch(config, data, epoch, resume).steps
    ids = data.buckets  # (its per-bucket totals counted once, not at every len() of a loader)
    totals = _kept(("totals", id(ids), len(ids), len(b)), lambda: (bucket_totals(ids, len(b)), ids))
    return bucket_steps(totals, config.layout, config.schedule, b.per)


def worker_run(config: Any, data: DataSet, mix: Any, epoch: int, worker: int, resume: Sequence = (),
               first: int = 0) -> BucketRun:
    """What worker ``worker`` of ``config``'s rank executes of ``epoch`` from step ``first`` on
    (after ``resume``'s segments, if any, ran under other layouts)."""
    if mix is not None:
        if resume:
            bucketed_steps(config, data, mix, epoch, resume)  # refused, in words
        plans, source, source_step = bucket_mix(config, mix, epoch, config.rank).worker(config.rank, worker)
        return bucket_run(plans, first, source, source_step)
    return bucket_run([bucket_epoch(config, data, epoch, resume, config.rank).worker(config.rank, worker)], first)
