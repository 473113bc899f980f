import itertools

import numpy as np
import pytest

from dalistream.errors import ConfigError, ManifestError
from dalistream.plan import (Layout, Schedule, epoch_layout, epoch_order, owned_parts, owned_shards, steps_per_epoch,
                             worker_plan)
from dalistream.tools.planview import epoch_summary


def L(R, W, B=None):
    return Layout(R, W, B if B is not None else W)


@pytest.mark.parametrize("R,W", list(itertools.product([1, 2, 3], [1, 2, 3, 4])))
def test_whole_shards_without_counts_have_exactly_one_owner(R, W):
    n = 17 + R * W
    for epoch in range(3):
        owners = [owned_shards(n, L(R, W), Schedule(5), epoch, r, w) for r in range(R) for w in range(W)]
        assert sorted(i for o in owners for i in o) == list(range(n))


def test_whole_shards_are_strided_positions_of_the_epoch_permutation():
    order = list(epoch_order(20, 3, 1))
    R, W = 2, 3
    for r, w in itertools.product(range(R), range(W)):
        g = r * W + w
        assert owned_shards(20, L(R, W), Schedule(3), 1, r, w) == order[g::R * W]
        assert owned_parts(None, 20, L(R, W), Schedule(3, "fixed", 4), 1, r, w) == [(i, 0, None) for i in order[g::R * W]]


def test_permutation_is_deterministic_and_changes_with_epoch_and_seed():
    assert list(epoch_order(50, 1, 0)) == list(epoch_order(50, 1, 0))
    assert list(epoch_order(50, 1, 0)) != list(epoch_order(50, 1, 1))
    assert list(epoch_order(50, 1, 0)) != list(epoch_order(50, 2, 0))
    assert list(epoch_order(5, 1, 3, shuffle=False)) == [0, 1, 2, 3, 4]


def test_fewer_shards_than_global_workers_is_an_error_only_for_whole_shards():
    with pytest.raises(ConfigError) as e:
        owned_shards(5, L(2, 3), Schedule(0), 0, 0, 0)
    assert "5 shards" in str(e.value) and "6 global workers" in str(e.value)
    parts = [owned_parts([40] * 5, 5, L(2, 3), Schedule(0), 0, r, w) for r in range(2) for w in range(3)]
    assert all(parts)  # with counts, 5 shards are cut among 6 global workers


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
        (s,) = steps
        assert s == sum(counts) // (R * B)
        slots = L(R, W, B).slots  # every worker delivers exactly its slot at every step
        assert all(worker_plan(counts, len(counts), L(R, W, B), Schedule(0), epoch, r, w).samples == s * slots[w]
                   for r in range(R) for w in range(W))


def test_exact_steps_are_the_same_on_every_rank_and_cover_every_sample():
    counts = [5, 40, 13, 9, 27, 31]
    s = {steps_per_epoch(counts, L(2, 3, 7), Schedule(0, "exact"), 0, r) for r in range(2)}
    assert s == {-(-sum(counts) // 14)}
    plans = [worker_plan(counts, 6, L(2, 3, 7), Schedule(0, "exact"), 0, r, w) for r in range(2) for w in range(3)]
    assert sum(p.samples for p in plans) == sum(counts)
    assert all(p.samples <= p.steps * p.slot for p in plans)


def test_counts_needed_except_for_fixed():
    with pytest.raises(ManifestError):
        steps_per_epoch(None, L(1, 1, 4), Schedule(0), 0, 0)
    assert steps_per_epoch(None, L(1, 1, 4), Schedule(0, "fixed", 9), 0, 0) == 9


def test_worker_plan_fields():
    p = worker_plan([10] * 8, 8, L(2, 2, 5), Schedule(1), 2, 1, 1)
    assert p.global_worker == 3 and p.slot == 2 and p.offset == 3
    assert p.steps == 8 and p.samples == 16 and sum(b - a for _, a, b in p.parts) == 16


def test_a_worked_example_cuts_shards_where_spans_meet():
    # 3 shards of 10, 1 rank x 2 workers, batch 4 (slots 2 + 2), no shuffle: 30 samples, 7 steps
    # (28 samples); 2 samples left out, one drawn in each half of the sequence (seed 0, epoch 0:
    # positions 14 and 25); worker 0 owns the first 14 kept, positions [0, 15) less 14; worker 1
    # the next 14, [15, 30) less 25.
    s = Schedule(0, "even", shuffle_shards=False)
    assert epoch_layout([10, 10, 10], L(1, 2, 4), s, 0).left.tolist() == [14, 25]
    assert owned_parts([10, 10, 10], 3, L(1, 2, 4), s, 0, 0, 0) == [(0, 0, 10), (1, 0, 5)]
    assert owned_parts([10, 10, 10], 3, L(1, 2, 4), s, 0, 0, 1) == [(1, 5, 10), (2, 0, 10)]
    assert worker_plan([10, 10, 10], 3, L(1, 2, 4), s, 0, 0, 0).drop == (14,)
    assert worker_plan([10, 10, 10], 3, L(1, 2, 4), s, 0, 0, 1).drop == (10,)  # position 25: its 11th sample
    summary = epoch_summary([10, 10, 10], L(1, 2, 4), s, 0)
    assert summary["left_out"] == 2 and summary["steps"] == 7 and summary["shards_cut"] == 1
    exact = Schedule(0, "exact", shuffle_shards=False)
    # exact: 8 steps, the last one's 2 samples at positions 0 and 1 (worker 0's slot): [0, 16), [16, 30)
    assert owned_parts([10, 10, 10], 3, L(1, 2, 4), exact, 0, 0, 0) == [(0, 0, 10), (1, 0, 6)]
    assert owned_parts([10, 10, 10], 3, L(1, 2, 4), exact, 0, 0, 1) == [(1, 6, 10), (2, 0, 10)]
    assert epoch_summary([10, 10, 10], L(1, 2, 4), exact, 0)["padding"] == 2


def test_empty_shards_own_nothing_and_a_tiny_data_set_pads_under_exact():
    counts = [0, 3, 0, 0, 2]
    plans = [worker_plan(counts, 5, L(2, 2, 4), Schedule(1, "exact"), 0, r, w) for r in range(2) for w in range(2)]
    assert {p.steps for p in plans} == {1}
    parts = [part for p in plans for part in p.parts]
    assert sorted(s for s, a, b in parts if a == b) == [0, 2, 3]  # empty shards: opened once, own nothing
    parts = [(s, a, b) for s, a, b in parts if b > a]
    assert sorted((s, i) for s, a, b in parts for i in range(a, b)) == [(1, 0), (1, 1), (1, 2), (4, 0), (4, 1)]


def test_fixed_with_counts_cuts_spans_and_needs_a_sample_per_worker():
    p = worker_plan([7, 7], 2, L(1, 4, 4), Schedule(0, "fixed", 3), 0, 0, 3)
    assert p.steps == 3 and p.samples and p.parts
    with pytest.raises(ConfigError, match="owns no sample"):
        worker_plan([1, 1], 2, L(1, 4, 4), Schedule(0, "fixed", 3), 0, 0, 0)


def test_epoch_layout_is_cheap_at_scale():
    counts = np.random.default_rng(0).integers(700, 1301, 100_000)
    plan = epoch_layout(counts, L(1024, 8, 256), Schedule(0), 0)
    assert plan.steps == int(counts.sum()) // (1024 * 256) and len(plan.bounds) == 8193
