"""The reads of one range of a local shard found by header walk: :func:`walk_runs` (which a
column's part takes too) and :func:`walked_range` (an epoch's range between its offsets,
:mod:`.epochfeed`).
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Iterator, Optional, Sequence

from ..io.streams import open_shard
from ..tar import iter_samples
from ..tar.runs import Run
from ..tar.walked import walked_runs
from .context import ReadContext
from .stats import WorkerStats

TOGETHER_BYTES = 4 << 20  # a walked range's runs: at most this many bytes (half an arena buffer)


def walk_runs(ctx: ReadContext, f: BinaryIO, url: str, first_index: int, keep: Callable[[int], bool],
              stats: WorkerStats, chunk: int, run_bytes: int, first_runs: Sequence[int]) -> Iterator:
    """The header walk of ``f`` (shard ``url`` opened at its sample ``first_index``) as a reader
    reads a shard without a member layout: the samples ``keep`` keeps, marked where they have a
    problem (:func:`~dalistream.tar.samples.iter_samples`), the whole ones gathered into runs of
    about ``run_bytes`` (:func:`~dalistream.tar.walked.walked_runs`; ``first_runs``: the first
    runs' bytes). A column's part (:meth:`~.reader.PlanReader.items`) and an epoch's ranges
    (:func:`walked_range`) are walked by it."""
    c = ctx.config
    samples = iter_samples(f, url, keep=keep, want_ext=ctx.wants, lowercase=c.lowercase_ext,
                           max_member_bytes=c.max_member_bytes, mark_errors=True, first_index=first_index,
                           clock=stats.io_clock, chunk=chunk)
    return walked_runs(samples, url, ctx.arena, run_bytes, first_runs)


def walked_range(ctx: ReadContext, index: int, first: int, stop: int, start: Optional[int], end: Optional[int],
                 stats: WorkerStats, chunk: int) -> Optional[list]:
    """Samples ``first … stop`` of local shard ``index`` found by header walk (:func:`walk_runs`)
    between bytes ``start`` and ``end`` (their offsets: to the end, checked, where ``stop`` is
    the shard's end), as runs of up to :data:`TOGETHER_BYTES`: an epoch's range of a shard
    without a member layout (:mod:`.epochfeed`); ``None`` where they are not all whole runs (a
    sample with a problem, or one the walk leaves alone). Raises what opening and reading raise."""
    url = ctx.data.urls[index]
    with stats.io_clock.timed():
        opened = open_shard(url, start or 0, ctx.config.storage_options, end)
    with opened as f:
        items = list(walk_runs(ctx, f, url, first, lambda i: True, stats, chunk, TOGETHER_BYTES, ()))
    return items if _whole(items, first, stop) else None


def _whole(items: Sequence, first: int, stop: int) -> bool:
    """Whether ``items`` are runs of samples ``first`` to ``stop``, one after the other."""
    for item in items:
        if not isinstance(item, Run) or item.first != first:
            return False
        first += len(item)
    return first == stop
