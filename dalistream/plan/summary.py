"""What an epoch's plan costs, in numbers: samples read, left out (``even``), padded (``exact``),
and into how many parts shards are cut (vectorized: seconds at 100,000 shards × 8,192 global
workers); for a mix, each source's share (:func:`mix_summary`)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from .layout import Layout, Schedule
from .mix import MixEpoch, integer_weights
from .ownership import epoch_layout


def epoch_summary(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int) -> Dict[str, Any]:
    """Numbers of one epoch's plan (``counts`` known): steps, samples owned per global worker
    (min/max), left out, padding, shards cut and parts per shard."""
    plan = epoch_layout(counts, layout, schedule, epoch)
    total, steps = plan.total, plan.steps
    sizes = np.diff(plan.bounds)
    owned = int(plan.bounds[-1] - plan.bounds[0])
    slots = np.tile(np.asarray(layout.slots, dtype=np.int64), layout.world_size)
    delivered = np.minimum(sizes, steps * slots) if schedule.policy == "fixed" else sizes
    capacity = steps * layout.world_size * layout.batch_size
    a, b = plan.starts[:-1], plan.starts[1:]
    nonempty = b > a
    # owners of a shard: the spans that hold its first and its last sample, and all between
    edges = plan.edges  # the spans' stretches of the sequence (left-out samples inside them passed over)
    first = np.searchsorted(edges, a, side="right") - 1
    last = np.searchsorted(edges, b - 1, side="right") - 1
    owned_shard = nonempty & (a < edges[-1]) & (b > edges[0])
    parts = np.where(owned_shard, np.minimum(last, layout.global_workers - 1) - first + 1, 0)
    return {
        "epoch": epoch, "policy": schedule.policy, "shards": len(counts), "empty_shards": int((~nonempty).sum()),
        "samples": total, "world_size": layout.world_size, "workers": layout.workers,
        "batch_size": layout.batch_size, "global_workers": layout.global_workers, "steps": steps,
        "samples_read": int(delivered.sum()),
        "left_out": total - owned,
        "left_out_fraction": (total - owned) / total if total else 0.0,
        "padding": max(0, capacity - int(delivered.sum())) if schedule.policy != "even" else 0,
        "owned_per_worker": {"min": int(sizes.min()), "max": int(sizes.max())},
        "shards_cut": int((parts > 1).sum()),
        "parts_per_shard": {"max": int(parts.max()) if len(parts) else 0,
                            "mean": float(parts[owned_shard].mean()) if owned_shard.any() else 0.0},
    }


def mix_summary(counts: Sequence[Sequence[int]], weights: Sequence[float], layout: Layout, schedule: Schedule,
                epoch: int, names: Optional[Sequence[str]] = None, per_batch: str = "sample",
                samples_per_epoch: Optional[int] = None) -> Dict[str, Any]:
    """Numbers of one epoch of a mix, for the CLI's ``plan``: steps, and per source its weight,
    samples, samples used this epoch (all ranks), per batch (min/max), repeats (samples read
    again after a whole pass), left out (default epochs: what no one reads), passes read."""
    plan = MixEpoch(counts, weights, layout, schedule, epoch, names, per_batch, samples_per_epoch)
    w = integer_weights(weights)
    out = []
    for s, name in enumerate(plan.names):
        total, lo, hi = plan.totals[s], int(plan.bounds[s, 0]), int(plan.bounds[s, -1])
        column = plan.batch_counts[:, s]
        out.append({
            "name": name, "weight": w[s] / sum(w), "samples": total, "used": hi - lo,
            "per_batch": {"min": int(column.min(initial=layout.batch_size)) if len(column) else 0,
                          "max": int(column.max(initial=0))},
            "repeats": max(0, hi - max(lo, total)) if plan.endless else 0,
            "left_out": 0 if plan.endless else total - hi,
            "passes": [plan.first_pass(s) + lo // total, plan.first_pass(s) + max(lo, hi - 1) // total],
        })
    return {"epoch": epoch, "steps": plan.steps, "world_size": layout.world_size, "workers": layout.workers,
            "batch_size": layout.batch_size, "per_batch": per_batch, "samples_per_epoch": samples_per_epoch,
            "sources": out}
