"""Bucket plans: which samples form which batch when every batch must hold one bucket. Pure
functions of (counts, every sample's bucket, layout, schedule, epoch, ``per``[, the positions
still to plan after a resume]); no I/O.

**Sequence.** As in :mod:`.ownership`, the epoch's shards are permuted (``seeds.shard_order``)
and laid end to end; what is planned is that sequence (or, after a resume, the part of it not yet
delivered: the elastic resume below). It is read in *columns*, as interleaved reading does
(:attr:`~.layout.Layout.column_layout`): cut into ``R·C`` balanced stretches (``C`` per rank,
default ``2B``: :data:`COLUMNS_PER_POSITION`), column ``q = p·R + r`` read by rank ``r``, so a
rank's columns lie spread over the whole epoch. The plan works on the *reading order*: rank 0's columns, then rank 1's, … .
Bucket ``b``'s samples, in reading order, are its *b-sequence* (``n_b`` samples).

**per="rank"** (each rank's batch one bucket). Units of ``B`` samples of one bucket are a rank
batch. ``exact``: bucket b has ``V_b = ⌈n_b/B⌉`` units (its last one partial, padded), ``N = Σ
V_b``, ``S = ⌈N/R⌉`` steps; ranks get ``S`` or ``S − 1`` units (then one all-padding step at the
end). ``even``: ``V_b ≤ ⌊n_b/B⌋`` full units with ``Σ V_b = R·S``, ``S = ⌊Σ⌊n_b/B⌋ / R⌋``; what
is past ``V_b·B`` in each b-sequence (its tail: different samples each epoch) is left out, less
than one batch per rank of each bucket. Rank ``r`` owns, of every bucket, a run of whole units
of its b-sequence, cut *where the sequence is*: at the position where the units before rank r
are reached, each bucket's count of samples before it is rounded to whole units (largest
remainders, so the units add up). Ranks so read nearly disjoint stretches of the sequence; a
rank's stretch overlaps its neighbour's by less than one unit of each bucket (samples it skips).

Within a rank, its owned samples (in reading order) are split among its ``W`` workers by their
slots; a worker's share is a few of the rank's columns, each a *reader* it reads front to back
(its shard ``parts``), skipping samples that are not its own (``drop``). All the rank's readers
advance in lockstep — reader j's i-th sample at time ``(i+1)/len_j`` — and the rank's batches
form in *completion order* over that merged reading: a bucket's next B samples make a batch when
its B-th arrives. A batch's samples come from whichever workers read them (``take``: how many
each contributes at a step, laid out worker by worker in the batch, ``offset``), so no worker
waits for samples another holds. Bound: at any step a rank's workers hold together at most
``B + (k − 1)(B − 1)`` samples (``k`` the buckets it has): the batch being assembled and less
than one batch of every other bucket; a worker holds its share, about ``1/W`` of that. This
*look-ahead* (the most read and not yet emitted) is computed exactly per worker
(:mod:`.bucketworker`, ``plan --buckets``).

**per="global"** (the whole global batch one bucket). ``exact``: ``V_b = ⌈n_b/(R·B)⌉`` global
steps of bucket b, each rank the balanced share ``⌊n_b(r+1)/R⌋ − ⌊n_b·r/R⌋`` of its b-sequence
(at most ``V_b·B``; its last b-batch padded); ``even``: ``V_b = ⌊n_b/(R·B)⌋``, each rank
``V_b·B``. Within each rank batches form as above; the common order of the ``(b, j)`` batches
is the order in which the last rank completes them. Ranks' shares are cut by the whole data
set's proportions, so their stretches drift apart by about √(samples) of the sequence and the
look-ahead grows with it: it is data-dependent, reported and checked against ``lookahead``.

The order of a rank's buckets across steps is that of the (seeded) epoch sequence: a new shard
order every epoch, so a new bucket order. Every rank computes ``S`` from the per-bucket counts
alone (:func:`bucket_steps`).

**Elastic resume** (:func:`resumed_bucket_plan`): the rest of an epoch after the *segments*
(:mod:`.resume`) that ran under other layouts, planned over a new one. What a segment delivered
is known from the plan alone: the samples of its first ``steps`` batches on every rank
(:meth:`BucketEpoch.rank_batches`). Segment ``k`` plans the positions left after segments ``0 …
k-1`` (those it had left out under ``even`` included) with the same rules (:class:`BucketEpoch`
with ``positions``), so a chain of segments delivers every sample once under ``exact`` and none
twice under ``even``, and every batch of every segment is one bucket.

**A mix** (:class:`BucketMix`): each batch one source *and* one bucket. A stratified mix
(``per_batch="sample"``) cannot hold both unless every source has the same bucket distribution,
which real sources (web photos and book scans, say) do not: it is refused (:func:`check_bucket_mix`).
With ``per_batch="source"`` the two hold together exactly: the mix deals whole batches to the
sources by Tijdeman's rule (:func:`~.mix.cumulative`: after any number of steps each source is
within one batch of its weight), and a source's batches are the batches of its own bucket plan
(:class:`BucketEpoch`, over its own samples, with the mix's layout), taken in its plan's
order. The epoch is the largest number of steps for which no source runs past its plan's steps
(the same on every rank); what a source's plan holds beyond its share is left out of the epoch.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from ..manifest.offsets import running_starts
from .layout import Layout, Schedule
from .bucketseq import BucketIndex, column_counts, cut_before, cuts_of, gather
from .bucketworker import BucketWorkerPlan, holdings, stable_argsort
from .mix import check_options, check_share, cumulative, fitting_steps, source_names
from .ownership import epoch_order, laid_out
from .resume import Segment, Stretch, check_ran, check_segments, runs_to_parts, segment_layout
from .shapes import check_bucket_schedule


#: Columns a rank reads per batch position (default ``C = 2B``). A batch of a bucket holding a
#: share ``p`` of the samples forms over ``B/(p·C)`` lockstep rounds of the rank's columns: with
#: ``C = B`` over ``1/p`` rounds, so a column gives it several samples (one place of the epoch,
#: often one class) and others none — about 63% as many distinct columns as samples, 75–82% of a
#: random order's distinct labels for shares of 10–40%. ``C = 2B`` halves the rounds (93–105%);
#: each worker then reads twice as many stretches, each half as long (more shard parts cut), and
#: holds no more (the look-ahead bound does not depend on ``C``).
COLUMNS_PER_POSITION = 2


def bucket_units(n: np.ndarray, layout: Layout, policy: str, per: str) -> Tuple[np.ndarray, int]:
    """``(V, S)``: units (rank batches for ``per="rank"``, global batches for ``"global"``) of
    each bucket of ``n`` samples, and the steps every rank runs."""
    n = np.asarray(n, dtype=np.int64)
    r, b = layout.world_size, layout.batch_size
    if per == "global":
        v = -(-n // (r * b)) if policy == "exact" else n // (r * b)
        return v, int(v.sum())
    if policy == "exact":
        v = -(-n // b)
        return v, -(-int(v.sum()) // r)
    full = n // b
    steps = int(full.sum()) // r
    drop = int(full.sum()) - r * steps  # fewer than R units left out whole: taken from the largest buckets
    v = full.copy()
    if drop:
        share = full * drop / max(int(full.sum()), 1)
        cut = np.floor(share).astype(np.int64)
        extra = drop - int(cut.sum())
        cut[np.argsort(-(share - cut), kind="stable")[:extra]] += 1
        v -= cut
    return v, steps


def bucket_steps(n: Sequence[int], layout: Layout, schedule: Schedule, per: str = "rank") -> int:
    """Steps of an epoch whose buckets hold ``n`` samples each, the same on every rank."""
    check_bucket_schedule(schedule.policy, per)
    return bucket_units(np.asarray(n, dtype=np.int64), layout, schedule.policy, per)[1]


def bucket_totals(ids: np.ndarray, buckets: int) -> np.ndarray:
    """Samples of each bucket (``ids``: every sample's bucket)."""
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=buckets)[:buckets]


class BucketEpoch:
    """One epoch's bucket plan for every rank and worker (see the module doc), computed once.

    ``counts``: samples per shard; ``ids``: every sample's bucket in written order (shard 0's
    samples, then shard 1's, …), ``0 … buckets-1``; ``positions``: the epoch positions to plan
    (sorted; default all: the unresumed epoch); ``columns``: stretches each rank reads (default
    :data:`COLUMNS_PER_POSITION` per batch position); ``lookahead``: the most
    samples a worker may hold, a :class:`ConfigError` when the plan needs more (``None``: no limit);
    ``ranks``: the ranks whose batches to lay out (default all; a worker needs its own rank's only)."""

    def __init__(self, counts: Sequence[int], ids: np.ndarray, buckets: int, layout: Layout, schedule: Schedule,
                 epoch: int, per: str = "rank", positions: Optional[np.ndarray] = None,
                 lookahead: Optional[int] = None, columns: Optional[int] = None,
                 ranks: Optional[Sequence[int]] = None, index: Optional[BucketIndex] = None) -> None:
        self.ranks = frozenset(range(layout.world_size) if ranks is None else ranks)
        check_bucket_schedule(schedule.policy, per)
        self.counts = np.asarray(counts, dtype=np.int64)
        ids = np.asarray(ids)
        if len(ids) != int(self.counts.sum()):
            raise ConfigError(f"{len(ids)} sample buckets for {int(self.counts.sum())} samples")
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= buckets):
            raise ConfigError(f"sample buckets must be 0 … {buckets - 1}, found {int(ids.min())} … {int(ids.max())}")
        self.layout, self.schedule, self.epoch, self.per, self.buckets = layout, schedule, int(epoch), per, buckets
        self.columns = COLUMNS_PER_POSITION * layout.batch_size if columns is None else columns
        if isinstance(self.columns, bool) or not isinstance(self.columns, int) or self.columns < 1:
            raise ConfigError(f"buckets: columns must be a positive integer, got {columns!r}")
        order = epoch_order(len(self.counts), schedule.seed, epoch, schedule.shuffle_shards)
        self.shards = laid_out(self.counts, order)
        if positions is None:
            self._plan(self._owners(index if index is not None else BucketIndex(self.counts, ids, buckets), order,
                                    self.shards.starts))
        else:  # (the positions still to plan, in order: a sequence of their own, indexed as one shard)
            planned = np.asarray(positions, dtype=np.int64)
            shift = running_starts(self.counts)[order] - self.shards.starts[:-1]  # written minus epoch start
            sample_ids = np.repeat(shift, self.counts[order])[planned] + planned
            owner = self._owners(BucketIndex([len(planned)], ids[sample_ids], buckets), np.zeros(1, dtype=np.int64),
                                 np.array([0, len(planned)], dtype=np.int64))
            self.positions, self.sample_ids = planned[self.positions], sample_ids[self.positions]
            self._plan(owner)
        most = int(self.lookahead.max(initial=0))
        if lookahead is not None and most > lookahead:
            r, w = (int(x) for x in np.unravel_index(int(np.argmax(self.lookahead)), self.lookahead.shape))
            raise ConfigError(f"buckets: worker {w} of rank {r} would hold {most} samples at once (read ahead to fill "
                              f"its batches), more than lookahead={lookahead}",
                              hint="raise lookahead, use fewer or coarser buckets, more workers, a smaller batch"
                                   + (", or per='rank' (its bound is B + (buckets - 1)(B - 1) per rank)"
                                      if per == "global" else ""))

    # -- who owns what ------------------------------------------------------------------------

    def _owners(self, index: BucketIndex, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The rank of every sample laid out (``-1``: left out), from the epoch's column counts
        (:mod:`.bucketseq`): the sequence cut into R·C column stretches, column q = p·R + r read
        by rank r (its C columns spread over the whole sequence), ranks one after the other in
        reading order; laid out, only the samples of the columns its ranks read (or where a cut
        falls) under ``per="rank"``, every sample under ``per="global"`` (each rank's order counts)."""
        layout, c, b = self.layout, self.columns, self.layout.batch_size
        blocks = column_counts(index, order, starts, layout.world_size, c)
        self.totals = blocks.cum[-1]
        self.units, self.steps = bucket_units(self.totals, layout, self.schedule.policy, self.per)
        r = np.arange(layout.world_size + 1, dtype=np.int64)
        if self.per == "rank":
            cuts = cuts_of(self.totals, self.units, layout, self.schedule.policy,
                           lambda cap, t: cut_before(index, order, starts, blocks, layout.world_size, c, cap, t))
            bounds = np.minimum(cuts * b, self.totals[None, :])
        elif self.schedule.policy == "exact":
            bounds = (self.totals[None, :] * r[:, None]) // layout.world_size
        else:
            bounds = r[:, None] * (self.units * b)[None, :]
        self.kept = bounds[-1]
        if len(self.ranks) == layout.world_size or self.per == "global":
            which = np.arange(len(blocks.size))  # (every rank: the left out too)
        else:  # the blocks holding a sample some rank asked for owns
            lo, hi = (bounds[sorted(self.ranks)][:, None, :], bounds[[r + 1 for r in sorted(self.ranks)]][:, None, :])
            which = np.flatnonzero(((blocks.cum[None, :-1] < hi) & (blocks.cum[None, 1:] > lo)).any(axis=(0, 2)))
        got = gather(index, order, starts, blocks, layout.world_size, c, which)
        self.positions, self.column, self.sample_ids, self.seq = got.position, got.column, got.sample_id, got.bucket
        rank = np.empty(len(got.nth), dtype=np.int64)
        for k in range(self.buckets):
            at = got.bucket == k
            rank[at] = np.searchsorted(bounds[:, k], got.nth[at], side="right") - 1
        return np.where(rank < layout.world_size, rank, -1)

    def _plan(self, owner: np.ndarray) -> None:
        layout, b = self.layout, self.layout.batch_size
        self.owner = owner
        by_rank = stable_argsort(owner)
        edges = np.searchsorted(owner[by_rank], np.arange(-1, layout.world_size + 1))
        self.left_out = by_rank[edges[0]:edges[1]]
        slot_starts = np.asarray(layout.slot_offsets + (b,), dtype=np.int64)
        n = len(self.seq)
        self.step_of = np.full(n, -1, dtype=np.int64)
        self.place = np.full(n, -1, dtype=np.int64)  # position in its batch
        self.worker_of = np.full(n, -1, dtype=np.int64)
        self.reader_of = np.full(n, -1, dtype=np.int64)  # the worker's reader (stretch) it is read by
        self.index_of = np.full(n, -1, dtype=np.int64)  # its ordinal among that reader's samples
        self.step_bucket = np.full((layout.world_size, self.steps), -1, dtype=np.int64)
        self.lookahead = np.zeros((layout.world_size, layout.workers), dtype=np.int64)
        merged: List[tuple] = []
        for r in range(layout.world_size):
            own = by_rank[edges[r + 1]:edges[r + 2]]  # sequence indices in reading order
            cut = (len(own) * slot_starts) // b  # its workers' shares, by their slots
            worker = np.repeat(np.arange(layout.workers), np.diff(cut))
            if not len(own) or (r not in self.ranks and self.per == "rank"):  # (global: every rank's order counts)
                merged.append((own[:0], np.zeros(0)))
                continue
            # a worker's readers: its samples of one column each (a stretch of the epoch), in order
            change = np.r_[True, (worker[1:] != worker[:-1]) | (self.column[own][1:] != self.column[own][:-1])]
            reader_global = np.cumsum(change) - 1
            first_of = np.flatnonzero(change)
            index = np.arange(len(own)) - first_of[reader_global]
            size = np.diff(np.r_[first_of, len(own)])[reader_global]
            self.worker_of[own], self.index_of[own] = worker, index
            self.reader_of[own] = reader_global - reader_global[cut[worker]]  # numbered from 0 per worker
            time = (index + 1) / size  # the readers advance in lockstep
            order = np.lexsort((reader_global, time))
            merged.append((own[order], time[order]))
        if self.per == "rank":
            for r, (m, _) in enumerate(merged):
                self._rank_steps(r, m)
        else:
            self._global_steps(merged)
        for r in sorted(self.ranks):
            self._layout_batches(r, by_rank[edges[r + 1]:edges[r + 2]])

    def _units_of(self, m: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For a rank's samples in merged order: each one's bucket, its unit within the bucket
        (k-th B of the bucket's samples), the merged index at which its unit completes (the
        unit's last sample) and its unit's size."""
        b = self.layout.batch_size
        bucket = self.seq[m]
        by = stable_argsort(bucket)  # by[start[k] + j]: the merged index of bucket k's j-th sample
        count = np.bincount(bucket, minlength=self.buckets)
        start = running_starts(count)
        rank_in = np.empty(len(m), dtype=np.int64)
        rank_in[by] = np.arange(len(m)) - np.repeat(start[:-1], count)
        unit = rank_in // b
        end = np.minimum((unit + 1) * b, count[bucket])  # its unit's end within the bucket
        return bucket, unit, by[start[bucket] + end - 1], end - unit * b

    def _rank_steps(self, r: int, m: np.ndarray) -> None:
        """``per="rank"``: rank r's steps in completion order of its units (partial ones last)."""
        if not len(m):
            return
        bucket, unit, last, size = self._units_of(m)
        done = np.where(size == self.layout.batch_size, last, len(m) + bucket)  # partial units after full
        completes = np.zeros(len(m) + self.buckets, dtype=np.int64)  # one unit completes at each merged index
        completes[done] = 1
        batches = int(completes.sum())
        if batches > self.steps:
            raise RuntimeError(f"rank {r}: {batches} batches for {self.steps} steps")  # a defect, never an input
        step = np.cumsum(completes)[done] - 1
        self.step_of[m] = step
        self.step_bucket[r, step] = bucket

    def _global_steps(self, merged: Sequence[tuple]) -> None:
        units = self.units
        base = running_starts(units)
        ready = np.zeros(int(base[-1]), dtype=np.float64)  # (b, j): when the last rank completes it
        per_rank = []
        for m, time in merged:
            if not len(m):
                per_rank.append(None)
                continue
            bucket, unit, last, _ = self._units_of(m)
            g = base[bucket] + unit
            np.maximum.at(ready, g, time[last])
            per_rank.append((m, g))
        schedule = np.lexsort((np.arange(len(ready)), ready))
        step_of_unit = np.empty(len(ready), dtype=np.int64)
        step_of_unit[schedule] = np.arange(len(ready))
        unit_bucket = np.repeat(np.arange(self.buckets), units)
        for r, item in enumerate(per_rank):
            self.step_bucket[r, step_of_unit] = unit_bucket
            if item is not None:
                m, g = item
                self.step_of[m] = step_of_unit[g]

    def _layout_batches(self, r: int, own: np.ndarray) -> None:
        """Batch positions worker by worker (each one's samples in reading order), and each
        worker's look-ahead."""
        if not len(own):
            return
        step, worker, reader, index = self.step_of[own], self.worker_of[own], self.reader_of[own], self.index_of[own]
        # by step, then worker, reader and ordinal: the reading order ``own`` is already ordered by those
        order = stable_argsort(step)
        s = step[order]
        self.place[own[order]] = np.arange(len(own)) - np.searchsorted(s, s, side="left")
        for w in range(self.layout.workers):
            mine = worker == w
            if mine.any():
                self.lookahead[r, w] = int(holdings(reader[mine], index[mine], step[mine], self.steps).max())

    # -- views ----------------------------------------------------------------------------------

    def rank_batches(self) -> np.ndarray:
        """Epoch positions of every rank's batches: ``(ranks, steps, batch_size)``, ``-1`` padding."""
        out = np.full((self.layout.world_size, self.steps, self.layout.batch_size), -1, dtype=np.int64)
        held = self.step_of >= 0
        out[self.owner[held], self.step_of[held], self.place[held]] = self.positions[held]
        return out

    def worker(self, rank: int, worker: int) -> BucketWorkerPlan:
        """The :class:`~.bucketworker.BucketWorkerPlan` of (``rank``, ``worker``)."""
        layout, steps = self.layout, self.steps
        mine = np.flatnonzero((self.owner == rank) & (self.worker_of == worker))  # in reading order
        readers = []
        reader = self.reader_of[mine]  # (increasing: its readers are numbered in reading order)
        edges = np.searchsorted(reader, np.arange(int(reader.max()) + 2 if len(mine) else 1))
        for j in range(len(edges) - 1):
            at = self.positions[mine[edges[j]:edges[j + 1]]]  # increasing: a reader is a stretch of one column
            lo, hi = int(at[0]), int(at[-1]) + 1
            keep = np.zeros(hi - lo, dtype=bool)
            keep[at - lo] = True
            parts, _ = runs_to_parts(self.shards, [Stretch(lo, hi)])
            readers.append((tuple(parts), tuple(np.flatnonzero(~keep).tolist())))
        step = self.step_of[mine]
        order = np.lexsort((self.place[mine], step))
        take = np.bincount(step, minlength=steps)[:steps]
        starts = np.full(steps, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(starts, step, self.place[mine])
        fill = np.bincount(self.step_of[(self.owner == rank) & (self.step_of >= 0)], minlength=steps)[:steps]
        return BucketWorkerPlan(rank, worker, self.epoch, steps, layout.global_worker(rank, worker), tuple(readers),
                                reader[order], self.index_of[mine][order], take, np.where(take > 0, starts, 0),
                                self.step_bucket[rank].copy(), int(self.lookahead[rank, worker]), fill)

    @property
    def left_out_count(self) -> int:
        """Samples of the epoch no rank owns (``even``: the buckets' tails), however few ranks
        were laid out."""
        return int((self.totals - np.minimum(self.kept, self.totals)).sum())


# -- elastic resume --------------------------------------------------------------------------------

def resumed_bucket_plan(counts: Sequence[int], ids: np.ndarray, buckets: int, layout: Layout, schedule: Schedule,
                        epoch: int, per: str, segments: Sequence[Segment], lookahead: Optional[int] = None,
                        ranks: Optional[Sequence[int]] = None, index: Optional[BucketIndex] = None) -> BucketEpoch:
    """The rest of ``epoch`` after ``segments`` (none: the whole epoch, laid out for ``ranks``),
    planned over ``layout`` (see the module doc)."""
    positions: Optional[np.ndarray] = None
    for k, segment in enumerate(check_segments(segments)):
        plan = BucketEpoch(counts, ids, buckets, segment_layout(segment), schedule, epoch, per, positions)
        check_ran(k, segment, plan.steps, "a bucket plan", "this data set and these buckets")
        done = plan.rank_batches()[:, :int(segment[3])]
        positions = np.setdiff1d(plan.positions, done[done >= 0])  # sorted
    return BucketEpoch(counts, ids, buckets, layout, schedule, epoch, per, positions, lookahead, ranks=ranks,
                       index=index)


# -- a mix ---------------------------------------------------------------------------------------

def check_bucket_mix(per_batch: str, samples_per_epoch: Optional[int] = None) -> None:
    """Raise for a mix that cannot be bucketed (see the module doc)."""
    if per_batch == "sample":
        raise ConfigError("buckets with a stratified mix (per_batch='sample') cannot hold both: every batch would need "
                          "each source's share of samples and all of them of one bucket, which only sources with "
                          "the same bucket distribution have",
                          hint="use per_batch='source': each batch then holds one source and one bucket, and the "
                               "sources keep their weighted proportion of batches")
    check_options(per_batch, samples_per_epoch)
    if samples_per_epoch is not None:
        raise ConfigError("buckets with a mix plan default epochs only (no samples_per_epoch)",
                          hint="leave samples_per_epoch out: an epoch then ends when a source has given its share")


class BucketMix:
    """One epoch of a mix with buckets (``per_batch="source"``): ``plans[s]`` is source s's
    :class:`BucketEpoch` (laid out for ``ranks``, default all; ``indexes``: the
    sources' :class:`~.bucketseq.BucketIndex`, if made before); ``source[t]`` and
    ``source_step[t]`` say which source's batch step t is, and which of its plan's steps."""

    def __init__(self, counts: Sequence[Sequence[int]], ids: Sequence[np.ndarray], buckets: int,
                 weights: Sequence[float], layout: Layout, schedule: Schedule, epoch: int, per: str = "rank",
                 names: Optional[Sequence[str]] = None, per_batch: str = "source",
                 samples_per_epoch: Optional[int] = None, ranks: Optional[Sequence[int]] = None,
                 indexes: Optional[Sequence[BucketIndex]] = None) -> None:
        check_bucket_mix(per_batch, samples_per_epoch)
        if not (len(counts) == len(ids) == len(weights)):
            raise ConfigError(f"mix: {len(counts)} sources' counts, {len(ids)} sources' buckets, {len(weights)} weights")
        self.names = source_names(names, len(weights))
        self.layout = layout
        totals = [int(np.sum(c)) for c in counts]
        check_share(weights, totals, layout.batch_size, "source", None, self.names)
        indexes = [None] * len(ids) if indexes is None else indexes
        self.plans: List[BucketEpoch] = [BucketEpoch(c, i, buckets, layout, schedule, epoch, per, ranks=ranks, index=x)
                                         for c, i, x in zip(counts, ids, indexes)]
        limits = np.array([p.steps for p in self.plans], dtype=np.int64)
        # the largest t whose dealt batches stay within every source's plan: batches of one "sample"
        self.steps = fitting_steps(weights, limits, Layout(1, 1, 1), "source")
        if self.steps == 0:
            short = int(np.argmin(limits))
            raise ConfigError(f"mix with buckets: source {self.names[short]!r} has no batch of its own this epoch "
                              f"({totals[short]} samples)", hint="give it more samples or use fewer ranks")
        check_share(weights, totals, layout.batch_size, "source", self.steps, self.names)
        dealt = cumulative(weights, np.arange(self.steps + 1))  # (steps + 1, S)
        step = np.diff(dealt, axis=0)
        self.source = np.argmax(step, axis=1).astype(np.int64)
        self.source_step = dealt[:-1][np.arange(self.steps), self.source]

    def worker(self, rank: int, worker: int) -> Tuple[Tuple[BucketWorkerPlan, ...], np.ndarray, np.ndarray]:
        """Per source its :class:`~.bucketworker.BucketWorkerPlan` (its steps no mix step names are
        not run this epoch), and per mix step the source and the source plan's step."""
        return tuple(p.worker(rank, worker) for p in self.plans), self.source.copy(), self.source_step.copy()
