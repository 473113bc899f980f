import hashlib
import json
import os

from dalistream.manifest import build_manifest

from helpers import key_shards


def test_counts_cached_under_older_tar_rules_are_scanned_again(tmp_path):
    """A count cached before the reader counted link-only samples (or found lone zero blocks)
    may be wrong: the cache key carries the rules, so such an entry is never used."""
    (path,) = key_shards(str(tmp_path / "data"), [4])
    st = os.stat(path)
    old_ident = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()  # the key before the rules
    old = tmp_path / "cache" / "manifests" / (hashlib.sha256(old_ident).hexdigest()[:32] + ".json")
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"url": path, "samples": 3, "bytes": st.st_size, "offsets": None}))
    (info,) = build_manifest([path], cache_dir=str(tmp_path / "cache"))
    assert info.samples == 4
    assert len(os.listdir(old.parent)) == 2  # the new entry beside the old one
    (again,) = build_manifest([path], cache_dir=str(tmp_path / "cache"))
    assert again == info
