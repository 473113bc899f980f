"""The frozen configuration that every stage receives explicitly.

``StreamConfig`` holds what decides *which samples* arrive *in which order*: sources, fields,
layout (rank, world size, workers), batch size, seed, shuffle and epoch policy. Nothing in the
library reads environment variables; entry points (CLI, :class:`dalistream.Loader`) resolve
defaults and build the config.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from .errors import ConfigError, redact
from .io.cache import parse_size
from .kinds import IMAGE_EXTS, KINDS, Kind, is_image_ext, kind_for
from .plan.layout import Layout, Schedule, is_int as _is_int
from .plan.affinity import Nodes
from .plan.shapes import AspectBuckets, LengthBuckets, check_stream

__all__ = ["Field", "IMAGE_EXTS", "StreamConfig", "is_image_ext", "parse_field", "parse_fields", "reading_order"]
MISSING = ("error", "skip", "empty")
#: DALI workers per rank by default: the one default of every entry point (StreamConfig,
#: Stream.open, the CLI, the demo and the ready pipelines).
WORKERS = 2
ON_ERROR = ("raise", "skip")
AFFINITY = (None, "node")


@dataclass(frozen=True)
class Field:
    """One pipeline output made from one tar member of each sample.

    ``exts`` are alternatives tried in order (``("jpg", "jpeg", "png")``). ``kind`` says how the
    member's bytes become an array (the kinds of :data:`dalistream.kinds.KINDS`, one entry each):

    - ``"bytes"``: raw ``uint8`` 1-D (images for DALI's decoders, ``txt``/``json`` captions);
    - ``"int"``: an ASCII integer (``cls``) as a 0-d ``int64``;
    - ``"npy"``: ``numpy.load`` of the member, must have ``dtype`` and ``ndim``;
    - ``"custom"``: ``decoder(bytes) -> numpy array`` of ``dtype`` and ``ndim`` (must pickle with dill);
    - ``"meta"``: ``__key__``, ``__url__`` or ``__source__`` (a mix's source name; empty otherwise) as
      ``uint8`` bytes;
    - ``"video"`` (``mp4``, ``webm``, ``mkv``, ``mov``): the checked bytes, or with a
      :class:`dalistream.kinds.Clips` as ``decoder`` a clip (:mod:`dalistream.kinds.video`);
    - ``"audio"`` (``wav``, ``flac``, ``ogg``, ``mp3``): the checked bytes, with a
      :class:`dalistream.kinds.Crops` as ``decoder`` its crop's start first (:mod:`dalistream.kinds.audio`).
    """

    name: str
    exts: tuple
    kind: str = "bytes"
    dtype: str = "uint8"
    ndim: int = 1
    decoder: Optional[Callable[[bytes], Any]] = None

    def __post_init__(self) -> None:
        if not self.name or not self.exts:
            raise ConfigError(f"field {self.name!r}: needs a name and at least one extension")
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise ConfigError(f"field {self.name!r}: unknown kind {self.kind!r}", hint=f"one of {sorted(KINDS)}")
        KINDS[self.kind].check(self)
        if self.decoder is not None and not callable(self.decoder):
            raise ConfigError(f"field {self.name!r}: decoder must be a function bytes -> array, got {self.decoder!r}")
        if not all(isinstance(e, str) and e for e in self.exts):
            raise ConfigError(f"field {self.name!r}: extensions must be non-empty strings, got {self.exts!r}")
        try:
            np.dtype(self.dtype)
        except (TypeError, ValueError):
            raise ConfigError(f"field {self.name!r}: dtype {self.dtype!r} is not a NumPy dtype",
                              hint="e.g. 'uint8', 'int64', 'float32'") from None
        if not _is_int(self.ndim) or self.ndim < 0:
            raise ConfigError(f"field {self.name!r}: ndim must be an integer >= 0, got {self.ndim!r}")

    @property
    def spec(self) -> Kind:
        """The field's kind: what the data path does with it (:mod:`dalistream.kinds`)."""
        return KINDS[self.kind]

    @property
    def empty(self) -> np.ndarray:
        """The value used for padding and for the ``empty`` missing policy."""
        return np.zeros((0,) * self.ndim if self.ndim else (), dtype=self.dtype)


def parse_field(name: str, spec: Union[str, Sequence[str], Field, Mapping[str, Any]]) -> Field:
    """Turn a user's field spec (``"jpg;png"``, ``["cls"]``, a dict or a :class:`Field`) into a Field."""
    if isinstance(spec, Field):
        return spec if spec.name == name else dataclasses.replace(spec, name=name)
    if isinstance(spec, Mapping):
        kwargs = dict(spec)
        if "exts" not in kwargs:
            raise ConfigError(f"field {name!r}: a dict spec needs 'exts', e.g. {{'exts': 'npy', 'kind': 'npy', ...}}")
        unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(Field)})
        if unknown:
            raise ConfigError(f"field {name!r}: unknown keys {unknown}")
        exts = kwargs.pop("exts")
        exts = tuple(exts.split(";")) if isinstance(exts, str) else tuple(exts)
        if "decoder" in kwargs and "kind" not in kwargs:
            kwargs["kind"] = "custom"
        kind = KINDS.get(kwargs.get("kind", ""))
        if kind is not None and any(key not in kwargs for key in kind.requires):
            raise ConfigError(f"field {name!r}: {kind.name} fields need {' and '.join(map(repr, kind.requires))}")
        return Field(name=name, exts=exts, **kwargs)
    if not isinstance(spec, (str, Sequence)) or not all(isinstance(e, str) for e in spec):
        raise ConfigError(f"field {name!r}: expected extensions like 'jpg;png', a list of them, a dict or a Field, "
                          f"got {spec!r}")
    exts = tuple(e.strip() for e in (spec.split(";") if isinstance(spec, str) else spec) if e.strip())
    if not exts:
        raise ConfigError(f"field {name!r}: no extensions given")
    kind = kind_for(exts)
    if kind.requires:
        raise ConfigError(
            f"field {name!r}: {kind.name} fields need {' and '.join(kind.requires)}, e.g. "
            f"{{'exts': {';'.join(exts)!r}, 'kind': {kind.name!r}, 'dtype': 'float32', 'ndim': 2}}")
    return Field(name, exts, kind=kind.name, dtype=kind.dtype, ndim=kind.ndim)


def parse_fields(fields: Union[Mapping[str, Any], Sequence[Field]]) -> tuple:
    """Parse a mapping ``{output name: spec}`` (or a list of Fields) into a tuple of Fields."""
    if isinstance(fields, Mapping):
        parsed = tuple(parse_field(str(k), v) for k, v in fields.items())
    elif isinstance(fields, (list, tuple)) and all(isinstance(f, Field) for f in fields):
        parsed = tuple(parse_field(f.name, f) for f in fields)
    else:
        raise ConfigError(f"fields must map output names to member extensions, got {fields!r}",
                          hint="e.g. fields={'image': 'jpg;png', 'label': 'cls'}")
    if not parsed:
        raise ConfigError("no fields requested: give e.g. fields={'image': 'jpg;png', 'label': 'cls'}")
    names = [f.name for f in parsed]
    if len(set(names)) != len(names) or "valid" in names:
        raise ConfigError(f"field names must be unique and not 'valid': {names}")
    return parsed


SHUFFLE_BUFFER = 1000  # a training stream's buffer when it cannot read interleaved (no counts)


def reading_order(policy: str, interleave: Optional[bool], shuffle: Optional[int], counts_known: bool = True) -> tuple:
    """``(interleave, shuffle)`` resolved: the one default of both for ``StreamConfig``,
    ``Stream.open``, the CLI and the ready pipelines (see :class:`StreamConfig`); ``policy`` is
    one already checked (:class:`~dalistream.plan.layout.Schedule`)."""
    if shuffle is not None and (not _is_int(shuffle) or shuffle < 0):
        raise ConfigError(f"shuffle must be an integer >= 0 or None, got {shuffle!r}")
    train = policy != "exact"
    if interleave is None:
        interleave = train and counts_known and not (shuffle or 0) > 1
    elif not isinstance(interleave, (bool, np.bool_)):
        raise ConfigError(f"interleave must be True, False or None, got {interleave!r}")
    elif interleave and not counts_known:
        raise ConfigError("interleave=True needs per-shard sample counts: policy 'fixed' without a manifest owns "
                          "whole shards", hint="give a manifest (`dalistream index`), or use a shuffle buffer")
    if shuffle is None:
        shuffle = SHUFFLE_BUFFER if train and not interleave else 0
    elif interleave and shuffle > 1:
        raise ConfigError(f"shuffle={shuffle} and interleave=True: a worker reading its slot's columns at once "
                          "needs no buffer (each batch already draws from every column)",
                          hint="leave shuffle unset, or pass interleave=False to read one span per worker "
                               "through a buffer")
    return bool(interleave), shuffle


MAX_BATCH_SIZE = 1 << 20  # beyond this, per-batch buffers alone outgrow any worker's memory


def _secret(key: str) -> bool:
    return any(word in key.lower() for word in ("secret", "token", "password", "key_id", "credential", "account_key",
                                                  "connection_string", "sas"))


@dataclass(frozen=True, repr=False)
class StreamConfig:
    """Everything that decides which samples a rank sees, in which order.

    ``policy``: ``"even"`` (every rank the same number of full batches, leftovers dropped),
    ``"exact"`` (every sample once, last batches padded and trimmed on the torch side) or
    ``"fixed"`` (``batches_per_epoch`` batches, workers cycle over their own part of the data).
    Without a manifest, remote shards are counted by a scan only while their total size is at
    most ``scan_limit_bytes`` (``None``: always), so ranks do not each read the data set.
    How samples are ordered (:func:`reading_order`, one rule for every entry point): ``interleave``
    reads each batch position's own span (its *column*, see :mod:`dalistream.plan.ownership`),
    a worker reading the columns of its slot at once, so a rank's batch draws from ``B`` places
    spread over the epoch; ``shuffle`` is a per-worker sample shuffle buffer (0: off), for
    streams that read one span per worker. Left ``None``, a training stream (``even``,
    ``fixed``) reads interleaved when its counts are known (a manifest, or not ``fixed``), else
    through a buffer of :data:`SHUFFLE_BUFFER`; ``exact`` (evaluation) does neither. ``max_skip_fraction``:
    when more than this share of the samples a worker has read were skipped for one reason
    (``missing_field`` from a typo in an extension, ``bad_image``, …), it raises a
    :class:`~dalistream.errors.SampleError` naming the reason instead of training on what is
    left (judged after 100 samples, and at the end of the worker's epoch; 1 turns it off). ``storage_options``
    configure remote byte streams (S3 endpoint and profile, read-ahead, retries); they are
    never printed in full (see ``__repr__``).
    """

    sources: tuple
    """Shard paths, folders, globs, ``{a..b}`` brace patterns, ``file://``, ``s3://``, ``http(s)://`` URLs or
    ``pipe:CMD`` commands (one, or a sequence); ``Stream.open`` also takes a mix ``{name: (source, weight)}``."""
    fields: tuple
    """Output names mapped to member extensions: ``{"image": "jpg;png", "label": "cls"}`` (alternatives
    separated by ``;``), a dict spec (``{"exts": "npy", "kind": "npy", "dtype": "float32", "ndim": 2}``, or a
    ``decoder``) or a :class:`Field`; ``__key__``, ``__url__`` and ``__source__`` give the sample key, its shard
    URL and a mix's source name."""
    batch_size: int
    """Samples per batch on each rank."""
    workers: int = WORKERS
    """DALI worker processes per rank, each the one reader of its share of every batch."""
    rank: int = 0
    """This rank (``Stream.open``: from ``torch.distributed``, ``RANK`` or ``SLURM_PROCID`` when not given)."""
    world_size: int = 1
    """Number of ranks (``Stream.open``: from ``torch.distributed``, ``WORLD_SIZE`` or ``SLURM_NTASKS`` when not
    given)."""
    seed: int = 0
    """Seed of the shard order, the spans and the shuffle; with the epoch it decides every batch."""
    shuffle: Optional[int] = None
    """Per-worker sample shuffle buffer (0: off), for streams that read one span per worker; ``None``: 1000 for
    a training stream that cannot read interleaved, else none."""
    interleave: Optional[bool] = None
    """Read each batch position's own span (a worker reads its slot's spans at once), so a batch draws from
    ``batch_size`` places of the epoch; ``None``: on for ``even`` and ``fixed`` when per-shard counts are known,
    off for ``exact`` and for mixes."""
    shuffle_shards: bool = True
    """Permute the shards each epoch (by seed and epoch) before they are laid end to end."""
    policy: str = "even"
    """Batches per epoch: ``"even"`` (the same full batches on every rank, fewer than one batch per rank left
    out), ``"exact"`` (every sample once, padding removed) or ``"fixed"`` (``batches_per_epoch``)."""
    batches_per_epoch: Optional[int] = None
    """Batches per epoch under ``policy="fixed"``; a worker that runs out starts over on its own part."""
    missing: str = "error"
    """A sample without a requested member: ``"error"`` (a bad sample), ``"skip"`` (skipped, counted as
    ``missing_field``) or ``"empty"`` (the field's empty value)."""
    on_error: str = "raise"
    """A bad sample or shard: ``"raise"`` stops with its error, ``"skip"`` counts and skips it, a function
    ``f(error)`` runs in the worker and raises to stop or returns to skip (it must pickle with dill)."""
    lowercase_ext: bool = False
    """Lowercase member extensions before matching fields (webdataset always does)."""
    max_member_bytes: int = 256 << 20
    """A larger member is refused from its tar header, before it is read (``too_large``)."""
    manifest: Optional[str] = None
    """A manifest with per-shard counts: dalistream's (``dalistream index``), a wids shard index, or ``wds2idx``
    ``.idx`` files (a pattern); ``None``: ``dalistream-manifest.json`` or ``.idx`` files beside the shards, else
    a scan."""
    cache_dir: Optional[str] = None
    """Where scanned counts and parsed manifests are cached (``Stream.open``: ``$DALISTREAM_CACHE``, else
    ``~/.cache/dalistream``; ``None``: no cache)."""
    scan_limit_bytes: Optional[int] = 1 << 30
    """Remote shards without a manifest are scanned for counts only while their total size is below this
    (``None``: always); beyond it ``Stream.open`` names the ``dalistream index`` command to run."""
    prefetch: int = 2
    """Batches each DALI worker prepares ahead."""
    max_skip_fraction: float = 0.95
    """When more than this share of the samples a worker read were skipped for one reason, it stops with a
    ``SampleError`` (``too_many_skips``); judged after 100 samples and at the end of its epoch; 1 turns it off."""
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    """Options of remote stores: ``endpoint_url``, ``profile``, ``region``, ``anon``, keys, and reading options
    (``parts_in_flight``, ``part_bytes``, ``read_ahead_bytes``, timeouts, retries); secret values are never
    printed."""
    cache: Optional[str] = None
    """A folder on a local disk where remote bytes are kept for later epochs, shared by the node's processes
    (:mod:`dalistream.io.cache`); ``None``: no cache."""
    cache_limit: Optional[Union[int, str]] = None
    """The most the cache may hold: bytes, or a size like ``"800GB"`` or ``"512GiB"`` (parsed when the config is
    made); ``None``: what its disk has free, less a tenth of the disk."""
    affinity: Optional[str] = None
    """``"node"``: each node of the job reads a fixed share of the shards, the same every epoch, so that its
    ``cache`` holds about 1/N of the data (:mod:`dalistream.plan.affinity`; needs per-shard counts, not for a
    mix); ``None``: every rank reads from all shards."""
    ranks_per_node: Optional[int] = None
    """With ``affinity="node"``: ranks on each node, placed in blocks (rank ``r`` on node ``r // ranks_per_node``);
    ``Stream.open``: from ``LOCAL_WORLD_SIZE`` (torchrun) or ``SLURM_NTASKS_PER_NODE`` when not given, else every
    rank on one node."""
    buckets: Optional[Union[AspectBuckets, LengthBuckets]] = None
    """Batches by shape: :class:`~dalistream.AspectBuckets` (each batch one aspect ratio, carrying its target
    ``bucket_width``/``bucket_height``) or :class:`~dalistream.LengthBuckets` (each batch one length range,
    carrying ``bucket_length``), from per-sample keys in the manifest (``dalistream index --keys``); policy
    ``even`` or ``exact``, read in columns (no shuffle buffer). See :mod:`dalistream.buckets`."""

    def __post_init__(self) -> None:
        if isinstance(self.sources, (str, bytes)):
            object.__setattr__(self, "sources", (self.sources,))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        if not isinstance(self.fields, tuple) or not all(isinstance(f, Field) for f in self.fields):
            object.__setattr__(self, "fields", parse_fields(self.fields))
        if not self.sources:
            raise ConfigError("no sources given", hint="pass shard paths, globs, brace patterns or URLs")
        if self.cache_limit is not None:
            object.__setattr__(self, "cache_limit", parse_size(self.cache_limit, "cache_limit"))
        self._check()
        if self.buckets is not None:  # a bucket plan reads in columns, as interleaved reading does
            object.__setattr__(self, "interleave", True if self.interleave is None else self.interleave)
        interleave, shuffle = reading_order(self.policy, self.interleave, self.shuffle,
                                            counts_known=bool(self.manifest) or self.policy != "fixed")
        object.__setattr__(self, "interleave", interleave)
        object.__setattr__(self, "shuffle", shuffle)

    def _check(self) -> None:
        def bad(name: str, expected: str) -> ConfigError:
            return ConfigError(f"{name} must be {expected}, got {getattr(self, name)!r}")

        for name in ("prefetch", "max_member_bytes"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise bad(name, "a positive integer")
        for name in ("rank", "seed"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "an integer >= 0")
        Layout(self.world_size, self.workers, self.batch_size)  # checks batch size, workers, world size
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world size {self.world_size}")
        if self.scan_limit_bytes is not None and (not _is_int(self.scan_limit_bytes) or self.scan_limit_bytes < 0):
            raise bad("scan_limit_bytes", "an integer >= 0 or None")
        if self.batch_size > MAX_BATCH_SIZE:
            raise ConfigError(f"batch_size {self.batch_size} is larger than {MAX_BATCH_SIZE}: a worker would run out "
                              "of memory building its batches", hint="use a batch size that fits a training step")
        if self.batches_per_epoch is not None and (not _is_int(self.batches_per_epoch) or self.batches_per_epoch < 1):
            raise bad("batches_per_epoch", "a positive integer or None")
        Schedule(self.seed, self.policy, self.batches_per_epoch, self.shuffle_shards)  # checks the policy
        if self.missing not in MISSING:
            raise ConfigError(f"missing must be one of {MISSING}, got {self.missing!r}")
        if not callable(self.on_error) and self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR} or a callable, got {self.on_error!r}")
        for name in ("shuffle_shards", "lowercase_ext"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise bad(name, "True or False")
        fraction = self.max_skip_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise bad("max_skip_fraction", "a number in (0, 1] (1 turns the check off)")
        for name in ("manifest", "cache_dir", "cache"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), (str, os.PathLike)):
                raise bad(name, "a path or None")
        if not isinstance(self.storage_options, Mapping):
            raise bad("storage_options", "a dict")
        self._check_affinity()
        if self.buckets is not None:
            check_stream(self)

    def _check_affinity(self) -> None:
        if self.affinity not in AFFINITY:
            raise ConfigError(f"affinity must be one of {AFFINITY}, got {self.affinity!r}")
        per = self.ranks_per_node
        if per is None:
            return
        if self.affinity is None:
            raise ConfigError(f"ranks_per_node={per!r} is given without affinity='node'",
                              hint="pass affinity='node' to keep each node on its own shards, or leave ranks_per_node "
                                   "unset")
        if not _is_int(per) or per < 1:
            raise ConfigError(f"ranks_per_node must be a positive integer or None, got {per!r}")
        if self.world_size % per:
            raise ConfigError(f"{self.world_size} ranks are not whole nodes of {per} ranks (ranks_per_node): "
                              "affinity='node' needs the same number of ranks on every node",
                              hint="start the same number of ranks on every node")

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["sources"] = tuple(redact(s) for s in self.sources)  # https://user:password@… → https://***@…
        if self.manifest:
            shown["manifest"] = redact(self.manifest)
        shown["storage_options"] = {k: ("***" if _secret(k) else redact(v) if isinstance(v, str) else v)
                                    for k, v in self.storage_options.items()}
        return "StreamConfig(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    @property
    def layout(self) -> Layout:
        """Ranks, workers and batch size, as the plan takes them."""
        return Layout(self.world_size, self.workers, self.batch_size)

    @property
    def plan_layout(self) -> Layout:
        """The layout the plan splits each epoch over: the columns when reading interleaved."""
        return self.layout.planned(bool(self.interleave))

    @property
    def schedule(self) -> Schedule:
        """Seed and epoch policy, as the plan takes them."""
        return Schedule(self.seed, self.policy, self.batches_per_epoch, self.shuffle_shards)

    @property
    def nodes(self) -> Optional[Nodes]:
        """The job's nodes with ``affinity="node"`` (every rank on one node when ``ranks_per_node`` is
        unset); ``None`` without affinity."""
        if self.affinity is None:
            return None
        per = self.ranks_per_node or self.world_size
        return Nodes(self.world_size // per, per)

    @property
    def bucket_outputs(self) -> tuple:
        """The outputs that carry each batch's bucket (none without buckets: ``buckets.outputs``)."""
        return self.buckets.outputs if self.buckets is not None else ()

    def replace(self, **changes: Any) -> "StreamConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
