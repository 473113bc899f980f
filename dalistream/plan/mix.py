"""Mixing weighted sources: pure functions of (counts per source, weights, layout, schedule,
epoch). Three choices make a mix; the names below are this module's functions.

**Weights.** The weights are normalised to sum 1, then followed as exact fractions ``w_s / D``
(:func:`integer_weights`): weights that are simple fractions (0.7/0.3, 1:1:1, 2:5) are kept
exactly; others are rounded to 1/65,536 (largest remainders, every source at least 1/65,536),
so that the rule's table of one period stays small: the proportions are then exact for the
rounded weights, within 2^-17 of the given ones.

**Composition** (:func:`batch_sources`). Every rank's batches hold the same number of samples of
each source. By default (``per_batch="sample"``, stratified) the sample slots of the batches,
n = 0, 1, 2, … (batch t holds slots ``[t·B, (t+1)·B)``), are dealt to the sources one at a time
by Tijdeman's rule: slot n goes, among the sources whose deficit ``p_s·(n+1) − N_s(n)`` is at
least ``1/(2S−2)``, to the one whose next sample is due first (smallest ``(N_s(n) + 1 −
1/(2S−2)) / p_s``; ties to the lower index). So every batch sums to B, and after any number of
slots n every source has within ``1 − 1/(2S−2)`` (< 1) of its ``p_s·n`` samples: over an epoch
the proportions are within one sample per source per rank of the weights, and exact every D
slots. (The plain largest-deficit round robin can drift further: 1.26 samples with weights
821:1:45:1:955:1; Tijdeman's rule cannot.) With ``per_batch="source"`` the same rule deals whole batches:
each batch comes from one source, in the weighted proportion of batches. Within a batch the
positions are laid out source-major (source 0's samples first); worker w's slot takes what falls
in it (:func:`worker_take`), so a worker's slot holds its share of each source and the merge is
unchanged.

**Epoch** (:class:`MixEpoch`). Each source has its own sequence: its shards permuted by
``seeds.source_pass(seed, source, pass)`` and laid end to end, as in :mod:`.ownership`. Global
worker ``g = rank × W + w`` owns one contiguous span of each source's sequence, sized by what
its slot takes of that source over the epoch. By default an epoch is the largest number of
steps for which no source repeats a sample (:func:`mix_steps`); source s's epoch e reads pass e,
and what is past its share is left out. With ``samples_per_epoch=N`` an epoch is
``N // (R·B)`` steps, the slot rule runs on across epochs (epoch e deals batches
``[e·steps, (e+1)·steps)``), and each source reads on through one endless sequence of passes
(pass p: its shards in a new order). With ``U_s(t)`` the samples of s per rank in the first t
steps, epoch e covers positions ``[R·U_s(e·steps), R·U_s((e+1)·steps))`` of that sequence: a
pure function of e. A source that runs out starts its next pass; one larger than its share goes
on through its data over the following epochs; nothing is read twice before everything was read
once. A span that crosses the end of a pass reads its parts of pass p, then its parts of pass
p+1 (and on, for a source smaller than its share of an epoch); ``passes`` says which pass each
part is of. Every rank computes the steps from the counts alone, so all run the same number.

**Worked example.** B = 256, weights 0.7/0.3 (exact: 7/10 and 3/10, shares 179.2/76.8 per
batch). Slot by slot the rule deals web, books, web, web, web, books, web, web, books, web,
then again (period 10); batch by batch the counts are 179/77, 179/77, 180/76, 179/77, 179/77,
then again (every 5 batches exactly 896/384; after any batch each source is within 1 of its
share). With W = 4
workers (slots of 64), workers 0 and 1 take 64 web samples per step, worker 2 takes 51 (or 52)
web and 13 (or 12) books, worker 3 takes 64 books. On R = 8 ranks with 1,000,000 web and 300,000
books samples, the default epoch is 488 steps: books limits it (8 × 37,478 = 299,824 ≤ 300,000
after 488 steps, 489 would need 300,440); web reads 8 × 87,450 = 699,600 and leaves 300,400 out.
With ``samples_per_epoch=1_000_000`` (also 488 steps) nothing is left out: epoch 1 reads web
positions 699,600 … 1,399,191, the last 300,400 of pass 0 then the first 399,192 of pass 1, and
books' pass 0 ends after 176 samples of epoch 1.

**Columns.** Read interleaved (the default, as for one data set), a worker's share of a source
is cut into one *column* per position of the share (:func:`column_takes`), laid over the source's
sequence as a rank's columns are for one data set (:func:`column_sizes`); read in spans, one span.

**Elastic resume** (:class:`MixEpoch` with ``segments``). Per source the rule of :mod:`.resume`,
a past worker having delivered what its slot took of the source: each source's remaining
sequence is a :class:`~.resume.Remaining`. The rule (:func:`cumulative`) goes on after the units
already dealt, in batches of the new size, so every prefix of the epoch stays within one unit of
the weights; the rest is the largest number of steps in which no source runs past its remaining
samples. With ``samples_per_epoch`` level 0 is the epoch's range of each source's passes from its
cursor, and a span may cross a pass's end.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from functools import lru_cache, reduce
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from ..manifest.offsets import running_starts
from . import seeds
from .layout import Layout, Schedule
from .ownership import EpochLayout, Part, WorkerPlan, epoch_order, laid_out
from .resume import Remaining, Stretch, check_ran, segment_layout

PER_BATCH = ("sample", "source")
MAX_DENOMINATOR = 1 << 16


def integer_weights(weights: Sequence[float]) -> Tuple[int, ...]:
    """The weights as integers ``w_s`` with ``p_s = w_s / D``, ``D = Σ w_s`` (see the module doc)."""
    p = np.asarray(weights, dtype=np.float64)
    if p.ndim != 1 or len(p) == 0 or not np.all(np.isfinite(p)) or np.any(p <= 0):
        raise ConfigError(f"mix: weights must be finite numbers greater than 0, got {list(weights)!r}")
    p = p / p.sum()
    fractions = [Fraction(float(x)).limit_denominator(1000) for x in p]
    if sum(fractions) == 1 and all(f > 0 and abs(float(f) - x) <= 1e-9 for f, x in zip(fractions, p)):
        d = reduce(lambda a, b: a * b // math.gcd(a, b), (f.denominator for f in fractions), 1)
        if d <= MAX_DENOMINATOR:
            return tuple(int(f * d) for f in fractions)
    raw = p * MAX_DENOMINATOR
    w = np.maximum(np.floor(raw).astype(np.int64), 1)
    short = MAX_DENOMINATOR - int(w.sum())
    if short > 0:
        w[np.argsort(-(raw - np.floor(raw)), kind="stable")[:short]] += 1
    elif short < 0:  # only when tiny weights were raised to 1: take from the largest
        w[np.argsort(-w, kind="stable")[:-short]] -= 1
    g = reduce(math.gcd, w.tolist())
    return tuple(int(x) // g for x in w)


def raised_by(weights: Sequence[float], source: int, batch_size: int) -> Optional[float]:
    """By how much source ``source``'s weight must be multiplied (the others kept) for half a
    sample per batch (:func:`check_share`) after :func:`integer_weights`' rounding (3 digits, up);
    ``None`` when the others would then fall short (more sources than a batch holds halves of)."""
    p = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    factor = (1.0 - p[source]) / ((2 * batch_size - 1) * p[source])  # x / (x + others) = 1 / (2B)
    for _ in range(100):  # the rounding to 1/65,536 may cost a unit: the next 3-digit value until it passes
        step = 10.0 ** (math.floor(math.log10(factor)) - 2)
        factor = float(f"{math.ceil(factor / step - 1e-9) * step:.3g}")
        w = integer_weights(np.where(np.arange(len(p)) == source, p * factor, p))
        if 2 * w[source] * batch_size >= sum(w):
            return factor if all(2 * x * batch_size >= sum(w) for x in w) else None
        factor += step
    return None


@lru_cache(maxsize=8)
def _period(w: Tuple[int, ...]) -> np.ndarray:
    """``N_s(n)`` for n = 0 … D under Tijdeman's rule: ``(D + 1, S)``. At n = D every source has
    exactly ``w_s`` (it is within 1 of an integer), so the table repeats every D slots."""
    size, d = len(w), sum(w)
    out = np.zeros((d + 1, size), dtype=np.int64)
    if size == 1:
        out[:, 0] = np.arange(d + 1)
        return out
    k = 2 * size - 2  # everything scaled by k·D to stay in integers
    have = [0] * size
    picks = np.empty(d, dtype=np.int64)
    for n in range(1, d + 1):
        best, due, weight = -1, 0, 1
        for s in range(size):
            if k * (w[s] * n - have[s] * d) >= d:
                key = k * have[s] + k - 1  # due at key / (k·p_s): compare key/w_s across sources
                if best < 0 or key * weight < due * w[s]:
                    best, due, weight = s, key, w[s]
        if best < 0:  # never, by Tijdeman's theorem; a defined choice rather than a wrong index
            best = max(range(size), key=lambda s: (w[s] * n - have[s] * d, -s))
        have[best] += 1
        picks[n - 1] = best
    np.cumsum(np.eye(size, dtype=np.int64)[picks], axis=0, out=out[1:])
    out.setflags(write=False)
    return out


def cumulative(weights: Sequence[float], n: Any) -> np.ndarray:
    """``N_s(n)``: units of each source among the first ``n`` dealt (``n`` an int or an array of
    them; the result has one more axis, of length S)."""
    w = integer_weights(weights)
    table = _period(w)
    q, r = np.divmod(np.asarray(n, dtype=np.int64), sum(w))
    return q[..., None] * np.asarray(w, dtype=np.int64) + table[r]


def check_options(per_batch: str, samples_per_epoch: Optional[int] = None) -> None:
    """Raise :class:`~dalistream.errors.ConfigError` for a mix's ``per_batch`` or
    ``samples_per_epoch`` (``None``: set by the weights) that no plan can take."""
    if per_batch not in PER_BATCH:
        raise ConfigError(f"mix: per_batch must be one of {PER_BATCH}, got {per_batch!r}")
    if samples_per_epoch is not None and (isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, int)
                                          or samples_per_epoch < 1):
        raise ConfigError(f"mix: samples_per_epoch must be a positive integer, got {samples_per_epoch!r}")


def batch_sources(weights: Sequence[float], batch_size: int, steps: int, per_batch: str = "sample",
                  dealt: int = 0) -> np.ndarray:
    """Samples of each source in each of ``steps`` rank batches after ``dealt`` units of the
    rule (sample slots; whole batches for ``"source"``; see the module doc): an int64 array
    ``(steps, S)``, the same on every rank; every row sums to ``batch_size``."""
    check_options(per_batch)
    return np.diff(_used(weights, np.arange(int(steps) + 1, dtype=np.int64), int(batch_size), per_batch, dealt), axis=0)


def worker_take(counts_per_step: np.ndarray, layout: Layout) -> np.ndarray:
    """``(steps, W, S)``: samples of each source worker w takes at each step. A batch's positions
    are source-major (source 0's count first); worker w's slot ``[offset_w, offset_w + slot_w)``
    takes what falls in it, so the sum over sources is its slot at every step."""
    counts = np.asarray(counts_per_step, dtype=np.int64)
    edges = np.zeros((counts.shape[0], counts.shape[1] + 1), dtype=np.int64)
    np.cumsum(counts, axis=1, out=edges[:, 1:])
    first = np.asarray(layout.slot_offsets, dtype=np.int64)[None, :, None]
    stop = first + np.asarray(layout.slots, dtype=np.int64)[None, :, None]
    lo = np.maximum(edges[:, None, :-1], first)
    hi = np.minimum(edges[:, None, 1:], stop)
    return np.maximum(hi - lo, 0).astype(np.int32)  # at most B: int32 halves (steps, W, S)


def source_names(names: Optional[Sequence[str]], size: int) -> List[str]:
    """The sources' names for messages (default ``source 0``, ``source 1``, …)."""
    return [f"source {i}" for i in range(size)] if names is None else [str(n) for n in names]


def check_share(weights: Sequence[float], totals: Sequence[int], batch_size: int, per_batch: str = "sample",
                steps: Optional[int] = None, names: Optional[Sequence[str]] = None) -> None:
    """Raise, naming the source, for an empty source (0 samples) and for a source whose share
    rounds to zero: stratified, fewer than half a sample per batch (``p_s·B < 1/2``, so most
    batches would hold none of it); ``per_batch="source"`` with ``steps`` known, fewer than half
    a batch per epoch. A share of half a sample or more is kept: the source is then in some
    batches and not others, in its exact proportion."""
    check_options(per_batch)
    w = integer_weights(weights)
    d, names = sum(w), source_names(names, len(w))
    for s, total in enumerate(totals):
        if int(total) <= 0:
            raise ConfigError(f"mix: source {names[s]!r} is empty (0 samples)",
                              hint="check its shards and manifest, or leave it out of the mix")
        if per_batch == "sample" and 2 * w[s] * batch_size < d:
            factor = raised_by(weights, s, batch_size)
            raise ConfigError(f"mix: source {names[s]!r}: weight {w[s] / d:.4g} of the mix is {w[s] * batch_size / d:.3g} "
                              f"samples per batch of {batch_size}, which rounds to 0",
                              hint=(f"raise its weight at least {factor:.3g}-fold (to 1/{2 * batch_size - 1} of the "
                                    "other sources' weights together: half a sample per batch), " if factor else "")
                              + f"use batch_size={-(-d // (2 * min(w)))} or more, or per_batch='source'")
        if per_batch == "source" and steps is not None and 2 * w[s] * steps < d:
            raise ConfigError(f"mix: source {names[s]!r}: weight {w[s] / d:.4g} is {w[s] * steps / d:.3g} batches "
                              f"per epoch of {steps} steps, which rounds to 0",
                              hint="give it a larger weight or make the epoch longer (samples_per_epoch)")


def _used(weights: Sequence[float], t: Any, batch_size: int, per_batch: str, dealt: int = 0) -> np.ndarray:
    """Samples of each source per rank in the first ``t`` steps (an int or an array) after
    ``dealt`` units of the rule (sample slots, or whole batches for ``per_batch="source"``)."""
    if per_batch == "sample":
        return cumulative(weights, int(dealt) + np.asarray(t, dtype=np.int64) * batch_size)
    return cumulative(weights, int(dealt) + np.asarray(t, dtype=np.int64)) * batch_size


def fitting_steps(weights: Sequence[float], totals: Sequence[int], layout: Layout, per_batch: str = "sample",
                  dealt: int = 0) -> int:
    """The largest t for which no source's samples in the next t steps after ``dealt`` units of
    the rule, on all ranks, exceed ``totals[s]`` (they grow with t; t ≤ Σ totals / (R·B))."""
    r, b = layout.world_size, layout.batch_size
    totals = np.asarray(totals, dtype=np.int64)
    before = _used(weights, 0, b, per_batch, dealt)
    lo, hi = 0, int(totals.sum()) // (r * b) + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if np.all(r * (_used(weights, mid, b, per_batch, dealt) - before) <= totals):
            lo = mid
        else:
            hi = mid - 1
    return lo


def mix_steps(totals: Sequence[int], weights: Sequence[float], layout: Layout, per_batch: str = "sample",
              samples_per_epoch: Optional[int] = None, names: Optional[Sequence[str]] = None) -> int:
    """Steps of an epoch, the same on every rank: ``samples_per_epoch // (R·B)``, or by default
    the largest t for which ``R × (samples of s in the first t steps) ≤ T_s`` for every source."""
    check_options(per_batch, samples_per_epoch)
    per_step = layout.world_size * layout.batch_size
    names = source_names(names, len(totals))
    if samples_per_epoch is not None:
        if samples_per_epoch < per_step:
            raise ConfigError(f"mix: samples_per_epoch {samples_per_epoch} is less than one step "
                              f"({layout.world_size} ranks x batch {layout.batch_size} = {per_step})")
        return samples_per_epoch // per_step
    steps, r, b = fitting_steps(weights, totals, layout, per_batch), layout.world_size, layout.batch_size
    if not steps:
        need = r * _used(weights, 1, b, per_batch)
        limit = int(np.flatnonzero(need > np.asarray(totals, dtype=np.int64))[0])
        need = int(need[limit])
        raise ConfigError(f"mix: source {names[limit]!r} has {int(totals[limit])} samples, fewer than its share of one "
                          f"step on {r} ranks ({need})",
                          hint="give samples_per_epoch, so that a small source starts a new pass when it runs out, "
                               "or lower its weight")
    return steps


# -- columns ---------------------------------------------------------------------------------------

def column_takes(take: np.ndarray, interleave: bool) -> np.ndarray:
    """``(steps, K)``: what each of a worker's columns of one source takes at each step, from its
    share ``take`` (``(steps,)``): one column of the whole share (a span), or, interleaved, one
    column per position of the share, taking one sample a step while the share reaches it."""
    take = np.asarray(take, dtype=np.int64)
    if not interleave:
        return take[:, None]
    return (take[:, None] > np.arange(int(take.max(initial=0)))[None, :]).astype(np.int64)


def column_sizes(take: np.ndarray, layout: Layout, interleave: bool,
                 ks: Optional[Sequence[int]] = None) -> Tuple[List[np.ndarray], List[int]]:
    """Per source, the samples of each of its columns over ``take`` (``(steps, W, S)``), columns
    ``c = (k·W + w)·R + r`` (:func:`column_index`: ``k``, the column of worker ``w``'s share; as for
    one data set, a position's columns of the ``R`` ranks lie side by side, so a rank's columns lie
    ``R`` spans apart, spread over the source's sequence); a worker without a ``k``-th column has
    one of size 0. Without ``interleave`` the columns are the workers' spans (``c = g``). And the
    number of ``k`` per source (``ks``: given, for the steps of a plan that has them)."""
    out, counts = [], []
    for s in range(take.shape[2]):
        per_worker = [column_takes(take[:, w, s], interleave).sum(axis=0) for w in range(layout.workers)]
        k = (max((len(p) for p in per_worker), default=0) if interleave else 1) if ks is None else int(ks[s])
        counts.append(k)
        sizes = np.zeros((k, layout.workers, layout.world_size), dtype=np.int64)
        for w in range(layout.workers):
            p = per_worker[w][:k]
            sizes[:len(p), w, :] = p[:, None]
        out.append(sizes.ravel() if interleave else sizes.transpose(2, 1, 0).ravel())  # (spans: g = r·W + w)
    return out, counts


def column_index(layout: Layout, rank: int, worker: int, k: int, interleave: bool) -> int:
    """The index of worker ``worker`` of ``rank``'s ``k``-th column of a source (:func:`column_sizes`)."""
    if not interleave:
        return layout.global_worker(rank, worker)
    return (k * layout.workers + worker) * layout.world_size + rank


# -- the epoch -------------------------------------------------------------------------------------

class MixEpoch:
    """One epoch of a mix, planned once for every worker (cheap: O(steps × W × S + shards)), or
    its rest after ``segments`` ran under other layouts, delivered through buffers of ``shuffle``
    (the module doc); :meth:`worker_columns` gives what one worker reads. ``counts[s]`` are source
    s's per-shard sample counts, ``weights[s]`` its weight (any positive scale)."""

    def __init__(self, counts: Sequence[Sequence[int]], weights: Sequence[float], layout: Layout,
                 schedule: Schedule, epoch: int, names: Optional[Sequence[str]] = None, per_batch: str = "sample",
                 samples_per_epoch: Optional[int] = None, interleave: bool = False, segments: Sequence = (),
                 shuffle: int = 0) -> None:
        if len(counts) != len(weights) or (names is not None and len(names) != len(weights)):
            raise ConfigError(f"mix: {len(counts)} sources' counts for {len(weights)} weights")
        self.counts = [np.asarray(c, dtype=np.int64) for c in counts]
        self.weights, self.layout, self.schedule, self.epoch = list(weights), layout, schedule, int(epoch)
        self.names, self.per_batch = source_names(names, len(weights)), per_batch
        self.totals = [int(c.sum()) for c in self.counts]
        self.endless, self.interleave = samples_per_epoch is not None, bool(interleave)
        self._passes: Dict[Tuple[int, int], EpochLayout] = {}
        self.rest: Optional[List[Remaining]] = None  # each source's sequence left after ``segments``
        if segments:
            self._resumed(segment_layout(segments[0]), samples_per_epoch, segments, shuffle)
            return
        check_share(weights, self.totals, layout.batch_size, per_batch, None, self.names)
        self.steps = mix_steps(self.totals, weights, layout, per_batch, samples_per_epoch, self.names)
        check_share(weights, self.totals, layout.batch_size, per_batch, self.steps, self.names)
        first = self.epoch * self.steps if self.endless else 0
        cursor = layout.world_size * _used(weights, first, layout.batch_size, per_batch)  # (zeros unless endless)
        # each source's columns (interleaved; else the workers' spans): their bounds in its sequence
        self.columns, self.take, self.batch_counts = self._laid(self.steps, self._units(first, layout), layout, cursor)
        self.bounds = np.array(_edges(column_sizes(self.take, layout, False)[0], cursor))  # (S, R·W + 1)

    def _resumed(self, past: Layout, samples_per_epoch: Optional[int], segments: Sequence, shuffle: int) -> None:
        """The rest of the epoch after ``segments`` (the first ran ``past``): each source's
        remaining sequence, and this layout's columns over it from the rule's units dealt."""
        schedule, epoch, per_batch = self.schedule, self.epoch, self.per_batch
        first = MixEpoch(self.counts, self.weights, past, schedule, epoch, self.names, per_batch, samples_per_epoch,
                         self.interleave)
        # level 0, per source: the epoch's positions from its cursor (default epochs: the whole pass
        # from 0, its tail no one owned included; samples_per_epoch: the epoch's range of the passes)
        self.base = first.bounds[:, 0].copy()
        lengths = self.totals if not self.endless else (first.bounds[:, -1] - first.bounds[:, 0]).tolist()
        rem = [Remaining(int(n), schedule, epoch, shuffle) for n in lengths]
        # the rule's units dealt before this epoch: it runs on across epochs with samples_per_epoch
        n0 = self._units(epoch * first.steps if self.endless else 0, past)
        for level, segment in enumerate(tuple(segments) + (None,)):  # each segment's layout, then this one
            past = self.layout if segment is None else segment_layout(segment)
            if level == 0:
                bounds, take, planned = [b - b[0] for b in first.columns], first.take, first.steps
            else:  # the most steps in which no source runs past its remaining samples
                planned = fitting_steps(self.weights, [r.total for r in rem], past, per_batch, n0)
                bounds, take, _ = self._laid(planned, n0, past)
            if segment is None:
                break
            ran = int(segment[3])
            check_ran(level, segment, planned, of="this mix")
            ks = [(len(b) - 1) // past.global_workers for b in bounds]
            done, _ = column_sizes(take[:ran], past, self.interleave, ks)  # per source: delivered per column
            rem = [Remaining.after(rem[s], bounds[s], done[s],
                                   lambda c, s=s, level=level: seeds.segment_source_shuffle(schedule.seed, epoch, level, s, c))
                   for s in range(len(rem))]
            n0 += self._units(ran, past)
        self.rest, self.level = rem, len(segments)
        self.columns, self.take, self.steps = bounds, take, planned

    def _laid(self, steps: int, n0: int, layout: Layout,
              cursor: Any = 0) -> Tuple[List[np.ndarray], np.ndarray, np.ndarray]:
        """``(per source its columns' bounds from its ``cursor``, take (steps, W, S), batch counts
        (steps, S))`` of ``steps`` steps of ``layout`` from unit ``n0`` of the rule."""
        counts = batch_sources(self.weights, layout.batch_size, steps, self.per_batch, n0)
        take = worker_take(counts, layout)
        return _edges(column_sizes(take, layout, self.interleave)[0], cursor), take, counts

    def _units(self, steps: int, layout: Layout) -> int:
        """The rule's units dealt in ``steps`` steps of ``layout``: sample slots, or whole batches."""
        return steps * layout.batch_size if self.per_batch == "sample" else steps

    def first_pass(self, source: int) -> int:
        """The pass that position 0 of ``source``'s spans is in (default: the epoch's)."""
        return 0 if self.endless else self.epoch

    def pass_layout(self, source: int, n_pass: int) -> EpochLayout:
        """Pass ``n_pass`` of ``source``: its shard order and starts (bounds and steps not set)."""
        key = (source, n_pass)
        if key not in self._passes:
            self._passes[key] = laid_out(self.counts[source], epoch_order(
                len(self.counts[source]), self.schedule.seed, n_pass, self.schedule.shuffle_shards, source))
        return self._passes[key]

    def spans_parts(self, source: int, spans: Sequence[int],
                    bounds: Optional[np.ndarray] = None) -> List[Tuple[List[Part], List[int]]]:
        """Per span of ``spans`` (of ``bounds``, by default the workers' spans: ``self.bounds[source]``),
        its parts of ``source`` in reading order and the pass of each, all worked out together, a
        pass at a time (a worker reading a mix interleaved plans a column per position of its slot
        every epoch: one cut of each pass for all of them, not one per column)."""
        bounds = self.bounds[source] if bounds is None else bounds
        total = self.totals[source]
        out: List[Tuple[List[Part], List[int]]] = [([], []) for _ in spans]
        at = np.asarray(spans, dtype=np.int64)
        lo, hi = bounds[at], bounds[at + 1]
        real = hi > lo
        if not real.any():
            return out
        first, last = lo // total, (hi - 1) // total
        for p in range(int(first[real].min()), int(last[real].max()) + 1):
            which = np.flatnonzero(real & (first <= p) & (p <= last)).tolist()
            if not which:
                continue
            n_pass = self.first_pass(source) + p
            cut = replace(self.pass_layout(source, n_pass), bounds=np.clip(bounds - p * total, 0, total))
            for i, parts in zip(which, cut.parts_of(at[which])):
                out[i][0].extend(parts)
                out[i][1].extend([n_pass] * len(parts))
        return out

    def rest_parts(self, s: int, runs: Sequence[Sequence[Stretch]]) -> List[Tuple[List[Part], List[int]]]:
        """Per column, the parts and drops of its ``runs`` (level-0 positions of source ``s`` after a
        resume), all runs cut together as :meth:`spans_parts` cuts spans: a run crossing the end of a
        pass reads the pass's last parts, then the next pass's first."""
        flat = [run for column in runs for run in column]
        edges = int(self.base[s]) + np.array([(run.start, run.stop) for run in flat], dtype=np.int64).reshape(-1)
        cut = iter(self.spans_parts(s, range(0, len(edges), 2), edges))
        out = []
        for column in runs:
            parts: List[Part] = []
            drop: List[int] = []
            raw = 0  # samples of the column's runs before this one
            for run, (got, _) in zip(column, cut):
                parts += [p for p in got if p[2] > p[1]]  # (an empty shard is no part of a run)
                drop += [raw + d - run.start for d in run.drop]
                raw += run.stop - run.start
            out.append((parts, drop))
        return out

    def worker_columns(self, rank: int, worker: int) -> List[Tuple[WorkerPlan, np.ndarray, int]]:
        """What (``rank``, ``worker``) reads: per source, each of its columns (its span, or its
        share's interleaved columns) as ``(plan, take per step, source)``, sources in order; after a
        resume, the columns of each source's rest, passing over what was delivered (drops), each
        with its segment's seed."""
        layout, seed = self.layout, self.schedule.seed
        out = []
        for s in range(self.take.shape[2]):
            takes = column_takes(self.take[:, worker, s], self.interleave)
            spans = [column_index(layout, rank, worker, k, self.interleave) for k in range(takes.shape[1])]
            bounds = self.columns[s]
            if self.rest is None:
                cut = [(parts, []) for parts, _ in self.spans_parts(s, spans, bounds)]
            else:
                cut = self.rest_parts(s, [self.rest[s].runs(int(bounds[c]), int(bounds[c + 1])) for c in spans])
            for k, (c, (parts, drop)) in enumerate(zip(spans, cut)):
                shuffle_seed = (seeds.source_shuffle(seed, self.epoch, s, c) if self.rest is None
                                else seeds.segment_source_shuffle(seed, self.epoch, self.level, s, c))
                plan = WorkerPlan(rank, worker, self.epoch, tuple(parts), self.steps, layout.slots[worker],
                                  layout.slot_offsets[worker], int(bounds[c + 1] - bounds[c]),
                                  layout.global_worker(rank, worker), 0, tuple(drop), shuffle_seed)
                out.append((plan, takes[:, k], s))
        return out


def _edges(sizes: Sequence[np.ndarray], cursor: Any) -> List[np.ndarray]:
    """Per source, the bounds of consecutive stretches of ``sizes`` from its ``cursor`` (one, or one for all)."""
    return [int(c) + running_starts(z) for c, z in zip(np.broadcast_to(cursor, len(sizes)), sizes)]
