"""One part of a shard read: :func:`read_part`, the tar reader's raw items of samples ``first``
to ``stop`` of one shard, from the stream its sequence opens (a local file's range, or remote
bytes through the worker's read-ahead and the node cache): cut into runs by the member layout
(:func:`~dalistream.tar.runs.sliced_runs`), or found by header walk and gathered into runs
(:func:`~dalistream.tar.walked.walked_runs`). The one way a worker reads a part of a shard: a
column's parts (:mod:`.reader`) and the ranges of an epoch's share read at once
(:mod:`.epochfeed`) alike."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

from ..errors import DalistreamError, ManifestError, ShardFormatError, SourceError
from ..io.streams import ShardSequence
from ..manifest.scan import forget
from ..tar import iter_samples, read_error
from ..tar.runs import Run, run_length, sliced_runs
from ..tar.walked import walked_runs
from .context import ReadContext
from .numbering import Numbering
from .stats import WorkerStats


def read_part(ctx: ReadContext, shards: ShardSequence, position: int, index: int, first: int, stop: Optional[int],
              start: Optional[int], end: Optional[int], stats: WorkerStats, numbering: Numbering,
              first_runs: Tuple[int, ...] = (), run_bytes: Optional[int] = None) -> Iterator:
    """Samples ``first`` to ``stop`` of shard ``index`` (to its end when ``stop`` is None) from
    ``shards.open(position)``: bytes ``start`` to ``end`` when the offsets are known (a seek or
    a ranged GET), else from the shard's start, the samples before ``first`` passed over by
    header; ``numbering`` numbers them. A stale count shows as a shard ending before ``stop`` or
    holding more samples than counted. Yields the tar reader's raw items (runs; a sample alone
    where the header walk cannot gather it); the shard's problem is left in
    ``numbering.problem``. ``first_runs``: the bytes of the part's first runs, where they are to
    differ; ``run_bytes``: a walked part's runs' (default: by the sequence's chunk)."""
    c, data = ctx.config, ctx.data
    skip = numbering.skip
    url = data.urls[index]
    count = data.counts[index] if data.counts is not None else None
    found_at = first if start is not None else 0
    layout = ctx.layouts.layout(index, first, stop, start)
    problem: Optional[DalistreamError] = None
    try:
        with stats.io_clock.timed():  # blocked before the first chunk arrives: I/O wait too
            opened = shards.open(position)  # (a part with an end: a tar of its own)
        with opened as f:
            if layout is not None:  # a regular shard: samples cut out by the manifest's member layout
                patterns, kinds, sizes, offset = layout
                found_at = first
                items = sliced_runs(f, url, patterns, kinds, sizes, first=first, offset=offset, want_ext=ctx.wants,
                                    lowercase=c.lowercase_ext, last=stop == count, clock=stats.io_clock,
                                    chunk=shards.chunk, geometry=ctx.layouts.geometry(index).part(first, stop),
                                    arena=ctx.arena, first_runs=first_runs)
            else:  # the header walk; its whole samples gathered into runs
                def keep(i: int) -> bool:
                    return first <= i and (stop is None or i < stop) and not skip(i)

                if start is not None and end is not None and not numbering.skips:  # (opened at ``first``
                    keep = _every  # and ending at ``stop``'s offset: no sample to pass over)
                samples = iter_samples(f, url, keep=keep, want_ext=ctx.wants, lowercase=c.lowercase_ext,
                                       max_member_bytes=c.max_member_bytes, mark_errors=True,
                                       first_index=first if start is not None else 0, clock=stats.io_clock,
                                       chunk=shards.chunk)
                items = walked_runs(samples, url, ctx.arena, run_bytes or run_length(shards.chunk), first_runs)
            for item in items:
                found_at = item.first + len(item) if isinstance(item, Run) else item["__index__"] + 1
                if found_at <= first:
                    continue  # another worker's sample, passed over by header
                if stop is not None and found_at > stop:
                    if stop == count:
                        problem = stale(ctx, url, count, f"at least {found_at}")
                    break
                yield item
            else:
                if stop is not None and found_at < stop:
                    problem = stale(ctx, url, count, str(found_at))
    except (ShardFormatError, SourceError) as e:
        problem = e
    except DalistreamError as e:
        raise e.at(rank=c.rank, worker=ctx.worker)
    except (OSError, EOFError) as e:  # I/O errors outside the tar reader (open, close)
        problem = read_error(e, url)
    numbering.found = found_at
    numbering.problem = problem.at(rank=c.rank, worker=ctx.worker) if problem is not None else None


def _every(index: int) -> bool:
    return True


def stale(ctx: ReadContext, url: str, counted: Optional[int], found: str) -> ManifestError:
    """The error of a shard whose sample count no longer holds (rewritten after it was counted)."""
    c = ctx.config
    source = ctx.data.count_source or ""
    if source.startswith("header scan"):  # our own count: its cache entry is dropped, so a restart rescans
        forget(url, c.cache_dir, c.storage_options, c.lowercase_ext)
        said, hint = ("it changed after it was counted", "its cached count was dropped: restart to rescan")
    else:  # an index file somebody wrote: restarting reads the same wrong count again
        said, hint = ("the shard and its index disagree (the shard changed after it was indexed, or the index "
                      "was written for other shards)",
                      "rebuild the index: `dalistream index SOURCE` writes a manifest beside the shards")
    return ManifestError(
        f"shard holds {found} samples but {counted} were counted{f' ({source})' if source else ''}: {said}",
        url=url, reason="stale_count", rank=c.rank, worker=ctx.worker, hint=hint,
    )
