import logging
import os
import shutil

import pytest

from dalistream.errors import SourceError
from dalistream.sources import expand_sources

from helpers import key_shards


def test_paths_dirs_globs_and_braces(tmp_path):
    paths = key_shards(str(tmp_path / "d"), [2, 2, 2, 2])
    d = str(tmp_path / "d")
    assert expand_sources(d) == paths
    assert expand_sources(os.path.join(d, "*.tar")) == paths
    assert expand_sources(os.path.join(d, "s-{0000..0002}.tar")) == paths[:3]
    assert expand_sources([paths[3], paths[0]]) == [paths[3], paths[0]]
    assert expand_sources("file://" + paths[1]) == [paths[1]]


def test_remote_urls_are_kept_and_brace_expanded():
    assert expand_sources("https://h/x-{0..2}.tar") == ["https://h/x-0.tar", "https://h/x-1.tar", "https://h/x-2.tar"]
    assert expand_sources("pipe:cat a{1,2}.tar") == ["pipe:cat a{1,2}.tar"]


def test_errors_name_the_source(tmp_path):
    with pytest.raises(SourceError, match="no such shard file"):
        expand_sources(str(tmp_path / "missing.tar"))
    with pytest.raises(SourceError, match="glob matched no files"):
        expand_sources(str(tmp_path / "*.tar"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="holds no"):
        expand_sources(str(tmp_path / "empty"))
    with pytest.raises(SourceError, match="source list is empty"):
        expand_sources([])


def test_a_shard_reached_twice_is_read_once_with_a_warning(tmp_path, caplog):
    d = tmp_path / "d"
    paths = key_shards(str(d), [2, 3, 4])
    (d / "backup").mkdir()
    shutil.copy(paths[0], d / "backup" / "s-0000.tar")  # same content, another file: not a duplicate
    os.symlink(paths[1], d / "z-link.tar")               # the same file under another name
    (d / "sub").mkdir()
    os.symlink(paths[2], d / "sub" / "a-link.tar")       # ... and in a subdirectory
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        urls = expand_sources(str(d))
    assert len(urls) == 4 and str(d / "backup" / "s-0000.tar") in urls
    assert {os.path.realpath(u) for u in urls} == set(paths) | {str(d / "backup" / "s-0000.tar")}
    assert "2 shards listed more than once" in caplog.text and "z-link.tar" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dalistream"):  # one file through two globs, a dir and a path
        urls = expand_sources([str(d / "s-000[01].tar"), str(d / "*.tar"), paths[2], "file://" + paths[0],
                               str(d / ".." / "d" / "s-0002.tar")])
    assert urls == paths[:2] + [paths[2]]
    assert "listed more than once" in caplog.text


def test_remote_urls_twice_are_read_once():
    assert expand_sources(["https://h/a.tar", "https://h/b.tar", "https://h/a.tar"]) == ["https://h/a.tar",
                                                                                       "https://h/b.tar"]


@pytest.mark.parametrize("scan_from", [1, 10**9])  # the folder's entries read, or a stat per path
def test_a_long_list_gives_the_same_shards_either_way(tmp_path, monkeypatch, scan_from):
    """A brace pattern or list of many paths in one folder is identified from the folder's entries;
    links, hard links, folders, ``file://``, ``..`` and relative paths among them come out as a
    ``stat`` per path gives them."""
    import dalistream.sources.listing as listing

    monkeypatch.setattr(listing, "FOLDER_SCAN_MIN", scan_from)
    d = tmp_path / "d"
    paths = key_shards(str(d), [1] * 6)
    os.symlink(paths[1], d / "link.tar")
    os.link(paths[2], d / "hard.tar")
    (d / "sub.tar").mkdir()  # a folder named like a shard: its shards are listed
    sub = key_shards(str(d / "sub.tar"), [1])
    os.symlink(str(d / "gone.tar"), d / "dangling.tar")
    listed = paths + [str(d / "link.tar"), str(d / "hard.tar"), str(d / "sub.tar"), "file://" + paths[3],
                      str(d / ".." / "d" / "s-0004.tar")]
    monkeypatch.chdir(d)
    listed.append("s-0005.tar")
    assert expand_sources(listed) == paths + sub
    assert expand_sources(str(d / "s-{0000..0005}.tar")) == paths
    with pytest.raises(SourceError, match="no such shard file"):
        expand_sources(paths + [str(d / "missing.tar")])
    assert str(d / "dangling.tar") in expand_sources(str(d))  # listed: opening it names it


def test_a_folder_walk_lists_shards_below_it_sorted_and_skips_linked_folders(tmp_path):
    d = tmp_path / "d"
    top = key_shards(str(d), [1, 1])
    below = key_shards(str(d / "a" / "b"), [1])
    (d / "notes.txt").write_text("not a shard")
    os.symlink(str(d / "a"), d / "linked-folder")
    assert expand_sources(str(d)) == sorted(top + below)


def test_a_few_paths_in_a_large_folder_stop_the_folder_scan_early(tmp_path, monkeypatch):
    """Listed paths the bounded folder scan does not reach are each ``stat``ed: the same shards."""
    import dalistream.sources.listing as listing

    monkeypatch.setattr(listing, "FOLDER_SCAN_MIN", 2)
    d = tmp_path / "d"
    paths = key_shards(str(d), [1, 1, 1])
    for i in range(1100):
        (d / f"other-{i:04d}.txt").write_bytes(b"")
    known = listing._known_files(paths)
    assert set(known) <= set(paths)
    assert expand_sources(list(reversed(paths))) == list(reversed(paths))
