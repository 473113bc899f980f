"""Multi-process training under torchrun (gloo, CPU): equal steps, disjoint ranks, no hang."""

import pytest
import json
import os
import subprocess
import sys

from helpers import key_shards, uneven_sizes

pytestmark = [pytest.mark.dali, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))


def test_torchrun_ddp_two_ranks_two_workers_two_epochs(tmp_path):
    sizes = uneven_sizes(11, seed=7, low=4, high=40)
    key_shards(str(tmp_path / "data"), sizes)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         os.path.join(HERE, "ddp_train.py"), str(tmp_path / "data"), str(out)],
        capture_output=True, text=True, timeout=420, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.load(open(out / f"rank-{r}.json")) for r in range(2)]
    assert [r["layout"] for r in ranks] == [[0, 2], [1, 2]]  # found by itself from the launcher
    all_keys = {f"s{s:03d}/{i:05d}" for s, n in enumerate(sizes) for i in range(n)}
    for epoch in range(2):
        per_rank = [r["epochs"][epoch] for r in ranks]
        assert per_rank[0]["steps"] == per_rank[1]["steps"] == per_rank[0]["len"] > 0
        keys = [set(k for batch in p["keys"] for k in batch) for p in per_rank]
        assert not keys[0] & keys[1], "ranks saw the same sample"
        assert keys[0] | keys[1] <= all_keys
        assert all(len(batch) == 6 for p in per_rank for batch in p["keys"])
    assert ranks[0]["epochs"][0]["keys"] != ranks[0]["epochs"][1]["keys"]
