"""Which device decodes — the GPU when DALI sees one (``mixed`` decoders, GPU ops), else the CPU —
how DALI starts its worker processes for it (``fork`` or ``spawn``), how many threads it gets
(:func:`process_cores`, :func:`dali_threads`), and the torch device of its batches
(:func:`torch_device`).

GPU detection asks DALI's backend (no torch import, ~0.4 ms), and only when a pipeline may use a
GPU: importing the package never touches CUDA. Which GPU: :func:`local_gpu`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Iterator, Optional, Tuple

from . import compat
from ..errors import ConfigError

if TYPE_CHECKING:  # annotations only: torch is imported when a function needs it
    import torch

log = logging.getLogger(__name__)

DEVICES = ("auto", "gpu", "cpu")


# -- how many GPUs DALI sees, without initializing CUDA here ---------------------------------------

# Paths an NVIDIA driver provides; where none exists there is no GPU to count (and no CUDA to start).
DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
# How often this process asked CUDA anything that may initialize it ("in_process") or had a child
# process ask ("child"): the test that nothing at import or collection touches CUDA reads these.
CUDA_QUERIES = {"in_process": 0, "child": 0}
# The child that counts the GPUs, and how long it may take (CUDA's start-up on 8 GPUs takes seconds).
COUNT_COMMAND = (sys.executable, "-c", "from nvidia.dali.backend import GetCUDADeviceCount as c; print(int(c()))")
COUNT_TIMEOUT_S = 120.0
_device_count: Any = None
_count_problem: Any = None


def gpu_count() -> int:
    """Number of CUDA devices DALI can see (0 without a driver or without DALI); no torch import.

    DALI's count initializes CUDA in the process that asks, and DALI refuses to fork workers from
    a process whose CUDA is initialized ("Cannot fork a process when the CUDA has been
    initialized"). So the count is asked in a short-lived child process (once per process, about
    half a second, cached), unless CUDA is already initialized here; without an NVIDIA driver
    (:data:`DRIVER_PATHS`) it is 0 at once. When a driver is there but the child fails, times out
    or prints no number, the count is 0 and :func:`gpu_count_problem` says what went wrong."""
    global _device_count, _count_problem
    if _device_count is None:
        _device_count, _count_problem = _count_devices()
    return _device_count


def gpu_count_problem() -> Any:
    """Why the last count was 0 although an NVIDIA driver is installed (the child's exit status or
    time-out, and the end of its stderr), or ``None``: no driver, or the count was asked cleanly."""
    return _count_problem


def _count_devices() -> tuple:
    import subprocess

    state = compat.cuda_driver_state()
    if state is None:  # no DALI backend, no driver: CPU only
        return 0, None
    if state:  # already started here: asking costs nothing more
        CUDA_QUERIES["in_process"] += 1
        return compat.cuda_count_here(), None
    driver = [p for p in DRIVER_PATHS if os.path.exists(p)]
    if not driver:
        return 0, None
    CUDA_QUERIES["child"] += 1
    where = f"an NVIDIA driver is installed ({driver[0]}) but counting the GPUs in a child process"
    try:
        done = subprocess.run(list(COUNT_COMMAND), capture_output=True, text=True, timeout=COUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 0, f"{where} did not answer within {COUNT_TIMEOUT_S:g} s{_tail(err)}"
    except OSError as e:
        return 0, f"{where} could not start: {e}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].strip().isdigit():
        status = f"exit status {done.returncode}" if done.returncode != 0 else f"printed {done.stdout.strip()[-200:]!r}"
        return 0, f"{where} failed ({status}){_tail(done.stderr)}"
    return int(lines[-1]), None


def _tail(stderr: str, lines: int = 12) -> str:
    text = "\n".join(stderr.strip().splitlines()[-lines:])
    return f"; its stderr:\n{text}" if text else "; it wrote nothing on stderr"


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
        problem = gpu_count_problem()
        if device == "gpu":
            raise ConfigError("device='gpu' but no CUDA device is visible" + (f": {problem}" if problem else ""),
                              hint="use device='auto' or 'cpu'")
        if problem:
            log.warning("device='auto' decodes on the CPU: %s", problem)
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


def dali_threads(cores: int, workers: int = 0) -> int:
    """DALI's ``num_threads`` by default: this process's ``cores`` (:func:`process_cores`) less one
    per DALI worker process, between 2 and 16. On a GPU these threads run the decoder's host
    stages (nvJPEG's Huffman decoding of most JPEGs), the PNG and CMYK fallbacks and the merge; on
    the CPU, the whole decode. A 2-core box keeps 2; 16 cores and 4 workers give 12."""
    return max(2, min(16, max(1, int(cores)) - max(0, int(workers))))


CGROUP_ROOT = "/sys/fs/cgroup"
MEMBERSHIP = "/proc/self/cgroup"


def process_cores(local_processes: int = 1, cgroup_root: str = CGROUP_ROOT, membership: str = MEMBERSHIP) -> int:
    """The cores this process's DALI threads can count on: its CPU affinity and its cgroup's CPU
    quota and cpuset (:func:`cgroup_limits`, read under ``cgroup_root`` for the cgroup named in
    ``membership``), shared with the node's other ``local_processes`` (:func:`cpu_share`)."""
    try:
        affinity = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = frozenset(range(os.cpu_count() or 1))
    allowed, quota = cgroup_limits(cgroup_root, membership)
    return cpu_share(affinity, allowed if allowed is not None else frozenset(range(os.cpu_count() or 1)), quota,
                     local_processes)


def cpu_share(affinity: FrozenSet[int], allowed: FrozenSet[int], quota: Optional[float], local_processes: int) -> int:
    """This process's share of the CPUs, at least 1.

    An ``affinity`` narrower than the CPUs its cgroup ``allowed`` means a launcher bound this
    process to its own cores (``srun --cpu-bind``, ``taskset``, ``numactl`` per rank): they are all
    its own. Otherwise the node's ``local_processes`` training processes share them. A CPU
    ``quota`` (cores' worth of time: ``docker --cpus``, a Kubernetes CPU limit) belongs to the
    cgroup, which the node's processes share, so each gets ``quota / local_processes``."""
    processes = max(1, int(local_processes))
    bound = bool(affinity) and affinity < allowed
    share = float(len(affinity)) if bound else len(affinity) / processes
    if quota is not None:
        share = min(share, quota / processes)
    return max(1, int(share))


def cgroup_limits(cgroup_root: str = CGROUP_ROOT, membership: str = MEMBERSHIP) -> Tuple[Optional[FrozenSet[int]], Optional[float]]:
    """``(cpuset, quota)`` of this process's cgroup, each ``None`` where none is set or readable.

    ``membership`` (``/proc/self/cgroup``) names the cgroup under each hierarchy; its folders are
    looked for under ``cgroup_root`` (v2: ``cpu.max``, ``cpuset.cpus.effective``; v1: the ``cpu``
    hierarchy's ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` and the ``cpuset`` one's
    ``cpuset.effective_cpus``). Inside a container the root is often the container's own cgroup,
    and the named path is absent there: the root's files count then. The smallest quota on the way
    up to the root is the one that binds."""
    paths = _memberships(membership)
    quotas = []
    cpuset = None
    for hierarchy, name in (("", ""), ("cpu", "cpu"), ("cpu", "cpu,cpuacct"), ("cpuset", "cpuset")):
        path = paths.get(hierarchy)
        if path is None:
            continue
        for folder in _up_to_root(os.path.join(cgroup_root, name) if name else cgroup_root, path):
            if hierarchy in ("", "cpu"):
                quotas.append(_quota(folder))
            if hierarchy in ("", "cpuset") and cpuset is None:
                cpuset = _cpuset(folder)
    quotas = [q for q in quotas if q is not None]
    return cpuset, (min(quotas) if quotas else None)


def _memberships(membership: str) -> Dict[str, str]:
    """``{hierarchy: path}`` from ``/proc/self/cgroup`` lines ``id:controllers:path`` (``""`` for v2)."""
    try:
        with open(membership) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out: Dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            out.setdefault(controller, path)
    return out


def _up_to_root(mount: str, path: str) -> Iterator[str]:
    """The folders from this process's cgroup up to the hierarchy's root (or the root alone when
    the cgroup's own folder is not there: a container whose root is its own cgroup)."""
    if not os.path.isdir(mount):
        return
    folder = os.path.normpath(os.path.join(mount, path.strip("/")))
    if not os.path.isdir(folder) or not folder.startswith(os.path.normpath(mount)):
        folder = os.path.normpath(mount)
    while True:
        yield folder
        if folder == os.path.normpath(mount):
            return
        folder = os.path.dirname(folder)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _quota(folder: str) -> Optional[float]:
    """Cores' worth of CPU time a cgroup folder grants: v2 ``cpu.max`` (``"max 100000"`` or
    ``"150000 100000"``), v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (-1: none)."""
    text = _read(os.path.join(folder, "cpu.max"))
    if text:
        quota, _, period = text.partition(" ")
    else:
        quota, period = _read(os.path.join(folder, "cpu.cfs_quota_us")), _read(os.path.join(folder, "cpu.cfs_period_us"))
    try:
        q, p = int(quota), int(period or 100000)  # "max" and missing files raise: no quota
    except (TypeError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def _cpuset(folder: str) -> Optional[FrozenSet[int]]:
    """The CPUs a cgroup folder allows (``"0-3,8-11"``), or None."""
    for name in ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"):
        text = _read(os.path.join(folder, name))
        if text:
            try:
                cpus = set()
                for part in text.split(","):
                    low, _, high = part.partition("-")
                    cpus.update(range(int(low), int(high or low) + 1))
                return frozenset(cpus)
            except ValueError:
                return None
    return None


def torch_device(stream: Any) -> "torch.device":
    """The torch device ``stream``'s batches come out on, made torch's current device: ``cuda:N``
    for a GPU stream (N = ``stream.device_id``, the GPU of this process's local rank), ``cpu``
    otherwise. Call it before building the model and before ``init_process_group("nccl")``, then
    ``model.to(device)``: ``model.cuda()``, new CUDA tensors and NCCL then use that GPU too (a
    torchrun rank on a node of 8 GPUs otherwise puts its model, and NCCL, on GPU 0)."""
    import torch

    if stream.device != "gpu":
        return torch.device("cpu")
    check_torch_cuda(stream.device_id)
    torch.cuda.set_device(stream.device_id)
    return torch.device("cuda", stream.device_id)


def check_torch_cuda(device_id: Optional[int]) -> None:
    """Raise :class:`ConfigError` when this torch build has no CUDA while DALI decodes on GPU
    ``device_id``: a GPU stream's batches are CUDA tensors. Touches no CUDA state."""
    import torch

    if torch.version.cuda is None or not torch.backends.cuda.is_built():
        raise ConfigError(f"DALI decodes on GPU {device_id}, but this torch ({torch.__version__}) is built without "
                          "CUDA: its batches could not be CUDA tensors",
                          hint="install a CUDA build of torch (see the GPU install guide), or open the stream "
                               "with device='cpu'")


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


def check_current_device(device_id: int) -> None:
    """Warn when torch's current CUDA device (this thread's) is not GPU ``device_id``, where a GPU
    stream's batches come out: a model put there by ``model.cuda()`` or ``.to("cuda")``, and NCCL,
    would be on another GPU than the batches."""
    import torch

    current = torch.cuda.current_device()
    if current != device_id:
        log.warning("torch's current CUDA device is %d, but this stream's batches come out on cuda:%d: a model moved "
                    "with .cuda() or .to('cuda'), and NCCL, use GPU %d. Call device = dalistream.torch_device(stream) "
                    "first (it sets the current device), then model.to(device)", current, device_id, current)
