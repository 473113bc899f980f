"""One worker's samples in plan order: its shards opened in sequence, tar members grouped into
samples, fields decoded, the error policy applied.

:class:`PlanReader` knows the shard list, counts and offsets; :meth:`~PlanReader.decoded` yields
a worker's decoded samples (tuples of arrays, one per field) for one :class:`~dalistream.plan.WorkerPlan`,
``None`` in place of samples skipped on resume (still numbered, never read or decoded).
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from ..config import StreamConfig
from ..errors import DalistreamError, SampleError, ShardFormatError, SourceError
from ..io.streams import ShardSequence, open_shard
from ..plan import WorkerPlan, seeds
from ..tar import iter_samples, read_error
from .fields import FieldDecoder
from .policy import ErrorPolicy
from .stats import WorkerStats

PASS_END = object()  # marks the end of one pass over a worker's shards

Keep = Callable[[int], bool]


class PlanReader:
    """Reads the samples a :class:`WorkerPlan` names (see module doc); picklable."""

    def __init__(self, config: StreamConfig, urls: Sequence[str], counts: Optional[Sequence[int]],
                 offsets: Optional[Sequence[Sequence[int]]], worker: int) -> None:
        self.config = config
        self.urls = list(urls)
        self.counts = list(counts) if counts is not None else None
        self.offsets = offsets  # per shard, the tar offset of each sample: resume opens mid-shard
        self.worker = worker
        self.decoder = FieldDecoder(config.fields, config.missing)

    def decoded(self, plan: WorkerPlan, keep: Keep, policy: ErrorPolicy, stats: WorkerStats) -> Iterator:
        """Decoded samples of this worker's shards (endless, re-ordered per pass, for ``fixed``),
        ``None`` for samples skipped on resume.

        The error policy is applied here: a bad sample (duplicate key or member, member too large,
        undecodable value or image, missing field) is raised, or counted and skipped, and its shard
        goes on; a shard that cannot be opened or read on is raised, or counted and skipped after
        the samples before the damage. Shard problems are met one raw sample early (see
        :func:`problem_first`), so a worker that stops after its last planned sample has still
        met, counted and reported the damage right after it, and the unreadable shards after it.
        """
        c = self.config
        good = 0

        def skip(error: DalistreamError, kind: str) -> None:
            policy.handle(error.at(rank=c.rank, worker=self.worker), kind)
            stats.flush_skips()

        for item in problem_first(self.raw(plan, keep, stats)):
            if item is PASS_END:
                if c.policy == "fixed" and not good:  # cycling over nothing would never end
                    raise SourceError("worker's shards hold no usable samples: policy 'fixed' cannot fill its batches",
                                      url=self.urls[plan.shards[0]], rank=c.rank, worker=self.worker,
                                      reason="no_samples", hint="check the shards (see the warnings), or use fewer workers")
                good = 0
                continue
            if item is None:
                good += 1
                yield None
                continue
            if isinstance(item, DalistreamError):  # per shard
                skip(item, "shards")
                continue
            error = item.get("__error__")  # per sample, found by the tar reader
            if error is not None:
                skip(error, "samples")
                continue
            stats.bytes += sum(len(v) for k, v in item.items() if v is not None and not k.startswith("__"))
            try:
                value = self.decoder.decode(item)
            except SampleError as e:
                skip(e, "samples")
                continue
            if value is None:
                policy.count("samples", "missing_field", example=self.decoder.describe_missing(item))
                stats.flush_skips()
                continue
            good += 1
            yield value

    def raw(self, plan: WorkerPlan, keep: Keep, stats: WorkerStats) -> Iterator:
        """This worker's raw samples (``ext -> bytes`` dicts, numbered in plan order; ``None`` when
        ``keep`` rejects one), a shard's error in place of what follows its damage, and
        :data:`PASS_END` after each pass over the shards."""
        c = self.config
        ordinal = 0
        passes = itertools.count() if c.policy == "fixed" else range(1)
        for n_pass in passes:
            order = list(plan.shards)
            if n_pass:
                perm = np.random.default_rng(seeds.pass_order(c.seed, plan.epoch, n_pass)).permutation(len(order))
                order = [order[int(i)] for i in perm]
            shards = ShardSequence([self.urls[i] for i in order], c.storage_options, stats.io)
            for position, index in enumerate(order):
                url = self.urls[index]
                base = ordinal
                count = self.counts[index] if self.counts is not None else None
                first = next((i for i in range(count) if keep(base + i)), count) if count else 0
                if count and first == count:
                    ordinal += count  # resume: a shard consumed before the restart is not even opened
                    yield from itertools.repeat(None, count)
                    continue
                if first and self.offsets is None:
                    first = 0  # no offsets: the consumed samples are skipped by header
                ordinal += first
                yield from itertools.repeat(None, first)
                try:
                    with stats.io_clock.timed():  # blocked before the first chunk arrives: I/O wait too
                        opened = (open_shard(url, self.offsets[index][first], c.storage_options) if first
                                  else shards.open(position))  # resume mid-shard: a seek or a ranged GET
                    with opened as f:
                        for sample in iter_samples(
                            f, url, keep=lambda i: keep(base + i), want_ext=self.decoder.wants,
                            lowercase=c.lowercase_ext, max_member_bytes=c.max_member_bytes, mark_errors=True,
                            first_index=first, clock=stats.io_clock,
                        ):
                            ordinal += 1
                            yield sample if keep(ordinal - 1) else None
                except (ShardFormatError, SourceError) as e:
                    yield e
                except DalistreamError as e:
                    raise e.at(rank=c.rank, worker=self.worker)
                except (OSError, EOFError) as e:  # I/O errors outside the tar reader (open, close)
                    yield read_error(e, url)
            shards.close()
            yield PASS_END


def problem_first(items: Iterator) -> Iterator:
    """``items`` one behind, except errors, which overtake the item held back.

    The reader yields a shard's last samples and then the error that ends it (or the errors of
    the unreadable shards after it). A worker stops reading once it has the samples its plan
    counted — for a damaged shard, counted up to the damage — so without this it would stop just
    before the error, and never count or report it."""
    held, holding = None, False
    for item in items:
        if isinstance(item, DalistreamError):
            yield item
            continue
        if holding:
            yield held
        held, holding = item, True
    if holding:
        yield held
