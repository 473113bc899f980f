"""A 2-process gloo DDP evaluation with an ``all_reduce`` per batch completes over ``exact``
streams where ``0 < N mod (2·B) < 2`` (one rank's last batch is empty), the loader built before
the process group (the PyTorch Lightning order): every rank yields len() batches, every sample
once."""

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, free_port, key_shards, launcher_free_env, shard_keys

pytestmark = [pytest.mark.dali, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [(1, 16, 33), (1, 16, 1025), (1, 8, 17), (2, 4, 9), (2, 4, 10)]  # (W, B, N) on 2 ranks


def test_ddp_evaluation_with_a_collective_per_batch_completes(tmp_path):
    args, wanted = [], []
    for i, (W, B, N) in enumerate(CASES):
        sizes = [N // 2, N - N // 2]
        folder = str(tmp_path / f"case{i}")
        key_shards(folder, sizes)
        args.append(f"{folder}:{W}:{B}")
        wanted.append((B, N, shard_keys(sizes)))
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    env = launcher_free_env(PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_eval.py"), str(r), str(port), str(out), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    try:
        results = [p.communicate(timeout=400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-4000:]
    ranks = [json.load(open(out / f"rank-{r}.json")) for r in range(2)]
    runs = [wanted[0]] + [w for w in wanted[1:] for _ in range(2)]  # cases after the first: two epochs each
    assert len(ranks[0]) == len(ranks[1]) == len(runs)
    for (B, N, keys), mine, theirs in zip(runs, ranks[0], ranks[1]):
        where = f"B={B} N={N}"
        assert mine["layout"] == [0, 2] and theirs["layout"] == [1, 2], where  # found when the loader started
        assert mine["steps"] == mine["len"] == theirs["steps"] == theirs["len"] == -(-N // (2 * B)), where
        assert mine["total"] == theirs["total"] == N, where
        assert sorted(mine["keys"] + theirs["keys"]) == keys, where
