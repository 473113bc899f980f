"""What node affinity (:mod:`.affinity`) costs and keeps, in numbers, without reading data: the
batches every rank receives (for the shuffle-quality measure of :mod:`.quality`), an epoch's
numbers per node, and how much of each node's cache a change of node count keeps."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import seeds
from .affinity import AffinePlan, Nodes, node_owner
from .layout import Layout, Schedule
from .quality import batches_quality
from .resume import Stretch
from .shuffle import shuffled


def affine_rank_batches(counts: Sequence[int], layout: Layout, nodes: Nodes, schedule: Schedule, epoch: int,
                        buffer: int, columns: bool) -> np.ndarray:
    """Sample ids of every rank's batches in ``epoch`` with node affinity: ``(ranks, steps,
    batch_size)``, ``-1`` for padding (as :func:`~.quality.rank_batches`)."""
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
    """:func:`~.quality.shuffle_quality` of the node-affine order (``nodes`` in the result)."""
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


def cache_kept(counts: Sequence[int], before: int, after: int, seed: int) -> List[float]:
    """Per node of a job resumed on ``after`` nodes (it was on ``before``): the share of the
    samples it now owns that the same node (same node id, so the same machine and disk) owned
    before — what its cache still holds after one epoch under the old count. Nodes beyond the
    old count start cold (0)."""
    counts = np.asarray(counts, dtype=np.int64)
    old, new = node_owner(counts, before, seed), node_owner(counts, after, seed)
    mine = np.bincount(new, weights=counts, minlength=after)
    kept = np.bincount(new, weights=np.where(old == new, counts, 0), minlength=after)
    return [float(k / m) if m else 0.0 for k, m in zip(kept, mine)]
