"""`dalistream bench`: runs end to end on a tiny synthetic data set and reports well-formed figures.

No timing assertions: the machine is shared and noisy; only structure and positivity are checked.
"""

import json
import os
import subprocess
import sys

import pytest

from dalistream.tools.bench import monitor as benchmon
from dalistream.tools.bench import runner as bench
from dalistream.errors import ConfigError
from dalistream.tools.synth import SynthSpec, write_dataset

pytestmark = [pytest.mark.dali]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("bench"))
    write_dataset(d, SynthSpec(shards=4, samples_per_shard=40, min_size=32, max_size=64))
    return d


def run_bench(tmp_path, *args):
    env = dict(os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "dalistream", "bench", *map(str, args), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"dalistream bench {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def positive(figures, keys):
    for key in keys:
        value = figures[key]
        if not (isinstance(value, (int, float)) and value > 0):
            raise AssertionError(f"{key} = {value!r} is not a positive number in {figures}")


MAIN = ("samples_per_s", "first_batch_s", "peak_rss_mb", "peak_pss_mb", "steady_cpu_ms_per_sample", "mb_per_s")


@pytest.mark.slow
def test_compare_reports_every_system(shards, tmp_path):
    report, proc = run_bench(tmp_path, shards, "--workers", 2, "--batch-size", 16, "--size", 64,
                             "--compare", "dali-native,webdataset", "--repeats", 1)
    positive(report, MAIN)
    assert set(report["peers"]) == {"dali-native", "webdataset"}
    for name, peer in report["peers"].items():
        positive(peer, MAIN)
        positive(peer["ratio"], ("samples_per_s", "first_batch_s", "peak_rss_mb"))
        assert peer["runs"] == 1
    assert report["config"]["batch_size"] == 16 and report["config"]["workers"] == 2
    workers = report["worker_stats"]["workers"]
    assert len(workers) == 2 and all(w["samples"] > 0 and w["bytes"] > 0 for w in workers)
    # everything but the JSON line goes to stderr
    assert len(proc.stdout.strip().splitlines()) == 1
    assert "dalistream / dali-native" in proc.stderr


@pytest.mark.slow
def test_read_only_sweep_and_plot(shards, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sweep.png"
    report, _ = run_bench(tmp_path, shards, "--pipeline", "read-only", "--batch-size", 16, "--repeats", 1,
                          "--sweep", "workers=1,2", "--plot", plot, "--lean-main")
    points = report["sweep"]["points"]
    assert report["sweep"]["param"] == "workers" and [p["value"] for p in points] == [1, 2]
    for point in points:
        positive(point, ("samples_per_s", "mb_per_s", "peak_rss_mb"))
        positive(point["peers"]["sequential-read"], ("samples_per_s", "mb_per_s"))
    assert plot.stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.s3
def test_compare_on_s3(shards, tmp_path, moto_endpoint):
    """The same comparison with the shards in a real S3 server (moto): all three systems read
    ``s3://`` (dalistream's streams, DALI's own S3 reader, webdataset through boto3)."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket="bench")
    for name in sorted(os.listdir(shards)):
        client.upload_file(os.path.join(shards, name), "bench", f"data/{name}")
    os.environ["AWS_ENDPOINT_URL"] = moto_endpoint  # DALI's S3 reader and boto3's chain (aws_env restores)
    report, proc = run_bench(tmp_path, "s3://bench/data/", "--workers", 2, "--batch-size", 16, "--size", 64,
                             "--compare", "dali-native,webdataset", "--repeats", 1)
    assert report["config"]["shards"] == 4 and report["config"]["samples"] == 160
    positive(report, MAIN)
    for peer in report["peers"].values():
        positive(peer, MAIN)
        positive(peer["ratio"], ("samples_per_s", "first_batch_s"))
    assert sum(w["samples"] for w in report["worker_stats"]["workers"]) == 160
    assert "testing" not in proc.stderr  # the credentials of aws_env


@pytest.mark.slow
def test_sweep_over_shards(shards, tmp_path):
    report, _ = run_bench(tmp_path, shards, "--pipeline", "read-only", "--batch-size", 16, "--repeats", 1,
                          "--compare", "dali-native", "--sweep", "shards=2,4", "--lean-main")
    points = report["sweep"]["points"]
    assert report["sweep"]["param"] == "shards" and [p["value"] for p in points] == [2, 4]
    assert [p["config"]["shards"] for p in points] == [2, 4]
    assert [p["config"]["samples"] for p in points] == [80, 160]
    for point in points:
        positive(point, ("samples_per_s", "peak_rss_mb", "peak_pss_mb"))
        positive(point["peers"]["dali-native"], ("samples_per_s", "peak_rss_mb"))
    with pytest.raises(AssertionError, match="hold 4 shards"):
        run_bench(tmp_path, shards, "--repeats", 1, "--sweep", "shards=2,8")


@pytest.mark.slow
def test_merge_only(tmp_path):
    report, _ = run_bench(tmp_path, "--merge-only", "--merge-workers", "2", "--merge-batches", 10, "--repeats", 1,
                          "--batch-size", 8)
    rows = report["merge_only"]["rows"]
    assert [r["workers"] for r in rows] == [2]
    for row in rows:
        positive(row, ("ms_per_batch", "sources_only_ms_per_batch", "build_s", "peak_rss_mb"))


def test_helpers():
    assert bench._parse_sweep("workers=1,2,4") == ("workers", [1, 2, 4])
    assert bench._parse_sweep("batch-size=32,64") == ("batch_size", [32, 64])
    assert bench._parse_sweep("shards=16,160") == ("shards", [16, 160])
    with pytest.raises(ConfigError):
        bench._parse_sweep("colour=1")
    ours = {"samples_per_s": 200.0, "first_batch_s": 1.0}
    r = bench.ratios(ours, {"samples_per_s": 100.0, "first_batch_s": 2.0})
    assert r["samples_per_s"] == 2.0 and r["first_batch_s"] == 0.5 and r["peak_rss_mb"] is None
    me = benchmon.sample(os.getpid())
    assert me["rss_mb"] > 0 and me["processes"] >= 1
    assert benchmon.tree_cpu_s(os.getpid()) > 0
