"""A loader state proves what it is: a digest of itself (an edited or damaged state is refused),
the content versions of its shards (shards rewritten under the same names, counts and sizes are
refused), and a state file that cannot be read is a StateError naming the file. No pipeline is
built: a Loader builds nothing until iterated."""

import copy
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from dalistream import Loader, Stream, read_state_file, write_state_file
from dalistream.errors import StateError
from dalistream.loader.state import STATE_VERSION, sealed

from helpers import REPO, key_shards

pytestmark = [pytest.mark.dali]  # Loader imports DALI

SIZES = [9, 4, 11, 6]


def open_loader(folder, **kw):
    stream = Stream.open(str(folder), fields={"key": "__key__"}, batch_size=4, workers=2, device="cpu", seed=3,
                         cache_dir=str(folder), **kw)
    return Loader(stream)


def saved_at(folder, step=2, **kw):
    with open_loader(folder, **kw) as loader:
        loader.load_state_dict(sealed({**loader.state_dict(), "loader": {"epoch": 0, "step": step}}))
        return loader.state_dict()


@pytest.fixture
def folder(tmp_path):
    key_shards(str(tmp_path / "data"), SIZES)
    return tmp_path / "data"


def test_a_state_carries_a_digest_and_loads_as_it_was_saved(folder):
    state = saved_at(folder, 3)
    assert state["version"] == STATE_VERSION == 7 and len(state["digest"]) == 64
    assert {"root", "versions"} <= set(state["plan"]["sources"])
    with open_loader(folder) as loader:
        loader.load_state_dict(json.loads(json.dumps(state)))
        assert (loader.epoch, loader.step) == (0, 3)


EDITS = [  # a hand edit (or damage) of a state that is still well formed: the digest says so
    ("the step", lambda s: s["loader"].update(step=1)),
    ("the epoch", lambda s: s["loader"].update(epoch=1)),
    ("the seed", lambda s: s["plan"].update(seed=4)),
    ("a segment added", lambda s: s["segments"].append([1, 1, 2, 1])),
    ("the sample count", lambda s: s["plan"]["sources"].update(samples=31)),
    ("the content versions", lambda s: s["plan"]["sources"].update(versions="0" * 32)),
    ("a key added", lambda s: s.update(note="hello")),
    ("the digest itself", lambda s: s.update(digest="0" * 64)),
    ("the digest removed", lambda s: s.pop("digest")),
]


@pytest.mark.parametrize("what,edit", EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_state_is_refused(folder, what, edit):
    state = saved_at(folder, 3)
    edit(state)
    with open_loader(folder) as loader, pytest.raises(StateError, match="digest") as info:
        loader.load_state_dict(state)
    assert (loader.epoch, loader.step) == (0, 0)  # nothing half-loaded
    assert "Traceback" not in str(info.value)


def rewrite(folder, prefix="t"):
    """Every shard written again: the same names, sample counts and sizes, other samples."""
    for path in folder.glob("*.tar"):
        path.unlink()
    written = key_shards(str(folder), SIZES, prefix=prefix)
    for path in written:  # named as before
        head, name = os.path.split(path)
        os.replace(path, os.path.join(head, "s" + name[len(prefix):]))


def test_shards_rewritten_with_other_samples_are_refused(folder):
    sizes = {p.name: p.stat().st_size for p in folder.glob("*.tar")}
    state = saved_at(folder)
    rewrite(folder)
    assert {p.name: p.stat().st_size for p in folder.glob("*.tar")} == sizes  # only the content differs
    with open_loader(folder) as loader:
        assert loader.state_dict()["plan"]["sources"]["names"] == state["plan"]["sources"]["names"]
        with pytest.raises(StateError, match="rewritten since the state was saved"):
            loader.load_state_dict(state)


@pytest.mark.parametrize("how", ["one shard edited in place", "one shard replaced by rename", "one shard touched"])
def test_one_changed_shard_is_enough(folder, how):
    state = saved_at(folder)
    path = sorted(folder.glob("*.tar"))[2]
    if how == "one shard edited in place":  # same inode, another mtime
        data = bytearray(path.read_bytes())
        data[600] ^= 1  # a byte of the first member's data
        with open(path, "r+b") as f:
            f.write(data)
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    elif how == "one shard replaced by rename":  # same bytes and mtime, another inode (an rsync)
        st = path.stat()
        shutil.copyfile(path, str(path) + ".new")
        os.utime(str(path) + ".new", ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(str(path) + ".new", path)
    else:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    with open_loader(folder) as loader, pytest.raises(StateError, match="rewritten"):
        loader.load_state_dict(state)


def test_the_same_bytes_copied_back_resume_when_asked(folder, caplog):
    state = saved_at(folder)
    for path in folder.glob("*.tar"):  # a restore from a backup: the same bytes, new files
        shutil.copyfile(path, str(path) + ".bak")
        os.replace(str(path) + ".bak", path)
    with open_loader(folder) as loader:
        with pytest.raises(StateError, match="allow_content_change|rewritten"):
            loader.load_state_dict(state)
        with caplog.at_level(logging.WARNING, logger="dalistream"):
            loader.load_state_dict(state, allow_content_change=True)
        assert (loader.epoch, loader.step) == (0, 2)
    assert "resumed as asked" in caplog.text


def test_shards_copied_elsewhere_resume_with_a_warning(folder, tmp_path, caplog):
    state = saved_at(folder)
    shutil.copytree(folder, tmp_path / "copy")
    with caplog.at_level(logging.WARNING, logger="dalistream"), open_loader(tmp_path / "copy") as loader:
        loader.load_state_dict(state)
        assert (loader.epoch, loader.step) == (0, 2)
    assert "another folder or bucket" in caplog.text


def test_an_old_state_loads_with_a_warning_that_it_proves_nothing(folder, caplog):
    state = saved_at(folder)
    old = copy.deepcopy(state)
    old["version"] = 4
    del old["digest"]
    for key in ("root", "versions"):
        del old["plan"]["sources"][key]
    old["loader"]["step"] = 1  # unprovable: an old state may say anything
    with caplog.at_level(logging.WARNING, logger="dalistream"), open_loader(folder) as loader:
        loader.load_state_dict(old)
        assert (loader.epoch, loader.step) == (0, 1)
    assert "version 4" in caplog.text and "cannot prove" in caplog.text


def test_a_version_5_state_loads_without_a_word(folder, caplog):
    """Version 6 adds the node count (affinity="node"); a version 5 state is one without affinity."""
    state = saved_at(folder, 3)
    old = copy.deepcopy(state)
    old["version"] = 5
    del old["plan"]["nodes"]
    old = sealed(old)
    with caplog.at_level(logging.WARNING, logger="dalistream"), open_loader(folder) as loader:
        loader.load_state_dict(old)
        assert (loader.epoch, loader.step, loader.resume) == (0, 3, ())
    assert "older dalistream" not in caplog.text


def test_an_old_exact_state_inside_an_epoch_restarts_it(folder, caplog):
    """Version 5 deals exact's last step otherwise: an old state cannot say what it delivered."""
    state = saved_at(folder, 2, policy="exact")
    state["version"] = 4
    del state["digest"]
    with caplog.at_level(logging.WARNING, logger="dalistream"), open_loader(folder, policy="exact") as loader:
        loader.load_state_dict(state)
        assert (loader.epoch, loader.step) == (0, 0)
    assert "restarts from its first batch" in caplog.text


BAD_FILES = [  # (content or None for missing, words)
    (None, "does not exist"),
    (b"", "empty"),
    (b"{\"version\": 5, \"loader\": {\"epoch\": 0, \"st", "not valid JSON"),
    (b"\x00\x01garbage\xff", "not valid JSON"),
    (b"[1, 2, 3]", "holds a list"),
]


@pytest.mark.parametrize("content,words", BAD_FILES, ids=["missing", "empty", "truncated", "garbage", "a list"])
def test_a_state_file_that_cannot_be_read_names_the_file(tmp_path, content, words):
    path = tmp_path / "state.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(StateError, match=words) as info:
        read_state_file(str(path))
    assert str(path) in str(info.value)


def test_a_truncated_state_file_is_caught_by_its_digest_or_its_json(folder, tmp_path):
    path = str(tmp_path / "state.json")
    write_state_file(path, saved_at(folder))
    whole = open(path, "rb").read()
    for cut in (1, len(whole) // 2, len(whole) - 1):
        with open(path, "wb") as f:
            f.write(whole[:cut])
        with pytest.raises(StateError, match="state.json"):
            read_state_file(path)


def test_a_state_file_is_written_with_a_new_files_permissions(folder, tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "state.json"
        write_state_file(str(path), saved_at(folder))
        assert path.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-m", "dalistream", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow
def test_the_cli_says_which_state_file_and_exits_2(folder, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 5, "loa')
    edited = tmp_path / "edited.json"
    state = saved_at(folder)
    state["loader"]["step"] = 0
    edited.write_text(json.dumps(state))
    for path, words in ((tmp_path / "missing.json", "does not exist"), (bad, "not valid JSON"), (edited, "digest")):
        out = run_cli("keys", str(folder), "-B", "4", "--state-in", str(path), "--stop-after", "1")
        assert out.returncode == 2, out.stderr[-2000:]
        assert str(path) in out.stderr and words in out.stderr and "Traceback" not in out.stderr
        out = run_cli("plan", str(folder), "-B", "4", "--resume-from", str(path))
        assert out.returncode == 2 and str(path) in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


@pytest.mark.s3
def test_remote_objects_rewritten_under_the_same_name_and_size_are_refused(tmp_path, moto_endpoint):
    """The identity of an S3 object's content is its ETag: rewritten with other samples of the same
    size, under the same key, it is refused; left as it was, it resumes."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="proof")
    local, other = tmp_path / "a", tmp_path / "b"
    key_shards(str(local), SIZES)
    key_shards(str(other), SIZES, prefix="t")
    names = sorted(os.listdir(local))
    for name in names:
        s3.upload_file(str(local / name), "proof", f"ds/{name}")
    options = {"endpoint_url": moto_endpoint}

    def remote_loader():
        stream = Stream.open("s3://proof/ds/", fields={"key": "__key__"}, batch_size=4, workers=1, device="cpu",
                             seed=3, storage_options=options, cache_dir=str(tmp_path / "cache"), env={})
        return Loader(stream)

    with remote_loader() as loader:
        state = sealed({**loader.state_dict(), "loader": {"epoch": 0, "step": 2}})
        assert state["plan"]["sources"]["versions"] is not None
    with remote_loader() as loader:
        loader.load_state_dict(state)  # the same objects: resumes
        assert loader.step == 2
    s3.upload_file(str(other / sorted(os.listdir(other))[1]), "proof", f"ds/{names[1]}")  # same size, other samples
    with remote_loader() as loader, pytest.raises(StateError, match="rewritten"):
        loader.load_state_dict(state)
