"""The error policy of a worker: re-raise a bad sample or shard, or count and skip it."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Dict, Iterator, Optional

from ..errors import DalistreamError, SampleError
from .rows import Rows

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


MIN_JUDGED = 100  # samples read before max_skip_fraction is judged (and at the end of an epoch)

HINTS = {
    "missing_field": "check each field's extensions against the shards' members (a typo such as 'jpeg' for "
                     "'jpg'?); pass lowercase_ext=True if they differ only in case",
    "bad_image": "the images are not in a format DALI decodes, or are cut: check the data",
    "bad_value": "check the field's kind and decoder against the members' contents",
}


class ErrorPolicy:
    """Applies ``on_error`` to an error of one sample or one shard: re-raise, or count and skip.

    ``on_error`` is ``"raise"``, ``"skip"`` or a callable ``f(error)`` that raises to stop or
    returns to skip (in the DALI worker process: it must pickle with dill, and what it records
    stays in that process). ``kind`` is ``"samples"`` or ``"shards"``; skips are counted in
    :attr:`skipped` under ``"<kind>:<error.reason>"`` (``skipped["samples"]`` is the total) and
    logged as a warning once per shard.

    ``max_skip_fraction``: samples that pass are counted by :meth:`watched`; once
    :data:`MIN_JUDGED` samples have been read (or at the end of the samples, if fewer), more
    than this share skipped for one reason raises a :class:`SampleError` naming the reason
    (``too_many_skips``): a typo in a field's extension skips every sample, damage rarely most.
    ``rank`` and ``worker`` are put on that error.
    """

    def __init__(self, on_error, max_skip_fraction: float = 1.0, *, rank: Optional[int] = None,
                 worker: Optional[int] = None) -> None:
        self.on_error = on_error
        self.skipped: Counter = Skips()
        self.max_skip_fraction = max_skip_fraction
        self.passed = 0
        self.examples: Dict[str, str] = {}  # reason -> what one skipped sample looked like
        self.where = {"rank": rank, "worker": worker}
        self._warned: set = set()

    def handle(self, error: DalistreamError, kind: str) -> None:
        if self.on_error == "raise":
            raise error
        if callable(self.on_error):
            self.on_error(error)
        if error.url not in self._warned:
            self._warned.add(error.url)
            log.warning("skipping bad %s (further skips in this shard are counted, not logged): %s",
                        "shard" if kind == "shards" else "sample", error)
        self.count(kind, error.reason, example=str(error))

    def count(self, kind: str, reason: str, example: Optional[str] = None) -> None:
        """Count one skip without an error (e.g. ``missing="skip"``); ``example`` describes it."""
        self.skipped[f"{kind}:{reason}"] += 1
        if kind == "samples":
            if example is not None:
                self.examples.setdefault(reason, example)
            self.check()

    def watched(self, blocks: Iterator[Rows]) -> Iterator[Rows]:
        """``blocks`` passed through, their rows counted as passed, judged at the end."""
        for block in blocks:
            self.passed += block.n
            yield block
        self.check(final=True)

    def check(self, final: bool = False) -> None:
        """Raise if one reason's skips exceed ``max_skip_fraction`` of the samples read."""
        skipped = self.skipped["samples"]
        seen = skipped + self.passed
        if not skipped or seen < (1 if final else MIN_JUDGED) or self.max_skip_fraction >= 1:
            return
        reason, count = max(((k.partition(":")[2], v) for k, v in self.skipped.items() if k.startswith("samples:")),
                            key=lambda kv: kv[1])
        if count <= self.max_skip_fraction * seen:
            return
        example = self.examples.get(reason)
        raise SampleError(
            f"{count} of the {seen} samples read were skipped as {reason!r}, more than "
            f"max_skip_fraction={self.max_skip_fraction:g}: this looks like a configuration mistake, not damaged data"
            + (f" (one of them: {example})" if example else ""), reason="too_many_skips",
            hint=HINTS.get(reason, "check the data") + "; to train on what is left, raise max_skip_fraction "
                 "(1 turns the check off)",
        ).at(**self.where)
