"""A rank's bucket plan from the epoch's counts (plan/bucketseq.py), indexed shard by shard,
against the same plan over every position given, indexed as one sequence (the path of a resumed
epoch's rest): every worker's plan identical, on layouts of every shape (R up to 1,024,
rare buckets, empty shards, fewer samples than columns, exact and even, shuffled or not, mixes);
and what one rank lays out stays near its share of the epoch however many ranks there are."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dalistream.plan import Layout, Schedule
from dalistream.plan.buckets import BucketEpoch, BucketMix
from dalistream.plan.bucketworker import bucket_run
from dalistream.plan.bucketseq import BucketIndex, column_counts, cut_before, cuts_of
from dalistream.plan.ownership import epoch_order
from dalistream.errors import ConfigError
from dalistream.tools.bucketview import written

FIELDS = ("emit_reader", "emit_index", "take", "offset", "bucket", "fill")


@st.composite
def case(draw, max_r, max_w, max_b, max_total):
    """Counts of 1-30 shards (some empty), 1-16 buckets of skewed sizes, a layout, a schedule, an epoch."""
    r, w = draw(st.integers(1, max_r)), draw(st.integers(1, max_w))
    b = draw(st.integers(w, max(w, max_b)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    shards = draw(st.integers(1, 30))
    counts = rng.integers(0, max(2, draw(st.integers(1, max_total)) // shards), shards)
    buckets = draw(st.integers(1, 16))
    weights = rng.random(buckets) ** 3 + 1e-3
    ids = rng.choice(buckets, int(counts.sum()), p=weights / weights.sum()).astype(np.int16)
    schedule = Schedule(draw(st.integers(0, 99)), draw(st.sampled_from(["exact", "even"])))
    return counts, ids, buckets, Layout(r, w, b), schedule, draw(st.integers(0, 3))


def same_worker(a, b):
    return (a.readers == b.readers and a.steps == b.steps and a.lookahead == b.lookahead
            and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS))


def laid_out(counts, ids, buckets, layout, schedule, epoch, **kw):
    """The plan over every position given, as a resume's rest is (the positions indexed as one
    sequence of their own, not shard by shard)."""
    return BucketEpoch(counts, ids, buckets, layout, schedule, epoch, "rank",
                       positions=np.arange(int(np.sum(counts))), **kw)


def compare(counts, ids, buckets, layout, schedule, epoch, columns=None, ranks=None):
    try:
        full = laid_out(counts, ids, buckets, layout, schedule, epoch, columns=columns)
    except ConfigError:
        return
    index = BucketIndex(counts, ids, buckets)
    every = BucketEpoch(counts, ids, buckets, layout, schedule, epoch, "rank", columns=columns, index=index)
    assert np.array_equal(every.rank_batches(), full.rank_batches())
    assert np.array_equal(written(every, every.rank_batches()), written(full, full.rank_batches()))
    assert every.left_out_count == full.left_out_count == len(full.left_out)
    for r in (range(layout.world_size) if ranks is None else ranks):
        one = BucketEpoch(counts, ids, buckets, layout, schedule, epoch, "rank", columns=columns, ranks=(r,),
                          index=index)
        assert (one.steps, one.left_out_count) == (full.steps, full.left_out_count)
        assert np.array_equal(one.step_bucket[r], full.step_bucket[r])
        for w in range(layout.workers):
            assert same_worker(one.worker(r, w), full.worker(r, w)), (r, w)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=case(max_r=9, max_w=4, max_b=24, max_total=1500), columns=st.sampled_from([None, 1, 2, 5]),
       shuffle=st.booleans())
def test_a_ranks_plan_from_counts_is_the_laid_out_plan(c, columns, shuffle):
    counts, ids, buckets, layout, schedule, epoch = c
    schedule = Schedule(schedule.seed, schedule.policy, shuffle_shards=shuffle)
    compare(counts, ids, buckets, layout, schedule, epoch, columns)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=case(max_r=1024, max_w=8, max_b=256, max_total=40000), rank=st.floats(0, 1))
def test_the_same_at_large_layouts(c, rank):
    """R up to 1,024 (often more columns than samples: empty columns), one rank and its workers."""
    counts, ids, buckets, layout, schedule, epoch = c
    compare(counts, ids, buckets, layout, schedule, epoch, ranks=[min(int(rank * layout.world_size),
                                                                      layout.world_size - 1)])


@pytest.mark.parametrize("shape", ["rare", "one-bucket", "empty-shards", "tiny"])
def test_the_same_on_awkward_data(shape):
    """A bucket of 3 samples spread over the whole epoch (one rank owns it, reading far from its
    own columns); one bucket only; shards with no samples; fewer samples than columns."""
    rng = np.random.default_rng(11)
    counts = rng.integers(5, 40, 40)
    if shape == "empty-shards":
        counts[::3] = 0
    if shape == "tiny":
        counts = np.array([3, 0, 2, 4])
    k = 1 if shape == "one-bucket" else 4
    ids = rng.integers(0, k, int(counts.sum()))
    if shape == "rare":
        ids[ids == 3] = 2
        ids[rng.choice(len(ids), 3, replace=False)] = 3
    for layout in (Layout(4, 2, 4), Layout(7, 3, 3), Layout(2, 1, 1)):
        for policy in ("exact", "even"):
            compare(counts, ids, k, layout, Schedule(5, policy), 1)


def test_index_counts_a_shards_first_samples():
    rng = np.random.default_rng(2)
    counts = np.array([0, 7, 1, 30, 0, 12])
    ids = rng.integers(0, 5, int(counts.sum()))
    index = BucketIndex(counts, ids, 5)
    written = np.r_[0, np.cumsum(counts)]
    shard = np.array([s for s in range(len(counts)) for _ in range(counts[s] + 1)])
    x = np.array([i for s in range(len(counts)) for i in range(counts[s] + 1)])
    want = np.array([np.bincount(ids[written[s]:written[s] + i], minlength=5) for s, i in zip(shard, x)])
    assert np.array_equal(index.prefix(shard, x), want)
    assert np.array_equal(index.hist.sum(axis=1), counts)


def test_column_counts_are_the_laid_out_epochs():
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 30, 25)
    ids = rng.integers(0, 6, int(counts.sum()))
    layout, schedule = Layout(3, 2, 5), Schedule(9, "exact")
    full = laid_out(counts, ids, 6, layout, schedule, 2, columns=5)
    order = epoch_order(len(counts), 9, 2)
    blocks = column_counts(BucketIndex(counts, ids, 6), order, full.shards.starts, 3, 5)
    assert np.array_equal(blocks.read_start[:-1] + blocks.size, blocks.read_start[1:])
    for j in range(15):  # block j: rank j // 5's (j % 5)-th column, in reading order
        seen = full.seq[blocks.read_start[j]:blocks.read_start[j + 1]]
        assert np.array_equal(blocks.cum[j + 1] - blocks.cum[j], np.bincount(seen, minlength=6))
        assert (full.column[blocks.read_start[j]:blocks.read_start[j + 1]] == (j % 5) * 3 + j // 5).all()


def test_cuts_from_counts_are_the_laid_out_cuts():
    rng = np.random.default_rng(8)
    for trial in range(30):
        r, w, b, k = int(rng.integers(2, 12)), 1, int(rng.integers(1, 9)), int(rng.integers(1, 6))
        counts = rng.integers(0, 25, int(rng.integers(r, 4 * r)))
        ids = rng.integers(0, k, int(counts.sum()))
        policy = ("exact", "even")[trial % 2]
        full = laid_out(counts, ids, k, Layout(r, w, b), Schedule(trial, policy), 0, columns=b)
        pos = [np.flatnonzero(full.seq == q) for q in range(k)]

        def before(cap, thresholds):  # counted sample by sample over the laid-out reading order
            counted = np.zeros(len(full.seq), dtype=np.int64)
            for q, p in enumerate(pos):
                counted[p[:cap[q]]] = 1
            at = np.searchsorted(np.cumsum(counted), thresholds, side="left") + 1  # prefix lengths reaching each
            return np.stack([np.minimum(np.searchsorted(p, at, side="left"), cap[q]) for q, p in enumerate(pos)], axis=1)

        dense = cuts_of(full.totals, full.units, full.layout, policy, before)
        index, order = BucketIndex(counts, ids, k), epoch_order(len(counts), trial, 0)
        blocks = column_counts(index, order, full.shards.starts, r, b)
        sparse = cuts_of(full.totals, full.units, full.layout, policy,
                         lambda cap, t: cut_before(index, order, full.shards.starts, blocks, r, b, cap, t))
        assert np.array_equal(dense, sparse)


def test_a_mix_laid_out_for_one_rank_gives_its_workers_the_same_plans():
    rng = np.random.default_rng(5)
    counts = [rng.integers(20, 60, 30), rng.integers(20, 60, 20)]
    ids = [rng.integers(0, 4, int(c.sum())) for c in counts]
    layout = Layout(3, 2, 8)
    full = BucketMix(counts, ids, 4, [0.6, 0.4], layout, Schedule(1, "even"), 2)
    indexes = [BucketIndex(c, i, 4) for c, i in zip(counts, ids)]
    for r in range(3):
        one = BucketMix(counts, ids, 4, [0.6, 0.4], layout, Schedule(1, "even"), 2, ranks=(r,), indexes=indexes)
        runs = [bucket_run(m.worker(r, 0)[0], 0, *m.worker(r, 0)[1:]) for m in (one, full)]
        assert np.array_equal(runs[0].bucket, runs[1].bucket)  # each step's bucket, as the rank runs it
        for w in range(2):
            a, b = one.worker(r, w), full.worker(r, w)
            assert all(same_worker(x, y) for x, y in zip(a[0], b[0]))
            assert np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])


@pytest.mark.parametrize("ranks", [16, 128, 512])
def test_a_rank_lays_out_about_its_share_however_many_ranks(ranks):
    """What one rank's plan lays out (its samples, the neighbours' it passes over, the blocks
    where cuts fall) stays within a few of its shares as ranks grow, where it was the whole epoch
    (3.0-3.3 shares at 16-512 ranks reading 2B columns each: its whole units of the 1% bucket reach
    into its neighbours' columns)."""
    rng = np.random.default_rng(ranks)
    counts = np.full(4 * ranks, 250)
    p = np.array([40, 20, 15, 10, 8, 4, 2, 1], dtype=float)
    ids = rng.choice(8, int(counts.sum()), p=p / p.sum())
    layout = Layout(ranks, 4, 32)
    share = int(counts.sum()) // ranks
    one = BucketEpoch(counts, ids, 8, layout, Schedule(0, "exact"), 0, ranks=(ranks // 2,),
                      index=BucketIndex(counts, ids, 8))
    assert len(one.positions) <= 3.5 * share
    assert sum(int(one.worker(ranks // 2, w).take.sum()) for w in range(4)) >= share - 8 * 32
