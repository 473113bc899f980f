import json
import os

import pytest

from dalistream.errors import ManifestError
from dalistream.manifest import build_manifest, read_manifest, scan_shard, shard_counts, write_manifest

from helpers import PEER_DATA, key_shards


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
    assert {k: v.samples for k, v in read_manifest(out).items()} == dict(zip(paths, [2, 7]))
    assert shard_counts(paths, manifest=out) == [2, 7]
    with pytest.raises(ManifestError, match="not in the manifest"):
        shard_counts([str(tmp_path / "other.tar")], manifest=out)
