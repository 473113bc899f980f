"""Manifest: per-shard sample counts (and sample offsets), from a manifest file or a header scan."""

from .counts import count_shards, shard_counts, shard_infos
from .files import FORMAT, lookup, read_manifest, write_manifest
from .rows import ShardInfo
from .scan import build_manifest, scan_shard, scan_tolerant

__all__ = ["FORMAT", "ShardInfo", "build_manifest", "count_shards", "lookup", "read_manifest", "scan_shard", "scan_tolerant",
           "shard_counts", "shard_infos", "write_manifest"]
