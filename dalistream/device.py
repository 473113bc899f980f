"""Which device decodes — the GPU when DALI sees one (``mixed`` decoders, GPU ops), else the CPU —
and how DALI starts its worker processes for it (``fork`` or ``spawn``).

GPU detection asks DALI's backend (no torch import, ~0.4 ms); ``device_id`` comes from the
caller (entry points pass ``LOCAL_RANK``).
"""

from __future__ import annotations

from typing import Optional, Tuple

from .dali.compat import cuda_device_count, cuda_initialized
from .errors import ConfigError

DEVICES = ("auto", "gpu", "cpu")


def gpu_count() -> int:
    """Number of CUDA devices DALI can see (0 without a driver); does not import torch."""
    return cuda_device_count()


def resolve_device(device: str = "auto", device_id: Optional[int] = None) -> Tuple[str, Optional[int]]:
    """``("gpu", id)`` or ``("cpu", None)`` for ``device`` in ``auto``/``gpu``/``cpu``.

    ``device_id`` defaults to 0; entry points pass ``LOCAL_RANK``. A CPU pipeline gets
    ``device_id=None``: DALI fails even CPU-only graphs given a device id without a driver.
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
    device_id = 0 if device_id is None else int(device_id)
    if not 0 <= device_id < count:
        raise ConfigError(f"device_id {device_id} is not one of the {count} visible GPUs")
    return "gpu", device_id


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
    return "spawn" if cuda_initialized() else "fork"  # unknown counts as initialized: spawn
