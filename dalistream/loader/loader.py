"""The torch-facing loader: runs a dalistream pipeline and yields dicts of torch tensors.

``len()`` is the number of batches the next iteration yields (computed from counts before the
epoch starts), ``set_epoch(e)`` selects the epoch (the one a loaded state stands in goes on),
``state_dict()``/``load_state_dict()`` save and restore the position mid-epoch, on the same layout
or another (elastic resume, :mod:`dalistream.plan.resume`). Padding (``valid == 0``) is removed
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
from ..plan import Layout, check_segments, continued
from ..stream import Stream
from ..worker import read_workers, summarize
from .convert import BufferPool, to_torch

STATE_VERSION = 4  # 4: interleave; 3: segments of an epoch under other layouts, sources by identity; 2: spans; 1: whole shards
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


INVARIANT = ("seed", "policy", "shuffle", "interleave", "batches_per_epoch", "shuffle_shards")  # a resume cannot change these


def read_state(state: Any, current: Dict[str, Any]) -> tuple:
    """``(epoch, step, saved plan, segments)`` of a state from :meth:`Loader.state_dict`; a
    :class:`StateError` naming what is missing or wrong, never a KeyError or TypeError."""
    def integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(state, dict):
        raise StateError(f"a loader state is a dict from Loader.state_dict(), got {type(state).__name__}")
    if state.get("version") not in (2, 3, STATE_VERSION):
        raise StateError(f"unknown loader state version {state.get('version')!r} (expected {STATE_VERSION})")
    for part in ("loader", "plan"):
        if not isinstance(state.get(part), dict):
            raise StateError(f"loader state has no {part!r} dict: got {state.get(part)!r}")
    position, saved = state["loader"], dict(state["plan"])
    for name in ("epoch", "step"):
        if not integer(position.get(name)) or position[name] < 0:
            raise StateError(f"loader state: {name} must be an integer >= 0, got {position.get(name)!r}")
    if state["version"] == 2:  # before elastic resume: no segments, sources a digest of the URLs
        saved.setdefault("shuffle_shards", current.get("shuffle_shards"))
    if state["version"] < 4:  # before interleaved reading
        saved.setdefault("interleave", False)
    missing = sorted(set(current) - set(saved))
    if missing:
        raise StateError(f"loader state: plan lacks {missing}")
    for name in ("world_size", "workers", "batch_size"):
        if not integer(saved[name]) or saved[name] < 1:
            raise StateError(f"loader state: {name} must be an integer >= 1, got {saved[name]!r}")
    segments = state.get("segments", [])
    if not isinstance(segments, list):
        raise StateError(f"loader state: segments must be a list, got {segments!r}")
    return position["epoch"], position["step"], saved, check_segments(segments)


def differences(saved: Dict[str, Any], current: Dict[str, Any], digest: str) -> list:
    """What keeps a saved state from resuming this loader, in words (empty: it fits)."""
    out = [f"{name}: saved {saved[name]!r}, this loader {current[name]!r}"
           for name in INVARIANT if saved.get(name) != current.get(name)]
    was, now = saved.get("sources"), current["sources"]
    if isinstance(now, dict) and "mix" in now or isinstance(was, dict) and "mix" in was:
        return out + ([] if was == now else [f"sources: another mix (saved {sorted((was or {}).get('mix', {}))}, "
                                             f"this loader {sorted(now.get('mix', {}))}; a mix resumes only with the "
                                             "same sources, counts, weights and choices)"])
    if isinstance(was, str):  # version 2: a digest of the URLs themselves
        return out + ([] if was == digest else ["sources: the shard URLs differ (a state of version 2 names its "
                                                "shards by URL; save again with this version to move them)"])
    if not isinstance(was, dict):
        return out + [f"sources: not a description of shards: {was!r}"]
    if was.get("shards") != now["shards"]:
        out.append(f"sources: {was.get('shards')} shards saved, {now['shards']} now")
    elif was.get("names") != now["names"]:
        out.append("sources: the shard names (relative to their folder or bucket prefix) differ")
    if was.get("samples") != now["samples"]:
        out.append(f"sources: {was.get('samples')} samples saved, {now['samples']} now")
    elif was.get("counts") != now["counts"]:
        out.append("sources: the per-shard sample counts differ")
    if None not in (was.get("sizes"), now["sizes"]) and was.get("sizes") != now["sizes"]:
        out.append("sources: the shard sizes in bytes differ")
    return out


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
        self.resume = stream.resume  # segments of this epoch run under other layouts (plan.resume)
        self._pipe = None
        self._pipe_at: Optional[tuple] = None
        self._built_resume: tuple = (self.epoch, self.resume)
        self._stats_dir = tempfile.mkdtemp(prefix="dalistream-stats-")
        self._timing = {"batches": 0, "wait_s": 0.0, "step_s": 0.0}  # see stats()
        self._closed = False
        _track(self)

    # -- iteration ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches the next ``iter()`` yields: the rest of the epoch after a resume (less any batch
        whose samples were all skipped)."""
        steps = self._steps()
        return steps - self.step if self.step < steps else self.stream.steps(self.epoch + 1)

    def _steps(self) -> int:
        return self.stream.steps(self.epoch, self.resume)

    def set_epoch(self, epoch: int, *, restart: bool = False) -> None:
        """Iterate ``epoch`` at the next ``iter()``. The epoch the loader stands in (a loaded
        state's, or one broken off) goes on where it stands; another epoch, or ``restart=True``,
        starts from its first batch."""
        if int(epoch) != self.epoch or restart:
            self.epoch, self.step, self.resume = int(epoch), 0, ()

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._closed:
            raise RuntimeError("loader is closed")
        steps = self._steps()
        if self.step >= steps:  # a finished epoch: the next one
            self.epoch, self.step, self.resume = self.epoch + 1, 0, ()
            steps = self._steps()
        if self._pipe is None or self._pipe_at != (self.epoch, self.step, self.resume):
            self._build()
        timing = self._timing
        while self.step < steps:
            t0 = time.perf_counter()
            batch = self._run()
            t1 = time.perf_counter()
            timing["batches"] += 1
            timing["wait_s"] += t1 - t0
            self.step += 1
            self._pipe_at = (self.epoch, self.step, self.resume)
            if batch is None:  # every sample of it was skipped: a batch of nothing is never trained on
                log.warning("batch %d of epoch %d holds no sample (all skipped, see Loader.stats()): not yielded",
                            self.step - 1, self.epoch)
                continue
            yield batch
            timing["step_s"] += time.perf_counter() - t1
        # the sources go straight on with the next epoch: the pipeline stays valid
        self.epoch, self.step, self.resume = self.epoch + 1, 0, ()
        self._pipe_at = (self.epoch, 0, ())

    def _build(self) -> None:
        self._shutdown_pipe()
        for path in glob.glob(os.path.join(self._stats_dir, "*.json")):
            os.remove(path)
        stream = self.stream.at(self.epoch, self.step, stats_dir=self._stats_dir, resume=self.resume)
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
        self._pipe_at = (self.epoch, self.step, self.resume)
        self._built_resume = (self.epoch, self.resume)  # the workers' step counts within the resumed segment

    def _run(self) -> Optional[Dict[str, Any]]:
        try:
            outputs = watched_run(self._pipe)
        except BaseException as e:  # after a failure (or Ctrl-C) the pipeline is dead: never run it again
            self._shutdown_pipe()
            if not isinstance(e, Exception):
                raise
            raise translate(e, self.stream.config.rank,
                            (self.stream.at(self.epoch, self.step, resume=self.resume), self.epoch, self.step)) from None
        batch = to_torch(self._outputs, outputs, self._buffers, zero_copy=exec_dynamic(self._pipe))
        if batch and all(len(value) == 0 for value in batch.values()):
            return None
        return self.transform(batch) if self.transform is not None else batch

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Plain data to resume from, on this layout or any other: the position (epoch, step), the
        layout it stands in, the ``segments`` of this epoch that ran under earlier layouts
        (``[world_size, workers, batch_size, steps]`` each, of the layout the plan split: its
        columns ``[R·B, 1, 1, steps]`` when reading interleaved), and what must not change (seed,
        policy, shuffle, interleave, the sources' identity). Rank 0's state resumes every rank."""
        c = self.stream.config
        return {
            "version": STATE_VERSION,
            "loader": {"epoch": self.epoch, "step": self.step},
            "plan": {"seed": c.seed, "rank": c.rank, "world_size": c.world_size, "workers": c.workers,
                     "batch_size": c.batch_size, "policy": c.policy, "shuffle": c.shuffle, "interleave": c.interleave,
                     "batches_per_epoch": c.batches_per_epoch, "shuffle_shards": c.shuffle_shards,
                     "sources": self.stream.identity},
            "segments": [list(s) for s in self.resume],
        }

    def load_state_dict(self, state: Dict[str, Any], *, allow_layout_change: bool = True) -> None:
        """Continue the saved epoch where the state stands. Under the saved layout the batches are
        those the saved run would have yielded; under another (ranks, workers, batch size) the
        rest of the epoch is planned over this layout (:mod:`dalistream.plan.resume`): ``exact``
        delivers every sample of the epoch once over all runs, ``even`` none twice, ``fixed``
        the remaining batches. ``fixed`` without counts restarts the saved epoch (with a warning).
        A state of other sources, seed, policy or shuffle is a :class:`StateError` saying what
        differs; ``allow_layout_change=False`` refuses a layout change too."""
        current = self.state_dict()["plan"]
        epoch, step, saved, segments = read_state(state, current)
        problems = differences(saved, current, self.stream.digest)
        saved_layout = (saved["world_size"], saved["workers"], saved["batch_size"])
        layout = (current["world_size"], current["workers"], current["batch_size"])
        if saved_layout != layout and not allow_layout_change:
            problems.append(f"layout: saved {saved_layout}, this loader {layout} (ranks, workers, batch size)")
        if problems:
            raise StateError("saved state does not fit this loader: " + "; ".join(problems),
                             hint="resume with the same data set, seed, policy and shuffle settings")
        if saved_layout != layout:
            if self.stream.data.counts is None:
                log.warning("policy 'fixed' without counts cannot continue epoch %d on another layout: it restarts "
                            "from its first batch (samples of its first %d steps are seen again)", epoch, step)
                segments, step = (), 0
            else:
                c = self.stream.config
                planned = self.stream.planned(Layout(*saved_layout))  # what the saved plan split
                segments, step = continued(segments, (planned.world_size, planned.workers, planned.batch_size), step,
                                           self.stream.planned(c.layout))
        steps = self.stream.steps(epoch, segments)  # validates the segments against the data set
        if step > steps:
            raise StateError(f"saved step {step} is past the end of epoch {epoch}, which has {steps} steps",
                             hint="the state does not come from this data set and layout")
        self.epoch, self.step, self.resume = epoch, step, segments

    # -- counters ----------------------------------------------------------------------------

    def stats(self, wait_s: float = 0.0) -> Dict[str, Any]:
        """Per-worker counters (bytes read, samples, padding, skips, where the time went) and their
        sums, and the training loop's side under ``loader``: ``wait_s``, the time it waited for
        batches (the input pipeline was the limit; the first includes the workers' start), and
        ``step_s``, the time it spent between batches (its own step), over ``batches`` batches.
        The totals and skips cover the epochs up to :meth:`delivered_epoch`: what a worker read
        ahead into the next epoch is counted in that epoch, under ``by_epoch`` only.
        See :mod:`dalistream.worker.stats` for the workers' counters.

        Workers write their counters every ~0.5 s, soon after every skip, and when they finish an
        epoch. ``wait_s`` > 0 waits up to that long for every worker to have written counters up to
        the loader's position (exact at the end of an epoch). Skips are summed as
        ``skipped_samples`` and ``skipped_shards`` and broken down by reason in
        ``skipped = {"samples": {reason: n}, "shards": {reason: n}}``, since the pipeline started;
        ``by_epoch[e]`` holds the totals and the same three keys for epoch ``e`` alone. Each worker's raw counters
        (``"samples:<reason>"``, ``"shards:<reason>"``) are under ``workers[i]["skipped"]``.
        """
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            workers = read_workers(self._stats_dir)
            if time.monotonic() >= deadline or self._workers_reached(workers):
                break
            time.sleep(0.05)
        return {**summarize(workers, through=self.delivered_epoch()), "loader": dict(self._timing)}

    def delivered_epoch(self) -> int:
        """The last epoch this loader has entered: its current one once a batch of it was taken (or
        before any batch at all), else the one it finished. The workers' read-ahead into later
        epochs is left out of :meth:`stats`' totals (it shows under ``by_epoch``)."""
        return self.epoch if self.step or self.epoch == self.stream.start_epoch else self.epoch - 1

    def _workers_reached(self, workers) -> bool:
        """True when every worker's counters are written up to the loader's position."""
        if self._pipe is None:  # nothing running: nothing more will be written
            return True
        if len(workers) < self.stream.config.workers:
            return False
        if self.step:
            target = (self.epoch, self.step)
        elif self.epoch > self.stream.start_epoch:
            built_epoch, built_resume = self._built_resume
            target = (self.epoch - 1, self.stream.steps(self.epoch - 1, built_resume if built_epoch == self.epoch - 1 else ()))
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
        return (f"Loader(shards={len(self.stream.data.urls)}, batch_size={c.batch_size}, workers={c.workers}, "
                f"rank={c.rank}/{c.world_size}, device={self.stream.device}, epoch={self.epoch}, step={self.step})")
