"""What a loader shows of itself: the progress bar, ``summary()``, the data-wait warning and the
stage it names, every rank's figures in a run folder (``dalistream stats``), and counters that
cannot be written, which never stop a job."""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from dalistream import Loader, Stream
from dalistream.cli import main
from dalistream.loader import progress
from dalistream.loader.progress import STAGES, Watch, likely_stage, rank_file, worker_sums
from dalistream.tools.runstats import rows
from dalistream.worker.stats import WorkerStats, stats_path

from helpers import key_shard_folder

SIZES = [40] * 6  # 240 samples: 30 batches of 8 per epoch on one rank


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return key_shard_folder(tmp_path_factory, "progress", SIZES)


def open_stream(shards, rank=0, world_size=1, **kw):
    return Stream.open(shards, fields={"key": "__key__", "label": "cls"}, batch_size=kw.pop("batch_size", 8),
                       workers=kw.pop("workers", 2), rank=rank, world_size=world_size, device="cpu", seed=3, **kw)


def worker(io_wait_s=0.0, read_s=0.0, batch_s=0.0, wall_s=0.0, **extra):
    return {"io_wait_s": io_wait_s, "read_s": read_s, "batch_s": batch_s, "wall_s": wall_s, **extra}


# -- the stage a wait points at (pure) ------------------------------------------------------------

@pytest.mark.parametrize("after,decodes,stage", [
    (worker(io_wait_s=8, read_s=9, batch_s=0.5, wall_s=10), False, "store"),        # busy, mostly waiting for bytes
    (worker(io_wait_s=6, read_s=9, batch_s=0.5, wall_s=10), True, "store"),         # decode does not matter then
    (worker(io_wait_s=1, read_s=8, batch_s=1, wall_s=10), False, "tar/worker"),     # busy parsing
    (worker(io_wait_s=0, read_s=7, batch_s=0.6, wall_s=10), True, "tar/worker"),    # just over BUSY
    (worker(io_wait_s=0.1, read_s=2, batch_s=0.5, wall_s=10), True, "decode"),      # idle, the graph decodes
    (worker(io_wait_s=0.1, read_s=2, batch_s=0.5, wall_s=10), False, "merge/feed"),  # idle, no decoder
    (worker(io_wait_s=3, read_s=4, batch_s=0.5, wall_s=10), False, "merge/feed"),    # idle though waiting a while
])
def test_likely_stage_from_the_workers_counters(after, decodes, stage):
    before = worker_sums([worker(wall_s=0)])
    found, why = likely_stage(before, worker_sums([after]), decodes)
    assert found == stage and found in STAGES
    assert "%" in why


def test_likely_stage_takes_the_window_not_the_totals():
    """Busy at the start and idle in the window: the window decides."""
    before = worker_sums([worker(io_wait_s=50, read_s=90, wall_s=100)])
    after = worker_sums([worker(io_wait_s=50.1, read_s=91, wall_s=110)])
    assert likely_stage(before, after, decodes=True)[0] == "decode"


def test_no_stage_without_worker_counters():
    assert likely_stage(worker_sums([]), worker_sums([]), True)[0] is None


def test_worker_sums_add_ranks_workers_and_cache_counters_only_where_counted():
    sums = worker_sums([worker(read_s=1, wall_s=2, samples=5, skipped={"samples:bad_image": 2},
                               io={"bytes": 100, "requests": 3}),
                        worker(read_s=2, wall_s=2, samples=7, skipped={"shards:truncated": 1},
                               io={"bytes": 50, "requests": 1, "cache_hits": 4, "cache_bytes": 40})])
    assert (sums["samples"], sums["read_s"], sums["skipped"], sums["remote_bytes"], sums["requests"]) == (12, 3, 3, 150, 4)
    assert (sums["cache_hits"], sums["cache_bytes"], sums["workers"]) == (4, 40, 2)
    assert "cache_hits" not in worker_sums([worker(io={"bytes": 1})])


# -- the warning's window (Watch fed by hand) -----------------------------------------------------

class FakeCounters:
    """Worker counters that grow as a test says: per batch, ``per_batch`` of each."""

    def __init__(self, **per_batch):
        self.per_batch, self.batches = per_batch, 0

    def __call__(self):
        return {"workers": [worker(**{k: v * self.batches for k, v in self.per_batch.items()})]}


def feed(watch, counters, n, wait, step):
    for i in range(n):
        counters.batches += 1
        watch.took(wait, 8, i + 1)
        watch.stepped(step)


@pytest.fixture
def no_min_window(monkeypatch):
    monkeypatch.setattr(progress, "MIN_WINDOW_S", 0.0)


@pytest.mark.parametrize("wait,step,threshold,warned", [
    (0.09, 0.01, 0.5, True), (0.01, 0.09, 0.5, False), (0.06, 0.04, 0.5, True), (0.04, 0.06, 0.5, False),
    (0.06, 0.04, 0.7, False), (0.09, 0.01, None, False)])
def test_wait_warning_once_over_a_window_above_the_threshold(no_min_window, caplog, wait, step, threshold, warned):
    counters = FakeCounters(read_s=0.01, wall_s=0.1)
    watch = Watch(wait_warning=threshold, counters=counters, decodes=lambda: False, window=5)
    watch.started()
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        feed(watch, counters, 40, wait, step)
    said = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said
    assert watch.warned is warned
    if warned:
        assert "likely stage: merge/feed" in said[0] and f"wait_warning={threshold:.0%}" in said[0]


def test_the_first_batch_after_a_start_is_not_judged(no_min_window, caplog):
    """A long first wait (the workers' start) followed by a loop that waits little: no warning."""
    counters = FakeCounters(read_s=0.01, wall_s=0.1)
    watch = Watch(counters=counters, window=5)
    watch.started()
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        counters.batches += 1
        watch.took(30.0, 8, 1)
        watch.stepped(0.1)
        feed(watch, counters, 20, 0.01, 0.1)
    assert not watch.warned and not caplog.records
    assert watch.figures()["wait_s"] == pytest.approx(30.2)


def test_the_warning_names_the_stage_from_the_windows_counters(no_min_window, caplog):
    counters = FakeCounters(io_wait_s=0.08, read_s=0.09, wall_s=0.1)
    watch = Watch(counters=counters, decodes=lambda: True, window=5)
    watch.started()
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        feed(watch, counters, 12, 0.1, 0.01)
    (record,) = caplog.records
    assert "likely stage: store" in record.getMessage()


def epoch_sums(skipped_samples=0, skipped_shards=0, **io):
    return {"skipped_samples": skipped_samples, "skipped_shards": skipped_shards, "io": io}


def test_figures_and_summary_line_per_epoch_and_rank():
    """The figures in all and per epoch; ``summary`` says one rank's one epoch (the ``set_epoch``
    number): two ranks never print the same-looking line, and a finished epoch's line holds only
    that epoch's samples, skips and bytes."""
    watch = Watch(counters=dict)
    watch.epoch(2, 4, 3, 0, 10)
    for i in range(4):
        watch.took(0.25, 8 if i < 3 else 0, i + 1, empty=i == 3)
        watch.stepped(0.75)
    f = watch.figures()
    assert (f["batches"], f["empty_batches"], f["samples"], f["wait_s"], f["step_s"]) == (4, 1, 24, 1.0, 3.0)
    assert f["samples_per_s"] == 6.0 and f["wait_share"] == 0.25
    assert f["by_epoch"][3]["batches"] == 4 and f["by_epoch"][3]["empty_batches"] == 1
    stats = {"by_epoch": {3: epoch_sums(3, 1, requests=4, bytes=2_500_000),
                          4: epoch_sums(9, 9, requests=1, bytes=870_000)}}  # epoch 4: read ahead, not entered
    line = watch.summary(stats, 3)
    assert line.startswith("rank 2, epoch 3 (step 4 of 10 so far): 24 samples in 4 batches (1 empty), 6.0 samples/s, "
                           "data wait 25%")
    assert "3 samples and 1 shards skipped" in line and line.endswith("2.5 MB from the store")
    watch.epoch(2, 4, 4, 0, 2)
    for i in range(2):
        watch.took(0.5, 8, i + 1)
        watch.stepped(0.5)
    stats["by_epoch"][4] = epoch_sums(requests=1, bytes=0, cache_hits=7, cache_misses=0, cache_bytes=7_400_000)
    line = watch.summary(stats, 4)
    assert line == ("rank 2, epoch 4: 16 samples in 2 batches, 8.0 samples/s, data wait 50% of the loop's time, "
                    "0 samples and 0 shards skipped, 0 B from the store, 7.4 MB from the cache")
    assert watch.summary(stats, 3).startswith("rank 2, epoch 3: 24 samples in 4 batches (1 empty)")  # ended at 4
    local = watch.summary({"by_epoch": {4: epoch_sums(requests=0, bytes=0)}}, 4)
    assert local.endswith("0 samples and 0 shards skipped")  # local shards: no store named
    assert watch.summary({}, 7).startswith("rank 2, epoch 7: 0 samples in 0 batches")  # no such epoch: zeros


def test_watch_refuses_a_bad_progress_or_threshold():
    for bad in ({"progress": "yes"}, {"wait_warning": 0}, {"wait_warning": 1.5}):
        with pytest.raises(ValueError):
            Watch(counters=dict, **bad)


# -- counters that cannot be written: one warning, never an error ----------------------------------

def break_folder(tmp_path, how):
    folder = tmp_path / "stats"
    folder.mkdir()
    path = stats_path(str(folder), 0)
    if how == "removed":
        shutil.rmtree(folder)
    elif how == "a file":
        shutil.rmtree(folder)
        folder.write_text("not a folder")
    elif how == "target a folder":
        os.mkdir(path)
    return folder, path


@pytest.mark.parametrize("how", ["removed", "a file", "target a folder"])
def test_worker_counters_that_cannot_be_written_are_one_warning(tmp_path, caplog, how):
    folder, path = break_folder(tmp_path, how)
    stats = WorkerStats(path, rank=1, worker=0)
    with caplog.at_level(logging.WARNING, logger="dalistream.worker.stats"):
        for _ in range(3):
            stats.add(samples=4)
            stats.write()
    assert len(caplog.records) == 1 and "counters not written" in caplog.records[0].getMessage()
    assert not [p for p in (os.listdir(folder) if folder.is_dir() else []) if p.endswith(".tmp")]
    if how == "removed":  # the folder back: the next write succeeds
        folder.mkdir()
        stats.write()
        with open(path) as f:
            assert json.load(f)["samples"] == 12


@pytest.mark.parametrize("how", ["removed-parent", "a file"])
def test_rank_figures_that_cannot_be_written_are_one_warning(tmp_path, caplog, how):
    run_dir = tmp_path / "run"
    if how == "a file":
        run_dir.write_text("x")
    else:
        run_dir = tmp_path / "gone" / "run"
        (tmp_path / "gone").write_text("a file where a folder should be")
    watch = Watch(run_dir=str(run_dir), counters=lambda: {"workers": []})
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        for _ in range(3):
            watch.publish()
    assert len(caplog.records) == 1 and "not written to the run folder" in caplog.records[0].getMessage()


# -- real loaders ----------------------------------------------------------------------------------

@pytest.mark.dali
def test_progress_bar_on_rank_zero_only_by_default(shards, capsys):
    shown = {}
    for rank, progress_arg in ((0, True), (1, True), (1, "all"), (0, False)):
        with Loader(open_stream(shards, rank, 2), progress=progress_arg) as loader:
            batches = sum(1 for _ in loader)
        shown[(rank, progress_arg)] = capsys.readouterr().err
        assert batches == len(SIZES) * 40 // 16
    lines = shown[(0, True)].splitlines()  # stderr is no terminal here: plain lines, no bar
    assert lines[-1].startswith(f"rank 0 epoch 0 done: {batches}/{batches} batches in 0:")
    assert "samples/s" in lines[-1] and "wait" in lines[-1] and "\r" not in shown[(0, True)]
    assert shown[(1, True)] == "" and shown[(0, False)] == ""
    assert shown[(1, "all")].splitlines()[-1].startswith(f"rank 1 epoch 0 done: {batches}/{batches} batches")


class Clock:
    """Seconds that pass only when told: an epoch of hours in no time."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def run_epoch(watch, clock, steps, seconds_per_batch, rank=0, epoch=0, stop=None):
    watch.epoch(rank, 8, epoch, 0, steps)
    for i in range(stop or steps):
        clock.now += seconds_per_batch * 0.1
        watch.took(seconds_per_batch * 0.1, 32, i + 1)
        clock.now += seconds_per_batch * 0.9
        watch.stepped(seconds_per_batch * 0.9)
    watch.ended()


@pytest.mark.parametrize("steps, seconds_per_batch, most", [
    (100_000, 0.36, 21),   # 10 hours: a line every 5% (30 min), and the end's
    (2_000, 0.9, 21),      # 30 minutes: every 5% (90 s)
    (600, 0.5, 11),        # 5 minutes: every 30 s (5% is 15 s)
    (200, 0.05, 1),        # 10 seconds: only the end's
    (12, 300.0, 13),       # an hour of 12 long batches: one per batch, the end's
])
@pytest.mark.parametrize("into", ["file", "pipe"])
def test_progress_into_a_file_or_pipe_is_a_few_plain_lines(tmp_path, steps, seconds_per_batch, most, into):
    """Not a terminal (a Slurm job's stderr in a file, or a pipe): a line per LINE_S seconds and
    LINE_SHARE of the epoch at most, each naming the rank and the epoch, and the end's; never a
    redrawn bar (a 10-hour job wrote ~26 MB of bar per rank)."""
    clock = Clock()
    if into == "file":
        out = open(tmp_path / "log", "w")
    else:
        read_end, write_end = os.pipe()
        out = os.fdopen(write_end, "w")
    watch = Watch(progress="all", counters=dict, file=out, clock=clock)
    run_epoch(watch, clock, steps, seconds_per_batch, rank=3, epoch=7)
    out.close()
    if into == "file":
        text = (tmp_path / "log").read_text()
    else:
        with os.fdopen(read_end) as f:
            text = f.read()
    lines = text.splitlines()
    assert 1 <= len(lines) <= most and "\r" not in text and len(text) < 200 * most
    assert all(line.startswith("rank 3 epoch 7") for line in lines)
    assert lines[-1].startswith(f"rank 3 epoch 7 done: {steps}/{steps} batches in ")
    assert "samples/s" in lines[-1] and "wait 10%" in lines[-1]
    done = [int(line.split(": ")[1].split("/")[0]) for line in lines[:-1]]
    assert done == sorted(done) and all(b - a >= progress.LINE_SHARE * steps for a, b in zip([0] + done, done))
    if steps * seconds_per_batch >= 3600:  # long: the lines come, spread over the epoch
        assert len(lines) >= min(most, 12)


def test_progress_lines_say_where_an_epoch_broke_off(tmp_path):
    clock = Clock()
    with open(tmp_path / "log", "w") as out:
        watch = Watch(progress=True, counters=dict, file=out, clock=clock)
        run_epoch(watch, clock, 1000, 1.0, rank=0, epoch=2, stop=400)
        run_epoch(watch, clock, 1000, 1.0, rank=0, epoch=3)
    lines = (tmp_path / "log").read_text().splitlines()
    assert [line for line in lines if "stopped" in line] == [lines[lines.index(next(
        line for line in lines if line.startswith("rank 0 epoch 2 stopped")))]]
    stopped = next(line for line in lines if "stopped" in line)
    assert stopped.startswith("rank 0 epoch 2 stopped: 400/1000 batches in 0:06:40")
    assert lines[-1].startswith("rank 0 epoch 3 done: 1000/1000 batches in 0:16:40")


def test_progress_on_a_terminal_is_a_bar(tmp_path):
    """A terminal (a pseudo-terminal here) gets tqdm's bar, redrawn in place."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 wide
    out = os.fdopen(slave, "w")
    clock = Clock()
    watch = Watch(progress=True, counters=dict, file=out, clock=clock)
    run_epoch(watch, clock, 50, 0.1)
    out.close()  # all of it written: the master reads it to the end (EIO once drained)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    text = b"".join(chunks).decode()
    assert "\r" in text and "epoch 0" in text and "50/50" in text and "rank 0 epoch 0 done" not in text


@pytest.mark.dali
@pytest.mark.slow
def test_a_loader_dropped_without_close_is_freed_at_once(shards, tmp_path):
    """The loader's figures refer back to it without a reference cycle: dropped, it is closed by
    ``__del__`` at once, not at the next garbage collection (a script of its own: pytest's log
    capture keeps tracebacks, and with them the loader's frames)."""
    script = tmp_path / "drop.py"
    script.write_text(textwrap.dedent(f"""
        import gc, weakref
        import dalistream
        gc.disable()
        # the first: a warm-up (the first pipeline built in a process imports modules whose import
        # machinery's frames stay referenced, and with them that first loader)
        for progress, stats_dir in ((False, None), (False, None), (True, None), (True, {str(tmp_path / "run")!r})):
            stream = dalistream.Stream.open({shards!r}, fields={{"key": "__key__"}}, batch_size=8, workers=2,
                                            device="cpu", rank=0, world_size=1)
            loader = dalistream.Loader(stream, progress=progress, stats_dir=stats_dir)
            batches = iter(loader)
            next(batches)
            del batches
            ref = weakref.ref(loader)
            del loader
            print(ref() is None)
    """))
    env = dict(os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[1:] == ["True", "True", "True"]


@pytest.mark.dali
def test_summary_counts_what_the_loop_took(shards):
    with Loader(open_stream(shards)) as loader:
        samples = sum(len(batch["key"]) for _ in range(2) for batch in loader)
        line = loader.summary()
        figures = loader.stats()["loader"]
    assert figures["samples"] == samples == 2 * 240 and figures["batches"] == 60
    assert line.startswith("rank 0, epoch 1: 240 samples in 30 batches, ")
    assert "samples/s, data wait" in line and "0 samples and 0 shards skipped" in line


@pytest.mark.dali
@pytest.mark.slow
def test_a_loop_that_only_waits_is_warned_once_with_a_stage(shards, caplog):
    """An empty training loop waits for data all its time: one warning, naming a stage."""
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        with Loader(open_stream(shards), wait_warning=0.5) as loader:
            loader._watch.window = 10
            for _ in range(200):  # until the window has lasted MIN_WINDOW_S, whatever the machine's speed
                for _ in loader:
                    pass
                if loader._watch.warned:
                    break
            for _ in loader:  # an epoch more: no second warning
                pass
    said = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(said) == 1
    assert "likely stage: merge/feed" in said[0] or "likely stage: tar/worker" in said[0]


@pytest.mark.dali
def test_every_rank_writes_its_figures_and_stats_shows_them_side_by_side(shards, tmp_path, capsys):
    run_dir = tmp_path / "run"
    for rank in range(3):
        with Loader(open_stream(shards, rank, 3, batch_size=4), stats_dir=str(run_dir)) as loader:
            for _ in loader:
                pass
    assert sorted(os.listdir(run_dir)) == [os.path.basename(rank_file(str(run_dir), r)) for r in range(3)]
    with open(rank_file(str(run_dir), 1)) as f:
        doc = json.load(f)
    assert (doc["rank"], doc["world_size"], doc["epoch"], doc["step"], doc["steps"]) == (1, 3, 0, 20, 20)
    assert doc["loader"]["samples"] == 80 and doc["workers"]["samples"] > 0 and doc["workers"]["workers"] == 2
    assert main(["stats", str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["rank", "host"] and [line.split()[0] for line in out[1:]] == ["0", "1", "2"]
    assert main(["stats", str(run_dir), "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in parsed["ranks"]] == [0, 1, 2] and all(r["samples"] == 80 for r in parsed["ranks"])


def test_stats_marks_the_slow_rank(tmp_path, capsys):
    for rank, rate in enumerate([1000.0, 980.0, 400.0, 1010.0]):
        doc = {"rank": rank, "world_size": 5, "host": f"node{rank}", "time": 0, "epoch": 0, "step": 3, "steps": 9,
               "loader": {"samples": 24, "samples_per_s": rate, "wait_share": 0.1},
               "workers": {"read_s": 1, "batch_s": 0, "wall_s": 4, "io_wait_s": 0.5, "remote_bytes": 2e6}}
        (tmp_path / f"rank-{rank:05d}.json").write_text(json.dumps(doc))
    assert [r["slow"] for r in rows(json.loads(json.dumps([json.loads((tmp_path / f"rank-{r:05d}.json").read_text())
                                                          for r in range(4)])), now=10)] == [False, False, True, False]
    assert main(["stats", str(tmp_path)]) == 1  # rank 4 of 5 wrote nothing
    said = capsys.readouterr()
    out = said.out.splitlines()
    assert "<- slow" in out[3] and not any("<- slow" in line for line in out[:3] + out[4:5])
    assert len(out) == 5 and "25%" in out[1] and "12%" in out[1]  # workers busy 1/4, io wait 0.5/4
    assert said.err.splitlines() == [f"dalistream stats: {tmp_path / 'rank-00004.json'}: missing: rank 4 of 5 wrote no "
                                     "figures"]


def rank_doc(rank, world):
    return {"rank": rank, "world_size": world, "host": f"node{rank}", "time": 0, "epoch": 0, "step": 3, "steps": 9,
            "loader": {"samples": 24, "samples_per_s": 100.0, "wait_share": 0.1}, "workers": {}}


@pytest.mark.parametrize("damage, why", [
    (lambda text: text[:len(text) // 2], "cut short or not JSON"),
    (lambda text: text[:1], "cut short or not JSON"),
    (lambda text: "", "empty (0 bytes)"),
    (lambda text: "not json at all", "cut short or not JSON"),
    (lambda text: "[1, 2, 3]", "not a rank's figures"),
    (lambda text: '{"epoch": 3}', "not a rank's figures"),
    (None, "missing: rank"),
])
@pytest.mark.parametrize("world, bad", [(2, 1), (3, 0), (4, 2)])
def test_stats_names_every_rank_file_it_cannot_read(tmp_path, capsys, damage, why, world, bad):
    """A rank file cut short, empty, not JSON, not a rank's, or missing: the other ranks are shown,
    the file is named with why, and the exit status is 1 (table and --json alike)."""
    for rank in range(world):
        text = json.dumps(rank_doc(rank, world))
        path = tmp_path / f"rank-{rank:05d}.json"
        if rank != bad:
            path.write_text(text)
        elif damage is not None:
            path.write_text(damage(text))
    named = str(tmp_path / f"rank-{bad:05d}.json")
    assert main(["stats", str(tmp_path)]) == 1
    said = capsys.readouterr()
    assert [line.split()[0] for line in said.out.splitlines()[1:]] == [str(r) for r in range(world) if r != bad]
    (line,) = said.err.splitlines()
    assert line.startswith(f"dalistream stats: {named}: ") and why in line
    assert main(["stats", str(tmp_path), "--json"]) == 1
    parsed = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in parsed["ranks"]] == [r for r in range(world) if r != bad]
    assert len(parsed["problems"]) == 1 and parsed["problems"][0].startswith(named) and why in parsed["problems"][0]


def test_stats_of_every_rank_file_unreadable(tmp_path, capsys):
    for rank in range(2):
        (tmp_path / f"rank-{rank:05d}.json").write_text("")
    assert main(["stats", str(tmp_path)]) == 1
    said = capsys.readouterr()
    assert "no rank has written readable figures" in said.out
    assert [line.split(": ")[1] for line in said.err.splitlines()] == [
        str(tmp_path / f"rank-{r:05d}.json") for r in range(2)]


def test_stats_of_a_whole_run_exits_0(tmp_path, capsys):
    for rank in range(3):
        (tmp_path / f"rank-{rank:05d}.json").write_text(json.dumps(rank_doc(rank, 3)))
    assert main(["stats", str(tmp_path)]) == 0
    said = capsys.readouterr()
    assert said.err == "" and len(said.out.splitlines()) == 4


def test_stats_of_a_missing_folder_is_an_error(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


@pytest.mark.dali
@pytest.mark.slow
@pytest.mark.parametrize("how", ["removed", "a file"])
def test_a_stats_folder_removed_mid_epoch_does_not_stop_the_epoch(shards, tmp_path, how):
    """The temp folder the workers write their counters to, removed (or replaced) under a running
    loader: the epoch ends with every batch, and each worker says so once."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import os, shutil, sys
        import dalistream
        stream = dalistream.Stream.open({shards!r}, fields={{"key": "__key__"}}, batch_size=4, workers=2,
                                        device="cpu", rank=0, world_size=1)
        with dalistream.Loader(stream) as loader:
            steps, keys = len(loader), []
            for i, batch in enumerate(loader):
                keys += batch["key"]
                if i == 2:
                    shutil.rmtree(loader._stats_dir)
                    if {how!r} == "a file":
                        open(loader._stats_dir, "w").close()
            print(steps, len(keys), len(set(keys)), loader.summary().split(":")[0])
            folder = loader._stats_dir
        if os.path.isfile(folder):
            os.remove(folder)
    """))
    env = dict(os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["60", "240", "240", "rank", "0,", "epoch", "0"]
    warned = [line for line in done.stderr.splitlines() if "counters not written" in line]
    assert 1 <= len(warned) <= 2 and "Traceback" not in done.stderr


@pytest.mark.dali
def test_the_graph_says_whether_it_decodes_images(tmp_path):
    """What tells ``decode`` from ``merge/feed``: a ready image pipeline decodes, the raw fields do not."""
    from dalistream.dali.compat import decodes_images
    from dalistream.pipelines import classification_train
    from dalistream.tools.synth import SynthSpec, write_shards

    write_shards(str(tmp_path / "img"), SynthSpec(shards=2, samples_per_shard=16))
    with classification_train.loader(str(tmp_path / "img"), batch_size=8, size=32, workers=1, device="cpu") as images:
        next(iter(images))
        assert decodes_images(images._pipe)
    with Loader(Stream.open(str(tmp_path / "img"), fields={"label": "cls"}, batch_size=8, workers=1,
                            device="cpu")) as raw:
        next(iter(raw))
        assert not decodes_images(raw._pipe)
    assert not decodes_images(None)
