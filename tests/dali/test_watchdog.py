"""How DALI's workers are started (the failure handling is in test_faults.py)."""


import pytest

from dalistream import ConfigError, Stream
from dalistream.dali.device import start_method

from helpers import key_shards


def test_auto_forks_cpu_pipelines_and_spawns_gpu_ones():
    assert start_method("auto", "cpu") == "fork"  # no CUDA in this test process
    assert start_method("auto", "gpu") == "spawn"
    assert start_method("spawn", "cpu") == "spawn"
    assert start_method("fork", "gpu") == "fork"  # asked for: DALI itself refuses once CUDA is up
    with pytest.raises(ConfigError, match="start_method"):
        start_method("forkserver", "cpu")


def test_stream_checks_and_shows_the_start_method(tmp_path):
    key_shards(str(tmp_path), [3, 3])
    stream = Stream.open(str(tmp_path), fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                         start_method="spawn", cache_dir=str(tmp_path / "cache"))
    assert stream.start_method == "spawn" and "start_method='spawn'" in repr(stream)
    with pytest.raises(ConfigError, match="start_method"):
        Stream.open(str(tmp_path), fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                    start_method="thread", cache_dir=str(tmp_path / "cache"))


# -- a script without the `if __name__ == "__main__":` guard, workers started with spawn ---------------

import os  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

GUARD = 'if __name__ == "__main__":'


def run_script(path, text, timeout=300):
    path.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                          cwd=str(path.parent), env=dict(os.environ))


def test_where_the_main_script_stands_is_found(tmp_path):
    """The top-level line the script is at, unless an `if` encloses it; None inside the guard."""
    script = tmp_path / "where.py"
    done = run_script(script, """\
        from dalistream.dali.watchdog import unguarded_main_line as at
        print("top", at())
        def helper():
            return at()
        print("call", helper())
        for i in range(1):
            print("loop", at())
        with open(__file__) as f:
            try:
                print("with-try", at())
            finally:
                pass
        if __name__ == "__main__":
            print("guard", at())
        if True:
            print("any-if", at())
        """)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    path = str(script)
    assert lines == {"top": repr((path, 2)), "call": repr((path, 5)), "loop": repr((path, 7)),
                     "with-try": repr((path, 10)), "guard": "None", "any-if": "None"}
    done = subprocess.run([sys.executable, "-c", "from dalistream.dali.watchdog import unguarded_main_line as at; "
                           "print(at())"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None"  # no script file: nothing runs again


@pytest.mark.slow
def test_a_spawned_child_knows_it_runs_the_script_again(tmp_path):
    script = tmp_path / "child.py"
    done = run_script(script, f"""\
        import multiprocessing
        from dalistream.dali.watchdog import main_rerun_line
        print("rerun", main_rerun_line(), flush=True)
        def child():
            pass
        {GUARD}
            p = multiprocessing.get_context("spawn").Process(target=child)
            p.start()
            p.join()
        """)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == sorted(["rerun None", f"rerun {(str(script), 3)!r}"])


SCRIPT = """\
import dalistream
import numpy as np

def on_error(error):
    pass

def decode_label(raw):
    return np.array(int(raw), np.int64)

print("BODY", flush=True)
{body}
"""

ON_ERROR = """\
{prefix}stream = dalistream.Stream.open({data!r}, fields={{"key": "__key__"}}, batch_size=2, workers=2,
{prefix}                                device="cpu", start_method="spawn", on_error=on_error, cache_dir={cache!r})
{prefix}with dalistream.Loader(stream) as loader:
{prefix}    print(sum(len(b["key"]) for b in loader))
"""

DECODER = """\
def main():
    stream = dalistream.Stream.open({data!r}, batch_size=2, workers=2, device="cpu", start_method="spawn",
                                    fields={{"label": {{"exts": "cls", "decoder": decode_label, "dtype": "int64",
                                                       "ndim": 0}}}}, cache_dir={cache!r})
    with dalistream.Loader(stream) as loader:
        print(sum(len(b["label"]) for b in loader))

{prefix}main()
"""


def final_error(stderr):
    return [line for line in stderr.splitlines() if line.startswith("dalistream.errors.")][-1]


@pytest.mark.slow
@pytest.mark.dali
@pytest.mark.parametrize("body, line", [(ON_ERROR, 14), (DECODER, 18)])
def test_spawn_without_the_guard_says_what_to_add_before_any_worker_starts(tmp_path, body, line):
    key_shards(str(tmp_path / "data"), [3, 3])
    script = tmp_path / "train.py"
    text = SCRIPT.format(body=body.format(data=str(tmp_path / "data"), cache=str(tmp_path / "cache"), prefix=""))
    done = run_script(script, text)
    assert done.returncode == 1
    error = final_error(done.stderr)
    assert error.startswith("dalistream.errors.WorkerError: ") and GUARD in error
    assert f"the script {script} starts DALI workers at line {line} outside" in error
    assert done.stdout.splitlines() == ["BODY"]  # no worker ran the script again


@pytest.mark.dali
@pytest.mark.slow
def test_spawn_without_a_real_guard_is_told_by_the_workers(tmp_path):
    """An `if` that guards nothing: the workers run the script again and the first to reach
    dalistream says so; the main process's error (the last one printed) says what to add. The
    other worker may say so too, or be stopped first: once one worker has failed, DALI tears the
    pool down, so how far the other got is a race (it once failed this test 1 run in 7)."""
    key_shards(str(tmp_path / "data"), [3, 3])
    script = tmp_path / "train.py"
    body = ON_ERROR.format(data=str(tmp_path / "data"), cache=str(tmp_path / "cache"), prefix="    ")
    done = run_script(script, SCRIPT.format(body="if True:\n" + body))
    assert done.returncode == 1
    told = done.stderr.count(f"the script {script} is running again in a spawned DALI worker process")
    assert told in (1, 2)  # one worker for sure; the other unless the pool was torn down first
    # the script, then each worker that ran it; two workers print at once into one pipe, so their
    # lines can interleave ("BODYBODY\n\n"): count the words, not the lines
    assert 1 + told <= done.stdout.count("BODY") <= 3
    error = final_error(done.stderr)
    assert error.startswith("dalistream.errors.WorkerError: DALI's worker processes failed to start")
    assert GUARD in error and str(script) in error
    assert done.stderr.count("Traceback (most recent call last)") == 1  # the main process's; a line per worker


@pytest.mark.dali
@pytest.mark.slow
def test_spawn_with_the_guard_runs(tmp_path):
    key_shards(str(tmp_path / "data"), [3, 3])
    body = ON_ERROR.format(data=str(tmp_path / "data"), cache=str(tmp_path / "cache"), prefix="    ")
    done = run_script(tmp_path / "train.py", SCRIPT.format(body=GUARD + "\n" + body))
    assert done.returncode == 0, done.stderr[-3000:]
    # the workers import it, the guard holds; their lines can interleave ("BODYBODY\n\n"): count words
    assert done.stdout.count("BODY") == 3 and done.stdout.split()[-1] == "6", done.stdout


@pytest.mark.dali
@pytest.mark.slow
@pytest.mark.parametrize("guarded", [False, True])
def test_fork_without_the_guard_warns_what_spawn_would_break(tmp_path, guarded):
    """Forked workers re-run nothing, so an unguarded script works on a CPU laptop -- and breaks on a
    GPU box (spawn). It is told on the laptop: a warning naming the line, once; not with the guard."""
    key_shards(str(tmp_path / "data"), [3, 3])
    body = ON_ERROR.format(data=str(tmp_path / "data"), cache=str(tmp_path / "cache"),
                           prefix="    " if guarded else "").replace('start_method="spawn"', 'start_method="fork"')
    done = run_script(tmp_path / "train.py", SCRIPT.format(body=(GUARD + "\n" + body) if guarded else body))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "6"
    warned = done.stderr.count("outside `if __name__ == \"__main__\":`: it works here because the workers fork")
    assert warned == (0 if guarded else 1)


# -- the caller's work while a batch is computed -----------------------------------------------------

def _waiting_pipeline(flag: str):
    """A pipeline whose worker's batches say whether ``flag`` existed when they were made; the
    first one waits for it (up to a minute)."""
    import time

    import numpy as np
    from nvidia.dali import fn, pipeline_def

    class Source:
        def __iter__(self):
            return self

        def __next__(self):
            deadline = time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            return [np.array(os.path.exists(flag), np.uint8)] * 2

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="fork")
    def pipe():
        return fn.external_source(source=Source(), batch=True, parallel=True, cycle="quiet")

    return pipe()


@pytest.mark.parametrize("fails", [False, True])
def test_watched_run_does_the_caller_s_work_while_the_batch_is_computed(tmp_path, fails):
    """``meanwhile`` runs on the caller's thread while the workers compute the batch (here the
    batch waits for what it does): not before the run starts, not after it ends. What it raises
    is not the run's error: the batch comes back all the same."""
    from dalistream.dali import watchdog

    flag = str(tmp_path / "flag")
    done = []

    def work():
        with open(flag, "w"):
            pass
        done.append(threading.current_thread().name)
        if fails:
            raise RuntimeError("the caller's work failed")

    pipe = _waiting_pipeline(flag)
    pipe.build()
    try:
        (outputs,) = watchdog.watched_run(pipe, meanwhile=work)
        assert [int(x) for x in outputs.as_array()] == [1, 1]
        assert done == [threading.main_thread().name]
    finally:
        watchdog.stop_pipe(pipe)
