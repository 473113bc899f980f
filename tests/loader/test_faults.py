"""Worker failures: a DALI worker killed by a signal is a WorkerError within seconds, not a hang;
Ctrl-C leaves no process and no shared memory behind."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dalistream import Loader, Stream, WorkerError
from dalistream.io.streams import open_shard

from helpers import REPO as ROOT, key_shards, shm_mapped

pytestmark = [pytest.mark.dali, pytest.mark.slow]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("faults"))
    key_shards(d, [20, 20, 20, 20])
    return d


def _stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[2])  # state, parent, process group


def _processes(match):
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                state, parent, group = _stat(pid)
            except (OSError, IndexError, ValueError):
                continue
            if state != "Z" and match(int(pid), parent, group):
                out.add(int(pid))
    return out


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def dali_workers():
    """Child processes of this test process: DALI workers once those before the loader are taken
    away (forked ones carry pytest's command line; multiprocessing's resource tracker is not one)."""
    me = os.getpid()
    return {p for p in _processes(lambda pid, parent, group: parent == me) if "resource_tracker" not in _cmdline(p)}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_killed_worker_is_a_worker_error_within_seconds(shards, start_method):
    stream = Stream.open(shards, fields={"key": "__key__"}, batch_size=4, workers=2, device="cpu", policy="fixed",
                         batches_per_epoch=10**6, start_method=start_method)
    before = dali_workers()
    loader = Loader(stream)
    outcome = {}
    started = threading.Event()

    def train():
        try:
            for i, _ in enumerate(loader):
                if i == 2:
                    started.set()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome["error"], outcome["at"] = e, time.monotonic()
        finally:
            started.set()

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        assert started.wait(120), "the loader did not start"
        workers = sorted(dali_workers() - before)
        assert len(workers) == 2
        victim = workers[-1]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)  # what the OOM killer does
        thread.join(30)
        assert not thread.is_alive(), "a killed worker made the loader hang"
        error = outcome["error"]
        detected = outcome["at"] - killed_at
        print(f"killed worker detected after {detected:.2f} s")
        assert isinstance(error, WorkerError) and detected < 10
        assert f"(pid {victim}) was killed by signal SIGKILL" in str(error)
        assert error.rank == 0 and error.worker in (0, 1) and "out-of-memory" in str(error)
        assert dali_workers() - before == set()  # the failed pipeline is gone, its workers too
        batch = next(iter(loader))  # iterating again starts new workers at the current position
        assert len(batch["key"]) == 4
    finally:
        t0 = time.monotonic()
        loader.close()
        assert time.monotonic() - t0 < 20
    assert dali_workers() - before == set()


def _touch_past_a_cut(path, ready, report):
    """A worker's part of ``path`` read as views of its mapping; the file then cut short in place
    (another process rewriting it), and the view read again: past the file's end now. The fault
    handler's report of the crash goes to ``report``, not into the test run's output."""
    import faulthandler

    faulthandler.enable(file=open(report, "w"))  # replaces the handler inherited from pytest (its terminal)
    part = open_shard(path, 0, None)
    view = part.view(10 ** 6)
    with open(path, "r+b") as f:
        f.truncate(0)
    ready.set()
    bytes(view)  # the kernel kills the process here (SIGBUS)


def test_a_worker_killed_by_sigbus_is_told_of_shards_rewritten_in_place(tmp_path):
    """Local shards are read through memory maps: one cut short in place while a worker holds its
    bytes kills the worker with SIGBUS (as DALI's own readers, which map files too); the error
    says what that usually is, and how to replace shards instead."""
    import multiprocessing

    from dalistream.dali.watchdog import _worker_died

    path = key_shards(str(tmp_path), [40])[0]
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    report = tmp_path / "child-stderr.txt"
    child = ctx.Process(target=_touch_past_a_cut, args=(path, ready, str(report)))
    child.start()
    child.join(60)
    assert ready.is_set() and child.exitcode == -signal.SIGBUS
    assert "Fatal Python error: Bus error" in report.read_text() and "_touch_past_a_cut" in report.read_text()
    error = _worker_died([(1, child)])
    assert isinstance(error, WorkerError) and "was killed by signal SIGBUS" in str(error) and error.worker == 1
    assert "rewriting it in place" in str(error) and "renaming it over the old one" in str(error)


def test_a_shutdown_blocked_after_a_worker_died_is_cut_short(shards, monkeypatch):
    """A worker killed while holding a lock the others share can leave DALI's own shutdown
    waiting for them: the error still comes within seconds, and no worker is left."""
    import dalistream.dali.watchdog as watchdog

    real = watchdog.shutdown
    release = threading.Event()

    def blocked(pipe):  # DALI's shutdown, stuck behind a lock a killed worker held
        release.wait(60)
        real(pipe)

    monkeypatch.setattr(watchdog, "shutdown", blocked)
    stream = Stream.open(shards, fields={"key": "__key__"}, batch_size=4, workers=2, device="cpu", policy="fixed",
                         batches_per_epoch=10**6, start_method="fork")
    before = dali_workers()
    loader = Loader(stream)
    try:
        batches = iter(loader)
        next(batches)
        workers = sorted(dali_workers() - before)
        killed_at = time.monotonic()
        os.kill(workers[0], signal.SIGKILL)
        with pytest.raises(WorkerError, match="killed by signal SIGKILL"):
            for _ in batches:
                pass
        assert time.monotonic() - killed_at < watchdog._SHUTDOWN_S  # cut short: the workers were killed instead
        assert dali_workers() - before == set()
    finally:
        release.set()
        monkeypatch.undo()
        loader.close()


def _signal_masks(pid):
    """Each thread of ``pid``: its name and its signal masks (a hung Ctrl-C: was SIGINT, bit 2,
    pending, blocked or ignored?), from ``/proc``."""
    out = []
    for task in sorted(glob.glob(f"/proc/{pid}/task/*/status")):
        try:
            with open(task) as f:
                out.append(" ".join(line.strip() for line in f if line.startswith(("Name", "ShdPnd", "SigPnd",
                                                                                      "SigBlk", "SigIgn", "SigCgt"))))
        except OSError:
            pass
    return "\n".join(out)


SCRIPT = textwrap.dedent("""
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for every thread's stack if it hangs
    sys.path.insert(0, {root!r})
    import dalistream

    if __name__ == "__main__":
        stream = dalistream.Stream.open({shards!r}, fields={{"key": "__key__", "label": "cls"}}, batch_size=4,
                                        workers=2, device="cpu", policy="fixed", batches_per_epoch=10**6,
                                        start_method={start_method!r})
        loader = dalistream.Loader(stream)   # no `with`: Ctrl-C alone must clean up
        for i, batch in enumerate(loader):
            if i == 3:
                print("running", flush=True)
                if {raise_in_body!r} and sys.stdin.readline():  # the test's go-ahead
                    raise KeyboardInterrupt  # lands outside the loader: it is closed at exit
""")


@pytest.mark.parametrize("target,start_method", [("process", "spawn"), ("group", "spawn"), ("loop-body", "spawn"),
                                                 ("process", "fork"), ("group", "fork")])
def test_ctrl_c_leaves_no_processes_and_no_shared_memory(shards, tmp_path, target, start_method):
    """SIGINT to the training process alone, or to its whole process group (a terminal's Ctrl-C),
    or a KeyboardInterrupt in the training step, outside the loader (the loader, never closed,
    is then shut down at interpreter exit: this once hung in Thread.start())."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=ROOT, shards=shards, raise_in_body=target == "loop-body",
                                    start_method=start_method))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,  # its own process group
                            # as from a terminal: SIGINT at its default (a test run started in the
                            # background inherits it ignored, and Python then never raises KeyboardInterrupt)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "running", proc.stderr.read()
        tree = _processes(lambda pid, parent, group: group == proc.pid) | {proc.pid}
        assert len(tree) >= 3  # the script and its two DALI workers (and multiprocessing's tracker)
        shm = shm_mapped(tree)
        if start_method == "spawn":  # forked pools unlink their semaphores at once
            assert shm, "expected the multiprocessing semaphores of the DALI worker pool"
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        elif target == "process":
            os.kill(proc.pid, signal.SIGINT)
        else:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:  # say where it hangs: every thread's Python stack, and its signal masks
            masks = _signal_masks(proc.pid)
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the script did not exit within 60 s of the interrupt; its threads' signal masks "
                        f"(pending, blocked, ignored, caught):\n{masks}\nits threads:\n{proc.stderr.read()[-8000:]}")
        stderr = proc.stderr.read()
        assert "KeyboardInterrupt" in stderr
        if target == "group":  # every process got it; one says so (the workers leave it to the main process)
            assert stderr.count("Traceback (most recent call last)") <= 1, stderr[-4000:]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _processes(lambda pid, parent, group: group == proc.pid or parent == proc.pid):
            time.sleep(0.1)
        assert _processes(lambda pid, parent, group: group == proc.pid or parent == proc.pid) == set()
        assert {p for p in shm if os.path.exists(p)} == set()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
