"""The error policy of a worker: re-raise a bad sample or shard, or count and skip it."""

from __future__ import annotations

import logging
from collections import Counter

from ..errors import DalistreamError

log = logging.getLogger(__name__)


class Skips(Counter):
    """Skip counters keyed ``"samples:<reason>"`` and ``"shards:<reason>"``; ``skips["samples"]``
    and ``skips["shards"]`` are the totals of each kind."""

    def __missing__(self, key):
        if key in ("samples", "shards"):
            return sum(v for k, v in self.items() if k.startswith(key + ":"))
        return 0


def skip_totals(skipped) -> dict:
    """``{"skipped_samples": n, "skipped_shards": n, "skipped": {"samples": {reason: n}, "shards": {...}}}``
    from flat ``"kind:reason"`` counters (as workers write them)."""
    nested: dict = {"samples": {}, "shards": {}}
    for key, value in sorted(dict(skipped).items()):
        kind, _, reason = key.partition(":")
        if kind in nested and reason:
            nested[kind][reason] = nested[kind].get(reason, 0) + int(value)
    return {"skipped_samples": sum(nested["samples"].values()), "skipped_shards": sum(nested["shards"].values()),
            "skipped": nested}


class ErrorPolicy:
    """Applies ``on_error`` to an error of one sample or one shard: re-raise, or count and skip.

    ``on_error`` is ``"raise"``, ``"skip"`` or a callable ``f(error)`` that raises to stop or
    returns to skip (in the DALI worker process: it must pickle with dill, and what it records
    stays in that process). ``kind`` is ``"samples"`` or ``"shards"``; skips are counted in
    :attr:`skipped` under ``"<kind>:<error.reason>"`` (``skipped["samples"]`` is the total) and
    logged as a warning once per shard.
    """

    def __init__(self, on_error) -> None:
        self.on_error = on_error
        self.skipped: Counter = Skips()
        self._warned: set = set()

    def handle(self, error: DalistreamError, kind: str) -> None:
        if self.on_error == "raise":
            raise error
        if callable(self.on_error):
            self.on_error(error)
        self.count(kind, error.reason)
        if error.url not in self._warned:
            self._warned.add(error.url)
            log.warning("skipping bad %s (further skips in this shard are counted, not logged): %s",
                        "shard" if kind == "shards" else "sample", error)

    def count(self, kind: str, reason: str) -> None:
        """Count one skip without an error (e.g. ``missing="skip"``)."""
        self.skipped[f"{kind}:{reason}"] += 1
