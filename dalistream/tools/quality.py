"""``dalistream plan --shuffle-quality``: shuffle quality without reading data: the exact order in which every rank's batches receive
samples is a pure function of (counts, layout, schedule, epoch, shuffle buffer size), so the
labels a batch holds can be computed for a labelling of the samples (class-sorted by default:
``label = position × classes / samples``, what a naive folder conversion writes) and compared
with a random order of the same samples.

The worker's order is reproduced from its parts: global worker ``g`` reads its span of the
epoch's sample sequence (:mod:`dalistream.plan.ownership`; under ``even``, of the samples kept) and shuffles it through :func:`dalistream.plan.shuffle.shuffled`,
the same function the worker runs, fed indices instead of samples; ``columns=True`` reproduces
interleaved reading (the default of training streams: :attr:`dalistream.plan.Layout.column_layout`).
``interleave=k > 1`` and ``spread`` are the design study's candidates that led to it (see
:func:`worker_streams`); the worker does not read them.

Sample ids are positions in the shards' written order (shard 0's samples, then shard 1's, …).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..errors import ConfigError
from ..plan import seeds
from ..plan.affinity import AffinePlan, Nodes, node_owner
from ..plan.layout import Layout, Schedule
from ..plan.mix import column_index, column_takes
from ..plan.ownership import EpochLayout, epoch_layout
from ..plan.resume import Stretch
from ..plan.shuffle import shuffled


def worker_streams(plan: EpochLayout, layout: Layout, interleave: int = 1, spread: bool = False) -> List[np.ndarray]:
    """Positions of the epoch's sample sequence in the order each global worker reads them,
    before its shuffle buffer.

    ``interleave=1``: today's reading, span ``g`` front to back. ``interleave=k``: candidate
    ordering: the owned sequence is cut into ``k`` blocks, each split among the global workers
    like the whole one (worker ``g`` keeps its span's length, one ``k``-th in each block), so a
    worker owns ``k`` sub-spans ``≈ T/k`` apart, reads them ``k`` at once and feeds its buffer
    one sample from each in turn. ``spread=True``: candidate placement: in each block the pieces
    are laid out worker-major (``w``, then ``rank``) instead of rank-major, so the ``W`` workers of
    a rank read far-apart places too (a rank batch draws from ``W × k`` places, not one)."""
    if isinstance(interleave, bool) or not isinstance(interleave, int) or interleave < 1:
        raise ConfigError(f"interleave must be a positive integer, got {interleave!r}")
    bounds = plan.bounds
    if interleave == 1 and not spread:
        return [np.arange(bounds[g], bounds[g + 1], dtype=np.int64) for g in range(len(bounds) - 1)]
    k = interleave
    lengths = np.diff(bounds)
    b = np.arange(k + 1, dtype=np.int64)[:, None]
    pieces = np.diff((b * lengths[None, :]) // k, axis=0)  # (k, G): g's piece in block b
    placed = np.arange(len(lengths))
    if spread:  # g = r × W + w laid out in the order of (w, r)
        placed = placed.reshape(layout.world_size, layout.workers).T.ravel()
    flat = np.zeros(pieces.size, dtype=np.int64)
    np.cumsum(pieces[:, placed].ravel()[:-1], out=flat[1:])
    heads = np.empty_like(pieces)
    heads[:, placed] = flat.reshape(pieces.shape) + bounds[0]  # block-major: block 0's pieces, then block 1's
    streams = []
    for g in range(len(bounds) - 1):
        n = pieces[:, g]
        block = np.repeat(np.arange(k), n)
        within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        order = np.argsort(within * k + block, kind="stable")  # round robin over the k sub-spans
        streams.append((heads[block, g] + within)[order])
    return streams


def rank_batches(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int, buffer: int,
                 interleave: int = 1, spread: bool = False, columns: bool = False) -> np.ndarray:
    """Sample ids of every rank's batches in ``epoch``: an array ``(ranks, steps, batch_size)``,
    ``-1`` where a batch is padded (``exact``). Position ``offset(w) + i`` of a batch holds worker
    ``w``'s ``i``-th sample of that step, as the loader delivers it. ``columns``: interleaved
    reading, as the worker does it (position ``p`` of rank ``r`` is column ``p·R + r``'s
    sample of the step; no buffer)."""
    if schedule.policy == "fixed":
        raise ConfigError("the shuffle-quality measure covers policies 'even' and 'exact'",
                          hint="measure with --policy even: 'fixed' reads the same spans")
    counts = np.asarray(counts, dtype=np.int64)
    plan = epoch_layout(counts, layout.planned(columns), schedule, epoch)
    written = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=written[1:])
    # sequence position -> sample id: shard order[i] starts at written[order[i]]
    shift = np.repeat(written[plan.order] - plan.starts[:-1], counts[plan.order])
    ids = shift + np.arange(plan.total, dtype=np.int64)
    steps = plan.steps
    out = np.full((layout.world_size, steps, layout.batch_size), -1, dtype=np.int64)
    if columns:  # column q = p·R + r: its span's t-th sample at step t
        sizes = np.diff(plan.bounds)
        t = np.arange(steps, dtype=np.int64)
        at = plan.bounds[:-1, None] + t[None, :]  # (R·B, steps), over the samples kept
        real = t[None, :] < sizes[:, None]
        kept = max(int(plan.bounds[-1]) - 1, 0)
        cols = np.where(real, ids[np.minimum(plan.position(np.minimum(at, kept)), max(plan.total - 1, 0))], -1)
        return cols.reshape(layout.batch_size, layout.world_size, steps).transpose(1, 2, 0).copy()
    for g, stream in enumerate(worker_streams(plan, layout, interleave, spread)):
        r, w = divmod(g, layout.workers)
        slot, lo = layout.slots[w], layout.slot_offsets[w]
        pick = np.fromiter(shuffled(range(len(stream)), buffer, seeds.sample_shuffle(schedule.seed, epoch, g)),
                           dtype=np.int64, count=len(stream))
        emitted = np.full(steps * slot, -1, dtype=np.int64)
        n = min(len(stream), steps * slot)
        emitted[:n] = ids[plan.position(stream[pick[:n]])]  # samples kept -> epoch positions
        out[r, :, lo:lo + slot] = emitted.reshape(steps, slot)
    return out


def sorted_labels(total: int, classes: int) -> np.ndarray:
    """Class-sorted labelling: sample id ``i`` has label ``i × classes // total``."""
    if classes < 1:
        raise ConfigError(f"classes must be a positive integer, got {classes!r}")
    return np.arange(total, dtype=np.int64) * classes // max(total, 1)


def batch_label_stats(labels: np.ndarray) -> Dict[str, np.ndarray]:
    """Distinct labels and entropy (bits) of every row of ``labels`` (``-1``: padding, left out)."""
    rows = labels.reshape(labels.shape[0], -1)
    s = np.sort(rows, axis=1)
    real = s >= 0
    first = np.ones_like(real)
    first[:, 1:] = s[:, 1:] != s[:, :-1]
    first &= real
    distinct = first.sum(axis=1)
    # run lengths of equal labels, row by row
    r_idx, c_idx = np.nonzero(first)
    ends = np.append(c_idx[1:], 0)
    last = np.append(r_idx[1:] != r_idx[:-1], True)
    ends = np.where(last, rows.shape[1], ends)  # a row's last run ends with the row
    runs = (ends - c_idx).astype(np.float64)
    size = real.sum(axis=1).astype(np.float64)
    p = runs / np.maximum(size[r_idx], 1.0)
    entropy = np.zeros(rows.shape[0])
    np.add.at(entropy, r_idx, -p * np.log2(p))
    return {"distinct": distinct, "entropy": entropy}


def _summary(stats: Dict[str, np.ndarray]) -> Dict[str, float]:
    return {"distinct": float(stats["distinct"].mean()), "distinct_min": int(stats["distinct"].min()),
            "entropy": float(stats["entropy"].mean())}


def shuffle_quality(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int, buffer: int,
                    classes: int = 100, labels: Optional[np.ndarray] = None, interleave: int = 1,
                    spread: bool = False, columns: bool = False) -> Dict[str, Any]:
    """Mean distinct labels and entropy per rank batch and per global batch (all ranks' batches
    of one step), for this order and for a random order of the same samples in batches of the
    same shapes (``random``; seeded by ``seed`` and ``epoch``). ``labels[i]`` is sample id
    ``i``'s label (default: :func:`sorted_labels`)."""
    batches = rank_batches(counts, layout, schedule, epoch, buffer, interleave, spread, columns)
    return batches_quality(batches, counts, layout, schedule, epoch, buffer, classes, labels, interleave=interleave,
                           spread=spread, columns=columns)


def batches_quality(batches: np.ndarray, counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int,
                    buffer: int, classes: int = 100, labels: Optional[np.ndarray] = None, interleave: int = 1,
                    spread: bool = False, columns: bool = False) -> Dict[str, Any]:
    """:func:`shuffle_quality` of given ``batches`` (sample ids ``(ranks, steps, batch_size)``,
    ``-1``: padding), whatever plan made them."""
    total = int(np.sum(np.asarray(counts, dtype=np.int64)))
    return compared(batches, total, layout, schedule, epoch, classes, labels,
                    {"shuffle": buffer, "interleave": interleave, "spread": spread, "columns": columns})


def mix_rank_batches(plan: Any, buffer: int) -> np.ndarray:
    """Sample ids of every rank's batches in a mix's epoch (a :class:`~dalistream.plan.mix.MixEpoch`), as
    :func:`rank_batches` gives them for one data set: source ``s``'s sample ``i`` (in its shards'
    written order) is id ``i`` plus the samples of the sources before it. Each worker's slot takes
    each of its columns' share at each step, sources in order (the worker's own rule); a column
    read through a buffer (spans, ``buffer > 1``) is shuffled as the worker shuffles it."""
    layout, steps = plan.layout, plan.steps
    out = np.full((layout.world_size, steps, layout.batch_size), -1, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(plan.totals)])
    for r in range(layout.world_size):
        for w in range(layout.workers):
            cursor = np.full(steps, layout.slot_offsets[w], dtype=np.int64)
            for s in range(len(plan.totals)):
                takes = column_takes(plan.take[:, w, s], plan.interleave)
                for k in range(takes.shape[1]):
                    c = column_index(layout, r, w, k, plan.interleave)
                    positions = np.arange(plan.columns[s][c], plan.columns[s][c + 1], dtype=np.int64)
                    if buffer > 1:
                        seed = seeds.source_shuffle(plan.schedule.seed, plan.epoch, s, c)
                        positions = positions[np.fromiter(shuffled(range(len(positions)), buffer, seed), np.int64,
                                                          count=len(positions))]
                    ids = _source_ids(plan, s, positions) + offsets[s]
                    take = takes[:, k]
                    first = np.cumsum(take) - take
                    for t in np.flatnonzero(take).tolist():
                        n = min(int(take[t]), max(0, len(ids) - int(first[t])))
                        out[r, t, cursor[t]:cursor[t] + n] = ids[first[t]:first[t] + n]
                    cursor += take
    return out


def _source_ids(plan: Any, s: int, positions: np.ndarray) -> np.ndarray:
    """The ids (written order) of positions of source ``s``'s sequence of passes."""
    total = plan.totals[s]
    written = np.concatenate([[0], np.cumsum(plan.counts[s])])
    out = np.empty(len(positions), dtype=np.int64)
    passes = positions // max(total, 1)
    for p in np.unique(passes).tolist():
        at = positions[passes == p] - p * total
        pl = plan.pass_layout(s, plan.first_pass(s) + p)
        i = np.searchsorted(pl.starts, at, side="right") - 1
        out[passes == p] = written[pl.order[i]] + at - pl.starts[i]
    return out


def mix_shuffle_quality(plan: Any, buffer: int, classes: int = 100) -> Dict[str, Any]:
    """:func:`shuffle_quality` of a mix's epoch (:func:`mix_rank_batches`): the sources' samples
    labelled class-sorted over all of them (source 0's classes first)."""
    batches = mix_rank_batches(plan, buffer)
    return compared(batches, int(sum(plan.totals)), plan.layout, plan.schedule, plan.epoch, classes, None,
                    {"shuffle": buffer, "interleave": 1, "spread": False, "columns": plan.interleave,
                     "sources": list(plan.names)})


def compared(batches: np.ndarray, total: int, layout: Layout, schedule: Schedule, epoch: int, classes: int,
             labels: Optional[np.ndarray], info: Dict[str, Any]) -> Dict[str, Any]:
    """Distinct labels and entropy of ``batches`` (ids, ``(ranks, steps, batch)``) per rank batch
    and per global batch, against a random order of the same ids (see :func:`shuffle_quality`)."""
    labels = sorted_labels(total, classes) if labels is None else np.asarray(labels, dtype=np.int64)
    if len(labels) != total:
        raise ConfigError(f"{len(labels)} labels for {total} samples")
    shuffled_ids = batches.copy()
    real = shuffled_ids >= 0
    rng = np.random.default_rng(seeds.random_reference(schedule.seed, epoch, 0xC1A55))
    shuffled_ids[real] = rng.permutation(shuffled_ids[real])
    result: Dict[str, Any] = {
        "epoch": epoch, "samples": total, "classes": int(labels.max()) + 1 if total else 0,
        "world_size": layout.world_size, "workers": layout.workers, "batch_size": layout.batch_size,
        **info, "steps": int(batches.shape[1]),
    }
    for name, ids in (("order", batches), ("random", shuffled_ids)):
        lab = np.where(ids >= 0, labels[np.maximum(ids, 0)], -1)
        per_rank = lab.reshape(-1, layout.batch_size)
        per_global = lab.transpose(1, 0, 2).reshape(lab.shape[1], -1)
        result[name] = {"rank_batch": _summary(batch_label_stats(per_rank)),
                        "global_batch": _summary(batch_label_stats(per_global))}
    for scope in ("rank_batch", "global_batch"):
        base = result["random"][scope]["distinct"]
        result[f"{scope}_vs_random"] = result["order"][scope]["distinct"] / base if base else 1.0
    return result


# -- node affinity (dalistream.plan.affinity): its batches, and its numbers per node -------------

def affine_rank_batches(counts: Sequence[int], layout: Layout, nodes: Nodes, schedule: Schedule, epoch: int,
                        buffer: int, columns: bool) -> np.ndarray:
    """Sample ids of every rank's batches in ``epoch`` with node affinity: ``(ranks, steps,
    batch_size)``, ``-1`` for padding (as :func:`rank_batches`)."""
    counts = np.asarray(counts, dtype=np.int64)
    plan = AffinePlan(counts, layout, nodes, schedule, epoch, columns=columns, shuffle=0 if columns else buffer)
    ep = plan.ep
    written = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=written[1:])
    by_position = np.repeat(written[ep.order] - ep.starts[:-1], counts[ep.order]) + np.arange(ep.total, dtype=np.int64)
    # the sample ids of the spans read, one block of consecutive spans (a node's) at a time
    ids = np.full(int(plan.bounds[-1]), -1, dtype=np.int64)
    real = np.flatnonzero(plan.owners >= 0)
    for block in np.split(real, np.flatnonzero(np.diff(real) > 1) + 1):
        if len(block):
            lo, hi = int(plan.bounds[block[0]]), int(plan.bounds[block[-1] + 1])
            ids[lo:hi] = by_position[epoch_positions(plan.sequence.runs(lo, hi), hi - lo)]
    steps, planned = plan.steps, layout.planned(columns)
    out = np.full((layout.world_size, steps, layout.batch_size), -1, dtype=np.int64)
    for g in range(planned.global_workers):
        i = int(plan.span[g])
        lo, hi = int(plan.bounds[i]), int(plan.bounds[i + 1])
        if columns:  # column g = p·R + r: its span's t-th sample at step t
            p, r = divmod(g, layout.world_size)
            n = min(hi - lo, steps)
            out[r, :n, p] = ids[lo:lo + n]
            continue
        r, w = divmod(g, layout.workers)
        slot, first = layout.slots[w], layout.slot_offsets[w]
        pick = np.fromiter(shuffled(range(hi - lo), buffer, seeds.sample_shuffle(schedule.seed, epoch, g)),
                           dtype=np.int64, count=hi - lo)
        emitted = np.full(steps * slot, -1, dtype=np.int64)
        n = min(hi - lo, steps * slot)
        emitted[:n] = ids[lo + pick[:n]]
        out[r, :, first:first + slot] = emitted.reshape(steps, slot)
    return out


def epoch_positions(runs: Sequence[Stretch], size: int) -> np.ndarray:
    """The epoch positions ``runs`` hold (``size`` of them), in order, their drops left out."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    starts = np.fromiter((r.start for r in runs), np.int64, len(runs))
    lengths = np.fromiter((r.stop - r.start for r in runs), np.int64, len(runs))
    offsets = np.zeros(len(runs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
    keep = np.ones(len(out), dtype=bool)
    for j, r in enumerate(runs):
        if r.drop:
            keep[offsets[j] + np.asarray(r.drop, dtype=np.int64) - r.start] = False
    out = out[keep]
    if len(out) != size:
        raise ValueError(f"runs hold {len(out)} positions, not {size}")
    return out


def affine_shuffle_quality(counts: Sequence[int], layout: Layout, nodes: Nodes, schedule: Schedule, epoch: int,
                           buffer: int, classes: int = 100, labels: Optional[np.ndarray] = None,
                           columns: bool = False) -> Dict[str, Any]:
    """:func:`shuffle_quality` of the node-affine order (``nodes`` in the result)."""
    batches = affine_rank_batches(counts, layout, nodes, schedule, epoch, buffer, columns)
    result = batches_quality(batches, counts, layout, schedule, epoch, buffer, classes, labels, columns=columns)
    result["nodes"] = nodes.count
    return result


def affine_summary(counts: Sequence[int], layout: Layout, nodes: Nodes, schedule: Schedule, epoch: int,
                   columns: bool) -> Dict[str, Any]:
    """An epoch's numbers with node affinity: steps, shards and samples per node (the share of
    the data each node's cache holds), samples left out (``even``) and padding (``exact``)."""
    counts = np.asarray(counts, dtype=np.int64)
    plan = AffinePlan(counts, layout, nodes, schedule, epoch, columns=columns)
    owner = node_owner(counts, nodes.count, schedule.seed)
    shards = np.bincount(owner, minlength=nodes.count)
    samples = plan.sequence.node_totals
    per_node = plan.steps * nodes.ranks_per_node * layout.batch_size
    total = int(counts.sum())
    return {
        "epoch": epoch, "policy": schedule.policy, "nodes": nodes.count, "ranks_per_node": nodes.ranks_per_node,
        "shards": len(counts), "samples": total, "steps": plan.steps,
        "shards_per_node": {"min": int(shards.min()), "max": int(shards.max())},
        "samples_per_node": {"min": int(samples.min()), "max": int(samples.max())},
        "largest_node_share": float(samples.max() / total) if total else 0.0,
        "left_out": int(np.maximum(samples - per_node, 0).sum()) if schedule.policy == "even" else 0,
        "padding": int(np.maximum(per_node - samples, 0).sum()) if schedule.policy != "even" else 0,
    }
