"""Parts of neighbouring columns read as one run.

A worker reading interleaved columns of a data set whose epoch is small beside its batch reads
each column's part of the epoch as one run, and in a job of one rank the columns' parts lie end
to end in their shards (column ``c + 1``'s part starts where column ``c``'s ends; with ``R``
ranks a worker's columns lie ``R`` spans apart). Read one by one, each costs a part's opening, a
read, a header check and a run of its own. :class:`Neighbours` knows which part follows which
in the columns' plans of an epoch; in a later epoch (the first's parts start with short runs,
for its first batch), the first column to open its part reads the parts after it that no
column opened yet, up to :data:`TOGETHER_BYTES` of a local file, as one run
(:meth:`Neighbours.read`), cut at the parts' bounds; the other columns take theirs when they
open them. What each column reads, and in which order, is unchanged: only how many reads bring it.

The reads of one range of a local shard live here too: by member layout (:func:`range_runs`), by
header walk (:func:`walk_runs`, which a column's part takes too; :func:`walked_range`, an
epoch's range between its offsets, :mod:`.epochfeed`).
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DalistreamError
from ..io.stores import is_ranged
from ..io.streams import open_shard
from ..plan import WorkerPlan
from ..tar import iter_samples
from ..tar.runs import Geometry, Run, is_one_run, run_length, sliced_runs
from ..tar.walked import walked_runs
from .context import ReadContext
from .stats import WorkerStats

TOGETHER_BYTES = 4 << 20  # parts read as one run: at most this many bytes (half an arena buffer)


class Neighbours:
    """The parts of one reader's columns in an epoch (``plans``), and the runs read for a column
    by its neighbour, until it takes them; one per reader and epoch (made anew when the columns
    are, so nothing read for a column that never comes outlives its epoch)."""

    def __init__(self, plans: Sequence[WorkerPlan] = ()) -> None:
        #: (shard, first sample) -> the stop of the part that starts there
        self.next: Dict[Tuple[int, int], int] = {
            (index, first): stop for plan in plans for index, first, stop in plan.parts if stop is not None}
        self.ahead: Dict[Tuple[int, int, int], Run] = {}

    def opened(self, index: int, first: int, stop: int) -> Optional[Run]:
        """Part ``first … stop`` of shard ``index`` is opened by its column now (no other column's
        read brings it from now on): its run, when a neighbour read it."""
        self.next.pop((index, first), None)
        return self.ahead.pop((index, first, stop), None) if self.ahead else None

    def bounds(self, index: int, first: int, stop: int, starts: np.ndarray, count: int, run_bytes: int) -> List[int]:
        """Where part ``first … stop`` of shard ``index`` and the parts right after it that other
        columns read (and have not opened, nor had read for them) end, as one read would bring
        them: ``[first, stop, …]`` (``[first, stop]`` alone: nothing to read with it). ``starts``: each sample's byte offset in the shard. Only
        a part read as one run of ``run_bytes`` goes with others (:func:`~dalistream.tar.runs.is_one_run`:
        a longer local part is cut out of the file's mapping, which copies nothing a read together
        would save), and never a shard's last part (its end-of-archive check is its own)."""
        out = [first, stop]
        if not self.next or not is_one_run(int(starts[stop] - starts[first]), run_bytes):
            return out
        while True:
            after = self.next.get((index, out[-1]))
            if after is None or after >= count or int(starts[after] - starts[first]) > TOGETHER_BYTES:
                return out
            out.append(after)

    def keep(self, index: int, run: Run, bounds: Sequence[int], geometry: Geometry) -> Run:
        """``run`` (samples ``bounds[0] … bounds[-1]`` of shard ``index``, whose :class:`Geometry`
        is ``geometry``) cut at ``bounds``: the first part's run; the others kept for their columns."""
        base, wanted = geometry.member_base, geometry.wanted
        parts = [run.cut(a - run.first, b - run.first, int(wanted[base[b]] - wanted[base[a]]))
                 for a, b in zip(bounds, bounds[1:])]
        for a, b, part in zip(bounds[1:], bounds[2:], parts[1:]):
            self.ahead[(index, a, b)] = part
            del self.next[(index, a)]  # (read: no other read brings it)
        return parts[0]

    def read(self, ctx: ReadContext, index: int, first: int, stop: int, start: Optional[int], stats: WorkerStats,
             chunk: int) -> Optional[Run]:
        """Part ``first … stop`` of shard ``index`` (opened at byte ``start``; one the member layout
        cuts out: :meth:`~.layouts.ShardLayouts.layout` found it) read with ``ctx`` with the parts
        right after it that other columns read (:meth:`bounds`), as one run cut at their bounds:
        this part's run; ``None`` (it is read alone) where none is to be read with it, the shard is
        remote, the part is to start with a short run (``ctx.first_runs``), or the read finds
        anything amiss (each part's problem is then found by its own column, reading it alone)."""
        url = ctx.data.urls[index]
        if ctx.first_runs or not self.next or is_ranged(url):
            return None
        g = ctx.layouts.geometry(index)
        bounds = self.bounds(index, first, stop, g.sample_start, ctx.data.counts[index], run_length(chunk))
        layout = ctx.layouts.layout(index, first, bounds[-1], start) if len(bounds) > 2 else None
        if layout is None:
            return None
        try:
            items = range_runs(ctx, index, first, bounds[-1], layout, stats, chunk, (TOGETHER_BYTES,))
        except (DalistreamError, OSError, EOFError):
            return None
        if len(items) != 1 or not isinstance(items[0], Run) or len(items[0]) != bounds[-1] - first:
            return None
        return self.keep(index, items[0], bounds, g)


def range_runs(ctx: ReadContext, index: int, first: int, stop: int, layout: tuple, stats: WorkerStats, chunk: int,
               first_runs: Sequence[int]) -> list:
    """Samples ``first … stop`` of local shard ``index``, cut out by its member ``layout``
    (:meth:`~.layouts.ShardLayouts.layout`), as ``sliced_runs`` reads them (its runs, its first ones
    of ``first_runs`` bytes; sample dicts up to any damage; the end-of-archive check where
    ``stop`` is the shard's end): the read of parts together, a later epoch's neighbours'. Raises
    what opening and reading raise."""
    patterns, kinds, sizes, offset = layout
    url, count, c = ctx.data.urls[index], ctx.data.counts[index], ctx.config
    with stats.io_clock.timed():
        opened = open_shard(url, offset, c.storage_options, ctx.data.offsets.at(index, stop) if stop < count else None)
    with opened as f:
        return list(sliced_runs(f, url, patterns, kinds, sizes, first=first, offset=offset, want_ext=ctx.wants,
                                lowercase=c.lowercase_ext, last=stop == count, clock=stats.io_clock, chunk=chunk,
                                geometry=ctx.layouts.geometry(index).part(first, stop), arena=ctx.arena,
                                first_runs=first_runs))


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
