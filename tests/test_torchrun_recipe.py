"""docs/recipes/torchrun_train.py, the multi-node outline: on a node of several GPUs (faked here,
tests/gpu_world.py) each rank puts its model, NCCL and its batches on the GPU of its local rank;
on CPUs it trains for real under torchrun (gloo)."""

import json
import os
import subprocess
import sys

import pytest

from dalistream.tools.synth import SynthSpec, write_dataset

pytestmark = [pytest.mark.dali]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "docs", "recipes", "torchrun_train.py")
WORLD = os.path.join(ROOT, "tests", "gpu_world.py")
LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
            "SLURM_NTASKS_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("recipe"))
    write_dataset(d, SynthSpec(shards=4, samples_per_shard=24, seed=5))
    return d


def clean_env(tmp_path, **launcher) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env.update(PYTHONPATH=ROOT, DALISTREAM_CACHE=str(tmp_path / "cache"), **{k: str(v) for k, v in launcher.items()})
    return env


def in_gpu_world(tmp_path, visible: int, local_rank: int, *args: str) -> dict:
    env = clean_env(tmp_path, RANK=local_rank, WORLD_SIZE=max(2, local_rank + 1), LOCAL_RANK=local_rank,
                    LOCAL_WORLD_SIZE=max(2, local_rank + 1))
    done = subprocess.run([sys.executable, WORLD, str(visible), *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("visible, local_rank, gpu", [
    (8, 3, 3),   # torchrun on a node of 8: local rank k takes GPU k
    (2, 1, 1),
    (8, 0, 0),
    (1, 3, 0),   # one GPU visible per process (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES=3): its GPU 0
])
@pytest.mark.slow
def test_each_rank_puts_model_nccl_and_batches_on_its_local_gpu(tmp_path, shards, visible, local_rank, gpu):
    seen = in_gpu_world(tmp_path, visible, local_rank, RECIPE, "--data", shards, "--batch-size", "4", "--size", "32",
                        "--workers", "1")
    assert seen["pipeline_device_id"] == seen["stream_device_id"] == gpu  # where DALI's outputs, the batches, are
    assert seen["torch_device"] == f"cuda:{gpu}"
    assert seen["set_device"] == [gpu] and seen["current"] == gpu      # .cuda() and new CUDA tensors go there too
    assert seen["moved_to"] == [f"cuda:{gpu}"]                          # the model
    assert seen["ddp_device_ids"] == [[gpu]]
    assert seen["process_group"] == [{"backend": "nccl", "device_id": f"cuda:{gpu}"}]


@pytest.mark.slow
def test_the_fake_world_catches_the_old_outline(tmp_path, shards):
    """README's outline before #39 (NCCL, then ``model.cuda()``): rank 1 of a node of 2 put its model
    on GPU 0 while its batches came out on GPU 1 — what the test above would catch."""
    seen = in_gpu_world(tmp_path, 2, 1, "--old-outline", shards)
    assert seen["pipeline_device_id"] == 1
    assert seen["moved_to"] == ["cuda:0"] and seen["set_device"] == []


@pytest.mark.slow
def test_the_recipe_trains_under_torchrun_on_cpus(tmp_path, shards):
    """Two ranks, gloo: the same script, every rank the same number of steps, on the CPU."""
    report = tmp_path / "report"
    report.mkdir()
    env = clean_env(tmp_path)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           RECIPE, "--data", shards, "--batch-size", "8", "--size", "32", "--workers", "1",
                           "--epochs", "2", "--classes", "10", "--report", str(report)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((report / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"], r["device"], r["model_device"]) for r in ranks] == [
        (0, 2, "cpu", "cpu"), (1, 2, "cpu", "cpu")]
    assert all(r["batch_devices"] == ["cpu"] for r in ranks)
    for epoch in range(2):
        steps = [r["epochs"][epoch]["steps"] for r in ranks]
        assert steps[0] == steps[1] > 0
