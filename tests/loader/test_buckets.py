"""Buckets through the loader and DALI (CPU): an epoch saved mid-way on 2 ranks resumes on one
rank with another batch size, every sample once (in one process, and under torchrun); the
same layout goes on exactly; a mix per source; what cannot be bucketed is refused by name."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dalistream
from dalistream import AspectBuckets, LengthBuckets, Loader, Stream
from dalistream.errors import ConfigError, ManifestError, StateError

from helpers import PHOTO_SIZES, key_shards, length_shards, photo_shards

pytestmark = [pytest.mark.dali]
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("bucket-photos"))
    return os.path.join(d, "shards"), photo_shards(d, n=72, seed=4, per_shard=10), os.path.join(d, "cache")


def stream(photos, rank=0, world=1, workers=2, batch=4, **kw):
    kw.setdefault("policy", "exact")
    kw.setdefault("buckets", AspectBuckets(PHOTO_SIZES))
    return Stream.open(photos[0], fields={"key": "__key__"}, batch_size=batch, workers=workers, rank=rank,
                       world_size=world, device="cpu", seed=7, cache_dir=photos[2], **kw)


def bucket_of(truth, key):
    w, h = truth[key]["width"], truth[key]["height"]
    return int(np.argmin([abs(np.log(w / h) - np.log(a / b)) for a, b in PHOTO_SIZES]))


def run_ranks(photos, world, workers, batch, state, steps=None):
    """Every rank of a layout one after the other, from ``state``; ``steps`` batches each (None: to
    the end). Returns the keys delivered and rank 0's state; every batch is checked to be one bucket."""
    keys, saved = [], None
    for rank in range(world):
        with Loader(stream(photos, rank, world, workers, batch)) as loader:
            if state is not None:
                loader.load_state_dict(state)
            expected = len(loader)
            for i, b in enumerate(loader):
                assert len({bucket_of(photos[1], k) for k in b["key"]} | set(b["bucket"].tolist())) <= 1
                keys += b["key"]
                if steps is not None and i + 1 == steps:
                    break
            else:
                assert i + 1 == expected
            if rank == 0:
                saved = loader.state_dict()
    return keys, saved


def test_two_ranks_saved_mid_epoch_resume_on_one_rank_with_another_batch_size(photos):
    a, state = run_ranks(photos, 2, 2, 4, None, steps=3)
    assert state["plan"]["buckets"]["sizes"] == [list(s) for s in PHOTO_SIZES]
    b, after = run_ranks(photos, 1, 1, 3, state)
    assert after["loader"] == {"epoch": 1, "step": 0} and after["segments"] == []
    assert sorted(a + b) == sorted(photos[1])  # every sample of the epoch once


def test_the_same_layout_goes_on_exactly(photos):
    with Loader(stream(photos, 0, 2)) as loader:
        full = [b["key"] for b in loader]
    with Loader(stream(photos, 0, 2)) as first:
        it = iter(first)
        head = [next(it)["key"] for _ in range(4)]
        state = first.state_dict()
    with Loader(stream(photos, 0, 2)) as loader:
        loader.load_state_dict(state)
        assert len(loader) == len(full) - 4
        rest = [b["key"] for b in loader]
    assert head + rest == full


@pytest.mark.slow
def test_torchrun_two_ranks_then_one_rank_with_another_batch_size(photos, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    keys = []
    for ranks, batch, state_in, state_out, stop in ((2, 4, "-", tmp_path / "s.json", 3), (1, 3, tmp_path / "s.json", "-", "-")):
        out = tmp_path / f"out{ranks}"
        out.mkdir()
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
             os.path.join(HERE, "bucket_train.py"), photos[0], str(out), str(batch), str(stop), str(state_in),
             str(state_out), photos[2]], capture_output=True, text=True, timeout=420, env=env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        rows = [json.load(open(out / f"rank-{r}.json")) for r in range(ranks)]
        assert [r["layout"] for r in rows] == [[r, ranks] for r in range(ranks)]
        for r in rows:
            for batch in r["batches"]:
                assert {bucket_of(photos[1], k) for k in batch["keys"]} <= {batch["bucket"]}
                assert batch["shape"] == list(PHOTO_SIZES[batch["bucket"]][::-1])  # (height, width)
            keys += r["keys"]
        if ranks == 2:
            assert len(rows[0]["batches"]) == len(rows[1]["batches"]) == 3
    assert sorted(keys) == sorted(photos[1])


def test_a_mix_per_source_holds_one_source_and_one_bucket_a_batch(tmp_path):
    length_shards(str(tmp_path / "a"), [21, 13, 30], seed=1)
    length_shards(str(tmp_path / "b"), [17, 9], seed=2)
    s = Stream.open({"a": (str(tmp_path / "a"), 0.6), "b": (str(tmp_path / "b"), 0.4)}, per_batch="source",
                    fields={"key": "__key__", "source": "__source__"}, batch_size=4, workers=2, device="cpu",
                    cache_dir=str(tmp_path / "cache"), buckets=LengthBuckets("txt", [15, 35]))
    seen, sources = [], []
    with Loader(s) as loader:
        assert len(loader) == s.steps(0) > 0
        for b in loader:
            assert len(set(b["source"])) == 1 and len(set(b["bucket"].tolist())) == 1 and len(b["key"]) == 4
            sources.append(b["source"][0])
            seen += [f"{b['source'][0]}:{k}" for k in b["key"]]
    assert len(seen) == len(set(seen))
    assert abs(sources.count("a") / len(sources) - 0.6) <= 1 / len(sources) + 1e-9  # within one batch


def test_what_cannot_be_bucketed_is_refused_by_name(photos, tmp_path):
    key_shards(str(tmp_path / "plain"), [5, 6])  # no manifest: counted by a header scan, no keys
    with pytest.raises(ManifestError, match=r"dalistream index SOURCES --keys image"):
        Stream.open(str(tmp_path / "plain"), fields={"key": "__key__"}, batch_size=2, device="cpu",
                    cache_dir=str(tmp_path / "cache"), buckets=AspectBuckets(PHOTO_SIZES))
    with pytest.raises(ConfigError, match="policy 'even' or 'exact'"):
        stream(photos, policy="fixed", batches_per_epoch=3)
    with pytest.raises(ConfigError, match="shuffle buffer"):
        stream(photos, shuffle=10)
    with pytest.raises(ConfigError, match="buckets with affinity='node'"):
        stream(photos, affinity="node")
    with pytest.raises(ConfigError, match=r"fields \['bucket'\]"):
        Stream.open(photos[0], fields={"bucket": "cls"}, batch_size=2, device="cpu", buckets=AspectBuckets(PHOTO_SIZES))
    with pytest.raises(ConfigError, match="per_batch='sample'"):
        Stream.open({"a": (photos[0], 1.0)}, fields={"key": "__key__"}, batch_size=2, device="cpu",
                    cache_dir=photos[2], buckets=AspectBuckets(PHOTO_SIZES))
    with pytest.raises(ConfigError, match=r"worker \d of rank 0 would hold \d+ samples at once .*lookahead=2"):
        stream(photos, buckets=AspectBuckets(PHOTO_SIZES, lookahead=2))
    with pytest.raises(ConfigError, match="no batch of one bucket"):
        stream(photos, policy="even", batch=20)


def test_a_state_resumes_only_the_same_buckets(photos):
    with Loader(stream(photos)) as bucketed:
        next(iter(bucketed))
        state = bucketed.state_dict()
    plain = Stream.open(photos[0], fields={"key": "__key__"}, batch_size=4, workers=2, device="cpu", seed=7,
                        policy="exact", cache_dir=photos[2], interleave=True)
    with Loader(plain) as loader:
        with pytest.raises(StateError, match="buckets: saved"):
            loader.load_state_dict(state)
    with Loader(stream(photos, buckets=AspectBuckets(PHOTO_SIZES, per="global"))) as other:
        with pytest.raises(StateError, match="buckets: saved"):
            other.load_state_dict(state)


@pytest.mark.parametrize("version", [5, 6])
def test_an_older_state_inside_a_bucketed_epoch_is_refused_and_one_at_its_start_loads(photos, version):
    """Version 7's bucket plans read 2B columns: an older state taken inside a bucketed epoch cannot
    say what that epoch delivered under today's plan, so it is refused by name; taken at an epoch's
    start (step 0) it loads, and the epoch runs whole."""
    from dalistream.loader.state import sealed

    with Loader(stream(photos)) as loader:
        whole = len(loader)
        it = iter(loader)
        next(it)
        inside = loader.state_dict()
    at_start = {**copy.deepcopy(inside), "loader": {"epoch": 1, "step": 0}}
    for state in (inside, at_start):
        state["version"] = version
        if version < 6:
            del state["plan"]["nodes"]
    with Loader(stream(photos)) as loader:
        with pytest.raises(StateError, match=f"version {version} inside epoch 0 of a bucketed stream") as e:
            loader.load_state_dict(sealed(inside))
        assert "step 0" in str(e.value)
        loader.load_state_dict(sealed(at_start))
        assert (loader.epoch, loader.step) == (1, 0) and len(list(loader)) == whole


def test_a_mix_with_buckets_resumes_on_its_own_layout_only(tmp_path):
    length_shards(str(tmp_path / "a"), [21, 13], seed=1)
    length_shards(str(tmp_path / "b"), [17, 9], seed=2)

    def mixed(batch):
        return Stream.open({"a": (str(tmp_path / "a"), 0.5), "b": (str(tmp_path / "b"), 0.5)}, per_batch="source",
                           fields={"key": "__key__"}, batch_size=batch, workers=1, device="cpu",
                           cache_dir=str(tmp_path / "cache"), buckets=LengthBuckets("txt", [30]))

    with Loader(mixed(3)) as first:
        next(iter(first))
        state = first.state_dict()
    with Loader(mixed(3)) as same:
        same.load_state_dict(state)
        assert same.step == 1
    with Loader(mixed(2)) as other:
        with pytest.raises(StateError, match="resumes on the layout it was saved under"):
            other.load_state_dict(state)


def test_the_torch_side_sees_each_batch_s_bucket(photos):
    with Loader(stream(photos)) as loader:
        batch = next(iter(loader))
    assert sorted(batch) == ["bucket", "bucket_height", "bucket_width", "key"]
    bucket = int(batch["bucket"][0])
    assert (int(batch["bucket_width"][0]), int(batch["bucket_height"][0])) == PHOTO_SIZES[bucket]
    assert dalistream.AspectBuckets(PHOTO_SIZES).describe(bucket) == {"width": PHOTO_SIZES[bucket][0],
                                                                      "height": PHOTO_SIZES[bucket][1]}


@pytest.mark.parametrize("policy", ["exact", "even"])
def test_the_workers_count_the_plan_s_padding_and_what_it_leaves_out(photos, policy):
    with Loader(stream(photos, policy=policy)) as loader:
        delivered = sum(len(b["key"]) for b in loader)
        stats = loader.stats(wait_s=10)
        steps = loader.stream.steps(0)
    assert stats["samples"] == delivered
    assert stats["padded"] == steps * 4 - delivered
    assert stats["dropped"] == (len(photos[1]) - delivered if policy == "even" else 0)


def test_per_global_every_rank_holds_the_same_bucket_at_every_step(photos):
    per_rank = []
    for rank in range(2):
        with Loader(stream(photos, rank, 2, buckets=AspectBuckets(PHOTO_SIZES, per="global"))) as loader:
            per_rank.append([(int(b["bucket"][0]), b["key"]) for b in loader])
    assert len(per_rank[0]) == len(per_rank[1])
    for (a, keys_a), (b, keys_b) in zip(*per_rank):
        assert a == b and {bucket_of(photos[1], k) for k in keys_a + keys_b} <= {a}
    assert sorted(k for r in per_rank for _, keys in r for k in keys) == sorted(photos[1])
