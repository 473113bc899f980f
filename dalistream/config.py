"""The frozen configuration that every stage receives explicitly.

``StreamConfig`` holds what decides *which samples* arrive *in which order*: sources, fields,
layout (rank, world size, workers), batch size, seed, shuffle and epoch policy. Nothing in the
library reads environment variables; entry points (CLI, :class:`dalistream.Loader`) resolve
defaults and build the config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from .errors import ConfigError, redact
from .plan.layout import POLICIES, Layout, Schedule

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "bmp", "tif", "tiff", "webp", "gif", "ppm", "pgm", "pbm", "pnm", "jp2"})
INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id"})
TEXT_EXTS = frozenset({"txt", "text", "json", "jsn", "caption"})
META_EXTS = frozenset({"__key__", "__url__"})
MISSING = ("error", "skip", "empty")
ON_ERROR = ("raise", "skip")


@dataclass(frozen=True)
class Field:
    """One pipeline output made from one tar member of each sample.

    ``exts`` are alternatives tried in order (``("jpg", "jpeg", "png")``). ``kind`` says how the
    member's bytes become an array:

    - ``"bytes"``: raw ``uint8`` 1-D (images for DALI's decoders, ``txt``/``json`` captions);
    - ``"int"``: an ASCII integer (``cls``) as a 0-d ``int64``;
    - ``"npy"``: ``numpy.load`` of the member, must have ``dtype`` and ``ndim``;
    - ``"custom"``: ``decoder(bytes) -> numpy array`` of ``dtype`` and ``ndim`` (must pickle with dill);
    - ``"meta"``: ``__key__`` or ``__url__`` as ``uint8`` bytes.
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
        if self.kind not in ("bytes", "int", "npy", "custom", "meta"):
            raise ConfigError(f"field {self.name!r}: unknown kind {self.kind!r}")
        if self.kind == "custom" and self.decoder is None:
            raise ConfigError(f"field {self.name!r}: kind 'custom' needs a decoder")
        np.dtype(self.dtype)  # raises TypeError on nonsense

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
        exts = kwargs.pop("exts")
        exts = tuple(exts.split(";")) if isinstance(exts, str) else tuple(exts)
        if "decoder" in kwargs and "kind" not in kwargs:
            kwargs["kind"] = "custom"
        if kwargs.get("kind") == "npy" and ("dtype" not in kwargs or "ndim" not in kwargs):
            raise ConfigError(f"field {name!r}: npy fields need 'dtype' and 'ndim'")
        return Field(name=name, exts=exts, **kwargs)
    exts = tuple(e.strip() for e in (spec.split(";") if isinstance(spec, str) else spec) if e.strip())
    if not exts:
        raise ConfigError(f"field {name!r}: no extensions given")
    lowered = {e.lower() for e in exts}
    if lowered <= META_EXTS:
        return Field(name, exts, kind="meta")
    if lowered <= INT_EXTS:
        return Field(name, exts, kind="int", dtype="int64", ndim=0)
    if "npy" in lowered:
        raise ConfigError(
            f"field {name!r}: npy fields need dtype and ndim, e.g. {{'exts': 'npy', 'kind': 'npy', 'dtype': 'float32', 'ndim': 2}}"
        )
    return Field(name, exts, kind="bytes")


def parse_fields(fields: Union[Mapping[str, Any], Sequence[Field]]) -> tuple:
    """Parse a mapping ``{output name: spec}`` (or a list of Fields) into a tuple of Fields."""
    if isinstance(fields, Mapping):
        parsed = tuple(parse_field(str(k), v) for k, v in fields.items())
    else:
        parsed = tuple(parse_field(f.name, f) for f in fields)
    if not parsed:
        raise ConfigError("no fields requested: give e.g. fields={'image': 'jpg;png', 'label': 'cls'}")
    names = [f.name for f in parsed]
    if len(set(names)) != len(names) or "valid" in names:
        raise ConfigError(f"field names must be unique and not 'valid': {names}")
    return parsed


def _secret(key: str) -> bool:
    return any(word in key.lower() for word in ("secret", "token", "password", "key_id", "credential"))


@dataclass(frozen=True, repr=False)
class StreamConfig:
    """Everything that decides which samples a rank sees, in which order.

    ``policy``: ``"even"`` (every rank the same number of full batches, leftovers dropped),
    ``"exact"`` (every sample once, last batches padded and trimmed on the torch side) or
    ``"fixed"`` (``batches_per_epoch`` batches, workers cycle over their own part of the data).
    Without a manifest, remote shards are counted by a scan only while their total size is at
    most ``scan_limit_bytes`` (``None``: always), so ranks do not each read the data set.
    ``shuffle`` is the per-worker sample shuffle buffer size (0: off). ``storage_options``
    configure remote byte streams (S3 endpoint and profile, read-ahead, retries); they are
    never printed in full (see ``__repr__``).
    """

    sources: tuple
    fields: tuple
    batch_size: int
    workers: int = 1
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    shuffle: int = 0
    shuffle_shards: bool = True
    policy: str = "even"
    batches_per_epoch: Optional[int] = None
    missing: str = "error"
    on_error: str = "raise"
    lowercase_ext: bool = False
    max_member_bytes: int = 256 << 20
    manifest: Optional[str] = None
    cache_dir: Optional[str] = None
    scan_limit_bytes: Optional[int] = 1 << 30
    prefetch: int = 2
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.sources, (str, bytes)):
            object.__setattr__(self, "sources", (self.sources,))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        if not isinstance(self.fields, tuple) or not all(isinstance(f, Field) for f in self.fields):
            object.__setattr__(self, "fields", parse_fields(self.fields))
        if not self.sources:
            raise ConfigError("no sources given", hint="pass shard paths, globs, brace patterns or URLs")
        for name in ("batch_size", "workers", "world_size", "prefetch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world size {self.world_size}")
        if self.batch_size < self.workers:
            raise ConfigError(
                f"batch_size {self.batch_size} is smaller than workers {self.workers}: every worker needs a slot of at least one sample"
            )
        if self.scan_limit_bytes is not None and (isinstance(self.scan_limit_bytes, bool)
                                                  or not isinstance(self.scan_limit_bytes, int) or self.scan_limit_bytes < 0):
            raise ConfigError(f"scan_limit_bytes must be a non-negative integer or None, got {self.scan_limit_bytes!r}")
        if self.shuffle < 0:
            raise ConfigError(f"shuffle buffer must be >= 0, got {self.shuffle}")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.policy == "fixed" and not (isinstance(self.batches_per_epoch, int) and self.batches_per_epoch > 0):
            raise ConfigError("policy 'fixed' needs batches_per_epoch > 0")
        if self.missing not in MISSING:
            raise ConfigError(f"missing must be one of {MISSING}, got {self.missing!r}")
        if self.on_error not in ON_ERROR and not callable(self.on_error):
            raise ConfigError(f"on_error must be one of {ON_ERROR} or a callable, got {self.on_error!r}")

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
    def schedule(self) -> Schedule:
        """Seed and epoch policy, as the plan takes them."""
        return Schedule(self.seed, self.policy, self.batches_per_epoch, self.shuffle_shards)

    def replace(self, **changes: Any) -> "StreamConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
