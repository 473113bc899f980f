"""Elastic resume over the pure plan: an epoch run in 1 to 4 segments under different layouts
delivers every sample once (``exact``), none twice (``even``, left out at most R·B of the last
layout). What each segment's worker delivers is simulated independently of plan.resume's window
arithmetic: its parts and drops are turned into epoch positions through the shard order, then run
through the real shuffle buffer, and its first ``steps × slot`` outputs taken."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dalistream.errors import StateError
from dalistream.plan import Layout, Schedule, worker_plan
from dalistream.plan.affinity import AffinePlan
from dalistream.tools.planview import remaining_summary
from dalistream.plan.resume import check_segments

from helpers import run_epoch, small_layout


def big_layout():
    return st.tuples(st.integers(1, 1024), st.integers(1, 16), st.integers(1, 512)).map(
        lambda t: Layout(t[0], t[1], max(t[1], t[2])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=30),
       layouts=st.lists(small_layout(), min_size=2, max_size=4),
       steps=st.lists(st.integers(0, 12), min_size=3, max_size=3),
       policy=st.sampled_from(["exact", "even"]), shuffle=st.sampled_from([0, 1, 3, 16]),
       seed=st.integers(0, 99), epoch=st.integers(0, 3))
@pytest.mark.slow
def test_segments_deliver_the_epoch(counts, layouts, steps, policy, shuffle, seed, epoch):
    total = sum(counts)
    if total == 0:
        return
    schedule = Schedule(seed, policy)
    delivered, _ = run_epoch(counts, schedule, epoch, layouts, steps, shuffle)
    assert len(delivered) == len(set(delivered))  # no sample twice, in any policy
    if policy == "exact":
        assert sorted(delivered) == list(range(total))
    else:
        last = layouts[-1]
        assert set(delivered) <= set(range(total))
        assert total - len(delivered) < last.world_size * last.batch_size


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 300), min_size=1, max_size=60),
       layouts=st.lists(big_layout(), min_size=2, max_size=4),
       fractions=st.lists(st.floats(0, 1), min_size=3, max_size=3),
       policy=st.sampled_from(["exact", "even"]), shuffle=st.sampled_from([0, 64]))
@pytest.mark.slow
def test_large_layouts(counts, layouts, fractions, policy, shuffle):
    """R up to 1,024, W up to 16, B up to 512, with layout changes at random steps."""
    total = sum(counts)
    schedule = Schedule(5, policy)
    segments = []
    for k, layout in enumerate(layouts[:-1]):
        plan = AffinePlan(counts, layout, None, schedule, 1, columns=False, shuffle=shuffle, segments=segments)
        segments.append((layout.world_size, layout.workers, layout.batch_size, int(fractions[k] * plan.steps)))
    steps = [s[3] for s in segments]
    delivered, _ = run_epoch(counts, schedule, 1, layouts, steps, shuffle)
    assert len(delivered) == len(set(delivered))
    if policy == "exact":
        assert sorted(delivered) == list(range(total))
    else:
        assert total - len(delivered) < layouts[-1].world_size * layouts[-1].batch_size


@pytest.mark.parametrize("shuffle", [0, 8])
@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_no_segment_is_the_plain_plan(shuffle, policy, epoch):
    """Without earlier segments the resumed plan is the epoch's own plan (same parts, steps, drops:
    even's left-out samples are passed over by the same workers)."""
    counts, layout, schedule = [5, 0, 9, 3, 7, 11, 4], Layout(2, 2, 4), Schedule(1, policy)
    plan = AffinePlan(counts, layout, None, schedule, epoch, columns=False, shuffle=shuffle, segments=[])
    for r, w in itertools.product(range(2), range(2)):
        a, b = plan.plans(r, w)[0], worker_plan(counts, len(counts), layout, schedule, epoch, r, w)
        assert [p for p in b.parts if p[2] > p[1]] == list(a.parts)
        assert (a.steps, a.samples, a.drop, a.left_out) == (b.steps, b.samples, b.drop, b.left_out)


def test_the_worked_example_four_ranks_to_three():
    """The README's example: 4 ranks x 2 workers x batch 8 stop at step 5 of 13; 3 ranks x 1
    worker x batch 12 run the rest."""
    counts = [100] * 4
    before = remaining_summary(counts, Layout(4, 2, 8), Schedule(0, "exact"), 0, [], 0)
    after = remaining_summary(counts, Layout(3, 1, 12), Schedule(0, "exact"), 0, [(4, 2, 8, 5)], 0)
    assert before["steps"] == 13 and before["remaining"] == 400
    assert after["delivered"] == 160 and after["remaining"] == 240 and after["steps"] == 7


def test_a_window_delivered_in_part_is_dropped_not_reread():
    """With a shuffle buffer, a past worker's window (what it read but did not all deliver) is read
    again and its delivered samples dropped by ordinal: at most (buffer) of them are kept, and
    the fully delivered prefix is not read at all."""
    counts, schedule = [1000], Schedule(0, "exact")
    plan = AffinePlan(counts, Layout(1, 1, 10), None, schedule, 0, columns=False, shuffle=50, segments=[(1, 1, 10, 30)])
    (wp,) = plan.plans(0, 0)
    assert wp.drop and wp.samples == 700
    assert wp.drop[-1] + 1 - len(wp.drop) <= 50  # kept samples up to the window's end
    assert 0 < wp.parts[0][1] < 300  # the window starts after the prefix, before the 300 delivered end


@pytest.mark.parametrize("bad", [[1, 2, 3], [0, 1, 1, 0], [1, 2, 1, 0], [1, 1, 1, -1], ["1", 1, 1, 1], [1, 1, 1, True]])
def test_bad_segments_are_state_errors(bad):
    with pytest.raises(StateError, match="segment 0"):
        check_segments([bad])


def test_a_segment_past_its_plan_is_a_state_error():
    with pytest.raises(StateError, match="ran 99 steps"):
        AffinePlan([10, 10], Layout(1, 1, 2), None, Schedule(0, "exact"), 0, columns=False, shuffle=0, segments=[(1, 1, 2, 99)])


def test_fixed_continues_the_remaining_batches():
    schedule = Schedule(0, "fixed", batches_per_epoch=20)
    plan = AffinePlan([30, 30], Layout(2, 1, 4), None, schedule, 0, columns=False, shuffle=0, segments=[(3, 1, 4, 7)])
    assert plan.steps == 13 and plan.plans(1, 0)[0].steps == 13
