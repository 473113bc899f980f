"""The merge inside DALI: conditionals (owner index) and the sum/concatenation merge deliver the
same samples, with byte fields shipped dense or as lists and trimmed in the graph."""

import io
import sys

import numpy as np
import pytest

import dalistream
from dalistream.config import StreamConfig
from dalistream.errors import ConfigError
from dalistream.dali.graph import concat_mergeable
from dalistream.plan.epochplan import epoch_plan

from helpers import write_wds

pytestmark = [pytest.mark.dali]


def npy(value):
    buf = io.BytesIO()
    np.save(buf, value)
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Every field kind; member sizes 0 to 40 kB (dense and list batches both occur); one ``txt`` missing."""
    d = tmp_path_factory.mktemp("kinds")
    rng = np.random.default_rng(1)
    truth = {}
    for s, n in enumerate([9, 5, 12, 7]):
        samples = []
        for i in range(n):
            key = f"s{s}/{i:03d}"
            size = int(rng.choice([0, 50, 300, 40_000]))
            sample = {"__key__": key, "bin": rng.integers(0, 256, size, dtype=np.uint8).tobytes(),
                      "cls": str(s * 100 + i).encode(), "npy": npy(np.full((2, 3), s * 100 + i, np.float32)),
                      "vec": npy(np.arange(i, dtype=np.int16))}
            if (s, i) != (1, 2):
                sample["txt"] = f"text {s} {i}".encode() * (i + 1)
            samples.append(sample)
            truth[key] = sample
        write_wds(str(d / f"s{s}.tar"), samples)
    return str(d), truth


BASE = {"data": "bin", "label": "cls", "vec": {"exts": "vec", "kind": "npy", "dtype": "int16", "ndim": 1},
        "text": "txt", "key": "__key__"}
WITH_2D = dict(BASE, arr={"exts": "npy", "kind": "npy", "dtype": "float32", "ndim": 2})


def delivered(directory, fields, workers, **kw):
    stream = dalistream.Stream.open(directory, fields=fields, batch_size=5, workers=workers, device="cpu",
                                    policy="exact", shuffle=4, seed=3, missing="empty", **kw)
    out = {}
    with dalistream.Loader(stream) as loader:
        for batch in loader:
            for j, key in enumerate(batch["key"]):
                assert key not in out
                out[key] = {"data": bytes(batch["data"][j]), "label": int(batch["label"][j]),
                            "vec": np.asarray(batch["vec"][j]).tolist(), "text": bytes(batch["text"][j]),
                            **({"arr": np.asarray(batch["arr"][j]).tolist()} if "arr" in batch else {})}
    return out


def expected(truth, with_2d):
    out = {}
    for key, s in truth.items():
        s_, i = key[1:].split("/")
        out[key] = {"data": s["bin"], "label": int(s["cls"]), "vec": list(range(int(i))), "text": s.get("txt", b"")}
        if with_2d:
            out[key]["arr"] = np.full((2, 3), int(s["cls"]), np.float32).tolist()
    return out


def test_which_merge():
    assert concat_mergeable(StreamConfig(sources=("x",), fields=BASE, batch_size=4).fields)
    assert not concat_mergeable(StreamConfig(sources=("x",), fields=WITH_2D, batch_size=4).fields)


@pytest.mark.parametrize("fields", [BASE, WITH_2D], ids=["concat", "conditionals"])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("layouts", [True, False], ids=["layouts", "headers"])
def test_every_sample_exactly_once_with_its_bytes(shards, fields, workers, layouts, tmp_path):
    """Shards cut out by their member layouts, or (a manifest without layouts) every header
    parsed; byte fields as blobs, cut into rows in the main process."""
    import dataclasses
    import glob

    from dalistream.manifest import build_manifest, write_manifest

    directory, truth = shards
    kw = {}
    if not layouts:
        infos = build_manifest(sorted(glob.glob(f"{directory}/*.tar")), offsets=True)
        kw["manifest"] = str(tmp_path / "no-members.json")
        write_manifest([dataclasses.replace(i, members=None) for i in infos], kw["manifest"])
    assert delivered(directory, fields, workers, **kw) == expected(truth, fields is WITH_2D)


@pytest.mark.parametrize("fields", [BASE, WITH_2D], ids=["concat", "conditionals"])
def test_a_bucket_plan_s_positions_change_every_step_and_both_merges_follow(shards, fields, tmp_path):
    """Under buckets a worker's samples sit at other positions each step: the owner index (read
    off the workers' ``valid``) follows them, and the bucket's outputs are summed."""
    import shutil

    from dalistream.cli import main

    directory, truth = shards
    copy = str(tmp_path / "copy")
    shutil.copytree(directory, copy)
    assert main(["index", copy, "--keys", "bin", "--json"]) == 0
    edges = [100, 1000]
    stream = dalistream.Stream.open(copy, fields=fields, batch_size=5, workers=3, device="cpu", policy="exact",
                                    missing="empty", buckets=dalistream.LengthBuckets("bin", edges),
                                    cache_dir=str(tmp_path / "cache"))
    out, moved = {}, set()
    with dalistream.Loader(stream) as loader:
        for batch in loader:
            bucket = int(batch["bucket"][0])
            assert batch["bucket"].tolist() == [bucket] * len(batch["key"])
            for j, key in enumerate(batch["key"]):
                assert int(np.searchsorted(edges, len(truth[key]["bin"]))) == bucket
                out[key] = {"data": bytes(batch["data"][j]), "label": int(batch["label"][j]),
                            "vec": np.asarray(batch["vec"][j]).tolist(), "text": bytes(batch["text"][j]),
                            **({"arr": np.asarray(batch["arr"][j]).tolist()} if "arr" in batch else {})}
    for w in range(3):  # the plan moves every worker's samples around the batch
        run = epoch_plan(stream.config, stream.data, None, 0).for_worker(stream.config.rank, w).run
        moved |= {int(o) for o, n in zip(run.offset, np.diff(run.bounds)) if n}
    assert len(moved) > 3
    assert out == expected(truth, fields is WITH_2D)


# -- conditionals only when the graph needs them ---------------------------------------------------

def plain_graph(stream):
    data = dalistream.read(stream)
    return {"key": data["key"], "label": data["label"] + 1}


def graph_with_if(stream):
    data = dalistream.read(stream)
    label = data["label"]
    if label > 100:  # on data: needs DALI's conditionals
        label = label - 100
    return {"key": data["key"], "label": label}


def _helper_with_if(label):
    if label > 100:
        label = label - 100
    return label


def graph_calling_a_helper_with_if(stream):
    data = dalistream.read(stream)
    return {"key": data["key"], "label": _helper_with_if(data["label"])}


def labels_by_key(directory, graph, **kw):
    stream = dalistream.Stream.open(directory, fields={"key": "__key__", "label": "cls"}, batch_size=4, workers=2,
                                    device="cpu", **kw)
    with dalistream.Loader(stream, graph) as loader:
        return {k: int(v) for b in loader for k, v in zip(b["key"], b["label"])}


def test_conditionals_only_for_a_merge_by_conditionals_or_an_if_on_data(shards):
    from dalistream.dali.pipeline import built, needs_conditionals

    directory, truth = shards
    fields = {"key": "__key__", "label": "cls"}
    even = dalistream.Stream.open(directory, fields=fields, batch_size=4, workers=2, device="cpu")
    exact = dalistream.Stream.open(directory, fields=fields, batch_size=4, workers=2, device="cpu", policy="exact")
    two_d = dalistream.Stream.open(directory, fields=WITH_2D, batch_size=4, workers=2)
    assert not needs_conditionals(even) and not needs_conditionals(exact)  # padding: no guard conditional
    assert needs_conditionals(two_d)                                        # the owner's conditionals merge 2-D arrays
    assert needs_conditionals(even, forced=True) and not needs_conditionals(two_d, forced=False)

    def conditionals(graph, stream, forced=None, **kw):
        return built(dalistream.pipeline_def(graph, conditionals=forced)(stream, **kw)).conditionals

    assert not conditionals(plain_graph, even) and not conditionals(plain_graph, exact)
    assert not conditionals(graph_with_python_if, even, flip=True)  # an `if` on a Python value
    assert conditionals(graph_with_if, even) and conditionals(graph_calling_a_helper_with_if, even)
    assert conditionals(plain_graph, even, forced=True)


def graph_with_python_if(stream, flip=False):
    data = dalistream.read(stream)
    label = data["label"]
    if flip and not stream.may_pad:
        label = 1 - label
    return {"key": data["key"], "label": label}


def test_graphs_with_and_without_conditionals_deliver_the_same(shards):
    directory, truth = shards
    plain = labels_by_key(directory, dalistream.pipeline_def(plain_graph), policy="even")
    assert plain and all(v == int(truth[k]["cls"]) + 1 for k, v in plain.items())
    with_if = labels_by_key(directory, dalistream.pipeline_def(graph_with_if), policy="even")
    assert with_if.keys() == plain.keys()
    once = {k: int(truth[k]["cls"]) - (100 if int(truth[k]["cls"]) > 100 else 0) for k in with_if}
    assert with_if == once and any(v != int(truth[k]["cls"]) for k, v in with_if.items())
    helper = labels_by_key(directory, dalistream.pipeline_def(graph_calling_a_helper_with_if))
    assert helper == with_if
    forced = labels_by_key(directory, dalistream.pipeline_def(conditionals=True)(graph_calling_a_helper_with_if))
    assert forced == with_if
    with pytest.raises(ConfigError, match="conditionals=False"):
        labels_by_key(directory, dalistream.pipeline_def(conditionals=False)(graph_calling_a_helper_with_if))


def graph_of_every_field(stream):
    return dict(dalistream.read(stream))


@pytest.mark.parametrize("fields, graph, forced, workers", [
    (WITH_2D, graph_of_every_field, None, 2),   # the owner's conditionals merge the 2-D arrays
    (WITH_2D, graph_of_every_field, None, 3),
    (BASE, graph_of_every_field, True, 2),      # conditionals asked for
    (BASE, graph_calling_a_helper_with_if, None, 2),  # an `if` on data: the graph defined again, converted
], ids=["owner-2", "owner-3", "forced", "if-on-data"])
def test_nothing_per_batch_runs_as_autograph_converted_code(shards, fields, graph, forced, workers):
    """A graph with conditionals has AutoGraph convert what its definition calls, the functions
    that register dalistream's per-batch hooks included: the receipt of every source's batch
    (``received_rows``, ``tensor_list``) and whatever else the main process runs per batch must
    run as the plain functions (converted code runs several times slower)."""
    import threading

    from dalistream.dali import compat
    from dalistream.dali.graph import received_rows
    from dalistream.dali.pipeline import built

    directory, _ = shards
    stream = dalistream.Stream.open(directory, fields=fields, batch_size=5, workers=workers, device="cpu",
                                    policy="exact", missing="empty")
    pipe = dalistream.pipeline_def(graph, conditionals=forced)(stream)
    assert built(pipe).conditionals
    pipe.build()
    codes = set()

    def profile(frame, event, arg):
        if event == "call":
            codes.add(frame.f_code)

    try:
        pipe.run()  # (the first batch: conversions done lazily would show below all the same)
        threading.setprofile(profile)
        sys.setprofile(profile)
        for _ in range(3):
            pipe.run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        compat.shutdown(pipe)
    converted = sorted(f"{c.co_filename}:{c.co_name}" for c in codes
                       if "autograph" in c.co_filename.lower())
    assert not converted, f"AutoGraph-converted code ran per batch: {converted}"
    assert received_rows.__code__ in codes and compat.tensor_list.__code__ in codes  # the originals ran


@pytest.mark.parametrize("fields, workers, forced", [(BASE, 1, None), (BASE, 2, None), (BASE, 3, True),
                                                     (WITH_2D, 2, None)], ids=["w1", "w2", "w3-cond", "owner"])
def test_summed_fields_reach_the_graph_as_their_types(shards, fields, workers, forced):
    """The integer scalars and valid, merged by a sum over the workers (or by the owner's
    conditionals), come out as their own types, with the values of a merge by owner."""
    from nvidia.dali import types

    from dalistream.dali import compat

    directory, truth = shards
    stream = dalistream.Stream.open(directory, fields=fields, batch_size=5, workers=workers, device="cpu",
                                    policy="exact", missing="empty")
    pipe = dalistream.pipeline_def(graph_of_every_field, conditionals=forced)(stream)
    pipe.build()
    names = list(fields) + ["valid"]
    try:
        for _ in range(3):
            out = dict(zip(names, pipe.run()))
            assert out["label"].dtype == types.INT64 and out["valid"].dtype == types.UINT8
            valid = [int(np.asarray(out["valid"][i])) for i in range(5)]
            assert set(valid) <= {0, 1} and any(valid)
            for i in range(5):
                key = bytes(np.asarray(out["key"][i])).decode()
                label = int(np.asarray(out["label"][i]))
                assert (label == int(truth[key]["cls"])) if valid[i] else (label == 0 and key == "")
    finally:
        compat.shutdown(pipe)


def test_the_shards_above_are_read_both_by_layout_and_by_header(shards):
    """Every shard above is regular, the one with a sample lacking its ``txt`` too (samples may
    differ in members): the test above cuts every field kind out by the layouts, or (its plain
    case) parses every header."""
    directory, truth = shards
    stream = dalistream.Stream.open(directory, fields=BASE, batch_size=5, workers=3, device="cpu", missing="empty")
    members = stream.data.offsets.members
    assert all(members.at(i) is not None for i in range(len(stream.urls)))
    kinds = {p for i in range(len(stream.urls)) for p in members.at(i)[1].tolist()}
    assert len(kinds) >= 2  # with and without txt
