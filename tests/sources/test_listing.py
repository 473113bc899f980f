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
