"""One resolved data set: what :meth:`dalistream.Stream.open` found, passed as one value to the workers.

A :class:`DataSet` is small and immutable: the shard URLs, their sample counts, every sample's
tar offset with the member layouts (where known), where the counts came from, the stored bytes
per sample and per shard, and for a bucketed stream every sample's bucket (from the manifest's
per-sample keys: :mod:`dalistream.buckets`). It does no I/O; it pickles as it is (the offsets by
path when saved to the cache directory), so each DALI worker receives it whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

import numpy as np

from .errors import ConfigError, redact
from .manifest.offsets import SampleOffsets


@dataclass(frozen=True)
class DataSet:
    """The shards of one data set, resolved: URLs, counts, offsets and where they came from.

    ``DataSet(tuple(urls), tuple(counts), offsets)``; lengths are checked on creation (a
    :class:`~dalistream.errors.ConfigError` names what disagrees with the URLs).
    """

    #: The shard URLs (or local paths), in listing order.
    urls: Tuple[str, ...]
    #: Samples per shard; ``None`` when not counted (policy ``fixed`` without a manifest).
    counts: Optional[Tuple[int, ...]] = None
    #: Every sample's tar offset and the regular shards' member layouts (``offsets.members``),
    #: where a manifest or scan recorded them; ``None`` otherwise (shards are read by header).
    offsets: Optional[SampleOffsets] = None
    #: Where the counts came from (a manifest's path, a scan, ``"mix"``), for error messages.
    count_source: Optional[str] = None
    #: Stored shard bytes per sample, where known: sizes the workers' shared memory.
    bytes_per_sample: Optional[float] = None
    #: Stored bytes per shard, where every shard's is known: part of the sources' identity.
    sizes: Optional[Tuple[int, ...]] = None
    #: The manifest's per-sample key columns (name → one integer per sample in written order, ``-1``
    #: unknown), for a stream opened with buckets; ``None`` without buckets, and once every sample's
    #: bucket is known (:meth:`with_buckets`).
    keys: Optional[Mapping[str, np.ndarray]] = field(default=None, compare=False)
    #: Every sample's bucket (``int16``, written order), for a bucketed stream; ``None`` otherwise.
    buckets: Optional[np.ndarray] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = len(self.urls)
        total = None if self.counts is None else sum(self.counts)
        columns = list((self.keys or {}).items()) + ([("buckets", self.buckets)] if self.buckets is not None else [])
        for name, column in columns:
            if total is None or len(column) != total:
                raise ConfigError(f"data set: {len(column)} values of {name!r} for {total} samples")
        if self.counts is not None and len(self.counts) != n:
            raise ConfigError(f"data set: {len(self.counts)} counts for {n} shard URLs")
        if self.sizes is not None and len(self.sizes) != n:
            raise ConfigError(f"data set: {len(self.sizes)} sizes for {n} shard URLs")
        if self.offsets is not None:
            shards = len(self.offsets.starts) - 1
            if shards != n:
                raise ConfigError(f"data set: offsets for {shards} shards, {n} shard URLs")
            if self.counts is not None and not np.array_equal(np.diff(self.offsets.starts), self.counts):
                raise ConfigError("data set: the offsets' per-shard sample counts disagree with counts")

    def with_buckets(self, ids: np.ndarray) -> "DataSet":
        """This data set with every sample's bucket ``ids`` (and its keys, now used, left out:
        the workers receive the buckets alone)."""
        return dataclasses.replace(self, keys=None, buckets=np.asarray(ids, dtype=np.int16))

    def shown(self) -> str:
        """The first shard URLs, redacted (no credentials in logs), and how many there are."""
        listed = ", ".join(redact(u) for u in self.urls[:3]) + (", …" if len(self.urls) > 3 else "")
        return f"[{listed}] ({len(self.urls)} shards)"

    def __repr__(self) -> str:
        samples = None if self.counts is None else sum(self.counts)
        return (f"DataSet(urls={self.shown()}, samples={samples}, "
                f"offsets={'yes' if self.offsets is not None else None}, count_source={self.count_source!r})")
