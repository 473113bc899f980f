"""`dalistream bench --compare litdata,mosaicml`: the converted peers do the same work as dalistream.

The peers' libraries are optional (the `peers` extra); a test of one skips, naming why, where its
library does not import. No timing assertions: only that every figure is there and that every
system read every sample of every epoch (equal work, counted in each run, not assumed).
"""

import json
import os
import subprocess
import sys

import pytest

from dalistream.tools.bench import runner as bench
from dalistream.tools.bench.converted import missing
from dalistream.tools.synth import SynthSpec, write_dataset

pytestmark = [pytest.mark.dali]

SHARDS, PER_SHARD = 4, 40


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("bench-peers"))
    write_dataset(d, SynthSpec(shards=SHARDS, samples_per_shard=PER_SHARD, min_size=32, max_size=64))
    return d


def run_bench(tmp_path, *args, env=None):
    env = dict(env or os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "dalistream", "bench", *map(str, args), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)


def report_of(proc, args):
    if proc.returncode != 0:
        raise AssertionError(f"dalistream bench {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def positive(figures, keys):
    for key in keys:
        value = figures[key]
        if not (isinstance(value, (int, float)) and value > 0):
            raise AssertionError(f"{key} = {value!r} is not a positive number in {figures}")


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["litdata", "mosaicml"])
@pytest.mark.parametrize("pipeline,epochs", [("classification_full", 2), ("read-only", 3)])
def test_a_converted_peer_reads_every_sample_of_every_epoch(shards, tmp_path, peer, pipeline, epochs):
    reason = missing(peer)
    if reason:
        pytest.skip(reason)
    args = (shards, "--workers", 2, "--batch-size", 16, "--size", 32, "--pipeline", pipeline,
            "--compare", f"webdataset,{peer}", "--repeats", 2, "--epochs", epochs)
    report = report_of(run_bench(tmp_path, *args), args)
    samples = SHARDS * PER_SHARD
    assert report["config"]["samples"] == samples and report["config"]["pipeline"] == pipeline
    assert set(report["peers"]) == {"webdataset", peer} | ({"sequential-read"} if pipeline == "read-only" else set())
    figures = report["peers"][peer]
    positive(figures, ("samples_per_s", "first_batch_s", "peak_rss_mb", "convert_s"))
    positive(figures["ratio"], ("samples_per_s", "first_batch_s"))
    assert figures["runs"] == 2
    # equal work: every run of every system delivered each sample once per epoch
    for name, runs in [("dalistream", report["samples_runs"])] + [(n, f["samples_runs"]) for n, f in report["peers"].items()]:
        assert runs == [samples * epochs] * 2, (name, runs)
    assert report["convert_s"] is None  # dalistream reads the shards as they are


@pytest.mark.slow
def test_the_full_decode_graph_runs_on_both_dali_systems(shards, tmp_path):
    args = (shards, "--workers", 2, "--batch-size", 16, "--size", 32, "--pipeline", "classification_full",
            "--compare", "dali-native", "--repeats", 1, "--epochs", 2)
    report = report_of(run_bench(tmp_path, *args), args)
    assert report["config"]["pipeline"] == "classification_full"
    positive(report, ("samples_per_s", "first_batch_s"))
    positive(report["peers"]["dali-native"], ("samples_per_s", "first_batch_s"))
    assert report["samples_runs"] == [2 * SHARDS * PER_SHARD]
    # DALI's iterator drops a last partial batch; 160 samples are 10 whole batches of 16
    assert report["peers"]["dali-native"]["samples_runs"] == [2 * SHARDS * PER_SHARD]


@pytest.mark.parametrize("peer,module", [("litdata", "litdata"), ("mosaicml", "streaming")])
@pytest.mark.parametrize("failure", ["raise ImportError('no module of that name')", "raise RuntimeError('broken build')"])
def test_a_peer_whose_library_fails_to_import_is_refused_by_name(shards, tmp_path, peer, module, failure):
    fake = tmp_path / "shadow"
    (fake / module).mkdir(parents=True)
    (fake / module / "__init__.py").write_text(failure + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    proc = run_bench(tmp_path, shards, "--compare", f"webdataset,{peer}", "--repeats", 1, env=env)
    assert proc.returncode != 0
    assert f"{peer} needs" in proc.stderr and "dalistream[peers]" in proc.stderr, proc.stderr[-2000:]
    assert "samples/s" not in proc.stderr  # refused before any run


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_rotated_rounds_start_at_each_system_in_turn(n):
    systems = [f"s{i}" for i in range(n)]
    rounds = [bench.rotated(systems, r) for r in range(2 * n)]
    assert all(sorted(r) == systems for r in rounds)  # every system once a round
    assert [r[0] for r in rounds[:n]] == systems  # each first in one of n rounds
    assert rounds[n:] == rounds[:n]
    assert [r[-1] for r in rounds[:n]] == systems[-1:] + systems[:-1]  # and last in one


def write_tar(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("lacking,members", [
    ("label", [("a.jpg", b"\xff\xd8a"), ("a.cls", b"3"), ("b.png", b"\x89PNGb")]),
    ("image", [("a.jpg", b"\xff\xd8a"), ("a.cls", b"3"), ("b.cls", b"7"), ("c.jpg", b"\xff\xd8c"), ("c.cls", b"1")]),
])
def test_a_sample_the_converters_cannot_carry_is_an_error_naming_shard_and_member(tmp_path, lacking, members):
    from dalistream.errors import SampleError
    from dalistream.tools.bench.converted import shard_samples

    path = str(tmp_path / "shard.tar")
    write_tar(path, members)
    with pytest.raises(SampleError) as e:
        list(shard_samples(path, {}))
    assert e.value.url == path and e.value.member == "b" and f"no {lacking}" in str(e.value)
    write_tar(path, [m for m in members if not m[0].startswith("b.")])  # without it, every sample in order
    assert [label for _, label in shard_samples(path, {})] == [int(d) for n, d in members if n.endswith(".cls") and not n.startswith("b.")]
