"""What a worker executes of a bucket plan (``bucket_run``), checked by executing it: each reader
read front to back from its start (passing over ``gone``), ``reads[t]`` rows of it at step t,
the rows held until emitted. From any step: every emitted sample has been read by its step, the
samples and batch positions are the plan's, the workers of a rank fill its batches without
overlap, and none holds more than the plan's look-ahead."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dalistream.plan import Layout, Schedule
from dalistream.plan.buckets import BucketEpoch, BucketMix, resumed_bucket_plan
from dalistream.plan.bucketworker import KEY_SHIFT, bucket_run, stable_argsort
from dalistream.tools import bucketview

from helpers import mix_bucket_batches


def reader_ids(run, g, written):
    """Written-order sample ids of reader ``g``'s kept samples, by ordinal."""
    plan = run.readers[g]
    ids = [int(written[shard]) + i for shard, first, stop in plan.parts for i in range(first, stop)]
    drop = set(plan.drop)
    return [x for raw, x in enumerate(ids) if raw not in drop]


def execute(run, written):
    """Run ``run`` as the worker does: ``{step: written ids in batch order}``, its positions, and
    the most samples held at once."""
    streams = []
    for g in range(len(run.readers)):
        ids = reader_ids(run, g, written)
        streams.append(iter([(o, ids[o]) for o in range(run.start[g], len(ids)) if o not in run.gone[g]]))
    held, most, out = {}, 0, {}
    for t in range(run.first, run.steps):
        for g in range(len(run.readers)):
            for _ in range(int(run.reads[t, g])):
                o, x = next(streams[g])
                held[g * KEY_SHIFT + o] = x
        most = max(most, len(held))
        # (a KeyError: emitted before it was read)
        out[t] = [held.pop(int(k)) for k in run.emit[run.bounds[t]:run.bounds[t + 1]]]
    return out, most


def written_starts(counts):
    return np.concatenate([[0], np.cumsum(counts)])


def check_plan(plan, written, steps_from):
    table = plan.rank_batches()
    for r in range(plan.layout.world_size):
        expected = bucketview.written(plan, table[r])
        for first in steps_from:
            filled = np.full(expected.shape, -1)
            for w in range(plan.layout.workers):
                wp = plan.worker(r, w)
                run = bucket_run([wp], first)
                got, most = execute(run, written)
                assert most <= wp.lookahead
                for t, ids in got.items():
                    lo = int(run.offset[t])
                    assert (filled[t, lo:lo + len(ids)] == -1).all(), "two workers at one position"
                    filled[t, lo:lo + len(ids)] = ids
                    assert int(run.fill[t]) == int((expected[t] >= 0).sum())
            assert np.array_equal(filled[first:], expected[first:])


@st.composite
def cases(draw):
    shards = draw(st.integers(1, 8))
    counts = draw(st.lists(st.integers(0, 40), min_size=shards, max_size=shards))
    buckets = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.ones(buckets))
    ids = rng.choice(buckets, int(sum(counts)), p=shares).astype(np.int16)
    workers = draw(st.integers(1, 3))
    layout = Layout(draw(st.integers(1, 3)), workers, draw(st.integers(workers, 7)))
    schedule = Schedule(seed, draw(st.sampled_from(["even", "exact"])))
    return counts, ids, buckets, layout, schedule, draw(st.sampled_from(["rank", "global"]))


@settings(max_examples=60, deadline=None)
@given(cases(), st.integers(0, 3))
def test_a_run_executes_the_plan_from_any_step(case, epoch):
    counts, ids, buckets, layout, schedule, per = case
    plan = BucketEpoch(counts, ids, buckets, layout, schedule, epoch, per)
    check_plan(plan, written_starts(counts), sorted({0, 1, plan.steps // 2, max(plan.steps - 1, 0)}))


@settings(max_examples=30, deadline=None)
@given(cases(), st.integers(1, 3), st.integers(1, 4), st.integers(0, 20))
def test_a_run_executes_an_elastic_resume(case, world, batch, ran):
    counts, ids, buckets, layout, schedule, per = case
    first = BucketEpoch(counts, ids, buckets, layout, schedule, 0, per)
    segment = (layout.world_size, layout.workers, layout.batch_size, min(ran, first.steps))
    rest = resumed_bucket_plan(counts, ids, buckets, Layout(world, 1, batch), schedule, 0, per, [segment])
    check_plan(rest, written_starts(counts), [0, rest.steps // 2])


def test_a_mix_run_takes_each_step_from_its_source():
    rng = np.random.default_rng(3)
    counts = [rng.integers(5, 30, 4), rng.integers(5, 30, 3)]
    ids = [rng.choice(3, int(c.sum())).astype(np.int16) for c in counts]
    layout = Layout(2, 2, 4)
    mix = BucketMix(counts, ids, 3, [0.7, 0.3], layout, Schedule(1, "even"), 0)
    table = mix_bucket_batches(mix)
    base = [written_starts(c) for c in counts]
    for r in range(2):
        for first in (0, 3):
            filled = np.full(table[r].shape, -1, dtype=np.int64)
            for w in range(2):
                plans, source, source_step = mix.worker(r, w)
                run = bucket_run(plans, first, source, source_step)
                assert run.steps == mix.steps
                got = execute_mixed(run, base)
                for t, ids_ in got.items():
                    lo = int(run.offset[t])
                    filled[t, lo:lo + len(ids_)] = ids_
            expected = np.full(table[r].shape, -1, dtype=np.int64)
            real, source_of, position = table[r] >= 0, table[r] >> 48, table[r] & ((1 << 48) - 1)
            for s, plan in enumerate(mix.plans):  # (source, position) as (source, written id)
                at = real & (source_of == s)
                expected[at] = (s << 48) | bucketview.written(plan, position[at])
            assert np.array_equal(filled[first:], expected[first:])


def execute_mixed(run, bases):
    """:func:`execute` over a mix's readers, each id tagged with its source (``s << 48 | id``)."""
    streams = []
    for g in range(len(run.readers)):
        s = run.source[g]
        ids = [(s << 48) | x for x in reader_ids(run, g, bases[s])]
        streams.append(iter([(o, ids[o]) for o in range(run.start[g], len(ids)) if o not in run.gone[g]]))
    held, out = {}, {}
    for t in range(run.first, run.steps):
        for g in range(len(run.readers)):
            for _ in range(int(run.reads[t, g])):
                o, x = next(streams[g])
                held[g * KEY_SHIFT + o] = x
        out[t] = [held.pop(int(k)) for k in run.emit[run.bounds[t]:run.bounds[t + 1]]]
        assert len({x >> 48 for x in out[t]}) <= 1  # one source a step
    return out


@settings(max_examples=30, deadline=None)
@given(cases(), st.integers(0, 2))
def test_a_plan_laid_out_for_one_rank_gives_that_rank_s_workers_the_same(case, rank):
    counts, ids, buckets, layout, schedule, per = case
    rank = min(rank, layout.world_size - 1)
    whole = BucketEpoch(counts, ids, buckets, layout, schedule, 1, per)
    one = BucketEpoch(counts, ids, buckets, layout, schedule, 1, per, ranks=[rank])
    assert one.steps == whole.steps
    for w in range(layout.workers):
        a, b = whole.worker(rank, w), one.worker(rank, w)
        assert a.readers == b.readers and a.lookahead == b.lookahead
        for name in ("emit_reader", "emit_index", "take", "offset", "bucket", "fill"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(1 << 40), 1 << 40), max_size=60), st.sampled_from([0, 1, 1 << 14, 1 << 15, 1 << 20]),
       st.sampled_from([np.int64, np.int32, np.uint16, np.int16]))
def test_the_plans_stable_sort_is_numpy_s_whatever_the_keys_range(values, scale, dtype):
    """The plans' sort (radix where the keys fit 16 bits) orders as numpy's stable sort does, ties
    in their first order: keys in range, just out of it either side, negative, unsigned, empty."""
    info = np.iinfo(dtype)
    keys = (np.asarray(values, dtype=np.int64) % (scale + 1) - (scale // 2 if info.min < 0 else 0))
    keys = np.clip(keys, info.min, info.max).astype(dtype)
    assert stable_argsort(keys).tolist() == np.argsort(keys, kind="stable").tolist()
