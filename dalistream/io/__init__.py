"""Byte streams, the lowest stage: local files, gzip, ``pipe:``, S3 and HTTP(S) with read-ahead,
resume and retries, and the counters of that I/O. Everything here yields plain bytes; nothing
here knows about tar."""

from .counters import IOCounters, ReadClock
from .streams import ShardSequence, open_raw, open_shard

__all__ = ["IOCounters", "ReadClock", "ShardSequence", "open_raw", "open_shard"]
