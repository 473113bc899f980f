"""Sources: what the user typed (paths, globs, braces, URLs) → the ordered list of shard URLs."""

from .listing import expand_sources, is_remote
from .unfinished import SHARD_SUFFIXES, is_shard_name

__all__ = ["SHARD_SUFFIXES", "expand_sources", "is_remote", "is_shard_name"]
