"""A mix reads interleaved like a single data set: each worker's share of a source is cut into
columns spread over the source's sequence, so batches of class-sorted sources are as mixed as a
random order (``plan --shuffle-quality``), every sample of an epoch is read once, and the worker
delivers exactly the order the measure predicts."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dalistream import Stream
from dalistream.plan import Layout, MixEpoch, Schedule
from dalistream.tools.quality import mix_rank_batches
from dalistream.worker import WorkerSource

from helpers import REPO, key_shards


def plan_cli(cache, *args):
    env = dict(os.environ, PYTHONPATH=REPO, DALISTREAM_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-m", "dalistream", "plan", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two sources of class-sorted shards (their samples in written order are the classes' order)."""
    d = tmp_path_factory.mktemp("mixq")
    sizes = {"a": [60] * 30, "b": [50] * 24}
    for name, counts in sizes.items():
        key_shards(str(d / name), counts, prefix=name)
    return str(d), sizes


@pytest.mark.slow
def test_plan_shuffle_quality_of_a_two_source_mix_meets_the_targets(sources, tmp_path):
    d, _ = sources
    args = ("--mix", f"a=0.6:{d}/a", "--mix", f"b=0.4:{d}/b", "--world-size", 4, "-W", 2, "-B", 32,
            "--shuffle-quality", "--json")
    (q,) = json.loads(plan_cli(tmp_path / "c", *args))["shuffle_quality"]
    assert q["columns"] and q["rank_batch_vs_random"] >= 0.9 and q["global_batch_vs_random"] >= 0.95, q
    (spans,) = json.loads(plan_cli(tmp_path / "c", *args, "--no-interleave"))["shuffle_quality"]  # each source's spans, a buffer
    assert not spans["columns"] and spans["rank_batch_vs_random"] < 0.9, spans  # (what a mix read before)


@pytest.mark.parametrize("layout", [Layout(1, 1, 5), Layout(2, 3, 10), Layout(3, 2, 7), Layout(4, 4, 32)])
@pytest.mark.parametrize("samples_per_epoch", [None, 900])
def test_every_sample_of_a_mix_epoch_is_read_once_by_the_columns(layout, samples_per_epoch):
    counts = [[37, 0, 52, 18, 40], [25, 31, 9]]
    for epoch in range(3):
        ep = MixEpoch(counts, [0.55, 0.45], layout, Schedule(3, "even"), epoch, ["a", "b"],
                      samples_per_epoch=samples_per_epoch, interleave=True)
        seen = {0: [], 1: []}
        for r in range(layout.world_size):
            for w in range(layout.workers):
                for plan, take, s in ep.worker_columns(r, w):
                    assert sum(b - a for _, a, b in plan.parts) == plan.samples == int(take.sum())
                    assert set(np.unique(take)) <= {0, 1}  # one sample a step, interleaved
                    seen[s] += [(shard, i) for shard, a, b in plan.parts for i in range(a, b)]
        for s in (0, 1):
            used = int(ep.bounds[s, -1] - ep.bounds[s, 0])
            assert len(seen[s]) == used
            if samples_per_epoch is None:  # within one pass: no sample twice
                assert len(set(seen[s])) == used


@pytest.mark.parametrize("R,W,B", [(1, 2, 12), (2, 3, 10)])
def test_the_worker_delivers_the_order_the_measure_predicts(sources, R, W, B):
    d, sizes = sources
    written = {name: np.concatenate([[0], np.cumsum(counts)]) for name, counts in sizes.items()}

    def key_of(i, offset, name):
        i -= offset
        shard = int(np.searchsorted(written[name], i, side="right")) - 1
        return f"{name}{shard:03d}/{i - written[name][shard]:05d}"

    for rank in range(R):
        stream = Stream.open({"a": (f"{d}/a", 0.6), "b": (f"{d}/b", 0.4)}, fields={"key": "__key__"}, batch_size=B,
                             workers=W, rank=rank, world_size=R, device="cpu", seed=5)
        assert stream.config.interleave and "interleaved" in stream.reading
        ids = mix_rank_batches(stream.mix.epoch(stream.config.layout, stream.config.schedule, 1, True), 0)[rank]
        total_a = sum(sizes["a"])
        expected = [[key_of(i, 0, "a") if i < total_a else key_of(i, total_a, "b") for i in row] for row in ids.tolist()]
        got = [[] for _ in expected]
        for w in range(W):
            source = WorkerSource(stream.config, stream.data, w, mix=stream.mix)
            for t, (keys, valid) in enumerate(source.epoch_batches(1)):
                got[t] += [bytes(k).decode() for k, v in zip(keys, valid) if int(v)]
        assert got == expected
