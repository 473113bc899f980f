"""A worker's rounds (worker/feed.py): its interleaved columns start out of step, so that in an
epoch they need their next runs a few at a time, not all at one step; what a worker delivers
is the same either way, and the same as when every sample is read alone."""

import os
import weakref

import numpy as np
import pytest

from dalistream.config import StreamConfig
from dalistream.dataset import DataSet
from dalistream.io.local import FileRange
from dalistream.manifest import build_manifest
from dalistream.manifest.offsets import SampleOffsets
from dalistream.manifest.rows import ShardRows
from dalistream.plan.bucketworker import KEY_SHIFT
from dalistream.tar import runs
from dalistream.worker import WorkerSource, epochfeed, feed
from dalistream.worker.policy import ErrorPolicy
from dalistream.worker.rows import Rows

from helpers import short_runs, write_tar

COLUMNS = 16


@pytest.fixture
def shards(tmp_path, monkeypatch):
    """4 shards x 60 samples of ~8 kB, with offsets and member layouts; runs of about 8 samples
    (the columns' share of the read buffers is 64 kB)."""
    short_runs(monkeypatch, 64 << 10)
    rng = np.random.default_rng(5)
    paths = []
    for s in range(4):
        members = []
        for i in range(60):
            members += [(f"s{s}/{i:03d}.bin", bytes(rng.integers(0, 256, 8000, dtype=np.uint8))),
                        (f"s{s}/{i:03d}.cls", str(i).encode())]
        paths.append(write_tar(str(tmp_path / f"f-{s}.tar"), members))
    rows = ShardRows.from_infos(build_manifest(paths, offsets=True))
    offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__", "raw": "bin", "label": "cls"},
                          batch_size=COLUMNS, workers=1, interleave=True, seed=1)
    per_sample = sum(os.path.getsize(p) for p in paths) / 240
    return config, DataSet(tuple(paths), (60,) * 4, offsets, bytes_per_sample=per_sample)


def epoch(config, data, monkeypatch, e=1):
    """The batches of epoch ``e``, and how many runs were read in each round (by the columns:
    a later epoch this small would be read at once, worker/epochfeed.py)."""
    per_round = []
    monkeypatch.setattr(epochfeed, "EPOCH_BYTES", 0)
    take, view = runs.Arena.take, FileRange.view

    def counted(self, n):
        per_round[-1] += 1
        return take(self, n)

    def viewed(self, n):  # (a run of a local file's mapped bytes)
        per_round[-1] += n > 0
        return view(self, n)

    def round_(self, t0, t1, original=feed.ColumnRounds.read):
        per_round.append(0)
        return original(self, t0, t1)

    monkeypatch.setattr(runs.Arena, "take", counted)
    monkeypatch.setattr(FileRange, "view", viewed)
    monkeypatch.setattr(feed.ColumnRounds, "read", round_)
    source = WorkerSource(config, data, 0)
    batches = [[np.asarray(v).tobytes() for v in b[0]] + [np.asarray(b[2]).tobytes()] for b in source.epoch_batches(e)]
    monkeypatch.undo()
    return batches, per_round


def test_columns_start_out_of_step_and_deliver_the_same(shards, monkeypatch):
    config, data = shards
    phased, reads = epoch(config, data, monkeypatch, e=0)
    # each column reads ~15 samples: a short first run (the job's first batch waits for little),
    # then one phased to (c + 1) / C of a run, then runs of ~8 samples
    assert len(phased) == 15 and reads[:2] == [COLUMNS, COLUMNS]
    short_runs(monkeypatch, 64 << 10)
    monkeypatch.setattr(feed.ColumnRounds, "_first_runs", lambda self, c: ())  # every column in step
    in_step, reads_in_step = epoch(config, data, monkeypatch, e=0)
    assert in_step == phased  # the same samples, in the same batches
    assert max(reads_in_step[2:]) == COLUMNS  # in step: every column needs its next run at the same round
    assert max(reads[2:]) <= COLUMNS * 3 // 4  # out of step: some at a time


def test_only_the_first_epoch_starts_with_short_runs(shards, monkeypatch):
    """A later epoch's columns start with their phased runs: a short first run there would only
    move the reading of each column's first whole run to the next round, one more run each."""
    config, data = shards
    later, reads = epoch(config, data, monkeypatch, e=1)
    short_runs(monkeypatch, 64 << 10)
    init = feed.ColumnRounds.__init__
    monkeypatch.setattr(feed.ColumnRounds, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "first_batch": True}))
    short, reads_short = epoch(config, data, monkeypatch, e=1)
    assert later == short  # the same samples, in the same batches
    assert reads_short[:2] == [COLUMNS, COLUMNS]  # short runs, then the phased ones a round later
    # the phased runs in the first round (a column whose phased run holds a sample or two reads
    # its next one too: a run's last sample waits for the next item), and fewer runs in all
    assert COLUMNS <= reads[0] < 2 * COLUMNS and sum(reads) < sum(reads_short)


def test_short_columns_are_not_cut(shards, monkeypatch):
    """Columns of a run or two each read their part at once (more runs would cost more than they spread)."""
    config, data = shards
    monkeypatch.setattr(runs, "MIN_RUN_BYTES", 1 << 20)  # a run holds a column's whole share
    monkeypatch.setattr(runs, "MAPPED_RUN_BYTES", 0)  # (a local file's mapped runs as long)
    source = WorkerSource(config, data, 0)
    plans = source.plans(1)
    f = feed.ColumnRounds([iter(())] * len(plans), np.ones((15, len(plans)), np.int64), 3,
                          bytes_per_sample=data.bytes_per_sample)
    assert f._first_runs(3) == ()


class _Values(list):
    """A block's field values (a list that can be watched with a weak reference)."""


def _blocks(rng, c, lengths, watch):
    """Column ``c``'s blocks of ``lengths`` rows, made as they are asked for; their ordinals
    consecutive within a block, with gaps between some (rows skipped); every value list watched."""
    ordinal = 0
    for n in lengths:
        ordinal += int(rng.integers(0, 2))
        yield _block(c, n, ordinal, watch)  # (not held by this generator while it waits)
        ordinal += n


def _block(c, n, ordinal, watch):
    rows = range(ordinal, ordinal + n)
    columns = [_Values((c, o) for o in rows), _Values(f"{c}:{o}" for o in rows)]
    watch += [weakref.ref(v) for v in columns]
    return Rows(columns, n, ordinal)


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("pattern", ["one row each", "a span's slot", "shares", "uneven, some columns short"])
def test_each_step_takes_each_column_s_rows_in_order(pattern, keyed):
    """Whatever the takes (a row of every column a step; one column's whole slot; a mix's
    shares; uneven and zero takes with columns that run out) and the blocks (1 to 9 rows), step
    ``t`` holds column after column the next ``takes[t, c]`` rows of each (fewer where it ran
    out), with their keys when keyed; and the blocks used up are let go (no reference kept,
    no cycle)."""
    rng = np.random.default_rng(["one row each", "a span's slot", "shares", "uneven, some columns short"].index(pattern))
    n_columns, steps = 6, 40
    if pattern == "one row each":
        takes = np.ones((steps, n_columns), np.int64)
    elif pattern == "a span's slot":
        takes = np.zeros((steps, n_columns), np.int64)
        takes[:, 2] = 12
    elif pattern == "shares":
        takes = np.tile(np.array([3, 0, 1, 2, 1, 5]), (steps, 1))
    else:
        takes = rng.integers(0, 4, (steps, n_columns))
    totals = takes.sum(axis=0)
    if pattern == "uneven, some columns short":
        totals = totals - np.array([0, 7, 0, 30, 0, 1])  # columns 1, 3 and 5 run short
    watch: list = []
    expected = []
    streams = []
    for c in range(n_columns):
        lengths = []
        while sum(lengths) < totals[c]:
            lengths.append(int(min(rng.integers(1, 10), totals[c] - sum(lengths))))
        rows = [(v0, v1, c * KEY_SHIFT + v0[1]) for b in _blocks(np.random.default_rng(c), c, lengths, [])
                for v0, v1 in zip(*b.columns)]
        expected.append(rows)
        streams.append(_blocks(np.random.default_rng(c), c, lengths, watch))
    f = epochfeed.read_by_columns(takes, ErrorPolicy("raise"), lambda s: feed.ColumnRounds(streams, takes, 2, keyed=keyed))
    at = [0] * n_columns
    for t in range(steps):
        values, n, counts = f.take(t)
        want = []
        for c in range(n_columns):
            got = expected[c][at[c]:at[c] + takes[t, c]]
            assert counts[c] == len(got), (t, c)
            at[c] += len(got)
            want += got
        assert n == len(want)
        assert [list(v) for v in values] == [list(v) for v in zip(*want)][:2 + keyed] if want else all(not len(v) for v in values)
    assert at == [len(rows) for rows in expected]
    del values
    assert not [w for w in watch if w() is not None]


@pytest.mark.parametrize("batch", [8, 64, 256])
@pytest.mark.parametrize("sample_bytes", [2_000, 10_000, 60_000])
def test_a_round_reads_about_its_bytes_however_many_columns_share_a_step(batch, sample_bytes):
    """A round reads about ``ROUND_BYTES`` (at most ``MAX_ROUND_STEPS`` steps, at least one) of the
    rows its steps take, counted by what the steps take: a bucket worker's 2B columns taking B rows
    a step between them (each about half a row a step, unevenly), or B interleaved columns one row
    each, give the same rounds; a keyed feed's rounds are not shortened for its columns' number."""
    rng = np.random.default_rng(batch + sample_bytes)
    steps = 60
    interleaved = np.ones((steps, batch), np.int64)
    bucketed = np.zeros((steps, 2 * batch), np.int64)  # B rows a step, spread over 2B columns
    for t in range(steps):
        np.add.at(bucketed[t], rng.integers(0, 2 * batch, batch), 1)
    run_bytes = runs.run_length(1 << 20, mapped=True)
    want = max(1, min(feed.MAX_ROUND_STEPS, feed.ROUND_BYTES // (batch * sample_bytes),
                      (run_bytes // 2) // sample_bytes))
    assert feed.round_steps(interleaved, False, sample_bytes, run_bytes) == want
    assert feed.round_steps(bucketed, True, sample_bytes, run_bytes) == want
    assert feed.round_steps(bucketed[:, :1], True, sample_bytes, run_bytes) >= 1  # (one column, few rows)
