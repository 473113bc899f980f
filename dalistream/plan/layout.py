"""Who reads and how batches are cut: :class:`Layout` (ranks, workers, batch size) and
:class:`Schedule` (seed, epoch policy), the two frozen values every plan function takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..errors import ConfigError

POLICIES = ("even", "exact", "fixed")


def is_int(value) -> bool:
    """An integer (Python's or NumPy's), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class Layout:
    """``world_size`` ranks × ``workers`` DALI workers per rank, ``batch_size`` samples per batch.

    Global worker ``g = rank × workers + worker``. Worker ``w`` fills slot ``w`` of each batch:
    ``⌈B/W⌉`` samples for the first ``B mod W`` workers, ``⌊B/W⌋`` for the others.
    """

    world_size: int
    workers: int
    batch_size: int

    def __post_init__(self) -> None:
        for name in ("world_size", "workers", "batch_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.batch_size < self.workers:
            raise ConfigError(f"batch_size {self.batch_size} is smaller than workers {self.workers}: "
                              "every worker needs a slot of at least one sample")

    @property
    def global_workers(self) -> int:
        """R × W."""
        return self.world_size * self.workers

    def global_worker(self, rank: int, worker: int) -> int:
        """``rank × workers + worker``."""
        return rank * self.workers + worker

    @property
    def slots(self) -> Tuple[int, ...]:
        """Samples each worker of a rank contributes to a batch."""
        base, extra = divmod(self.batch_size, self.workers)
        return tuple(base + (1 if w < extra else 0) for w in range(self.workers))

    @property
    def slot_offsets(self) -> Tuple[int, ...]:
        """First batch position of each worker's slot."""
        base, extra = divmod(self.batch_size, self.workers)
        return tuple(w * base + min(w, extra) for w in range(self.workers))

    @property
    def column_layout(self) -> "Layout":
        """The layout of *columns*, for interleaved reading: every batch position of every rank
        reads its own span, one sample per step. Column ``q = position × world_size + rank`` is
        global worker ``q`` of ``R·B`` ranks of one worker and batch 1, so the balanced spans of
        :mod:`.ownership` place a rank's ``B`` columns ``R`` spans apart, evenly over the epoch."""
        return Layout(self.world_size * self.batch_size, 1, 1)

    def columns(self, rank: int, worker: int) -> Tuple[int, ...]:
        """The columns (global workers of :attr:`column_layout`) that ``worker`` of ``rank`` reads,
        in the order of its slot's positions."""
        lo = self.slot_offsets[worker]
        return tuple(p * self.world_size + rank for p in range(lo, lo + self.slots[worker]))

    def planned(self, interleave: bool) -> "Layout":
        """The layout the plan splits an epoch over: :attr:`column_layout` when reading interleaved."""
        return self.column_layout if interleave else self


@dataclass(frozen=True)
class Schedule:
    """What an epoch is: the shard order's ``seed``, whether shards are shuffled, and the policy
    (``even``, ``exact``, or ``fixed`` with ``batches_per_epoch``)."""

    seed: int = 0
    policy: str = "even"
    batches_per_epoch: Optional[int] = None
    shuffle_shards: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str) or self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.policy == "fixed" and not (is_int(self.batches_per_epoch) and self.batches_per_epoch > 0):
            raise ConfigError("policy 'fixed' needs batches_per_epoch > 0")
