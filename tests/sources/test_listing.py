import os

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
    p = key_shards(str(tmp_path / "d"), [1])[0]
    with pytest.raises(SourceError, match="listed twice"):
        expand_sources([p, p])
