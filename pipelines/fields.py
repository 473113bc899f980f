"""The ready pipelines' field handling."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional


def with_read_fields(outputs: Dict[str, Any], data: Mapping[str, Any]) -> Dict[str, Any]:
    """A ready pipeline's outputs, then every other field as read (``valid`` aside)."""
    return {**outputs, **{k: v for k, v in data.items() if k not in outputs and k != "valid"}}


def merged_fields(defaults: Mapping[str, Any], user: Any) -> Dict[str, Any]:
    """A ready pipeline's ``fields``: its defaults, with the user's ``fields`` (a mapping, or a
    list of :class:`dalistream.Field`) merged over them by name."""
    fields = dict(defaults)
    fields.update(user if isinstance(user, Mapping) else {f.name: f for f in user or ()})
    return fields


#: Keywords of :class:`dalistream.Loader` itself that a ready pipeline's ``loader()`` passes on to it.
LOADER_OPTIONS = ("progress", "stats_dir", "wait_warning", "warn_empty")


def loader_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """Take :data:`LOADER_OPTIONS` out of a ready pipeline's ``stream_options``, for the Loader."""
    return {name: options.pop(name) for name in LOADER_OPTIONS if name in options}


def evaluation_order(options: Dict[str, Any], shuffle: Optional[int], every_sample: bool = True) -> int:
    """An evaluation's reading, set in a ready pipeline's ``stream_options`` unless the user chose:
    the order the shards hold (one span per worker, no shuffle) and, with ``every_sample``, every
    sample once (policy ``exact``). Returns the shuffle to open the stream with."""
    options.setdefault("interleave", False)
    if every_sample:
        options.setdefault("policy", "exact")
    return 0 if shuffle is None else shuffle
