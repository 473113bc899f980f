"""A worker's small epoch read at once (worker/epochfeed.py): the same batches, byte for byte, as
its columns read them (worker/feed.py), in a read per run of neighbouring parts, the job's first
epoch and an elastic resume's rest included; the columns read every epoch it does not take (one
resumed mid-way, one span per worker, over its budget), and one in which anything is amiss,
meeting the problem where it lies."""

import dataclasses
import io
import os
import tarfile

import numpy as np
import pytest

from dalistream.errors import DalistreamError
from dalistream.io.local import FileRange
from dalistream.manifest import build_manifest, write_manifest
from dalistream.manifest.offsets import SampleOffsets
from dalistream.tar import runs
from dalistream.worker import WorkerSource, epochfeed, mapped
from dalistream.worker.epochfeed import EpochFeed
from dalistream.worker.policy import ErrorPolicy

from helpers import passed_over_shard
from tests.worker.test_columns import as_bytes, config, data_set, make_shards


def read(source, e, monkeypatch, budget=None, start_step=0):
    """Epoch ``e``'s batches from ``start_step`` on (as bytes), how many reads brought them,
    whether it was read at once, and the source's skips after it (``budget``:
    :data:`~epochfeed.EPOCH_BYTES`)."""
    reads, at_once = [0], [0]
    take, view, region_of = runs.Arena.take, FileRange.view, mapped.ShareMaps.region_of

    def counted(self, n):
        reads[0] += 1
        return take(self, n)

    def viewed(self, n):
        reads[0] += n > 0
        return view(self, n)

    def mapped_for(self, paths, nbytes):  # (a share's shards read from one mapping: a read per shard)
        reads[0] += len(paths)
        return region_of(self, paths, nbytes)

    class Made(epochfeed.EpochFeed):  # (a share read at once and given out; not a round of the columns')
        def __init__(self, *args, counted=True):
            at_once[0] += counted
            super().__init__(*args, counted=counted)

    monkeypatch.setattr(runs.Arena, "take", counted)
    monkeypatch.setattr(FileRange, "view", viewed)
    monkeypatch.setattr(mapped.ShareMaps, "region_of", mapped_for)
    monkeypatch.setattr(epochfeed, "EpochFeed", Made)
    if budget is not None:
        monkeypatch.setattr(epochfeed, "EPOCH_BYTES", budget)
    try:
        batches = [as_bytes(b) for b in source.epoch_batches(e, start_step)]
    finally:
        monkeypatch.undo()
    return batches, reads[0], at_once[0], dict(source._stats.skipped)


def unlaid_shards(d, unlaid, n_shards=4, per_shard=37, large=()):
    """Shards and their data set with no member layout: ``offsets only`` (an index without one),
    or ``a folder entry`` (as ``tar cf`` of a folder writes it: not a regular shard). ``large``:
    samples of the first shard over a walked run's share (:data:`~epochfeed.WALKED_RUN_BYTES`)."""
    if unlaid == "offsets only":
        paths = make_shards(d, n_shards=n_shards, per_shard=per_shard)
        data = data_set(paths, per_shard=per_shard)
        offsets = SampleOffsets.from_flat(data.offsets.starts, np.asarray(data.offsets.flat))
        return paths, dataclasses.replace(data, offsets=offsets)
    rng, paths = np.random.default_rng(5), []
    for s in range(n_shards):
        paths.append(str(d / f"f-{s}.tar"))
        with tarfile.open(paths[-1], "w", format=tarfile.USTAR_FORMAT) as tar:
            folder = tarfile.TarInfo(f"s{s}")
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
            for i in range(per_shard):
                size = 600_000 if s == 0 and i in large else 2000 + i
                for name, value in ((f"s{s}/{i:03d}.bin", bytes(rng.integers(0, 256, size, dtype=np.uint8))),
                                    (f"s{s}/{i:03d}.cls", str(i).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(value)
                    tar.addfile(info, io.BytesIO(value))
    data = data_set(paths, per_shard=per_shard)
    assert data.offsets is not None and data.offsets.members is None  # (found by header walk)
    return paths, data


def by_columns(c, data, worker, epochs, monkeypatch, **resumed):
    """Each of ``epochs``' batches as the columns read them (no epoch read at once); ``resumed``:
    the source's ``start_epoch`` and ``resume``."""
    source = WorkerSource(c, data, worker, **resumed)
    return [read(source, e, monkeypatch, budget=0)[0] for e in epochs]


@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("workers,world_size,rank", [(1, 1, 0), (2, 1, 0), (2, 2, 1), (3, 1, 0)])
def test_a_small_epoch_is_read_at_once_and_delivers_the_same(tmp_path, monkeypatch, policy, workers,
                                                             world_size, rank):
    paths = make_shards(tmp_path, n_shards=4, per_shard=37)
    data = data_set(paths, per_shard=37)
    c = config(paths, policy=policy, workers=workers, world_size=world_size, rank=rank)
    for worker in range(workers):
        source = WorkerSource(c, data, worker)
        got = [read(source, e, monkeypatch) for e in (0, 1, 2)]  # the job's first epoch too
        assert all(at_once == 1 for _, _, at_once, _ in got)
        columns = WorkerSource(c, data, worker)
        assert [batches for batches, _, _, _ in got] == [read(columns, e, monkeypatch, budget=0)[0] for e in (0, 1, 2)]
        for e in (0, 1, 2):  # the same samples, padding and drops; bytes read: at most the columns' (whose
            ours, theirs = source._stats.totals_by_epoch[e], columns._stats.totals_by_epoch[e]  # runs read ahead)
            assert 0 < ours.pop("bytes") <= theirs.pop("bytes") and ours == theirs
        # a read per run of neighbouring parts: at most one per shard at R = 1 (one more under ``even``,
        # where the samples it leaves out are not read: a shard's range may end before its last part)
        if world_size == 1:
            assert all(0 < reads <= len(paths) + (policy == "even") for _, reads, _, _ in got)


@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("members", [True, False])
@pytest.mark.parametrize("workers,world_size,rank", [(1, 1, 0), (2, 1, 0), (2, 2, 1)])
def test_one_span_without_a_shuffle_buffer_is_read_at_once_and_delivers_the_columns(
        tmp_path, monkeypatch, policy, members, workers, world_size, rank):
    """One span per worker with no shuffle buffer (its one column's rows in order): read at once
    (from one mapping, or by ranges without member layouts), fresh and resumed at a step, the
    batches, samples, padding and drops its column delivers; through a shuffle buffer, by the
    column."""
    paths = make_shards(tmp_path, n_shards=4, per_shard=37)
    data = data_set(paths, per_shard=37)
    if not members:
        data = dataclasses.replace(data, offsets=SampleOffsets.from_flat(data.offsets.starts,
                                                                       np.asarray(data.offsets.flat)))
    c = config(paths, policy=policy, workers=workers, world_size=world_size, rank=rank, interleave=False, shuffle=0)
    for worker in range(workers):
        for start in (0, 3):
            source = WorkerSource(c, data, worker)
            got = [read(source, e, monkeypatch, start_step=start if e == 1 else 0) for e in (0, 1)]
            assert [at_once for _, _, at_once, _ in got] == [1, 1]
            columns = WorkerSource(c, data, worker)
            want = [read(columns, e, monkeypatch, budget=0, start_step=start if e == 1 else 0) for e in (0, 1)]
            assert [g[0] for g in got] == [w[0] for w in want] and len(got[0][0]) > 3
            for e in (0, 1):
                ours, theirs = source._stats.totals_by_epoch[e], columns._stats.totals_by_epoch[e]
                assert {k: v for k, v in ours.items() if k != "bytes"} == {k: v for k, v in theirs.items() if k != "bytes"}
    buffered = WorkerSource(c.replace(shuffle=8), data, 0)
    assert read(buffered, 0, monkeypatch)[2] == 0  # (a shuffle buffer: the column's order)


@pytest.mark.parametrize("members", [True, False])
@pytest.mark.parametrize("workers,world_size,rank", [(1, 1, 0), (2, 1, 0), (2, 2, 1)])
@pytest.mark.parametrize("batches", [3, 40])
def test_a_fixed_epoch_is_read_at_once_over_its_passes_and_delivers_the_columns(
        tmp_path, monkeypatch, members, workers, world_size, rank, batches):
    """``fixed``: each column reads its parts pass after pass (each later pass in its own order)
    for as many batches as the epoch has; read at once, its passes unrolled, fresh and resumed at
    a step: the batches, samples and padding its columns deliver (3 batches: part of a pass; 40:
    several passes, in shares of a step or two)."""
    paths = make_shards(tmp_path, n_shards=3, per_shard=80)  # (every column of R 2 x W 2 x B 16 some samples)
    data = data_set(paths, per_shard=80)

    def shares(source, e, **kw):  # (``read`` undoes every patch: set again for each read)
        if batches > 3:  # (a share of a whole pass or more would read a part twice: the columns')
            monkeypatch.setattr(epochfeed, "WHOLE_BYTES", 1)
            monkeypatch.setattr(epochfeed, "FIRST_SHARE_BYTES", 1)
        return read(source, e, monkeypatch, **kw)

    if not members:
        data = dataclasses.replace(data, offsets=SampleOffsets.from_flat(data.offsets.starts,
                                                                       np.asarray(data.offsets.flat)))
    manifest = str(tmp_path / "manifest.json")  # (``fixed`` reads interleaved with counts: a manifest's)
    write_manifest(build_manifest(paths, offsets=True), manifest)
    c = config(paths, policy="fixed", batches_per_epoch=batches, workers=workers, world_size=world_size, rank=rank,
               manifest=manifest)
    for worker in range(workers):
        for start in (0, 2):
            source = WorkerSource(c, data, worker)
            got = [shares(source, e, start_step=start if e == 1 else 0) for e in (0, 1)]
            assert all(at_once >= 1 for _, _, at_once, _ in got)
            columns = WorkerSource(c, data, worker)
            want = [read(columns, e, monkeypatch, budget=0, start_step=start if e == 1 else 0) for e in (0, 1)]
            assert [g[0] for g in got] == [w[0] for w in want] and len(got[0][0]) == batches
            for e in (0, 1):
                ours, theirs = source._stats.totals_by_epoch[e], columns._stats.totals_by_epoch[e]
                assert {k: v for k, v in ours.items() if k != "bytes"} == {k: v for k, v in theirs.items() if k != "bytes"}


@pytest.mark.parametrize("at_once", [True, False])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_fixed_epoch_resumed_passes_later_delivers_the_rest(tmp_path, monkeypatch, at_once, workers):
    """A ``fixed`` epoch resumed at a step in any pass of its columns (the first, the second, one
    much later) delivers the batches of the whole epoch from that step, at once and by the columns
    (which called a column whose passes before the resume gave nothing "no usable samples")."""
    paths = make_shards(tmp_path, n_shards=2, per_shard=16)
    data = data_set(paths, per_shard=16)
    manifest = str(tmp_path / "manifest.json")
    write_manifest(build_manifest(paths, offsets=True), manifest)
    c = config(paths, policy="fixed", batches_per_epoch=30, workers=workers, manifest=manifest)
    budget = None if at_once else 0
    for worker in range(workers):
        whole = read(WorkerSource(c, data, worker), 0, monkeypatch, budget=budget)[0]
        for start in (1, 3, 9, 25):  # (a column of 2 samples a pass: its first, second, fifth, thirteenth)
            rest = read(WorkerSource(c, data, worker), 0, monkeypatch, budget=budget, start_step=start)[0]
            assert rest == whole[start:], (worker, start)


def test_long_ranges_are_cut_out_of_the_mapping_and_deliver_the_same(tmp_path, monkeypatch):
    """Ranges of several megabytes (one worker, every column's part end to end: a range a shard),
    each a run of the file's mapping, in one share and in several: the columns' batches."""
    paths = make_shards(tmp_path, n_shards=2, per_shard=30, size=200_000)
    data = data_set(paths, per_shard=30)
    c = config(paths, workers=1)
    count, patch = shares_read(monkeypatch, 1 << 20, 2 << 20)
    source = WorkerSource(c, data, 0)
    whole = [read(source, e, monkeypatch) for e in (0, 1)]
    assert [at_once for _, _, at_once, _ in whole] == [1, 1]
    shared = []
    for e in (0, 1):
        patch()
        shared.append(read(source, e, monkeypatch))
        assert count[0] > 2 and shared[-1][2] == count[0]
        count[0] = 0
    assert [b for b, _, _, _ in whole] == [b for b, _, _, _ in shared] == by_columns(c, data, 0, (0, 1), monkeypatch)


@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("unlaid", ["offsets only", "a folder entry"])
@pytest.mark.parametrize("workers,world_size,rank", [(1, 1, 0), (2, 1, 0), (2, 2, 1)])
def test_shards_without_a_member_layout_are_walked_at_once_and_deliver_the_same(tmp_path, monkeypatch, policy, unlaid,
                                                                               workers, world_size, rank):
    """Each range found by header walk between its offsets, as a column finds it: the same
    batches, samples, padding and drops as the columns', the job's first epoch too."""
    paths, data = unlaid_shards(tmp_path, unlaid)
    c = config(paths, policy=policy, workers=workers, world_size=world_size, rank=rank)
    for worker in range(workers):
        source, columns = WorkerSource(c, data, worker), WorkerSource(c, data, worker)
        got = [read(source, e, monkeypatch) for e in (0, 1, 2)]
        assert all(at_once == 1 for _, _, at_once, _ in got)
        assert [batches for batches, _, _, _ in got] == [read(columns, e, monkeypatch, budget=0)[0] for e in (0, 1, 2)]
        for e in (0, 1, 2):  # (bytes: the walk reads the samples a column passes over by header, its plan's drops)
            ours, theirs = source._stats.totals_by_epoch[e], columns._stats.totals_by_epoch[e]
            drops = sum(len(plan.drop) for plan in source.plans(e))
            assert 0 < ours.pop("bytes") <= theirs.pop("bytes") + drops * 2100 and ours == theirs


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_what_the_walk_leaves_alone_sends_every_epoch_to_the_columns(tmp_path, monkeypatch, on_error):
    """A sample too large for a walked run (the header walk gives it alone), or a damaged header
    in a shard without a layout: the columns read the epoch, with the same batches, skips and
    error, and the worker's later epochs too, with no read at once tried again."""
    paths, data = unlaid_shards(tmp_path, "a folder entry", large=range(0, 37, 2))
    (tmp_path / "d").mkdir()
    damaged, _ = unlaid_shards(tmp_path / "d", "a folder entry")
    damaged_data = data_set(damaged, per_shard=37)  # (indexed before the damage)
    plans = WorkerSource(config(damaged, workers=2), damaged_data, 0).plans(0)
    index, first, _ = next(part for plan in plans for part in plan.parts if part[1] > 0)  # (one worker 0 reads)
    with tarfile.open(damaged[index]) as tar:
        member = tar.getmember(f"s{index}/{first:03d}.bin")
    with open(damaged[index], "r+b") as f:
        f.seek(member.offset + 257)
        f.write(b"xxxxx")
    walked = [0]
    walk = epochfeed._read  # (a share's ranges read)

    def counted(*args):
        walked[0] += 1
        return walk(*args)

    for shards, shards_data in ((paths, data), (damaged, damaged_data)):
        c = config(shards, on_error=on_error, max_skip_fraction=1.0, workers=2)

        def epochs(budget):
            source, out, at_once, tried = WorkerSource(c, shards_data, 0), [], 0, []
            for e in (0, 1, 2):
                monkeypatch.setattr(epochfeed, "_read", counted)  # (``read`` undoes it)
                try:
                    batches, _, once, skipped = read(source, e, monkeypatch, budget=budget)
                    out.append((batches, skipped))
                    at_once += once
                except DalistreamError as error:
                    out.append((type(error), str(error)))
                tried.append(walked[0])
            return out, at_once, tried

        walked[0] = 0
        ours, at_once, tried = epochs(None)
        assert ours == epochs(0)[0] and at_once == 0
        assert 0 < tried[0] == tried[2]  # (the first epoch's try alone: none after it)
        if shards is damaged:  # (met in epoch 0, whose plan reads the damaged sample on worker 0)
            if on_error == "skip":
                assert sum(ours[0][1].values()) > 0
            else:
                assert isinstance(ours[0][1], str) and f"f-{index}.tar" in ours[0][1]  # (named by the shard)


@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("segment", [(8, 1, 1, 2), (4, 1, 1, 3)])
def test_an_elastic_resume_s_rest_is_read_at_once_and_delivers_the_same(tmp_path, monkeypatch, segment, policy):
    """The first epoch of a job resumed on another layout (``segment``: the one it ran under, and
    its steps): the rest of it, the plan's drops left out, as its columns read it."""
    paths = make_shards(tmp_path, n_shards=4, per_shard=37)
    data = data_set(paths, per_shard=37)
    c = config(paths, workers=2, policy=policy)
    for worker in range(2):
        resumed = dict(start_epoch=1, resume=(segment,))
        batches, _, at_once, _ = read(WorkerSource(c, data, worker, **resumed), 1, monkeypatch)
        assert at_once == 1 and batches == by_columns(c, data, worker, (1,), monkeypatch, **resumed)[0]
        assert batches != by_columns(c, data, worker, (1,), monkeypatch)[0]  # (the segment's samples left out)


def test_the_columns_read_a_span_s_shuffle_buffer_and_an_epoch_over_the_budget(tmp_path, monkeypatch):
    paths = make_shards(tmp_path)
    data = data_set(paths)
    c = config(paths)
    source = WorkerSource(c, data, 0)
    later, _, at_once, _ = read(source, 1, monkeypatch, budget=1000)  # (fewer bytes than the epoch's)
    assert at_once == 0 and later == by_columns(c, data, 0, (0, 1), monkeypatch)[1]
    for shuffle, once in ((0, 1), (8, 0)):  # one span per worker: its one column, through a buffer or not
        span = config(paths, interleave=False, shuffle=shuffle)
        source = WorkerSource(span, data, 0)
        read(source, 0, monkeypatch)
        got, _, at_once, _ = read(source, 1, monkeypatch)
        assert at_once == once and got == by_columns(span, data, 0, (0, 1), monkeypatch)[1]


@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("workers,start", [(1, 1), (1, 5), (2, 3), (3, 2)])
@pytest.mark.parametrize("shares", ["one", "several"])
def test_an_epoch_resumed_mid_way_is_read_at_once_from_its_step(tmp_path, monkeypatch, policy, workers, start,
                                                                 shares):
    """Resumed at step ``start``, an interleaved epoch is read at once from that step (its rows
    before it not read, in one share or several): the batches the columns give from that step,
    and the epoch after it whole."""
    paths = make_shards(tmp_path)
    data = data_set(paths)
    c = config(paths, policy=policy, workers=workers)

    def small_shares():  # (read() undoes every patch when it is done)
        if shares == "several":
            monkeypatch.setattr(epochfeed, "WHOLE_BYTES", 1)
            monkeypatch.setattr(epochfeed, "FIRST_SHARE_BYTES", 1)

    for worker in range(workers):
        whole = by_columns(c, data, worker, (1, 2), monkeypatch)
        resumed = WorkerSource(c, data, worker, start_epoch=1, start_step=start)
        small_shares()
        got, _, at_once, _ = read(resumed, 1, monkeypatch, start_step=start)
        assert at_once >= (2 if shares == "several" and len(got) > 1 else 1) and got == whole[0][start:]
        small_shares()
        after, _, at_once, _ = read(resumed, 2, monkeypatch)
        assert at_once >= 1 and after == whole[1]


@pytest.mark.parametrize("damage", ["header", "label", "cut", "end"])
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_anything_amiss_is_met_by_the_columns_where_it_lies(tmp_path, monkeypatch, damage, on_error):
    """A header that fails its check, a sample the decoder refuses, a shard cut short or one whose
    end-of-archive marker is overwritten, in a later epoch: the columns read that epoch, and skip
    or raise as they do in the first (the same batches, the same skips, the same error)."""
    paths = make_shards(tmp_path)
    data = data_set(paths)  # (indexed before the damage)
    with tarfile.open(paths[1]) as tar:
        member = tar.getmember("s1/020.bin" if damage in ("header", "cut") else "s1/020.cls")
        last = tar.getmembers()[-1]
    with open(paths[1], "r+b") as f:
        if damage == "header":  # the member header's ustar magic overwritten
            f.seek(member.offset + 257)
            f.write(b"xxxxx")
        elif damage == "label":  # a label that is no decimal ("20" -> "2x")
            f.seek(member.offset_data + 1)
            f.write(b"x")
        elif damage == "cut":  # the file cut inside a member's data
            f.truncate(member.offset_data + 100)
        else:  # the block after the last member, its end-of-archive marker, not zeros
            f.seek(last.offset_data + -(-last.size // 512) * 512)
            f.write(b"x" * 512)
    c = config(paths, on_error=on_error, max_skip_fraction=1.0)

    def epochs(budget):
        source = WorkerSource(c, data, 0)
        out, at_once = [], 0
        for e in (0, 1):
            try:
                batches, _, once, skipped = read(source, e, monkeypatch, budget=budget)
                out.append((batches, skipped))
                at_once += once
            except DalistreamError as error:  # (the same error, either way)
                out.append((type(error), str(error)))
        return out, at_once

    (ours, at_once), (theirs, _) = epochs(None), epochs(0)
    assert ours == theirs and at_once == 0
    if on_error == "skip" and damage in ("header", "label"):  # (one sample: the skips of epochs 0 and 1)
        assert sum(ours[1][1].values()) == 2 * sum(ours[0][1].values()) > 0
    elif on_error == "skip":  # (a shard cut short or not ended: what follows the damage in each part)
        assert sum(ours[1][1].values()) > sum(ours[0][1].values()) > 0
    else:
        assert all(isinstance(o[1], str) and paths[1] in o[1] for o in ours)  # (named by the shard)


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_damage_in_ranges_read_side_by_side_is_met_by_the_columns(tmp_path, monkeypatch, on_error):
    """At R = 2 a worker's parts of a shard lie apart, read side by side into one buffer (a read
    each): a header there that fails its check, and the columns read the epoch, as they would."""
    paths = make_shards(tmp_path, n_shards=4, per_shard=37)
    data = data_set(paths, per_shard=37)  # (indexed before the damage)
    c = config(paths, on_error=on_error, max_skip_fraction=1.0, workers=2, world_size=2, rank=1)
    index, first, _ = next(part for plan in WorkerSource(c, data, 0).plans(1) for part in plan.parts if part[2] < 37)
    with tarfile.open(paths[index]) as tar:
        member = tar.getmember(f"s{index}/{first:03d}.bin")
    with open(paths[index], "r+b") as f:
        f.seek(member.offset + 257)
        f.write(b"xxxxx")

    def epoch_1(budget):
        try:
            batches, _, at_once, skipped = read(WorkerSource(c, data, 0), 1, monkeypatch, budget=budget)
            return (batches, skipped), at_once
        except DalistreamError as error:
            return (type(error), str(error)), 0

    (ours, at_once), (theirs, _) = epoch_1(None), epoch_1(0)
    assert ours == theirs and at_once == 0
    assert sum(ours[1].values()) > 0 if on_error == "skip" else paths[index] in ours[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_samples_ending_with_a_member_not_wanted_are_all_read_without_a_layout(tmp_path, monkeypatch, workers):
    """Shards without a member layout whose samples end with a member not wanted (passed over by
    a seek): each column's part, read by header walk to its end, ends there (the reader once
    found no end-of-archive marker after a part's last member and called the shard truncated).
    Every sample once an epoch, at once and by the columns alike."""
    paths = [str(tmp_path / f"q-{s}.tar") for s in range(3)]
    for s, path in enumerate(paths):
        passed_over_shard(path, n=12, seed=s, prefix=f"q{s}", passed=(70_000, 100_000))  # (past a worker's buffer)
    data = data_set(paths, per_shard=12)
    data = dataclasses.replace(data, offsets=SampleOffsets.from_flat(data.offsets.starts, np.asarray(data.offsets.flat)))
    c = config(paths, fields={"key": "__key__", "label": "cls"}, workers=workers, policy="exact")
    every = sorted(f"q{s}/{i:03d}" for s in range(3) for i in range(12))
    for budget in (None, 0):
        for e in (0, 1):
            keys = []
            for worker in range(workers):
                batches, _, at_once, skipped = read(WorkerSource(c, data, worker), e, monkeypatch, budget=budget)
                assert skipped == {} and bool(at_once) == (budget is None)
                keys += [bytes(k).decode() for batch in batches for k in batch[0] if len(k)]
            assert sorted(keys) == every


def shares_read(monkeypatch, first_share, share, growth=1 << 30):
    """Count the shares read (:func:`epochfeed.start_share`): every epoch cut into shares, the first
    of ``first_share`` bytes, each after it ``growth`` times the one before up to ``share`` (by
    default: of ``share`` at once)."""
    count, start_share = [0], epochfeed.start_share

    def counted(*args):
        count[0] += 1
        return start_share(*args)

    def patch():  # (``read`` undoes what it patched)
        monkeypatch.setattr(epochfeed, "start_share", counted)
        monkeypatch.setattr(epochfeed, "WHOLE_BYTES", 0)
        monkeypatch.setattr(epochfeed, "FIRST_SHARE_BYTES", first_share)
        monkeypatch.setattr(epochfeed, "SHARE_BYTES", share)
        monkeypatch.setattr(epochfeed, "WALKED_SHARE_BYTES", share)
        monkeypatch.setattr(epochfeed, "GROWTH", growth)
    return count, patch


@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("workers,world_size,rank", [(1, 1, 0), (2, 2, 1), (3, 1, 0)])
def test_an_epoch_read_in_shares_delivers_the_same(tmp_path, monkeypatch, policy, workers, world_size, rank):
    """Shares of a few steps each (the first of ~6 kB, each next twice the last): the same
    batches, samples, padding and drops as the columns', the job's first epoch, later ones and an
    elastic resume's rest, with and without member layouts."""
    paths = make_shards(tmp_path, n_shards=4, per_shard=37)
    data = data_set(paths, per_shard=37)
    (tmp_path / "u").mkdir()
    unlaid, unlaid_data = unlaid_shards(tmp_path / "u", "offsets only")
    # (a worker's epoch of these shards cut into about 8 shares)
    count, patch = shares_read(monkeypatch, 6000, sum(map(os.path.getsize, paths)) // (workers * world_size) // 8)
    for shards, shard_data in ((paths, data), (unlaid, unlaid_data)):
        c = config(shards, policy=policy, workers=workers, world_size=world_size, rank=rank)
        for worker in range(workers):
            for resumed in ({}, dict(start_epoch=1, resume=((4, 1, 1, 3),))):
                source = WorkerSource(c, shard_data, worker, **resumed)
                epochs = (1, 2) if resumed else (0, 1)
                got = []
                for e in epochs:
                    count[0] = 0
                    patch()
                    got.append(read(source, e, monkeypatch))
                    assert count[0] >= 3 and got[-1][2] == count[0]  # (every share read at once)
                assert [b for b, _, _, _ in got] == by_columns(c, shard_data, worker, epochs, monkeypatch, **resumed)


def test_an_epoch_found_by_header_walk_is_cut_after_a_small_first_share(tmp_path, monkeypatch):
    """Without member layouts the first batch waits for a small first share only (the walk's cost
    is per sample); with them a small epoch is one share. The same batches either way."""
    paths = make_shards(tmp_path, n_shards=4, per_shard=37)
    data = data_set(paths, per_shard=37)
    (tmp_path / "u").mkdir()
    unlaid, unlaid_data = unlaid_shards(tmp_path / "u", "offsets only")
    count, start = [0], epochfeed.start_share

    def counted(*args):
        count[0] += 1
        return start(*args)

    got = []
    for shards, shard_data in ((paths, data), (unlaid, unlaid_data)):
        monkeypatch.setattr(epochfeed, "start_share", counted)
        monkeypatch.setattr(epochfeed, "FIRST_SHARE_BYTES", 6000)
        count[0] = 0
        c = config(shards, workers=2)
        batches, _, at_once, _ = read(WorkerSource(c, shard_data, 0), 0, monkeypatch)
        assert at_once == count[0] and batches == by_columns(c, shard_data, 0, (0,), monkeypatch)[0]
        got.append(count[0])
    assert got[0] == 1 and got[1] > 1  # (the small first share, then the rest, in shares growing from it)


def test_an_epoch_found_by_header_walk_is_read_in_shares_within_the_copy_budget(tmp_path, monkeypatch):
    """Without member layouts every share after the first is of ``WALKED_SHARE_BYTES``, half
    the bytes a share may copy (``COPIED_BYTES``), so a large epoch is read at once share by
    share, not handed to the columns after its first share; the same batches."""
    (tmp_path / "u").mkdir()
    unlaid, unlaid_data = unlaid_shards(tmp_path / "u", "offsets only")
    c = config(unlaid, workers=1)
    got = []
    for later in (130_000, epochfeed.SHARE_BYTES):  # (~2 steps of ~62 kB; the second: the rest, over the budget)
        count, patch = shares_read(monkeypatch, 6000, later)  # (the next shares of ``later`` at once)
        patch()
        monkeypatch.setattr(epochfeed, "COPIED_BYTES", 270_000)
        batches, _, at_once, _ = read(WorkerSource(c, unlaid_data, 0), 1, monkeypatch)
        assert batches == by_columns(c, unlaid_data, 0, (1,), monkeypatch)[0]
        got.append((count[0], at_once))
    assert got[0][0] >= 4 and got[0][1] == got[0][0]  # (every share read at once)
    assert got[1] == (2, 1)  # (the first share, then one over the budget: the columns read the rest)


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_share_that_cannot_be_read_hands_the_rest_of_the_epoch_to_the_columns(tmp_path, monkeypatch, on_error):
    """Damage the last shares read: the shares before it are given out as read, the rest by the
    columns from that share's first step: the same batches, skips and error as the columns
    alone; the worker's later epochs go to the columns at once."""
    paths = make_shards(tmp_path, n_shards=4, per_shard=37)
    data = data_set(paths, per_shard=37)  # (indexed before the damage)
    c = config(paths, on_error=on_error, max_skip_fraction=1.0, workers=2)
    index, first, stop = WorkerSource(c, data, 0).plans(0)[0].parts[-1]  # (column 0's last part: its last steps)
    with tarfile.open(paths[index]) as tar:
        member = tar.getmember(f"s{index}/{stop - 1:03d}.bin")
    with open(paths[index], "r+b") as f:
        f.seek(member.offset + 257)
        f.write(b"xxxxx")
    count, patch = shares_read(monkeypatch, 6000, 20_000)

    def epochs(budget):
        source, out, shares = WorkerSource(c, data, 0), [], []
        for e in (0, 1):
            count[0] = 0
            patch()
            try:
                batches, _, once, skipped = read(source, e, monkeypatch, budget=budget)
                out.append((batches, skipped))
            except DalistreamError as error:
                out.append((type(error), str(error)))
                once = None
            shares.append((count[0], once))
        return out, shares

    (ours, shares), (theirs, _) = epochs(None), epochs(0)
    assert ours == theirs
    assert shares[0][0] >= 3 and shares[0][1] in (shares[0][0] - 1, None)  # (read at once up to the damage)
    assert shares[1][0] == 0 and shares[1][1] in (0, None)  # (epoch 1: no share read, no try)
    if on_error == "skip":
        assert sum(ours[0][1].values()) > 0
    else:
        assert isinstance(ours[0][1], str) and f"n-{index}.tar" in ours[0][1]


def test_an_epoch_over_the_whole_read_s_bytes_is_cut_into_shares_a_small_first():
    """A small first share (the first batch waits for it), then shares growing ``GROWTH``-fold to
    their size (the next batches wait for a piece of the next share each)."""
    takes = np.ones((1000, 4), np.int64)  # 1,000 steps of 4 rows
    whole = epochfeed.WHOLE_BYTES / 4000  # (the whole epoch: one share's bytes exactly)
    assert epochfeed.share_bounds(takes, whole) == [0, 1000] and epochfeed.share_bounds(takes, None) == [0, 1000]
    per_sample = epochfeed.FIRST_SHARE_BYTES / 20  # (5 steps a first share)

    def growing(later):  # each share's steps: 5, then GROWTH times the one before, up to ``later`` bytes
        steps, want = [], epochfeed.FIRST_SHARE_BYTES
        while sum(steps) < 1000:
            steps.append(round(want / (4 * per_sample)))
            want = min(later, want * epochfeed.GROWTH)
        return steps

    for later, bounds in ((epochfeed.SHARE_BYTES, epochfeed.share_bounds(takes, per_sample)),
                          (epochfeed.WALKED_SHARE_BYTES, epochfeed.share_bounds(
                              takes, per_sample, epochfeed.FIRST_SHARE_BYTES, epochfeed.WALKED_SHARE_BYTES))):
        expected = growing(later)
        assert expected[:3] == [5, 5 * epochfeed.GROWTH, min(5 * epochfeed.GROWTH ** 2, expected[-1])]
        assert np.diff(bounds)[:-1].tolist() == expected[:len(bounds) - 2] and bounds[-1] == 1000
        assert 0 < bounds[-1] - bounds[-2] <= expected[len(bounds) - 2]
    assert epochfeed.share_bounds(takes, 2.0 * epochfeed.SHARE_BYTES) == list(range(1001))  # (a step each, at least)
    walked = epochfeed.share_bounds(takes, whole, whole=epochfeed.FIRST_SHARE_BYTES)  # (no layouts: a small first share)
    assert walked[:2] == [0, round(epochfeed.FIRST_SHARE_BYTES / (4 * whole))] and walked[-1] == 1000
    remote = (epochfeed.WALKED_SHARE_BYTES,) * 3  # (remote: shares as large from the first)
    far = epochfeed.share_bounds(takes, per_sample, *remote)
    steps = round(epochfeed.WALKED_SHARE_BYTES / (4 * per_sample))
    assert len(far) > 3 and np.diff(far)[:-1].tolist() == [steps] * (len(far) - 2)


def test_steps_take_their_rows_by_index():
    """Each step's rows: what it takes of each column, column after column, in the column's
    order, and counted as passed; a step may take nothing of some columns (an uneven tail)."""
    rows = [np.array([4, 5, 6]), np.array([0, 1]), np.array([2, 3, 7, 8])]
    flat = [[f"r{i}" for i in range(9)], list(range(100, 109))]
    takes = np.array([[1, 1, 2], [2, 0, 1], [0, 1, 1]])
    policy = ErrorPolicy("raise")
    feed = EpochFeed(flat, rows, takes, policy)
    expected = [[4, 0, 2, 3], [5, 6, 7], [1, 8]]
    for step, index in enumerate(expected):
        values, n, counts = feed.take(step)
        assert values == [[flat[0][i] for i in index], [flat[1][i] for i in index]]
        assert n == len(index) and counts.tolist() == takes[step].tolist()
    assert policy.passed == 9
    lattice = EpochFeed(flat, [np.array([3, 1]), np.array([0, 2])], np.ones((2, 2), np.int64), ErrorPolicy("raise"))
    assert [lattice.take(t)[0][1] for t in (0, 1)] == [[103, 100], [101, 102]]


@pytest.mark.parametrize("workers,rank,world_size", [(1, 0, 1), (2, 0, 1), (2, 1, 2)])
@pytest.mark.parametrize("b_gzipped", [False, True])
def test_a_mix_is_read_at_once_source_by_source_and_delivers_the_same(tmp_path, monkeypatch, workers, rank,
                                                                        world_size, b_gzipped):
    """A mix's interleaved epoch is read at once, each source's columns by its own reader, the
    step's rows source after source: the batches and counts of the column path, whether both
    sources are read at once or one cannot be (gzipped shards: read by their columns, beside the
    other source read at once)."""
    import gzip
    import shutil

    from dalistream import Stream

    for name, n, per in (("a", 3, 37), ("b", 2, 29)):
        (tmp_path / name).mkdir()
        for path in make_shards(tmp_path / name, n_shards=n, per_shard=per):
            if name == "b" and b_gzipped:
                with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
                    shutil.copyfileobj(f, g)
                os.remove(path)
    stream = Stream.open({"a": (str(tmp_path / "a"), 0.6), "b": (str(tmp_path / "b"), 0.4)},
                         fields={"key": "__key__", "raw": "bin", "label": "cls"}, batch_size=10, workers=workers,
                         rank=rank, world_size=world_size, device="cpu", seed=3, policy="even", env={},
                         cache_dir=str(tmp_path / "cache"))
    for worker in range(workers):
        source = WorkerSource(stream.config, stream.data, worker, mix=stream.mix)
        got = [read(source, e, monkeypatch) for e in (0, 1)]
        assert all(at_once >= 1 for _, _, at_once, _ in got)  # (source a at least, read at once)
        columns = WorkerSource(stream.config, stream.data, worker, mix=stream.mix)
        assert [batches for batches, _, _, _ in got] == [read(columns, e, monkeypatch, budget=0)[0] for e in (0, 1)]
        for e in (0, 1):
            ours, theirs = source._stats.totals_by_epoch[e], columns._stats.totals_by_epoch[e]
            ours.pop("bytes"), theirs.pop("bytes")
            assert ours == theirs
