"""Manifest rows as columns: the column-at-a-time read gives exactly the rows the row-by-row
check gives, for every kind of row, and a selection in any order carries its offsets along."""

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dalistream.manifest import SampleOffsets, ShardInfo, lookup, read_manifest
from dalistream.manifest.formats import _checked_row, parse_json
from dalistream.manifest.rows import ShardRows

URLS = ["a.tar", "sub/b.tar", "./c.tar", "sub/../d.tar", "/abs/e.tar", "file:///abs/f.tar", "~/g.tar",
        "s3://bkt/h.tar", "with:colon.tar", "x//y.tar"]


def _row(draw_url, samples, size, offsets):
    row = {"url": draw_url, "samples": samples}
    if size is not None:
        row["bytes"] = size
    if offsets is not None:
        row["offsets"] = offsets
    return row


rows_strategy = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 6), st.one_of(st.none(), st.integers(0, 10**6)), st.booleans()),
    min_size=0, max_size=12,
).map(lambda spec: [_row(f"{i}-{URLS[u]}" if "/" not in URLS[u] else URLS[u].replace(".tar", f"-{i}.tar"),
                         n, size, [512 * 3 * k for k in range(n)] if with_offsets else None)
                    for i, (u, n, size, with_offsets) in enumerate(spec)])


def _slow(rows, manifest):
    """The row-by-row reading, as the reference."""
    folder = os.path.dirname(manifest)
    return [_checked_row(r, manifest, i, "url", "samples", "bytes", folder=folder) for i, r in enumerate(rows)]


@settings(max_examples=150, deadline=None)
@given(rows=rows_strategy)
def test_columns_equal_the_row_by_row_reading(rows):
    manifest = "/data/set/dalistream-manifest.json"
    expected = _slow(rows, manifest)
    if len({i.url for i in expected}) != len(expected):
        return  # two spellings of one shard: an error either way (tested below)
    got = parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, manifest)
    assert len(got) == len(expected)
    for g, e in zip(got.infos(), expected):
        assert (g.url, g.samples, g.bytes) == (e.url, e.samples, e.bytes)
        assert g.offsets == e.offsets or (e.samples == 0 and not g.offsets and not e.offsets)


def test_relative_row_urls_resolve_against_the_manifest_folder(tmp_path):
    manifest = str(tmp_path / "m.json")
    rows = [{"url": u, "samples": 1} for u in ["a.tar", "sub/b.tar", "./c.tar", "sub/../d.tar", "x//y.tar"]]
    got = parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, manifest).urls
    folder = str(tmp_path)
    assert got == [f"{folder}/a.tar", f"{folder}/sub/b.tar", f"{folder}/c.tar", f"{folder}/d.tar", f"{folder}/x/y.tar"]
    remote = parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, "s3://bkt/ds/m.json").urls
    assert remote == ["s3://bkt/ds/a.tar", "s3://bkt/ds/sub/b.tar", "s3://bkt/ds/c.tar", "s3://bkt/ds/d.tar",
                      "s3://bkt/ds/x/y.tar"]
    dotted = [{"url": u, "samples": 1} for u in ["a.tar", "..b.tar", "../c.tar", "../../../d.tar"]]
    for manifest, folder in [("s3://bkt/.hidden/m.json", "s3://bkt/.hidden/"), (str(tmp_path / ".hidden" / "m.json"),
                                                                                str(tmp_path / ".hidden") + "/")]:
        got = parse_json({"format": "dalistream-manifest", "version": 1, "shards": dotted}, manifest).urls
        above = folder.rstrip("/").rsplit("/", 1)[0] + "/"
        assert got[:3] == [folder + "a.tar", folder + "..b.tar", above + "c.tar"], got  # names keep their dots
    assert parse_json({"format": "dalistream-manifest", "version": 1, "shards": dotted},
                      "s3://bkt/.hidden/m.json").urls[3] == "s3://bkt/d.tar"  # clamped at the bucket's root


def test_two_spellings_of_one_shard_are_listed_twice(tmp_path):
    rows = [{"url": "a.tar", "samples": 1}, {"url": "./a.tar", "samples": 1}]
    with pytest.raises(Exception, match="listed twice"):
        parse_json({"format": "dalistream-manifest", "version": 1, "shards": rows}, str(tmp_path / "m.json"))


@pytest.mark.parametrize("bad,problem", [
    ({"offsets": [0, 5.0]}, "increasing multiples"),
    ({"offsets": [0, 2**70]}, "increasing multiples"),
    ({"samples": 2**70, "offsets": None}, "non-negative integer"),
    ({"bytes": -2}, "non-negative integer"),
    ({"offsets": [0, 0]}, "increasing multiples"),
    ({"offsets": [0]}, "one offset per sample"),
])
def test_the_bad_row_is_named_whichever_way_it_is_read(tmp_path, bad, problem):
    good = {"url": "a.tar", "samples": 2, "offsets": [0, 1024]}
    row = {k: v for k, v in ({**good, "url": "b.tar"} | bad).items() if v is not None}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": "dalistream-manifest", "version": 1, "shards": [good, row]}))
    with pytest.raises(Exception) as e:
        read_manifest(str(path))
    assert problem in str(e.value) and "manifest row 1" in str(e.value)


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=10), data=st.data(), with_offsets=st.booleans())
def test_take_gathers_rows_and_their_offsets(counts, data, with_offsets):
    infos = [ShardInfo(f"/d/{i}.tar", n, 100 * i, tuple(512 * (7 * i + k) for k in range(n)) if with_offsets or i % 2
                       else None) for i, n in enumerate(counts)]
    rows = ShardRows.from_infos(infos)
    index = data.draw(st.lists(st.integers(0, len(counts) - 1), max_size=12))
    taken = rows.take(np.array(index, dtype=np.int64))
    assert taken.infos() == [rows.info(i) for i in index]
    assert [i.samples for i in taken.infos()] == [counts[i] for i in index]


def test_lookup_matches_listed_urls_in_listed_order(tmp_path):
    infos = [ShardInfo(str(tmp_path / f"{i}.tar"), i + 1, 10, tuple(512 * k for k in range(i + 1))) for i in range(4)]
    rows = ShardRows.from_infos(infos)
    listed = [str(tmp_path / "2.tar"), os.path.relpath(str(tmp_path / "0.tar")), str(tmp_path / "3.tar")]
    assert [i.samples for i in lookup(listed, rows, "m.json").infos()] == [3, 1, 4]
    with pytest.raises(Exception, match="not in the manifest"):
        lookup([str(tmp_path / "other" / "0.tar")], rows, "m.json")


def test_parsed_rows_are_kept_in_the_cache_and_follow_the_manifest(tmp_path):
    from dalistream.manifest.files import read_manifest_cached, write_manifest

    cache = str(tmp_path / "cache")
    manifest = str(tmp_path / "m.json")
    first = [ShardInfo(str(tmp_path / f"{i}.tar"), 2, 100, (0, 1024)) for i in range(3)]
    write_manifest(first, manifest)
    assert read_manifest_cached(manifest, cache).infos() == first
    kept = sorted(os.listdir(os.path.join(cache, "parsed")))
    assert len(kept) == 2 and kept[0].endswith(".npz") and kept[1].endswith(".offsets.npy")
    again = read_manifest_cached(manifest, cache)  # from the cache, offsets mapped from their file
    assert again.infos() == first and isinstance(again.offsets, np.memmap)
    offsets = SampleOffsets.from_flat(again.starts, again.offsets).saved(cache)
    assert offsets.path == os.path.join(cache, "parsed", kept[1])  # workers map that file: no copy
    assert offsets.at(2, 1) == 1024
    second = [ShardInfo(str(tmp_path / f"{i}.tar"), 3, 100, None) for i in range(3)]
    write_manifest(second, manifest)  # rewritten (a new file): a new key, never the old rows
    assert read_manifest_cached(manifest, cache).infos() == second
    for name in os.listdir(os.path.join(cache, "parsed")):  # a damaged cache file: parsed again
        with open(os.path.join(cache, "parsed", name), "wb") as f:
            f.write(b"PK\x03\x04 not a zip")
    assert read_manifest_cached(manifest, cache).infos() == second
    with open(manifest, "w") as f:
        f.write('{"format": "dalistream-manifest", "version": 1, "shards": [{"url": "a.tar"}]}')
    with pytest.raises(Exception, match="manifest row 0"):  # a bad manifest is an error, never cached
        read_manifest_cached(manifest, cache)
    with pytest.raises(Exception, match="manifest row 0"):
        read_manifest_cached(manifest, cache)
