"""``notebooks/worker_cost.py``: one worker's CPU per sample, interleaved and one span, in processes
of their own, against another checkout (here: this one again)."""

import os
import re
import subprocess
import sys

import pytest

from dalistream.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_table_gives_both_orders_for_both_checkouts(tmp_path):
    data = str(tmp_path / "synth")
    assert main(["synth", data, "--shards", "4", "--samples-per-shard", "40"]) == 0
    out = subprocess.run([sys.executable, os.path.join(ROOT, "notebooks", "worker_cost.py"), data, "-B", "16",
                          "--rounds", "2", "--epochs", "2", "--code", ROOT], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(r"^\| (this|other) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)×", out, re.M)}
    assert set(rows) == {"this", "other"} and all(float(v) > 0 for row in rows.values() for v in row)
    assert re.search(r"this / other, interleaved: [\d.]+×", out) and re.search(r"this / other, span: [\d.]+×", out)
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, os.path.join(ROOT, "notebooks", "worker_cost.py"), data, "--epochs", "1"],
                       capture_output=True, check=True, timeout=60)


@pytest.mark.slow
def test_a_rank_of_several_is_measured(tmp_path):
    """``-R``: worker 0 of rank 0 of a job of ``R`` ranks (its share of the epoch, its columns ``R``
    spans apart), the rank count printed with the figures."""
    data = str(tmp_path / "synth")
    assert main(["synth", data, "--shards", "4", "--samples-per-shard", "40"]) == 0
    out = subprocess.run([sys.executable, os.path.join(ROOT, "notebooks", "worker_cost.py"), data, "-B", "8", "-R", "2",
                          "--rounds", "1", "--epochs", "2"], capture_output=True, text=True, timeout=300, check=True).stdout
    assert "R=2" in out
    row = re.search(r"^\| this \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)×", out, re.M)
    assert row and all(float(v) > 0 for v in row.groups())
