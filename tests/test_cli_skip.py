"""Every command that reads shards, under ``--on-error skip``, on a directory holding damaged
shards: it runs to its end, counts the damaged shards up to their damage and reports them,
as ``keys`` and the loader do. (Under ``raise`` the same data stops each command, naming a shard.)"""

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from helpers import write_tar

GOOD = 3  # good shards of PER samples each
PER = 8


def png(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (12, 12), (i * 29 % 256, 40, 200)).save(buf, "PNG")
    return buf.getvalue()


def members(prefix: str, n: int):
    out = []
    for i in range(n):
        out += [(f"{prefix}/{i:03d}.png", png(i)), (f"{prefix}/{i:03d}.cls", str(i % 3).encode())]
    return out


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A directory: GOOD good shards, an empty one, one cut inside its 4th sample's image, an error page."""
    d = str(tmp_path_factory.mktemp("damaged"))
    for s in range(GOOD):
        write_tar(os.path.join(d, f"good-{s}.tar"), members(f"g{s}", PER))
    open(os.path.join(d, "zero.tar"), "wb").close()
    full = write_tar(os.path.join(d, "cut.raw"), members("cut", 6))
    with tarfile.open(full) as tar:
        image_3 = [m for m in tar.getmembers() if m.name == "cut/003.png"][0]
    data = open(full, "rb").read()
    open(os.path.join(d, "late-cut.tar"), "wb").write(data[:image_3.offset_data + 10])
    os.remove(full)
    open(os.path.join(d, "page.tar"), "wb").write(b"<html><body>503 Service Unavailable</body></html>\n" * 30)
    return d


def cli(*args, cache):
    return subprocess.run([sys.executable, "-m", "dalistream", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, DALISTREAM_CACHE=str(cache)))


def last_json(proc):
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


DAMAGED = {"zero.tar", "late-cut.tar", "page.tar"}
DELIVERED = GOOD * PER + 3  # the cut shard: its samples before the damage


def test_plan_skip_counts_damaged_shards_up_to_the_damage(damaged, tmp_path):
    proc = cli("plan", damaged, "--on-error", "skip", "-W", 2, "-B", 4, "--json", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    payload = last_json(proc)
    (epoch,) = payload["epochs"]
    assert epoch["samples"] == DELIVERED  # counted up to the damage
    assert sum(row["samples"] for row in payload["plan"]) == DELIVERED - epoch["left_out"]
    assert payload["skipped_shards"] == 3
    assert {os.path.basename(e["url"]) for e in payload["errors"]} == DAMAGED
    assert cli("plan", damaged, "-W", 2, "-B", 4, "--json", cache=tmp_path).returncode == 2


def test_index_skip_with_offsets_records_the_samples_before_the_damage(damaged, tmp_path):
    proc = cli("index", damaged, "--on-error", "skip", "--offsets", "-o", tmp_path / "m.json", "--json",
               cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {os.path.basename(r["url"]): r for r in last_json(proc)["shards"]}
    assert rows["late-cut.tar"]["samples"] == 3 and len(rows["late-cut.tar"]["offsets"]) == 3
    assert rows["zero.tar"]["samples"] == 0 and rows["good-1.tar"]["samples"] == PER


@pytest.mark.dali
@pytest.mark.slow
def test_keys_skip_delivers_every_good_sample(damaged, tmp_path):
    proc = cli("keys", damaged, "--on-error", "skip", "--policy", "exact", "-W", 2, "-B", 4, "--json", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    keys = [k for line in lines[:-1] for k in line["keys"]]
    assert len(keys) == len(set(keys)) == DELIVERED
    assert lines[-1]["stats"]["skipped"]["shards"] == {"empty": 1, "truncated": 1, "not_tar": 1}


@pytest.mark.dali
@pytest.mark.slow
def test_bench_skip_runs_past_the_damaged_shards(damaged, tmp_path):
    proc = cli("bench", damaged, "--on-error", "skip", "--pipeline", "read-only", "--repeats", 1, "-W", 1, "-B", 3,
               "--device", "cpu", "--lean-main", "--json", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = last_json(proc)
    assert report["config"]["samples"] == DELIVERED
    assert report["worker_stats"]["skipped_shards"] == 3
    assert "cannot be read to its end" in proc.stderr
    raised = cli("bench", damaged, "--pipeline", "read-only", "--repeats", 1, "-W", 1, "-B", 3, "--json", cache=tmp_path)
    assert raised.returncode == 2 and any(name in raised.stderr for name in DAMAGED)


@pytest.mark.dali
@pytest.mark.slow
def test_demo_on_damaged_data_skips(damaged, tmp_path):
    proc = cli("demo", "--data", damaged, "--on-error", "skip", "--steps", 4, "-B", 4, "-W", 1, "--size", 16,
               "--classes", 3, "--device", "cpu", "--shuffle", 0, "--json", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = last_json(proc)
    assert summary["steps"] == 4 and summary["samples"] == 16
