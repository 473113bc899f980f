"""The worker: the DALI parallel-source iterable of one worker, from its plan to padded batches.

Reads its shards (:mod:`.reader`, a column's parts; an epoch at once, in shares from one mapping of its
shards, :mod:`.epochfeed`, :mod:`.mapped`), decodes fields (:mod:`.fields`) under the error policy
(:mod:`.policy`), shuffles (:mod:`dalistream.plan.shuffle`), assembles batches (:mod:`.source`) and counts
(:mod:`.stats`). Runs without DALI."""

from ..kinds import image_problem
from .fields import FieldDecoder
from .policy import ErrorPolicy, skip_totals
from ..plan.shuffle import emitted_indices, shuffled
from .source import WorkerSource
from .stats import WorkerStats, read_workers, stats_path, summarize

__all__ = ["ErrorPolicy", "FieldDecoder", "WorkerSource", "WorkerStats", "emitted_indices", "image_problem",
           "read_workers", "shuffled", "skip_totals", "stats_path", "summarize"]
