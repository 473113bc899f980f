"""DALI's worker processes: started without re-running the user's script, and so that they end
with the process that started them (:func:`dalistream.lifetime.die_with_parent`); watched while
a batch is awaited (no hang on a dead worker); shut down in bounded time.

A DALI worker killed by a signal (the out-of-memory killer) can leave ``pipe.run()`` blocked for
ever on a queue lock the dead process held. ``watched_run`` runs it on a helper thread and
watches the worker processes meanwhile; ``stop_pipe`` shuts the pipeline down and kills what is
left.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import logging
import os
import queue
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional, Tuple

from ..errors import WorkerError
from .compat import (forget_observer, light_queues, main_hidden_from_spawn, run_batch, shutdown, worker_processes,
                     workers_die_with_parent)

log = logging.getLogger(__name__)


_POLL_S = 0.05      # how often the waiting thread looks at the worker processes
_GRACE_S = 0.5      # after a worker died: time DALI gets to report it itself
_STOP_WAIT_S = 2.0  # at shutdown: time an interrupted run() gets to finish
_SHUTDOWN_S = 10.0  # time DALI's own shutdown gets before the workers are killed
# ... after a worker died: a worker killed holding a lock the others share (DALI's queues) can
# leave them blocked, and DALI's shutdown waits for them; the caller waits for the error meanwhile
_SHUTDOWN_AFTER_DEATH_S = 2.0


class _Runner:
    """A daemon thread that runs ``pipe.run()`` for a caller who waits on it with a timeout.

    A DALI worker killed by a signal can leave ``pipe.run()`` blocked for ever (on a queue lock
    the dead process held); the caller, not being blocked, sees the dead process and raises
    instead. One thread per pipeline, so DALI is always called
    from the same thread."""

    def __init__(self) -> None:
        self._requests: "queue.SimpleQueue" = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: tuple = ()
        self.busy = False
        self.thread = threading.Thread(target=self._loop, name="dalistream-run", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            pipe, stream = request
            try:
                self._result = (True, run_batch(pipe, stream))
            except BaseException as e:  # handed to the waiting thread
                self._result = (False, e)
            pipe = stream = request = None
            self._done.set()

    def run(self, pipe, processes: list, stream: Any = None, meanwhile: Optional[Callable[[], Any]] = None):
        self._done.clear()
        self.busy = True
        self._requests.put((pipe, stream))
        if meanwhile is not None:
            _meanwhile(meanwhile)
        dead_since = None
        while not self._done.wait(_POLL_S):
            dead = [(i, p) for i, p in enumerate(processes) if p.exitcode is not None]
            if dead:
                now = time.monotonic()
                dead_since = dead_since or now
                if now - dead_since >= _GRACE_S:
                    raise _worker_died(dead)
        self.busy = False
        ok, value = self._result
        self._result = ()
        if not ok:
            dead = [(i, p) for i, p in enumerate(processes) if p.exitcode is not None]
            if dead:  # DALI noticed first ("Worker data receiving interrupted"): say which one and how
                raise _worker_died(dead) from value
            raise value
        return value

    def stop(self, timeout: float) -> bool:
        """End the thread once the current run (if any) is over; False if it is still running."""
        if self.busy and not self._done.wait(timeout):
            return False
        self.busy = False
        self._requests.put(None)
        return True


_runners: "weakref.WeakKeyDictionary[Any, _Runner]" = weakref.WeakKeyDictionary()


def watched_run(pipe, stream: Any = None, meanwhile: Optional[Callable[[], Any]] = None):
    """``pipe.run()`` (``pipe.run(stream)`` with a consumer's CUDA stream, see
    :func:`dalistream.dali.compat.run_batch`), but a dead DALI worker process is a
    :class:`WorkerError` within about a second instead of a hang.

    ``meanwhile``: called on this thread while the batch is computed on the helper thread, for
    work the caller does with the outputs next (the first import of the converter: ~3 ms on the
    first batch's path otherwise); what it raises is left to the caller's own use of that work.
    With no worker process the batch is computed on this thread, and ``meanwhile`` is not called."""
    processes = worker_processes(pipe)
    if not processes:
        return run_batch(pipe, stream)
    runner = _runners.get(pipe)
    if runner is None:
        runner = _runners[pipe] = _Runner()
    return runner.run(pipe, processes, stream, meanwhile)


def _meanwhile(work: Callable[[], Any]) -> None:
    try:
        work()
    except Exception:  # noqa: BLE001 - raised again where the caller does the work itself
        log.debug("work done while a batch was computed failed", exc_info=True)


def _exit_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _worker_died(dead: list) -> WorkerError:
    # DALI terminates (SIGTERM) the other workers as soon as one dies: report the first one
    dead = sorted(dead, key=lambda item: item[1].exitcode == -signal.SIGTERM)
    worker, process = dead[0]
    code = process.exitcode
    how = _exit_text(code)
    others = ""
    if len(dead) > 1:
        others = "; then " + ", ".join(f"worker {w} {_exit_text(p.exitcode)}" for w, p in dead[1:])
    hint = ("SIGKILL is usually the out-of-memory killer: check `dmesg`, the memory limit and the size of /dev/shm; "
            if code == -signal.SIGKILL else
            "SIGBUS is usually a local shard cut short while it was read (workers read local shards through "
            "memory maps): replace a shard by writing a new file and renaming it over the old one, never by "
            "rewriting it in place; " if code == -signal.SIGBUS else "")
    return WorkerError(
        f"DALI worker process {worker} (pid {process.pid}) {how}{others}; the pipeline cannot go on", worker=worker,
        hint=hint + "the pipeline has been stopped; iterating the loader again starts new workers where it stood")


def stop_pipe(pipe) -> None:
    """Shut a pipeline and its workers down, in bounded time even when a worker died."""
    processes = worker_processes(pipe)
    runner = _runners.pop(pipe, None)
    dead = any(p.exitcode is not None for p in processes)
    allowed = _SHUTDOWN_AFTER_DEATH_S if dead else _SHUTDOWN_S  # DALI's own shutdown, before the workers are killed
    if runner is not None:
        if not runner.stop(0.0 if dead else _STOP_WAIT_S):
            log.debug("a pipeline run is still blocked in DALI; shutting down around it")

    failure: list = []

    def stop() -> None:
        try:
            shutdown(pipe)
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=stop, name="dalistream-shutdown", daemon=True)
    if sys.is_finalizing():  # a new thread would never start (Thread.start() waits for ever)
        stop()
    else:
        try:
            thread.start()
        except RuntimeError:  # no new threads at interpreter exit: shut down in this one
            stop()
        else:
            thread.join(allowed)
    if thread.is_alive():
        log.warning("DALI did not shut down within %.0f s; killing its worker processes", allowed)
        forget_observer(pipe)
    for p in processes:  # normally all gone by now
        if p.exitcode is None:
            try:
                p.join(1.0 if not thread.is_alive() else 0.0)
                if p.exitcode is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.join(1.0)
            except (OSError, ValueError, AssertionError):
                pass
    if failure:
        if not isinstance(failure[0], Exception):
            raise failure[0]
        log.debug("error while shutting the pipeline down: %r", failure[0])


def spawn_without_main(config, method: str = "spawn"):
    """While DALI starts its workers, keep ``spawn`` from re-running the user's script in each
    (see :func:`dalistream.dali.compat.main_hidden_from_spawn`) — unless the config carries user
    callables (custom decoders, an ``on_error`` function), which may live in the main script.
    Forked workers re-import nothing.

    When the script does run again in each spawned worker, a script without the
    ``if __name__ == "__main__":`` guard would start workers from its workers: that is a
    :class:`WorkerError` saying what to add, raised before any worker starts where the script
    shows it, else in the worker and when DALI reports that its workers failed to start."""
    user_code = callable(config.on_error) or any(f.decoder is not None for f in config.fields)
    if method == "fork" and user_code:
        _warn_unguarded()
    return _starting_workers(method, hide=method == "spawn" and not user_code)


_warned_unguarded: set = set()


def _warn_unguarded() -> None:
    """Forked workers re-run nothing, so a script without the guard works here; with a GPU (or
    any spawn) the same script fails: say so once, on the laptop, before it reaches a GPU box."""
    unguarded = unguarded_main_line()
    if unguarded is not None and unguarded not in _warned_unguarded:
        _warned_unguarded.add(unguarded)
        log.warning("the script %s starts DALI workers at line %d outside `%s`: it works here because the workers "
                    "fork, but with a GPU (or start_method='spawn') each worker runs the script again and it stops "
                    "with a WorkerError; %s", unguarded[0], unguarded[1], _GUARD, _guard_hint())


_GUARD = 'if __name__ == "__main__":'


@contextlib.contextmanager
def _starting_workers(method: str, hide: bool) -> Iterator[None]:
    rerun = main_rerun_line()
    if rerun is not None:  # we are a spawned worker running the user's script again
        error = WorkerError(
            f"the script {rerun[0]} is running again in a spawned DALI worker process and reached line {rerun[1]}, "
            "which starts DALI workers of its own", hint=_guard_hint())
        # one line from the worker, not a traceback: the main process's error says it all again
        print(f"dalistream worker: {error.message} (see the error of the main process)", file=sys.stderr, flush=True)
        raise SystemExit(1)
    workers_die_with_parent()  # a training process killed by any signal takes its workers with it
    light_queues()  # no handshake between processes per task sent and batch returned
    reruns = method == "spawn" and not hide
    if reruns:
        unguarded = unguarded_main_line()
        if unguarded is not None:
            raise WorkerError(
                f"the script {unguarded[0]} starts DALI workers at line {unguarded[1]} outside `{_GUARD}`, and "
                "every worker started with 'spawn' runs the script again from the top (it is imported again "
                "because the stream carries your own functions: an on_error function or a field decoder)",
                hint=_guard_hint())
    with main_hidden_from_spawn(hide):
        try:
            yield
        except Exception as e:
            if "Workers initialization failed" not in str(e) and "bootstrapping phase" not in str(e):
                raise
            if reruns:
                main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"
                raise WorkerError(
                    f"DALI's worker processes failed to start; with 'spawn' each of them runs {main} again first "
                    "(their own errors are printed above)", hint=_guard_hint()) from None
            raise WorkerError("DALI's worker processes failed to start (their own errors are printed above)",
                              hint="the first error a worker printed says why") from None


def _guard_hint() -> str:
    return (f"put the code that opens the Stream and iterates the Loader under `{_GUARD}` (functions, the "
            "@dalistream.pipeline_def and imports may stay at the top level): Python's spawn start method "
            "imports the main script again in every worker process")


def main_rerun_line() -> Optional[Tuple[str, int]]:
    """``(script, line)`` when this process is a spawned child running the main script again
    (``multiprocessing`` runs it as ``__mp_main__``) and is at that line of it; else ``None``."""
    frame = inspect.currentframe()
    found = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            found = (frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return found


def unguarded_main_line() -> Optional[Tuple[str, int]]:
    """``(script, line)`` when the main script's top level is at a line that no ``if`` encloses
    (so that a re-run of the script in a spawned worker reaches it too); ``None`` when it is
    inside an ``if`` (a ``__name__`` guard or any other), or when there is no script file (``-c``,
    Jupyter) or it cannot be read."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not path.endswith(".py"):
        return None
    frame = inspect.currentframe()
    line = None
    while frame is not None:
        if (frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__
                and os.path.abspath(frame.f_code.co_filename) == os.path.abspath(path)):
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    body = tree.body
    while True:
        node = next((n for n in body if n.lineno <= line <= (n.end_lineno or n.lineno)), None)
        if node is None:
            return None
        if isinstance(node, ast.If):
            return None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
        inner = [part for name in ("body", "orelse", "finalbody", "handlers") for part in getattr(node, name, [])]
        inner += [part for case in getattr(node, "cases", []) for part in case.body]
        if not inner or not any(n.lineno <= line <= (n.end_lineno or n.lineno) for n in inner):
            return (path, line)
        body = [n for n in inner if hasattr(n, "lineno")]
