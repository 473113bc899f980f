"""Mixing data sets by weight, through real DALI pipelines (CPU): every rank batch holds exactly
the plan's count of each source (``__source__`` counted per batch), no sample is read twice
within a pass, every rank runs the same steps, resume mid-epoch on the saved layout equals the
uninterrupted run and on another layout continues the epoch (no sample twice, the rule's counts
go on), one source on S3 (moto) beside a local one, and every bad mix is a ConfigError naming
the source before any worker starts."""

import collections
import math
import os

import pytest

from dalistream import Loader, Stream
from dalistream.errors import ConfigError, StateError
from dalistream.plan import Layout, batch_sources

from helpers import key_shards

pytestmark = [pytest.mark.dali]

R, W, B = 2, 2, 10


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three sources of very different sizes: 'big' 102 samples, 'mid' 31, 'tiny' 4 (smaller than
    one batch per rank)."""
    d = tmp_path_factory.mktemp("mix")
    for name, sizes in (("big", [40, 37, 25]), ("mid", [9, 6, 16]), ("tiny", [4])):
        key_shards(str(d / name), sizes, prefix=name[0])
    return str(d)


def open_mix(data, weights, rank=0, world=R, workers=W, batch=B, **kw):
    mix = {name: (os.path.join(data, name), w) for name, w in weights.items()}
    return Stream.open(mix, fields={"key": "__key__", "src": "__source__"}, batch_size=batch, workers=workers,
                       rank=rank, world_size=world, device="cpu", seed=kw.pop("seed", 4), **kw)


def run_rank(stream, epochs=1):
    out = []
    with Loader(stream) as loader:
        for _ in range(epochs):
            out.append([list(zip(b["src"], b["key"])) for b in loader])
        stats = loader.stats(wait_s=5)
    return out, stats


@pytest.mark.parametrize("weights", [{"big": 0.7, "mid": 0.3}, {"big": 5, "mid": 3, "tiny": 2}])
def test_every_batch_holds_the_plans_count_of_each_source(data, weights):
    names = list(weights)
    steps, seen = None, collections.Counter()
    for rank in range(R):
        stream = open_mix(data, weights, rank=rank)
        (batches,), stats = run_rank(stream)
        want = batch_sources([weights[n] for n in names], B, stream.steps(0))
        assert len(batches) == stream.steps(0) > 0  # every rank the same number of steps
        steps = steps or len(batches)
        assert len(batches) == steps
        for batch, counts in zip(batches, want):
            got = collections.Counter(src for src, _ in batch)
            assert [got[n] for n in names] == counts.tolist()
        seen.update((src, key) for batch in batches for src, key in batch)
        assert stats["sources"] == {n: int(want[:, i].sum()) for i, n in enumerate(names) if want[:, i].sum()}
    assert max(seen.values()) == 1  # no sample twice within a pass, across ranks
    for name in names:  # keys are the source's own
        assert all(key.startswith(name[0]) for src, key in seen if src == name)


def test_one_batch_one_source(data):
    stream = open_mix(data, {"big": 3, "mid": 1}, rank=0, per_batch="source")
    (batches,), _ = run_rank(stream)
    kinds = [{src for src, _ in b} for b in batches]
    assert all(len(k) == 1 for k in kinds) and {"big"} in kinds and {"mid"} in kinds


def test_samples_per_epoch_reads_everything_once_before_repeating(data):
    """With samples_per_epoch the small source starts a new pass when it runs out; over the
    epochs every sample of it is read once before any is read twice."""
    stream = open_mix(data, {"big": 0.5, "tiny": 0.5}, rank=0, world=1, workers=1, batch=4, samples_per_epoch=8)
    epochs, _ = run_rank(stream, epochs=3)
    tiny = [key for epoch in epochs for batch in epoch for src, key in batch if src == "tiny"]
    assert len(tiny) == 12
    for n in range(0, 12, 4):  # each pass of 4 holds every tiny sample once
        assert sorted(tiny[n:n + 4]) == sorted(f"t000/{i:05d}" for i in range(4))


def test_resume_mid_epoch_on_the_saved_layout(data):
    weights = {"big": 0.7, "mid": 0.3}
    (full,), _ = run_rank(open_mix(data, weights))
    k = len(full) // 2
    with Loader(open_mix(data, weights)) as a:
        it = iter(a)
        for _ in range(k):
            next(it)
        state = a.state_dict()
    assert set(state["plan"]["sources"]["mix"]) == {"big", "mid"}
    with Loader(open_mix(data, weights)) as b:
        b.load_state_dict(state)
        rest = [list(zip(x["src"], x["key"])) for x in b]
    assert rest == full[k:]
    with Loader(open_mix(data, {"big": 0.6, "mid": 0.4})) as d:
        with pytest.raises(StateError, match="another mix"):
            d.load_state_dict(state)


def preempted(data, weights, k, **kw):
    """Every rank of 2 x 2 x batch 10 runs ``k`` steps: what they delivered, and the state."""
    first = []
    for rank in range(R):
        with Loader(open_mix(data, weights, rank=rank, **kw)) as a:
            it = iter(a)
            for _ in range(k):
                batch = next(it)
                first += list(zip(batch["src"], batch["key"]))
            state = a.state_dict()  # (the same on every rank)
    return first, state


def continued(data, weights, state, n0, layout, per_batch="sample", **kw):
    """Every rank of ``layout`` resumes ``state``: what they delivered, after checking that every
    batch holds the continued rule's counts and that every rank ran the same steps."""
    rest, steps = [], set()
    for rank in range(layout.world_size):
        with Loader(open_mix(data, weights, rank=rank, world=layout.world_size, workers=layout.workers,
                             batch=layout.batch_size, per_batch=per_batch, **kw)) as b:
            b.load_state_dict(state)
            batches = [list(zip(x["src"], x["key"])) for x in b]
        steps.add(len(batches))
        want = batch_sources(list(weights.values()), layout.batch_size, len(batches), per_batch, n0)
        for got, counts in zip(batches, want):
            c = collections.Counter(src for src, _ in got)
            assert [c[name] for name in weights] == counts.tolist()
        rest += [x for batch in batches for x in batch]
    assert len(steps) == 1 and steps.pop() > 0  # every rank the same number of steps
    return rest


@pytest.mark.parametrize("world,workers,batch,per_batch", [(3, 1, 8, "sample"), (1, 3, 12, "sample"),
                                                          (3, 1, 8, "source")])
def test_resume_mid_epoch_on_another_layout(data, world, workers, batch, per_batch):
    """Preempted after k steps on 2 ranks x 2 workers x batch 10, the epoch goes on on another
    allocation: no sample of either source twice, every continued batch holds the continued
    rule's counts, the epoch's proportions stay those of the weights."""
    weights, k = {"big": 0.7, "mid": 0.3}, 1
    first, state = preempted(data, weights, k, per_batch=per_batch)
    n0 = k * B if per_batch == "sample" else k  # units dealt before the preemption: slots, or batches
    rest = continued(data, weights, state, n0, Layout(world, workers, batch), per_batch)
    everything = first + rest
    assert len(everything) == len(set(everything))  # no sample twice, across both allocations
    c = collections.Counter(src for src, _ in everything)
    assert abs(c["big"] - 0.7 * len(everything)) <= max(R, world) * (1 if per_batch == "sample" else max(B, batch))


def test_resume_with_samples_per_epoch_on_another_layout(data):
    """samples_per_epoch, the tiny source wrapping into new passes within the epoch: resumed on
    another layout, every continued batch holds the rule's counts, the big source no sample twice,
    the tiny one every sample as often as the others, give or take one pass."""
    weights, k = {"big": 0.5, "tiny": 0.5}, 1
    first, state = preempted(data, weights, k, samples_per_epoch=40)
    rest = continued(data, weights, state, k * B, Layout(3, 1, 6), samples_per_epoch=40)  # epoch 0: from 0
    everything = first + rest
    big = [key for src, key in everything if src == "big"]
    assert len(big) == len(set(big))
    tiny = collections.Counter(key for src, key in everything if src == "tiny")
    assert sum(tiny.values()) >= 8, tiny  # it wrapped: several passes in one epoch
    assert len(tiny) == 4 and max(tiny.values()) - min(tiny.values()) <= 1  # whole passes, give or take one


@pytest.mark.s3
def test_a_source_on_s3_beside_a_local_one(data, moto_endpoint):
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="mix")
    folder = os.path.join(data, "mid")
    for name in sorted(os.listdir(folder)):
        s3.upload_file(os.path.join(folder, name), "mix", f"mid/{name}")
    weights = {"big": 0.7, "mid": 0.3}
    local = run_rank(open_mix(data, weights))[0][0]
    mix = {"big": (os.path.join(data, "big"), 0.7),
           "mid": {"source": "s3://mix/mid/", "weight": 0.3, "storage_options": {"endpoint_url": moto_endpoint}}}
    stream = Stream.open(mix, fields={"key": "__key__", "src": "__source__"}, batch_size=B, workers=W, rank=0,
                         world_size=R, device="cpu", seed=4)
    remote = run_rank(stream)[0][0]
    assert remote == local  # the same samples, the same order: where the bytes live changes nothing


@pytest.mark.parametrize("weights,words", [
    ({"big": 0, "mid": 1}, "'big'"), ({"big": -1, "mid": 1}, "'big'"), ({"big": math.nan, "mid": 1}, "'big'"),
    ({"big": math.inf, "mid": 1}, "'big'"), ({"big": "x", "mid": 1}, "'big'"), ({"big": True, "mid": 1}, "'big'"),
    ({"big": 1000, "tiny": 1}, "'tiny'"),  # its share rounds to nothing
])
def test_bad_mixes_name_the_source(data, weights, words):
    with pytest.raises(ConfigError) as info:
        open_mix(data, weights)
    assert words in str(info.value)


def test_other_refusals(data, tmp_path):
    os.makedirs(tmp_path / "empty")
    key_shards(str(tmp_path / "empty"), [0])
    with pytest.raises(ConfigError, match="'none'.*no samples|no samples.*'none'"):
        Stream.open({"big": (os.path.join(data, "big"), 1), "none": (str(tmp_path / "empty"), 1)},
                    fields={"key": "__key__"}, batch_size=B, device="cpu")
    with pytest.raises(ConfigError, match="interleave"):
        open_mix(data, {"big": 1, "mid": 1}, interleave=True)
    with pytest.raises(ConfigError, match="policy"):
        open_mix(data, {"big": 1, "mid": 1}, policy="exact")
    with pytest.raises(ConfigError, match="per_batch"):
        open_mix(data, {"big": 1, "mid": 1}, per_batch="rank")

