"""A training process killed by SIGTERM or SIGKILL takes its DALI workers with it: within 5 s no
process of its process group is left, no shared memory it mapped remains, and its stats folder
is removed by the next run. A loader built from a thread that ends lives on."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from dalistream import Loader, Stream

from helpers import REPO, end_group, key_shards, process_group, shm_mapped, wait_until

pytestmark = [pytest.mark.dali, pytest.mark.slow]

SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    import dalistream

    if __name__ == "__main__":
        stream = dalistream.Stream.open({shards!r}, fields={{"key": "__key__", "label": "cls"}}, batch_size=4,
                                        workers={workers}, device="cpu", policy="fixed", batches_per_epoch=10**6,
                                        start_method={method!r})
        with dalistream.Loader(stream) as loader:
            for i, batch in enumerate(loader):
                if i == 3:
                    print("running", loader._stats_dir, flush=True)
""")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("parent-death"))
    key_shards(d, [40, 40, 40])
    return d


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_training_process_leaves_nothing_behind(shards, tmp_path, sig, method, workers, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(repo=REPO, shards=shards, method=method, workers=workers))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, TMPDIR=str(tmp)))
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["running"], proc.stderr.read()[-3000:]
        stats_dir = line[1]
        tree = process_group(proc.pid)
        workers_pids = tree - {proc.pid}
        assert len([p for p in workers_pids if "resource_tracker" not in open(f"/proc/{p}/cmdline").read()]) == workers
        shm = shm_mapped(tree)
        if method == "spawn":
            assert shm, "expected the named semaphores of DALI's spawned pool"
        assert os.path.isdir(stats_dir) and os.path.dirname(stats_dir) == str(tmp)
        os.kill(proc.pid, sig)
        proc.wait(30)
        assert wait_until(lambda: not process_group(proc.pid), 5), f"left running: {process_group(proc.pid)}"
        assert wait_until(lambda: not any(os.path.exists(p) for p in shm), 5), [p for p in shm if os.path.exists(p)]
    finally:
        end_group(proc)
    # the killed process could not remove its stats folder: the next run does
    assert os.path.isdir(stats_dir)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    stream = Stream.open(shards, fields={"key": "__key__"}, batch_size=4, workers=1, device="cpu")
    with Loader(stream) as loader:
        assert not os.path.exists(stats_dir)
        assert os.listdir(tmp) == [os.path.basename(loader._stats_dir)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_loader_built_from_a_thread_that_ends_keeps_its_workers(shards, method):
    """The kernel's death signal follows the thread that started a worker: asked for from a
    thread that ends, the workers would die with it. The loader starts its workers here from a
    thread that then ends; the main thread iterates a whole epoch."""
    stream = Stream.open(shards, fields={"key": "__key__"}, batch_size=4, workers=2, device="cpu", start_method=method)
    loader = Loader(stream)
    first = []
    ids = []

    def build():
        batches = iter(loader)
        first.append(next(batches))  # workers started from this thread
        first.append(batches)
        ids.append(threading.get_native_id())

    try:
        thread = threading.Thread(target=build)
        thread.start()
        thread.join(300)
        assert wait_until(lambda: not os.path.exists(f"/proc/self/task/{ids[0]}"), 10)  # the OS thread is gone
        keys = list(first[0]["key"])
        for batch in first[1]:
            keys.extend(batch["key"])
        assert len(keys) == len(set(keys)) == 120
    finally:
        loader.close()
