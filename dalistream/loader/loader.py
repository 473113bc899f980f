"""The torch-facing loader: runs a dalistream pipeline and yields dicts of torch tensors.

``len()`` is the number of batches in the current epoch (computed from counts before the
epoch starts), ``set_epoch(e)`` selects the epoch, ``state_dict()``/``load_state_dict()`` save
and restore (epoch, step) for an exact mid-epoch resume. Padding (``valid == 0``) is removed
here, so users only ever see real samples; a batch whose samples were all skipped
(``on_error``/``missing="skip"``) is not yielded at all (a warning says so), so such an epoch
yields fewer than ``len()`` batches. The DALI pipeline runs on across epoch boundaries;
it is rebuilt only when the position asked for is not where it stands (``set_epoch`` to
another epoch, ``load_state_dict``).
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import tempfile
import time
import weakref
from typing import Any, Callable, Dict, Iterator, Optional

from ..dali.compat import exec_dynamic
from ..dali.diagnose import translate
from ..dali.pipeline import built, raw_pipeline
from ..dali.watchdog import spawn_without_main, stop_pipe, watched_run
from ..errors import StateError
from ..stream import Stream
from ..worker import read_workers, summarize
from .convert import BufferPool, to_torch

STATE_VERSION = 2  # 2: samples owned by spans of the epoch sequence (1: whole shards)
log = logging.getLogger(__name__)

_open_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()
_atexit_registered = False


def _close_open_loaders() -> None:
    # At exit, before the interpreter finalizes: a Loader still open (a script ended by Ctrl-C
    # without `with`) is closed while threads can still be started. Left to ``__del__`` during
    # finalization, the bounded shutdown could not start its helper thread.
    for loader in list(_open_loaders):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - at exit, the others still get closed
            log.debug("closing a loader at exit failed", exc_info=True)


def _track(loader: "Loader") -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_close_open_loaders)  # registered on first use, not at import
        _atexit_registered = True
    _open_loaders.add(loader)


def read_state(state: Any, current: Dict[str, Any]) -> tuple:
    """``(epoch, step, saved plan)`` of a state from :meth:`Loader.state_dict`; a
    :class:`StateError` naming what is missing or wrong, never a KeyError or TypeError."""
    def integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(state, dict):
        raise StateError(f"a loader state is a dict from Loader.state_dict(), got {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise StateError(f"unknown loader state version {state.get('version')!r} (expected {STATE_VERSION})")
    for part in ("loader", "plan"):
        if not isinstance(state.get(part), dict):
            raise StateError(f"loader state has no {part!r} dict: got {state.get(part)!r}")
    position, saved = state["loader"], state["plan"]
    for name in ("epoch", "step"):
        if not integer(position.get(name)) or position[name] < 0:
            raise StateError(f"loader state: {name} must be an integer >= 0, got {position.get(name)!r}")
    missing = sorted(set(current) - set(saved))
    if missing:
        raise StateError(f"loader state: plan lacks {missing}")
    return position["epoch"], position["step"], saved


class Loader:
    """Iterate a dalistream pipeline as dicts of torch tensors (CUDA tensors on GPU).

    ``pipeline`` is a function decorated with :func:`dalistream.pipeline_def`; by default the
    raw fields. ``transform``, if given, is applied to each batch dict (after padding is trimmed)
    and its result yielded, e.g. to turn caption bytes into ``str``.
    Use as ``with Loader(...) as loader: for batch in loader: ...``.
    """

    def __init__(self, stream: Stream, pipeline: Optional[Callable] = None, *,
                 transform: Optional[Callable[[Dict[str, Any]], Any]] = None, **pipeline_kwargs: Any) -> None:
        self.stream = stream
        self.pipeline_fn = pipeline or raw_pipeline
        self.pipeline_kwargs = pipeline_kwargs
        self.transform = transform
        self.epoch = stream.start_epoch
        self.step = stream.start_step
        self._pipe = None
        self._pipe_at: Optional[tuple] = None
        self._stats_dir = tempfile.mkdtemp(prefix="dalistream-stats-")
        self._timing = {"batches": 0, "wait_s": 0.0, "step_s": 0.0}  # see stats()
        self._closed = False
        _track(self)

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
        timing = self._timing
        while self.step < steps:
            t0 = time.perf_counter()
            batch = self._run()
            t1 = time.perf_counter()
            timing["batches"] += 1
            timing["wait_s"] += t1 - t0
            self.step += 1
            self._pipe_at = (self.epoch, self.step)
            if batch is None:  # every sample of it was skipped: a batch of nothing is never trained on
                log.warning("batch %d of epoch %d holds no sample (all skipped, see Loader.stats()): not yielded",
                            self.step - 1, self.epoch)
                continue
            yield batch
            timing["step_s"] += time.perf_counter() - t1
        # the sources go straight on with the next epoch: the pipeline stays valid
        self.epoch, self.step = self.epoch + 1, 0
        self._pipe_at = (self.epoch, 0)

    def _build(self) -> None:
        self._shutdown_pipe()
        for path in glob.glob(os.path.join(self._stats_dir, "*.json")):
            os.remove(path)
        stream = self.stream.at(self.epoch, self.step, stats_dir=self._stats_dir)
        pipe = self.pipeline_fn(stream, **self.pipeline_kwargs)
        info = built(pipe)
        try:
            with spawn_without_main(self.stream.config, info.start_method):
                pipe.build()
        except Exception as e:
            self._pipe = pipe
            self._shutdown_pipe()
            raise translate(e, self.stream.config.rank) from None
        self._pipe = pipe
        self._outputs = info.outputs
        self._buffers = BufferPool()
        self._pipe_at = (self.epoch, self.step)

    def _run(self) -> Optional[Dict[str, Any]]:
        try:
            outputs = watched_run(self._pipe)
        except BaseException as e:  # after a failure (or Ctrl-C) the pipeline is dead: never run it again
            self._shutdown_pipe()
            if not isinstance(e, Exception):
                raise
            raise translate(e, self.stream.config.rank, (self.stream, self.epoch, self.step)) from None
        batch = to_torch(self._outputs, outputs, self._buffers, zero_copy=exec_dynamic(self._pipe))
        if batch and all(len(value) == 0 for value in batch.values()):
            return None
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
        current = self.state_dict()["plan"]
        epoch, step, saved = read_state(state, current)
        saved_layout = {k: v for k, v in saved.items() if k != "rank"}
        current_layout = {k: v for k, v in current.items() if k != "rank"}
        if saved_layout != current_layout:
            if not allow_layout_change:
                diff = {k: (saved_layout.get(k), current_layout.get(k)) for k in current_layout
                        if saved_layout.get(k) != current_layout.get(k)}
                raise StateError(f"saved state does not fit this loader (saved, current): {diff}",
                                 hint="pass allow_layout_change=True to restart the saved epoch at shard granularity")
            step = 0
        steps = self.stream.steps(epoch)  # plan.steps_per_epoch for this rank
        if step > steps:
            raise StateError(f"saved step {step} is past the end of epoch {epoch}, which has {steps} steps",
                             hint="the state does not come from this data set and layout")
        self.epoch, self.step = epoch, step

    # -- counters ----------------------------------------------------------------------------

    def stats(self, wait_s: float = 0.0) -> Dict[str, Any]:
        """Per-worker counters (bytes read, samples, padding, skips, where the time went) and their
        sums, and the training loop's side under ``loader``: ``wait_s``, the time it waited for
        batches (the input pipeline was the limit; the first includes the workers' start), and
        ``step_s``, the time it spent between batches (its own step), over ``batches`` batches.
        See :mod:`dalistream.worker.stats` for the workers' counters.

        Workers write their counters every ~0.5 s, soon after every skip, and when they finish an
        epoch. ``wait_s`` > 0 waits up to that long for every worker to have written counters up to
        the loader's position (exact at the end of an epoch). Skips are summed as
        ``skipped_samples`` and ``skipped_shards`` and broken down by reason in
        ``skipped = {"samples": {reason: n}, "shards": {reason: n}}``, since the pipeline started;
        ``by_epoch[e]`` holds the same three keys for epoch ``e`` alone (the workers read a few
        batches ahead, into the next epoch: its skips appear there). Each worker's raw counters
        (``"samples:<reason>"``, ``"shards:<reason>"``) are under ``workers[i]["skipped"]``.
        """
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            workers = read_workers(self._stats_dir)
            if time.monotonic() >= deadline or self._workers_reached(workers):
                break
            time.sleep(0.05)
        return {**summarize(workers), "loader": dict(self._timing)}

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
        stop_pipe(pipe)

    def close(self) -> None:
        """Stop the pipeline and its worker processes and free their shared memory.

        Never hangs: after a worker died, DALI's own shutdown can block on a lock the dead
        process held; it then gets a bounded time before the workers are killed."""
        if self._closed:
            return
        self._closed = True
        _open_loaders.discard(self)
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
