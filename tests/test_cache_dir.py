"""The cache directory is not trusted: its owner and permissions are checked, no symbolic link in it
is written through, an entry that does not describe its shard is scanned again, a count a worker
found wrong is dropped so that a restart rescans, and a full disk is a warning and no cache."""

import errno
import glob
import json
import logging
import os

import pytest

import dalistream
from dalistream.errors import ConfigError, ManifestError
from dalistream.manifest import build_manifest
from dalistream.stream import usable_cache_dir

from helpers import key_shards, small_disk


def open_keys(paths, cache, **kw):
    return dalistream.Stream.open(paths, fields={"key": "__key__"}, batch_size=1, workers=1, cache_dir=cache, **kw)


def entries(cache):
    return sorted(glob.glob(os.path.join(cache, "manifests", "*.json")))


def test_a_new_cache_dir_is_private(tmp_path):
    cache = str(tmp_path / "new" / "cache")
    old = os.umask(0)
    try:
        assert usable_cache_dir(cache, given=True) == cache
    finally:
        os.umask(old)
    assert os.stat(cache).st_mode & 0o077 == 0


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o703])
def test_a_cache_dir_writable_by_others_is_refused_or_passed_over(tmp_path, caplog, mode):
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, mode)
    with pytest.raises(ConfigError, match="writable by every user"):
        usable_cache_dir(str(cache), given=True)
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        assert usable_cache_dir(str(cache), given=False) is None
    assert "writable by every user" in caplog.text


def test_a_cache_dir_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o755)
    os.chown(cache, 12345, 12345)
    with pytest.raises(ConfigError, match="owned by another user"):
        usable_cache_dir(str(cache), given=True)


@pytest.mark.parametrize("link", ["manifests", "offsets"])
def test_a_symbolic_link_in_the_cache_is_never_written_through(tmp_path, caplog, link):
    paths = key_shards(str(tmp_path / "d"), [3, 4])
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, cache / link)  # planted: where the writes would go
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        stream = open_keys(paths, str(cache))
    assert stream.counts == (3, 4)
    assert os.listdir(elsewhere) == []
    assert "symbolic link" in caplog.text


def test_an_edited_entry_is_scanned_again_and_rewritten(tmp_path):
    paths = key_shards(str(tmp_path / "d"), [5])
    cache = str(tmp_path / "cache")
    (info,) = build_manifest(paths, cache_dir=cache, offsets=True)
    (entry,) = entries(cache)
    for edit in ({"samples": 50}, {"samples": 4}, {"offsets": [0, 1, 2, 3, 4]}, {"bytes": 1}, {"url": paths[0] + "x"},
                 {"samples": "5"}, {"members": [[[["cls", "bin"], [1, 1]]], [0] * 5, [1, 600] * 5]}):
        with open(entry) as f:
            row = json.load(f)
        row.update(edit)
        with open(entry, "w") as f:
            json.dump(row, f)
        (again,) = build_manifest(paths, cache_dir=cache, offsets=True)
        assert again == info, edit
        with open(entry) as f:
            assert json.load(f)["samples"] == 5  # rewritten by the rescan


def test_a_count_a_worker_finds_wrong_is_dropped_so_a_restart_rescans(tmp_path):
    """A cached count that no longer holds (an entry edited in place, the shard's size and time
    kept): the worker names it and drops the entry, and the next run counts the shard afresh."""
    from dalistream.worker import WorkerSource

    paths = key_shards(str(tmp_path / "d"), [4])
    cache = str(tmp_path / "cache")
    stream = open_keys(paths, cache, policy="exact")
    (entry,) = entries(cache)
    with open(entry) as f:
        row = json.load(f)
    row.update(samples=3, offsets=row["offsets"][:3] if row["offsets"] else None, members=None)
    with open(entry, "w") as f:
        json.dump(row, f)
    stale = open_keys(paths, cache, policy="exact")
    assert stale.counts == (3,)  # believed: it describes the shard well enough to pass the checks
    source = WorkerSource(stale.config, stale.data, 0)
    with pytest.raises(ManifestError, match="restart to rescan"):
        list(source.epoch_batches(0))
    assert entries(cache) == []
    assert open_keys(paths, cache).counts == (4,) == stream.counts


def test_a_failing_cache_write_is_a_warning_and_no_cache(tmp_path, caplog, monkeypatch):
    paths = key_shards(str(tmp_path / "d"), [3])

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the last step of every cache write
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        stream = open_keys(paths, str(tmp_path / "cache"))
    assert stream.counts == (3,) and "No space left on device" in caplog.text


def test_a_full_disk_is_a_warning_and_no_cache(tmp_path, caplog):
    """A real full file system (a 64 kB tmpfs, where this machine lets a test mount one)."""
    with small_disk(tmp_path / "disk", "64k") as disk:
        with open(disk / "filler", "wb") as f:
            try:
                f.write(bytes(1 << 20))
            except OSError:
                pass
        paths = key_shards(str(tmp_path / "d"), [200, 300])
        with caplog.at_level(logging.WARNING, logger="dalistream"):
            stream = open_keys(paths, str(disk / "cache"))
        assert stream.counts == (200, 300) and "No space left on device" in caplog.text
