"""A resolved stream: the config plus its shard list, counts, device and starting point.

This is the entry point where defaults come from the outside world: rank and world size from
``torch.distributed`` (when initialized) or ``RANK``/``WORLD_SIZE``, the GPU from ``LOCAL_RANK``,
the manifest cache directory from ``DALISTREAM_CACHE``. Everything below receives them explicitly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from .buckets import missing_keys
from .config import SHUFFLE_BUFFER, StreamConfig, WORKERS
from .dataset import DataSet
from .errors import ConfigError, redact, redact_client_logs
from .io.folder import folder_problem
from .io.options import with_cache
from .io.stores import any_remote
from .dali.device import check_start_method, resolve_device
from .manifest import SampleOffsets, count_samples
from .manifest.files import manifest_reader, manifest_urls
from .mixing import Mix, concatenated, open_mix
from .plan import Layout, check_layout, steps_per_epoch
from .plan.buckets import check_bucket_mix
from .plan.epochplan import affine_plan, check_buckets, epoch_plan, plan_head, planned_layout
from .plan.affinity import ranks_per_node, resolve_nodes
from .sources import expand_sources

log = logging.getLogger(__name__)


def resolve_layout(rank: Optional[int], world_size: Optional[int], env: Mapping[str, str]) -> Tuple[int, int]:
    """(rank, world size): explicit values, else torch.distributed, else RANK/WORLD_SIZE, else
    SLURM_PROCID/SLURM_NTASKS (a job started by ``srun``), else (0, 1)."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if rank is not None and world_size is not None:
        return rank, world_size
    dist_rank = dist_world = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist_rank, dist_world = dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    if dist_world is None and "WORLD_SIZE" in env:
        try:
            dist_rank, dist_world = int(env.get("RANK", "0")), int(env["WORLD_SIZE"])
        except ValueError:
            raise ConfigError(f"RANK/WORLD_SIZE are not integers: {env.get('RANK')!r}/{env.get('WORLD_SIZE')!r}") from None
    if dist_world is None and "SLURM_NTASKS" in env:
        try:
            dist_rank, dist_world = int(env.get("SLURM_PROCID", "0")), int(env["SLURM_NTASKS"])
        except ValueError:
            raise ConfigError(f"SLURM_PROCID/SLURM_NTASKS are not integers: {env.get('SLURM_PROCID')!r}/"
                              f"{env.get('SLURM_NTASKS')!r}") from None
    return (int(rank) if rank is not None else (dist_rank or 0),
            int(world_size) if world_size is not None else (dist_world or 1))


def local_device(env: Mapping[str, str]) -> Optional[int]:
    """This process's rank on its node: ``LOCAL_RANK`` (torchrun), else ``SLURM_LOCALID`` (srun); which
    GPU that means depends on how many it sees (:func:`dalistream.dali.device.local_gpu`)."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        if name in env:
            try:
                return int(env[name])
            except ValueError:
                raise ConfigError(f"{name} is not an integer: {env[name]!r}") from None
    return None


def local_processes(env: Mapping[str, str]) -> int:
    """Training processes on this node: ``LOCAL_WORLD_SIZE`` (torchrun), else
    ``SLURM_NTASKS_PER_NODE`` (srun; its first number), else 1."""
    return ranks_per_node(env) or 1


def node_ranks(rank: int, world_size: int, env: Mapping[str, str], affinity: Any, given: Any) -> Any:
    """``ranks_per_node`` for the config, at the entry point: with ``affinity="node"``, ``given``
    (checked against the launcher's node of this rank) or the launcher's (``LOCAL_WORLD_SIZE``,
    ``SLURM_NTASKS_PER_NODE``; :func:`~dalistream.plan.affinity.resolve_nodes`); ``None`` when the
    launcher names none (every rank on one node, said once). Otherwise ``given`` as it is (the
    config refuses what does not fit, by name)."""
    if affinity != "node" or (given is not None and not (isinstance(given, int) and not isinstance(given, bool)
                                                         and given >= 1 and world_size % given == 0)):
        return given
    if given is not None:
        return resolve_nodes(rank, world_size, env, world_size // given).ranks_per_node
    if ranks_per_node(env) is None:
        if world_size > 1:
            log.warning("affinity='node': the launcher names no ranks per node (LOCAL_WORLD_SIZE, "
                        "SLURM_NTASKS_PER_NODE): the %d ranks are taken as one node (pass ranks_per_node=)", world_size)
        return None
    return resolve_nodes(rank, world_size, env).ranks_per_node


def default_cache_dir(env: Mapping[str, str]) -> str:
    """Where scanned shard counts are cached: ``$DALISTREAM_CACHE``, else ``$XDG_CACHE_HOME/dalistream``,
    else ``~/.cache/dalistream``."""
    return env.get("DALISTREAM_CACHE") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dalistream")


def usable_cache_dir(path: str, *, given: bool) -> Optional[str]:
    """``path`` if the scan cache can be kept there: created private (0700) if missing, writable,
    owned by this user and not writable by others (whose planted entries would be believed).
    Otherwise a :class:`ConfigError` naming ``cache_dir`` when the user ``given`` it, else a
    warning and ``None`` (shards are then scanned without caching)."""
    problem = folder_problem(path)
    if problem is None:
        return path
    if given:
        raise ConfigError(f"cache_dir {path!r} cannot hold the scan cache: {problem}",
                          hint="pass a writable directory (cache_dir= or DALISTREAM_CACHE), or cache_dir=None")
    log.warning("default cache directory %r is unusable (%s): shard counts are not cached", path, problem)
    return None


def check_data_size(config: StreamConfig, counts: Sequence[int]) -> None:
    """Raise :class:`ConfigError` (naming ``batch_size``, and what would work) when a batch is
    larger than the data: ``even`` would yield no batch at all, ``exact`` batches of mostly padding."""
    total, ranks, workers = sum(counts), config.world_size, config.workers
    if config.affinity is not None:
        check_node_data(config, counts)
    def samples(n: int) -> str:
        return f"{n} sample" + ("s" if n != 1 else "")

    def fits(most: int) -> str:  # a batch size of at most `most` samples (every worker needs one)
        return f"a batch_size of at most {most}" if most >= workers else f"workers={most} and a batch_size of at most {most}"

    if config.policy == "even" and steps_per_epoch(counts, config.layout, config.schedule, 0, config.rank) == 0:
        per_rank = total // ranks
        raise ConfigError(f"batch_size {config.batch_size} gives no full batch: {samples(total)} over "
                          f"{ranks} ranks x {workers} workers", url=redact(config.sources[0]),
                          hint=(f"use {fits(per_rank)}, or policy='exact'" if per_rank else
                                "use policy='exact'" + (f" with {fits(total)}" if config.batch_size > total else "")
                                + " (fewer samples than ranks: under 'even' no rank gets a full batch)")
                          if total else "the data set holds no samples")
    if config.policy == "exact" and config.batch_size > total:
        raise ConfigError(f"batch_size {config.batch_size} is larger than the whole data set ({samples(total)})",
                          url=redact(config.sources[0]),
                          hint=f"use {fits(total)}" if total else "the data set holds no samples")


def check_node_data(config: StreamConfig, counts: Sequence[int]) -> None:
    """Raise :class:`ConfigError` when the node-affine plan cannot run: fewer shards than nodes,
    or (``even``) a node whose shards fill no batch of each of its ranks."""
    nodes = config.nodes
    plan = affine_plan(config, counts, 0)  # (fewer shards than nodes: refused here, by name)
    if config.policy == "even" and plan.steps == 0:
        smallest = int(plan.sequence.node_totals.min())
        raise ConfigError(f"batch_size {config.batch_size} gives no full batch with affinity='node': the smallest of "
                          f"{nodes.count} nodes holds {smallest} samples for its {nodes.ranks_per_node} ranks",
                          url=redact(config.sources[0]),
                          hint="use a smaller batch_size, policy='exact', or fewer nodes' worth of shards per node")


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
                          named=lambda folder: manifest_urls(folder, read, manifest))
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


def resolve(config: StreamConfig, mapping: Optional[Mapping[str, Any]] = None, *, per_batch: str = "sample",
            samples_per_epoch: Optional[int] = None,
            interleave_asked: bool = False) -> Tuple[StreamConfig, DataSet, Optional[Mix], str]:
    """Every data set, mix or not, resolved in one way: each source listed and counted
    (:func:`resolve_source`; a single data set is a mix of one source, without
    a name), the data checked against the layout, and the reading order decided once the data is
    known (:func:`reading_order_for`): ``(config, data set, mix or None, why)``;
    with buckets, every sample's bucket is known by then (:func:`bucketed`)."""
    config = config.replace(storage_options=with_cache(config.storage_options, config.cache, config.cache_limit))
    if config.cache_dir is not None and not config.manifest and config.policy != "fixed":
        usable_cache_dir(os.fspath(config.cache_dir), given=True)
    if config.affinity is not None and mapping is not None:
        raise ConfigError("affinity='node' is not supported for a mix: each source of a mix is planned on its own",
                          hint="read the mix without affinity (affinity=None)")
    if mapping is not None:
        mix = open_mix(mapping, config, resolve_source, per_batch, samples_per_epoch, interleave_asked)
        urls, counts = concatenated(mix.sources)
        known = [s.data for s in mix.sources if s.data.sizes is not None]
        per_sample = (sum(sum(d.sizes) for d in known) / max(1, sum(sum(d.counts) for d in known))) if known else None
        config, why = reading_order_for(config, [s.data for s in mix.sources])
        data = DataSet(urls, counts, count_source="mix", bytes_per_sample=per_sample)
        if config.buckets is not None:
            config, data, mix = bucketed(config, data, mix)
        return config, data, mix, why
    data = resolve_source(config.sources, config, manifest=config.manifest)
    if config.affinity is not None and data.counts is None:
        raise ConfigError("affinity='node' needs per-shard sample counts: policy 'fixed' without a manifest owns "
                          "whole shards", url=redact(config.sources[0]),
                          hint="give a manifest (`dalistream index SOURCES`), or read without affinity")
    if config.buckets is not None:
        config, data, _ = bucketed(config, data, None)
    elif data.counts is not None:
        check_data_size(config, data.counts)
    else:
        check_layout(len(data.urls), config.layout)  # whole shards: one per global worker at least
    config, why = reading_order_for(config, [data])
    return config, data, None, why


def sources_digest(urls: Sequence[str]) -> str:
    """A short digest of the shard list (saved with the loader state, compared on load)."""
    return hashlib.sha256("\n".join(urls).encode()).hexdigest()[:16]


def relative_names(urls: Sequence[str]) -> Tuple[str, ...]:
    """Shard names relative to their listing root (the longest common folder of ``urls``), so
    that the same shards in another folder, or in a bucket, have the same names; without query
    strings (a presigned URL's signature changes from run to run, the shard does not)."""
    urls = [u.split("?", 1)[0] if "://" in u else u for u in urls]
    root = os.path.commonprefix([u.rsplit("/", 1)[0] + "/" if "/" in u else "" for u in urls]) if urls else ""
    root = root[:root.rfind("/") + 1]
    return tuple(u[len(root):] for u in urls)


def sources_identity(urls: Sequence[str], counts: Optional[Sequence[int]], sizes: Optional[Sequence[int]]) -> dict:
    """What the shards are, for a loader state: their number, their names relative to the listing
    root, per-shard sample counts and stored sizes (digests; ``None`` where unknown)."""
    def digest(values: Optional[Sequence]) -> Optional[str]:
        return None if values is None else hashlib.sha256("\n".join(map(str, values)).encode()).hexdigest()[:16]

    return {"shards": len(urls), "names": digest(relative_names(urls)), "counts": digest(counts),
            "samples": None if counts is None else int(sum(counts)), "sizes": digest(sizes)}


@dataclass(frozen=True)
class Stream:
    """What a pipeline reads: config, the resolved data set (shard URLs, per-shard counts, offsets),
    device, start (epoch, step).

    Build it with :meth:`Stream.open`; pipelines receive it as their first argument.
    """

    config: StreamConfig
    data: DataSet  # the shards, counts, offsets (a mix: all sources' shards and counts end to end)
    device: str = "cpu"
    device_id: Optional[int] = None
    start_epoch: int = 0
    start_step: int = 0
    stats_dir: Optional[str] = None
    start_method: str = "auto"  # how DALI starts its workers: auto, fork or spawn (see device.start_method)
    local_processes: int = 1  # training processes on this node (LOCAL_WORLD_SIZE), sharing its cores
    resume: Tuple[Tuple[int, int, int, int], ...] = ()  # start_epoch's segments under other layouts (plan.resume)
    mix: Optional[Mix] = None  # several named data sets by weight (dalistream.mixing)
    given: Optional[Tuple[Optional[int], Optional[int]]] = None  # (rank, world_size) as given to open; None: the config's
    reading: str = ""  # how the workers read (interleaved, or spans through a buffer) and why

    @property
    def urls(self) -> Tuple[str, ...]:
        """The shard URLs (``data.urls``)."""
        return self.data.urls

    @property
    def counts(self) -> Optional[Tuple[int, ...]]:
        """Samples per shard (``data.counts``; ``None`` when not counted)."""
        return self.data.counts

    def __repr__(self) -> str:  # URLs redacted: no credentials in logs
        return (f"Stream(config={self.config!r}, urls={self.data.shown()}, "
                f"samples={sum(self.data.counts) if self.data.counts is not None else None}, device={self.device!r}, "
                f"device_id={self.device_id!r}, start_method={self.start_method!r}, start_epoch={self.start_epoch}, start_step={self.start_step})")

    @classmethod
    def open(
        cls, sources: Any, *, fields: Any, batch_size: int, workers: int = WORKERS, rank: Optional[int] = None,
        world_size: Optional[int] = None, device: str = "auto", device_id: Optional[int] = None,
        start_method: str = "auto", env: Optional[Mapping[str, str]] = None, **options: Any,
    ) -> "Stream":
        """Resolve layout and device, list the shards and count their samples.

        ``options`` are :class:`~dalistream.config.StreamConfig` fields (``seed``, ``shuffle``,
        ``policy``, ``batches_per_epoch``, ``missing``, ``on_error``, ``manifest``, …), and for a mix
        ``per_batch`` and ``samples_per_epoch``. The arguments of its own:

        Args:
            sources: shard paths, folders, globs, brace patterns, URLs, ``pipe:`` commands; or a mix,
                ``{name: (source, weight)}`` or ``{name: {"source": …, "weight": …, "manifest": …,
                "storage_options": …}}`` (:mod:`dalistream.mixing`).
            device: ``"auto"`` (the GPU when DALI sees one, else the CPU), ``"gpu"`` or ``"cpu"``: where
                images are decoded and augmented.
            device_id: the GPU to use; ``None``: the one this process sees, or its ``LOCAL_RANK``'s
                (``SLURM_LOCALID``'s) when it sees several.
            start_method: how DALI starts its worker processes: ``"auto"`` forks CPU pipelines while
                CUDA is untouched and spawns otherwise; ``"fork"``, ``"spawn"``.
            env: the environment to read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``SLURM_*``,
                ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` (the nodes, for ``affinity="node"``) and
                ``DALISTREAM_CACHE`` from; ``None``: ``os.environ``.
            per_batch: a mix's composition: ``"sample"`` (every batch holds each source's share) or
                ``"source"`` (each batch comes whole from one source, in the weighted proportion).
            samples_per_epoch: a mix's epoch; ``None``: the longest in which no source repeats a sample.
        """
        env = os.environ if env is None else env
        redact_client_logs()  # the S3/HTTP libraries' own DEBUG lines carry signed URLs and key ids
        given = (rank, world_size)
        rank, world_size = resolve_layout(rank, world_size, env)
        local_rank = local_device(env) if device_id is None else None
        if "cache_dir" not in options:
            options["cache_dir"] = usable_cache_dir(default_cache_dir(env), given="DALISTREAM_CACHE" in env)
        mixed = isinstance(sources, Mapping)
        mix_options: dict = {}
        if mixed:  # a mix: {name: (source, weight)} or {name: {"source", "weight", "manifest", "storage_options"}}
            mix_options = {"per_batch": options.pop("per_batch", "sample"),
                           "samples_per_epoch": options.pop("samples_per_epoch", None),
                           "interleave_asked": options.get("interleave") is True}
            mapping, sources = sources, [str(name) for name in sources] or ["(empty mix)"]
        elif isinstance(sources, (str, os.PathLike)):
            sources = [os.fspath(sources)]
        options["ranks_per_node"] = node_ranks(rank, world_size, env, options.get("affinity"),
                                               options.get("ranks_per_node"))
        config = StreamConfig(sources=tuple(os.fspath(s) for s in sources), fields=fields, batch_size=batch_size,
                              workers=workers, rank=rank, world_size=world_size, **options)
        device, device_id = resolve_device(device, device_id, local_rank)
        check_start_method(start_method)
        config, data, mix, reading = resolve(config, mapping if mixed else None, **mix_options)
        return cls(config, data, device, device_id, start_method=start_method, local_processes=local_processes(env),
                   mix=mix, reading=reading, given=given)

    def steps(self, epoch: int, resume: Sequence = ()) -> int:
        """Batches this rank yields in ``epoch`` (its rest after the segments ``resume``):
        :func:`~dalistream.plan.epochplan.epoch_plan`'s ``steps``."""
        return epoch_plan(self.config, self.data, self.mix, epoch, resume).steps

    def planned(self, layout: Layout) -> Layout:
        """The layout the plan splits an epoch over: a single data set read interleaved splits it
        over ``layout``'s columns (:attr:`~dalistream.plan.Layout.column_layout`); a mix plans its
        columns within its own plan, over ``layout`` itself; so does a bucket plan
        (:func:`~dalistream.plan.epochplan.planned_layout`)."""
        return planned_layout(self.config, self.mix is not None, layout)

    def at(self, epoch: int, step: int = 0, stats_dir: Optional[str] = None, resume: Sequence = ()) -> "Stream":
        """The same stream starting at (``epoch``, ``step``), after the segments ``resume`` of
        ``epoch`` ran under other layouts."""
        return dataclasses.replace(self, start_epoch=epoch, start_step=step, resume=tuple(map(tuple, resume)),
                                   stats_dir=stats_dir if stats_dir is not None else self.stats_dir)

    def segment_head(self, layout: Layout, nodes: Optional[int]) -> Tuple[int, ...]:
        """What a loader state's segment says of a layout, all but its steps (:mod:`dalistream.plan.affinity`):
        run with node affinity over ``nodes`` nodes, ``(world_size, workers, batch_size, nodes,
        columns)``; without (``nodes`` None), the layout the plan splits (:meth:`planned`)."""
        return plan_head(self.config, self.mix, layout, nodes)

    @property
    def may_pad(self) -> bool:
        """True when batches can hold padding (``exact``, or samples that may be skipped)."""
        c = self.config
        return c.policy == "exact" or c.on_error != "raise" or c.missing == "skip"

    @property
    def digest(self) -> str:
        return sources_digest(self.data.urls)

    @property
    def identity(self) -> dict:
        """:func:`sources_identity` of this stream's shards (of each source's, for a mix)."""
        if self.mix is not None:
            return self.mix.identity(sources_identity)
        return sources_identity(self.data.urls, self.data.counts, self.data.sizes)
