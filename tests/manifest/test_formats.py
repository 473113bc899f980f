"""Manifest formats and matching: dalistream JSON, webdataset's wids index, DALI's wds2idx files;
rows matched by full URL; every malformed row a ManifestError naming the manifest and the row."""

import json
import os
import shutil

import pytest

from dalistream import Stream
from dalistream.errors import ManifestError, SourceError
from dalistream.manifest import (DEFAULT_NAME, build_manifest, count_samples, default_location, read_manifest,
                                 write_manifest)

from helpers import key_shards


def dali_index(tar_path, idx_path):
    from wds2idx import IndexCreator  # DALI's own tool, installed with nvidia-dali

    with IndexCreator(tar_path, idx_path, verbose=False) as creator:
        creator.create_index()


def open_keys(paths, **kw):
    return Stream.open(paths, fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu", **kw)


def test_wids_index_with_relative_urls(tmp_path):
    paths = key_shards(str(tmp_path / "data" / "train"), [3, 5])
    index = tmp_path / "data" / "train.json"
    index.write_text(json.dumps({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [
        {"url": f"train/{os.path.basename(p)}", "nsamples": n, "filesize": os.path.getsize(p)}
        for p, n in zip(paths, [3, 5])]}))
    stream = open_keys(paths, manifest=str(index), cache_dir=str(tmp_path / "c"))
    assert stream.counts == (3, 5) and stream.data.offsets is None and "manifest" in stream.data.count_source


@pytest.mark.skipif(shutil.which("tar") is None, reason="wds2idx uses GNU tar when present; tarfile otherwise")
def test_wds2idx_files_give_counts_and_the_same_offsets_as_a_scan(tmp_path):
    paths = key_shards(str(tmp_path / "d"), [4, 1, 6])
    for p in paths:
        dali_index(p, p[:-4] + ".idx")
    scanned = build_manifest(paths, offsets=True)
    found = count_samples(paths)  # beside the shards: found without being named
    assert found.source == "index files (.idx) beside the shards"
    assert [(i.samples, i.offsets) for i in found.infos] == [(i.samples, i.offsets) for i in scanned]
    named = count_samples(paths, manifest=str(tmp_path / "d" / "*.idx"))
    assert [i.samples for i in named.infos] == [4, 1, 6]
    with pytest.raises(ManifestError, match="2 index files for 3 shards"):
        count_samples(paths, manifest=str(tmp_path / "d" / "s-000{0,1}.idx"))


def test_the_manifest_of_another_split_is_an_error_naming_both(tmp_path):
    train = key_shards(str(tmp_path / "train"), [3, 3], prefix="part")
    val = key_shards(str(tmp_path / "val"), [2, 2], prefix="part")  # the same file names
    manifest = str(tmp_path / "train" / "m.json")
    write_manifest(build_manifest(train), manifest)
    assert json.load(open(manifest))["shards"][0]["url"] == "part-0000.tar"  # relative to the manifest
    with pytest.raises(ManifestError) as e:
        open_keys(val, manifest=manifest)
    assert e.value.url == val[0] and manifest in str(e.value) and "another split" in str(e.value)
    assert open_keys(train, manifest=manifest).counts == (3, 3)
    # the folder moved: relative rows still match
    shutil.move(str(tmp_path / "train"), str(tmp_path / "moved"))
    moved = [str(tmp_path / "moved" / os.path.basename(p)) for p in train]
    assert open_keys(moved, manifest=str(tmp_path / "moved" / "m.json")).counts == (3, 3)


def _manifest(tmp_path, rows, **top):
    path = tmp_path / "m.json"
    payload = {"format": "dalistream-manifest", "version": 1, "shards": rows}
    payload.update(top)
    path.write_text(json.dumps(payload))
    return str(path)


GOOD = {"url": "/x/a.tar", "samples": 2, "bytes": 10}


@pytest.mark.parametrize("row,problem", [
    ({"url": "/x/a.tar", "bytes": 10}, "no 'samples'"),
    ({**GOOD, "samples": -1}, "samples must be a non-negative integer, got -1"),
    ({**GOOD, "samples": 2.5}, "got 2.5"),
    ({**GOOD, "samples": "2"}, "got '2'"),
    ({**GOOD, "samples": True}, "got True"),
    ({**GOOD, "bytes": -7}, "bytes must be"),
    ({"samples": 2}, "no 'url'"),
    ({**GOOD, "offsets": [0]}, "one offset per sample"),
    ({**GOOD, "offsets": [1024, 512]}, "increasing"),
    ({**GOOD, "offsets": [0, 100]}, "multiples of 512"),
    ({**GOOD, "offsets": ["0", "512"]}, "increasing multiples"),
    ({**GOOD, "offsets": [[0], [512]]}, "increasing multiples"),
    ({**GOOD, "offsets": [0.0, 512.0]}, "increasing multiples"),
    ({**GOOD, "offsets": [-512, 0]}, "increasing multiples"),
    ("a.tar", "not an object"),
])
def test_a_malformed_row_names_the_manifest_and_the_row(tmp_path, row, problem):
    path = _manifest(tmp_path, [GOOD | {"url": "/x/b.tar"}, row])
    with pytest.raises(ManifestError) as e:
        read_manifest(path)
    assert problem in str(e.value) and "manifest row 1" in str(e.value) and path in str(e.value)


@pytest.mark.parametrize("text,problem", [
    ("{", "not valid JSON"),
    ("[]", "not a JSON object"),
    (json.dumps({"format": "other"}), "neither format"),
    (json.dumps({"format": "dalistream-manifest", "version": 2, "shards": []}), "version 2"),
    (json.dumps({"format": "dalistream-manifest", "version": 1}), "list of shards is missing"),
    (json.dumps({"format": "dalistream-manifest", "version": 1, "shards": [GOOD, GOOD]}), "listed twice"),
    (json.dumps({"__kind__": "wids-shard-index-v1", "shardlist": [{"url": "a.tar"}]}), "no 'nsamples'"),
])
def test_a_malformed_manifest_is_a_manifest_error(tmp_path, text, problem):
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(ManifestError, match=problem) as e:
        read_manifest(str(path))
    assert str(path) in str(e.value)


def test_a_malformed_idx_file_names_it(tmp_path):
    paths = key_shards(str(tmp_path), [2])
    idx = tmp_path / "s-0000.idx"
    for text, problem in [("", "empty index file"), ("v1.2 x\n", "not a wds2idx"), ("v1.2 3\njpg 512 3 a.jpg\n", "lists 1 samples"),
                          ("v1.2 1\njpg x 3 a.jpg\n", "not integers"), ("v1.2 1\njpg 512 3\n", "groups")]:
        idx.write_text(text)
        with pytest.raises(ManifestError, match=problem) as e:
            count_samples(paths, manifest=str(idx))
        assert str(idx) in str(e.value)


def test_index_writes_where_the_loader_looks_and_the_loader_finds_it(tmp_path):
    from dalistream.cli import main

    paths = key_shards(str(tmp_path / "d"), [3, 4])
    assert default_location(paths) == str(tmp_path / "d" / DEFAULT_NAME)
    assert main(["index", str(tmp_path / "d"), "--json"]) == 0
    written = json.load(open(tmp_path / "d" / DEFAULT_NAME))
    assert [r["url"] for r in written["shards"]] == ["s-0000.tar", "s-0001.tar"] and written["shards"][0]["offsets"]
    stream = open_keys(paths, cache_dir=str(tmp_path / "c"))
    assert stream.counts == (3, 4) and stream.data.count_source == f"manifest {tmp_path / 'd' / DEFAULT_NAME}"
    assert not os.path.exists(tmp_path / "c" / "manifests")  # no scan, nothing cached
    # the shards' stored bytes per sample size the workers' shared memory from the start
    assert stream.data.bytes_per_sample == sum(os.path.getsize(p) for p in paths) / 7
    assert open_keys(paths, cache_dir=None, manifest=None).data.bytes_per_sample == stream.data.bytes_per_sample


def test_index_dash_writes_nothing(tmp_path):
    from dalistream.cli import main

    key_shards(str(tmp_path / "d"), [2])
    assert main(["index", str(tmp_path / "d"), "-o", "-", "--json"]) == 0
    assert not os.path.exists(tmp_path / "d" / DEFAULT_NAME)


@pytest.mark.s3
def test_remote_shards_without_a_manifest_are_scanned_only_when_small(moto_endpoint, tmp_path):
    import boto3

    paths = key_shards(str(tmp_path), [4, 6])
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="bkt")
    urls = []
    for p in paths:
        s3.upload_file(p, "bkt", f"ds/{os.path.basename(p)}")
        urls.append(f"s3://bkt/ds/{os.path.basename(p)}")
    options = {"endpoint_url": moto_endpoint}
    with pytest.raises(ManifestError) as e:
        count_samples(urls, options=options, scan_limit_bytes=1000)
    assert "dalistream index SOURCES -o s3://bkt/ds/dalistream-manifest.json" in str(e.value)
    assert [i.samples for i in count_samples(urls, options=options).infos] == [4, 6]  # small: scanned
    write_manifest(build_manifest(urls, options=options), "s3://bkt/ds/" + DEFAULT_NAME, options)
    found = count_samples(urls, options=options, scan_limit_bytes=1000)
    assert found.source == "manifest s3://bkt/ds/dalistream-manifest.json" and [i.samples for i in found.infos] == [4, 6]


@pytest.mark.s3
def test_a_remote_manifest_is_cached_by_its_etag(moto_endpoint, tmp_path):
    """Rows of an S3 manifest are kept by URL, size and ETag: a later start asks one HEAD and
    fetches nothing; a rewritten manifest (a new ETag) is read again."""
    import boto3

    from dalistream.manifest.files import read_manifest_cached

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="etag")
    options = {"endpoint_url": moto_endpoint}
    url, cache = "s3://etag/ds/" + DEFAULT_NAME, str(tmp_path / "cache")
    rows = [{"url": "a.tar", "samples": 2, "offsets": [0, 1024]}, {"url": "b.tar", "samples": 3}]
    s3.put_object(Bucket="etag", Key="ds/" + DEFAULT_NAME,
                  Body=json.dumps({"format": "dalistream-manifest", "version": 1, "shards": rows}).encode())
    first = read_manifest_cached(url, cache, options)
    assert [(i.url, i.samples, i.offsets) for i in first.infos()] == [
        ("s3://etag/ds/a.tar", 2, (0, 1024)), ("s3://etag/ds/b.tar", 3, None)]
    assert any(n.endswith(".npz") for n in os.listdir(os.path.join(cache, "parsed")))
    assert read_manifest_cached(url, cache, options).infos() == first.infos()
    rows[1]["samples"] = 5
    s3.put_object(Bucket="etag", Key="ds/" + DEFAULT_NAME,
                  Body=json.dumps({"format": "dalistream-manifest", "version": 1, "shards": rows}).encode())
    assert [i.samples for i in read_manifest_cached(url, cache, options).infos()] == [2, 5]
    with pytest.raises(SourceError, match="manifest file does not exist"):
        read_manifest_cached("s3://etag/ds/none.json", cache, options)
