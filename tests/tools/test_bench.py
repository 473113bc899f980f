"""`dalistream bench`: runs end to end on a tiny synthetic data set and reports well-formed figures.

No timing assertions: the machine is shared and noisy; only structure and positivity are checked.
"""

import importlib
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


MAIN = ("samples_per_s", "first_batch_s", "peak_rss_mb", "peak_pss_mb", "mb_per_s")


def figures_ok(report):
    """The main figures positive; CPU per sample positive or, on a run too short to resolve, None."""
    positive(report, MAIN)
    split_or_unmeasured(report)


@pytest.mark.slow
def test_compare_reports_every_system(shards, tmp_path):
    # epochs enough that every system's steady phase spans many /proc clock ticks of CPU
    report, proc = run_bench(tmp_path, shards, "--workers", 2, "--batch-size", 16, "--size", 64,
                             "--compare", "dali-native,webdataset", "--repeats", 1, "--epochs", 6)
    figures_ok(report)
    assert set(report["peers"]) == {"dali-native", "webdataset"}
    for name, peer in report["peers"].items():
        figures_ok(peer)
        positive(peer["ratio"], ("samples_per_s", "first_batch_s", "peak_rss_mb"))
        assert peer["runs"] == 1
    assert report["config"]["batch_size"] == 16 and report["config"]["workers"] == 2
    workers = report["worker_stats"]["workers"]
    assert len(workers) == 2 and all(w["samples"] > 0 and w["bytes"] > 0 for w in workers)
    # everything but the JSON line goes to stderr
    assert len(proc.stdout.strip().splitlines()) == 1
    assert "dalistream / dali-native" in proc.stderr


@pytest.mark.slow
def test_feed_pipeline_splits_cpu_between_main_and_workers(shards, tmp_path):
    # epochs enough that DALI's reader, the fastest, runs for many clock ticks of CPU after its first batch
    report, _ = run_bench(tmp_path, shards, "--pipeline", "feed", "--workers", 2, "--batch-size", 16,
                          "--compare", "dali-native,webdataset", "--repeats", 1, "--lean-main", "--epochs", 12)
    assert report["config"]["pipeline"] == "feed"
    positive(report, ("samples_per_s", "first_batch_s"))
    split_or_unmeasured(report)
    if report["steady_cpu_ms_per_sample"] is not None:  # CPU per MB of the shards read: the same CPU
        per_sample = report["config"]["shard_bytes_per_sample"]
        assert report["cpu_ms_per_mb"] == pytest.approx(report["steady_cpu_ms_per_sample"] / per_sample * 1e6)
    for name, peer in report["peers"].items():
        positive(peer, ("samples_per_s", "first_batch_s"))
        split_or_unmeasured(peer)
    # DALI's reader has no worker processes; the DataLoader's workers do the work
    native, wds = (report["peers"][name]["workers_cpu_ms_per_sample"] for name in ("dali-native", "webdataset"))
    if native is not None and wds is not None:
        assert native <= wds  # (both may read 0 clock ticks on a very short run)


def split_or_unmeasured(figures):
    """CPU per sample, split into main process and workers: positive figures, or -- on a machine fast
    enough that a run's steady phase took fewer than MIN_CPU_TICKS clock ticks of CPU, which /proc
    cannot resolve -- all three None together (the rule itself is tested exactly by the fake system
    below). Which of the two a run gives depends on the machine's speed, never what the test asserts."""
    keys = ("steady_cpu_ms_per_sample", "main_cpu_ms_per_sample", "workers_cpu_ms_per_sample")
    if figures["steady_cpu_ms_per_sample"] is None:
        assert all(figures[k] is None for k in keys), figures
    else:  # the split adds up; either side may read 0 ticks on a short run, so neither must be > 0
        positive(figures, ("steady_cpu_ms_per_sample",))
        main, workers = figures["main_cpu_ms_per_sample"], figures["workers_cpu_ms_per_sample"]
        assert main >= 0 and workers >= 0, figures
        assert main + workers == pytest.approx(figures["steady_cpu_ms_per_sample"]), figures


@pytest.mark.slow
def test_several_pipelines_in_one_command(shards, tmp_path):
    report, _ = run_bench(tmp_path, shards, "--pipeline", "feed,read-only", "--batch-size", 16, "--repeats", 1,
                          "--lean-main")
    assert set(report["pipelines"]) == {"feed", "read-only"}
    for pipeline, point in report["pipelines"].items():
        assert point["config"]["pipeline"] == pipeline
        positive(point, ("samples_per_s",))


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
    figures_ok(report)
    for peer in report["peers"].values():
        figures_ok(peer)
        positive(peer["ratio"], ("samples_per_s", "first_batch_s"))
    stats = report["worker_stats"]
    # the epoch's samples, each once (a worker's own counter also holds what it read ahead into the
    # next epoch, counted there: the sources go straight on with it)
    assert stats["samples"] == 160 and stats["by_epoch"]["0"]["samples"] == 160
    assert "testing" not in proc.stderr  # the credentials of aws_env


@pytest.mark.slow
@pytest.mark.s3
def test_cache_against_no_cache_and_the_local_copy(shards, tmp_path, moto_endpoint):
    """--cache: dalistream reads S3 through a new cache folder per run, alternating with the same
    sources without it and with the local copy read directly; epoch rates per system, and the
    cached run's second epoch read nothing from the store. Every run's cache folder is removed."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket="bench-cache")
    for name in sorted(os.listdir(shards)):
        client.upload_file(os.path.join(shards, name), "bench-cache", f"data/{name}")
    os.environ["AWS_ENDPOINT_URL"] = moto_endpoint  # (aws_env restores)
    caches = tmp_path / "caches"
    caches.mkdir()
    report, proc = run_bench(tmp_path, "s3://bench-cache/data/", "--pipeline", "read-only", "--batch-size", 16,
                             "--workers", 2, "--repeats", 1, "--epochs", 2, "--cache", caches, "--local-copy", shards)
    assert set(report["peers"]) == {"dalistream-nocache", "dalistream-local", "sequential-read"}
    assert len(report["epoch_samples_per_s"]) == 2 and all(r > 0 for r in report["epoch_samples_per_s"])
    for name in ("dalistream-nocache", "dalistream-local"):
        assert all(r > 0 for r in report["peers"][name]["ratio"]["epoch_samples_per_s"])
    by_epoch = report["worker_stats"]["by_epoch"]
    # (a first run: the header scan at the stream's opening reads the shards through the new cache,
    # filling it, or the first epoch does; the second epoch reads it)
    assert by_epoch["0"]["io"]["cache_written_bytes"] + by_epoch["0"]["io"]["cache_hits"] > 0
    assert by_epoch["1"]["io"]["cache_hits"] > 0
    assert by_epoch["1"]["io"]["bytes"] <= 4 << 20  # (read-ahead across the epochs' boundary aside)
    assert "samples/s per epoch" in proc.stderr and "from the store" in proc.stderr
    assert list(caches.iterdir()) == []
    with pytest.raises(AssertionError, match="local-copy"):
        run_bench(tmp_path, "s3://bench-cache/data/", "--repeats", 1, "--local-copy", os.path.join(shards, "*0.tar"))


@pytest.mark.slow
def test_buckets_against_the_same_sources_without(shards, tmp_path):
    import shutil

    from dalistream.cli import main

    copy = str(tmp_path / "keyed")
    shutil.copytree(shards, copy)
    assert main(["index", copy, "--keys", "image", "--json"]) == 0
    report, proc = run_bench(tmp_path, copy, "--pipeline", "feed", "--workers", 2, "--batch-size", 8, "--repeats", 1,
                             "--epochs", 2, "--buckets", "auto:3")
    figures_ok(report)
    assert set(report["peers"]) == {"dalistream-nobuckets"}
    positive(report["peers"]["dalistream-nobuckets"]["ratio"], ("samples_per_s", "first_batch_s"))
    assert "dalistream / dalistream-nobuckets" in proc.stderr


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
    assert [r["workers"] for r in rows] == [2] and rows[0]["payload_bytes"] == 1
    for row in rows:
        positive(row, ("ms_per_batch", "sources_only_ms_per_batch", "build_s", "peak_rss_mb"))
    report, _ = run_bench(tmp_path, "--merge-only", "--merge-workers", "1,2", "--merge-batches", 5, "--repeats", 1,
                          "--batch-size", 8, "--merge-bytes", "100-3000", "--merge-method", "conditional")
    assert [r["workers"] for r in report["merge_only"]["rows"]] == [1, 2]
    assert report["merge_only"]["method"] == "conditional" and report["merge_only"]["payload_bytes"] == "100-3000"


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


def test_cpu_split_counts_a_child_below_and_never_goes_backwards():
    """The main process's CPU and its descendants' are read from one reading of its counters:
    the descendants' share only grows (a child that burns CPU, alive and then reaped)."""
    import subprocess
    import sys

    main0, below0 = benchmon.split_cpu_s(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    readings = []
    while child.poll() is None and len(readings) < 400:
        readings.append(benchmon.split_cpu_s(os.getpid())[1])
        if readings[-1] - below0 >= 0.25:
            break
    child.communicate(b"")  # reaped: its CPU moves into this process's counters of waited-for children
    readings.append(benchmon.split_cpu_s(os.getpid())[1])
    assert all(b >= a for a, b in zip(readings, readings[1:]))
    assert readings[-1] - below0 >= 0.25
    assert benchmon.split_cpu_s(os.getpid())[0] >= main0


# -- the one timing rule --------------------------------------------------------------------------

class FakeClock:
    """A clock that moves only when a fake system sleeps: the rule's results become exact."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_every_system_goes_through_the_same_rule():
    from dalistream.tools.bench import peers, timing

    assert set(peers.SYSTEMS) >= {"dalistream", *bench.PEERS, "sequential-read"}
    from dalistream.tools.bench import mds

    for name, (modules, opener) in peers.SYSTEMS.items():
        assert callable(opener) and all(isinstance(m, str) or callable(m) for m in modules), name
    # the libraries a system needs are imported before its clock starts
    assert {"torch", "nvidia.dali.fn"} <= set(peers.SYSTEMS["dali-native"][0])
    assert {"torch", "nvidia.dali.fn", "dalistream"} <= set(peers.SYSTEMS["dalistream"][0])
    assert {"torch", "webdataset"} <= set(peers.SYSTEMS["webdataset"][0])
    assert {"torch", "litdata"} <= set(peers.SYSTEMS["litdata"][0])
    assert {"torch", mds.base} <= set(peers.SYSTEMS["mosaicml"][0])  # streaming.base, its package's __init__ unrun
    seen = []

    def clock():
        seen.append("colorsys" in sys.modules)
        return 0.0

    # a library named, or imported by a function of its own
    for needs in ("colorsys", lambda: importlib.import_module("colorsys")):
        sys.modules.pop("colorsys", None)
        seen.clear()
        systems = {"x": ((needs,), lambda spec: timing.Opened([1, 2], lambda b: (b, 0)))}
        timing.run_system({"system": "x"}, systems, clock=clock, cpu=lambda: (0.0, 0.0))
        assert seen and all(seen)  # imported before the first reading of the clock


@pytest.mark.parametrize("first_s, per_batch_s, open_s", [(0.5, 0.01, 0.2), (0.01, 0.25, 0.0)])
def test_fake_system_of_known_cost_is_measured_exactly(first_s, per_batch_s, open_s):
    """A system whose every batch costs a known (fake) time: steady rate after the first batch,
    first batch from the start of opening, CPU split per sample, all exactly as the rule says."""
    import functools

    from dalistream.tools.bench import peers, timing

    clock = FakeClock()
    cpu_readings = iter([(1.0, 2.0), (1.5, 6.0)])  # at the first batch, at the end
    systems = dict(peers.SYSTEMS, fake=((), functools.partial(peers.open_fake, sleep=clock.sleep)))
    spec = {"system": "fake", "batches": 11, "batch_size": 32, "first_s": first_s, "per_batch_s": per_batch_s,
            "open_s": open_s}
    r = timing.run_system(spec, systems, clock=clock, cpu=lambda: next(cpu_readings))
    assert r["system"] == "fake" and r["samples"] == 11 * 32 and r["batches"] == 11
    assert r["first_batch_s"] == pytest.approx(open_s + first_s)
    assert r["samples_per_s"] == pytest.approx(32 / per_batch_s)
    assert r["total_s"] == pytest.approx(open_s + first_s + 10 * per_batch_s)
    assert r["main_cpu_ms_per_sample"] == pytest.approx(0.5 / 320 * 1000)
    assert r["workers_cpu_ms_per_sample"] == pytest.approx(4.0 / 320 * 1000)
    assert r["steady_cpu_ms_per_sample"] == pytest.approx(4.5 / 320 * 1000)


def test_fake_system_through_the_child_process(tmp_path):
    """The same fake system, run the way every system runs (a child process under the monitor):
    real sleeps can only lengthen batches, so the steady rate is at most batch / per-batch time."""
    from dalistream.tools.bench.child import run_child

    spec = {"system": "fake", "batches": 6, "batch_size": 10, "first_s": 0.05, "per_batch_s": 0.02}
    r = run_child(spec, timeout=120, lean_main=True)
    assert r["samples"] == 60 and r["system"] == "fake"
    assert 0 < r["samples_per_s"] <= 10 / 0.02
    assert r["first_batch_s"] >= 0.05
    assert r["monitor_cpu_s"] >= 0


def test_cpu_split_counts_workers_that_exited():
    """Workers' CPU counts the descendants of the main process, those already waited for too."""
    import subprocess

    main0, workers0 = benchmon.split_cpu_s(os.getpid())
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    main1, workers1 = benchmon.split_cpu_s(os.getpid())
    assert workers1 > workers0 and main1 >= main0


def test_ascii_labels():
    torch = pytest.importorskip("torch")
    from dalistream.tools.bench.peers import ascii_labels

    padded = torch.tensor([[ord("7"), 0, 0], [ord("4"), ord("2"), 0], [ord("1"), ord("0"), ord("3")]], dtype=torch.uint8)
    assert ascii_labels(padded).tolist() == [7, 42, 103]


def _children(pid):
    from dalistream.tools.bench.monitor import tree

    return [p for p in tree(pid) if p != pid]


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["feed", "read-only"])
def test_ctrl_c_on_bench_stops_and_waits_for_its_child_and_workers(shards, tmp_path, pipeline):
    """Ctrl-C (SIGINT to the bench process, as a terminal sends it) returns only once the child run
    and the child's DALI workers are gone: nothing is left running behind the prompt."""
    import signal
    import time

    env = dict(os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "dalistream", "bench", shards, "--pipeline", pipeline,
                             "--workers", "2", "--batch-size", "8", "--epochs", "100000", "--repeats", "1",
                             "--lean-main"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            # as from a terminal: SIGINT handled (a run started in the background inherits it ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(_children(proc.pid)) < 3:  # the child and its 2 workers
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        group = _children(proc.pid)
        assert len(group) >= 3, "the bench child and its workers did not start"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
        left = [p for p in group if os.path.exists(f"/proc/{p}") and
                open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
        assert left == [], f"still running after the bench returned: {left}"
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.parametrize("visible, pipeline, pinned", [(0, "classification_train", False), (1, "classification_train", True),
                                                       (1, "feed", False)])
def test_the_webdataset_peer_copies_to_the_gpu_from_pinned_memory(monkeypatch, shards, visible, pipeline, pinned):
    """Where its batches go on to a GPU, the webdataset peer's DataLoader pins them, as a GPU user
    sets it (a copy from pageable memory is slower and would flatter dalistream); the report says so."""
    import glob

    from dalistream.dali import device
    from dalistream.tools.bench import peers

    monkeypatch.setattr(device, "gpu_count", lambda: visible)
    spec = {"urls": sorted(glob.glob(os.path.join(shards, "*.tar"))), "pipeline": pipeline, "size": 32, "seed": 0,
            "workers": 0, "batch_size": 8, "epochs": 1, "device": "auto"}
    opened = peers.open_webdataset(spec)
    try:
        assert opened.extra() == {"device": "gpu" if visible else "cpu", "pin_memory": pinned}
    finally:
        opened.close()


def test_a_peer_s_ratio_is_the_median_of_each_round_s_own_ratio():
    """Each round's ratio, then their median (2.0 here), not the ratio of the medians (1.2): a
    round slow for both systems cancels in its own ratio."""
    ours = [{"samples_per_s": 100.0, "epoch_samples_per_s": [100.0]}, {"samples_per_s": 120.0},
            {"samples_per_s": 300.0, "epoch_samples_per_s": [300.0]}]
    peer = [{"samples_per_s": 50.0}, {"samples_per_s": 200.0}, {"samples_per_s": 100.0}]
    assert bench.round_ratios(ours, peer)["samples_per_s"] == 2.0
    assert bench.ratios(bench.summarize(ours), bench.summarize(peer))["samples_per_s"] == 1.2


def test_with_and_without_buckets_differ_in_buckets_alone(tmp_path):
    """--buckets with --cache: both runs read through a cache folder of their own (removed after),
    so the pair compares buckets, not a cache against none."""
    import argparse

    from dalistream.tools.bench.runner import _system_spec

    args = argparse.Namespace(cache=str(tmp_path), cache_limit=None)
    base = {"buckets": "auto:8", "urls": ["s3://b/x.tar"]}
    folders = {}
    for system in ("dalistream", "dalistream-nobuckets"):
        with _system_spec(args, base, system) as spec:
            folders[system] = spec.get("cache")
            assert spec["cache"] and os.path.isdir(spec["cache"])
            assert spec["buckets"] == (None if system == "dalistream-nobuckets" else "auto:8")
    assert folders["dalistream"] != folders["dalistream-nobuckets"] and os.listdir(tmp_path) == []


@pytest.mark.slow
def test_every_system_reads_one_rank_s_share(shards):
    """``--rank r --world-size R``: each system reads rank ``r``'s share alone (dalistream its plan's,
    DALI's reader its ``shard_id`` of ``num_shards``, webdataset and the sequential read every
    ``R``-th shard): the two ranks of a job read disjoint samples, between them the data set (less
    what a rank's last partial batch drops)."""
    import glob

    import numpy as np

    from dalistream.tools.bench import peers

    urls = sorted(glob.glob(os.path.join(shards, "*.tar")))
    base = dict(urls=urls, counts=[40] * len(urls), batch_size=8, workers=1, threads=1, device="cpu", seed=0,
                size=64, epochs=1, pipeline="read-only", start_method="fork", world_size=2)
    for name, opener in [("dalistream", peers.open_dalistream), ("dali-native", peers.open_dali_native),
                         ("webdataset", peers.open_webdataset)]:
        seen = []
        for rank in (0, 1):
            opened = opener(dict(base, rank=rank))
            try:
                images = [x if isinstance(x, bytes) else np.asarray(x).tobytes() for b in opened.batches
                          for x in (b["image"] if isinstance(b, dict) else b[0])]
            finally:
                opened.close()
            assert len(images) == len(set(images)), name
            seen.append(set(images))
        assert not seen[0] & seen[1], f"{name}: the two ranks read the same samples"
        assert 160 - 2 * 8 <= len(seen[0] | seen[1]) <= 160 and abs(len(seen[0]) - len(seen[1])) <= 8, \
            (name, len(seen[0]), len(seen[1]))
    for rank in (0, 1):
        opened = peers.open_sequential_read(dict(base, rank=rank, storage_options={}))
        assert sum(n for n, _ in opened.batches) == 80
    from dalistream.cli import main

    assert main(["bench", shards, "--rank", "2", "--world-size", "2"]) == 2  # (a rank outside the job: refused)


def test_every_option_of_the_data_reaches_the_systems(shards, tmp_path, monkeypatch):
    """The class of ``--rank``/``--world-size`` (accepted, then ignored: every run measured a job
    of one rank): every option the bench shares with the loader, given a value other than its
    default, is in the spec every system is opened with."""
    import shutil

    from dalistream.cli import main

    shards = shutil.copytree(shards, str(tmp_path / "shards"))  # (the module's shards stay without a manifest)
    assert main(["index", shards]) == 0
    manifest = os.path.join(shards, "dalistream-manifest.json")
    given = {"--workers": ("workers", 3), "--rank": ("rank", 1), "--world-size": ("world_size", 3),
             "--epoch": ("epoch", 2), "--seed": ("seed", 5), "--manifest": ("manifest", manifest),
             "--on-error": ("on_error", "skip"), "--start-method": ("start_method", "spawn"),
             "--batch-size": ("batch_size", 12), "--shuffle": ("shuffle", 7), "--policy": ("policy", "fixed"),
             "--batches-per-epoch": ("batches_per_epoch", 4), "--buckets": ("buckets", "aspect:1x1,2x1"),
             "--bucket-per": ("bucket_per", "global"), "--lookahead": ("lookahead", 9),
             "--affinity": ("affinity", "node"), "--ranks-per-node": ("ranks_per_node", 1),
             "--epochs": ("epochs", 3), "--threads": ("threads", 3), "--size": ("size", 48)}
    seen = {}

    class Opened(Exception):
        pass

    def compare(args, base, shard_bytes, systems, log):
        seen.update(base)
        raise Opened

    monkeypatch.setattr(bench, "compare", compare)
    argv = ["bench", shards, "--no-interleave", "--endpoint-url", "http://127.0.0.1:9"]
    for option, (_, value) in given.items():
        argv += [option, str(value)]
    with pytest.raises(Opened):
        main(argv)
    assert {key: seen[key] for key, _ in given.values()} == dict(given.values())
    assert seen["interleave"] is False and seen["storage_options"]["endpoint_url"] == "http://127.0.0.1:9"


@pytest.mark.parametrize("system", ["dalistream", "dalistream-nobuckets", "dalistream-local"])
def test_every_dalistream_run_counts_as_a_first_run(shards, tmp_path, monkeypatch, system):
    """Each dalistream run opens its stream with a scan cache of its own, empty (removed after the
    run): its first batch includes the header scan of shards without a manifest, as a user's first
    run does and DALI's reader does in every run; a cache left by the bench's own count, or by an
    earlier run, is never read (for every dalistream system)."""
    import argparse
    import glob

    from dalistream.manifest import count_shards
    from dalistream.tools.bench import peers
    from dalistream.tools.bench.runner import _system_spec

    default = tmp_path / "default-cache"
    monkeypatch.setenv("DALISTREAM_CACHE", str(default))
    urls = sorted(glob.glob(os.path.join(shards, "*.tar")))
    count_shards(urls, cache_dir=str(default))  # what the bench's parent counts: scans cached by default
    cached = sorted(os.listdir(default / "manifests"))
    assert len(cached) == len(urls)
    args = argparse.Namespace(cache=None, cache_limit=None)
    base = dict(urls=urls, local_urls=urls, counts=[40] * len(urls), batch_size=8, workers=1, threads=1,
                device="cpu", seed=0, size=64, epochs=1, pipeline="read-only", start_method="fork", buckets=None)
    folders = []
    for _ in range(2):
        with _system_spec(args, base, system) as spec:
            folders.append(spec["cache_dir"])
            assert os.listdir(spec["cache_dir"]) == []
            opened = peers.open_dalistream(spec)
            opened.close()
            # the stream scanned every shard into its own folder: nothing was found cached
            assert len(os.listdir(os.path.join(spec["cache_dir"], "manifests"))) == len(urls)
            assert opened.extra()["counts_from"] == "header scan"
    assert folders[0] != folders[1] and not any(os.path.exists(f) for f in folders)
    assert sorted(os.listdir(default / "manifests")) == cached  # the default cache: untouched
