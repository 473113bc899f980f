"""Shard ownership and epoch lengths: pure functions of (counts, layout, schedule, epoch).

In epoch ``e`` the shard list is permuted by a generator seeded with ``(seed, e)`` and global
worker ``g`` owns positions ``g, g + R·W, …`` of that permutation, so every shard has exactly
one owner and every rank computes the same plan without talking to the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, ManifestError
from . import seeds
from .layout import Layout, Schedule


def epoch_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> List[int]:
    """The permutation of shard indices used in ``epoch`` (identity when ``shuffle`` is off)."""
    if not shuffle:
        return list(range(num_shards))
    rng = np.random.default_rng(seeds.shard_order(seed, epoch))
    return [int(i) for i in rng.permutation(num_shards)]


def check_layout(num_shards: int, layout: Layout) -> None:
    """Raise if there are fewer shards than global workers (some worker would own nothing)."""
    if num_shards < layout.global_workers:
        raise ConfigError(
            f"{num_shards} shards cannot be split over {layout.world_size} ranks x {layout.workers} workers = "
            f"{layout.global_workers} global workers",
            hint="use fewer workers, or split the data set into more shards",
        )


def owned_shards(num_shards: int, layout: Layout, schedule: Schedule, epoch: int, rank: int, worker: int) -> List[int]:
    """Indices (into the shard list) that global worker ``rank × workers + worker`` reads in ``epoch``."""
    check_layout(num_shards, layout)
    order = epoch_order(num_shards, schedule.seed, epoch, schedule.shuffle_shards)
    return order[layout.global_worker(rank, worker)::layout.global_workers]


def owned_samples(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int) -> List[List[int]]:
    """Samples owned by every (rank, worker) in ``epoch``: a ``world_size × workers`` table."""
    check_layout(len(counts), layout)
    order = epoch_order(len(counts), schedule.seed, epoch, schedule.shuffle_shards)
    gw = layout.global_workers
    per_g = [sum(counts[i] for i in order[g::gw]) for g in range(gw)]
    return [per_g[r * layout.workers:(r + 1) * layout.workers] for r in range(layout.world_size)]


def steps_per_epoch(counts: Optional[Sequence[int]], layout: Layout, schedule: Schedule, epoch: int, rank: int) -> int:
    """Batches rank ``rank`` yields in ``epoch``.

    ``even``: min over all global workers of ⌊owned samples / slot⌋ (the same on every rank);
    ``exact``: max over this rank's workers of ⌈owned samples / slot⌉; ``fixed``: ``batches_per_epoch``.
    """
    if schedule.policy == "fixed":
        return int(schedule.batches_per_epoch)  # type: ignore[arg-type]
    if counts is None:
        raise ManifestError(f"policy {schedule.policy!r} needs per-shard sample counts (a manifest)",
                            hint="run `dalistream index` or use policy='fixed' with batches_per_epoch")
    table = owned_samples(counts, layout, schedule, epoch)
    slots = layout.slots
    if schedule.policy == "even":
        return min(table[r][w] // slots[w] for r in range(layout.world_size) for w in range(layout.workers))
    return max(-(-table[rank][w] // slots[w]) for w in range(layout.workers))


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker does in one epoch: which shards, how many batches, its slot."""

    rank: int
    worker: int
    epoch: int
    shards: Tuple[int, ...]
    steps: int
    slot: int
    offset: int
    samples: Optional[int]  # samples owned this epoch (None when counts are unknown)
    global_worker: int


def worker_plan(counts: Optional[Sequence[int]], num_shards: int, layout: Layout, schedule: Schedule, epoch: int,
                rank: int, worker: int) -> WorkerPlan:
    """The :class:`WorkerPlan` of one worker; identical on every machine for the same inputs."""
    shards = owned_shards(num_shards, layout, schedule, epoch, rank, worker)
    steps = steps_per_epoch(counts, layout, schedule, epoch, rank)
    samples = sum(counts[i] for i in shards) if counts is not None else None
    return WorkerPlan(rank, worker, epoch, tuple(shards), steps, layout.slots[worker], layout.slot_offsets[worker],
                      samples, layout.global_worker(rank, worker))
