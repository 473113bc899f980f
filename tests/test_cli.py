"""The command line, run as users run it: subprocesses, real shards, real DALI pipelines."""

import json
import os
import subprocess
import sys

import pytest

from helpers import key_shards, shard_keys, uneven_sizes

SIZES = uneven_sizes(9, seed=4, low=3, high=20)


def cli(*args, env=None, check=True):
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "dalistream", *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"dalistream {args} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def json_lines(proc, stats=False):
    """The JSON lines printed; without the closing ``{"stats": …}`` line unless ``stats``."""
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return lines if stats else [line for line in lines if "stats" not in line]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("cli"))
    key_shards(d, SIZES)
    return d


def all_keys():
    return shard_keys(SIZES)


def test_help_lists_every_command():
    out = cli("--help").stdout
    for command in ("synth", "plan", "index", "keys"):
        assert command in out


@pytest.mark.slow
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


def test_plan_with_node_affinity_reports_its_mixing_and_the_cache_kept():
    out = json.loads(cli("plan", "--counts", "64:100", "--world-size", 8, "-B", 16, "--affinity", "node", "--nodes", 4,
                         "--shuffle-quality", "--classes", 64, "--from-nodes", 2, "--json").stdout)
    (summary,) = out["affinity"]
    assert summary["nodes"] == 4 and summary["shards_per_node"] == {"min": 16, "max": 16}
    (quality,) = out["shuffle_quality"]
    assert quality["affinity"]["nodes"] == 4 and quality["plain"]["order"]["global_batch"]["distinct"] == 64
    assert out["cache_kept"]["per_node"] == [1.0, 1.0, 0.0, 0.0]  # nodes 2 and 3 start cold
    bad = cli("plan", "--counts", "64:100", "--world-size", 8, "-B", 16, "--affinity", "node", "--nodes", 3,
              check=False)
    assert bad.returncode != 0 and "dividing the world size 8" in bad.stderr


@pytest.mark.slow
def test_keys_with_buckets_prints_each_batch_s_bucket(tmp_path):
    from helpers import length_shards

    lengths = length_shards(str(tmp_path / "d"), [9, 14, 6], seed=3)
    keys = []
    for rank in range(2):
        lines = json_lines(cli("keys", tmp_path / "d", "--rank", rank, "--world-size", 2, "-W", 2, "-B", 4,
                               "--policy", "exact", "--buckets", "length:txt:20,40", "--json",
                               env={"DALISTREAM_CACHE": str(tmp_path / "cache")}))
        for line in lines:
            assert {sum(lengths[k] > e for e in (20, 40)) for k in line["keys"]} <= {line["bucket"]}
            keys += line["keys"]
    assert sorted(keys) == sorted(lengths)
    text = cli("keys", tmp_path / "d", "-B", 4, "--buckets", "length:txt:20,40", "--stop-after", 1,
               env={"DALISTREAM_CACHE": str(tmp_path / "cache")}).stdout
    assert text.startswith("rank 0 epoch 0 step 0 bucket ")
    failed = cli("keys", tmp_path / "d", "-B", 4, "--buckets", "length:txt:20,40", "--policy", "fixed",
                 "--batches-per-epoch", 2, check=False)
    assert failed.returncode == 2 and "policy 'even' or 'exact'" in failed.stderr and "--policy even" in failed.stderr


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


# -- what a new user meets: --version, --help, options, human output ------------------------------------

def parse(*args):
    from dalistream.cli import build_parser

    return build_parser().parse_args([str(a) for a in args])


def subcommands():
    import argparse

    from dalistream.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, action.choices


def test_version_names_the_package_version(capsys):
    import dalistream
    from dalistream.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"dalistream {dalistream.__version__}"
    assert cli("--version").stdout.strip() == f"dalistream {dalistream.__version__}"


def test_every_option_has_help_and_help_shows_the_defaults():
    import argparse

    parser, commands = subcommands()
    assert set(commands) >= {"synth", "plan", "index", "keys", "bench", "demo"}
    for name, command in [("dalistream", parser), *commands.items()]:
        text = command.format_help()
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help text"
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                shown = f"(default: {action.default})"
                assert shown in " ".join(text.split()), f"{name} --help does not show {shown} for {action.option_strings}"
    keys_help = " ".join(commands["keys"].format_help().split())
    assert "(default: 32)" in keys_help and "(default: even)" in keys_help and "(default: raise)" in keys_help
    assert "(default: None)" not in keys_help and "(default: False)" not in keys_help


@pytest.mark.parametrize("option", [["--workers", "2"], ["-W", "3"], ["--rank", "1"], ["--epoch", "1"],
                                    ["--start-method", "spawn"], ["--world-size", "2"], ["--batch-size", "8"]])
def test_index_refuses_the_loader_options_it_would_ignore(option, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("index", "shards/", *option)
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_index_keeps_its_own_options():
    args = parse("index", "a.tar", "b.tar", "--on-error", "skip", "--endpoint-url", "http://minio:9000",
                 "--profile", "lab", "-o", "m.json", "--offsets", "--json")
    assert (args.sources, args.on_error, args.output, args.offsets, args.json) == (["a.tar", "b.tar"], "skip", "m.json",
                                                                                   True, True)
    for command in ("plan", "keys", "bench"):  # the loader options stay where they are used
        args = parse(command, "a.tar", "--workers", 3, "--rank", 0, "--epoch", 2, "--start-method", "spawn")
        assert (args.workers, args.epoch, args.start_method) == (3, 2, "spawn")


@pytest.mark.parametrize("argv, level", [
    (["index", "x.tar"], "WARNING"),
    (["--log-level", "error", "index", "x.tar"], "ERROR"),
    (["index", "x.tar", "--log-level", "debug"], "DEBUG"),
    (["keys", "x.tar", "--log-level", "Info", "-B", "4"], "INFO"),
    (["--log-level", "critical", "synth", "out", "--log-level", "warning"], "WARNING"),  # the last one given wins
])
def test_log_level_before_or_after_the_command(argv, level, monkeypatch):
    monkeypatch.delenv("DALISTREAM_LOG", raising=False)
    assert parse(*argv).log_level == level


@pytest.mark.parametrize("argv", [["--log-level", "verbose", "index", "x.tar"], ["index", "x.tar", "--log-level", "loud"],
                                  ["synth", "out", "--log-level", "10"]])
def test_log_level_refuses_what_is_no_level(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_log_level_from_the_environment_is_checked_too(tmp_path, monkeypatch, capsys):
    from dalistream.cli import main

    monkeypatch.setenv("DALISTREAM_LOG", "debug")
    assert parse("index", "x.tar").log_level == "DEBUG"
    monkeypatch.setenv("DALISTREAM_LOG", "verbose")
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", str(tmp_path / "out"), "--shards", "1", "--samples-per-shard", "1"])
    assert exit_info.value.code == 2 and "DALISTREAM_LOG='verbose' is not a logging level" in capsys.readouterr().err


@pytest.mark.parametrize("spec", [(3, 5, False), (2, 7, True)])
def test_synth_says_how_many_samples_and_shards(spec, tmp_path, capsys):
    from dalistream.cli import main

    shards, per_shard, uneven = spec
    out = tmp_path / "ds"
    assert main(["synth", str(out), "--shards", str(shards), "--samples-per-shard", str(per_shard)]
                + (["--uneven", "--seed", "3"] if uneven else [])) == 0
    line = capsys.readouterr().out.strip()
    assert main(["index", str(out), "--json"]) == 0
    total = json.loads(capsys.readouterr().out)["samples"]
    if not uneven:
        assert total == shards * per_shard
    assert line == f"wrote {total} samples in {shards} shards to {out}"
    assert main(["synth", str(tmp_path / "again"), "--shards", str(shards), "--samples-per-shard", str(per_shard),
                 "--json"] + (["--uneven", "--seed", "3"] if uneven else [])) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["samples"] == total == sum(payload["samples_per_shard"]) and len(payload["shards"]) == shards


@pytest.mark.parametrize("extra", [[], ["--on-error", "skip"], ["--offsets"]])
def test_index_output_says_what_it_wrote(extra, shards, tmp_path, capsys):
    from dalistream.cli import main

    target = tmp_path / "sub" / "manifest.json"
    target.parent.mkdir()
    assert main(["index", shards, "-o", str(target), *extra]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"wrote manifest {target} ({len(SIZES)} shards, {sum(SIZES)} samples)"
    assert len(json.load(open(target))["shards"]) == len(SIZES)
    assert main(["index", shards, "-o", "-", *extra]) == 0  # nothing written: nothing said about it
    assert "wrote" not in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.dali
def test_keys_prints_people_text_without_json(shards):
    import re

    base = [shards, "-W", 2, "-B", 5, "--policy", "exact", "--seed", 3]
    text = cli("keys", *base)
    lines = text.stdout.splitlines()
    pattern = re.compile(r"^rank 0 epoch 0 step (\d+): (\S+(?: \S+)*)$")
    matches = [pattern.match(line) for line in lines]
    assert lines and all(matches), lines[:3]
    for line in lines:
        with pytest.raises(ValueError):
            json.loads(line)
    *as_json, closing = json_lines(cli("keys", *base, "--json"), stats=True)
    assert closing["stats"]["delivered"] == len(all_keys()) and closing["stats"]["batches"] == len(as_json)
    assert [int(m.group(1)) for m in matches] == [line["step"] for line in as_json]
    assert [m.group(2).split(" ") for m in matches] == [line["keys"] for line in as_json]
    assert sorted(k for m in matches for k in m.group(2).split(" ")) == all_keys()
    assert re.search(rf"^stats \(rank 0 of 1\): {len(all_keys())} samples delivered in {len(lines)} batches; "
                     rf"{len(all_keys())} samples read, 0 of them ahead of the batches taken; \d+ padding positions, "
                     r"0 samples left out by the plan", text.stderr, re.M)


def test_index_writes_member_layouts_unless_told_not_to(shards, tmp_path):
    from dalistream.cli import main

    target = tmp_path / "m.json"
    assert main(["index", shards, "-o", str(target)]) == 0
    rows = json.load(open(target))["shards"]
    assert all("members" in r and "offsets" in r for r in rows if r["samples"])
    assert main(["index", shards, "-o", str(target), "--no-members"]) == 0
    rows = json.load(open(target))["shards"]
    assert not any("members" in r for r in rows) and all("offsets" in r for r in rows)
    assert main(["index", shards, "-o", str(target), "--no-offsets"]) == 0  # a layout needs the offsets
    assert not any("members" in r or "offsets" in r for r in json.load(open(target))["shards"])


def test_plan_shuffle_quality_without_data(shards):
    """The issue's setting (64 × 500, 100 classes, 8 × 4 × 32): figures of today's order, in
    text and JSON; a class count changes them; without counts it refuses."""
    args = ("plan", "--counts", "64:500", "--world-size", 8, "-W", 4, "-B", 32, "--shuffle-quality", "--no-detail")
    text = cli(*args, "--shuffle", 1000).stdout
    assert "per rank batch of 32: 14.6" in text and "per global batch of 256: 94.7" in text
    (q,) = json.loads(cli(*args, "--no-interleave", "--shuffle", 0, "--json").stdout)["shuffle_quality"]
    assert q["shuffle"] == 0 and q["classes"] == 100 and q["order"]["rank_batch"]["distinct"] == pytest.approx(4.084)
    assert 27 < q["random"]["rank_batch"]["distinct"] < 28 and q["rank_batch_vs_random"] < 0.2
    (q,) = json.loads(cli(*args, "--json").stdout)["shuffle_quality"]  # the default: interleaved
    assert q["columns"] and q["shuffle"] == 0 and q["order"]["rank_batch"]["distinct"] == pytest.approx(32.0)
    assert q["rank_batch_vs_random"] >= 0.9 and q["global_batch_vs_random"] >= 0.95
    assert "(interleaved, 100 classes" in cli(*args).stdout
    (q,) = json.loads(cli(*args, "--classes", 1000, "--json").stdout)["shuffle_quality"]
    assert q["classes"] == 1000 and q["random"]["rank_batch"]["distinct"] > 30
    proc = cli("plan", shards, "--no-counts", "--shuffle-quality", check=False)
    assert proc.returncode != 0 and "--shuffle-quality needs sample counts" in proc.stderr



@pytest.mark.slow
@pytest.mark.parametrize("stop_after", [1, 3])
def test_keys_stats_add_up_to_the_keys_printed(shards, stop_after):
    """--stop-after K: the stats say how many samples were delivered -- the keys printed -- in text
    and in the closing JSON line (there with --on-error raise too)."""
    base = [shards, "-W", 2, "-B", 4, "--policy", "exact", "--stop-after", stop_after]
    text = cli("keys", *base)
    printed = sum(len(line.split(": ", 1)[1].split(" ")) for line in text.stdout.splitlines())
    assert printed == 4 * stop_after
    assert f"stats (rank 0 of 1): {printed} samples delivered in {stop_after} batches" in text.stderr
    *batches, closing = json_lines(cli("keys", *base, "--json"), stats=True)
    assert len(batches) == stop_after and closing["stats"]["delivered"] == sum(len(b["keys"]) for b in batches)


@pytest.mark.slow
@pytest.mark.parametrize("rank,stop_after", [(1, 2), (0, 2), (1, 1), (1, None)])
def test_keys_stats_add_up_per_rank(shards, rank, stop_after):
    """``RANK=1 WORLD_SIZE=2 dalistream keys … --stop-after 2`` printed "32 samples delivered in 2
    batches; 16 samples read": the counters were read before the workers wrote them. Read =
    delivered + read ahead, for the rank that ran."""
    import re

    env = {"RANK": str(rank), "WORLD_SIZE": "2"}
    base = [shards, "-W", 2, "-B", 4] + ([] if stop_after is None else ["--stop-after", stop_after])
    text = cli("keys", *base, env=env)
    printed = sum(len(line.split(": ", 1)[1].split(" ")) for line in text.stdout.splitlines())
    found = re.search(r"stats \(rank (\d) of 2\): (\d+) samples delivered in (\d+) batches; (\d+) samples read, (\d+) of "
                      r"them ahead", text.stderr)
    assert found, text.stderr
    shown_rank, delivered, batches, read, ahead = map(int, found.groups())
    assert (shown_rank, delivered) == (rank, printed) and batches == len(text.stdout.splitlines())
    assert read == delivered + ahead and read >= delivered
    if stop_after is None:
        assert ahead == 0
    *_, closing = json_lines(cli("keys", *base, "--json", env=env), stats=True)
    stats = closing["stats"]
    assert stats["rank"] == rank and stats["samples"] == stats["delivered"] + stats["read_ahead"]


@pytest.mark.slow
def test_an_error_prints_once_and_its_traceback_only_at_debug(tmp_path):
    missing = str(tmp_path / "nothing-here.tar")
    plain = cli("keys", missing, check=False)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert [line for line in plain.stderr.splitlines() if line.strip()] == [
        line for line in plain.stderr.splitlines() if line.startswith("dalistream keys: error: ")]
    assert plain.stderr.count("no such shard file") == 1
    debug = cli("--log-level", "DEBUG", "keys", missing, check=False)
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("dalistream keys: error: ")


def test_hints_are_spelled_as_flags(tmp_path):
    """The command line's errors name its flags (``--on-error skip``), not the library's keywords
    (``on_error='skip'``), and a hint names values that work."""
    one = str(tmp_path / "one")
    key_shards(one, [1])
    proc = cli("keys", one, "-W", 3, "-B", 3, "--policy", "exact", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "use --workers 1 and a --batch-size of at most 1" in proc.stderr
    assert "batch_size" not in proc.stderr and "workers=" not in proc.stderr
    proc = cli("keys", one, "-B", 4, "--world-size", 3, "--rank", 0, check=False)
    assert proc.returncode == 2 and "--policy exact" in proc.stderr and "policy=" not in proc.stderr


@pytest.mark.parametrize("text,flags", [
    ("or use on_error='skip'", "or use --on-error skip"),
    ("use policy='fixed' with batches_per_epoch", "use --policy fixed with --batches-per-epoch"),
    ("pass interleave=False to read one span", "pass --no-interleave to read one span"),
    ('give samples_per_epoch="1000"', "give --samples-per-epoch 1000"),
    ("shard s3://bucket/a.tar?policy=x&seed=1", "shard s3://bucket/a.tar?policy=x&seed=1"),  # a URL is left alone
    ("raise max_skip_fraction (1 turns it off)", "raise max_skip_fraction (1 turns it off)"),  # no such flag
])
def test_flag_spelling(text, flags):
    from dalistream.tools.args import flag_spelling

    assert flag_spelling(text) == flags
