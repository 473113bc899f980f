"""Buckets as values (checked, frozen, picklable; nearest aspect ratio on a log scale, lengths by
edges, ``auto`` from the data), and ``dalistream plan --buckets`` on real shards and their keys."""

import io
import json
import math
import pickle

import numpy as np
import pytest
from PIL import Image

import dalistream
from dalistream.buckets import AspectBuckets, LengthBuckets, parse_buckets
from dalistream.errors import ConfigError, ManifestError
from tests.helpers import write_tar

SIZES = [(1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768), (768, 1344)]


def test_nearest_aspect_on_a_log_scale():
    buckets = dalistream.AspectBuckets(SIZES)
    rng = np.random.default_rng(0)
    width, height = rng.integers(100, 4000, 5000), rng.integers(100, 4000, 5000)
    got = buckets.assign({"width": width, "height": height})
    ratios = np.log([w / h for w, h in SIZES])
    for w, h, g in zip(width, height, got):  # the brute-force nearest, ties to the first
        distance = np.abs(np.log(w / h) - ratios)
        assert g == int(np.flatnonzero(distance == distance.min())[0])
    assert got.dtype == np.int16


def test_log_scale_is_symmetric():
    """2:1 and 1:2 are as far from 1:1; a linear distance would send 1:2 to 1:1 and 2:1 away."""
    buckets = AspectBuckets([(1, 1), (2, 1), (1, 2)])
    assert buckets.assign({"width": np.array([141, 100]), "height": np.array([100, 141])}).tolist() == [0, 0]
    assert buckets.assign({"width": np.array([142, 100]), "height": np.array([100, 142])}).tolist() == [1, 2]


def test_single_size():
    assert AspectBuckets([(64, 64)]).assign({"width": np.array([3, 90]), "height": np.array([5, 2])}).tolist() == [0, 0]


def test_lengths_by_edges():
    buckets = LengthBuckets("txt", [32, 64, 128])
    lengths = np.array([0, 1, 32, 33, 64, 65, 128, 129, 10**6])
    assert buckets.assign({"length:txt": lengths}).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert len(buckets) == 4 and buckets.describe(3) == {"length": -1} and buckets.describe(1) == {"length": 64}


def test_auto_from_the_distribution():
    rng = np.random.default_rng(1)
    ratios = np.repeat([4 / 3, 3 / 2, 16 / 9, 1.0, 2 / 3, 3 / 4], [400, 200, 100, 100, 100, 100])
    area = rng.uniform(0.3e6, 3e6, len(ratios))
    keys = {"width": np.round(np.sqrt(area * ratios)).astype(int), "height": np.round(np.sqrt(area / ratios)).astype(int)}
    auto = AspectBuckets.auto(6, area=512 * 512, multiple=32)
    resolved = auto.resolve(keys)
    assert len(resolved) <= 6 and resolved.per == auto.per
    for w, h in resolved.sizes:
        assert w % 32 == 0 and h % 32 == 0 and abs(w * h / (512 * 512) - 1) < 0.2
    got = sorted(round(w / h, 2) for w, h in resolved.sizes)
    for want in (0.67, 0.75, 1.0, 1.33, 1.5):  # the frequent ratios get buckets near them
        assert min(abs(math.log(g / want)) for g in got) < 0.08
    assert np.array_equal(auto.assign(keys), resolved.assign(keys))
    with pytest.raises(ConfigError, match="known once resolved"):
        len(auto)


@pytest.mark.parametrize("make,match", [
    (lambda: AspectBuckets([]), "non-empty list"),
    (lambda: AspectBuckets("1024x1024"), "non-empty list"),
    (lambda: AspectBuckets([(1024, 0)]), "positive integer"),
    (lambda: AspectBuckets([(1024,)]), r"\(width, height\)"),
    (lambda: AspectBuckets([(512, 512), (1024, 1024)]), "aspect ratio of"),
    (lambda: AspectBuckets([(1.5, 2)]), "positive integer"),
    (lambda: AspectBuckets(SIZES, per="node"), "per must be"),
    (lambda: AspectBuckets(), "needs sizes"),
    (lambda: AspectBuckets.auto(0), "positive integer"),
    (lambda: AspectBuckets(SIZES, lookahead=0), "positive integer"),
    (lambda: LengthBuckets("txt", [64, 32]), "must increase"),
    (lambda: LengthBuckets("txt", []), "non-empty list"),
    (lambda: LengthBuckets("", [3]), "member extension"),
    (lambda: LengthBuckets("txt", [True]), "positive integer"),
    (lambda: LengthBuckets(edges=[3]), "a member field .* or a key column, one of them"),
    (lambda: LengthBuckets("txt", [3], key="duration_ms"), "one of them"),
    (lambda: LengthBuckets(key="", edges=[3]), "key must name"),
    (lambda: LengthBuckets(key="duration_ms", edges=[2000, 1000]), "must increase"),
])
def test_validation_raises(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_frozen_and_picklable():
    for value in (AspectBuckets(SIZES, per="global"), AspectBuckets.auto(4), LengthBuckets("txt", [8, 16]),
                  LengthBuckets(key="duration_ms", edges=(2000, 4000))):
        assert pickle.loads(pickle.dumps(value)) == value
        with pytest.raises(Exception):
            value.per = "rank"


def test_missing_keys_ask_for_the_index():
    with pytest.raises(ManifestError, match=r"dalistream index SOURCES --keys image") as info:
        AspectBuckets(SIZES).assign(None)
    assert "counts-only or older manifest" in str(info.value)
    with pytest.raises(ManifestError, match=r"--keys txt"):
        LengthBuckets("txt", [8]).assign({"width": np.zeros(2)})


def test_buckets_over_a_key_column_by_its_edges():
    """``key=`` reads that column (a clip's duration in ms) by the same edges; a sample without
    it (-1) is named with its shard; the column missing asks for the keys that record it."""
    b = LengthBuckets(key="duration_ms", edges=(2000, 4000, 8000))
    assert b.columns == ("duration_ms",) and len(b) == 4
    ms = np.array([1, 2000, 2001, 4000, 7999, 8000, 8001, 60000])
    assert b.assign({"duration_ms": ms, "length:txt": np.zeros(8)}).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [b.describe(i)["length"] for i in range(4)] == [2000, 4000, 8000, -1]
    with pytest.raises(ManifestError, match="sample 0 of its shard has no duration_ms") as info:
        b.assign({"duration_ms": np.array([5, -1])}, ["/d/a.tar", "/d/b.tar"], np.array([0, 1]))
    assert info.value.url == "/d/b.tar"
    with pytest.raises(ManifestError, match=r"--keys video \(or audio\)"):
        b.assign({"length:txt": np.zeros(2)})
    with pytest.raises(ManifestError, match=r"--keys video"):
        LengthBuckets(key="frames", edges=(8,)).assign(None)


def test_unknown_key_names_its_shard():
    keys = {"width": np.array([5, 5, -1]), "height": np.array([5, 5, -1])}
    with pytest.raises(ManifestError, match="sample 0 of its shard has no width/height") as info:
        AspectBuckets(SIZES).assign(keys, ["/d/a.tar", "/d/b.tar"], np.array([0, 2, 3]))
    assert info.value.url == "/d/b.tar"


def test_parse_buckets():
    assert parse_buckets("aspect:1024x1024,1152X896").sizes == ((1024, 1024), (1152, 896))
    assert parse_buckets("auto:5", per="global").n == 5
    assert parse_buckets("length:tok.npy:8,16").field == "tok.npy"
    assert parse_buckets("key:duration_ms:2000,4000") == LengthBuckets(key="duration_ms", edges=(2000, 4000))
    assert parse_buckets("key:frames:8,16", per="global").columns == ("frames",)
    for bad in ("aspect:10x", "box:1", "length:txt:a,b", "aspect:", "key:1,2", "key::1,2", "key:duration_ms:"):
        with pytest.raises(ConfigError):
            parse_buckets(bad)


# -- the command ----------------------------------------------------------------------------------

def image(size):
    out = io.BytesIO()
    Image.new("RGB", size).save(out, "JPEG")
    return out.getvalue()


def keyed_shards(tmp_path):
    sizes = [(40, 30), (30, 40), (32, 32), (48, 27)]
    paths = []
    k = 0
    for s in range(4):
        members = []
        for i in range(24):
            members.append((f"{k:04d}.jpg", image(sizes[(k * 7) % 4])))
            members.append((f"{k:04d}.txt", b"x" * (1 + k % 50)))
            k += 1
        paths.append(write_tar(str(tmp_path / f"s-{s}.tar"), members))
    return paths


def test_plan_buckets_on_real_shards(tmp_path, capsys):
    from dalistream.cli import main

    paths = keyed_shards(tmp_path)
    assert main(["index", *paths]) == 0  # indexed without keys: the plan asks for them
    assert main(["plan", *paths, "--buckets", "aspect:40x30,30x40,32x32", "-B", "4", "-W", "2"]) == 2
    assert "dalistream index SOURCES --keys image" in capsys.readouterr().err
    assert main(["index", *paths, "--keys", "image,txt"]) == 0
    capsys.readouterr()
    assert main(["plan", *paths, "--buckets", "aspect:40x30,30x40,32x32,48x27", "-B", "4", "-W", "2",
                 "--world-size", "2", "--policy", "exact", "--json", "--shuffle-quality"]) == 0
    view = json.loads(capsys.readouterr().out)["buckets"][0]
    assert view["steps"] == 12 and [b["samples"] for b in view["buckets"]] == [24, 24, 24, 24]
    assert view["padding"] == 0 and view["left_out"] == 0 and view["lookahead"]["max"] <= view["lookahead"]["rank_bound"]
    assert [b["size"] for b in view["buckets"]] == ["40x30", "30x40", "32x32", "48x27"]
    assert main(["plan", *paths, "--buckets", "length:txt:10,20,30,40", "-B", "5", "--policy", "even"]) == 0
    text = capsys.readouterr().out
    assert "bucket 0 <= 10: 20 samples" in text and "bucket 4 > 40" in text


def test_plan_bucket_cost(capsys):
    from dalistream.cli import main

    assert main(["plan", "--bucket-cost", "20000", "-B", "64", "--world-size", "2", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["bucket_cost"]
    images, captions = figures["images"], figures["captions"]
    assert images["7 aspect buckets"]["lost"] < images["one square 1024x1024"]["lost"] / 4
    assert captions["length buckets"]["padding"] < captions["unbucketed"]["padding"] / 4


def test_guide_snippets_run():
    """docs/guide/buckets.md: every Python block is marked, and the runnable ones run (here those
    of values and plans; those that read the docs' data folder run in tests/test_readme.py, in it)."""
    import os

    from tests.test_readme import blocks

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "guide", "buckets.md")
    with open(path, encoding="utf-8") as f:
        found = [b for b in blocks(f.read()) if b.lang == "python"]
    assert found and all(b.mark for b in found)
    for block in found:
        if block.mark == "runnable" and '"data"' not in block.code:
            exec(compile(block.code, f"{path}:{block.line}", "exec"), {})


def _aspect_keys(seed=1):
    rng = np.random.default_rng(seed)
    ratios = np.exp(rng.uniform(np.log(1 / 3), np.log(3), 3000))  # portrait 1:3 to panorama 3:1
    area = rng.uniform(0.05e6, 3e6, len(ratios))
    return {"width": np.round(np.sqrt(area * ratios)).astype(int), "height": np.round(np.sqrt(area / ratios)).astype(int)}


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("area,multiple", [(128 * 128, 64), (128 * 128, 32), (128 * 128, 16), (100 * 100, 8),
                                           (224 * 224, 32), (300 * 200, 64), (512 * 512, 32), (1024 * 1024, 64),
                                           (1024 * 1024, 8), (2048 * 1536, 128)])
def test_auto_sizes_keep_the_area_asked_within_the_tolerance(n, area, multiple):
    """Every computed size is of the multiple and holds ``area`` pixels within AREA_TOLERANCE,
    whatever the ratios (auto(4, area=128*128) once made a 192x160 bucket: 1.9 times the area)."""
    from dalistream.buckets import AREA_TOLERANCE

    resolved = AspectBuckets.auto(n, area=area, multiple=multiple).resolve(_aspect_keys(n))
    assert 1 <= len(resolved) <= n
    for w, h in resolved.sizes:
        assert w % multiple == 0 and h % multiple == 0
        assert 1 / AREA_TOLERANCE <= w * h / area <= AREA_TOLERANCE, (w, h, w * h / area)
    if area >= 64 * multiple * multiple:  # room enough: the extreme ratios get sizes near them
        ratios = sorted(w / h for w, h in resolved.sizes)
        if n >= 4:
            assert ratios[0] < 0.6 and ratios[-1] > 1.7, ratios


@pytest.mark.parametrize("area,multiple", [(64 * 64 * 3 // 2, 64), (30 * 30, 64), (10, 8)])
def test_auto_refuses_an_area_its_multiple_cannot_make(area, multiple):
    with pytest.raises(ConfigError, match="within a factor of 1.25"):
        AspectBuckets.auto(4, area=area, multiple=multiple)
