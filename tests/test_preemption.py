"""The preemption recipe (docs/recipes/preemption.py), run as a scheduler runs it: SIGTERM
mid-epoch (to the process, or to its whole process group as SLURM's scancel does), the state
file written whole, nothing left running, and a second run from that state trains on exactly
the batches, and ends with exactly the weights, of a run never stopped."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, end_group, key_shards, process_group

pytestmark = [pytest.mark.dali, pytest.mark.slow]

RECIPE = os.path.join(REPO, "docs", "recipes", "preemption.py")
STEPS = 30  # per epoch: 120 samples in batches of 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("preempt"))
    key_shards(d, [30, 30, 30, 30])
    return d


def _run(shards, state, log, *extra, timeout=600):
    done = subprocess.run([sys.executable, RECIPE, shards, str(state), "--log", str(log), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _weights(stdout):
    return next(line for line in stdout.splitlines() if line.startswith("weights"))


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    d = tmp_path_factory.mktemp("reference")
    out = _run(shards, d / "state.pt", d / "keys.txt")
    assert not os.path.exists(d / "state.pt")
    return _weights(out), (d / "keys.txt").read_text().splitlines()


@pytest.mark.parametrize("target,after", [("process", 5), ("group", 5), ("process", STEPS + 7), ("process", STEPS)])
def test_sigterm_saves_a_whole_state_and_the_next_run_goes_on_exactly(shards, tmp_path, reference, target, after):
    """``after``: the steps trained before SIGTERM; at ``STEPS`` it comes after an epoch's last batch
    (while that step lasts, or, on a slow machine, during the next epoch's first)."""
    weights, keys = reference
    assert len(keys) == 2 * STEPS
    state, log = tmp_path / "state.pt", tmp_path / "keys.txt"
    seconds = "0.5" if after == STEPS else "0.05"
    proc = subprocess.Popen([sys.executable, RECIPE, shards, str(state), "--log", str(log), "--step-seconds", seconds],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        seen = 0
        for line in proc.stdout:
            seen += line.startswith("epoch ")
            if seen == after:
                break
        assert seen == after, proc.stderr.read()[-3000:]
        (os.killpg if target == "group" else os.kill)(proc.pid, signal.SIGTERM)
        rest = proc.stdout.read()
        assert proc.wait(60) == 0, proc.stderr.read()[-3000:]
        deadline = time.monotonic() + 5
        while process_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_group(proc.pid)  # its DALI workers too
    finally:
        end_group(proc)
    saved_line = next(line for line in rest.splitlines() if line.startswith("SIGTERM: state saved"))
    epoch, step = int(saved_line.split()[5]), int(saved_line.split()[7])
    if after == STEPS:  # the state is the next epoch's start (or the step after it)
        assert (epoch, step) in ((1, 0), (1, 1))
    else:
        assert (epoch, 0 < step < STEPS) == (after // STEPS, True)  # mid-epoch
    import torch

    saved = torch.load(state)  # whole: it loads, with every part
    assert set(saved) == {"model", "optimizer", "loader"}
    assert (saved["loader"]["loader"]["epoch"], saved["loader"]["loader"]["step"]) == (epoch, step)
    assert glob.glob(str(tmp_path / ".state-*")) == []  # no temporary file left beside it
    first = log.read_text().splitlines()
    assert len(first) == epoch * STEPS + step
    out = _run(shards, state, log)
    assert f"resumed at epoch {epoch} step {step}" in out
    assert log.read_text().splitlines() == keys  # the same batches, in the same order, each once
    assert _weights(out) == weights
