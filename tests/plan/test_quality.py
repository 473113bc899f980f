"""The shuffle-quality measure: the batches it predicts are the plan's spans shuffled by the
worker's own buffer, every owned sample once, and its label statistics are those of the batches."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dalistream.errors import ConfigError
from dalistream.plan import Layout, Schedule, epoch_layout, seeds, worker_plan
from dalistream.plan.shuffle import shuffled
from dalistream.tools.quality import (batch_label_stats, rank_batches, shuffle_quality, sorted_labels,
                                     worker_streams)

from helpers import plan_case


@st.composite
def cases(draw):
    layout, schedule, counts = draw(plan_case())
    return (layout, schedule, counts, draw(st.integers(0, 3)), draw(st.sampled_from([0, 1, 2, 7, 100])),
            draw(st.integers(1, 9)), draw(st.booleans()))


def test_the_worker_shuffles_with_the_measures_buffer():
    from dalistream.worker import feed

    assert feed.shuffled is shuffled  # one implementation: what the measure predicts is what workers run


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_batches_hold_every_owned_sample_once(case):
    layout, schedule, counts, epoch, buffer, k, spread = case
    out = rank_batches(counts, layout, schedule, epoch, buffer, interleave=k, spread=spread)
    plan = epoch_layout(counts, layout, schedule, epoch)
    assert out.shape == (layout.world_size, plan.steps, layout.batch_size)
    ids = out[out >= 0]
    assert len(ids) == len(set(ids.tolist())) == int(plan.bounds[-1])
    assert ids.min(initial=0) >= 0 and ids.max(initial=-1) < plan.total
    if schedule.policy == "exact":
        assert len(ids) == plan.total
    streams = worker_streams(plan, layout, k, spread)
    assert [len(s) for s in streams] == np.diff(plan.bounds).tolist()  # each worker keeps its span's length
    assert sorted(np.concatenate(streams).tolist()) == list(range(int(plan.bounds[-1])))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_todays_batches_are_the_parts_through_the_buffer(case):
    """Independent of the measure's vectorized path: the worker's plan (parts less drops), item by
    item through the buffer, cut into slots."""
    layout, schedule, counts, epoch, buffer, _, _ = case
    out = rank_batches(counts, layout, schedule, epoch, buffer)
    written = np.concatenate([[0], np.cumsum(counts)])
    for r, w in itertools.product(range(layout.world_size), range(layout.workers)):
        plan = worker_plan(counts, len(counts), layout, schedule, epoch, r, w)
        items = [x for k, x in enumerate(int(written[s]) + i for s, a, b in plan.parts for i in range(a, b))
                 if k not in set(plan.drop)]  # even's left-out samples passed over
        g = layout.global_worker(r, w)
        emitted = list(shuffled(items, buffer, seeds.sample_shuffle(schedule.seed, epoch, g)))
        slot, lo = layout.slots[w], layout.slot_offsets[w]
        got = [i for i in out[r, :, lo:lo + slot].ravel().tolist() if i >= 0]
        assert got == emitted[:len(got)] and len(got) == min(len(emitted), out.shape[1] * slot)


def brute_stats(row):
    c = Counter(x for x in row if x >= 0)
    n = sum(c.values())
    return len(c), -sum(v / n * math.log2(v / n) for v in c.values())


@pytest.mark.parametrize("seed", range(5))
def test_label_stats_match_counting_row_by_row(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, [1, 3, 50][seed % 3], (40, 17))
    labels[rng.random(labels.shape) < 0.3] = -1  # padding
    labels[0] = -1
    stats = batch_label_stats(labels)
    for row, d, e in zip(labels, stats["distinct"], stats["entropy"]):
        bd, be = brute_stats(row.tolist())
        assert d == bd and e == pytest.approx(be, abs=1e-9)


def expected_distinct(sizes, n):
    """Mean distinct classes in n draws without replacement from classes of these sizes."""
    total = sum(sizes)
    lc = lambda a, b: math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)  # noqa: E731
    return sum(1 - (math.exp(lc(total - s, n) - lc(total, n)) if total - s >= n else 0) for s in sizes)


@pytest.mark.parametrize("classes,layout", [(100, Layout(8, 4, 32)), (37, Layout(3, 2, 10)), (10, Layout(2, 3, 7))])
def test_random_baseline_is_a_random_order(classes, layout):
    counts = [500] * 64
    q = shuffle_quality(counts, layout, Schedule(3), 0, 0, classes)
    sizes = np.bincount(sorted_labels(sum(counts), classes))
    for scope, n in (("rank_batch", layout.batch_size), ("global_batch", layout.batch_size * layout.world_size)):
        assert q["random"][scope]["distinct"] == pytest.approx(expected_distinct(sizes.tolist(), n), rel=0.03)


def test_the_issues_figures_and_what_the_buffer_changes():
    """64 shards × 500, 100 classes, 8 × 4 × 32 (issue #26): no shuffle, every worker's slot is 8
    consecutive samples (at most 2 classes); the buffer mixes a rank batch but only up to its
    workers' spans."""
    counts, layout = [500] * 64, Layout(8, 4, 32)
    plain = shuffle_quality(counts, layout, Schedule(0), 0, 0, 100)
    batches = rank_batches(counts, layout, Schedule(0), 0, 0)
    labels = sorted_labels(32000, 100)[batches]
    for w in range(4):
        slot = labels[:, :, 8 * w:8 * w + 8]
        assert batch_label_stats(slot.reshape(-1, 8))["distinct"].max() <= 2
    buffered = shuffle_quality(counts, layout, Schedule(0), 0, 1000, 100)
    assert plain["order"]["rank_batch"]["distinct"] == pytest.approx(4.1, abs=0.05)
    assert plain["order"]["global_batch"]["distinct"] == pytest.approx(32.5, abs=0.05)
    assert buffered["order"]["rank_batch"]["distinct"] == pytest.approx(14.6, abs=0.1)
    assert buffered["order"]["global_batch"]["distinct"] == pytest.approx(94.7, abs=0.1)
    assert buffered["order"]["rank_batch"]["entropy"] > plain["order"]["rank_batch"]["entropy"]


def test_spread_interleave_draws_each_slot_sample_from_its_own_place():
    """Candidate ordering: worker-major pieces, k = slot sub-spans read round robin, no buffer:
    a rank batch of 32 holds 32 samples from 32 places each of a different class."""
    counts, layout = [500] * 64, Layout(8, 4, 32)
    q = shuffle_quality(counts, layout, Schedule(0), 0, 0, 100, interleave=8, spread=True)
    assert q["order"]["rank_batch"]["distinct"] == 32 and q["order"]["rank_batch"]["distinct_min"] == 32
    rankmajor = shuffle_quality(counts, layout, Schedule(0), 0, 0, 100, interleave=8)
    assert rankmajor["order"]["rank_batch"]["distinct"] < 20  # a rank's workers read neighbouring places


def test_refusals():
    with pytest.raises(ConfigError):
        rank_batches([10] * 4, Layout(1, 1, 2), Schedule(0, "fixed", 3), 0, 0)
    with pytest.raises(ConfigError):
        rank_batches([10] * 4, Layout(1, 1, 2), Schedule(0), 0, 0, interleave=0)
    with pytest.raises(ConfigError):
        shuffle_quality([10] * 4, Layout(1, 1, 2), Schedule(0), 0, 0, labels=np.zeros(3))
    with pytest.raises(ConfigError):
        sorted_labels(10, 0)
