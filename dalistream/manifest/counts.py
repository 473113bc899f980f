"""Per-shard sample counts, the front of the manifest stage: from a manifest file, else a (cached)
header scan."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

from .files import lookup, read_manifest
from .rows import ShardInfo
from .scan import build_manifest


def shard_infos(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False,
) -> List[ShardInfo]:
    """Every shard's row (sample count, size): from ``manifest`` if given, else a (cached) header scan."""
    if manifest:
        return lookup(urls, read_manifest(manifest, options), manifest)
    return build_manifest(urls, cache_dir=cache_dir, options=options, lowercase=lowercase)


def shard_counts(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False,
) -> List[int]:
    """Sample count of every shard (see :func:`shard_infos`)."""
    return [i.samples for i in shard_infos(urls, manifest=manifest, cache_dir=cache_dir, options=options,
                                           lowercase=lowercase)]
