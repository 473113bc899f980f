"""``dalistream plan --resume-from STATE.json``: a state saved by a real Loader, shown for
another layout (subprocess, as users run it)."""

import json
import subprocess
import sys

import pytest

from dalistream import Loader, Stream

from helpers import key_shards

pytestmark = [pytest.mark.dali]


def plan(*args):
    proc = subprocess.run([sys.executable, "-m", "dalistream", "plan", *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    return proc


def test_resume_from_a_saved_state(tmp_path):
    data = str(tmp_path / "data")
    key_shards(data, [20, 0, 13, 31, 8])
    stream = Stream.open(data, fields={"key": "__key__"}, batch_size=6, workers=2, world_size=2, rank=0,
                         device="cpu", policy="exact", seed=2, cache_dir=str(tmp_path))
    with Loader(stream) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
    proc = plan(data, "--resume-from", tmp_path / "state.json", "--world-size", 3, "--workers", 1, "--batch-size", 4,
                "--json")
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout)["resume"]
    assert view["delivered"] == 2 * 3 * 6 and view["remaining"] == 72 - 36
    assert view["steps_left"] == 3 and [r["steps"] for r in view["ranks"]] == [3, 3, 3]
    assert sum(r["samples"] for r in view["ranks"]) == 36
    text = plan(data, "--resume-from", tmp_path / "state.json", "--world-size", 3, "--workers", 1, "--batch-size", 4)
    assert "36 of 72 samples delivered, 36 left, 3 steps per rank" in text.stdout
    # other shards: refused in words
    key_shards(str(tmp_path / "other"), [20, 0, 13, 31])
    proc = plan(tmp_path / "other", "--resume-from", tmp_path / "state.json", "--world-size", 1, "--workers", 1,
                "--batch-size", 4)
    assert proc.returncode != 0 and "5 shards saved, 4 now" in proc.stderr
