"""Which GPU a process takes, and that nothing at import or test collection touches CUDA.

The CUDA queries are faked in the compat shim (``dalistream.dali.compat.cuda_device_count``),
where the library asks them; no GPU is needed."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import dalistream
from dalistream import device
from dalistream.dali import compat
from dalistream.errors import ConfigError

from helpers import key_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("visible", [1, 2, 8])
@pytest.mark.parametrize("local_ranks", [1, 2, 4, 8])
def test_each_local_rank_takes_its_gpu(monkeypatch, caplog, visible, local_ranks):
    """One visible GPU per process (srun --gpus-per-task=1, Kubernetes): always GPU 0. All of the
    node's GPUs visible (torchrun): local rank k takes GPU k; more ranks than GPUs share them
    round-robin, with a warning."""
    monkeypatch.setattr(compat, "cuda_device_count", lambda: visible)
    chosen = []
    for k in range(local_ranks):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dalistream.device"):
            chosen.append(device.resolve_device("auto", None, k))
        shared = visible > 1 and k >= visible
        assert ("shared with other processes" in caplog.text) == shared
    if visible == 1:
        assert chosen == [("gpu", 0)] * local_ranks
    else:
        assert chosen == [("gpu", k % visible) for k in range(local_ranks)]
        if local_ranks <= visible:
            assert len(set(chosen)) == local_ranks  # one GPU each


def test_no_local_rank_is_gpu_0_and_a_negative_one_is_refused(monkeypatch):
    monkeypatch.setattr(compat, "cuda_device_count", lambda: 4)
    assert device.resolve_device("gpu") == ("gpu", 0)
    with pytest.raises(ConfigError, match="negative"):
        device.resolve_device("gpu", None, -1)


@pytest.mark.parametrize("visible, env, expected", [
    (1, {"LOCAL_RANK": "3"}, 0),            # srun/k8s: this process's only GPU
    (8, {"LOCAL_RANK": "3"}, 3),            # torchrun on a node of 8
    (8, {"SLURM_LOCALID": "5"}, 5),         # srun with every GPU visible
    (2, {"LOCAL_RANK": "3"}, 1),            # 4 processes on 2 GPUs: shared
    (8, {}, 0),
])
def test_stream_open_follows_the_rule(monkeypatch, tmp_path, visible, env, expected):
    monkeypatch.setattr(compat, "cuda_device_count", lambda: visible)
    paths = key_shards(str(tmp_path / "d"), [4, 4])
    stream = dalistream.Stream.open(paths, fields={"key": "__key__"}, batch_size=2, workers=1, env=env,
                                    cache_dir=str(tmp_path / "c"))
    assert (stream.device, stream.device_id) == ("gpu", expected)
    given = dalistream.Stream.open(paths, fields={"key": "__key__"}, batch_size=2, workers=1, env=env,
                                   device_id=visible - 1, cache_dir=str(tmp_path / "c"))
    assert given.device_id == visible - 1  # device_id, when given, wins


def test_the_device_count_is_asked_in_a_child_process(monkeypatch, tmp_path):
    """Asking CUDA for the count initializes it in the asking process; the shim asks in a child,
    so this process's CUDA stays untouched (and its DALI workers may still fork)."""
    from nvidia.dali.backend import IsDriverInitialized

    driver = tmp_path / "version"
    driver.write_text("NVRM version: fake")  # as if a driver were installed: the child is asked
    monkeypatch.setattr(compat, "DRIVER_PATHS", (str(driver),))
    monkeypatch.setattr(compat, "_device_count", None)
    before = dict(compat.CUDA_QUERIES)
    count = compat.cuda_device_count()
    assert isinstance(count, int) and count >= 0
    assert compat.CUDA_QUERIES["child"] == before["child"] + 1
    assert compat.cuda_device_count() == count and compat.CUDA_QUERIES["child"] == before["child"] + 1  # cached
    if not IsDriverInitialized():  # (a GPU test earlier in this process may have started CUDA)
        assert compat.CUDA_QUERIES["in_process"] == before["in_process"]


def test_without_a_driver_nothing_is_asked(monkeypatch, tmp_path):
    monkeypatch.setattr(compat, "DRIVER_PATHS", (str(tmp_path / "absent"),))
    monkeypatch.setattr(compat, "_device_count", None)
    before = dict(compat.CUDA_QUERIES)
    from nvidia.dali.backend import IsDriverInitialized

    if IsDriverInitialized():
        pytest.skip("CUDA was started in this process by an earlier test")
    assert compat.cuda_device_count() == 0 and compat.CUDA_QUERIES == before


@pytest.mark.slow
def test_no_import_or_collection_touches_cuda():
    """Importing the package, its pipelines and tools, and collecting every test asks CUDA
    nothing: on a GPU machine that would initialize CUDA in pytest's process, and DALI would then
    refuse to fork the workers of every later test. The backend's own count is wrapped too."""
    script = textwrap.dedent(f"""
        import json, sys
        import nvidia.dali.backend as backend
        calls = []
        real = backend.GetCUDADeviceCount
        backend.GetCUDADeviceCount = lambda *a: calls.append(1) or real(*a)
        import pytest
        import dalistream, dalistream.ops, dalistream.pipelines
        from dalistream.pipelines import classification_train, classification_eval, image_text
        from dalistream import cli
        from dalistream.dali import compat
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", {os.path.join(REPO, "tests")!r}])
        print(json.dumps({{"code": int(code), "backend": len(calls), "queries": compat.CUDA_QUERIES,
                           "initialized": bool(backend.IsDriverInitialized())}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, done.stdout[-3000:]
    assert result == {"code": 0, "backend": 0, "queries": {"in_process": 0, "child": 0}, "initialized": False}


@pytest.mark.parametrize("cores, processes, workers, expected", [
    (2, 1, 2, 2), (2, 1, 0, 2), (16, 1, 4, 12), (128, 8, 4, 12), (256, 1, 8, 16), (8, 8, 1, 2), (96, 8, 2, 10)])
def test_dali_threads_are_this_process_share_of_the_cores(cores, processes, workers, expected):
    assert device.dali_threads(cores, processes, workers) == expected


@pytest.mark.parametrize("env, expected", [({}, 1), ({"LOCAL_WORLD_SIZE": "8"}, 8), ({"SLURM_NTASKS_PER_NODE": "4"}, 4),
                                           ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 4), ({"SLURM_NTASKS_PER_NODE": "2,1"}, 2),
                                           ({"LOCAL_WORLD_SIZE": "x"}, 1)])
def test_local_processes_from_the_launcher(env, expected):
    from dalistream.stream import local_processes

    assert local_processes(env) == expected
