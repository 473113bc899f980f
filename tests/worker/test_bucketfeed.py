"""A worker's batches under a bucket plan, read from real shards (no DALI): each step's samples
where the plan puts them, the batch's bucket shipped with them, a resume mid-epoch, the
look-ahead held, a sample skipped by the error policy."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dalistream import LengthBuckets, Stream
from dalistream.plan.epochplan import bucket_epoch, epoch_plan
from dalistream.tools import bucketview
from dalistream.worker import WorkerSource
from dalistream.worker.bucketfeed import BucketFeed
from dalistream.worker.epochfeed import EpochShares, read_by_columns, read_epoch
from dalistream.worker.feed import ColumnRounds
from dalistream.worker.policy import ErrorPolicy
from dalistream.worker.reader import PlanReader
from dalistream.worker.stats import WorkerStats

from helpers import length_shards

SIZES = [23, 0, 31, 17, 40, 9]
EDGES = [12, 24, 40]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("bucketfeed"))
    return d, length_shards(d, SIZES, seed=2)


def open_stream(d, **kw):
    kw.setdefault("policy", "exact")
    return Stream.open(d, fields={"key": "__key__", "label": "cls"}, batch_size=kw.pop("batch_size", 6),
                       workers=kw.pop("workers", 2), device="cpu", seed=4, cache_dir=os.path.join(d, "cache"),
                       buckets=LengthBuckets("txt", EDGES, per=kw.pop("per", "rank")), **kw)


def batches(stream, worker, epoch=0, start=0):
    """A worker's batches as (keys by position, the bucket it ships, valid)."""
    source = WorkerSource(stream.config, stream.data, worker, start_epoch=epoch, start_step=start)
    out = []
    for key, label, bucket, valid in source.epoch_batches(epoch, start):
        by_position = [bytes(k).decode() if v else None for k, v in zip(key, valid)]
        out.append((by_position, bucket.tolist(), valid.tolist()))
    return out


def key_of(stream):
    names = {}
    for s, n in enumerate(stream.data.counts):
        for i in range(n):
            names[len(names)] = f"s{s:03d}/{i:05d}"
    return names


@pytest.mark.parametrize("policy,per,rank,world", [("exact", "rank", 0, 1), ("even", "rank", 1, 2),
                                                   ("exact", "global", 0, 2), ("even", "global", 2, 3)])
def test_every_step_holds_the_plan_s_samples_where_it_puts_them(shards, policy, per, rank, world):
    d, lengths = shards
    stream = open_stream(d, policy=policy, per=per, rank=rank, world_size=world)
    plan = bucket_epoch(stream.config, stream.data, 0)
    names = key_of(stream)
    written = bucketview.written(plan, plan.rank_batches()[rank])
    got = [batches(stream, w) for w in range(2)]
    assert len(got[0]) == len(got[1]) == stream.steps(0) == plan.steps  # the workers end together
    for t in range(plan.steps):
        merged = [a or b for a, b in zip(got[0][t][0], got[1][t][0])]
        assert merged == [names[int(x)] if x >= 0 else None for x in written[t]]
        bucket = int(plan.step_bucket[rank, t])
        assert got[0][t][1] == [bucket] * 6  # worker 0 ships it at every position
        assert got[1][t][1] == [0] * 6  # the others zeros (summed in the graph)
        for key in filter(None, merged):  # every sample in its bucket
            assert int(np.searchsorted(EDGES, lengths[key])) == bucket


def test_a_resume_mid_epoch_goes_on_with_the_same_batches(shards):
    d, _ = shards
    stream = open_stream(d)
    for w in range(2):
        full = batches(stream, w)
        for start in (1, len(full) // 2, len(full) - 1):
            assert batches(stream, w, start=start) == full[start:]


@pytest.mark.parametrize("at_once", [False, True])
def test_a_worker_holds_at_most_the_plan_s_look_ahead(shards, at_once):
    """Through the column path or the epoch read at once, a worker's pool holds at most the plan's
    look-ahead of samples, and every emission is found in it."""
    d, _ = shards
    stream = open_stream(d, batch_size=8, workers=2)
    c = stream.config
    for w in range(2):
        planned = bucket_epoch(c, stream.data, 0).worker(0, w).lookahead
        run = epoch_plan(c, stream.data, None, 0).for_worker(c.rank, w).run
        reader = PlanReader(c, stream.data, w)
        stats, policy = WorkerStats(None, 0, w), ErrorPolicy("raise", 1.0)
        if at_once:
            rows = read_epoch(reader.context(), reader.maps, list(run.readers), run.reads, policy, stats, None)
            assert rows.rounds is None  # (read at once)
        else:
            streams = [reader.blocks(plan, policy, stats, start=run.start[g], gone=run.gone[g])
                       for g, plan in enumerate(run.readers)]
            rows = read_by_columns(run.reads, policy, lambda s: ColumnRounds(streams, run.reads, len(c.fields),
                                                                             keyed=True), run.first)
        feed = BucketFeed(run, rows, len(c.fields))
        taken = sum(feed.take(t)[1] for t in range(run.steps))
        assert taken == int(run.bounds[-1]) and not feed.held
        assert 0 < feed.most <= planned


def test_the_epoch_is_read_at_once_where_it_can_be_and_gives_the_same_batches(shards, monkeypatch):
    """A fresh epoch of one data set is read at once (its readers' rows, in shares of its steps):
    the same batches as the column path gives, for every worker and policy, in one share or many."""
    from dalistream.worker import epochfeed, source

    d, _ = shards
    for policy in ("exact", "even"):
        stream = open_stream(d, batch_size=8, workers=2, policy=policy)
        used = []
        real = epochfeed.read_epoch
        monkeypatch.setattr(source, "read_epoch", lambda *a: used.append(real(*a)) or used[-1])
        for whole in (epochfeed.WHOLE_BYTES, 1):  # one share; shares of a step or two
            monkeypatch.setattr(epochfeed, "WHOLE_BYTES", whole)
            monkeypatch.setattr(epochfeed, "FIRST_SHARE_BYTES", whole)
            at_once = [batches(stream, w) for w in range(2)]
            assert used and all(isinstance(r, EpochShares) and r.rounds is None for r in used)
            if whole == 1:
                assert max(len(r.bounds) for r in used) > 3
            monkeypatch.setattr(source, "read_epoch", lambda ctx, maps, plans, takes, policy, stats, columns, start=0:
                                read_by_columns(takes, policy, columns, start))
            assert at_once == [batches(stream, w) for w in range(2)]
            monkeypatch.setattr(source, "read_epoch", lambda *a: used.append(real(*a)) or used[-1])
            used.clear()


def test_a_skipped_sample_leaves_its_step_one_sample_short_and_nothing_else_moves(tmp_path):
    bad = "s001/00004"
    clean, damaged = str(tmp_path / "clean"), str(tmp_path / "damaged")
    length_shards(clean, [14, 11], seed=5)
    length_shards(damaged, [14, 11], seed=5, bad_labels=[bad])  # the same captions, one label no number
    want = [b[0] for w in range(2) for b in batches(open_stream(clean), w)]
    got = [b[0] for w in range(2) for b in batches(open_stream(damaged, on_error="skip"), w)]
    assert len(got) == len(want)
    for g, x in zip(got, want):
        real = [k for k in x if k]
        if bad in real:  # its step: the others in order, at the start of the worker's positions
            assert [k for k in g if k] == [k for k in real if k != bad]
        else:
            assert g == x


def test_a_worker_the_plan_gives_nothing_ships_padding_and_ends_with_the_others(tmp_path):
    d = str(tmp_path)
    lengths = length_shards(d, [3], seed=1)
    keys = []
    for rank in range(2):
        stream = open_stream(d, workers=4, batch_size=4, rank=rank, world_size=2)
        got = [batches(stream, w) for w in range(4)]
        assert {len(g) for g in got} == {stream.steps(0)}  # every worker ends on the same step
        assert any(all(k is None for b in g for k in b[0]) for g in got)  # some worker holds nothing
        keys += [k for g in got for b in g for k in b[0] if k]
    assert sorted(keys) == sorted(lengths)
