"""The command line, run as users run it: subprocesses, real shards, real DALI pipelines."""

import json
import os
import subprocess
import sys

import pytest

from helpers import key_shards, uneven_sizes

SIZES = uneven_sizes(9, seed=4, low=3, high=20)


def cli(*args, env=None, check=True):
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "dalistream", *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"dalistream {args} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def json_lines(proc):
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("cli"))
    key_shards(d, SIZES)
    return d


def all_keys():
    return sorted(f"s{s:03d}/{i:05d}" for s, n in enumerate(SIZES) for i in range(n))


def test_help_lists_every_command():
    out = cli("--help").stdout
    for command in ("synth", "plan", "index", "keys"):
        assert command in out


def test_synth_writes_a_dataset_index_counts_it(tmp_path):
    cli("synth", tmp_path / "ds", "--shards", 3, "--samples-per-shard", 5, "--uneven", "--seed", 2)
    shards = sorted(os.listdir(tmp_path / "ds"))
    assert len(shards) == 3
    proc = cli("index", tmp_path / "ds", "-o", tmp_path / "m.json", "--json")
    payload = json.loads(proc.stdout.splitlines()[-1])
    assert payload["samples"] == sum(s["samples"] for s in payload["shards"]) > 0
    assert json.load(open(tmp_path / "m.json"))["format"] == "dalistream-manifest"


def test_plan_json_assigns_every_sample_once(shards):
    payload = json.loads(cli("plan", shards, "--world-size", 2, "--workers", 2, "-B", 6, "--epoch", 1,
                             "--policy", "exact", "--json").stdout)
    owned = [(p["url"], i) for row in payload["plan"] for p in row["parts"] for i in range(p["first"], p["stop"])]
    assert len(owned) == len(set(owned)) == sum(SIZES)
    assert len({row["steps"] for row in payload["plan"]}) == 1
    assert {(row["rank"], row["worker"]) for row in payload["plan"]} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    (epoch,) = payload["epochs"]
    assert epoch["left_out"] == 0 and epoch["padding"] == epoch["steps"] * 12 - sum(SIZES)


def test_plan_at_scale_without_data():
    out = cli("plan", "--counts", "100000:700-1300", "--world-size", 1024, "-W", 8, "-B", 256, "--epochs", 2,
              "--json").stdout
    epochs = json.loads(out)["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1] and all(e["left_out"] < 1024 * 256 for e in epochs)
    assert "plan" not in json.loads(out)  # 8,192 workers: summary only unless --detail


@pytest.mark.dali
@pytest.mark.slow
def test_keys_per_rank_exact_covers_everything_once(shards):
    keys = []
    for rank in range(2):
        lines = json_lines(cli("keys", shards, "--rank", rank, "--world-size", 2, "-W", 2, "-B", 5,
                               "--policy", "exact", "--shuffle", 4, "--json"))
        assert all(line["rank"] == rank for line in lines)
        assert [line["step"] for line in lines] == list(range(len(lines)))
        keys += [k for line in lines for k in line["keys"]]
    assert sorted(keys) == all_keys()


@pytest.mark.dali
@pytest.mark.slow
def test_keys_per_rank_even_equal_full_batches_from_env(shards):
    counts, seen = [], []
    for rank in range(2):
        lines = json_lines(cli("keys", shards, "-W", 2, "-B", 4, "--epoch", 2, "--json",
                               env={"RANK": str(rank), "WORLD_SIZE": "2"}))
        assert all(line["rank"] == rank and len(line["keys"]) == 4 for line in lines)
        counts.append(len(lines))
        seen += [k for line in lines for k in line["keys"]]
    assert counts[0] == counts[1] > 0
    assert len(seen) == len(set(seen))


@pytest.mark.dali
@pytest.mark.slow
def test_keys_resume_from_state_file(shards, tmp_path):
    base = [shards, "-W", 2, "-B", 4, "--shuffle", 6, "--seed", 9, "--policy", "exact", "--json"]
    full = json_lines(cli("keys", *base))
    steps = len(full)
    for k in (0, steps // 2, steps):
        state = tmp_path / f"state-{k}.json"
        first = json_lines(cli("keys", *base, "--stop-after", k, "--state-out", state))
        assert first == full[:k]
        saved = json.load(open(state))
        assert saved["loader"] == {"epoch": 0, "step": k}
        rest = json_lines(cli("keys", *base, "--state-in", state))
        if k < steps:
            assert rest == full[k:]
        else:  # a state saved at the end of an epoch resumes with the next epoch
            assert rest == json_lines(cli("keys", *base, "--epoch", 1))


@pytest.mark.slow
def test_errors_exit_non_zero_and_name_the_source(tmp_path):
    proc = cli("keys", tmp_path / "nothing-*.tar", "--json", check=False)
    assert proc.returncode == 2 and "nothing-*.tar" in proc.stderr
