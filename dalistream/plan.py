"""Shard ownership and epoch lengths: pure functions of (shards, seed, epoch, R, W, B, policy).

Global worker ``g = rank × workers + worker``. In epoch ``e`` the shard list is permuted by a
generator seeded with ``(seed, e)`` and global worker ``g`` owns positions ``g, g + R·W, …`` of
that permutation, so every shard has exactly one owner and every rank computes the same plan
without talking to the others. Worker ``w`` fills slot ``w`` of each batch: slots are
``⌈B/W⌉`` for the first ``B mod W`` workers and ``⌊B/W⌋`` for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .errors import ConfigError, ManifestError


def epoch_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> List[int]:
    """The permutation of shard indices used in ``epoch`` (identity when ``shuffle`` is off)."""
    if not shuffle:
        return list(range(num_shards))
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 0x5EED])
    return [int(i) for i in rng.permutation(num_shards)]


def check_layout(num_shards: int, world_size: int, workers: int) -> None:
    """Raise if there are fewer shards than global workers (some worker would own nothing)."""
    if num_shards < world_size * workers:
        raise ConfigError(
            f"{num_shards} shards cannot be split over {world_size} ranks x {workers} workers = "
            f"{world_size * workers} global workers",
            hint="use fewer workers, or split the data set into more shards",
        )


def owned_shards(
    num_shards: int, seed: int, epoch: int, rank: int, world_size: int, workers: int, worker: int,
    shuffle: bool = True,
) -> List[int]:
    """Indices (into the shard list) that global worker ``rank × workers + worker`` reads in ``epoch``."""
    check_layout(num_shards, world_size, workers)
    g = rank * workers + worker
    return epoch_order(num_shards, seed, epoch, shuffle)[g :: world_size * workers]


def slot_sizes(batch_size: int, workers: int) -> List[int]:
    """Samples each worker contributes to a batch: ⌈B/W⌉ for the first B mod W workers, ⌊B/W⌋ after."""
    if batch_size < workers:
        raise ConfigError(f"batch_size {batch_size} is smaller than workers {workers}")
    base, extra = divmod(batch_size, workers)
    return [base + (1 if w < extra else 0) for w in range(workers)]


def slot_offsets(batch_size: int, workers: int) -> List[int]:
    """First batch position of each worker's slot."""
    sizes = slot_sizes(batch_size, workers)
    return [sum(sizes[:w]) for w in range(workers)]


def owned_samples(counts: Sequence[int], seed: int, epoch: int, world_size: int, workers: int,
                  shuffle: bool = True) -> List[List[int]]:
    """Samples owned by every (rank, worker) in ``epoch``: a ``world_size × workers`` table."""
    n = len(counts)
    order = epoch_order(n, seed, epoch, shuffle)
    check_layout(n, world_size, workers)
    gw = world_size * workers
    per_g = [sum(counts[i] for i in order[g::gw]) for g in range(gw)]
    return [per_g[r * workers:(r + 1) * workers] for r in range(world_size)]


def steps_per_epoch(
    counts: Optional[Sequence[int]], seed: int, epoch: int, rank: int, world_size: int, workers: int,
    batch_size: int, policy: str, batches_per_epoch: Optional[int] = None, shuffle: bool = True,
) -> int:
    """Batches rank ``rank`` yields in ``epoch``.

    ``even``: min over all global workers of ⌊owned samples / slot⌋ (the same on every rank);
    ``exact``: max over this rank's workers of ⌈owned samples / slot⌉; ``fixed``: ``batches_per_epoch``.
    """
    if policy == "fixed":
        if not batches_per_epoch:
            raise ConfigError("policy 'fixed' needs batches_per_epoch")
        return int(batches_per_epoch)
    if counts is None:
        raise ManifestError(f"policy {policy!r} needs per-shard sample counts (a manifest)",
                            hint="run `dalistream index` or use policy='fixed' with batches_per_epoch")
    table = owned_samples(counts, seed, epoch, world_size, workers, shuffle)
    slots = slot_sizes(batch_size, workers)
    if policy == "even":
        return min(table[r][w] // slots[w] for r in range(world_size) for w in range(workers))
    if policy == "exact":
        return max(-(-table[rank][w] // slots[w]) for w in range(workers))
    raise ConfigError(f"unknown policy {policy!r}")


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


def worker_plan(
    counts: Optional[Sequence[int]], num_shards: int, seed: int, epoch: int, rank: int, world_size: int,
    workers: int, worker: int, batch_size: int, policy: str, batches_per_epoch: Optional[int] = None,
    shuffle: bool = True,
) -> WorkerPlan:
    """The :class:`WorkerPlan` of one worker; identical on every machine for the same inputs."""
    shards = owned_shards(num_shards, seed, epoch, rank, world_size, workers, worker, shuffle)
    steps = steps_per_epoch(counts, seed, epoch, rank, world_size, workers, batch_size, policy,
                            batches_per_epoch, shuffle)
    samples = sum(counts[i] for i in shards) if counts is not None else None
    return WorkerPlan(rank, worker, epoch, tuple(shards), steps, slot_sizes(batch_size, workers)[worker],
                      slot_offsets(batch_size, workers)[worker], samples, rank * workers + worker)
