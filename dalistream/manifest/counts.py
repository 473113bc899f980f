"""Per-shard sample counts, the front of the manifest stage: from a manifest file, else a (cached)
header scan."""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from .files import lookup, read_manifest
from .rows import ShardInfo
from .scan import build_manifest, scan_tolerant

log = logging.getLogger(__name__)


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


def count_shards(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False, tolerant: bool = False,
    offsets: bool = False, progress: Optional[Callable[[ShardInfo], None]] = None,
) -> Tuple[List[ShardInfo], list]:
    """Every shard's row and the problems met, for every command that counts shards.

    ``tolerant`` (``on_error="skip"``): a shard that cannot be read to its end (empty,
    truncated, unreadable) is counted up to its problem — what a worker delivers before it skips
    the rest — its error returned and logged as a warning, instead of raised. A ``manifest``
    is taken as it is (no problems)."""
    if manifest:
        return lookup(urls, read_manifest(manifest, options), manifest), []
    if not tolerant:
        return build_manifest(urls, cache_dir=cache_dir, options=options, lowercase=lowercase, offsets=offsets,
                              progress=progress), []
    infos, problems = scan_tolerant(urls, cache_dir=cache_dir, options=options, lowercase=lowercase, offsets=offsets,
                                    progress=progress)
    for problem in problems:
        log.warning("shard cannot be read to its end; counting the samples before the problem: %s", problem)
    return infos, problems
