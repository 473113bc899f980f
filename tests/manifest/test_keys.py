"""Per-sample keys in the manifest: ``dalistream index --keys`` records image sizes and member
lengths from real shards; they survive the manifest's write, both readings (by columns and row by
row), the parsed-manifest cache and a selection of rows; older manifests still load."""

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from dalistream.errors import ConfigError, ManifestError, SampleError
from dalistream.manifest import build_manifest, read_manifest, write_manifest
from dalistream.manifest.files import read_manifest_cached
from dalistream.manifest.formats import parse_json
from dalistream.manifest.keys import KeySpec, with_keys
from tests.helpers import write_tar

FORMATS = [("jpg", "JPEG"), ("png", "PNG"), ("webp", "WEBP")]


def image(size, fmt):
    out = io.BytesIO()
    Image.new("RGB", size, "white").save(out, fmt)
    return out.getvalue()


def shards(tmp_path, n_shards=3, per_shard=7):
    """Shards of samples with an image (JPEG, PNG or WebP, varied sizes), a caption of varied
    length (left out of every fifth sample) and a label; returns paths and the expected keys."""
    paths, expected = [], []
    k = 0
    for s in range(n_shards):
        members, want = [], {"width": [], "height": [], "length:txt": []}
        for i in range(per_shard):
            ext, fmt = FORMATS[k % 3]
            size = (16 + 7 * k, 9 + 5 * (k % 4))
            members.append((f"{k:05d}.{ext}", image(size, fmt)))
            caption = ("x" * (3 + k)).encode()
            if k % 5:
                members.append((f"{k:05d}.txt", caption))
            members.append((f"{k:05d}.cls", b"1"))
            want["width"].append(size[0])
            want["height"].append(size[1])
            want["length:txt"].append(len(caption) if k % 5 else -1)
            k += 1
        paths.append(write_tar(str(tmp_path / f"s-{s}.tar"), members))
        expected.append(want)
    return paths, expected


def test_keys_from_real_shards(tmp_path):
    paths, expected = shards(tmp_path)
    infos, problems = with_keys(build_manifest(paths, offsets=True), KeySpec.parse("image,txt"))
    assert problems == []
    for info, want in zip(infos, expected):
        assert {k: list(v) for k, v in info.keys.items()} == want


def test_keys_survive_manifest_write_and_read(tmp_path):
    paths, expected = shards(tmp_path)
    infos, _ = with_keys(build_manifest(paths, offsets=True), KeySpec.parse("image,txt"))
    manifest = str(tmp_path / "m.json")
    write_manifest(infos, manifest)
    row = json.load(open(manifest))["shards"][0]
    assert set(row["keys"]) == {"width", "height", "length:txt"}  # one list per key per shard
    for rows in (read_manifest(manifest), read_manifest_cached(manifest, str(tmp_path / "cache")),
                 read_manifest_cached(manifest, str(tmp_path / "cache"))):  # parsed, then mapped back
        flat = {name: np.concatenate([w[name] for w in expected]) for name in expected[0]}
        assert set(rows.keys) == set(flat)
        for name in flat:
            assert np.array_equal(rows.keys[name], flat[name])
        picked = rows.take(np.array([2, 0]))
        assert np.array_equal(picked.keys["width"], np.concatenate([expected[2]["width"], expected[0]["width"]]))
        assert picked.info(0).keys["height"] == tuple(expected[2]["height"])


def test_row_by_row_reading_gives_the_same_keys(tmp_path):
    rows = [{"url": "a.tar", "samples": 2, "keys": {"width": [3, -1], "length:txt": [5, 6]}},
            {"url": "b.tar", "samples": 1},
            {"url": "c.tar", "samples": 2, "keys": {"width": [7, 8]}}]
    fast = parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, str(tmp_path / "m.json"))
    rows[1]["bytes"] = "x"  # sends the whole manifest through the row-by-row check... which then names it
    with pytest.raises(ManifestError, match="row 1"):
        parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, str(tmp_path / "m.json"))
    del rows[1]["bytes"]
    rows[1]["offsets"] = ["bad"]  # not plainly valid: the slow path reads the rows
    with pytest.raises(ManifestError, match="row 1"):
        parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, str(tmp_path / "m.json"))
    del rows[1]["offsets"]
    assert fast.keys["width"].tolist() == [3, -1, -1, 7, 8]
    assert fast.keys["length:txt"].tolist() == [5, 6, -1, -1, -1]
    assert fast.info(1).keys is None and fast.info(2).keys == {"width": (7, 8)}


@pytest.mark.parametrize("keys,problem", [
    ([1, 2], "object of named lists"),
    ({"width": [1]}, "one value per sample"),
    ({"width": [1, "2"]}, "integers >= -1"),
    ({"width": [1, -2]}, "integers >= -1"),
    ({"width": [1, True]}, "integers >= -1"),
    ({"": [1, 2]}, "object of named lists"),
])
def test_bad_keys_name_the_row(tmp_path, keys, problem):
    rows = [{"url": "a.tar", "samples": 2}, {"url": "b.tar", "samples": 2, "keys": keys}]
    with pytest.raises(ManifestError, match=f"row 1: 'keys': .*{problem}"):
        parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, str(tmp_path / "m.json"))


def test_counts_only_manifest_loads_without_keys(tmp_path):
    paths, _ = shards(tmp_path, 2, 3)
    manifest = str(tmp_path / "m.json")
    write_manifest([type(i)(i.url, i.samples, i.bytes) for i in build_manifest(paths)], manifest)
    rows = read_manifest(manifest)
    assert rows.keys is None and rows.samples.tolist() == [3, 3]
    assert read_manifest_cached(manifest, str(tmp_path / "cache")).keys is None


def test_damaged_image_names_shard_and_member(tmp_path):
    good = image((20, 10), "PNG")
    path = write_tar(str(tmp_path / "bad.tar"), [("a.png", good), ("b.png", good[:18]), ("c.png", good)])
    with pytest.raises(SampleError, match="PNG header: cut short") as info:
        with_keys(build_manifest([path]), KeySpec.parse("image"))
    assert info.value.url == path and info.value.member == "b.png"
    infos, problems = with_keys(build_manifest([path]), KeySpec.parse("image"), tolerant=True)
    assert infos[0].keys == {"width": (20, -1, 20), "height": (10, -1, 10)}
    assert [p.member for p in problems] == ["b.png"]


def test_image_member_chosen_and_unknown_formats(tmp_path):
    jpg, png = image((30, 20), "JPEG"), image((5, 6), "PNG")
    path = write_tar(str(tmp_path / "a.tar"), [("a.seg.png", png), ("a.jpg", jpg), ("b.bmp", b"BM" + b"\0" * 60),
                                                ("c.gif", b"GIF89a")])
    info = build_manifest([path])
    # "seg.png" is not an image extension (a mask beside the image): "image" takes the jpg
    assert with_keys(info, KeySpec.parse("image"))[0][0].keys == {"width": (30, -1, -1), "height": (20, -1, -1)}
    assert with_keys(info, KeySpec.parse("image:seg.png"))[0][0].keys == {"width": (5, -1, -1), "height": (6, -1, -1)}
    assert with_keys(info, KeySpec.parse("gif"))[0][0].keys == {"length:gif": (-1, -1, 6)}
    assert with_keys(info, KeySpec.parse("txt"))[0][0].keys is None  # no sample has one


@pytest.mark.parametrize("text", ["", ",", "image:", ".txt", "a/b"])
def test_bad_key_specs(text):
    with pytest.raises(ConfigError):
        KeySpec.parse(text)


def test_key_spec_columns():
    assert KeySpec.parse("image, txt,tok.npy,txt").columns == ("width", "height", "length:txt", "length:tok.npy")


def test_index_cli_records_keys(tmp_path):
    from dalistream.cli import main

    paths, expected = shards(tmp_path)
    manifest = str(tmp_path / "out.json")
    assert main(["index", *paths, "-o", manifest, "--keys", "image,txt"]) == 0
    rows = read_manifest(manifest)
    assert rows.keys["width"].tolist() == [w for e in expected for w in e["width"]]
    assert rows.offsets is not None and rows.members is not None  # beside the layouts, not instead
    assert main(["index", *paths, "-o", str(tmp_path / "plain.json")]) == 0
    assert read_manifest(str(tmp_path / "plain.json")).keys is None
    assert os.path.exists(manifest)


def test_write_records_image_keys(tmp_path):
    """``dalistream write`` records each sample's image size (a damaged image is left out by the
    writer's own check, so a written set has every size)."""
    from dalistream.writer import write

    sizes = {}
    for c, cls in enumerate(["cat", "dog"]):
        os.makedirs(tmp_path / "in" / cls)
        for i in range(4):
            size = (20 + 10 * i + c, 15 + 3 * i)
            fmt, ext = FORMATS[i % 3][1], FORMATS[i % 3][0]
            (tmp_path / "in" / cls / f"{i}.{ext}").write_bytes(image(size, fmt))
            sizes[(cls, i)] = size
    (tmp_path / "in" / "dog" / "broken.jpg").write_bytes(image((9, 9), "JPEG")[:30])
    done = write(str(tmp_path / "in"), str(tmp_path / "out"), samples_per_shard=3, processes=1, shuffle=False,
                 on_bad="skip")
    rows = read_manifest(done["manifest"])
    got = list(zip(rows.keys["width"].tolist(), rows.keys["height"].tolist()))
    want = [sizes[("cat", i)] for i in range(4)] + [sizes[("dog", i)] for i in range(4)]
    assert got == want  # folder order without shuffling: cat 0-3, dog 0-3 (broken.jpg left out)
    assert [os.path.basename(path) for path, _ in done["bad"]] == ["broken.jpg"]
