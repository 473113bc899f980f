"""The plan: who reads which samples, in which order, for how many steps. Pure functions of
(counts, :class:`Layout`, :class:`Schedule`, epoch); no I/O. Every seed is derived in :mod:`.seeds`."""

from . import seeds
from .layout import POLICIES, Layout, Schedule
from .ownership import WorkerPlan, check_layout, epoch_order, owned_samples, owned_shards, steps_per_epoch, worker_plan

__all__ = ["POLICIES", "Layout", "Schedule", "WorkerPlan", "check_layout", "epoch_order", "owned_samples",
           "owned_shards", "seeds", "steps_per_epoch", "worker_plan"]
