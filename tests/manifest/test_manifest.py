import gzip
import json
import os

import pytest

from dalistream.errors import ManifestError
from dalistream.manifest import build_manifest, count_samples, read_manifest, scan_shard, write_manifest

from helpers import PEER_DATA, key_shards


def shard_counts(urls, **kw):
    """Every shard's sample count, as the stream counts them."""
    return count_samples(urls, scan_limit_bytes=None, **kw).rows.samples.tolist()


def test_scan_counts_samples_by_headers(tmp_path):
    paths = key_shards(str(tmp_path), [3, 0 + 5, 11])
    assert [scan_shard(p).samples for p in paths] == [3, 5, 11]
    assert scan_shard(os.path.join(PEER_DATA, "sample.tgz")).samples == 90


def test_cache_is_used_and_invalidated_by_changes(tmp_path):
    (p,) = key_shards(str(tmp_path / "d"), [4])
    cache = str(tmp_path / "cache")
    assert shard_counts([p], cache_dir=cache) == [4]
    cached = os.listdir(os.path.join(cache, "manifests"))
    assert len(cached) == 1
    key_shards(str(tmp_path / "d"), [6])  # rewrite the same file with more samples
    os.utime(p, ns=(1, 10**18))
    assert shard_counts([p], cache_dir=cache) == [6]


def test_manifest_roundtrip_and_lookup(tmp_path):
    paths = key_shards(str(tmp_path / "d"), [2, 7])
    out = str(tmp_path / "m.json")
    write_manifest(build_manifest(paths), out)
    assert json.load(open(out))["format"] == "dalistream-manifest"
    rows = read_manifest(out)
    assert dict(zip(rows.urls, rows.samples.tolist())) == dict(zip(paths, [2, 7]))
    assert shard_counts(paths, manifest=out) == [2, 7]
    with pytest.raises(ManifestError, match="not in the manifest"):
        shard_counts([str(tmp_path / "other.tar")], manifest=out)


def test_offsets_are_recorded_and_roundtrip(tmp_path):
    (p,) = key_shards(str(tmp_path / "d"), [5])
    (info,) = build_manifest([p], offsets=True)
    assert info.offsets[0] == 0 and len(info.offsets) == 5 and list(info.offsets) == sorted(info.offsets)
    out = str(tmp_path / "m.json")
    write_manifest([info], out)
    assert read_manifest(out).infos() == [info]
    write_manifest(build_manifest([p]), out)
    assert "offsets" not in json.load(open(out))["shards"][0]


def test_offsets_must_match_the_count():
    from dalistream.manifest import ShardInfo

    with pytest.raises(ManifestError, match="2 offsets for 3 samples"):
        ShardInfo("u", 3, 10, (0, 512))


def test_stream_takes_offsets_from_the_manifest(tmp_path):
    from dalistream import Stream

    paths = key_shards(str(tmp_path / "d"), [3, 4])
    with_offsets, without = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    write_manifest(build_manifest(paths, offsets=True), with_offsets)
    write_manifest(build_manifest(paths), without)
    kw = dict(fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu")
    stream = Stream.open(paths, manifest=with_offsets, cache_dir=str(tmp_path / "cache"), **kw)
    rows = build_manifest(paths, offsets=True)
    assert stream.counts == (3, 4)
    assert [[stream.data.offsets.at(s, i) for i in range(n)] for s, n in enumerate((3, 4))] == [list(r.offsets) for r in rows]
    assert stream.data.offsets.path and stream.data.offsets.path.startswith(str(tmp_path / "cache"))  # mapped by workers
    assert Stream.open(paths, manifest=without, **kw).data.offsets is None


def _scan_threads(scan, urls, **kw):
    """``scan(urls)``'s rows, and the threads alive at each shard's row that were not before."""
    import threading

    before = set(threading.enumerate())
    seen = []
    rows = scan(urls, progress=lambda row: seen.append(sorted(t.name for t in threading.enumerate() if t not in before)),
                **kw)
    return rows, seen


def test_local_shards_are_scanned_in_turn_the_others_in_threads_in_order(tmp_path):
    """A scan of plain local shards starts no thread (their scan holds the interpreter lock: a
    pool would only add its switches); ``pipe:`` (as remote and gzipped) shards go to a pool,
    which is alive while a mixed list's rows come, in the list's order, the rows each shard
    has alone; ``scan_tolerant`` the same."""
    from dalistream.manifest import scan_tolerant

    paths = key_shards(str(tmp_path / "k"), [3, 5, 2, 4])
    gz = str(tmp_path / "k" / "z.tar.gz")
    with open(paths[1], "rb") as f, gzip.open(gz, "wb") as out:
        out.write(f.read())
    mixed = [paths[0], f"pipe:cat {paths[2]}", gz, paths[3], f"pipe:cat {paths[1]}"]
    for scan in (build_manifest, lambda urls, **kw: scan_tolerant(urls, **kw)[0]):
        rows, seen = _scan_threads(scan, paths, offsets=True)
        assert [r.samples for r in rows] == [3, 5, 2, 4] and seen == [[]] * 4
        rows, seen = _scan_threads(scan, mixed, offsets=True)
        assert [r.url for r in rows] == mixed and [r.samples for r in rows] == [3, 2, 5, 4, 5]
        assert [r.offsets for r in rows] == [scan_shard(u, offsets=True).offsets for u in mixed]
        assert all(any(name.startswith("ThreadPoolExecutor") for name in names) for names in seen)


def test_an_error_in_a_local_shard_is_raised_in_turn_with_remote_ones_pending(tmp_path):
    """A local shard that is not a tar raises the tar reader's error naming it, in its turn,
    while the ``pipe:`` shards after it are scanned in threads; ``scan_tolerant`` counts it as
    the problem it is."""
    from dalistream.errors import DalistreamError
    from dalistream.manifest import scan_tolerant

    paths = key_shards(str(tmp_path / "k"), [3, 5])
    bad = str(tmp_path / "k" / "bad.tar")
    with open(bad, "wb") as f:
        f.write(b"not a tar" * 200)
    urls = [paths[0], bad, f"pipe:cat {paths[1]}"]
    with pytest.raises(DalistreamError, match="bad.tar"):
        build_manifest(urls)
    rows, problems = scan_tolerant(urls)
    assert [r.samples for r in rows] == [3, 0, 5] and len(problems) == 1 and "bad.tar" in str(problems[0])
