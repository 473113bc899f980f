"""Every use of DALI's and torch's internals, in one place, each with its own test
(``tests/dali/test_compat.py``). dalistream is pinned to DALI 2.4.x; :func:`check_versions`
warns once when another version is found, naming the shims that may need a look.

- AutoGraph: :func:`do_not_convert` marks a function the way ``nvidia.dali.pipeline.do_not_convert``
  does (the ``autograph_info__`` attribute) without importing DALI; :func:`converted` applies the
  converter DALI uses for pipeline definitions (``nvidia.dali._conditionals._autograph``).
- Worker processes of a pipeline (``Pipeline._py_pool.pool._processes``), its shutdown
  (``Pipeline._shutdown``, ``_py_pool.close``) and the pool's observer thread (``_observer``).
- The CUDA state DALI's backend sees (``GetCUDADeviceCount``, asked in a child process so that
  this one's CUDA stays uninitialized and workers may fork; ``IsDriverInitialized``).
- DALI's torch helpers (``nvidia.dali.plugin.pytorch.torch_utils``) and torch's reference counts
  of a tensor and its storage (``Tensor._use_count``, ``torch._C._storage_Use_Count``).
- The graph behind a pipeline's outputs (``DataNode.source``, ``_OperatorInstance.inputs``): which
  nodes the outputs depend on, so that fields nobody uses are not read; the pruning of their
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
import sys
import warnings
import weakref
from typing import Any, Callable, Iterator, List, Sequence, TypeVar

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


# -- the graph ----------------------------------------------------------------------------------

def upstream(outputs: Any) -> set:
    """The ``id()`` of every DALI ``DataNode`` the nodes in ``outputs`` are computed from (themselves
    included): the part of the graph DALI keeps when it prunes what no output needs."""
    seen: set = set()
    todo = list(outputs)
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        source = getattr(node, "source", None)
        if source is not None:
            todo.extend(getattr(source, "inputs", None) or ())
    return seen


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

# Paths an NVIDIA driver provides; where none exists there is no GPU to count (and no CUDA to start).
DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
# How often this process asked CUDA anything that may initialize it ("in_process") or had a child
# process ask ("child"): the test that nothing at import or collection touches CUDA reads these.
CUDA_QUERIES = {"in_process": 0, "child": 0}
_COUNT_SCRIPT = "from nvidia.dali.backend import GetCUDADeviceCount as c; print(int(c()))"
_device_count: Any = None


def cuda_device_count() -> int:
    """Number of CUDA devices DALI can see (0 without a driver or without DALI); no torch import.

    ``GetCUDADeviceCount`` initializes CUDA in the process that calls it, and DALI refuses to fork
    workers from a process whose CUDA is initialized ("Cannot fork a process when the CUDA has been
    initialized"). So the count is asked in a short-lived child process (once per process, about
    half a second, cached), unless CUDA is already initialized here; without an NVIDIA driver
    (:data:`DRIVER_PATHS`) it is 0 at once."""
    global _device_count
    if _device_count is None:
        _device_count = _count_devices()
    return _device_count


def _count_devices() -> int:
    import os
    import subprocess

    try:
        from nvidia.dali.backend import GetCUDADeviceCount, IsDriverInitialized
    except ImportError:
        return 0
    try:
        if IsDriverInitialized():  # already started here: asking costs nothing more
            CUDA_QUERIES["in_process"] += 1
            return int(GetCUDADeviceCount())
    except Exception:  # no driver, no libcuda: CPU only
        return 0
    if not any(os.path.exists(p) for p in DRIVER_PATHS):
        return 0
    CUDA_QUERIES["child"] += 1
    try:
        done = subprocess.run([sys.executable, "-c", _COUNT_SCRIPT], capture_output=True, text=True, timeout=120)
        return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0


def cuda_initialized() -> bool:
    """True when CUDA's driver is initialized in this process (a forked child could not use it).
    Unknown counts as initialized: the caller then takes the safe choice."""
    try:
        from nvidia.dali.backend import IsDriverInitialized

        return bool(IsDriverInitialized())
    except Exception:
        return True


# -- torch ----------------------------------------------------------------------------------------

def exec_dynamic(pipe: Any) -> bool:
    """Whether ``pipe`` runs on DALI's dynamic executor (``Pipeline.exec_dynamic``), whose outputs
    stay valid while referenced, so torch may take them without a copy (DALI's own iterator does)."""
    return bool(getattr(pipe, "exec_dynamic", False))


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


@do_not_convert
def tensor_list(rows: Sequence[Any]) -> Any:
    """A batch of one-dimensional ``uint8`` rows (NumPy arrays, views of one buffer) as one DALI
    ``TensorListCPU`` that refers to them, no copy: what DALI's feeding would build one row at a
    time, with a type check per row; every empty row is one shared empty tensor."""
    from nvidia.dali.tensors import TensorCPU, TensorListCPU

    empty = _empty_tensor()
    return TensorListCPU([TensorCPU(r, "") if len(r) else empty for r in rows], "", False)


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
