"""DDP training through an empty batch (issue 61): 2 and 3 gloo processes, each a real
``DistributedDataParallel`` over a real DALI loader, run the training loop the docs show
(docs/recipes/torchrun_train.py's ``train``) through the empty batch of ``exact``'s last step (a
rank no sample is left for) and through a batch whose samples were all skipped (damaged images in
one rank's shard, ``on_error="skip"``): every rank finishes (none waits in an all-reduce: the
processes are bounded by a timeout), the logged losses are finite and no weight is NaN."""

import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from dalistream.tools.synth import encode, make_image

from helpers import REPO, end_group, free_port, launcher_free_env, write_tar

pytestmark = [pytest.mark.dali, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 300


def write_shards(folder, sizes, damaged=()):
    """Image shards of ``sizes`` samples; the images of the samples numbered in ``damaged`` are cut
    in half (no JPEG end marker: a ``bad_image`` skip in the worker)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(3)
    n = 0
    for s, size in enumerate(sizes):
        members = []
        for _ in range(size):
            label = n % 10
            image = encode(make_image(label, rng, (24, 24)), "jpg")
            members += [(f"k{n:05d}.jpg", image[:len(image) // 2] if n in damaged else image),
                        (f"k{n:05d}.cls", str(label).encode())]
            n += 1
        write_tar(os.path.join(folder, f"shard-{s}.tar"), members)
    return folder


CASES = {  # world, policy, shard sizes, damaged samples
    "exact-2-ranks": (2, "exact", [9, 8], ()),          # 17 = 2 steps of 2x4 + 1: rank 1's last step is empty
    "exact-3-ranks": (3, "exact", [9, 9, 8], ()),       # 26 = 2 steps of 3x4 + 2: rank 2's last step is empty
    "skipped-2-ranks": (2, "even", [8, 8], range(8, 12)),          # rank 1's first batch: every image damaged
    "skipped-3-ranks": (3, "even", [8, 8, 8], range(16, 20)),      # rank 2's first batch: every image damaged
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ddp_training_runs_through_an_empty_batch(tmp_path, case):
    world, policy, sizes, damaged = CASES[case]
    data = write_shards(str(tmp_path / "data"), sizes, set(damaged))
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    env = launcher_free_env(PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_empty_train.py"), str(r), str(world), str(port),
                               data, str(out), policy], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=str(tmp_path), start_new_session=True) for r in range(world)]
    try:
        results = []
        for p in procs:
            try:
                results.append(p.communicate(timeout=TIMEOUT_S))
            except subprocess.TimeoutExpired:
                pytest.fail(f"a rank did not finish in {TIMEOUT_S} s: the ranks hang on the empty batch")
    finally:
        for p in procs:
            end_group(p)
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]
    for epoch in ("0", "1"):  # the case is met: some rank took an empty batch in each epoch
        assert sum(r["empty_batches"][epoch] for r in ranks) >= 1, (epoch, ranks)
    if damaged:
        assert sum(r["skipped_samples"] for r in ranks) >= 2 * len(damaged)
    steps = {tuple(e["steps"] for e in r["epochs"]) for r in ranks}
    assert len(steps) == 1  # every rank took the same steps
    for r in ranks:
        assert r["losses_finite"], r          # no NaN reaches the logged loss
        assert r["weights_finite"] and r["buffers_finite"], r
    warned = [err for _, err in results if "empty batch" in err]
    assert warned, "warn_empty=True: the rank that took an empty batch says so"
