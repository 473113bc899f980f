"""One manifest row: a shard's URL, its number of samples, its stored size and (optionally) the
tar offset of every sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import ManifestError


@dataclass(frozen=True)
class ShardInfo:
    """One manifest row: shard URL, number of samples, size in bytes (as stored), and optionally
    the tar offset of every sample."""

    url: str
    samples: int
    bytes: int
    offsets: Optional[Tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if self.offsets is not None:
            object.__setattr__(self, "offsets", tuple(self.offsets))
            if len(self.offsets) != self.samples:
                raise ManifestError(f"manifest row has {len(self.offsets)} offsets for {self.samples} samples",
                                    url=self.url)
