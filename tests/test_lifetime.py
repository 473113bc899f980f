"""Nothing outlives its parent: a child that called ``die_with_parent`` ends within seconds of
its parent's death by any signal (the kernel's death signal, and the watch thread alone); a
child started from a thread that ends before the parent does is not killed with the thread;
temporary folders of ended owners are removed by the next run, and no others."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from dalistream import lifetime
from dalistream.lifetime import alive, owner_tag, reclaim_temp_folders, temp_folder

from helpers import REPO

# A parent that starts one child (fork or spawn, from its main thread or from a thread that then
# ends), prints the child's pid, and waits to be killed. The child answers pings on a pipe.
PARENT = textwrap.dedent("""
    import multiprocessing, os, sys, threading, time
    sys.path.insert(0, {repo!r})
    from dalistream.lifetime import die_with_parent

    def child(parent, death_signal, conn):
        die_with_parent(parent, death_signal)
        conn.send("ready")
        while True:
            conn.recv()
            conn.send("pong")

    if __name__ == "__main__":
        context = multiprocessing.get_context({method!r})
        mine, theirs = context.Pipe()
        started = []

        def start():
            p = context.Process(target=child, args=(os.getpid(), {death_signal!r}, theirs), daemon=False)
            p.start()
            started.append(p)
            assert mine.poll(60) and mine.recv() == "ready"  # the thread ends after the child's die_with_parent

        if {from_thread!r}:
            t = threading.Thread(target=start)
            t.start()
            t.join()
            native = t.native_id
            while os.path.exists(f"/proc/self/task/{{native}}"):  # the OS thread itself is gone
                time.sleep(0.01)
        else:
            start()
        theirs.close()  # the child's end is the child's alone: its death is an EOF here
        mine.send("ping")  # the child lives on after the thread that started it ended
        assert mine.poll(60) and mine.recv() == "pong"
        print(started[0].pid, flush=True)
        time.sleep(600)
""")


def _run_parent(tmp_path, method, death_signal, from_thread):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(repo=REPO, method=method, death_signal=death_signal, from_thread=from_thread))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        pytest.fail(f"the parent did not start its child: {line!r} {proc.stderr.read()[-3000:]}")
    return proc, int(line)


def _gone_within(pid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("death_signal", [True, False], ids=["death-signal", "watch-only"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_child_ends_with_its_parent(tmp_path, method, death_signal, sig):
    proc, child = _run_parent(tmp_path, method, death_signal, from_thread=False)
    try:
        assert alive(child)
        os.kill(proc.pid, sig)
        proc.wait(30)
        assert _gone_within(child, 5), f"child {child} outlived its parent by 5 s"
    finally:
        if proc.poll() is None:
            proc.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_started_from_a_thread_that_ended_lives_until_the_parent_dies(tmp_path, method):
    """The kernel's death signal follows the thread that forked: asked for from a thread that
    ended, it kills the child with that thread. The parent script checks the child answers
    after its starting thread is gone; the watch still ends it with the parent."""
    proc, child = _run_parent(tmp_path, method, death_signal=False, from_thread=True)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert _gone_within(child, 5)
    finally:
        if proc.poll() is None:
            proc.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_death_signal_follows_the_thread_that_started_the_child(tmp_path):
    """Why ``death_signal`` is asked for only from the main thread: from a thread that ends, the
    child is killed with the thread (here, the parent script's ping gets no answer)."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(repo=REPO, method="fork", death_signal=True, from_thread=True))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Error" in done.stderr, done.stderr[-2000:]


def _ended_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_next_run_removes_temp_folders_of_ended_owners_only(tmp_path):
    root = str(tmp_path)
    dead = _ended_pid()
    host = owner_tag().rpartition(".")[0]
    left = os.path.join(root, f"dalistream-stats-{host}.{dead}-abc")
    left_write = os.path.join(root, f"dalistream-write-{host}.{dead}-def")
    running = os.path.join(root, f"dalistream-stats-{host}.{os.getppid()}-ghi")  # pytest's parent: alive
    other_host = os.path.join(root, f"dalistream-stats-{'0' * 8 if host != '0' * 8 else '1' * 8}.{dead}-jkl")
    old_style = os.path.join(root, "dalistream-stats-q1w2e3r4")  # named before owners were: unknown owner
    not_ours = os.path.join(root, f"other-stats-{host}.{dead}-mno")
    for folder in (left, left_write, running, other_host, old_style, not_ours):
        os.makedirs(os.path.join(folder, "inner"))
        with open(os.path.join(folder, "inner", "w0.json"), "w") as f:
            f.write("{}")
    made = temp_folder("stats", root)
    assert os.path.basename(made).startswith(f"dalistream-stats-{owner_tag()}-")
    assert sorted(os.listdir(root)) == sorted(os.path.basename(p) for p in (made, running, other_host, old_style,
                                                                             not_ours))
    assert reclaim_temp_folders(root) == []  # its own folder stays


def test_a_zombie_is_not_alive():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # exited, not yet reaped: a zombie
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert not alive(proc.pid)
    proc.wait()
    assert not alive(proc.pid) and alive(os.getpid())


def test_the_loader_stats_folder_names_its_owner(tmp_path, monkeypatch):
    from dalistream import Loader, Stream

    from helpers import key_shards

    key_shards(str(tmp_path / "d"), [4])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.makedirs(tempfile.tempdir)
    dead = _ended_pid()
    left = os.path.join(tempfile.tempdir, f"dalistream-stats-{lifetime.host_tag()}.{dead}-xyz")
    os.makedirs(left)
    stream = Stream.open(str(tmp_path / "d"), fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                         cache_dir=str(tmp_path / "c"))
    loader = Loader(stream)
    try:
        assert os.listdir(tempfile.tempdir) == [os.path.basename(loader._stats_dir)]  # the dead owner's is gone
        assert os.path.basename(loader._stats_dir).startswith(f"dalistream-stats-{owner_tag()}-")
    finally:
        loader.close()
    assert os.listdir(tempfile.tempdir) == []
