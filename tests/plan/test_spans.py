"""Property tests of span ownership over the pure plan, at the scale users run: R up to 1,024,
W up to 16, 1 to 100,000 shards of random sizes (empty ones and ones smaller than a slot)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dalistream.plan import Layout, Schedule, epoch_layout, owned_parts
from dalistream.tools.planview import epoch_summary


@st.composite
def cases(draw):
    R = draw(st.sampled_from([1, 2, 3, 7, 32, 64, 256, 1024]))
    W = draw(st.integers(1, 16))
    B = draw(st.integers(W, 4 * W + 13))
    n = draw(st.sampled_from([1, 2, 5, 17, 100, 1000, 10_000, 100_000]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    shape = draw(st.sampled_from(["equal", "uneven", "tiny", "with_empty"]))
    if shape == "equal":
        counts = np.full(n, draw(st.integers(1, 2000)))
    elif shape == "uneven":
        counts = rng.integers(1, 3000, n)
    elif shape == "tiny":  # most shards smaller than a slot
        counts = rng.integers(0, max(2, B // W), n)
    else:
        counts = np.where(rng.random(n) < 0.3, 0, rng.integers(1, 500, n))
    policy = draw(st.sampled_from(["even", "exact"]))
    return Layout(R, W, B), Schedule(draw(st.integers(0, 9)), policy), counts.astype(np.int64), draw(st.integers(0, 3))


def sample_sets(counts, layout, schedule, epoch, workers):
    """(position in the epoch sequence) intervals of every checked global worker's parts."""
    plan = epoch_layout(counts, layout, schedule, epoch)
    where = {int(s): int(plan.starts[i]) for i, s in enumerate(plan.order)}
    spans = {}
    for g in workers:
        r, w = divmod(g, layout.workers)
        parts = owned_parts(counts, len(counts), layout, schedule, epoch, r, w)
        assert all(0 <= a < b <= counts[s] or a == b == counts[s] == 0 for s, a, b in parts)
        parts = [p for p in parts if p[2] > p[1]]
        spans[g] = [(where[s] + a, where[s] + b) for s, a, b in parts]
    return plan, spans


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_spans_tile_the_epoch_once_and_keep_the_promises(case):
    layout, schedule, counts, epoch = case
    G, R, B = layout.global_workers, layout.world_size, layout.batch_size
    total = int(counts.sum())
    # every global worker when there are few, else a sample of them with both ends
    workers = range(G) if G <= 512 else sorted({0, G - 1, *np.random.default_rng(epoch).integers(0, G, 300).tolist()})
    plan, spans = sample_sets(counts, layout, schedule, epoch, workers)
    slots = np.tile(layout.slots, R)
    for g, intervals in spans.items():
        # one contiguous stretch, exactly the plan's edges: nothing owned twice, nothing between spans
        joined = [x for iv in intervals for x in iv]
        assert all(joined[i] == joined[i + 1] for i in range(1, len(joined) - 1, 2))
        lo, hi = (intervals[0][0], intervals[-1][1]) if intervals else (int(plan.edges[g]), int(plan.edges[g]))
        assert (lo, hi) == (int(plan.edges[g]), int(plan.edges[g + 1]))
        (drops,) = plan.drops_of([g])  # even's left-out samples inside the stretch, passed over
        assert [lo + d for d in drops] == [p for p in plan.left.tolist() if lo <= p < hi]
        assert hi - lo - len(drops) == int(plan.bounds[g + 1] - plan.bounds[g]) <= plan.steps * slots[g]
    assert np.all(np.diff(plan.bounds) >= 0) and plan.bounds[0] == 0
    if schedule.policy == "even":
        assert plan.steps == total // (R * B)
        assert np.array_equal(np.diff(plan.bounds), plan.steps * slots)
        assert total - int(plan.bounds[-1]) == len(plan.left) < R * B  # less than one batch per rank left out
        assert len(set(plan.left.tolist())) == len(plan.left) and all(0 <= p < total for p in plan.left.tolist())
    else:
        assert int(plan.bounds[-1]) == total  # every sample has its owner
        assert plan.steps * R * B - total < R * B  # padding: less than one step per rank
    if G <= 512 and schedule.policy == "exact":  # every empty shard is opened once, by one worker
        empties = sorted(s for g in range(G) for s, a, b in owned_parts(counts, len(counts), layout, schedule, epoch,
                                                                         *divmod(g, layout.workers)) if a == b)
        assert empties == sorted(np.flatnonzero(counts == 0).tolist())
    summary = epoch_summary(counts, layout, schedule, epoch)
    assert summary["left_out"] == total - int(plan.bounds[-1])


def test_issue_layouts_leave_out_at_most_a_batch_per_rank():
    rng = np.random.default_rng(1)
    short_last = np.r_[np.full(146, 1000), 300]
    for counts, R, W, B in [(np.full(1000, 1000), 32, 8, 256), (np.full(10_000, 1000), 256, 8, 256),
                            (short_last, 8, 4, 64), (rng.integers(700, 1301, 1024), 32, 4, 128),
                            (rng.integers(5, 40, 61), 8, 4, 8)]:
        s = epoch_summary(counts, Layout(R, W, B), Schedule(0), 0)
        assert s["left_out"] < R * B, s
        e = epoch_summary(counts, Layout(R, W, B), Schedule(0, "exact"), 0)
        assert e["left_out"] == 0 and e["padding"] < R * B, e


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 2**31))
def test_spans_worked_out_together_are_each_its_own(case, seed):
    """``parts_of``/``drops_of`` of many spans at once (any order, repeats: a worker's columns)
    give each span what it gives alone: no part crosses into a neighbour's list."""
    layout, schedule, counts, epoch = case
    plan = epoch_layout(counts, layout, schedule, epoch)
    G = len(plan.bounds) - 1
    spans = np.random.default_rng(seed).integers(0, G, min(G, 300) + 3).tolist() + [0, G - 1]
    together, drops = plan.parts_of(spans), plan.drops_of(spans)
    assert together == [plan.parts_of([g])[0] for g in spans] and drops == [plan.drops_of([g])[0] for g in spans]
    assert plan.parts_of([]) == [] and plan.drops_of([]) == []
