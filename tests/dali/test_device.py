"""Which GPU a process takes, and that nothing at import or test collection touches CUDA.

The GPU count is faked where the library asks it (``dalistream.dali.device.gpu_count``); no GPU is needed."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import dalistream
from dalistream.dali import device
from dalistream.errors import ConfigError

from helpers import key_shards

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("visible", [1, 2, 8])
@pytest.mark.parametrize("local_ranks", [1, 2, 4, 8])
def test_each_local_rank_takes_its_gpu(monkeypatch, caplog, visible, local_ranks):
    """One visible GPU per process (srun --gpus-per-task=1, Kubernetes): always GPU 0. All of the
    node's GPUs visible (torchrun): local rank k takes GPU k; more ranks than GPUs share them
    round-robin, with a warning."""
    monkeypatch.setattr(device, "gpu_count", lambda: visible)
    chosen = []
    for k in range(local_ranks):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dalistream.dali.device"):
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
    monkeypatch.setattr(device, "gpu_count", lambda: 4)
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
    monkeypatch.setattr(device, "gpu_count", lambda: visible)
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
    monkeypatch.setattr(device, "DRIVER_PATHS", (str(driver),))
    monkeypatch.setattr(device, "_device_count", None)
    before = dict(device.CUDA_QUERIES)
    count = device.gpu_count()
    assert isinstance(count, int) and count >= 0
    assert device.CUDA_QUERIES["child"] == before["child"] + 1
    assert device.gpu_count() == count and device.CUDA_QUERIES["child"] == before["child"] + 1  # cached
    if not IsDriverInitialized():  # (a GPU test earlier in this process may have started CUDA)
        assert device.CUDA_QUERIES["in_process"] == before["in_process"]


def test_without_a_driver_nothing_is_asked(monkeypatch, tmp_path):
    monkeypatch.setattr(device, "DRIVER_PATHS", (str(tmp_path / "absent"),))
    monkeypatch.setattr(device, "_device_count", None)
    before = dict(device.CUDA_QUERIES)
    from nvidia.dali.backend import IsDriverInitialized

    if IsDriverInitialized():
        pytest.skip("CUDA was started in this process by an earlier test")
    assert device.gpu_count() == 0 and device.CUDA_QUERIES == before


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
        from dalistream.dali import device
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", {os.path.join(REPO, "tests")!r}])
        print(json.dumps({{"code": int(code), "backend": len(calls), "queries": device.CUDA_QUERIES,
                           "initialized": bool(backend.IsDriverInitialized())}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, done.stdout[-3000:]
    assert result == {"code": 0, "backend": 0, "queries": {"in_process": 0, "child": 0}, "initialized": False}


@pytest.mark.parametrize("cores, workers, expected", [(2, 2, 2), (2, 0, 2), (16, 4, 12), (12, 0, 12), (256, 8, 16),
                                                       (1, 1, 2), (12, 2, 10)])
def test_dali_threads_are_this_process_cores_less_its_workers(cores, workers, expected):
    assert device.dali_threads(cores, workers) == expected


def cpus(text: str) -> frozenset:
    """CPUs written as in the kernel's lists: ``"0-3,8"``."""
    out = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


@pytest.mark.parametrize("affinity, allowed, quota, processes, expected", [
    ("0-127", "0-127", None, 8, 16),        # torchrun on a node of 128 cores: shared by its 8 ranks
    ("0-11", "0-95", None, 8, 12),          # srun --cpu-bind: 12 cores of this task's own, not 12 / 8
    ("12-23", "0-95", None, 8, 12),
    ("0-95", "0-95", None, 8, 12),          # srun without binding: the 96 shared by 8 tasks
    ("0-63", "0-63", 8.0, 1, 8),            # docker --cpus=8 on a 64-core host
    ("0-63", "0-63", 16.0, 8, 2),           # a Kubernetes limit of 16 for 8 ranks
    ("0-63", "0-63", 0.5, 1, 1),            # less than a core still runs
    ("0-3", "0-63", 64.0, 8, 4),            # bound, and a loose quota
    ("0-7", "0-7", None, 1, 8),
])
def test_cpu_share_counts_a_bound_affinity_once(affinity, allowed, quota, processes, expected):
    """A launcher that binds each task to its own cores (srun's CPU binding) leaves an affinity
    narrower than what the cgroup allows: those cores are the task's alone, not divided again by the
    tasks of the node; a CPU quota is the cgroup's, shared by its processes."""
    assert device.cpu_share(cpus(affinity), cpus(allowed), quota, processes) == expected


def cgroup(tmp_path, membership: str, files: dict) -> tuple:
    """A fake cgroup tree: ``files`` maps paths under the root to their text."""
    root = tmp_path / "cgroup"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text + "\n")
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(membership + "\n")
    return str(root), str(proc)


@pytest.mark.parametrize("membership, files, expected", [
    # cgroup v2: the process's own folder, its parents' limits bind too
    ("0::/kubepods/pod1/ctr", {"kubepods/pod1/ctr/cpu.max": "max 100000", "kubepods/pod1/cpu.max": "250000 100000",
                               "kubepods/cpu.max": "max 100000"}, (None, 2.5)),
    ("0::/kubepods/pod1/ctr", {"kubepods/pod1/ctr/cpu.max": "50000 100000", "kubepods/pod1/cpu.max": "400000 100000",
                               "kubepods/pod1/ctr/cpuset.cpus.effective": "0-3,8-11"}, ("0-3,8-11", 0.5)),
    # inside a container (cgroup namespace): the named path is not there, the root is the container's
    ("0::/", {"cpu.max": "400000 100000"}, (None, 4.0)),
    ("0::/docker/abc", {"cpu.max": "200000 100000", "cpuset.cpus.effective": "2-5"}, ("2-5", 2.0)),
    ("0::/", {"cpu.max": "max 100000"}, (None, None)),
    ("0::/", {}, (None, None)),
    # cgroup v1: the cpu hierarchy's CFS quota, the cpuset hierarchy's CPUs
    ("4:cpu,cpuacct:/slurm/job7\n3:cpuset:/slurm/job7",
     {"cpu,cpuacct/slurm/job7/cpu.cfs_quota_us": "300000", "cpu,cpuacct/slurm/job7/cpu.cfs_period_us": "100000",
      "cpuset/slurm/job7/cpuset.effective_cpus": "0-23"}, ("0-23", 3.0)),
    ("4:cpu,cpuacct:/docker/abc", {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
     (None, None)),
    ("2:cpu:/x\n1:cpuacct:/x", {"cpu/x/cpu.cfs_quota_us": "150000", "cpu/x/cpu.cfs_period_us": "100000"}, (None, 1.5)),
])
def test_cgroup_limits_are_read_from_a_fixture_tree(tmp_path, membership, files, expected):
    root, proc = cgroup(tmp_path, membership, files)
    cpuset, quota = device.cgroup_limits(root, proc)
    assert (cpuset, quota) == ((cpus(expected[0]) if expected[0] else None), expected[1])


def test_unreadable_cgroups_mean_no_limit(tmp_path):
    assert device.cgroup_limits(str(tmp_path / "none"), str(tmp_path / "none")) == (None, None)


CHILD = """
import json, os, sys
from dalistream.dali import device
os.sched_setaffinity(0, {cores})
print(json.dumps(device.process_cores({processes}, {root!r}, {proc!r})))
"""


def cores_in_a_child(cores: set, processes: int, root: str, proc: str) -> int:
    """``process_cores`` in a child process bound to ``cores`` by ``sched_setaffinity``."""
    script = CHILD.format(cores=sorted(cores), processes=processes, root=root, proc=proc)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores to bind a child to one of them")
def test_a_child_bound_by_sched_setaffinity_gets_its_own_cores(tmp_path):
    """A process bound to its own cores (as srun binds each task) keeps them all; the same cores
    shared by the node's processes are divided among them; the cgroup's quota caps either."""
    both = set(sorted(os.sched_getaffinity(0))[:2])
    wide, _ = cgroup(tmp_path / "wide", "0::/job", {"job/cpuset.cpus.effective": "0-63"})
    tight, proc = cgroup(tmp_path / "tight", "0::/job", {"job/cpuset.cpus.effective": ",".join(map(str, sorted(both)))})
    capped, capped_proc = cgroup(tmp_path / "capped", "0::/job", {"job/cpuset.cpus.effective": "0-63",
                                                                  "job/cpu.max": "100000 100000"})
    assert cores_in_a_child(both, 8, wide, proc) == 2        # bound (2 of the 64 allowed): its own, not 2 / 8
    assert cores_in_a_child(both, 2, tight, proc) == 1       # all the allowed cores: shared by 2 processes
    assert cores_in_a_child(both, 1, tight, proc) == 2
    assert cores_in_a_child({min(both)}, 4, wide, proc) == 1
    assert cores_in_a_child(both, 8, capped, capped_proc) == 1  # bound, but the quota is one core


@pytest.mark.parametrize("env, expected", [({}, 1), ({"LOCAL_WORLD_SIZE": "8"}, 8), ({"SLURM_NTASKS_PER_NODE": "4"}, 4),
                                           ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 4), ({"SLURM_NTASKS_PER_NODE": "2,1"}, 2),
                                           ({"LOCAL_WORLD_SIZE": "x"}, 1)])
def test_local_processes_from_the_launcher(env, expected):
    from dalistream.stream import local_processes

    assert local_processes(env) == expected


# -- a driver that is there, a count that fails -------------------------------------------------

def failing_probe(monkeypatch, tmp_path, code: str, timeout_s: float = 60.0) -> None:
    """As if an NVIDIA driver were installed, with ``code`` as the child that counts the GPUs."""
    driver = tmp_path / "nvidiactl"
    driver.write_text("")
    monkeypatch.setattr(device, "DRIVER_PATHS", (str(driver),))
    monkeypatch.setattr(device, "COUNT_COMMAND", (sys.executable, "-c", code))
    monkeypatch.setattr(device, "COUNT_TIMEOUT_S", timeout_s)
    monkeypatch.setattr(device, "_device_count", None)
    monkeypatch.setattr(device, "_count_problem", None)


@pytest.mark.parametrize("code, said", [
    ("import sys; sys.stderr.write('cuInit: CUDA_ERROR_NO_DEVICE (fake)\\n'); sys.exit(3)",
     ["exit status 3", "CUDA_ERROR_NO_DEVICE (fake)"]),
    ("import sys; sys.stderr.write('libcuda.so.1: cannot open shared object file (fake)\\n'); raise SystemExit(1)",
     ["exit status 1", "libcuda.so.1: cannot open shared object file"]),
    ("print('Warning: driver mismatch (fake)')", ["printed 'Warning: driver mismatch (fake)'",
                                                   "nothing on stderr"]),
])
def test_auto_warns_with_the_child_stderr_when_a_driver_is_there_but_the_count_fails(monkeypatch, tmp_path, caplog,
                                                                                     code, said):
    failing_probe(monkeypatch, tmp_path, code)
    with caplog.at_level(logging.WARNING, logger="dalistream.dali.device"):
        assert device.resolve_device("auto") == ("cpu", None)
    text = caplog.text
    assert "device='auto' decodes on the CPU" in text and "nvidiactl" in text
    for words in said:
        assert words in text
    with pytest.raises(ConfigError) as raised:
        device.resolve_device("gpu")
    assert all(words in str(raised.value) for words in said)


def test_a_count_that_hangs_is_a_warning_after_the_time_out(monkeypatch, tmp_path, caplog):
    failing_probe(monkeypatch, tmp_path, "import sys, time; sys.stderr.write('waiting for the GPU\\n'); "
                                         "sys.stderr.flush(); time.sleep(60)", timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="dalistream.dali.device"):
        assert device.resolve_device("auto") == ("cpu", None)
    assert "did not answer within 1 s" in caplog.text


def test_a_clean_count_of_zero_and_no_driver_say_nothing(monkeypatch, tmp_path, caplog):
    """CUDA_VISIBLE_DEVICES="" (a count of 0, asked cleanly) and a machine without a driver are
    not problems: the CPU is taken without a warning."""
    failing_probe(monkeypatch, tmp_path, "print(0)")
    with caplog.at_level(logging.WARNING, logger="dalistream.dali.device"):
        assert device.resolve_device("auto") == ("cpu", None)
    monkeypatch.setattr(device, "DRIVER_PATHS", (str(tmp_path / "absent"),))
    monkeypatch.setattr(device, "_device_count", None)
    with caplog.at_level(logging.WARNING, logger="dalistream.dali.device"):
        assert device.resolve_device("auto") == ("cpu", None)
    from nvidia.dali.backend import IsDriverInitialized

    if not IsDriverInitialized():  # (a GPU test earlier in this process may have started CUDA)
        assert caplog.text == ""


def test_a_working_probe_counts(monkeypatch, tmp_path):
    failing_probe(monkeypatch, tmp_path, "print('some banner'); print(2)")
    from nvidia.dali.backend import IsDriverInitialized

    if IsDriverInitialized():
        pytest.skip("CUDA was started in this process by an earlier test: the count is asked here, not in a child")
    assert device.gpu_count() == 2 and device.gpu_count_problem() is None


# -- the torch side: which device, which torch ---------------------------------------------------

def fake_cuda_torch(monkeypatch, current: int = 0) -> dict:
    """torch's CUDA surface, faked on this CPU-only build: a CUDA version, a current device that
    ``set_device`` moves."""
    import torch

    state = {"current": current, "set": []}
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: state.update(current=int(d)) or state["set"].append(int(d)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["current"])
    return state


def gpu_stream(monkeypatch, tmp_path, visible: int, local_rank: int):
    monkeypatch.setattr(device, "gpu_count", lambda: visible)
    paths = key_shards(str(tmp_path / "d"), [4, 4])
    return dalistream.Stream.open(paths, fields={"key": "__key__"}, batch_size=2, workers=1, cache_dir=str(tmp_path / "c"),
                                  env={"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(visible)})


def test_torch_device_of_a_cpu_stream_is_the_cpu_and_touches_no_cuda(tmp_path):
    import torch

    paths = key_shards(str(tmp_path / "d"), [4])
    stream = dalistream.Stream.open(paths, fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                                    cache_dir=str(tmp_path / "c"))
    assert dalistream.torch_device(stream) == torch.device("cpu")


@pytest.mark.parametrize("visible, local_rank, gpu", [(8, 3, 3), (2, 1, 1), (1, 3, 0), (4, 6, 2)])
def test_torch_device_is_the_stream_gpu_and_becomes_the_current_one(monkeypatch, tmp_path, visible, local_rank, gpu):
    import torch

    state = fake_cuda_torch(monkeypatch)
    stream = gpu_stream(monkeypatch, tmp_path, visible, local_rank)
    assert dalistream.torch_device(stream) == torch.device("cuda", gpu)
    assert state["set"] == [gpu] and torch.cuda.current_device() == gpu


def test_a_cpu_only_torch_beside_a_gpu_stream_is_named_at_loader_creation(monkeypatch, tmp_path):
    """This torch has no CUDA; DALI (faked) sees a GPU: the Loader refuses at once, naming the
    torch build, instead of "Torch not compiled with CUDA enabled" at the first batch."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    stream = gpu_stream(monkeypatch, tmp_path, 2, 1)
    assert (stream.device, stream.device_id) == ("gpu", 1)
    for make in (lambda: dalistream.Loader(stream), lambda: dalistream.torch_device(stream)):
        with pytest.raises(ConfigError, match=r"GPU 1, but this torch \(.*\) is built without CUDA") as raised:
            make()
        assert "device='cpu'" in raised.value.hint


def test_the_loader_warns_when_torch_current_device_is_not_the_stream_gpu(monkeypatch, tmp_path, caplog):
    fake_cuda_torch(monkeypatch, current=0)
    stream = gpu_stream(monkeypatch, tmp_path, 2, 1)
    with caplog.at_level(logging.WARNING, logger="dalistream.dali.device"):
        loader = dalistream.Loader(stream)
        try:
            next(iter(loader))
        except dalistream.DalistreamError:  # the GPU pipeline cannot be built without a GPU
            pass
        finally:
            loader.close()
    assert "torch's current CUDA device is 0, but this stream's batches come out on cuda:1" in caplog.text
    assert "dalistream.torch_device(stream)" in caplog.text


def test_no_warning_once_torch_device_set_the_current_device(monkeypatch, tmp_path, caplog):
    fake_cuda_torch(monkeypatch, current=0)
    stream = gpu_stream(monkeypatch, tmp_path, 2, 1)
    dalistream.torch_device(stream)
    with caplog.at_level(logging.WARNING, logger="dalistream.dali.device"):
        loader = dalistream.Loader(stream)
        try:
            next(iter(loader))
        except dalistream.DalistreamError:
            pass
        finally:
            loader.close()
    assert "current CUDA device" not in caplog.text
