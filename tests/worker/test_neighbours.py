"""Parts of neighbouring columns read as one run (worker/neighbours.py): in a later epoch, a
worker whose interleaved columns each read their part as one run reads neighbouring parts
together; what it delivers, skips and reports is the same as when each part is read alone (as
the job's first epoch reads them)."""

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
from dalistream.worker.neighbours import TOGETHER_BYTES, Neighbours

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
    """Epoch ``e``'s batches (as bytes), the runs read for it, and the source's skips after it
    (read by the columns: an epoch this small would be read at once, worker/epochfeed.py)."""
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
def test_a_later_epoch_reads_neighbouring_parts_together_and_delivers_the_same(tmp_path, monkeypatch, policy):
    paths = make_shards(tmp_path)
    c = config(paths, policy=policy)
    data = data_set(paths)
    going = WorkerSource(c, data, 0)
    read_epoch(going, 0, monkeypatch)
    together, reads, _ = read_epoch(going, 1, monkeypatch)
    alone, reads_alone, _ = read_epoch(WorkerSource(c, data, 0, start_epoch=1), 1, monkeypatch)
    assert together == alone  # the same samples, in the same batches
    # each column's part (7 or 8 samples of ~2 kB) is one run; read alone, a part per column
    # (a short first run, then the rest: the job's first batch waits for little)
    assert reads_alone >= COLUMNS
    # together: a read per shard, and one each for its last part (whose end-of-archive check is
    # its own) and its first where that is a column's second part (opened a round later, after
    # the part after it was read)
    assert reads <= 3 * len(paths) < reads_alone
    assert not going.readers[0].neighbours.ahead  # every part read ahead was taken by its column


def test_parts_cut_out_of_the_mapping_are_not_copied_together(tmp_path, monkeypatch):
    """A later epoch's parts of more than a run and a half are views of their file's mapping, as
    in the first epoch: none is read into the worker's buffers with its neighbours (a copy that
    saves nothing), and the batches are those of reading each part alone. (With a bound of the
    mapped run length instead, these parts were copied together.)"""
    paths = make_shards(tmp_path, size=20000)  # parts of 7–8 samples of ~20 kB: ~150 kB
    short = {"MIN_RUN_BYTES": 1, "MIN_RUN_SAMPLES": 0}  # runs of a chunk (64 kB): each part is mapped
    for name, value in short.items():
        monkeypatch.setattr(runs, name, value)
    c = config(paths, storage_options={"chunk_bytes": 64 << 10})
    data = data_set(paths)
    going = WorkerSource(c, data, 0)
    read_epoch(going, 0, monkeypatch)  # (undoes the patches)
    for name, value in short.items():
        monkeypatch.setattr(runs, name, value)
    grouped = [0]
    keep = Neighbours.keep

    def counted(self, *args):
        grouped[0] += 1
        return keep(self, *args)

    monkeypatch.setattr(Neighbours, "keep", counted)
    together = [as_bytes(b) for b in going.epoch_batches(1)]
    assert grouped[0] == 0  # no part copied with its neighbours: each a view of the mapping
    alone = [as_bytes(b) for b in WorkerSource(c, data, 0, start_epoch=1).epoch_batches(1)]
    assert together == alone


def test_a_damaged_neighbour_is_found_by_its_own_column(tmp_path, monkeypatch):
    """A part whose header check fails in the read with its neighbours is read again alone: its
    problem is its own column's (the same skips, the same samples delivered)."""
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
    together, _, skipped = read_epoch(going, 1, monkeypatch)
    alone, _, skipped_alone = read_epoch(WorkerSource(c, data, 0, start_epoch=1), 1, monkeypatch)
    assert together == alone
    assert sum(skipped.values()) - sum(skipped_alone.values()) == sum(skipped_alone.values()) > 0  # (epochs 0 and 1)


def test_bounds_stop_at_a_shards_last_part_a_runs_bytes_and_the_limit():
    plans = [type("Plan", (), {"parts": parts})() for parts in
             [((0, 0, 10),), ((0, 10, 20),), ((0, 20, 30),), ((0, 30, 40),), ((1, 0, 10),)]]
    n = Neighbours(plans)
    starts = np.arange(41) * 1000  # 1 kB a sample
    assert n.bounds(0, 0, 10, starts, 40, 1 << 20) == [0, 10, 20, 30]  # not the shard's last part (30 … 40)
    assert n.bounds(0, 30, 40, starts, 40, 1 << 20) == [30, 40]
    assert n.bounds(0, 0, 10, starts, 40, 5000) == [0, 10]  # a part of more than one run reads alone
    big = np.arange(41) * (TOGETHER_BYTES // 15)
    assert n.bounds(0, 0, 10, big, 40, 1 << 30) == [0, 10]  # 20 samples would pass the limit
    assert Neighbours().bounds(0, 0, 10, starts, 40, 1 << 20) == [0, 10]  # no plans: nothing to read with it


def test_only_parts_read_into_the_buffers_go_with_others():
    """A part of up to a run and a half is one run in the worker's buffers and goes with its
    neighbours; a longer one is cut out of its file's mapping (no copy), so a read together would
    only copy it: it reads alone (``sliced_runs``' rule for a mapped part, the same bound)."""
    plans = [type("Plan", (), {"parts": ((0, a, a + 10),)})() for a in range(0, 40, 10)]
    n = Neighbours(plans)
    starts = np.arange(41) * 1000  # parts of 10 kB
    assert n.bounds(0, 0, 10, starts, 40, 8000) == [0, 10, 20, 30]  # 1.25 runs: one run, read together
    assert n.bounds(0, 0, 10, starts, 40, 6000) == [0, 10]  # 1.67 runs: mapped alone
    assert n.bounds(0, 0, 10, starts, 40, 20000 // 3 + 1) == [0, 10, 20, 30]  # just a run and a half


def test_nothing_read_ahead_travels_with_a_reader(tmp_path, monkeypatch):
    paths = make_shards(tmp_path)
    source = WorkerSource(config(paths), data_set(paths), 0)
    reader = source.readers[0]
    read_epoch(source, 0, monkeypatch)
    reader.neighbours.ahead[(0, 0, 1)] = "a run"
    assert pickle.loads(pickle.dumps(reader)).neighbours.ahead == {}


@pytest.mark.parametrize("start_step", [1, 3])
def test_a_resumed_epoch_delivers_the_same(tmp_path, monkeypatch, start_step):
    """A job resumed mid-epoch opens its columns' parts where they resume (not where a neighbour
    would read them); what it delivers from there is what the job would have."""
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
