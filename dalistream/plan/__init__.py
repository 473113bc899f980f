"""The plan: who reads which samples, in which order, for how many steps. Pure functions of
(counts, :class:`Layout`, :class:`Schedule`, epoch); no I/O. Every seed is derived in :mod:`.seeds`.
Whatever the data, an epoch's plan is the one :func:`epoch_plan` builds (:mod:`.epochplan`)."""

from . import seeds
from .layout import POLICIES, Layout, Schedule
from .ownership import (EpochLayout, Part, WorkerPlan, check_layout, epoch_layout, epoch_order, epoch_steps,
                        owned_parts, owned_shards, span_bounds, steps_per_epoch, worker_columns, worker_plan)
from .resume import Remaining, Stretch, check_segments, continued
from .mix import PER_BATCH, MixEpoch, batch_sources, check_share, cumulative, integer_weights, mix_steps, worker_take
from .epochplan import EpochPlan, Reading, epoch_plan

__all__ = ["POLICIES", "EpochLayout", "EpochPlan", "Layout", "MixEpoch", "PER_BATCH", "Part", "Reading", "Remaining",
           "Schedule", "Stretch", "WorkerPlan", "batch_sources", "check_layout", "check_segments", "check_share",
           "continued", "cumulative", "epoch_layout", "epoch_order", "epoch_plan", "epoch_steps", "integer_weights",
           "mix_steps", "owned_parts", "owned_shards", "seeds", "span_bounds", "steps_per_epoch",
           "worker_columns", "worker_plan", "worker_take"]
