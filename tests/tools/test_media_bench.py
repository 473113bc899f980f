"""``dalistream bench --pipeline video_clips_train|audio_train`` on a tiny set: every system
(dalistream, its DALI-decode variant, the torch DataLoader with PyAV, DALI's file reader) runs,
reads every clip once per epoch, and reports positive figures in one JSON object. No timing
assertions (the machine is shared): structure, counts and positivity only."""

import json
import os
import subprocess
import sys

import pytest

from helpers import write_tar
from media import make_clip, make_wav

pytestmark = [pytest.mark.dali, pytest.mark.slow]
pytest.importorskip("av")


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("media-bench")
    (root / "video").mkdir()
    (root / "audio").mkdir()
    k = 0
    for s in range(2):
        video, audio = [], []
        for _ in range(5):  # 10 samples: batches of 4 leave a partial last batch
            video += [(f"{k:04d}.webm", make_clip("vp9", 12 + k, size=40, height=32)), (f"{k:04d}.txt", b"a clip")]
            audio += [(f"{k:04d}.wav", make_wav(4000 * (1 + k % 4), rate=16000, channels=1, seed=k))]
            k += 1
        write_tar(str(root / "video" / f"v-{s}.tar"), video)
        write_tar(str(root / "audio" / f"a-{s}.tar"), audio)
    return root


def bench(tmp_path, *args):
    env = dict(os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "dalistream", "bench", *map(str, args), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(proc.stdout.strip().splitlines()) == 1  # the JSON alone on stdout, the table on stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("pipeline,systems", [
    ("video_clips_train", ["dalistream", "dalistream-dali", "torch-pyav", "dali-files"]),
    ("audio_train", ["dalistream", "torch-pyav"])])
def test_every_system_reads_every_clip_and_reports_its_figures(sets, tmp_path, pipeline, systems):
    folder = sets / ("video" if pipeline.startswith("video") else "audio")
    report, table = bench(tmp_path, folder, "--pipeline", pipeline, "--workers", 2, "--batch-size", 4,
                          "--size", 32, "--repeats", 2, "--epochs", 2)
    assert list(report["systems"]) == systems
    for name, figures in report["systems"].items():
        assert figures["runs"] == 2 and figures["samples"] == [20, 20], (name, figures)  # 10 clips, 2 epochs, each run
        assert all(v > 0 for v in figures["samples_per_s_runs"]) and figures["first_batch_s"] > 0
        assert figures["peak_rss_mb"] > 0
        for key in ("steady_cpu_ms_per_sample", "main_cpu_ms_per_sample", "workers_cpu_ms_per_sample"):
            assert figures[key] is None or figures[key] >= 0  # None: a steady phase too short to resolve in ticks
        if name != "dalistream":
            assert figures["ratio"]["samples_per_s"] > 0
        assert name in table
    assert len(report["loadavg_1m"]) == 2 and report["config"]["pipeline"] == pipeline


def test_remote_or_missing_sources_are_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dalistream", "bench", "--pipeline", "audio_train"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "needs shard sources" in proc.stderr
