"""``dalistream write`` stopped by Ctrl-C, SIGTERM or SIGKILL mid-write: within 5 s no process of it is
left and no shared memory it mapped; the output is refused by a read; the next write into it
replaces it without being asked to, and a local folder of shards to upload (an ``s3://``
output) is removed by the next run."""

import os
import signal
import subprocess
import sys
import tempfile

import pytest

import dalistream
from dalistream.errors import SourceError
from dalistream.sources.unfinished import MANIFEST, MARKER
from dalistream.writer import write

from helpers import REPO, end_group, process_group, shm_mapped, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """600 tiny PNGs in 3 classes: written two per shard, 300 shards, long enough to be caught mid-write."""
    from PIL import Image

    root = tmp_path_factory.mktemp("many")
    for c in range(3):
        (root / f"c{c}").mkdir()
        for i in range(200):
            Image.new("L", (4, 4), (i + c) % 256).save(root / f"c{c}" / f"{i:03d}.png")
    return str(root)


def _in_flight(output, tmp, remote):
    """True once the write has a shard under way: a ``.part`` in the folder, or a shard in its
    local folder of shards to upload."""
    if not remote:
        return os.path.isdir(output) and any(n.endswith(".part") for n in os.listdir(output))
    return any(n.startswith("dalistream-write-") and os.listdir(os.path.join(tmp, n)) for n in os.listdir(tmp))


def _as_from_a_terminal() -> None:
    """The writer as a shell in a terminal starts it: SIGINT at its default (a test run started in
    the background, or by a CI runner, inherits SIGINT ignored, and Python then never turns it into
    KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["Ctrl-C", "SIGTERM", "SIGKILL"])
def test_killing_the_writer_leaves_nothing_running_and_a_set_reads_refuse(many, tmp_path, sig, where, request):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    options = {}
    if where == "s3":
        import boto3

        endpoint = request.getfixturevalue("moto_endpoint")  # (its test credentials are in os.environ from here)
        bucket = f"kill-{sig}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        output, options = f"s3://{bucket}/set/", {"endpoint_url": endpoint}
        extra = ["--endpoint-url", endpoint]
    else:
        output, extra = str(tmp_path / "out"), []
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "dalistream", "write", many, output, "--samples-per-shard", "2",
                             "--processes", "2", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env, cwd=REPO, preexec_fn=_as_from_a_terminal)
    try:
        assert wait_until(lambda: _in_flight(output, str(tmp), where == "s3") or proc.poll() is not None, 120)
        tree = process_group(proc.pid)
        assert proc.poll() is None and len(tree) >= 3, "the writer and its two processes"  # caught mid-write
        shm = shm_mapped(tree)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C reaches the whole process group
        else:
            os.kill(proc.pid, sig)
        proc.wait(60)
        assert wait_until(lambda: not process_group(proc.pid), 5), f"left running: {process_group(proc.pid)}"
        assert not any(os.path.exists(p) for p in shm)
        stderr = proc.stderr.read()
        if sig == signal.SIGTERM:
            assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in stderr, stderr[-3000:]
        elif sig == signal.SIGINT:
            assert proc.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr, stderr[-3000:]
        else:
            assert proc.returncode == -signal.SIGKILL
    finally:
        end_group(proc)
    with pytest.raises(SourceError, match="did not finish"):
        dalistream.Stream.open(output, fields={"image": "png"}, batch_size=2, workers=1, device="cpu",
                               storage_options=options)
    if where == "local":
        names = os.listdir(output)
        assert MARKER in names and MANIFEST not in names
        # Ctrl-C and SIGTERM let the writer remove the shards it had not placed; SIGKILL leaves them to the next write
        assert any(n.endswith(".part") for n in names) == (sig == signal.SIGKILL)
        assert os.listdir(tmp) == []
    else:
        assert bool(os.listdir(tmp)) == (sig == signal.SIGKILL)  # only SIGKILL leaves the folder to upload from
    # the next run: its write process ended, so the output is replaced without --overwrite, and
    # what the killed one left in the temporary folder is removed
    tempfile.tempdir, saved = str(tmp), tempfile.tempdir
    try:
        done = write(many, output, samples_per_shard=50, storage_options=options)
    finally:
        tempfile.tempdir = saved
    assert os.listdir(tmp) == []
    stream = dalistream.Stream.open(output, fields={"image": "png"}, batch_size=2, workers=1, device="cpu",
                                    storage_options=options)
    assert sum(stream.data.counts) == done["samples"] == 600 and len(stream.data.urls) == 12
