"""Local folders and globs a manifest names are listed from it and one read of the folder's names:
the same shards, in the same order, as the entry-by-entry listing gives, and wherever the two
could differ (a shard the manifest does not name, one it names that is gone, a folder below, a
write that did not finish, hidden names a glob leaves out, relative paths) either the same
answer or the entry-by-entry listing itself."""

import os
import shutil

import pytest

import dalistream
from dalistream.errors import SourceError
from dalistream.manifest import ShardInfo, write_manifest
from dalistream.manifest.files import manifest_reader, manifest_urls
from dalistream.sources import expand_sources
from dalistream.sources.named import FOLDER_SCAN_MIN, named_folder, named_glob, names_in

from helpers import key_shards

SHARDS = FOLDER_SCAN_MIN + 6


def named(folder):
    return manifest_urls(folder, manifest_reader(None))


@pytest.fixture
def folder(tmp_path):
    """SHARDS shards, their manifest (written by dalistream's writer) and a file that is no shard."""
    d = str(tmp_path / "d")
    paths = key_shards(d, [1] * SHARDS)
    write_manifest([ShardInfo(p, 1, os.path.getsize(p)) for p in paths], os.path.join(d, "dalistream-manifest.json"))
    with open(os.path.join(d, "README.txt"), "w") as f:
        f.write("not a shard")
    return d


def both(source):
    """The listing from the manifest and the entry-by-entry one (no manifest consulted)."""
    return expand_sources(source, named=named), expand_sources(source)


def test_a_folder_and_a_glob_the_manifest_names_are_its_rows(folder, monkeypatch):
    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".tar"))
    assert named_folder(folder, named) == paths == expand_sources(folder)
    assert named_folder(folder + "/", named) == paths
    assert named_glob(os.path.join(folder, "s-*.tar"), named) == paths
    assert named_glob(os.path.join(folder, "s-00[0-3]?.tar"), named) == paths[:40]
    for source in (folder, folder + "/", os.path.join(folder, "*.tar"), "file://" + folder):
        fast, walked = both(source)
        assert fast == walked == paths, source
    monkeypatch.chdir(os.path.dirname(folder))  # relative: named as given, as the walk names them
    assert both("d") == (both("d")[1], [os.path.join("d", os.path.basename(p)) for p in paths])
    assert named_folder("d", named) == expand_sources("d")
    assert named_glob("d/s-*.tar", named) == expand_sources("d/s-*.tar")


def test_what_the_manifest_does_not_settle_is_listed_entry_by_entry(folder):
    shard = os.path.join(folder, "s-0000.tar")
    extra = os.path.join(folder, "t-new.tar")
    shutil.copy(shard, extra)  # a shard written after the manifest
    assert named_folder(folder, named) is None and named_glob(os.path.join(folder, "*.tar"), named) is None
    fast, walked = both(folder)
    assert fast == walked and extra in fast
    assert named_glob(os.path.join(folder, "s-*.tar"), named) is not None  # the glob does not match it
    os.remove(extra)

    os.symlink(shard, extra)  # a link to a named shard: the walk reads it once
    assert named_folder(folder, named) is None and both(folder)[0] == both(folder)[1]
    os.remove(extra)

    below = key_shards(os.path.join(folder, "sub"), [1], prefix="u")  # a folder below
    assert named_folder(folder, named) is None
    fast, walked = both(folder)
    assert fast == walked and below[0] in fast
    shutil.rmtree(os.path.join(folder, "sub"))

    os.rename(shard, shard + ".gone")  # a named shard that is not there any more
    assert named_folder(folder, named) is None
    assert both(folder)[0] == both(folder)[1] and shard not in both(folder)[0]
    glob = os.path.join(folder, "s-*.tar")  # a glob matches what is there, as glob.glob does
    assert named_glob(glob, named) == expand_sources(glob) and shard not in named_glob(glob, named)
    os.rename(shard + ".gone", shard)
    assert named_folder(folder, named) is not None


def test_a_glob_leaves_hidden_names_out_as_glob_does(folder):
    hidden = os.path.join(folder, ".s-hidden.tar")
    shutil.copy(os.path.join(folder, "s-0001.tar"), hidden)
    fast, walked = both(os.path.join(folder, "*.tar"))
    assert fast == walked and hidden not in fast
    assert named_glob(os.path.join(folder, "*.tar"), named) == fast


def test_an_unfinished_write_is_refused_either_way(folder):
    open(os.path.join(folder, "s-9999.tar.part"), "wb").close()
    for named_by in (named, None):
        with pytest.raises(SourceError) as info:
            expand_sources(folder, named=named_by)
        assert info.value.reason == "unfinished_write"


def test_rows_outside_the_folder_or_odd_are_not_names():
    assert names_in(["/a/b/x.tar", "/a/b/y.tar"], "/a/b/") == ["x.tar", "y.tar"]
    for rows in (["/a/b/x.tar", "/a/b/c/y.tar"], ["/a/b/x.tar", "/a/bb/y.tar"], ["/a/x.tar"], ["/a/b/"], []):
        assert names_in(rows, "/a/b/") is None, rows


def test_stream_open_counts_a_folder_from_its_manifest(folder, tmp_path):
    stream = dalistream.Stream.open(folder, fields={"k": "__key__"}, batch_size=4, device="cpu", rank=0,
                                    world_size=1, cache_dir=str(tmp_path / "cache"))
    assert list(stream.urls) == expand_sources(folder) and sum(stream.counts) == SHARDS
    assert stream.data.count_source.startswith("manifest")
