"""Which device decodes — the GPU when DALI sees one (``mixed`` decoders, GPU ops), else the CPU —
and how DALI starts its worker processes for it (``fork`` or ``spawn``).

GPU detection asks DALI's backend (no torch import, ~0.4 ms), and only when a pipeline may use a
GPU: importing the package never touches CUDA. Which GPU: :func:`local_gpu`.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

from .dali import compat
from .errors import ConfigError

log = logging.getLogger(__name__)

DEVICES = ("auto", "gpu", "cpu")


def gpu_count() -> int:
    """Number of CUDA devices DALI can see (0 without a driver); does not import torch."""
    return compat.cuda_device_count()


def resolve_device(device: str = "auto", device_id: Optional[int] = None,
                   local_rank: Optional[int] = None) -> Tuple[str, Optional[int]]:
    """``("gpu", id)`` or ``("cpu", None)`` for ``device`` in ``auto``/``gpu``/``cpu``.

    ``device_id``, when given, is the GPU to use (an index among the visible ones). Otherwise the
    GPU follows the process's ``local_rank`` (entry points pass ``LOCAL_RANK``/``SLURM_LOCALID``)
    by :func:`local_gpu`, else it is 0. A CPU pipeline gets ``device_id=None``: DALI fails even
    CPU-only graphs given a device id without a driver.
    """
    if device not in DEVICES:
        raise ConfigError(f"device must be auto, gpu or cpu, got {device!r}")
    if device == "cpu":
        return "cpu", None
    count = gpu_count()
    if count == 0:
        if device == "gpu":
            raise ConfigError("device='gpu' but no CUDA device is visible", hint="use device='auto' or 'cpu'")
        return "cpu", None
    if device_id is None:
        return "gpu", local_gpu(local_rank, count)
    device_id = int(device_id)
    if not 0 <= device_id < count:
        raise ConfigError(f"device_id {device_id} is not one of the {count} visible GPUs",
                          hint="device_id counts the GPUs this process sees (CUDA_VISIBLE_DEVICES), from 0")
    return "gpu", device_id


def local_gpu(local_rank: Optional[int], visible: int) -> int:
    """The GPU of the process with ``local_rank`` on its node, among ``visible`` GPUs.

    One visible GPU (``srun --gpus-per-task=1``, Kubernetes, ``CUDA_VISIBLE_DEVICES`` set per
    process) is this process's own: 0, whatever its local rank. With several visible, local rank
    ``k`` takes GPU ``k``, as ``torchrun`` users expect; more local ranks than visible GPUs share
    them round-robin (``k mod visible``), with a warning, since it is rarely meant.
    """
    if local_rank is None or visible == 1:
        return 0
    if local_rank < 0:
        raise ConfigError(f"local rank {local_rank} is negative")
    if local_rank >= visible:
        log.warning("local rank %d but only %d GPUs are visible: GPU %d is shared with other processes",
                    local_rank, visible, local_rank % visible)
    return local_rank % visible


def dali_threads(cores: int, local_processes: int = 1, workers: int = 0) -> int:
    """DALI's ``num_threads`` by default: this process's share of the node's cores (``cores`` usable
    by it, split among the ``local_processes`` training processes of its node), less one core per
    DALI worker process, between 2 and 16. On a GPU these threads run the decoder's host stages,
    the PNG and CMYK fallbacks and the merge; on the CPU, the whole decode. A 2-core box keeps 2;
    a 16-core node with one process and 4 workers gets 12; 128 cores, 8 processes, 4 workers: 12."""
    share = max(1, int(cores)) // max(1, int(local_processes))
    return max(2, min(16, share - max(0, int(workers))))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which container limits often set)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


START_METHODS = ("auto", "fork", "spawn")


def check_start_method(requested: str) -> None:
    """Raise :class:`ConfigError` unless ``requested`` is one of :data:`START_METHODS`."""
    if requested not in START_METHODS:
        raise ConfigError(f"start_method must be one of {START_METHODS}, got {requested!r}")


def start_method(requested: str, device: str) -> str:
    """How DALI starts its worker processes: ``requested`` unless ``"auto"``.

    ``auto`` forks CPU pipelines while CUDA is not initialized in this process (what torch's
    ``DataLoader`` does on Linux): workers are up in milliseconds instead of each importing
    DALI again (about a second of CPU per worker). A GPU pipeline, or any process that has
    touched CUDA, gets ``spawn``, since a forked CUDA context is unusable.
    """
    check_start_method(requested)
    if requested != "auto":
        return requested
    if device != "cpu":
        return "spawn"
    return "spawn" if compat.cuda_initialized() else "fork"  # unknown counts as initialized: spawn
