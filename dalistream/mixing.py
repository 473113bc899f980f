"""A mix of named data sets, resolved: each source's shards, counts and offsets, its weight, and
how batches are composed (:mod:`dalistream.plan.mix` plans it; :class:`dalistream.Stream` carries
it; each DALI worker reads every source's share of its slot).

``Stream.open({"web": ("s3://a/web-{0000..8191}.tar", 0.7), "clean": ("/data/clean", 0.3)}, …)``
lists and counts each source like a single data set (its own ``manifest`` and ``storage_options``
when given), then checks the mix before any worker starts: weights, a source with no samples, a
share that rounds to nothing (each a :class:`~dalistream.errors.ConfigError` naming the source).
A shard listed by two sources is refused (:func:`check_disjoint`). A mix reads each source's span per worker through the shuffle buffer (not interleaved): the
composition is the mix's own, stratified per batch. On another layout mid-epoch it goes on by
:mod:`dalistream.plan.mixresume` (default epochs, ``per_batch="sample"``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .dataset import DataSet
from .errors import ConfigError
from .manifest import SampleOffsets, count_samples
from .plan import Layout, MixEpoch, Schedule, WorkerPlan, parse_mix
from .plan.mix import PER_BATCH
from .plan.mixresume import MixResume
from .io.local import local_path
from .sources import expand_sources, is_remote


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

    def epoch(self, layout: Layout, schedule: Schedule, epoch: int) -> MixEpoch:
        """The plan of ``epoch`` for every worker of ``layout``."""
        return MixEpoch([s.data.counts for s in self.sources], [s.weight for s in self.sources], layout, schedule, epoch,
                        self.names, self.per_batch, self.samples_per_epoch)

    def resumed(self, layout: Layout, schedule: Schedule, epoch: int, segments: Sequence, shuffle: int) -> MixResume:
        """The rest of ``epoch`` after ``segments`` ran under other layouts (elastic resume)."""
        return MixResume([s.data.counts for s in self.sources], [s.weight for s in self.sources], self.names,
                         self.per_batch, self.samples_per_epoch, layout, schedule, epoch, segments, shuffle)

    def worker_plans(self, layout: Layout, schedule: Schedule, epoch: int, rank: int, worker: int,
                     resume: Sequence = (), shuffle: int = 0) -> List[Tuple[WorkerPlan, np.ndarray]]:
        """Per source, what (``rank``, ``worker``) reads of it in ``epoch`` and what its slot takes
        of it at each step: the epoch's plan, or after ``resume`` (segments run under other
        layouts) the rest of it."""
        if resume:
            return self.resumed(layout, schedule, epoch, resume, shuffle).worker(rank, worker)
        mixed = self.epoch(layout, schedule, epoch).worker(rank, worker)
        return [(WorkerPlan(rank, worker, epoch, s.parts, mixed.steps, mixed.slot, mixed.offset, s.samples,
                            mixed.global_worker, 0, (), s.shuffle_seed), s.take) for s in mixed.sources]

    def identity(self, of: Any) -> dict:
        """What the sources are, for a loader state: ``of(urls, counts, sizes)`` per source name,
        with the weights and choices (a state resumes only the same mix)."""
        return {"mix": {s.name: {**of(s.data.urls, s.data.counts, s.data.sizes), "weight": s.weight} for s in self.sources},
                "per_batch": self.per_batch, "samples_per_epoch": self.samples_per_epoch}


def open_mix(mapping: Mapping[str, Any], config: Any, per_batch: str = "sample",
             samples_per_epoch: Optional[int] = None) -> Mix:
    """List and count every source of ``mapping`` (see the module doc) for ``config`` (its
    storage options, cache, scan limit and error policy apply to every source without its own)."""
    if per_batch not in PER_BATCH:
        raise ConfigError(f"per_batch must be one of {PER_BATCH}, got {per_batch!r}")
    if samples_per_epoch is not None and (isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, int)
                                          or samples_per_epoch < 1):
        raise ConfigError(f"samples_per_epoch must be a positive integer or None, got {samples_per_epoch!r}")
    if config.policy != "even":
        raise ConfigError(f"a mix's epoch is set by its weights (or samples_per_epoch), not by policy {config.policy!r}",
                          hint="leave policy unset (even) for a mix")
    if config.interleave:
        raise ConfigError("a mix reads each source's span through the shuffle buffer: interleave=True is not "
                          "available for a mix", hint="leave interleave unset")
    out = []
    owners: dict = {}  # shard -> the source that lists it
    for item in parse_mix(mapping):
        options = dict(item.storage_options if item.storage_options is not None else config.storage_options)
        if config.storage_options.get("cache") is not None:  # the node's byte cache, for every source
            options.setdefault("cache", config.storage_options["cache"])
        sources = [item.source] if isinstance(item.source, str) else list(item.source)
        urls = expand_sources(sources, options)
        check_disjoint(item.name, urls, owners)
        counted = count_samples(urls, manifest=item.manifest, cache_dir=config.cache_dir, options=options,
                                lowercase=config.lowercase_ext, tolerant=config.on_error != "raise",
                                scan_limit_bytes=config.scan_limit_bytes)
        rows = counted.rows
        if not int(rows.samples.sum()):
            raise ConfigError(f"mix: source {item.name!r} holds no samples", url=urls[0] if urls else None)
        offsets = None
        if rows.offsets is not None:
            offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
        sizes = tuple(rows.sizes.tolist()) if bool((rows.sizes >= 0).all()) else None
        data = DataSet(tuple(urls), tuple(rows.samples.tolist()), offsets, count_source=counted.source, sizes=sizes)
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
