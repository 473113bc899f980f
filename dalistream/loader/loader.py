"""The torch-facing loader: runs a dalistream pipeline and yields dicts of torch tensors.

``len()`` is the number of batches the next iteration yields (computed from counts before the
epoch starts), ``set_epoch(e)`` selects the epoch (the one a loaded state stands in goes on),
``state_dict()``/``load_state_dict()`` save and restore the position mid-epoch, on the same layout
or another (elastic resume, :mod:`dalistream.plan.resume`). Padding (``valid == 0``) is removed
here, so users only ever see real samples.

Every rank yields exactly ``len()`` batches, under every policy: a DDP loop runs a collective per
batch (an ``all_reduce`` of a metric, of gradients), and one batch fewer on one rank hangs the
others. A batch without a sample is yielded *empty* (every tensor's first dimension 0, every list
empty): under ``exact`` the last step of a rank that no sample is left for (fewer samples than
ranks remain for that step, :mod:`dalistream.plan.ownership`), and under any policy a batch
whose samples were all skipped (``on_error``/``missing="skip"``). ``stats()`` counts them
(``empty_batches``, per epoch under ``by_epoch``), ``warn_empty=True`` warns at each epoch's first;
a DDP training step takes them like any other (forward, a zero loss, backward: docs/guide/training.md).
The DALI pipeline runs on across epoch boundaries;
it is rebuilt only when the position asked for is not where it stands (``set_epoch`` to
another epoch, ``load_state_dict``).
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import time
import weakref
from typing import Any, Callable, Dict, Iterator, Optional

from ..dali.compat import consumer_stream, decodes_images, exec_dynamic, torch_utils
from ..dali.diagnose import translate
from ..dali.pipeline import built, raw_pipeline
from ..dali.watchdog import spawn_without_main, stop_pipe, watched_run
from ..dali.device import check_current_device, check_torch_cuda
from ..errors import StateError
from ..lifetime import temp_folder
from ..stream import Stream
from ..worker import read_workers, summarize
from .convert import BufferPool, to_torch
from .progress import WAIT_WARNING, Watch
from .ranks import distributed_layout, relaid
from .state import (STATE_VERSION, differences, identity_of, node_report, read_state, resumed_at, said_node_change,
                    sealed)

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


class Loader:
    """Iterate a dalistream pipeline as dicts of torch tensors (CUDA tensors on GPU).

    Use as ``with Loader(...) as loader: for batch in loader: ...``. What it shows of itself is in
    :mod:`dalistream.loader.progress`: none of it stops a job.

    Args:
        stream: what to read, from :meth:`dalistream.Stream.open`.
        pipeline: a function decorated with :func:`dalistream.pipeline_def`; ``None``: the raw fields.
        transform: a function applied to each batch dict (after padding is removed), whose result
            is yielded, e.g. to turn caption bytes into ``str``.
        progress: ``True`` draws a bar per epoch on rank 0 with samples/s and the share of time
            the training loop waited for data; ``"all"`` on every rank.
        stats_dir: a run folder (shared by the ranks) where this rank writes its figures every few
            seconds and at the end of each epoch, for ``dalistream stats RUN_DIR``.
        wait_warning: when the training loop waits for data more than this share of its time over
            a window of batches, one warning names the likely stage; ``None``: never.
        warn_empty: one warning per epoch at its first empty batch (no sample: ``exact``'s last
            step of a rank no sample is left for, or every sample of the batch skipped), which a
            training step must still take (forward, a zero loss, backward: the guide's loop);
            ``stats()["by_epoch"][e]["empty_batches"]`` counts them either way.
        pipeline_kwargs: the pipeline function's own arguments (``size=224``, …).
    """

    def __init__(self, stream: Stream, pipeline: Optional[Callable] = None, *,
                 transform: Optional[Callable[[Dict[str, Any]], Any]] = None, progress: Any = False,
                 stats_dir: Optional[str] = None, wait_warning: Optional[float] = WAIT_WARNING,
                 warn_empty: bool = False, **pipeline_kwargs: Any) -> None:
        if stream.device == "gpu":  # before the first batch: its tensors are CUDA tensors
            check_torch_cuda(stream.device_id)
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
        self._stats_dir = temp_folder("stats")  # named by its owner: the next run removes it if this one is killed
        me = weakref.ref(self)  # no cycle: a loader dropped without close() is closed by __del__ at once
        self._watch = Watch(progress=progress, wait_warning=wait_warning, warn_empty=warn_empty, run_dir=stats_dir,
                            counters=lambda: me().stats(), decodes=lambda: decodes_images(me()._pipe))
        self._identity: Optional[Dict[str, Any]] = None  # the sources' identity, read at the first state taken
        self._from_nodes: Optional[int] = None  # the node count of a state loaded (affinity="node")
        self._group_seen = False  # rank and world size checked against an initialised torch.distributed
        self._samples, self._empty, self._closed = 0, False, False  # of the last batch taken (for the figures)
        self._device_checked = stream.device != "gpu"
        _track(self)

    # -- iteration ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches the next ``iter()`` yields, on every rank the same: the rest of the epoch after
        a resume (empty batches included, see the module doc)."""
        self._check_group()
        steps = self._steps()
        return steps - self.step if self.step < steps else self.stream.steps(self.epoch + 1)

    def _steps(self) -> int:
        return self.stream.steps(self.epoch, self.resume)

    def _check_group(self) -> None:
        """Rank and world size again, once ``torch.distributed`` is initialised (:mod:`.ranks`)."""
        if self._group_seen:
            return
        group = distributed_layout()
        if group is None:
            return
        stream = relaid(self.stream, group)
        self._group_seen = True
        if stream is not self.stream:
            self._shutdown_pipe()
            self.stream = stream

    def set_epoch(self, epoch: int, *, restart: bool = False) -> None:
        """Iterate ``epoch`` at the next ``iter()``. The epoch the loader stands in (a loaded
        state's, or one broken off) goes on where it stands; another epoch, or ``restart=True``,
        starts from its first batch."""
        if int(epoch) != self.epoch or restart:
            self.epoch, self.step, self.resume = int(epoch), 0, ()

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._closed:
            raise RuntimeError("loader is closed")
        self._check_group()
        steps = self._steps()
        if self.step >= steps:  # a finished epoch: the next one
            self.epoch, self.step, self.resume = self.epoch + 1, 0, ()
            steps = self._steps()
        if not self._device_checked:  # once, when the model is usually on its device already
            self._device_checked = True
            check_current_device(self.stream.device_id)
        if self._pipe is None or self._pipe_at != (self.epoch, self.step, self.resume):
            self._build()
        watch = self._watch
        watch.epoch(self.stream.config.rank, self.stream.config.world_size, self.epoch, self.step, steps)
        try:
            while self.step < steps:
                t0 = time.perf_counter()
                batch = self._run()
                t1 = time.perf_counter()
                self.step += 1
                watch.took(t1 - t0, self._samples, self.step, self._empty)
                self._pipe_at = (self.epoch, self.step, self.resume)
                yield batch
                watch.stepped(time.perf_counter() - t1)
        finally:  # the epoch ended, or the loop broke off: the bar closes, the run folder is written
            watch.ended()
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
        self._watch.started()

    def _run(self) -> Any:
        try:
            # DALI's torch helpers imported while the batch is computed (the first batch's path)
            outputs = watched_run(self._pipe, consumer_stream(self._pipe), meanwhile=torch_utils)
        except BaseException as e:  # after a failure (or Ctrl-C) the pipeline is dead: never run it again
            self._shutdown_pipe()
            if not isinstance(e, Exception):
                raise
            raise translate(e, self.stream.config.rank,
                            (self.stream.at(self.epoch, self.step, resume=self.resume), self.epoch, self.step)) from None
        batch = to_torch(self._outputs, outputs, self._buffers, zero_copy=exec_dynamic(self._pipe))
        self._samples = len(next(iter(batch.values()), ()))
        # an empty batch is yielded all the same: every rank yields len() batches
        self._empty = bool(batch) and all(len(value) == 0 for value in batch.values())
        return self.transform(batch) if self.transform is not None else batch

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Plain data to resume from, on this layout or any other (:mod:`.state`): the position
        (epoch, step), the layout it stands in, the ``segments`` of this epoch that ran under
        earlier layouts (``[world_size, workers, batch_size, steps]`` each, of the layout the plan
        split: its columns ``[R·B, 1, 1, steps]`` when reading interleaved), what must not change
        (seed, policy, shuffle, interleave, buckets, the sources' identity and content versions), and a
        digest of it all. Rank 0's state resumes every rank. The sources' content versions are
        read the first time (a ``stat`` per local shard, a HEAD per remote one), then kept."""
        c = self._current().config
        if self._identity is None:
            self._identity = identity_of(self.stream)
        return sealed({
            "version": STATE_VERSION,
            "loader": {"epoch": self.epoch, "step": self.step},
            "plan": {"seed": c.seed, "rank": c.rank, "world_size": c.world_size, "workers": c.workers,
                     "batch_size": c.batch_size, "policy": c.policy, "shuffle": c.shuffle, "interleave": c.interleave,
                     "batches_per_epoch": c.batches_per_epoch, "shuffle_shards": c.shuffle_shards,
                     "nodes": c.nodes.count if c.nodes is not None else None,
                     "buckets": c.buckets.plain() if c.buckets is not None else None, "sources": self._identity},
            "segments": [list(s) for s in self.resume],
        })

    def _current(self) -> Stream:
        self._check_group()
        return self.stream

    def load_state_dict(self, state: Dict[str, Any], *, allow_layout_change: bool = True,
                        allow_content_change: bool = False) -> None:
        """Continue the saved epoch where the state stands. Under the saved layout the batches are
        those the saved run would have yielded; under another (ranks, workers, batch size) the
        rest of the epoch is planned over this layout (:mod:`dalistream.plan.resume`): ``exact``
        delivers every sample of the epoch once over all runs, ``even`` none twice, ``fixed``
        the remaining batches. ``fixed`` without counts restarts the saved epoch (with a warning).
        A state edited or damaged (its digest), or of other sources (names, counts, sizes, or
        content rewritten since: :mod:`.state`), seed, policy or shuffle is a :class:`StateError`
        saying what differs; ``allow_layout_change=False`` refuses a layout change too, and
        ``allow_content_change=True`` resumes shards whose content versions changed (the same bytes
        copied back into place) with a warning."""
        current = self.state_dict()["plan"]
        epoch, step, saved, segments, version = read_state(state, current)
        problems, doubts = differences(saved, current, self.stream.digest, allow_content_change)
        saved_layout = (saved["world_size"], saved["workers"], saved["batch_size"], saved["nodes"])
        layout = (current["world_size"], current["workers"], current["batch_size"], current["nodes"])
        if saved_layout != layout and not allow_layout_change:
            problems.append(f"layout: saved {saved_layout}, this loader {layout} (ranks, workers, batch size, nodes)")
        if problems:
            rewritten = any("rewritten" in p for p in problems)
            raise StateError("saved state does not fit this loader: " + "; ".join(problems),
                             hint="resume with the same data set, seed, policy and shuffle settings"
                             + ("; if the shards hold the same bytes as then (copied back into place), pass "
                                "allow_content_change=True" if rewritten else ""))
        if version < 5:
            log.warning("a loader state of version %d (an older dalistream) carries no digest of itself and no "
                        "content versions of its shards: it cannot prove it is unedited, nor that the shards are "
                        "the same content; resumed on their names, counts and sizes", version)
        for doubt in doubts:
            log.warning("resuming a loader state: %s", doubt)
        if version < 5 and saved["policy"] == "exact" and (step or segments):
            log.warning("policy 'exact' deals the last step's samples otherwise since state version 5: a state of "
                        "version %d taken inside epoch %d cannot say which samples it delivered; the epoch restarts "
                        "from its first batch (samples of its first %d steps are seen again)", version, epoch, step)
            segments, step = (), 0
        if saved_layout != layout:
            if self.stream.data.counts is None:
                log.warning("policy 'fixed' without counts cannot continue epoch %d on another layout: it restarts "
                            "from its first batch (samples of its first %d steps are seen again)", epoch, step)
                segments, step = (), 0
            else:
                segments, step = resumed_at(self.stream, saved, segments, step)
        steps = self.stream.steps(epoch, segments)  # validates the segments against the data set
        if step > steps:
            raise StateError(f"saved step {step} is past the end of epoch {epoch}, which has {steps} steps",
                             hint="the state does not come from this data set and layout")
        self.epoch, self.step, self.resume = epoch, step, segments
        self._from_nodes = saved["nodes"]
        said_node_change(node_report(self.stream, self._from_nodes))

    # -- counters ----------------------------------------------------------------------------

    def stats(self, wait_s: float = 0.0) -> Dict[str, Any]:
        """Per-worker counters (bytes read, samples, padding, skips, where the time went) and their
        sums, and the training loop's side under ``loader``: ``wait_s``, the time it waited for
        batches (the input pipeline was the limit; the first includes the workers' start),
        ``step_s``, the time it spent between batches (its own step), ``empty_batches``, the
        batches that held no sample (yielded empty: see the module doc), and more, in all and per
        epoch (:meth:`dalistream.loader.progress.Watch.figures`); with ``affinity="node"``, ``affinity``:
        this rank's node, its shards and samples, and after a resume onto another node count the
        share of them its cache still holds (:func:`~dalistream.loader.state.node_report`).
        The totals and skips cover the epochs up to :meth:`delivered_epoch`: what a worker read
        ahead into the next epoch is counted in that epoch, under ``by_epoch`` only, marked
        ``read_ahead: True`` while this loader has not entered it (the caller may never start it).
        Epochs are numbered as ``set_epoch`` numbers them (from 0).
        See :mod:`dalistream.worker.stats` for the workers' counters.

        Workers write their counters every ~0.5 s (and within ~0.5 s of the last batch they made,
        so a loader stopped early reads them whole), soon after every skip, and when they finish
        an epoch. ``wait_s`` > 0 waits up to that long for every worker to have written counters up to
        the loader's position (exact at the end of an epoch). Skips are summed as
        ``skipped_samples`` and ``skipped_shards`` and broken down by reason in
        ``skipped = {"samples": {reason: n}, "shards": {reason: n}}``, since the pipeline started;
        ``by_epoch[e]`` holds the totals, the same three keys, the remote and cache I/O (``io``)
        and ``empty_batches`` for epoch ``e`` alone. Each worker's raw counters
        (``"samples:<reason>"``, ``"shards:<reason>"``) are under ``workers[i]["skipped"]``.
        """
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            workers = read_workers(self._stats_dir)
            if time.monotonic() >= deadline or self._workers_reached(workers):
                break
            time.sleep(0.05)
        nodes = node_report(self.stream, self._from_nodes)
        out = summarize(workers, through=self.delivered_epoch())
        figures = self._watch.figures()
        for epoch, sums in out["by_epoch"].items():
            sums["empty_batches"] = figures["by_epoch"].get(epoch, {}).get("empty_batches", 0)
        return {**out, "loader": figures, **({"affinity": nodes} if nodes is not None else {})}

    def summary(self, epoch: Optional[int] = None) -> str:
        """One line about this rank's ``epoch`` (the ``set_epoch`` number; default: the last one
        entered, :meth:`delivered_epoch`), e.g. ``rank 0, epoch 1: 640 samples in 10 batches,
        812.3 samples/s, data wait 4% of the loop's time, 0 samples and 0 shards skipped, 0 B from
        the store, 7.4 MB from the cache``: samples and batches taken (and how many were empty),
        samples/s, the share of the loop's time spent waiting for data, skips, and, reading from
        a remote store, the bytes fetched from it and (through a byte cache) those read from the
        cache, in that epoch alone. An epoch only partly taken says at which step it stands."""
        return self._watch.summary(self.stats(), self.delivered_epoch() if epoch is None else int(epoch))

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
            self._watch.pause()
            self._watch.publish()  # the rank's last figures, into the run folder if there is one
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
