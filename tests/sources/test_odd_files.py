"""Files that are not what a shard list expects: a FIFO, a device, a socket named as a shard
(an error naming it, never a read that blocks), and files whose names hold glob or brace
characters (named directly, they are themselves)."""

import os
import socket
import threading

import pytest

import dalistream
from dalistream.errors import SourceError
from dalistream.io.local import open_file
from dalistream.sources import expand_sources

from helpers import key_shards


def _within(seconds, fn):
    """Run ``fn`` in a thread; fail (instead of hanging CI) if it has not returned in ``seconds``."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 -- handed back to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def odd(tmp_path):
    fifo = tmp_path / "pipe.tar"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.tar"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    device = tmp_path / "null.tar"
    os.symlink("/dev/null", device)
    yield {"FIFO": str(fifo), "socket": str(sock_path), "device": str(device)}
    server.close()


@pytest.mark.parametrize("kind", ["FIFO", "socket", "device"])
def test_a_non_regular_file_named_as_a_shard_is_an_error_naming_it(tmp_path, odd, kind):
    path = odd[kind]
    for run in (lambda: expand_sources([path]),
                lambda: open_file(path),
                lambda: dalistream.Stream.open(path, fields={"key": "__key__"}, batch_size=1, workers=1,
                                               cache_dir=str(tmp_path / "c"))):
        with pytest.raises(SourceError, match="not a regular file") as e:
            _within(10, run)
        assert e.value.url == path and e.value.reason == "not_regular"


def test_a_fifo_in_a_shard_folder_or_glob_is_passed_over(tmp_path):
    paths = key_shards(str(tmp_path / "d"), [2, 3])
    os.mkfifo(tmp_path / "d" / "zz-pipe.tar")
    assert _within(10, lambda: expand_sources([str(tmp_path / "d")])) == paths
    assert _within(10, lambda: expand_sources([str(tmp_path / "d" / "*.tar")])) == paths


@pytest.mark.parametrize("name", ["a[1].tar", "b*.tar", "c?.tar", "d{0..1}.tar", "e{x,y}.tar"])
def test_a_file_whose_name_holds_glob_or_brace_characters_is_itself(tmp_path, name):
    (real,) = key_shards(str(tmp_path / "src"), [3])
    path = tmp_path / name
    os.rename(real, path)
    decoy = tmp_path / "a1.tar"  # what a[1].tar would match as a glob
    if name.startswith("a"):
        os.symlink(path, decoy)
    assert expand_sources([str(path)]) == [str(path)]
    stream = dalistream.Stream.open(str(path), fields={"key": "__key__"}, batch_size=1, workers=1,
                                    cache_dir=str(tmp_path / "c"))
    assert stream.counts == (3,)


def test_glob_and_brace_patterns_still_expand_when_no_file_has_that_name(tmp_path):
    paths = key_shards(str(tmp_path), [1, 1, 1])
    assert expand_sources([str(tmp_path / "s-*.tar")]) == paths
    assert expand_sources([str(tmp_path / "s-{0000..0002}.tar")]) == paths
