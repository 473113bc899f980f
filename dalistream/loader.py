"""The torch-facing loader: runs a dalistream pipeline and yields dicts of torch tensors.

``len()`` is the number of batches in the current epoch (computed from counts before the
epoch starts), ``set_epoch(e)`` selects the epoch, ``state_dict()``/``load_state_dict()`` save
and restore (epoch, step) for an exact mid-epoch resume. Padding (``valid == 0``) is removed
here, so users only ever see real samples. The DALI pipeline runs on across epoch boundaries;
it is rebuilt only when the position asked for is not where it stands (``set_epoch`` to
another epoch, ``load_state_dict``).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import queue
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

from . import errors
from .errors import StateError, WorkerError
from .stream import Stream

STATE_VERSION = 1
_ERROR_LINE = re.compile(r"dalistream\.errors\.(\w+): (.+)")
log = logging.getLogger(__name__)


class Loader:
    """Iterate a dalistream pipeline as dicts of torch tensors (CUDA tensors on GPU).

    ``pipeline`` is a function decorated with :func:`dalistream.pipeline_def`; by default the
    raw fields. ``transform``, if given, is applied to each batch dict (after padding is trimmed)
    and its result yielded, e.g. to turn caption bytes into ``str``.
    Use as ``with Loader(...) as loader: for batch in loader: ...``.
    """

    def __init__(self, stream: Stream, pipeline: Optional[Callable] = None, *,
                 transform: Optional[Callable[[Dict[str, Any]], Any]] = None, **pipeline_kwargs: Any) -> None:
        from .pipeline import raw_pipeline

        self.stream = stream
        self.pipeline_fn = pipeline or raw_pipeline
        self.pipeline_kwargs = pipeline_kwargs
        self.transform = transform
        self.epoch = stream.start_epoch
        self.step = stream.start_step
        self._pipe = None
        self._pipe_at: Optional[tuple] = None
        self._stats_dir = tempfile.mkdtemp(prefix="dalistream-stats-")
        self._closed = False

    # -- iteration ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.stream.steps(self.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch at the next ``iter()``."""
        if epoch != self.epoch or self.step:
            self.epoch, self.step = int(epoch), 0

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._closed:
            raise RuntimeError("loader is closed")
        steps = len(self)
        if self.step >= steps:  # a finished epoch: the next one
            self.epoch, self.step = self.epoch + 1, 0
            steps = len(self)
        if self._pipe is None or self._pipe_at != (self.epoch, self.step):
            self._build()
        while self.step < steps:
            batch = self._run()
            self.step += 1
            self._pipe_at = (self.epoch, self.step)
            yield batch
        # the sources go straight on with the next epoch: the pipeline stays valid
        self.epoch, self.step = self.epoch + 1, 0
        self._pipe_at = (self.epoch, 0)

    def _build(self) -> None:
        self._shutdown_pipe()
        for path in glob.glob(os.path.join(self._stats_dir, "*.json")):
            os.remove(path)
        stream = self.stream.at(self.epoch, self.step, stats_dir=self._stats_dir)
        pipe = self.pipeline_fn(stream, **self.pipeline_kwargs)
        try:
            pipe.build()
        except Exception as e:
            self._pipe = pipe
            self._shutdown_pipe()
            raise _translate(e, self.stream.config.rank) from None
        self._pipe = pipe
        self._outputs = pipe.dalistream_outputs
        self._pipe_at = (self.epoch, self.step)

    def _run(self) -> Dict[str, Any]:
        try:
            outputs = _watched_run(self._pipe)
        except BaseException as e:  # after a failure (or Ctrl-C) the pipeline is dead: never run it again
            self._shutdown_pipe()
            if not isinstance(e, Exception):
                raise
            raise _translate(e, self.stream.config.rank, (self.stream, self.epoch, self.step)) from None
        batch = _to_torch(self._outputs, outputs)
        return self.transform(batch) if self.transform is not None else batch

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Plain data to resume from: the position (epoch, step) and the layout it is valid for."""
        c = self.stream.config
        return {
            "version": STATE_VERSION,
            "loader": {"epoch": self.epoch, "step": self.step},
            "plan": {"seed": c.seed, "rank": c.rank, "world_size": c.world_size, "workers": c.workers,
                     "batch_size": c.batch_size, "policy": c.policy, "shuffle": c.shuffle,
                     "batches_per_epoch": c.batches_per_epoch, "sources": self.stream.digest},
        }

    def load_state_dict(self, state: Dict[str, Any], *, allow_layout_change: bool = False) -> None:
        """Continue from a saved state. A state saved under another layout is an error, unless
        ``allow_layout_change``: then the saved epoch restarts from its beginning."""
        if state.get("version") != STATE_VERSION:
            raise StateError(f"unknown loader state version {state.get('version')!r}")
        saved = state["plan"]
        current = self.state_dict()["plan"]
        saved_layout = {k: v for k, v in saved.items() if k != "rank"}
        current_layout = {k: v for k, v in current.items() if k != "rank"}
        epoch, step = int(state["loader"]["epoch"]), int(state["loader"]["step"])
        if saved_layout != current_layout:
            if not allow_layout_change:
                diff = {k: (saved_layout.get(k), current_layout.get(k)) for k in current_layout
                        if saved_layout.get(k) != current_layout.get(k)}
                raise StateError(f"saved state does not fit this loader (saved, current): {diff}",
                                 hint="pass allow_layout_change=True to restart the saved epoch at shard granularity")
            step = 0
        self.epoch, self.step = epoch, step

    # -- counters ----------------------------------------------------------------------------

    def stats(self, wait_s: float = 0.0) -> Dict[str, Any]:
        """Per-worker counters (bytes read, samples, padding, skips, time reading) and their sums.

        Workers write their counters every ~0.5 s, soon after every skip, and when they finish an
        epoch. ``wait_s`` > 0 waits up to that long for every worker to have written counters up to
        the loader's position (exact at the end of an epoch). Skips are summed as
        ``skipped_samples`` and ``skipped_shards`` and broken down by reason in
        ``skipped = {"samples": {reason: n}, "shards": {reason: n}}``, since the pipeline started;
        ``by_epoch[e]`` holds the same three keys for epoch ``e`` alone (the workers read a few
        batches ahead, into the next epoch: its skips appear there). Each worker's raw counters
        (``"samples:<reason>"``, ``"shards:<reason>"``) are under ``workers[i]["skipped"]``.
        """
        from .samples import skip_totals

        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            workers = []
            for path in sorted(glob.glob(os.path.join(self._stats_dir, "worker-*.json"))):
                try:
                    with open(path) as f:
                        workers.append(json.load(f))
                except (OSError, ValueError):
                    continue
            if time.monotonic() >= deadline or self._workers_reached(workers):
                break
            time.sleep(0.05)
        skipped: Counter = Counter()
        by_epoch: Dict[int, Counter] = {}
        for w in workers:
            skipped.update(w.get("skipped", {}))
            for epoch, counts in w.get("skipped_by_epoch", {}).items():
                by_epoch.setdefault(int(epoch), Counter()).update(counts)
        totals = {k: sum(w.get(k, 0) for w in workers) for k in ("samples", "padded", "bytes", "dropped")}
        return {"workers": workers, **totals, **skip_totals(skipped),
                "by_epoch": {e: skip_totals(c) for e, c in sorted(by_epoch.items())}}

    def _workers_reached(self, workers) -> bool:
        """True when every worker's counters are written up to the loader's position."""
        if self._pipe is None:  # nothing running: nothing more will be written
            return True
        if len(workers) < self.stream.config.workers:
            return False
        if self.step:
            target = (self.epoch, self.step)
        elif self.epoch > self.stream.start_epoch:
            target = (self.epoch - 1, self.stream.steps(self.epoch - 1))
        else:
            return True
        return all((w.get("epoch", -1), w.get("step", -1)) >= target for w in workers)

    # -- lifetime ----------------------------------------------------------------------------

    def _shutdown_pipe(self) -> None:
        pipe, self._pipe, self._pipe_at = self._pipe, None, None
        if pipe is None:
            return
        _stop_pipe(pipe)

    def close(self) -> None:
        """Stop the pipeline and its worker processes and free their shared memory.

        Never hangs: after a worker died, DALI's own shutdown can block on a lock the dead
        process held; it then gets a bounded time before the workers are killed."""
        if self._closed:
            return
        self._closed = True
        try:
            self._shutdown_pipe()
        finally:
            shutil.rmtree(self._stats_dir, ignore_errors=True)

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        c = self.stream.config
        return (f"Loader(shards={len(self.stream.urls)}, batch_size={c.batch_size}, workers={c.workers}, "
                f"rank={c.rank}/{c.world_size}, device={self.stream.device}, epoch={self.epoch}, step={self.step})")


_WORKER_TB = "Exception traceback received from worker thread:"
_DECODER = re.compile(r"fn\.decoders\.\w+|decoders__\w+|nvImageCodec")
_LAST_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.*)$")


def _translate(error: Exception, rank: int, where: Optional[tuple] = None) -> Exception:
    """Turn what a failed DALI pipeline raised into a dalistream error.

    - an error of dalistream's own code in a worker (DALI passes on only its traceback text):
      the same class with the same fields (shard, member, rank, worker, hint), rebuilt from the
      note :meth:`DalistreamError.at` attached in the worker;
    - any other exception in a worker: :class:`WorkerError` naming its type and message;
    - DALI's image decoder failing (a corrupt image that passed the workers' cheap check): a
      :class:`SampleError` naming the shard and key when they can be found (``where`` is
      ``(stream, epoch, step)`` of the batch asked for; see :func:`_locate_bad_images`);
    - anything else: :class:`WorkerError` with DALI's message.

    The worker's traceback, where there is one, is kept in ``worker_traceback`` and added as a note.
    """
    if isinstance(error, errors.DalistreamError):
        if error.rank is None:
            error.rank = rank
            error.args = (error._render(),)
        return error
    text = str(error)
    traceback_text = text.split(_WORKER_TB, 1)[1].strip("\n") if _WORKER_TB in text else None
    out: Optional[errors.DalistreamError] = None
    if traceback_text is not None:
        out = _from_worker_traceback(traceback_text, rank)
    elif _DECODER.search(text):
        out = _decoder_error(text, rank, where)
    elif "Worker data receiving interrupted" in text:
        out = WorkerError("a DALI worker process stopped while the pipeline waited for its data", rank=rank,
                          hint="a killed worker is often the out-of-memory killer: check memory, `dmesg`, and the "
                               "size of /dev/shm")
    if out is None:
        out = WorkerError(f"DALI pipeline failed: {text.strip()[-3000:]}", rank=rank)
    if traceback_text is not None:
        tb = "\n".join(line for line in traceback_text.splitlines() if not line.startswith(errors.FIELDS_NOTE))
        out.worker_traceback = tb  # type: ignore[attr-defined]
        out.add_note("Traceback in the DALI worker process:\n" + tb)
    return out


def _from_worker_traceback(tb: str, rank: int) -> errors.DalistreamError:
    for line in reversed(tb.splitlines()):
        if line.startswith(errors.FIELDS_NOTE):
            try:
                fields = json.loads(line[len(errors.FIELDS_NOTE):])
            except ValueError:
                break
            out = errors.DalistreamError.from_fields(fields)
            if out.rank is None:
                out.rank = rank
                out.args = (out._render(),)
            return out
    found = _ERROR_LINE.findall(tb)
    if found:  # a dalistream error raised without .at() (no fields note): class and text only
        name, message = found[-1]
        cls = getattr(errors, name, WorkerError)
        if isinstance(cls, type) and issubclass(cls, errors.DalistreamError):
            out = cls(message.strip())
            out.args = (message.strip() + (f" [rank {rank}]" if "rank " not in message else ""),)
            return out
    last = next((m for m in (_LAST_LINE.match(x) for x in reversed(tb.splitlines())) if m), None)
    what = f"{last.group(1)}: {last.group(2)}" if last else tb.strip().splitlines()[-1]
    return WorkerError(f"a DALI worker raised {what}", rank=rank,
                       hint="see the worker's traceback below; the pipeline has been stopped")


def _decoder_error(text: str, rank: int, where: Optional[tuple]) -> errors.DalistreamError:
    status = re.search(r"nvImageCodec failure: '?([^'\n]*)'?", text)
    what = f"nvImageCodec failure {status.group(1)}" if status else "decoder error"
    op = _DECODER.search(text).group(0)
    found: List[tuple] = []
    keys: List[str] = []
    if where is not None:
        stream, epoch, step = where
        try:
            found, keys = _locate_bad_images(stream, epoch, step)
        except Exception as e:  # locating is a courtesy: never hide the real error behind it
            log.debug("could not locate the undecodable image: %s", e)
    if found:
        url, key, field, problem, bad_step = found[0]
        more = f" ({len(found) - 1} more in the same batches)" if len(found) > 1 else ""
        return errors.SampleError(
            f"DALI's image decoder ({op}) failed ({what}); the undecodable image is field {field!r} of the batch at "
            f"epoch {epoch}, step {bad_step}: {problem}{more}", url=url, member=key, rank=rank, reason="bad_image",
            hint="re-encode or remove the image; on_error='skip' skips only images that fail the workers' cheap "
                 "check (signature and end marker), not images that only DALI's decoder rejects")
    shown = ", ".join(keys[:8]) + (", …" if len(keys) > 8 else "")
    near = f" of the batch at epoch {where[1]}, step {where[2]} (keys: {shown})" if where is not None and keys else ""
    return errors.SampleError(
        f"DALI's image decoder ({op}) failed ({what}) on a sample{near}. DALI does not say which sample, and no image "
        "of that batch failed to decode with PIL", rank=rank, reason="bad_image",
        hint="check the images of these samples; the pipeline has been stopped")


def _locate_bad_images(stream: Stream, epoch: int, step: int, depth: int = 2):
    """Re-read, in this process, the batches ``step .. step + depth`` of ``epoch`` (DALI may fail
    on a prefetched batch) and decode their image fields with PIL; return ``([(url, key, field,
    problem, step), ...], keys of the batch at step)``. Only called after a decoder failure."""
    import dataclasses
    import io

    from .config import IMAGE_EXTS, Field
    from .source import WorkerSource

    c = stream.config
    images = [i for i, f in enumerate(c.fields)
              if f.kind == "bytes" and any(e.rsplit(".", 1)[-1].lower() in IMAGE_EXTS for e in f.exts)]
    if not images:
        return [], []
    try:
        from PIL import Image
    except ImportError:
        Image = None  # noqa: N806
    extra = (Field("__dalistream_key__", ("__key__",), kind="meta"), Field("__dalistream_url__", ("__url__",), kind="meta"))
    config = dataclasses.replace(c, fields=tuple(c.fields) + extra)
    n = len(c.fields)
    found, keys = [], []
    last = min(stream.steps(epoch), step + depth + 1)
    for w in range(c.workers):
        source = WorkerSource(config, stream.urls, stream.counts, w, start_epoch=epoch, start_step=step)
        batches = source.epoch_batches(epoch, step)
        try:
            for s, batch in zip(range(step, last), batches):
                valid = batch[-1]
                for pos in range(len(valid)):
                    if not int(valid[pos]):
                        continue
                    key = bytes(batch[n][pos]).decode("utf-8", "replace")
                    url = bytes(batch[n + 1][pos]).decode("utf-8", "replace")
                    if s == step:
                        keys.append(key)
                    for i in images:
                        data = bytes(batch[i][pos])
                        if not data or Image is None:
                            continue
                        try:
                            with Image.open(io.BytesIO(data)) as im:
                                im.load()
                        except Exception as e:
                            found.append((url, key, c.fields[i].name, f"PIL: {type(e).__name__}: {e}", s))
        finally:
            batches.close()
    return found, keys


# -- running a pipeline without hanging on a dead worker -----------------------------------------

_POLL_S = 0.05      # how often the waiting thread looks at the worker processes
_GRACE_S = 0.5      # after a worker died: time DALI gets to report it itself
_STOP_WAIT_S = 2.0  # at shutdown: time an interrupted run() gets to finish
_SHUTDOWN_S = 10.0  # time DALI's own shutdown gets before the workers are killed


def _worker_processes(pipe) -> list:
    """The ``multiprocessing.Process`` objects of the pipeline's DALI workers (DALI internals;
    an empty list where they cannot be found)."""
    pool = getattr(pipe, "_py_pool", None)
    return list(getattr(getattr(pool, "pool", None), "_processes", None) or [])


class _Runner:
    """A daemon thread that runs ``pipe.run()`` for a caller who waits on it with a timeout.

    A DALI worker killed by a signal can leave ``pipe.run()`` blocked for ever (on a
    multiprocessing condition the dead process was waiting on); the caller, not being blocked,
    sees the dead process and raises instead. One thread per pipeline, so DALI is always called
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
            pipe = self._requests.get()
            if pipe is None:
                return
            try:
                self._result = (True, pipe.run())
            except BaseException as e:  # handed to the waiting thread
                self._result = (False, e)
            pipe = None
            self._done.set()

    def run(self, pipe, processes: list):
        self._done.clear()
        self.busy = True
        self._requests.put(pipe)
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


def _watched_run(pipe):
    """``pipe.run()``, but a dead DALI worker process is a :class:`WorkerError` within about a
    second instead of a hang."""
    processes = _worker_processes(pipe)
    if not processes:
        return pipe.run()
    runner = getattr(pipe, "_dalistream_runner", None)
    if runner is None:
        runner = pipe._dalistream_runner = _Runner()
    return runner.run(pipe, processes)


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
            if code == -signal.SIGKILL else "")
    return WorkerError(
        f"DALI worker process {worker} (pid {process.pid}) {how}{others}; the pipeline cannot go on", worker=worker,
        hint=hint + "the pipeline has been stopped; iterating the loader again starts new workers where it stood")


def _stop_pipe(pipe) -> None:
    """Shut a pipeline and its workers down, in bounded time even when a worker died."""
    processes = _worker_processes(pipe)
    runner = getattr(pipe, "_dalistream_runner", None)
    if runner is not None:
        dead = any(p.exitcode is not None for p in processes)
        if not runner.stop(0.0 if dead else _STOP_WAIT_S):
            log.debug("a pipeline run is still blocked in DALI; shutting down around it")

    failure: list = []

    def shutdown() -> None:
        try:
            try:
                pipe._shutdown()
            finally:
                pool = getattr(pipe, "_py_pool", None)
                if pool is not None:
                    pool.close()
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=shutdown, name="dalistream-shutdown", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no new threads at interpreter exit: shut down in this one
        shutdown()
    else:
        thread.join(_SHUTDOWN_S)
    if thread.is_alive():
        log.warning("DALI did not shut down within %.0f s; killing its worker processes", _SHUTDOWN_S)
        observer = getattr(getattr(getattr(pipe, "_py_pool", None), "pool", None), "_observer", None)
        if observer is not None:
            observer.thread = None  # its close() would block again at exit
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


def _to_torch(names_kinds, outputs) -> Dict[str, Any]:
    import torch
    from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor

    batch: Dict[str, Any] = {}
    mask = None
    for (name, kind), tl in zip(names_kinds, outputs):
        if name == "valid":
            mask = np.array(tl.as_cpu().as_tensor() if hasattr(tl, "as_cpu") else tl.as_tensor(), dtype=bool)
            continue
        if kind in ("bytes", "text"):
            tl = tl.as_cpu() if hasattr(tl, "as_cpu") else tl
            values = [np.array(tl.at(i)).tobytes() for i in range(len(tl))]
            batch[name] = [v.decode("utf-8") for v in values] if kind == "text" else values
        elif tl.is_dense_tensor():
            batch[name] = to_torch_tensor(tl.as_tensor(), copy=True)
        else:
            tl = tl.as_cpu() if hasattr(tl, "as_cpu") else tl
            batch[name] = [torch.from_numpy(np.array(tl.at(i))) for i in range(len(tl))]
    if mask is not None and not mask.all():
        keep = np.flatnonzero(mask)
        index = torch.from_numpy(keep)
        for name, value in batch.items():
            if isinstance(value, list):
                batch[name] = [value[i] for i in keep]
            else:
                batch[name] = value.index_select(0, index.to(value.device))
    return batch
