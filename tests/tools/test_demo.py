"""``dalistream demo``: it trains, prints the loss, and with --json ends on a JSON summary.

Two short runs as subprocesses (the real entry point): one on a synthetic data set it writes
itself, one on that data set passed as ``--data`` with ``--json`` and ``--eval``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.dali]

pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")


def _demo(*args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    exe = shutil.which("dalistream")
    command = [exe] if exe else [sys.executable, "-m", "dalistream"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command + ["demo", *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("demo") / "data"
    result = _demo("--steps", "20", "--batch-size", "16", "--size", "32", "--log-every", "5",
                   "--data-dir", str(data_dir))
    return result, data_dir


@pytest.mark.slow
def test_demo_trains_on_synthetic_data(first_run):
    result, data_dir = first_run
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+epoch \d+\s+loss ([0-9.]+)", out, re.M)]
    assert len(losses) == 4, out  # every 5 steps of 20
    assert all(v == v and v > 0 for v in losses)
    assert "samples/s" in out and "data wait" in out and "accuracy" in out
    assert re.search(r"done: 20 steps", out)
    assert sorted(os.listdir(data_dir / "train"))[0].endswith(".tar")  # --data-dir keeps the data set
    assert "\r" not in result.stderr  # no progress bar when stderr is not a terminal


@pytest.mark.slow
def test_demo_json_on_given_data(first_run):
    _, data_dir = first_run
    result = _demo("--data", str(data_dir / "train"), "--eval", "--eval-data", str(data_dir / "val"),
                   "--steps", "6", "--batch-size", "16", "--size", "32", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # quiet: only the summary
    summary = json.loads(lines[-1])
    assert summary["steps"] == 6 and summary["samples"] == 6 * 16
    assert summary["device"] in ("cpu", "gpu") and summary["workers"] == 2
    assert summary["final_loss"] > 0 and 0 <= summary["train_accuracy"] <= 1
    assert 0 <= summary["eval_accuracy"] <= 1
    assert summary["data_wait_s"] >= 0 and summary["compute_s"] > 0
    assert summary["data"] == [str(data_dir / "train")]


def test_demo_bad_arguments_exit_2(tmp_path):
    result = _demo("--steps", "0", "--data", str(tmp_path))
    assert result.returncode == 2 and "steps" in result.stderr


def test_help_lists_every_command_with_a_purpose():
    from dalistream.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    helps = {action.dest: action.help for action in sub._choices_actions}
    assert "demo" in helps and set(helps) == set(sub.choices)
    assert all(text and "\n" not in text for text in helps.values()), helps


def test_torch_threads_leave_cores_to_workers():
    from dalistream.tools.demo import torch_threads

    assert torch_threads(3, 2, {}) == 3
    assert torch_threads(None, 2, {"OMP_NUM_THREADS": "4"}) == 4
    assert torch_threads(None, 64, {}) == 1


@pytest.mark.parametrize("labels, bad", [([0, 2, 1], None), ([3, 0], 3), ([-1, 2], -1), ([0, 9, -4], 9), ([2], None)])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_labels_are_checked_against_the_classes(labels, bad, dtype):
    import torch

    from dalistream.errors import ConfigError
    from dalistream.tools.demo import check_labels

    tensor = torch.tensor(labels, dtype=getattr(torch, dtype))
    if bad is None:
        check_labels(tensor, 3)
    else:
        with pytest.raises(ConfigError, match=rf"label {bad} is outside 0\.\.2"):
            check_labels(tensor, 3)
