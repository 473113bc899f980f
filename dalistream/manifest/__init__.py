"""Manifest: per-shard sample counts (and sample offsets), from a manifest file or a header scan."""

from .counts import Counted, count_samples, count_shards
from .files import DEFAULT_NAME, default_location, lookup, read_idx, read_manifest, write_manifest
from .formats import FORMAT
from .offsets import SampleOffsets
from .rows import ShardInfo
from .scan import build_manifest, scan_shard, scan_tolerant

__all__ = ["Counted", "DEFAULT_NAME", "FORMAT", "SampleOffsets", "ShardInfo", "build_manifest", "count_samples", "count_shards",
           "default_location", "lookup", "read_idx", "read_manifest", "scan_shard", "scan_tolerant", "write_manifest"]
