"""One worker's samples in plan order: its shards opened in sequence, tar members grouped into
samples, fields decoded, the error policy applied.

:class:`PlanReader` knows the data set (:class:`~dalistream.dataset.DataSet`); :meth:`~PlanReader.decoded`
yields a worker's decoded samples (tuples of arrays, one per field) for one :class:`~dalistream.plan.WorkerPlan`,
``None`` in place of samples skipped on resume (still numbered, never read or decoded).
"""

from __future__ import annotations

import bisect
import itertools
from typing import Callable, Iterator, Optional

import numpy as np

from ..config import StreamConfig
from ..dataset import DataSet
from ..errors import DalistreamError, ManifestError, SampleError, ShardFormatError, SourceError
from ..io.options import shared_budget
from ..io.streams import ShardSequence, is_gzip_name
from ..manifest.scan import forget
from ..plan import WorkerPlan, seeds
from ..tar import iter_samples, read_error
from ..tar.runs import Run, sliced_runs
from ..tar.sliced import sliced_samples
from .fields import FieldDecoder
from .policy import ErrorPolicy
from .rows import RowDecoder, Rows
from .stats import WorkerStats

PASS_END = object()  # marks the end of one pass over a worker's shards

Keep = Callable[[int], bool]


class PlanReader:
    """Reads the samples a :class:`WorkerPlan` names (see module doc); picklable."""

    def __init__(self, config: StreamConfig, data: DataSet, worker: int, source_name: str = "") -> None:
        self.config = config
        self.data = data  # the shards, their counts, offsets (a part opens where it starts) and count source
        self.worker = worker
        self.decoder = FieldDecoder(config.fields, config.missing)
        self.rows = RowDecoder(config.fields, config.lowercase_ext)
        self.source_name = source_name  # a mix's source name: the ``__source__`` field
        self._source_field = any("__source__" in f.exts for f in config.fields)

    def decoded(self, plan: WorkerPlan, keep: Keep, policy: ErrorPolicy, stats: WorkerStats, share: int = 1,
                blocks: bool = False) -> Iterator:
        """Decoded samples of this worker's shards (endless, re-ordered per pass, for ``fixed``),
        ``None`` for samples skipped on resume.

        The error policy is applied here: a bad sample (duplicate key or member, member too large,
        undecodable value or image, missing field) is raised, or counted and skipped, and its shard
        goes on; a shard that cannot be opened or read on is raised, or counted and skipped after
        the samples before the damage. Shard problems are met one raw sample early (see
        :func:`problem_first`), so a worker that stops after its last planned sample has still
        met, counted and reported the damage right after it, and the unreadable shards after it.
        ``share``: how many plans this worker reads at once (their remote read-ahead budget is
        shared, :func:`~dalistream.io.options.shared_budget`). ``blocks``: samples a member layout
        cuts out are read a run at a time and come decoded as :class:`~.rows.Rows` blocks (for
        a reader whose ``keep`` passes all but a first few: no shuffle buffer); the others one by
        one, as tuples.
        """
        c = self.config
        good = 0
        for item in problem_first(self.raw(plan, keep, stats, share, blocks)):
            if item is PASS_END:
                if c.policy == "fixed" and not good:  # cycling over nothing would never end
                    raise SourceError("worker's shards hold no usable samples: policy 'fixed' cannot fill its batches",
                                      url=self.data.urls[plan.shards[0]] if plan.parts else None, rank=c.rank, worker=self.worker,
                                      reason="no_samples", hint="check the shards (see the warnings), or use fewer workers")
                good = 0
                continue
            if item is None:
                good += 1
                yield None
                continue
            if isinstance(item, DalistreamError):  # per shard
                policy.handle(item.at(rank=c.rank, worker=self.worker), "shards")
                stats.flush_skips()
                continue
            if type(item) is Run:
                stats.add(bytes=item.nbytes)
                if self._source_field:
                    item.source = self.source_name
                for block in self.blocks(item, policy, stats):
                    good += len(block) if type(block) is Rows else 1  # (a sample settled alone: a tuple)
                    yield block
                continue
            stats.add(bytes=sum(len(v) for k, v in item.items() if v is not None and not k.startswith("__")))
            if self._source_field:
                item["__source__"] = self.source_name
            value = self.settle(item, policy, stats)
            if value is not None:
                good += 1
                yield value

    def blocks(self, run: Run, policy: ErrorPolicy, stats: WorkerStats) -> Iterator:
        """A run's samples decoded together (:class:`~.rows.RowDecoder`), as :class:`~.rows.Rows`
        between the samples that do not pass, which are settled one by one (:meth:`settle`) in
        their place: the error policy meets them in the order, and at the moment, it would meet
        them read one by one."""
        columns, bad = self.rows.decode(run)
        lowercase, wants = self.config.lowercase_ext, self.decoder.wants
        start = 0
        for i in bad + [len(run)]:
            if i > start:
                yield Rows([column[start:i] for column in columns], i - start)
            if i < len(run):
                value = self.settle(run.sample(i, lowercase, wants), policy, stats)
                if value is not None:
                    yield value
            start = i + 1

    def settle(self, sample: dict, policy: ErrorPolicy, stats: WorkerStats) -> Optional[tuple]:
        """One raw sample decoded, or ``None`` when the error policy skipped it (counted; raised
        under ``on_error="raise"``): its tar reader's error, a field that does not decode, a
        missing field."""
        c = self.config
        error = sample.get("__error__")  # found by the tar reader
        if error is None:
            try:
                value = self.decoder.decode(sample)
            except SampleError as e:
                error = e
            else:
                if value is not None:
                    return value
                policy.count("samples", "missing_field", example=self.decoder.describe_missing(sample))
                stats.flush_skips()
                return None
        policy.handle(error.at(rank=c.rank, worker=self.worker), "samples")
        stats.flush_skips()
        return None

    def raw(self, plan: WorkerPlan, keep: Keep, stats: WorkerStats, share: int = 1, blocks: bool = False) -> Iterator:
        """This worker's raw samples (``ext -> bytes`` dicts; with ``blocks``, runs of those a member
        layout cuts out, :class:`~dalistream.tar.runs.Run`; numbered in plan order; ``None`` when
        ``keep`` rejects one), a shard's error in place of what follows its damage, and
        :data:`PASS_END` after each pass over the parts."""
        c = self.config
        options = shared_budget(c.storage_options, share)
        ordinal = 0
        passes = itertools.count() if c.policy == "fixed" else range(1)
        for n_pass in passes:
            parts = list(plan.parts)
            if n_pass:
                perm = np.random.default_rng(seeds.pass_order(c.seed, plan.epoch, n_pass)).permutation(len(parts))
                parts = [parts[int(i)] for i in perm]
            # resume: samples consumed before the restart are not even read (known sizes only);
            # an elastic resume's drops (raw positions over the parts) are neither read nor numbered
            drop = frozenset(plan.drop) if not n_pass else frozenset()
            done, nones, heads, base, raw = [], [], [], ordinal, 0
            for index, first, stop in parts:
                size = (None if stop is None else stop - first) or 0
                d = n = 0
                while d < size and (raw + d in drop or not keep(base + n)):
                    n += raw + d not in drop
                    d += 1
                done.append(d)
                nones.append(n)
                heads.append(raw - first)  # raw position of the part's sample i: heads[k] + i
                base += size - (bisect.bisect_left(plan.drop, raw + size) - bisect.bisect_left(plan.drop, raw) if drop else 0)
                raw += size
            reads = [(k, index, first + d, stop) for k, ((index, first, stop), d) in enumerate(zip(parts, done))
                     if not (stop is not None and stop > first and d == stop - first)]
            ranges = [self.byte_range(index, first, stop) for _, index, first, stop in reads]
            shards = ShardSequence([self.data.urls[index] for _, index, _, _ in reads], options, stats.io,
                                   ranges=[(start or 0, end) for start, end in ranges])
            position = 0
            for k, (index, first, stop) in enumerate(parts):
                ordinal += nones[k]
                yield from itertools.repeat(None, nones[k])
                if position == len(reads) or reads[position][0] != k:
                    continue
                first, (start, end) = first + done[k], ranges[position]
                for sample in self._part(shards, position, index, first, stop, start, end, stats, blocks):
                    if isinstance(sample, DalistreamError):
                        yield sample
                        continue
                    singles = (sample,)
                    if type(sample) is Run:
                        n = len(sample)
                        at = heads[k] + sample.first  # raw position of the run's first sample
                        if (not drop or bisect.bisect_left(plan.drop, at + n) == bisect.bisect_left(plan.drop, at)) \
                                and all(keep(o) for o in range(ordinal, ordinal + n)):
                            ordinal += n
                            yield sample
                            continue
                        # drops inside it (left out, or delivered before an elastic resume), or a reader
                        # that keeps only some: one by one
                        singles = (sample.sample(i, c.lowercase_ext, self.decoder.wants) for i in range(n))
                    for one in singles:
                        if drop and heads[k] + one["__index__"] in drop:
                            continue  # delivered before an elastic resume
                        ordinal += 1
                        yield one if keep(ordinal - 1) else None
                position += 1
            shards.close()
            yield PASS_END

    def byte_range(self, index: int, first: int, stop: Optional[int]) -> "tuple[Optional[int], Optional[int]]":
        """Where samples ``first`` to ``stop`` of shard ``index`` lie in its tar, as far as the
        offsets say: ``(start, end)``, ``None`` where unknown (from 0 / to the end)."""
        if self.data.offsets is None:
            return None, None
        count = self.data.counts[index] if self.data.counts is not None else None
        start = self.data.offsets.at(index, first) if first else None
        end = self.data.offsets.at(index, stop) if stop is not None and count is not None and stop < count else None
        return start, end

    def _part(self, shards: ShardSequence, position: int, index: int, first: int, stop: Optional[int],
              start: Optional[int], end: Optional[int], stats: WorkerStats, blocks: bool = False) -> Iterator:
        """Samples ``first`` to ``stop`` of shard ``index`` (to its end when ``stop`` is None), from
        ``shards.open(position)``: the bytes from ``start`` (``first``'s offset, a seek or a ranged
        GET) to ``end`` (``stop``'s, closed by an end-of-archive marker) when the offsets are known,
        else from the shard's start, the samples before ``first`` passed over by header. Then a
        stale count is found where it shows: a shard ending before ``stop``, or holding more
        samples than its count after its last part."""
        c = self.config
        url = self.data.urls[index]
        count = self.data.counts[index] if self.data.counts is not None else None
        at_offset = start is not None
        found = first if at_offset else 0
        layout = self.layout(index, first, stop, start)
        try:
            with stats.io_clock.timed():  # blocked before the first chunk arrives: I/O wait too
                opened = shards.open(position)  # (a part with an end: a tar of its own)
            with opened as f:
                if layout is not None:  # a regular shard: samples cut out by the manifest's member layout
                    patterns, kinds, sizes, offset = layout
                    found = first
                    samples = (sliced_runs if blocks else sliced_samples)(
                        f, url, patterns, kinds, sizes, first=first, offset=offset, want_ext=self.decoder.wants,
                        lowercase=c.lowercase_ext, last=stop == count, clock=stats.io_clock, chunk=shards.chunk)
                else:
                    samples = iter_samples(
                        f, url, keep=lambda i: first <= i and (stop is None or i < stop), want_ext=self.decoder.wants,
                        lowercase=c.lowercase_ext, max_member_bytes=c.max_member_bytes, mark_errors=True,
                        first_index=first if at_offset else 0, clock=stats.io_clock, chunk=shards.chunk)
                for sample in samples:
                    found = sample.first + len(sample) if type(sample) is Run else sample["__index__"] + 1
                    if found <= first:
                        continue  # another worker's sample, passed over by header
                    if stop is not None and found > stop:
                        if stop == count:
                            yield self.stale(url, count, f"at least {found}")
                        return
                    yield sample
        except (ShardFormatError, SourceError) as e:
            yield e
            return
        except DalistreamError as e:
            raise e.at(rank=c.rank, worker=self.worker)
        except (OSError, EOFError) as e:  # I/O errors outside the tar reader (open, close)
            yield read_error(e, url)
            return
        if stop is not None and found < stop:
            yield self.stale(url, count, str(found))

    def layout(self, index: int, first: int, stop: Optional[int], start: Optional[int]) -> Optional[tuple]:
        """``(patterns, each sample's pattern, member sizes, offset of first)`` for samples ``first``
        to ``stop`` of shard ``index`` when they can be cut out by its member layout (a regular
        shard, its part opened at ``first``'s offset, no member over ``max_member_bytes``: that one
        the header path refuses by name, nor two extensions equal once lowercased); else ``None``."""
        members = getattr(self.data.offsets, "members", None)
        if members is None or stop is None or self.data.counts is None or is_gzip_name(self.data.urls[index]):
            return None
        found = members.at(index)
        offset = self.data.offsets.at(index, first)
        if found is None or offset is None or offset != (start or 0) or len(found[1]) != self.data.counts[index]:
            return None
        patterns, kinds, sizes, member_starts = found
        if self.config.lowercase_ext and any(len({e.lower() for e in exts}) < len(exts) for exts, _ in patterns):
            return None  # two members differing only in case: the header walk names the duplicate
        sizes = sizes[member_starts[first]:member_starts[stop]]
        if sizes.size and int(sizes.max()) > self.config.max_member_bytes:
            return None
        return patterns, kinds[first:stop], sizes, offset

    def stale(self, url: str, counted: Optional[int], found: str) -> ManifestError:
        """The error of a shard whose sample count no longer holds (rewritten after it was counted)."""
        source = self.data.count_source or ""
        if source.startswith("header scan"):  # our own count: its cache entry is dropped, so a restart rescans
            forget(url, self.config.cache_dir, self.config.storage_options, self.config.lowercase_ext)
            said, hint = ("it changed after it was counted", "its cached count was dropped: restart to rescan")
        else:  # an index file somebody wrote: restarting reads the same wrong count again
            said, hint = ("the shard and its index disagree (the shard changed after it was indexed, or the index "
                          "was written for other shards)",
                          "rebuild the index: `dalistream index SOURCE` writes a manifest beside the shards")
        return ManifestError(
            f"shard holds {found} samples but {counted} were counted{f' ({source})' if source else ''}: {said}",
            url=url, reason="stale_count", rank=self.config.rank, worker=self.worker, hint=hint,
        )


def problem_first(items: Iterator) -> Iterator:
    """``items`` one behind, except errors, which overtake the item held back.

    The reader yields a shard's last samples and then the error that ends it (or the errors of
    the unreadable shards after it). A worker stops reading once it has the samples its plan
    counted — for a damaged shard, counted up to the damage — so without this it would stop just
    before the error, and never count or report it."""
    held, holding = None, False
    for item in items:
        if isinstance(item, DalistreamError):
            yield item
            continue
        if holding:
            yield held
        held, holding = item, True
    if holding:
        yield held
