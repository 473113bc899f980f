"""A mix of named data sets, as the user gives it and as it is resolved: each source's shards,
counts and offsets, its weight, and how batches are composed (:mod:`dalistream.plan.mix` plans
it: its composition, columns and resume; :class:`dalistream.Stream` carries it; each DALI worker
reads every source's share of its slot).

``Stream.open({"web": ("s3://a/web-{0000..8191}.tar", 0.7), "clean": ("/data/clean", 0.3)}, …)``
lists and counts each source like a single data set (its own ``manifest`` and ``storage_options``
when given), then checks the mix before any worker starts: weights, a source with no samples, a
share that rounds to nothing, a shard listed by two sources (:func:`check_disjoint`), each a
:class:`~dalistream.errors.ConfigError` naming the source. The input is checked before anything
is listed (:func:`parse_mix`; on a command line :func:`parse_mix_arg`). With buckets (:func:`dalistream.stream.bucketed`) a mix is bucketed with
``per_batch="source"`` only (:class:`dalistream.plan.buckets.BucketMix`).
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .dataset import DataSet
from .errors import ConfigError
from .io.local import local_path
from .plan import Layout, MixEpoch, Schedule
from .plan.mix import check_options
from .sources import is_remote


# -- a mix as given: {name: (source, weight)} or a dict per source; NAME=WEIGHT:SOURCE on a command line

MIX_KEYS = ("source", "weight", "manifest", "storage_options")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class MixSource:
    """One named source of a mix: where its shards are, its weight (normalised: all weights of
    the mix sum to 1), and optionally its manifest and storage options."""

    name: str
    source: Any
    weight: float
    manifest: Optional[Any] = None
    storage_options: Optional[Mapping[str, Any]] = None


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"mix: a source name must be a non-empty string, got {name!r}")
    return name


def check_weight(name: str, weight: Any) -> float:
    """``weight`` as a float, or a ConfigError naming source ``name``: the weight must be a real
    number (not a bool), finite and greater than zero."""
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise ConfigError(f"mix: source {name!r}: weight must be a number, got {weight!r}")
    value = float(weight)
    if not math.isfinite(value):
        raise ConfigError(f"mix: source {name!r}: weight must be finite, got {weight!r}")
    if value <= 0:
        raise ConfigError(f"mix: source {name!r}: weight must be greater than 0, got {weight!r}",
                          hint="leave the source out of the mix instead of giving it weight 0")
    return value


def check_weights(weights: Mapping[str, Any]) -> Dict[str, float]:
    """The weights of ``{name: weight}`` checked (:func:`check_weight`) and normalised to sum 1,
    in the mapping's order."""
    if not isinstance(weights, Mapping) or not weights:
        raise ConfigError(f"mix: needs at least one source, got {weights!r}")
    raw = {_name(name): check_weight(name, w) for name, w in weights.items()}
    total = math.fsum(raw.values())
    if not math.isfinite(total):
        raise ConfigError("mix: the weights' sum is not finite", hint="give weights of a smaller scale")
    return {name: w / total for name, w in raw.items()}


def _entry(name: str, value: Any) -> Dict[str, Any]:
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in MIX_KEYS]
        if unknown:
            raise ConfigError(f"mix: source {name!r}: unknown key {unknown[0]!r}", hint=f"the keys are {MIX_KEYS}")
        entry = dict(value)
        entry.setdefault("weight", 1.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        entry = {"source": value[0], "weight": value[1]}
    else:
        raise ConfigError(f"mix: source {name!r}: expected (source, weight) or a dict with keys {MIX_KEYS}, "
                          f"got {value!r}")
    source = entry.get("source")
    if source is None or (isinstance(source, (str, list, tuple)) and len(source) == 0):
        raise ConfigError(f"mix: source {name!r}: missing source (shard paths or URLs)")
    options = entry.get("storage_options")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"mix: source {name!r}: storage_options must be a dict, got {options!r}")
    return entry


def parse_mix(mapping: Mapping[str, Any]) -> List[MixSource]:
    """The sources of a mix, in the mapping's order, weights normalised. Each entry is
    ``name: (source, weight)`` or ``name: {"source": …, "weight": …, "manifest": …,
    "storage_options": …}`` (``weight`` defaults to 1 in the dict form)."""
    if not isinstance(mapping, Mapping) or not mapping:
        raise ConfigError(f"mix: expected a non-empty mapping of named sources, got {mapping!r}")
    entries = {_name(name): _entry(name, value) for name, value in mapping.items()}
    weights = check_weights({name: e["weight"] for name, e in entries.items()})
    return [MixSource(name, e["source"], weights[name], e.get("manifest"), e.get("storage_options"))
            for name, e in entries.items()]


def parse_mix_arg(text: str) -> Tuple[str, float, str]:
    """``"web=0.7:s3://a/web-{0000..0009}.tar"`` → ``("web", 0.7, "s3://a/web-{0000..0009}.tar")``:
    a command line's ``NAME=WEIGHT:SOURCE`` (the weight not yet normalised)."""
    usage = "expected NAME=WEIGHT:SOURCE, e.g. web=0.7:s3://bucket/web-{0000..0009}.tar"
    name, eq, rest = str(text).partition("=")
    weight_text, colon, source = rest.partition(":")
    if not eq or not colon:
        raise ConfigError(f"mix: cannot read {text!r}: {usage}")
    name = name.strip()
    if not _NAME.match(name):
        raise ConfigError(f"mix: cannot read {text!r}: the name {name!r} must be letters, digits, '_', '.' or '-'",
                          hint=usage)
    try:
        weight = float(weight_text)
    except ValueError:
        raise ConfigError(f"mix: source {name!r}: weight must be a number, got {weight_text!r}", hint=usage) from None
    if not source.strip():
        raise ConfigError(f"mix: source {name!r}: missing source after {name}={weight_text}:", hint=usage)
    return name, check_weight(name, weight), source.strip()


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

    def epoch(self, layout: Layout, schedule: Schedule, epoch: int, interleave: bool = False, resume: Sequence = (),
              shuffle: int = 0) -> MixEpoch:
        """The plan of ``epoch`` for every worker of ``layout`` (each source's spans, or its columns;
        its rest after the segments ``resume``, delivered through buffers of ``shuffle``)."""
        return MixEpoch([s.data.counts for s in self.sources], [s.weight for s in self.sources], layout, schedule,
                        epoch, self.names, self.per_batch, self.samples_per_epoch, interleave, resume, shuffle)

    def identity(self, of: Any) -> dict:
        """What the sources are, for a loader state: ``of(urls, counts, sizes)`` per source name,
        with the weights and choices (a state resumes only the same mix)."""
        return {"mix": {s.name: {**of(s.data.urls, s.data.counts, s.data.sizes), "weight": s.weight} for s in self.sources},
                "per_batch": self.per_batch, "samples_per_epoch": self.samples_per_epoch}


def open_mix(mapping: Mapping[str, Any], config: Any, resolve: Callable[..., DataSet], per_batch: str = "sample",
             samples_per_epoch: Optional[int] = None, interleave_asked: bool = False) -> Mix:
    """Resolve every source of ``mapping`` (see the module doc) for ``config`` by ``resolve(source,
    config, manifest=, storage_options=)`` (the stream's one way to resolve a data set,
    :func:`dalistream.stream.resolve_source`: the config's storage options, cache, scan limit and
    error policy apply to every source without its own) and check the mix."""
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
        data = resolve(item.source, config, manifest=item.manifest, storage_options=options)
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
