"""Every seed dalistream derives, in one place: the randomness of an epoch is a pure function of
the user's ``seed``, the epoch and who draws it (a global worker, a rank), never of global state
or the wall clock. Changing any formula here changes which samples go where: the loader state's
version must then change too."""

from __future__ import annotations

from typing import List


def shard_order(seed: int, epoch: int) -> List[int]:
    """Seed sequence of the epoch's shard permutation (the same on every rank)."""
    return [int(seed) & 0xFFFFFFFF, int(epoch), 0x5EED]


def node_shards(seed: int) -> List[int]:
    """Seed sequence of the order in which shards of equal counts are given to nodes
    (:func:`dalistream.plan.affinity.node_owner`; the same in every epoch)."""
    return [int(seed) & 0xFFFFFFFF, 0xAFF1]


def left_out(seed: int, epoch: int) -> List[int]:
    """Seed sequence of the samples ``even`` leaves out of ``epoch`` (the same on every rank)."""
    return shard_order(seed, epoch) + [0x1EF7]


def random_reference(seed: int, epoch: int, measure: int) -> List[int]:
    """Seed sequence of the random order a measure compares an epoch's batches with (the
    shuffle quality's ``0xC1A55``, the buckets' ``0xB0C4E7``): drawn apart from every order
    that delivers data."""
    return shard_order(seed, epoch) + [int(measure)]


def pass_order(seed: int, epoch: int, n_pass: int) -> List[int]:
    """Seed sequence of the order in which a ``fixed``-policy worker re-reads its shards on pass
    ``n_pass`` (1, 2, …) of ``epoch``."""
    return shard_order(seed, int(epoch) * 1_000_003 + int(n_pass))


def source_pass(seed: int, source: int, n_pass: int) -> List[int]:
    """Seed sequence of the shard permutation of pass ``n_pass`` (0, 1, …) over source ``source``
    (its index in a mix). Source 0's pass ``e`` is the unmixed epoch ``e``'s order."""
    base = shard_order(seed, n_pass)
    return base if int(source) == 0 else base + [int(source)]


def sample_shuffle(seed: int, epoch: int, global_worker: int) -> int:
    """Seed of one global worker's sample shuffle buffer in one epoch."""
    return (int(seed) * 1_000_003 + int(epoch)) * 1_000_033 + int(global_worker)


def source_shuffle(seed: int, epoch: int, source: int, global_worker: int) -> int:
    """Seed of one global worker's shuffle buffer over source ``source`` of a mix in one epoch
    (source 0: :func:`sample_shuffle`'s)."""
    base = sample_shuffle(seed, epoch, global_worker)
    return base if int(source) == 0 else (base * 1_000_039 + int(source)) & 0x7FFFFFFFFFFF


def segment_shuffle(seed: int, epoch: int, segment: int, global_worker: int) -> int:
    """Seed of a global worker's sample shuffle in segment ``segment`` of ``epoch`` after an
    elastic resume (segment 0: :func:`sample_shuffle`'s, so that a run never resumed is unchanged)."""
    return segment_source_shuffle(seed, epoch, segment, 0, global_worker)


def segment_source_shuffle(seed: int, epoch: int, segment: int, source: int, global_worker: int) -> int:
    """Seed of a global worker's shuffle buffer over a mix's ``source`` in segment ``segment`` of
    ``epoch`` (segment 0: :func:`source_shuffle`'s; source 0: :func:`segment_shuffle`'s)."""
    base = source_shuffle(seed, epoch, source, global_worker)
    return base if segment == 0 else (base * 1_000_037 + segment) & 0x7FFFFFFFFFFF


def pipeline(seed: int, rank: int, epoch: int, step: int) -> int:
    """Seed of DALI's own random operators (crops, flips) for a pipeline built at (epoch, step) on
    ``rank``: different per rank, and a pipeline rebuilt on resume draws afresh."""
    return (int(seed) * 7919 + int(rank) * 104729 + int(epoch) * 1299709 + int(step)) & 0x7FFFFFFF
