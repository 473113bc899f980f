"""``storage_options``: what they are, their defaults, and validation.

Two kinds of keys. The reading options (read-ahead, parts, retries, timeouts, stall and give-up
bounds) and ``endpoint_url``/``anon`` mean the same for every store. A store's own keys (S3's
``profile``, ``region`` and explicit keys; Azure's ``account_key`` or ``connection_string``; a
GCS or Hub ``token``) are declared by the store in :data:`STORE_OPTIONS` and reach only it.
Every store otherwise uses its own client's credential chain (see ``docs/guide/stores.md``).
Secret values never appear in ``repr()``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import ConfigError
from .cache import ByteCache

#: Keys each store understands beyond the common ones (by registry scheme family).
STORE_OPTIONS: Dict[str, Tuple[str, ...]] = {
    "s3": ("profile", "region", "aws_access_key_id", "aws_secret_access_key", "aws_session_token"),
    "gs": ("project", "token"),
    "az": ("account_name", "account_key", "connection_string", "sas_token"),
    "hf": ("token",),
}
SECRET_OPTIONS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "token", "account_key",
                  "connection_string", "sas_token")


@dataclass(frozen=True, repr=False)
class RemoteOptions:
    """The ``storage_options`` understood here, with their defaults; ``store`` holds the
    store-specific keys as sorted ``(name, value)`` pairs (:meth:`get` reads one); ``cache`` the
    node-local byte cache (:func:`with_cache`)."""

    endpoint_url: Optional[str] = None
    anon: bool = False
    store: Tuple[Tuple[str, Any], ...] = ()
    read_ahead_bytes: int = 64 << 20
    chunk_bytes: int = 1 << 20
    # requests a worker keeps in flight: None, SPAN_IN_FLIGHT for a span, one per interleaved column
    # up to MAX_IN_FLIGHT; a number given bounds both
    parts_in_flight: Optional[int] = None
    part_bytes: int = 8 << 20
    max_attempts: int = 8
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    stall_warning_s: float = 5.0  # a request unanswered this long is reported in the log
    give_up_s: float = 300.0  # no retry starts once a request has gone unanswered this long in all
    version_check_s: float = 10.0  # with a byte cache: how long an object's stated version is trusted by a process
    # the node-local byte cache (a :class:`~.cache.ByteCache`) every ranged read of a shard goes
    # through; set by ``Stream.open`` from ``cache=``/``cache_limit=``; not part of a store's identity
    cache: Any = field(default=None, compare=False)

    def get(self, name: str, default: Any = None) -> Any:
        """A store-specific option (``profile``, ``account_key``, …), ``default`` if not given."""
        return dict(self.store).get(name, default)

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "store"]
        shown += [f"{k}={'***' if k in SECRET_OPTIONS else v!r}" for k, v in self.store]
        return "RemoteOptions(" + ", ".join(shown) + ")"

    @property
    def in_flight(self) -> int:
        """Requests in flight for one span: ``parts_in_flight``, :data:`SPAN_IN_FLIGHT` if not given."""
        return self.parts_in_flight if self.parts_in_flight is not None else SPAN_IN_FLIGHT

    @property
    def connections(self) -> int:
        """A client's connection pool: one for each request a worker may keep in flight."""
        return max(MAX_IN_FLIGHT, self.in_flight)

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): full jitter."""
        return rng.uniform(0, min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 1))))


def remote_options(options: Optional[Mapping[str, Any]]) -> RemoteOptions:
    """Validate ``storage_options`` (unknown keys are a :class:`ConfigError`)."""
    if isinstance(options, RemoteOptions):
        return options
    options = dict(options or {})
    common = {f.name for f in fields(RemoteOptions)} - {"store"}
    specific = {name for names in STORE_OPTIONS.values() for name in names}
    unknown = sorted(set(options) - common - specific)
    if unknown:
        raise ConfigError(f"unknown storage_options {unknown}; known: {sorted(common | specific)}")
    store = tuple(sorted((k, options.pop(k)) for k in list(options) if k in specific))
    opts = RemoteOptions(store=store, **options)
    if opts.cache is not None and not isinstance(opts.cache, ByteCache):
        raise ConfigError(f"storage_options: cache must be a ByteCache (set cache= and cache_limit= instead), "
                          f"got {type(opts.cache).__name__}")
    if opts.stall_warning_s <= 0 or opts.give_up_s <= 0 or opts.read_timeout_s <= 0 or opts.connect_timeout_s <= 0:
        raise ConfigError("storage_options: stall_warning_s, give_up_s and the timeouts must be > 0")
    if not opts.version_check_s >= 0:
        raise ConfigError("storage_options: version_check_s must be >= 0")
    if (opts.max_attempts < 1 or opts.chunk_bytes < 1 or opts.read_ahead_bytes < 0
            or (opts.parts_in_flight is not None and opts.parts_in_flight < 1)
            or opts.part_bytes < 1024):
        raise ConfigError("storage_options: max_attempts, chunk_bytes and parts_in_flight must be >= 1, part_bytes "
                          ">= 1024, read_ahead_bytes >= 0")
    return opts


MIN_SHARED_CHUNK = 64 << 10  # a read of a local file, or of a parser's buffer, still a large one
SPAN_IN_FLIGHT = 8  # the requests a worker reading one span keeps in flight, unless told
MAX_IN_FLIGHT = 32  # the most requests a worker keeps in flight for its columns (and a client's connections)


def shared_budget(options: Optional[Mapping[str, Any]], share: int) -> Dict[str, Any]:
    """``options`` for one of ``share`` byte streams a worker reads at once (interleaved columns,
    fetched by one :class:`~.parts.PartFetcher`): the read-ahead divided among them, so the
    worker's remote memory stays within its ``read_ahead_bytes``, and parts of at most half a
    stream's share, so each stream's next part is fetched while it reads the one before; the
    requests in flight are the worker's, shared by its streams (``parts_in_flight`` if given, else one per
    stream, at least :data:`SPAN_IN_FLIGHT` and at most :data:`MAX_IN_FLIGHT`). So is ``chunk_bytes``, the size of each stream's read
    buffers (local files, the tar parser, the reads of a part; no smaller than :data:`MIN_SHARED_CHUNK`
    unless its read-ahead is)."""
    options = dict(options or {})
    if share <= 1:
        return options
    opts = remote_options(options)
    ahead = max(2048, opts.read_ahead_bytes // share)
    options.update(read_ahead_bytes=ahead, part_bytes=max(1024, min(opts.part_bytes, ahead // 2)),
                   chunk_bytes=min(ahead, max(MIN_SHARED_CHUNK, opts.chunk_bytes // share)))
    return options


def one_stream(options: Optional[Mapping[str, Any]], streams: int, share: int = 1) -> Dict[str, Any]:
    """``options`` for one byte stream that reads what ``streams`` streams reading at once would
    (a worker's interleaved columns, an epoch's share of them read by ranges), within ``share``
    of the worker's read-ahead (:func:`shared_budget`): as many requests in flight as the streams
    would keep (one each, at least :data:`SPAN_IN_FLIGHT`, at most :data:`MAX_IN_FLIGHT`;
    ``parts_in_flight`` if given), in parts small enough that so many fit in its budget; its
    reads' chunks those of one of the streams (its many short ranges each read through a buffer
    of that size, and a stream's budget is at least a chunk)."""
    options = shared_budget(options, share)
    opts = remote_options(options)
    flight = opts.parts_in_flight or min(MAX_IN_FLIGHT, max(SPAN_IN_FLIGHT, streams))
    ahead = opts.read_ahead_bytes
    options.update(parts_in_flight=flight, part_bytes=max(1024, min(opts.part_bytes, ahead // flight)),
                   chunk_bytes=shared_budget(options, streams).get("chunk_bytes", opts.chunk_bytes))
    return options


def with_cache(options: Optional[Mapping[str, Any]], folder: Optional[str], limit: Any) -> Dict[str, Any]:
    """``options`` carrying the node-local byte cache of ``folder`` (at most ``limit`` bytes):
    built here, once, so a folder that cannot hold it is a :class:`ConfigError` before any worker
    starts; it travels to the workers with the options (it pickles as its settings). ``folder``
    None: ``options`` as they are; a cache already there is kept."""
    options = dict(options or {})
    if folder is not None and options.get("cache") is None:
        options["cache"] = ByteCache(folder, limit)
    return options
