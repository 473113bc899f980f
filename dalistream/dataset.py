"""One resolved data set: what :meth:`dalistream.Stream.open` found, passed as one value to the workers.

A :class:`DataSet` is small and immutable: the shard URLs, their sample counts, every sample's
tar offset with the member layouts (where known), where the counts came from, and the stored
bytes per sample and per shard. It does no I/O; it pickles as it is (the offsets by path when
saved to the cache directory), so each DALI worker receives it whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

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

    def __post_init__(self) -> None:
        n = len(self.urls)
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

    def shown(self) -> str:
        """The first shard URLs, redacted (no credentials in logs), and how many there are."""
        listed = ", ".join(redact(u) for u in self.urls[:3]) + (", …" if len(self.urls) > 3 else "")
        return f"[{listed}] ({len(self.urls)} shards)"

    def __repr__(self) -> str:
        samples = None if self.counts is None else sum(self.counts)
        return (f"DataSet(urls={self.shown()}, samples={samples}, "
                f"offsets={'yes' if self.offsets is not None else None}, count_source={self.count_source!r})")
