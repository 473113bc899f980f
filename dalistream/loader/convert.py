"""DALI outputs to torch: dense outputs as tensors, byte fields as ``bytes``/``str``, padding removed.

Under DALI's dynamic executor (dalistream's default), whose outputs stay valid while anything
refers to them, a dense output becomes a torch tensor over DALI's own memory (DLPack, no copy),
on the CPU as on a GPU, as DALI's own PyTorch iterator does: a 224 px float batch of 64 is 38 MB,
whose copy cost the main process about 30 µs per sample on a 2-core machine. Off that executor
(``exec_dynamic=False``) DALI reuses its output buffers, so CPU tensors are copied into buffers
recycled from earlier batches once nothing refers to them any more (a fresh 40 MB tensor per
batch costs thousands of page faults, 15–30 ms of CPU per batch there). A buffer is reused only
when no Python object, no other tensor (view, autograd's saved tensors) and no NumPy array
refers to it, so a batch the training loop still holds is never overwritten.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ..dali.compat import only_reference, torch_utils
from ..kinds import KINDS

log = logging.getLogger(__name__)

KEEP = 3  # buffers per output: the batch being filled, the one the loop holds, one spare


class BufferPool:
    """Per output name, a few CPU tensors to copy batches into."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.pools: Dict[str, List[Any]] = {}

    def get(self, name: str, shape: Tuple[int, ...], dtype) -> Any:
        import torch

        pool = self.pools.setdefault(name, [])
        for buffer in pool:
            if buffer.shape == shape and buffer.dtype == dtype and only_reference(buffer):
                return buffer
        buffer = torch.empty(shape, dtype=dtype)
        pool.append(buffer)
        if len(pool) > self.keep:
            pool.pop(0)
        return buffer


_ragged_told: set = set()


def _say_ragged(name: str, rows: List[Any]) -> None:
    """Once per output name in a process: a batch whose samples differ in shape comes as a list of
    tensors, not one tensor -- say so, with the shapes, rather than change the type in silence."""
    if name in _ragged_told or not rows:
        return
    _ragged_told.add(name)
    shapes = sorted({tuple(r.shape) for r in rows})
    log.warning("output %r: the samples of a batch differ in shape (%s%s), so it comes as a list of %d tensors, not "
                "one tensor; resize or crop them to one size in the pipeline to get a (B, ...) tensor",
                name, ", ".join(map(str, shapes[:3])), ", …" if len(shapes) > 3 else "", len(rows))


def shared(tensor: Any) -> Any:
    """A torch tensor on a DALI tensor's own memory (DLPack), a GPU one ordered after DALI's work
    on torch's current stream of its device.

    Not ``torch.from_dlpack(tensor)`` (what DALI's ``to_torch_tensor(copy=False)`` does): it
    compares DALI's device enum (pybind11) with torch's (Python), pybind11 runs an
    ``Enum.__getattr__`` for that and clears whatever it raises, so a Ctrl-C whose
    ``KeyboardInterrupt`` was raised there was lost and the training loop went on. A capsule's
    conversion runs no Python code."""
    import torch
    from nvidia.dali.backend import TensorGPU

    if isinstance(tensor, TensorGPU):
        with torch.cuda.device(tensor.device_id()):
            stream = torch.cuda.current_stream().cuda_stream
            return torch.utils.dlpack.from_dlpack(tensor.__dlpack__(stream=stream or 1))  # 1: the legacy default one
    return torch.utils.dlpack.from_dlpack(tensor.__dlpack__())


def to_torch(names_kinds: Sequence[Tuple[str, str]], outputs, buffers: "BufferPool | None" = None,
             zero_copy: bool = False) -> Dict[str, Any]:
    """One batch dict from the pipeline's outputs; rows whose ``valid`` is 0 are dropped.

    ``zero_copy`` (a pipeline run by DALI's dynamic executor, whose outputs stay valid while
    referenced): dense outputs become torch tensors without a copy (DLPack; on a GPU ordered
    after DALI's work on torch's current stream), as DALI's own PyTorch iterator does; otherwise
    CPU outputs are copied into ``buffers`` (a fresh tensor without them) and GPU outputs on
    torch's current stream. Ragged GPU outputs stay on the GPU, one tensor per sample."""
    import torch
    from nvidia.dali.backend import TensorListCPU

    utils = torch_utils()
    feed_ndarray, to_torch_tensor, to_torch_type = utils.feed_ndarray, utils.to_torch_tensor, utils.to_torch_type

    batch: Dict[str, Any] = {}
    mask = None
    for (name, kind), tl in zip(names_kinds, outputs):
        cpu = tl if isinstance(tl, TensorListCPU) else None
        if name == "valid":
            mask = np.array((cpu or tl.as_cpu()).as_tensor(), dtype=bool)
            continue
        if kind != "tensor":  # a field returned as read: its kind makes the rows (dalistream.kinds)
            tl = cpu or tl.as_cpu()
            batch[name] = KINDS[kind].to_torch([np.array(tl.at(i)) for i in range(len(tl))])
        elif tl.is_dense_tensor():
            tensor = tl.as_tensor()
            if zero_copy:
                batch[name] = shared(tensor)
            elif cpu is not None and buffers is not None:
                out = buffers.get(name, tuple(tensor.shape()), to_torch_type[tensor.dtype])
                batch[name] = feed_ndarray(tensor, out)
            else:
                batch[name] = to_torch_tensor(tensor, copy=True)
        elif cpu is None:  # ragged on the GPU: one CUDA tensor per sample, never through the host
            with torch.cuda.device(tl.device_id()):
                batch[name] = [shared(tl[i]) if zero_copy else to_torch_tensor(tl[i], copy=True) for i in range(len(tl))]
            _say_ragged(name, batch[name])
        else:
            batch[name] = [torch.from_numpy(np.array(tl.at(i))) for i in range(len(tl))]
            _say_ragged(name, batch[name])
    if mask is not None and not mask.all():
        batch = trimmed(batch, np.flatnonzero(mask))
    return batch


def trimmed(batch: Dict[str, Any], keep: np.ndarray) -> Dict[str, Any]:
    """``batch`` with only the rows ``keep`` (increasing indices). Rows in one run (padding at the
    end or the start of the batch, the usual place) are a view, no copy; scattered rows are
    gathered, with one copy of the index per device, queued without waiting for it."""
    import torch

    run = len(keep) == 0 or keep[-1] - keep[0] + 1 == len(keep)
    first, last = (int(keep[0]), int(keep[-1]) + 1) if len(keep) else (0, 0)
    index = None if run else torch.from_numpy(keep)
    on_device: Dict[Any, Any] = {}
    out = {}
    for name, value in batch.items():
        if isinstance(value, list):
            out[name] = value[first:last] if run else [value[i] for i in keep]
        elif run:
            out[name] = value[first:last]
        else:
            if value.device not in on_device:
                on_device[value.device] = (index.pin_memory().to(value.device, non_blocking=True) if value.is_cuda
                                           else index)
            out[name] = value.index_select(0, on_device[value.device])
    return out
