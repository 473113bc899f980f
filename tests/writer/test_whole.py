"""A write is whole or it is not there: interrupted (an exception, Ctrl-C, S3 gone away), the
output holds the writer's marker without its manifest and every read of it is refused, by
folder, glob, brace pattern, file list or S3 prefix; a hand-made set without a manifest is
still read; writing over another set needs ``overwrite``; a write that did not finish, whose
process ended, is replaced by the next one."""

import json
import os
import subprocess
import sys
import tarfile
import tempfile

import pytest

import dalistream
from dalistream.errors import ConfigError, SourceError
from dalistream.lifetime import host_tag, owner_tag
from dalistream.sources import expand_sources
from dalistream.sources.unfinished import MANIFEST, MARKER
from dalistream.writer import write

from helpers import free_port, write_tar

FIELDS = {"image": "jpg;png", "label": "cls"}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("photos")
    for c, name in enumerate(("a", "b", "c")):
        (root / name).mkdir()
        for i in range(8):
            Image.new("RGB", (12 + i, 10), (c * 80, i * 30, 50)).save(root / name / f"{i}.png")
    return str(root)


def _open(source, **options):
    return dalistream.Stream.open(source, fields=FIELDS, batch_size=2, workers=1, device="cpu", **options)


def _keys(folder):
    keys = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(folder, name)) as tar:
                keys.extend(m.name.split(".")[0] for m in tar if m.name.endswith(".cls"))
    return keys


class Interrupt(KeyboardInterrupt):
    pass


def _interrupted(photos, out, after, processes):
    """A write stopped by Ctrl-C once ``after`` items were written."""
    seen = []

    def progress(n):
        seen.append(n)
        if sum(seen) >= after:
            raise Interrupt()

    with pytest.raises(Interrupt):
        write(photos, str(out), samples_per_shard=3, processes=processes, progress=progress)


@pytest.mark.parametrize("after", [1, 12])
@pytest.mark.parametrize("processes", [1, 2])
def test_an_interrupted_write_is_refused_by_every_read(photos, tmp_path, after, processes):
    out = tmp_path / "out"
    _interrupted(photos, out, after, processes)
    names = set(os.listdir(out))
    assert MARKER in names and MANIFEST not in names
    assert not [n for n in names if n.endswith(".part")]  # the shards not placed are removed
    forms = [str(out), str(out) + "/", "file://" + str(out), str(out / "*.tar"), str(out / "train-{00000..00007}.tar")]
    tars = sorted(str(out / n) for n in names if n.endswith(".tar"))
    if tars:
        forms.append(tars)
    for form in forms:
        with pytest.raises(SourceError, match="did not finish") as caught:
            _open(form)
        assert caught.value.reason == "unfinished_write"


def test_a_write_killed_while_renaming_is_refused_and_one_left_whole_is_read(photos, tmp_path):
    """The states a kill can leave between the marker and the manifest: shards under their final
    names and others still temporary; all placed and no manifest yet; then whole."""
    out = tmp_path / "out"
    write(photos, str(out), samples_per_shard=5)
    names = sorted(n for n in os.listdir(out) if n.endswith(".tar"))
    os.rename(out / MANIFEST, tmp_path / "manifest.kept")
    with pytest.raises(SourceError, match=f"holds {MARKER} .* but no {MANIFEST}"):
        _open(str(out))
    os.rename(out / names[-1], out / (names[-1] + ".part"))
    with pytest.raises(SourceError, match="1 shards still under temporary names"):
        _open(str(out))
    os.rename(out / (names[-1] + ".part"), out / names[-1])
    os.rename(tmp_path / "manifest.kept", out / MANIFEST)
    assert sum(_open(str(out)).data.counts) == 24


def test_a_hand_made_set_without_a_manifest_is_read_and_part_files_are_not(tmp_path):
    folder = tmp_path / "hand"
    folder.mkdir()
    for s in range(3):
        write_tar(str(folder / f"h-{s}.tar"), [(f"k{s}{i}.cls", b"1") for i in range(4)])
    assert expand_sources(str(folder)) == [str(folder / f"h-{s}.tar") for s in range(3)]  # no marker: read
    (folder / "h-3.tar.part").write_bytes(b"cut")  # an interrupted copy or download
    with pytest.raises(SourceError, match=r"1 shards under temporary names \(h-3.tar.part\)"):
        expand_sources(str(folder))
    (folder / "h-3.tar.part").unlink()
    (folder / "sub").mkdir()  # in a sub-folder too: every folder listed is checked
    (folder / "sub" / MARKER).write_text("{}")
    with pytest.raises(SourceError, match="did not finish"):
        expand_sources(str(folder))


@pytest.mark.parametrize("old", ["written", "hand-made", "manifest only", "other prefix"])
def test_writing_over_another_set_needs_overwrite(photos, tmp_path, old):
    out = tmp_path / "out"
    if old == "written":
        write(photos, str(out), samples_per_shard=2)  # 12 shards
    elif old == "other prefix":
        write(photos, str(out), samples_per_shard=2, prefix="val")
    else:
        out.mkdir()
        if old == "hand-made":
            write_tar(str(out / "mine-0.tar"), [("x.cls", b"1")])
        with open(out / MANIFEST, "w") as f:
            json.dump({"format": "dalistream-manifest", "version": 1, "shards": []}, f)
    before = sorted(os.listdir(out))
    with pytest.raises(ConfigError, match="already holds a set") as caught:
        write(photos, str(out), samples_per_shard=5)
    assert "--overwrite" in str(caught.value)
    assert sorted(os.listdir(out)) == before  # untouched
    done = write(photos, str(out), samples_per_shard=5, overwrite=True)
    assert sorted(n for n in os.listdir(out) if n.endswith(".tar")) == [f"train-{i:05d}.tar" for i in range(5)]
    stream = _open(str(out))
    assert sum(stream.data.counts) == done["samples"] == 24 and len(stream.data.urls) == 5
    assert sorted(_keys(out)) == sorted(json.load(open(out / MANIFEST))["source"]["keys"])


def _marker(out, pid, host=None):
    out.mkdir(exist_ok=True)
    owner = f"{host or host_tag()}.{pid}"
    (out / MARKER).write_text(json.dumps({"owner": owner, "pid": pid, "host": "somewhere", "started": "then"}))
    write_tar(str(out / "train-00000.tar"), [("x.cls", b"1")])
    (out / "train-00001.tar.part").write_bytes(b"cut")


def _ended_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_write_that_did_not_finish_is_replaced_when_its_process_ended(photos, tmp_path):
    out = tmp_path / "out"
    _marker(out, _ended_pid())
    done = write(photos, str(out), samples_per_shard=6)
    assert sorted(os.listdir(out)) == sorted([MARKER, MANIFEST] + [f"train-{i:05d}.tar" for i in range(4)])
    assert sum(_open(str(out)).data.counts) == done["samples"] == 24


@pytest.mark.parametrize("owner", ["running here", "another host", "unreadable marker"])
def test_a_write_that_may_still_run_is_replaced_only_with_overwrite(photos, tmp_path, owner):
    out = tmp_path / "out"
    _marker(out, os.getppid(), "0" * 8 if owner == "another host" and host_tag() != "0" * 8 else None)
    if owner == "unreadable marker":
        (out / MARKER).write_text("{cut")
    if owner == "another host" and host_tag() == "0" * 8:
        pytest.skip("this host's tag is the one the test uses for another host")
    with pytest.raises(ConfigError, match="did not finish"):
        write(photos, str(out), samples_per_shard=6)
    write(photos, str(out), samples_per_shard=6, overwrite=True)
    assert sum(_open(str(out)).data.counts) == 24


def test_shards_in_a_sub_folder_are_never_written_beside(photos, tmp_path):
    out = tmp_path / "out"
    (out / "old").mkdir(parents=True)
    write_tar(str(out / "old" / "a.tar"), [("x.cls", b"1")])
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="sub-folders"):
            write(photos, str(out), overwrite=overwrite)


@pytest.mark.s3
def test_s3_going_away_mid_write_leaves_a_set_every_read_refuses(photos, tmp_path, aws_env):
    """A moto server stopped after some shards were uploaded: the write fails naming the
    store; with the server back, the prefix (and its shards named one by one) is refused; a
    write with overwrite then replaces it whole."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    first = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    first.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="gone")
    options = {"endpoint_url": endpoint, "max_attempts": 1}
    written = []

    def progress(n):
        written.append(n)
        if len(written) == 3:
            first.stop()  # S3 goes away after the third shard

    with pytest.raises(SourceError):
        write(photos, "s3://gone/set/", samples_per_shard=2, processes=1, storage_options=options, progress=progress)
    staging = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"dalistream-write-{owner_tag()}-")]
    assert staging == []  # its local folder of shards to upload is gone
    port = free_port()
    second = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)  # the same buckets
    second.start()
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{port}"}
        keys = sorted(o["Key"] for o in boto3.client("s3", endpoint_url=options["endpoint_url"])
                      .list_objects_v2(Bucket="gone")["Contents"])
        assert "set/" + MARKER in keys and "set/" + MANIFEST not in keys and len(keys) == 1 + 3
        for form in ("s3://gone/set/", [f"s3://gone/{k}" for k in keys if k.endswith(".tar")]):
            with pytest.raises(SourceError, match="did not finish"):
                _open(form, storage_options=options)
        with pytest.raises(ConfigError, match="did not finish"):  # this process is alive: it may still run
            write(photos, "s3://gone/set/", samples_per_shard=2, storage_options=options)
        done = write(photos, "s3://gone/set/", samples_per_shard=5, storage_options=options, overwrite=True)
        stream = _open("s3://gone/set/", storage_options=options)
        assert sum(stream.data.counts) == done["samples"] == 24 and len(stream.data.urls) == 5
    finally:
        second.stop()


def test_part_files_of_another_tool_are_replaced_only_with_overwrite(photos, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "x-0.tar.part").write_bytes(b"an interrupted copy")
    with pytest.raises(ConfigError, match=r"1 shards under temporary names \(x-0.tar.part"):
        write(photos, str(out))
    write(photos, str(out), samples_per_shard=6, overwrite=True)
    assert "x-0.tar.part" not in os.listdir(out) and sum(_open(str(out)).data.counts) == 24
