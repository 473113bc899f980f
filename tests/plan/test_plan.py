import itertools

import pytest

from dalistream.errors import ConfigError, ManifestError
from dalistream.plan import Layout, Schedule, epoch_order, owned_samples, owned_shards, steps_per_epoch, worker_plan


def L(R, W, B=None):
    return Layout(R, W, B if B is not None else W)


@pytest.mark.parametrize("R,W", list(itertools.product([1, 2, 3], [1, 2, 3, 4])))
def test_every_shard_has_exactly_one_owner(R, W):
    n = 17 + R * W
    for epoch in range(3):
        owners = [owned_shards(n, L(R, W), Schedule(5), epoch, r, w) for r in range(R) for w in range(W)]
        flat = sorted(i for o in owners for i in o)
        assert flat == list(range(n))


def test_global_worker_owns_strided_positions_of_the_epoch_permutation():
    order = epoch_order(20, 3, 1)
    R, W = 2, 3
    for r, w in itertools.product(range(R), range(W)):
        g = r * W + w
        assert owned_shards(20, L(R, W), Schedule(3), 1, r, w) == order[g::R * W]


def test_permutation_is_deterministic_and_changes_with_epoch_and_seed():
    assert epoch_order(50, 1, 0) == epoch_order(50, 1, 0)
    assert epoch_order(50, 1, 0) != epoch_order(50, 1, 1)
    assert epoch_order(50, 1, 0) != epoch_order(50, 2, 0)
    assert epoch_order(5, 1, 3, shuffle=False) == [0, 1, 2, 3, 4]


def test_fewer_shards_than_global_workers_names_both_numbers():
    with pytest.raises(ConfigError) as e:
        owned_shards(5, L(2, 3), Schedule(0), 0, 0, 0)
    assert "5 shards" in str(e.value) and "6 global workers" in str(e.value)


@pytest.mark.parametrize("B,W", [(8, 2), (7, 3), (10, 4), (5, 5), (64, 3)])
def test_slots_cover_the_batch(B, W):
    sizes = Layout(1, W, B).slots
    assert sum(sizes) == B and max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)
    assert list(Layout(1, W, B).slot_offsets) == [sum(sizes[:w]) for w in range(W)]


def test_batch_smaller_than_workers_is_an_error():
    with pytest.raises(ConfigError):
        Layout(1, 3, 2)


def test_even_steps_are_the_same_on_every_rank_and_fit_every_worker():
    counts = [5, 40, 13, 9, 27, 31, 2, 18, 11, 50, 7, 22]
    R, W, B = 3, 2, 6
    for epoch in range(4):
        steps = {steps_per_epoch(counts, L(R, W, B), Schedule(0), epoch, r) for r in range(R)}
        assert len(steps) == 1
        (s,) = steps
        table = owned_samples(counts, L(R, W, B), Schedule(0), epoch)
        slots = L(R, W, B).slots
        assert all(table[r][w] >= s * slots[w] for r in range(R) for w in range(W))
        assert any(table[r][w] < (s + 1) * slots[w] for r in range(R) for w in range(W))


def test_exact_steps_cover_every_sample_of_the_rank():
    counts = [5, 40, 13, 9, 27, 31]
    for r in range(2):
        s = steps_per_epoch(counts, L(2, 3, 7), Schedule(0, "exact"), 0, r)
        plans = [worker_plan(counts, 6, L(2, 3, 7), Schedule(0, "exact"), 0, r, w) for w in range(3)]
        assert all(p.samples <= s * p.slot for p in plans)
        assert any(p.samples > (s - 1) * p.slot for p in plans)


def test_counts_needed_except_for_fixed():
    with pytest.raises(ManifestError):
        steps_per_epoch(None, L(1, 1, 4), Schedule(0), 0, 0)
    assert steps_per_epoch(None, L(1, 1, 4), Schedule(0, "fixed", 9), 0, 0) == 9


def test_worker_plan_fields():
    p = worker_plan([10] * 8, 8, L(2, 2, 5), Schedule(1), 2, 1, 1)
    assert p.global_worker == 3 and p.slot == 2 and p.offset == 3 and p.samples == 20 and len(p.shards) == 2
