"""Elastic resume through real DALI pipelines (CPU): an epoch saved mid-way under one layout goes
on under others (ranks, workers, batch size), every sample of it once under ``exact``; the
resume traps of the issue (``set_epoch``, ``len``, moved sources, refusals in words)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dalistream import Loader, Stream
from dalistream.errors import StateError

from helpers import key_shard_folder, shard_keys, uneven_sizes

pytestmark = [pytest.mark.dali]

SIZES = uneven_sizes(9, seed=4, low=0, high=30)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return key_shard_folder(tmp_path_factory, "elastic", SIZES)


ALL = shard_keys(SIZES)


def stream(shards, rank, world, workers, batch, **kw):
    kw.setdefault("seed", 5)
    kw.setdefault("policy", "exact")
    return Stream.open(shards, fields={"key": "__key__"}, batch_size=batch, workers=workers, rank=rank,
                       world_size=world, device="cpu", cache_dir=shards, **kw)


def run_layout(shards, world, workers, batch, state, steps=None, **kw):
    """Every rank of a layout, one after the other, from rank 0's ``state``; ``steps`` batches
    each (None: to the epoch's end). Returns (keys delivered, rank 0's state after)."""
    keys, saved = [], None
    for rank in range(world):
        with Loader(stream(shards, rank, world, workers, batch, **kw)) as loader:
            if state is not None:
                loader.load_state_dict(state)
            epoch, n = loader.epoch, len(loader)
            for i, b in enumerate(loader):
                keys += b["key"]
                if steps is not None and i + 1 == steps:
                    break
            else:
                assert i + 1 == n  # len() was what the iteration yielded
            if rank == 0:
                saved = loader.state_dict()
            assert loader.epoch == epoch + (steps is None)
    return keys, saved


@pytest.mark.parametrize("shuffle", [0, 5])
def test_two_by_two_then_three_by_one_then_one(shards, shuffle):
    a, state = run_layout(shards, 2, 2, 4, None, steps=4, shuffle=shuffle)
    b, state = run_layout(shards, 3, 1, 3, state, steps=2, shuffle=shuffle)
    assert state["segments"] == [[2, 2, 4, 4]] and state["loader"]["step"] == 2
    c, state = run_layout(shards, 1, 1, 5, state, shuffle=shuffle)
    assert sorted(a + b + c) == ALL  # every sample once
    assert state["loader"] == {"epoch": 1, "step": 0} and state["segments"] == []


def test_even_never_twice_and_leaves_at_most_a_batch_per_rank(shards):
    a, state = run_layout(shards, 2, 1, 6, None, steps=3, policy="even")
    b, _ = run_layout(shards, 3, 1, 4, state, policy="even")
    keys = a + b
    assert len(keys) == len(set(keys)) and set(keys) <= set(ALL)
    assert len(ALL) - len(keys) < 3 * 4


def test_set_epoch_of_the_loaded_epoch_goes_on(shards):
    with Loader(stream(shards, 0, 1, 1, 4)) as first:
        it = iter(first)
        seen = [next(it)["key"] for _ in range(3)]
        state = first.state_dict()
    with Loader(stream(shards, 0, 1, 1, 4)) as loader:
        loader.load_state_dict(state)
        full = -(-len(ALL) // 4)
        assert len(loader) == full - 3
        loader.set_epoch(0)  # the README's loop: goes on
        rest = [b["key"] for b in loader]
        assert len(rest) == full - 3 and sorted(sum(seen + rest, [])) == ALL
        loader.set_epoch(0, restart=True)
        assert len(loader) == full


def test_the_same_shards_in_another_folder_resume(shards, tmp_path):
    moved = str(tmp_path / "elsewhere" / "data")
    shutil.copytree(shards, moved, ignore=shutil.ignore_patterns("manifests", "members", "offsets"))
    with Loader(stream(shards, 0, 1, 1, 4)) as first:
        next(iter(first))
        state = first.state_dict()
    with Loader(stream(moved, 0, 2, 1, 3)) as loader:
        loader.load_state_dict(state)
        assert loader.resume == ((1, 1, 4, 1),)


def test_refusals_say_what_differs(shards, tmp_path):
    with Loader(stream(shards, 0, 1, 1, 4)) as first:
        state = first.state_dict()
    with Loader(stream(shards, 0, 1, 1, 4, seed=6)) as other:
        with pytest.raises(StateError, match="seed: saved 5, this loader 6"):
            other.load_state_dict(state)
    fewer = str(tmp_path / "fewer")
    os.makedirs(fewer)
    for name in sorted(os.listdir(shards)):
        if name.endswith(".tar") and name != "s-0008.tar":
            shutil.copy(os.path.join(shards, name), fewer)
    with Loader(stream(fewer, 0, 1, 1, 4)) as other:
        with pytest.raises(StateError, match="9 shards saved, 8 now"):
            other.load_state_dict(state)


# -- torchrun: separate processes per rank, locally and from S3 (moto) ---------------------------

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(source, out, ranks, workers, batch, stop, state_in, state_out, env):
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
         os.path.join(HERE, "elastic_train.py"), source, str(out), str(workers), str(batch), str(stop),
         str(state_in), str(state_out)], capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.load(open(out / f"rank-{r}.json")) for r in range(ranks)]
    assert [r["layout"] for r in rows] == [[r, ranks] for r in range(ranks)]
    return [k for r in rows for k in r["keys"]], rows


def elastic_epoch(source, tmp_path, env):
    """2 ranks x 2 workers x batch 4 for 3 steps, then 3 ranks x 1 worker x batch 5 for 2 steps,
    then 1 rank x 1 worker x batch 3 to the end: the epoch's keys."""
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    a, _ = torchrun(source, tmp_path / "a", 2, 2, 4, 3, "-", tmp_path / "s1.json", env)
    b, _ = torchrun(source, tmp_path / "b", 3, 1, 5, 2, tmp_path / "s1.json", tmp_path / "s2.json", env)
    c, rows = torchrun(source, tmp_path / "c", 1, 1, 3, "-", tmp_path / "s2.json", "-", env)
    assert json.load(open(tmp_path / "s2.json"))["segments"] == [[2, 2, 4, 3]]
    assert rows[0]["len"] * 3 >= len(c) > (rows[0]["len"] - 1) * 3  # len() was the rest of the epoch
    return a + b + c


def uninterrupted(source, **kw):
    keys = []
    with Loader(Stream.open(source, fields={"key": "__key__"}, batch_size=4, workers=2, rank=0, world_size=1,
                            device="cpu", shuffle=6, seed=9, policy="exact", **kw)) as loader:
        for b in loader:
            keys += b["key"]
    return keys


@pytest.mark.slow
def test_torchrun_elastic_local(shards, tmp_path):
    keys = elastic_epoch(shards, tmp_path, dict(os.environ, DALISTREAM_CACHE=str(tmp_path / "cache")))
    once = uninterrupted(shards, cache_dir=str(tmp_path / "cache"))
    assert sorted(keys) == sorted(once) == ALL  # the same set, each once


@pytest.mark.slow
def test_torchrun_elastic_from_s3(shards, tmp_path, moto_endpoint):
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket="elastic")
    for name in sorted(os.listdir(shards)):
        if name.endswith(".tar"):
            client.upload_file(os.path.join(shards, name), "elastic", f"ds/{name}")
    env = dict(os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"), ELASTIC_ENDPOINT=moto_endpoint)
    keys = elastic_epoch("s3://elastic/ds/", tmp_path, env)
    assert sorted(keys) == ALL
    # a state saved over the local folder resumes over the bucket: the same shards
    with Loader(stream(shards, 0, 1, 1, 4)) as first:
        next(iter(first))
        state = first.state_dict()
    with Loader(Stream.open("s3://elastic/ds/", fields={"key": "__key__"}, batch_size=3, workers=1, rank=0,
                            world_size=1, device="cpu", policy="exact", seed=5, cache_dir=str(tmp_path / "c2"),
                            storage_options={"endpoint_url": moto_endpoint})) as loader:
        loader.load_state_dict(state)
        rest = [k for b in loader for k in b["key"]]
    assert len(rest) == len(ALL) - 4 and len(set(rest)) == len(rest)


def test_fixed_without_counts_restarts_the_epoch_with_a_warning(shards, caplog):
    kw = dict(policy="fixed", batches_per_epoch=5)
    with Loader(stream(shards, 0, 1, 1, 4, **kw)) as first:
        assert first.stream.counts is None  # whole shards: no plan of samples to resume from
        it = iter(first)
        next(it), next(it)
        state = first.state_dict()
    with Loader(stream(shards, 0, 2, 1, 3, **kw)) as loader:
        with caplog.at_level("WARNING", logger="dalistream.loader.loader"):
            loader.load_state_dict(state)
        assert (loader.epoch, loader.step, loader.resume, len(loader)) == (0, 0, (), 5)
        assert "restarts" in caplog.text
    with Loader(stream(shards, 0, 1, 1, 4, **kw)) as same:  # the same layout goes on
        same.load_state_dict(state)
        assert (same.step, len(same)) == (2, 3)
