"""Every use of DALI's and torch's internals, in one place, each with its own test
(``tests/dali/test_compat.py``). dalistream is pinned to DALI 2.4.x; :func:`check_versions`
warns once when another version is found, naming the shims that may need a look.

- AutoGraph: :func:`do_not_convert` marks a function the way ``nvidia.dali.pipeline.do_not_convert``
  does (the ``autograph_info__`` attribute) without importing DALI; :func:`converted` applies the
  converter DALI uses for pipeline definitions (``nvidia.dali._conditionals._autograph``).
- Worker processes of a pipeline (``Pipeline._py_pool.pool._processes``), its shutdown
  (``Pipeline._shutdown``, ``_py_pool.close``) and the pool's observer thread (``_observer``).
- The entry point DALI's worker pool starts its processes with (``_multiproc.pool.worker``),
  wrapped so that every worker ends with the process that started it (:func:`workers_die_with_parent`).
- The queues of that pool (``_multiproc.pool.ShmQueue``, its ``cv_not_empty``): a condition whose
  notify does not wait for the woken process (:func:`light_queues`).
- The CUDA state DALI's backend sees (``IsDriverInitialized``, ``GetCUDADeviceCount``; the count
  is asked in a child process by :func:`dalistream.dali.device.gpu_count`, so that this one's CUDA
  stays uninitialized and workers may fork).
- DALI's torch helpers (``nvidia.dali.plugin.pytorch.torch_utils``) and torch's reference counts
  of a tensor and its storage (``Tensor._use_count``, ``torch._C._storage_Use_Count``).
- The consumer's CUDA stream given to ``Pipeline.run(stream)`` (dynamic executor only in DALI 2.4),
  and the device DALI reads for the legacy default stream (the calling thread's current one).
- The graph behind a pipeline's outputs (``DataNode.source``, ``_OperatorInstance.inputs``): which
  nodes the outputs depend on, so that fields nobody uses are not read, and which operators on
  which device (``Pipeline._graph_out``, ``_OperatorInstance._op``); the pruning of their
  sources' unused outputs
  (``Pipeline._disable_pruned_external_source_instances``), whose warning is silenced for ours.
- What a parallel source's worker shipped, rewritten in the main process before DALI feeds it
  (``_ExternalSourceGroup.schedule_and_receive``, ``_ExternalDataBatch._data``,
  ``source_desc.source``), and a batch of rows as one ``TensorListCPU`` without a copy.
- ``spawn`` without re-running the user's script: ``__main__.__spec__``/``__file__`` hidden while
  DALI starts its workers (multiprocessing's spawn re-imports the main module from them).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Iterator, List, Optional, Sequence, TypeVar

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable)

DALI_TESTED = "2.4."
TORCH_MIN = (2, 4)
_checked: List[bool] = []


def check_versions() -> None:
    """Warn (once per process) when DALI or torch is not a version these shims were tested with."""
    if _checked:
        return
    _checked.append(True)
    import nvidia.dali

    if not nvidia.dali.__version__.startswith(DALI_TESTED):
        warnings.warn(f"dalistream was tested with DALI {DALI_TESTED}x, found {nvidia.dali.__version__}: the "
                      "shims in dalistream.dali.compat (AutoGraph, worker pool, shutdown) may need a look",
                      RuntimeWarning, stacklevel=2)
    try:
        import torch
    except ImportError:
        return
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < TORCH_MIN:
        warnings.warn(f"dalistream needs torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]}, found {torch.__version__}",
                      RuntimeWarning, stacklevel=2)


# -- AutoGraph ---------------------------------------------------------------------------------

def do_not_convert(fn: F) -> F:
    """Mark ``fn`` so DALI's AutoGraph calls it as it is (no rewrite of its ``if``s): what
    ``nvidia.dali.pipeline.do_not_convert`` does, without importing DALI."""
    fn.autograph_info__ = None  # type: ignore[attr-defined]
    return fn


def converted(fn: F) -> F:
    """``fn`` as DALI's AutoGraph converts it, also when called from code it leaves alone (an
    ``if`` on data inside ``fn`` becomes a DALI conditional). Converted at first call."""
    state: dict = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "fn" not in state:
            from nvidia.dali._conditionals import _autograph

            state["fn"] = _autograph.convert(recursive=True, user_requested=True)(fn)
        return state["fn"](*args, **kwargs)

    return do_not_convert(call)  # type: ignore[return-value]


# -- worker processes and shutdown ---------------------------------------------------------------

def worker_processes(pipe: Any) -> list:
    """The ``multiprocessing.Process`` objects of the pipeline's Python workers (empty if none)."""
    pool = getattr(pipe, "_py_pool", None)
    return list(getattr(getattr(pool, "pool", None), "_processes", None) or [])


def shutdown(pipe: Any) -> None:
    """DALI's own shutdown of the pipeline, then of its worker pool (may block on a dead worker's lock)."""
    try:
        pipe._shutdown()
    finally:
        pool = getattr(pipe, "_py_pool", None)
        if pool is not None:
            pool.close()


def forget_observer(pipe: Any) -> None:
    """Detach the worker pool's observer thread, whose ``close()`` would block again at exit after
    a shutdown that did not finish."""
    observer = getattr(getattr(getattr(pipe, "_py_pool", None), "pool", None), "_observer", None)
    if observer is not None:
        observer.thread = None


class _ParentWatched:
    """DALI's worker entry point, run after :func:`dalistream.lifetime.die_with_parent`.

    The parent's death signal (Linux) is asked for only when the thread that starts the worker
    is the parent's main thread, which lives as long as the parent process: the kernel sends it
    when the starting *thread* ends, and a loader may be built from a thread that ends before
    the loader does. With ``spawn`` the object is pickled, by that thread, just before it starts
    the process (:meth:`__reduce__`); with ``fork`` the child's only thread is a copy of it (same
    thread id)."""

    def __init__(self, target: Callable, main_thread: Optional[int], parent: Optional[int] = None,
                 from_main: bool = False) -> None:
        self.target, self.main_thread, self.parent, self.from_main = target, main_thread, parent, from_main

    def __reduce__(self) -> tuple:
        return (_ParentWatched, (self.target, None, os.getpid(), threading.get_ident() == self.main_thread))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from ..lifetime import die_with_parent

        if self.parent is not None:  # spawned: what the parent said
            parent, from_main = self.parent, self.from_main
        else:  # forked: this thread is the copy of the one that forked
            started_by = multiprocessing.parent_process()
            parent = started_by.pid if started_by is not None else os.getppid()
            from_main = threading.get_ident() == self.main_thread
        die_with_parent(parent, death_signal=from_main)
        return self.target(*args, **kwargs)


def workers_die_with_parent() -> None:
    """Have every worker process DALI's pools start from now on end when the process that started
    it dies, SIGKILL included (:func:`dalistream.lifetime.die_with_parent`): DALI's workers
    otherwise wait for ever on their task queues, orphaned, holding their memory. DALI starts a
    worker with ``Process(target=worker)``, ``worker`` looked up in ``_multiproc.pool`` at each
    start: that name is wrapped, once per process."""
    from nvidia.dali._multiproc import pool

    if not isinstance(pool.worker, _ParentWatched):
        pool.worker = _ParentWatched(pool.worker, threading.main_thread().ident)


# -- the pool's queues ---------------------------------------------------------------------------

class QueueCondition:
    """A condition for processes, in place of ``multiprocessing.Condition`` in the queues of DALI's
    worker pool (``ShmQueue.cv_not_empty``), whose :meth:`notify` does not wait for the woken
    process to run. multiprocessing's ``notify`` blocks, holding the queue's lock, until the
    sleeper has woken and said so (``_woken_count``): a handshake between processes for every task
    sent to a worker and every batch a worker returns, which costs a context switch each on a
    loaded machine, and which never ends when the sleeper died meanwhile.

    Two counting semaphores: ``sleeping`` counts the waiters not yet woken, ``wake`` the wake-ups
    not yet taken; every waiter inside :meth:`wait` is counted by exactly one of them (a waiter
    whose timeout ran out takes its own count back, or, if a notify took it first, that notify's
    wake-up). A waiter that registers under the lock before it sleeps cannot miss a later notify;
    a wake-up may go to another waiter than the longest sleeping (waiters re-check their predicate,
    as with any condition); a waiter that died asleep leaves a count whose wake-up wakes the next
    waiter once, spuriously, instead of hanging the notifier."""

    def __init__(self, ctx: Any, lock: Any) -> None:
        self._lock = lock
        self._sleeping = ctx.Semaphore(0)
        self._wake = ctx.Semaphore(0)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Release the lock (held by the caller), sleep until notified or ``timeout`` seconds
        passed, take the lock again; whether notified."""
        self._sleeping.release()
        self._lock.release()
        try:
            woken = self._wake.acquire(True, timeout)
            if not woken and not self._sleeping.acquire(False):
                self._wake.acquire()  # a notify counted this waiter meanwhile: its wake-up is this one's
                woken = True
            return woken
        finally:
            self._lock.acquire()

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters (the caller holds the lock), without waiting for them."""
        for _ in range(n):
            if not self._sleeping.acquire(False):
                return
            self._wake.release()


class _LightQueues:
    """DALI's ``ShmQueue`` constructor as ``_multiproc.pool`` calls it, each queue then given a
    :class:`QueueCondition` on its own lock."""

    def __init__(self, make: Callable) -> None:
        self.make = make

    def __call__(self, mp: Any, capacity: int) -> Any:
        queue = self.make(mp, capacity)
        queue.cv_not_empty = QueueCondition(mp, queue.lock)
        return queue


def light_queues() -> None:
    """Have the queues of every worker pool DALI makes from now on (tasks to the workers, results
    back) wake their waiters with a :class:`QueueCondition`. DALI makes them with
    ``ShmQueue(mp, capacity=...)``, ``ShmQueue`` looked up in ``_multiproc.pool`` at each pool:
    that name is wrapped, once per process; the queues travel to spawned workers with their
    condition."""
    from nvidia.dali._multiproc import pool

    if not isinstance(pool.ShmQueue, _LightQueues):
        pool.ShmQueue = _LightQueues(pool.ShmQueue)


# -- the graph ----------------------------------------------------------------------------------

def _walk(outputs: Any) -> Iterator[Any]:
    """Every DALI ``DataNode`` the nodes in ``outputs`` are computed from (themselves included), once."""
    seen: set = set()
    todo = list(outputs)
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        source = getattr(node, "source", None)
        if source is not None:
            todo.extend(getattr(source, "inputs", None) or ())


def upstream(outputs: Any) -> set:
    """The ``id()`` of every DALI ``DataNode`` the nodes in ``outputs`` are computed from (themselves
    included): the part of the graph DALI keeps when it prunes what no output needs."""
    return {id(node) for node in _walk(outputs)}


def operators(pipe: Any) -> set:
    """``(schema name, device)`` of every operator a defined pipeline's outputs are computed from
    (``Pipeline._graph_out``, each node's ``source._op``): what it would run, read before (or
    without) a build, so a GPU graph can be checked on a machine without one."""
    found = set()
    for node in _walk(getattr(pipe, "_graph_out", None) or ()):
        source = getattr(node, "source", None)
        if source is not None:
            found.add((getattr(source._op, "schema_name", type(source._op).__name__), source._op.device))
    return found


def current_pipeline() -> Any:
    """The DALI pipeline being defined (``Pipeline.current()``; ``None`` outside a definition)."""
    from nvidia.dali import Pipeline

    return Pipeline.current()


def quiet_pruned_sources(pipe: Any, name: str) -> None:
    """Silence DALI's warning that an output of one of dalistream's sources (whose ``repr`` starts
    with ``name``) is not used (``Pipeline._disable_pruned_external_source_instances``, run when the
    graph is built): the fields no output needs are left out on purpose, the sources ship a
    placeholder for them and DALI feeds nothing. Other sources' warnings stay."""
    original = pipe._disable_pruned_external_source_instances

    def disable() -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=f"The external source node '{name}")
            original()

    pipe._disable_pruned_external_source_instances = disable


# -- CUDA as DALI sees it -----------------------------------------------------------------------

def cuda_driver_state() -> Optional[bool]:
    """Whether CUDA's driver is initialized in this process, as DALI's backend says
    (``IsDriverInitialized``); ``None`` without DALI's backend or a usable driver (no libcuda)."""
    try:
        from nvidia.dali.backend import IsDriverInitialized

        return bool(IsDriverInitialized())
    except Exception:  # no backend, no driver: CPU only
        return None


def cuda_count_here() -> int:
    """DALI's GPU count asked in this process (``GetCUDADeviceCount``): it initializes CUDA here, so
    only once :func:`cuda_driver_state` says it is (:func:`dalistream.dali.device.gpu_count`)."""
    from nvidia.dali.backend import GetCUDADeviceCount

    return int(GetCUDADeviceCount())


def cuda_initialized() -> bool:
    """True when CUDA's driver is initialized in this process (a forked child could not use it).
    Unknown counts as initialized: the caller then takes the safe choice."""
    try:
        from nvidia.dali.backend import IsDriverInitialized

        return bool(IsDriverInitialized())
    except Exception:
        return True


def decodes_images(pipe: Any) -> bool:
    """Whether a built pipeline's graph holds an image decoder (``fn.decoders.*``): the loader's
    data-wait warning then names decode, not the merge, when the workers sit idle (DALI's
    operator list is private: ``Pipeline._ops``, each instance's ``_op`` class)."""
    try:
        return any(type(op._op).__module__.endswith(".decoders") for op in getattr(pipe, "_ops", None) or ())
    except Exception:  # an unknown DALI layout: no opinion
        return False


# -- torch ----------------------------------------------------------------------------------------

def exec_dynamic(pipe: Any) -> bool:
    """Whether ``pipe`` runs on DALI's dynamic executor (``Pipeline.exec_dynamic``), whose outputs
    stay valid while referenced, so torch may take them without a copy (DALI's own iterator does)."""
    return bool(getattr(pipe, "exec_dynamic", False))


def consumer_stream(pipe: Any) -> Any:
    """The CUDA stream a batch is handed over on: torch's current stream on the pipeline's GPU, for
    :func:`run_batch`. DALI then orders its outputs on that stream (the consumer's kernels wait for
    DALI's work on the GPU, the host does not) and frees their buffers in that order; without it
    ``pipe.run()`` waits on the host for every batch's GPU work. ``None`` for a CPU pipeline, and
    for one off DALI's dynamic executor (DALI 2.4 takes a stream only under that executor). Asked
    on the consuming thread: torch's current stream is per thread."""
    device_id = getattr(pipe, "device_id", None)
    if device_id is None or int(device_id) < 0 or not exec_dynamic(pipe):
        return None
    import torch

    return torch.cuda.current_stream(int(device_id))


def run_batch(pipe: Any, stream: Any = None) -> Any:
    """``pipe.run(stream)``: the next batch's outputs, ordered on ``stream`` (from
    :func:`consumer_stream`), or host-synchronous (``pipe.run()``) when it is ``None``. The
    pipeline's GPU is made this thread's current device meanwhile: DALI takes the device of the
    legacy default stream (handle 0, torch's default) from the calling thread's current device."""
    if stream is None:
        return pipe.run()
    import torch

    with torch.cuda.device(int(pipe.device_id)):
        return pipe.run(stream)


def torch_utils() -> Any:
    """DALI's torch helpers module (``feed_ndarray``, ``to_torch_tensor``, ``to_torch_type``)."""
    from nvidia.dali.plugin.pytorch import torch_utils as utils

    return utils


def only_reference(tensor: Any) -> bool:
    """True when only a pool's list and the caller's loop variable refer to ``tensor`` (called
    directly from that loop), and no other tensor, view, autograd record or NumPy array shares its
    storage (CPython and torch reference counts)."""
    import torch

    return (sys.getrefcount(tensor) <= 4 and tensor._use_count() == 1
            and torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) <= 2)


# -- parallel sources: a shipped batch before DALI feeds it --------------------------------------

_receivers: "weakref.WeakKeyDictionary[Any, Callable[[list], list]]" = weakref.WeakKeyDictionary()
_HOOKED = "__dalistream_receive__"


@functools.lru_cache(maxsize=None)
def receivable() -> bool:
    """Whether :func:`on_receive` can hook this DALI (the names it needs are there)."""
    try:
        from nvidia.dali import external_source as es

        es._ExternalSourceGroup.schedule_and_receive  # noqa: B018
        return hasattr(es._ExternalDataBatch(None, None, [], 0), "_data")
    except (ImportError, AttributeError, TypeError):
        return False


@do_not_convert  # its hook runs per batch for every parallel source: never AutoGraph-converted
def on_receive(source: Any, receive: Callable[[list], list]) -> None:
    """Have ``receive(outputs)`` rewrite every batch the worker of ``source`` (the iterable given
    to a parallel ``fn.external_source``) ships, in the main process, before DALI feeds it.

    DALI's ``_ExternalSourceGroup.schedule_and_receive`` is wrapped once; the wrapper looks the
    group's source (``source_desc.source``) up and replaces the received outputs
    (``_ExternalDataBatch._data``); other sources pass untouched. dalistream's byte fields travel
    only this way, so a DALI that lacks those names is an error (:func:`receivable`)."""
    if not receivable():
        import nvidia.dali

        raise RuntimeError(f"DALI {nvidia.dali.__version__} lacks what dalistream's sources need "
                           "(_ExternalSourceGroup.schedule_and_receive, _ExternalDataBatch._data): "
                           f"install nvidia-dali {DALI_TESTED}x")
    from nvidia.dali import external_source as es

    group = es._ExternalSourceGroup
    original = group.schedule_and_receive
    if not getattr(original, _HOOKED, False):
        @functools.wraps(original)
        def schedule_and_receive(self, *args, **kwargs):
            batch = original(self, *args, **kwargs)
            try:
                receive = _receivers.get(getattr(getattr(self, "source_desc", None), "source", None))
            except TypeError:  # a source that cannot be weakly referenced (None, …): never registered
                receive = None
            if receive is not None:
                batch._data = receive(list(batch._data))
            return batch

        setattr(schedule_and_receive, _HOOKED, True)
        group.schedule_and_receive = schedule_and_receive
    _receivers[source] = receive


@functools.lru_cache(maxsize=None)
def _empty_tensor() -> Any:
    import numpy as np
    from nvidia.dali.tensors import TensorCPU

    return TensorCPU(np.zeros(0, np.uint8), "")


def empty_rows(batch_size: int) -> List[Any]:
    """``batch_size`` empty rows (one shared empty ``TensorCPU``): the placeholder a source's
    :func:`tensor_list` starts every batch from (made once per source, in the main process)."""
    return [_empty_tensor()] * batch_size


@do_not_convert
def tensor_list(placeholder: List[Any], body: Any, positions: Sequence[int], starts: Sequence[int],
                ends: Sequence[int]) -> Any:
    """A batch of one-dimensional ``uint8`` rows as one DALI ``TensorListCPU`` that refers to them,
    no copy: ``placeholder`` (:func:`empty_rows`, left untouched) with row ``body[starts[k]:ends[k]]``
    at position ``positions[k]``. Only those rows become tensors (what DALI's feeding would build
    one per position, with a type check each)."""
    from nvidia.dali.tensors import TensorCPU, TensorListCPU

    tensors = list(placeholder)
    for i, a, b in zip(positions, starts, ends):
        tensors[i] = TensorCPU(body[a:b], "")
    return TensorListCPU(tensors, "", False)


# -- spawn ------------------------------------------------------------------------------------------

@contextlib.contextmanager
def main_hidden_from_spawn(hide: bool = True) -> Iterator[None]:
    """While DALI starts its workers, keep ``spawn`` from re-running the user's script in each
    (``__main__``'s ``__spec__`` and ``__file__`` hidden): seconds of ``import torch`` and
    hundreds of MB per worker that dalistream's own source objects do not need."""
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)
        if "__spec__" not in saved:
            main.__dict__.pop("__spec__", None)
