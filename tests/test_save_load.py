"""One save/load test, run on every stage that holds state (torchdata.nodes' ``run_test_save_load_state``
is the model): a stage is iterated over two epochs; at every cut (its start, after the first
item, the middle, the epoch boundary, the last item) its state is taken, a *fresh* stage is
made from that state alone, and what it yields must be exactly the rest of the uninterrupted
run, across the epoch boundary. Stages: a worker's source (spans, interleaved columns, a shuffle
buffer, ``exact`` padding, ``fixed`` passes, a mix read interleaved and in spans, an elastic
resume's segment; a bucket plan's, over one data set, a mix and a segment) and the loader itself
(state_dict / load_state_dict, through DALI; over one data set, read interleaved or in spans, over
a mix, and with buckets)."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from dalistream import LengthBuckets, Loader, Stream
from dalistream.config import StreamConfig
from dalistream.worker import WorkerSource
from dalistream.worker.batch import rows

from helpers import data_set, key_shards, length_shards

EPOCHS = 2


def run_save_load(make: Callable[[Optional[Any]], Tuple[Iterator, Callable[[], Any]]], cuts: Optional[List[int]] = None):
    """The shared test. ``make(state)`` returns a fresh stage from ``state`` (``None``: the start)
    as ``(items, state_of)``: an iterator over its items to the end of the run, and a function
    giving the state after the items taken so far (plain data)."""
    items, _ = make(None)
    full = list(items)
    assert full, "the stage yields something"
    n = len(full)
    for cut in sorted(set(cuts if cuts is not None else [0, 1, n // 2, n - 1, n])):
        items, state_of = make(None)
        head = [next(items) for _ in range(cut)]
        state = state_of()
        assert head == full[:cut]
        rest, _ = make(state)
        assert list(rest) == full[cut:], f"restored at item {cut} of {n}: not the rest of the run"


def keys_of(batch) -> List[str]:
    """The real samples' keys of a worker's batch in transfer form (the key's blob first, valid
    last)."""
    keys, valid = batch[0], batch[-1]
    return [bytes(k).decode() for k, v in zip(rows(keys, len(valid)), valid) if int(v)]


def worker_stage(config: StreamConfig, data, worker: int, mix=None, resume: tuple = ()):
    """A worker's source as DALI drives it (``iter`` once per epoch, ``next`` per batch); its
    state: the epoch and step it stands at (and an elastic resume's segments of the first epoch)."""
    def make(state):
        epoch, step = state if state is not None else (0, 0)
        source = WorkerSource(config, data, worker, start_epoch=epoch, start_step=step,
                              resume=resume if epoch == 0 else (), mix=mix)
        where = {"epoch": epoch, "step": step}

        def items():
            for e in range(epoch, EPOCHS):
                where["epoch"], where["step"] = e, step if e == epoch else 0
                for batch in iter(source):
                    where["step"] += 1
                    yield keys_of(batch)
                if e == where["epoch"]:
                    where["epoch"], where["step"] = e + 1, 0

        return items(), lambda: (where["epoch"], where["step"])
    return make


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("saveload")
    paths = key_shards(str(d / "one"), [13, 4, 22, 9, 15, 6])
    key_shards(str(d / "a"), [17, 11, 9], prefix="a")
    key_shards(str(d / "b"), [8, 12], prefix="b")
    return str(d), paths, [13, 4, 22, 9, 15, 6]


CASES = {
    "span": dict(interleave=False, shuffle=0),
    "interleaved": dict(interleave=True),
    "shuffle buffer": dict(interleave=False, shuffle=5),
    "exact padded": dict(policy="exact", shuffle=3),
    "fixed passes": dict(policy="fixed", batches_per_epoch=7, interleave=False, shuffle=4),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("worker", [0, 1])
def test_a_worker_s_source(shards, case, worker):
    d, paths, counts = shards
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=6, workers=2, seed=3,
                          **CASES[case])
    data = data_set(paths, None if case == "fixed passes" else counts)
    run_save_load(worker_stage(config, data, worker))


@pytest.mark.parametrize("interleave", [True, False])
def test_a_worker_s_source_over_a_mix(shards, interleave):
    d, _, _ = shards
    stream = Stream.open({"a": (os.path.join(d, "a"), 0.6), "b": (os.path.join(d, "b"), 0.4)},
                         fields={"key": "__key__"}, batch_size=5, workers=2, device="cpu", seed=2,
                         cache_dir=os.path.join(d, "cache"), **({} if interleave else {"interleave": False}))
    assert stream.config.interleave == interleave
    for worker in range(2):
        run_save_load(worker_stage(stream.config, stream.data, worker, mix=stream.mix))


@pytest.mark.parametrize("interleave", [True, False])
def test_a_worker_s_source_in_an_elastic_resume_s_segment(shards, interleave):
    """The first epoch is the rest of one that ran 2 steps on 2 ranks x 1 worker x batch 4 (its
    segment in the state), as a loader resumed on this layout reads it."""
    d, paths, counts = shards
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=6, workers=2, seed=3,
                          interleave=interleave, shuffle=0 if interleave else 5)
    planned = (8, 1, 1) if interleave else (2, 1, 4)  # what the saved layout's plan split (columns when interleaved)
    run_save_load(worker_stage(config, data_set(paths, counts), 1, resume=(planned + (2,),)))


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory):
    d = tmp_path_factory.mktemp("saveload-buckets")
    length_shards(str(d / "one"), [13, 4, 22, 9, 15, 6], seed=1)
    length_shards(str(d / "two"), [11, 17], seed=2)
    return str(d)


def bucket_stream(d, sources, **kw):
    return Stream.open(sources, fields={"key": "__key__"}, batch_size=5, workers=2, device="cpu", seed=2,
                       cache_dir=os.path.join(d, "cache"), buckets=LengthBuckets("txt", [10, 25, 45]), **kw)


@pytest.mark.parametrize("options", [dict(policy="exact"), dict(policy="even", rank=1, world_size=2)])
@pytest.mark.parametrize("worker", [0, 1])
def test_a_worker_s_source_with_buckets(bucketed, options, worker):
    stream = bucket_stream(bucketed, os.path.join(bucketed, "one"), **options)
    run_save_load(worker_stage(stream.config, stream.data, worker))


def test_a_worker_s_source_with_buckets_over_a_mix(bucketed):
    stream = bucket_stream(bucketed, {"a": (os.path.join(bucketed, "one"), 0.6), "b": (os.path.join(bucketed, "two"), 0.4)},
                           per_batch="source")
    for worker in range(2):
        run_save_load(worker_stage(stream.config, stream.data, worker, mix=stream.mix))


def test_a_worker_s_source_with_buckets_in_an_elastic_resume_s_segment(bucketed):
    """The first epoch is the rest of one that ran 2 steps on 2 ranks x 1 worker x batch 4."""
    stream = bucket_stream(bucketed, os.path.join(bucketed, "one"), policy="exact")
    run_save_load(worker_stage(stream.config, stream.data, 1, resume=((2, 1, 4, 2),)))


@pytest.mark.dali
@pytest.mark.parametrize("options", [dict(), dict(interleave=False, shuffle=5, policy="exact"), dict(mix=True),
                                     dict(buckets=True)])
@pytest.mark.slow
def test_the_loader(shards, options, tmp_path):
    d, paths, _ = shards
    options = dict(options)
    if options.pop("buckets", False):
        stream = bucket_stream(str(tmp_path), length_shards_folder(tmp_path), policy="exact")
    else:
        sources = ({"a": (os.path.join(d, "a"), 0.6), "b": (os.path.join(d, "b"), 0.4)} if options.pop("mix", False)
                   else paths)
        stream = Stream.open(sources, fields={"key": "__key__"}, batch_size=6, workers=2, device="cpu", seed=4,
                             cache_dir=os.path.join(d, "cache"), **options)

    def make(state):
        loader = Loader(stream)
        if state is not None:
            loader.load_state_dict(state)

        def items():
            try:
                while loader.epoch < EPOCHS:
                    for batch in loader:
                        yield list(batch["key"])
            finally:
                loader.close()

        return items(), loader.state_dict

    n = stream.steps(0)
    run_save_load(make, cuts=[0, 1, n, n + 1])


def length_shards_folder(tmp_path) -> str:
    folder = str(tmp_path / "lengths")
    length_shards(folder, [13, 4, 22, 9], seed=3)
    return folder
