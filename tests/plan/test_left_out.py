"""``even`` leaves out other samples every epoch, from anywhere in the shards (it used to leave out
the tail of the shard permuted last: with seed 0 on 13 shards, epochs 0 and 1 left out the same
26 keys). Pure plan checks: which positions, spread, read over (drops), each epoch its own."""

import numpy as np
import pytest

from dalistream.plan import Layout, Schedule, epoch_layout, worker_columns, worker_plan
from dalistream.plan.ownership import left_out_positions

EVEN = Schedule(0, "even")


def left_keys(counts, layout, schedule, epoch, columns=False):
    """(shard, index) of every sample no worker delivers in ``epoch``, from the workers' plans."""
    delivered = set()
    for r in range(layout.world_size):
        for w in range(layout.workers):
            plans = (worker_columns(counts, len(counts), layout, schedule, epoch, r, w) if columns
                     else [worker_plan(counts, len(counts), layout, schedule, epoch, r, w)])
            for plan in plans:
                raw = [(s, i) for s, a, b in plan.parts for i in range(a, b)]
                kept = [x for k, x in enumerate(raw) if k not in set(plan.drop)]
                assert len(kept) == plan.samples
                delivered |= set(kept)
    return {(s, i) for s, n in enumerate(counts) for i in range(n)} - delivered


@pytest.mark.parametrize("columns", [False, True], ids=["spans", "interleaved"])
def test_the_issue_case_leaves_out_other_samples_each_epoch_from_many_shards(columns):
    counts = [100] * 13  # 1300 samples; R=2, B=32: 20 steps, 20 left out
    layout = Layout(2, 2, 32)
    epochs = [left_keys(counts, layout, EVEN, e, columns) for e in range(4)]
    assert all(len(e) == 1300 - 20 * 64 for e in epochs)
    assert all(a != b for i, a in enumerate(epochs) for b in epochs[i + 1:])
    for left in epochs:
        assert len({s for s, _ in left}) >= 5  # spread over shards, not the tail of one
        assert len({i for _, i in left}) >= 10  # at many places within them


def test_one_left_out_in_each_stretch_and_none_twice():
    for total, layout in [(1300, Layout(2, 2, 32)), (1001, Layout(3, 1, 7)), (64, Layout(1, 1, 64)), (5, Layout(2, 1, 2))]:
        for epoch in range(5):
            left = left_out_positions(total, layout, EVEN, epoch)
            n = total - (total // (layout.world_size * layout.batch_size)) * layout.world_size * layout.batch_size
            assert len(left) == n == len(set(left.tolist()))
            edges = np.arange(n + 1) * total // max(n, 1)
            assert all(edges[i] <= p < edges[i + 1] for i, p in enumerate(left.tolist()))
    assert not len(left_out_positions(100, Layout(1, 1, 7), Schedule(0, "exact"), 0))


def test_the_same_on_every_rank_and_from_seed_and_epoch_alone():
    a = left_out_positions(1300, Layout(2, 2, 32), Schedule(5, "even"), 3)
    assert np.array_equal(a, left_out_positions(1300, Layout(2, 2, 32), Schedule(5, "even"), 3))
    assert not np.array_equal(a, left_out_positions(1300, Layout(2, 2, 32), Schedule(6, "even"), 3))


def test_reads_stay_sequential_left_out_samples_are_passed_over():
    """A worker's parts are one stretch of the sequence; the samples left out inside are drops."""
    counts = [37, 50, 13, 71]
    layout = Layout(2, 3, 9)
    plan = epoch_layout(counts, layout, EVEN, 2)
    for g in range(layout.global_workers):
        wp = worker_plan(counts, len(counts), layout, EVEN, 2, *divmod(g, layout.workers))
        assert list(wp.drop) == sorted(wp.drop) and all(0 <= d < sum(b - a for _, a, b in wp.parts) for d in wp.drop)
        assert wp.samples == plan.steps * layout.slots[g % layout.workers]
