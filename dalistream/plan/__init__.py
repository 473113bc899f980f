"""The plan: who reads which samples, in which order, for how many steps. Pure functions of
(counts, :class:`Layout`, :class:`Schedule`, epoch); no I/O. Every seed is derived in :mod:`.seeds`.
Whatever the data, an epoch's plan is the one :func:`epoch_plan` builds (:mod:`.epochplan`)."""

from . import seeds
from .layout import POLICIES, Layout, Schedule
from .ownership import (EpochLayout, Part, WorkerPlan, check_layout, epoch_layout, epoch_order, epoch_steps,
                        owned_parts, owned_samples, owned_shards, span_bounds, steps_per_epoch, worker_columns,
                        worker_plan)
from .mix import (PER_BATCH, MixEpoch, MixPlan, SourcePlan, batch_sources, check_share, cumulative, integer_weights,
                  mix_plan, mix_steps, source_order, span_layout, worker_take)
from .mixinput import MixSource, check_fields, check_weight, check_weights, parse_mix, parse_mix_arg
from .resume import Remaining, ResumePlan, Stretch, check_segments, continued, remaining_summary, resumed_steps
from .summary import epoch_summary, mix_summary
from .buckets import BucketEpoch, bucket_steps
from .bucketmix import BucketMix, check_bucket_mix
from .bucketresume import resumed_bucket_plan
from .bucketworker import BucketWorkerPlan
from .epochplan import EpochPlan, Reading, epoch_plan

__all__ = ["POLICIES", "EpochLayout", "Remaining", "ResumePlan", "Stretch", "check_segments", "continued", "remaining_summary", "resumed_steps",
           "Layout", "Part", "Schedule", "WorkerPlan", "check_layout", "epoch_layout",
           "epoch_order", "epoch_steps", "epoch_summary", "owned_parts", "owned_samples", "owned_shards", "seeds",
           "span_bounds", "steps_per_epoch", "worker_columns", "worker_plan",
           "PER_BATCH", "MixEpoch", "MixPlan", "MixSource", "SourcePlan", "batch_sources", "check_fields", "check_share",
           "check_weight", "check_weights", "cumulative", "integer_weights", "mix_plan", "mix_steps", "mix_summary",
           "parse_mix", "parse_mix_arg", "source_order", "span_layout", "worker_take",
           "BucketEpoch", "BucketMix", "BucketWorkerPlan", "bucket_steps", "check_bucket_mix", "resumed_bucket_plan",
           "EpochPlan", "Reading", "epoch_plan"]
