"""A worker's interleaved columns, each reading its own parts (worker/reader.py, worker/feed.py),
in the epochs the epoch read at once does not take: a later epoch reads each part once, and
delivers, skips and reports what a job started at that epoch does; a damaged part is met by its
own column; a resumed epoch delivers the rest of the epoch; nothing read travels with a reader.
(Until #60 a later epoch read neighbouring columns' parts together, worker/neighbours.py.)
Helpers for the other worker tests too: small shards, their data set and config."""

import os
import pickle
import tarfile

import numpy as np
import pytest

from dalistream.config import StreamConfig
from dalistream.dataset import DataSet
from dalistream.io.local import FileRange
from dalistream.manifest import build_manifest
from dalistream.manifest.offsets import SampleOffsets
from dalistream.manifest.rows import ShardRows
from dalistream.tar import runs
from dalistream.worker import WorkerSource, epochfeed

from helpers import write_tar

COLUMNS = 16


def make_shards(d, n_shards=3, per_shard=40, size=2000):
    rng = np.random.default_rng(3)
    paths = []
    for s in range(n_shards):
        members = []
        for i in range(per_shard):
            members += [(f"s{s}/{i:03d}.bin", bytes(rng.integers(0, 256, size + i, dtype=np.uint8))),
                        (f"s{s}/{i:03d}.cls", str(i).encode())]
        paths.append(write_tar(str(d / f"n-{s}.tar"), members))
    return paths


def data_set(paths, per_shard=40):
    rows = ShardRows.from_infos(build_manifest(paths, offsets=True))
    offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
    per_sample = sum(os.path.getsize(p) for p in paths) / (per_shard * len(paths))
    return DataSet(tuple(paths), (per_shard,) * len(paths), offsets, bytes_per_sample=per_sample)


def config(paths, **kw):
    options = dict(sources=tuple(paths), fields={"key": "__key__", "raw": "bin", "label": "cls"},
                   batch_size=COLUMNS, workers=1, interleave=True, seed=1)
    options.update(kw)
    return StreamConfig(**options)


def as_bytes(outputs):
    return [[np.asarray(x).tobytes() for x in v] if isinstance(v, list) else np.asarray(v).tobytes() for v in outputs]


def read_epoch(source, e, monkeypatch):
    """Epoch ``e``'s batches (as bytes), the runs read for it (into the worker's buffers, or cut
    out of a file's mapping), and the source's skips after it (read by the columns: an epoch this
    small would be read at once, worker/epochfeed.py)."""
    reads = [0]
    monkeypatch.setattr(epochfeed, "EPOCH_BYTES", 0)
    take, view = runs.Arena.take, FileRange.view

    def counted(self, n):
        reads[0] += 1
        return take(self, n)

    def viewed(self, n):  # (a run of a local file's mapped bytes)
        reads[0] += n > 0
        return view(self, n)

    monkeypatch.setattr(runs.Arena, "take", counted)
    monkeypatch.setattr(FileRange, "view", viewed)
    batches = [as_bytes(b) for b in source.epoch_batches(e)]
    monkeypatch.undo()
    return batches, reads[0], dict(source._stats.skipped)


@pytest.mark.parametrize("policy", ["exact", "even"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_later_epoch_reads_each_part_once_and_delivers_what_a_job_started_there_does(tmp_path, monkeypatch,
                                                                                     policy, workers):
    paths = make_shards(tmp_path)
    c = config(paths, policy=policy, workers=workers)
    data = data_set(paths)
    for worker in range(workers):
        going = WorkerSource(c, data, worker)
        read_epoch(going, 0, monkeypatch)
        later, reads, _ = read_epoch(going, 1, monkeypatch)
        fresh = WorkerSource(c, data, worker, start_epoch=1)
        started, reads_started, _ = read_epoch(fresh, 1, monkeypatch)
        assert later == started  # the same samples, in the same batches
        # each column's part (7 or 8 samples of ~2 kB) is one run, read by its column alone (not
        # with its neighbours'); a job's first epoch reads its parts' first runs short (its first
        # batch waits for little), so more runs
        parts = sum(len(plan.parts) for plan in going.plans(1))
        assert reads == parts <= reads_started
        ours, theirs = dict(going._stats.totals_by_epoch[1]), dict(fresh._stats.totals_by_epoch[1])
        assert ours.pop("bytes") == theirs.pop("bytes") > 0 and ours == theirs  # (samples, padding, drops)


def test_a_damaged_part_is_met_by_its_own_column_every_epoch(tmp_path, monkeypatch):
    """A part whose member header fails its check is met by its column: the same skips each
    epoch, and the same samples as a job started at that epoch delivers."""
    paths = make_shards(tmp_path)
    data = data_set(paths)  # (indexed before the damage)
    with tarfile.open(paths[1]) as tar:
        member = tar.getmember("s1/020.bin")
    with open(paths[1], "r+b") as f:  # the member header's ustar magic overwritten
        f.seek(member.offset + 257)
        f.write(b"xxxxx")
    c = config(paths, on_error="skip", max_skip_fraction=1.0)
    going = WorkerSource(c, data, 0)
    read_epoch(going, 0, monkeypatch)
    later, _, skipped = read_epoch(going, 1, monkeypatch)
    started, _, skipped_started = read_epoch(WorkerSource(c, data, 0, start_epoch=1), 1, monkeypatch)
    assert later == started
    assert going._stats.skipped_by_epoch[0] == going._stats.skipped_by_epoch[1] == skipped_started
    assert sum(skipped_started.values()) > 0


def test_nothing_read_travels_with_a_reader(tmp_path, monkeypatch):
    """A reader pickled after an epoch carries none of the runs, buffers, mappings or read-ahead
    threads of its reads."""
    paths = make_shards(tmp_path)
    source = WorkerSource(config(paths), data_set(paths), 0)
    list(source.epoch_batches(0))  # (read at once, from a mapping of its shards)
    read_epoch(source, 1, monkeypatch)  # (by its columns, into its buffers)
    reader = source.readers[0]
    assert reader.arena is not None and reader.arena._pool  # (its buffers, after the epoch)
    assert reader.fetcher is not None and reader.maps.region is not None  # (its threads, its mapping)
    again = pickle.loads(pickle.dumps(reader))
    assert again.arena is not None and again.arena._pool == [] and again.arena._buffer is None
    assert again.fetcher is None and again.maps.region is None
    assert len(pickle.dumps(reader)) < os.path.getsize(paths[0])


@pytest.mark.parametrize("start_step", [1, 3])
def test_a_resumed_epoch_delivers_the_same(tmp_path, monkeypatch, start_step):
    """A job resumed mid-epoch opens its columns' parts where they resume; what it delivers from
    there is what the job would have."""
    paths = make_shards(tmp_path)
    c, data = config(paths), data_set(paths)
    going = WorkerSource(c, data, 0)
    for e in range(2):
        read_epoch(going, e, monkeypatch)
    whole, _, _ = read_epoch(going, 2, monkeypatch)
    resumed = WorkerSource(c, data, 0, start_epoch=2, start_step=start_step)
    got = [as_bytes(b) for b in resumed.epoch_batches(2, start_step)]
    later, _, _ = read_epoch(resumed, 3, monkeypatch)
    assert got == whole[start_step:] and later == read_epoch(going, 3, monkeypatch)[0]
