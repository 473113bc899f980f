"""Bucket plans, checked by executing them: every worker's plan (parts, drops, what it emits at
each step and where) is run against the epoch's shard order the way a worker reads — front to
back, holding what it has read and not yet emitted — and the batches it builds are checked,
independently of how the plan computed them: every batch one bucket (per rank, or the same on
every rank for ``per="global"``), ``exact``: every sample once with padding only in the last
batch of each bucket on a rank (and at most one step of padding alone); ``even``: no sample
twice, no padding, less than one batch per rank of each bucket left out; equal steps on every
rank; what a worker holds never above the bound (``per="rank"``) nor above what it reports."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dalistream.errors import ConfigError
from dalistream.plan import Layout, Schedule
from dalistream.plan.buckets import BucketEpoch, bucket_steps, bucket_totals
from dalistream.tools.bucketview import (bucket_quality, bucket_reading, bucket_summary, pixel_cost, rank_bound,
                                         token_padding, written)


def execute(plan, counts, schedule, epoch):
    """Run every worker's plan: ``(batches (R, S, B) of written-order sample ids, -1 padding,
    the most any worker held)``."""
    layout = plan.layout
    written = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=written[1:])
    out = np.full((layout.world_size, plan.steps, layout.batch_size), -1, dtype=np.int64)
    held_most = 0
    for r in range(layout.world_size):
        for w in range(layout.workers):
            wp = plan.worker(r, w)
            assert wp.steps == plan.steps and len(wp.take) == plan.steps
            kept = []
            for parts, drop in wp.readers:  # each reader: its parts front to back, its drops skipped
                raw = [int(written[s]) + k for s, a, b in parts for k in range(a, b)]
                kept.append([x for i, x in enumerate(raw) if i not in set(drop)])
            pairs = sorted(zip(wp.emit_reader.tolist(), wp.emit_index.tolist()))
            assert pairs == [(j, i) for j, k in enumerate(kept) for i in range(len(k))]  # each kept sample once
            at, read = 0, [0] * len(kept)
            for t in range(plan.steps):
                n = int(wp.take[t])
                readers, index = wp.emit_reader[at:at + n], wp.emit_index[at:at + n]
                at += n
                for j, i in zip(readers.tolist(), index.tolist()):
                    read[j] = max(read[j], i + 1)  # each reader read front to back up to what it needs
                if n:
                    assert (out[r, t, wp.offset[t]:wp.offset[t] + n] == -1).all()  # no position twice
                    out[r, t, wp.offset[t]:wp.offset[t] + n] = [kept[j][i] for j, i in zip(readers, index)]
                held = sum(read) - (at - n)  # read, not emitted before this step
                held_most = max(held_most, held)
                assert held <= wp.lookahead
    return out, held_most


def check(counts, ids, buckets, layout, schedule, epoch, per):
    plan = BucketEpoch(counts, ids, buckets, layout, schedule, epoch, per)
    batches, held = execute(plan, counts, schedule, epoch)
    assert np.array_equal(written(plan, plan.rank_batches()), batches)  # the plan's own table says the same
    total = int(np.sum(counts))
    n = bucket_totals(ids, buckets)
    r_count, b = layout.world_size, layout.batch_size
    assert plan.steps == bucket_steps(n, layout, schedule, per)  # from the counts of each bucket alone
    real = batches[batches >= 0]
    assert len(real) == len(set(real.tolist()))  # no sample twice
    of = np.where(batches >= 0, np.asarray(ids)[np.maximum(batches, 0)], -1)
    for r in range(r_count):
        for t in range(plan.steps):
            got = set(of[r, t][of[r, t] >= 0].tolist())
            assert got <= {int(plan.step_bucket[r, t])}  # one bucket per batch
    if per == "global":
        assert (plan.step_bucket == plan.step_bucket[0]).all()
    left = n - np.bincount(np.asarray(ids)[real], minlength=buckets)[:buckets]
    if schedule.policy == "exact":
        assert sorted(real.tolist()) == list(range(total))
        for r in range(r_count):
            padded = (batches[r] < 0).any(axis=1)
            alone = (batches[r] < 0).all(axis=1)
            assert alone.sum() <= (1 if per == "rank" else buckets)
            for k in range(buckets):  # at most the last batch of each bucket padded
                assert (padded & ~alone & (plan.step_bucket[r] == k)).sum() + (
                    (alone & (plan.step_bucket[r] == k)).sum() if per == "global" else 0) <= 1
    else:
        assert (batches >= 0).all()  # even: full batches only
        assert (left < r_count * b).all() and (left >= 0).all()  # less than one batch per rank of each bucket
    if per == "rank":
        assert held <= rank_bound(plan) and plan.lookahead.max(initial=0) <= rank_bound(plan)
    return plan


def skewed(draw, total, buckets):
    weights = np.asarray(draw(st.lists(st.floats(0.01, 1.0), min_size=buckets, max_size=buckets))) ** 3
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    return rng.choice(buckets, total, p=weights / weights.sum()).astype(np.int16)


@st.composite
def case(draw, max_r=1024, max_w=8, max_b=256, max_total=6000):
    r = draw(st.integers(1, max_r))
    w = draw(st.integers(1, max_w))
    b = draw(st.integers(w, max(w, max_b)))
    shards = draw(st.integers(1, 30))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    counts = rng.integers(0, max(2, draw(st.integers(1, max_total)) // shards), shards)
    buckets = draw(st.integers(1, 16))
    ids = skewed(draw, int(counts.sum()), buckets)
    schedule = Schedule(draw(st.integers(0, 99)), draw(st.sampled_from(["exact", "even"])))
    return counts, ids, buckets, Layout(r, w, b), schedule, draw(st.integers(0, 3)), draw(st.sampled_from(["rank", "global"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=case(max_r=6, max_w=4, max_b=24, max_total=800))
def test_small_layouts(c):
    check(*c)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=case(max_total=40000))
def test_large_layouts(c):
    """R up to 1,024, W up to 8, B up to 256, 1 to 16 buckets of skewed sizes."""
    check(*c)


def test_steps_and_lookahead_at_scale():
    """200,000 samples over 64 ranks x 8 workers x 64, eight buckets from 40% down to 1%: the
    rank bound holds, and a worker holds far less (about 1/W of a rank's)."""
    rng = np.random.default_rng(3)
    counts = rng.integers(300, 500, 500)
    p = np.array([40, 20, 15, 10, 8, 4, 2, 1], dtype=float)
    ids = rng.choice(8, int(counts.sum()), p=p / p.sum()).astype(np.int16)
    layout = Layout(64, 8, 64)
    plan = BucketEpoch(counts, ids, 8, layout, Schedule(0, "even"), 0)
    assert plan.lookahead.max() <= rank_bound(plan) // 2
    assert bucket_summary(plan)["left_out"] < 8 * 64 * 64


def test_new_order_each_epoch():
    rng = np.random.default_rng(0)
    counts = np.full(20, 50)
    ids = rng.integers(0, 4, 1000).astype(np.int16)
    layout = Layout(2, 2, 8)
    orders = [BucketEpoch(counts, ids, 4, layout, Schedule(0, "exact"), e).step_bucket.tolist() for e in range(3)]
    assert orders[0] != orders[1] != orders[2]
    again = BucketEpoch(counts, ids, 4, layout, Schedule(0, "exact"), 1).step_bucket.tolist()
    assert again == orders[1]  # a pure function of (seed, epoch)


def test_rank_stretches_barely_overlap():
    """A rank reads its stretch of the sequence; neighbours overlap by less than a unit per bucket."""
    rng = np.random.default_rng(1)
    counts = np.full(100, 200)
    ids = rng.choice(3, 20000, p=[0.6, 0.3, 0.1]).astype(np.int16)
    layout = Layout(8, 1, 32)
    plan = BucketEpoch(counts, ids, 3, layout, Schedule(0, "exact"), 0)
    read = sum(b - a for r in range(8) for parts, _ in plan.worker(r, 0).readers for _, a, b in parts)
    assert read <= 20000 + 8 * 2 * 3 * 32 / 0.1  # each cut: under one unit of each bucket, spread by its share


@pytest.mark.parametrize("bad", [dict(policy="fixed"), dict(per="node")])
def test_refused(bad):
    schedule = Schedule(0, "fixed", 3) if "policy" in bad else Schedule(0, "even")
    with pytest.raises(ConfigError):
        BucketEpoch([4], np.zeros(4, dtype=np.int16), 1, Layout(1, 1, 2), schedule, 0, bad.get("per", "rank"))


def test_bad_ids():
    with pytest.raises(ConfigError, match="3 sample buckets for 4"):
        BucketEpoch([4], np.zeros(3, dtype=np.int16), 1, Layout(1, 1, 2), Schedule(), 0)
    with pytest.raises(ConfigError, match="must be 0"):
        BucketEpoch([2], np.array([0, 2]), 2, Layout(1, 1, 2), Schedule(), 0)


def test_lookahead_limit_refuses():
    rng = np.random.default_rng(0)
    counts = np.full(10, 100)
    ids = rng.integers(0, 6, 1000).astype(np.int16)
    plan = BucketEpoch(counts, ids, 6, Layout(2, 2, 16), Schedule(), 0)
    most = int(plan.lookahead.max())
    BucketEpoch(counts, ids, 6, Layout(2, 2, 16), Schedule(), 0, lookahead=most)
    with pytest.raises(ConfigError, match=f"hold {most} samples at once.*lookahead={most - 1}"):
        BucketEpoch(counts, ids, 6, Layout(2, 2, 16), Schedule(), 0, lookahead=most - 1)


# -- elastic resume ------------------------------------------------------------------------------

from dalistream.plan.buckets import resumed_bucket_plan  # noqa: E402
from dalistream.errors import StateError  # noqa: E402


def run_segments(counts, ids, buckets, layouts, fractions, schedule, epoch, per):
    """Each layout runs a fraction of its plan's steps (the last one to the end), executed worker
    by worker; returns every sample delivered and the last plan."""
    segments, delivered = [], []
    for k, layout in enumerate(layouts):
        plan = resumed_bucket_plan(counts, ids, buckets, layout, schedule, epoch, per, segments)
        steps = plan.steps if k == len(layouts) - 1 else int(fractions[k] * plan.steps)
        batches, _ = execute(plan, counts, schedule, epoch)
        of = np.where(batches >= 0, np.asarray(ids)[np.maximum(batches, 0)], -1)
        for r in range(layout.world_size):  # every batch of every segment one bucket
            for t in range(steps):
                assert set(of[r, t][of[r, t] >= 0].tolist()) <= {int(plan.step_bucket[r, t])}
        done = batches[:, :steps]
        delivered += done[done >= 0].tolist()
        segments.append((layout.world_size, layout.workers, layout.batch_size, steps))
    return delivered, plan


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=case(max_r=64, max_w=8, max_b=64, max_total=4000),
       more=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 8), st.integers(1, 64)), min_size=1, max_size=3),
       fractions=st.lists(st.floats(0, 1), min_size=3, max_size=3))
def test_elastic_resume_is_exact(c, more, fractions):
    counts, ids, buckets, layout, schedule, epoch, per = c
    layouts = [layout] + [Layout(r, w, max(w, b)) for r, w, b in more]
    delivered, last = run_segments(counts, ids, buckets, layouts, fractions, schedule, epoch, per)
    total = int(np.sum(counts))
    assert len(delivered) == len(set(delivered))
    if schedule.policy == "exact":
        assert sorted(delivered) == list(range(total))
    else:
        left = bucket_totals(ids, buckets) - np.bincount(np.asarray(ids)[delivered], minlength=buckets)[:buckets]
        final = layouts[-1]
        assert (left < final.world_size * final.batch_size).all()


def test_resume_on_the_same_layout_continues_the_plan():
    rng = np.random.default_rng(2)
    counts = rng.integers(20, 80, 12)
    ids = rng.integers(0, 3, int(counts.sum())).astype(np.int16)
    layout, schedule = Layout(2, 2, 8), Schedule(4, "exact")
    whole = BucketEpoch(counts, ids, 3, layout, schedule, 1).rank_batches()
    rest = resumed_bucket_plan(counts, ids, 3, Layout(1, 1, 5), schedule, 1, "rank", [(2, 2, 8, 5)]).rank_batches()
    delivered = set(whole[:, :5][whole[:, :5] >= 0].tolist()) | set(rest[rest >= 0].tolist())
    assert delivered == set(range(int(counts.sum())))


def test_resume_state_from_elsewhere_is_refused():
    counts = [10]
    ids = np.zeros(10, dtype=np.int16)
    with pytest.raises(StateError, match="ran 99 steps of a bucket plan of"):
        resumed_bucket_plan(counts, ids, 1, Layout(1, 1, 2), Schedule(), 0, "rank", [(1, 1, 2, 99)])


# -- mixing ---------------------------------------------------------------------------------------

from dalistream.plan.buckets import BucketMix  # noqa: E402
from dalistream.plan.bucketworker import bucket_run  # noqa: E402
from helpers import mix_bucket_batches  # noqa: E402


def test_stratified_mix_with_buckets_is_refused():
    with pytest.raises(ConfigError, match="stratified mix.*per_batch='source'"):
        BucketMix([[10], [10]], [np.zeros(10), np.zeros(10)], 1, [0.5, 0.5], Layout(1, 1, 2), Schedule(), 0,
                  per_batch="sample")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=case(max_r=8, max_w=4, max_b=32, max_total=3000), other=st.integers(200, 3000),
       weight=st.floats(0.1, 0.9), seed=st.integers(0, 99))
def test_mix_by_source_keeps_both(c, other, weight, seed):
    """Every batch one source and one bucket; after every step each source within one batch of its
    weight; no sample twice; equal steps on every rank."""
    counts, ids, buckets, layout, schedule, epoch, per = c
    rng = np.random.default_rng(seed)
    counts2 = rng.integers(0, 100, max(1, other // 50))
    ids2 = rng.integers(0, buckets, int(counts2.sum())).astype(np.int16)
    try:
        mix = BucketMix([counts, counts2], [ids, ids2], buckets, [weight, 1 - weight], layout, schedule, epoch, per)
    except ConfigError as e:
        assert "no batch of its own" in str(e) or "rounds to 0" in str(e) or "is empty" in str(e)
        return
    batches = mix_bucket_batches(mix)
    source = np.where(batches >= 0, batches >> 48, -1)
    position = batches & ((1 << 48) - 1)
    for t in range(mix.steps):
        assert set(source[:, t][source[:, t] >= 0].tolist()) <= {int(mix.source[t])}
    dealt = np.cumsum(np.eye(2, dtype=np.int64)[mix.source], axis=0)
    share = np.arange(1, mix.steps + 1)[:, None] * np.array([weight, 1 - weight])[None, :]
    assert (np.abs(dealt - share) < 1 + 1e-9).all()
    for s, (plan, sid) in enumerate(zip(mix.plans, [ids, ids2])):
        mine = position[source == s]
        assert len(mine) == len(set(mine.tolist()))
        read = written(plan, mine)
        for r in range(layout.world_size):
            buckets = bucket_run(mix.worker(r, 0)[0], 0, *mix.worker(r, 0)[1:]).bucket  # each step's, as run
            for t in np.flatnonzero(mix.source == s):
                row = batches[r, t][batches[r, t] >= 0] & ((1 << 48) - 1)
                got = set(np.asarray(sid)[written(plan, row)].tolist())
                assert got <= {int(buckets[t])}
        assert len(read) <= len(sid)


# -- figures ---------------------------------------------------------------------------------------



def test_bucket_quality_on_class_sorted_data():
    """Columns spread over the epoch: each bucket's batches mix classes nearly as a random order
    of the bucket's samples does (one stretch per rank would give a few classes per batch)."""
    rng = np.random.default_rng(4)
    counts = np.full(100, 400)
    ids = rng.choice(4, 40000, p=[0.4, 0.3, 0.2, 0.1]).astype(np.int16)
    plan = BucketEpoch(counts, ids, 4, Layout(4, 4, 64), Schedule(0, "even"), 0)
    q = bucket_quality(plan, classes=100)
    assert len(q["buckets"]) == 4 and all(b["vs_random"] > 0.7 for b in q["buckets"])
    one_column = BucketEpoch(counts, ids, 4, Layout(4, 4, 64), Schedule(0, "even"), 0, columns=1)
    assert all(b["vs_random"] < 0.4 for b in bucket_quality(one_column, classes=100)["buckets"])
    assert q["repeat_rate"] < q["repeat_rate_random"]


@pytest.mark.parametrize("shards, shares, layout, per, policy", [
    (64, [0.4, 0.3, 0.2, 0.1], Layout(8, 4, 32), "rank", "even"),  # the layout
    (64, [0.25, 0.25, 0.25, 0.25], Layout(8, 4, 32), "rank", "exact"),
    (200, [0.5, 0.3, 0.1, 0.05, 0.05], Layout(4, 2, 64), "rank", "even"),
    (64, [0.6, 0.4], Layout(8, 4, 16), "rank", "exact"),
    (64, [0.4, 0.3, 0.2, 0.1], Layout(8, 4, 32), "global", "even"),
])
def test_bucket_batches_mix_as_a_random_order(shards, shares, layout, per, policy):
    """Class-sorted data: every bucket's batches hold at least 90% of the distinct labels of a
    random order of the bucket's samples in batches of the same shapes, rare buckets too (a rank
    reading one column per batch position gave 75-82%: a batch of a bucket of share p formed over
    1/p lockstep rounds, several samples from one column), and the look-ahead bound still holds."""
    rng = np.random.default_rng(shards)
    counts = rng.integers(900, 1100, shards)
    ids = rng.choice(len(shares), int(counts.sum()), p=shares).astype(np.int16)
    plan = BucketEpoch(counts, ids, len(shares), layout, Schedule(1, policy), 0, per)
    q = bucket_quality(plan, classes=100)
    assert len(q["buckets"]) == len(shares)
    assert min(b["vs_random"] for b in q["buckets"]) >= 0.9, [round(b["vs_random"], 3) for b in q["buckets"]]
    if per == "rank":
        assert plan.lookahead.max() <= rank_bound(plan)


@pytest.mark.parametrize("columns", [None, 1, 32, 96])
@pytest.mark.parametrize("layout, per", [(Layout(8, 4, 32), "rank"), (Layout(3, 2, 16), "global")])
def test_bucket_reading_counts_the_workers_readers_and_parts(columns, layout, per):
    """The reading figure is what the worker plans read: their readers, and a part per shard each
    reader's stretch touches."""
    rng = np.random.default_rng(7)
    counts = rng.integers(50, 400, 40)
    ids = rng.choice(3, int(counts.sum()), p=[0.6, 0.3, 0.1]).astype(np.int16)
    plan = BucketEpoch(counts, ids, 3, layout, Schedule(2, "exact"), 1, per, columns=columns)
    plans = [plan.worker(r, w) for r in range(layout.world_size) for w in range(layout.workers)]
    readers = [len(p.readers) for p in plans]
    parts = [sum(len(parts) for parts, _ in p.readers) for p in plans]
    got = bucket_reading(plan)
    assert got["readers"] == {"mean": sum(readers) / len(plans), "max": max(readers)}
    assert got["parts"] == {"mean": sum(parts) / len(plans), "max": max(parts)}
    sizes = [int(b) - int(a) for p in plans for parts, _ in p.readers for _, a, b in parts]
    assert got["samples_per_part"] == pytest.approx(sum(sizes) / len(sizes))
    assert bucket_summary(plan)["reading"] == got


def test_pixel_cost_and_token_padding():
    same = pixel_cost(np.array([400, 300]), np.array([300, 400]), np.array([0, 1]), np.array([4, 3]), np.array([3, 4]))
    assert same == {"lost": 0.0, "stretch": 1.0, "stretched_10": 0.0}
    square = pixel_cost(np.array([400]), np.array([200]), np.array([0]), np.array([1]), np.array([1]))
    assert square["lost"] == pytest.approx(0.5) and square["stretch"] == pytest.approx(2.0)
    padded = token_padding(np.array([1, 5, 2, 2]), np.array([[0, 1], [2, 3], [3, -1]]))
    assert padded == {"tokens": 12, "padding": 4, "padding_share": 4 / 16}
