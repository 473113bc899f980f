"""A node of GPUs faked on a CPU machine, to run a training script's set-up under a launcher's
variables (LOCAL_RANK, RANK, …) and see where it puts the model, NCCL and the batches.

Run by tests/test_torchrun_recipe.py as ``python tests/gpu_world.py VISIBLE SCRIPT [args…]`` or
``… VISIBLE --old-outline DATA``; prints one JSON line. Faked: what DALI sees (the GPU count,
where dalistream asks it: ``dalistream.dali.device.gpu_count``) and torch's CUDA surface (a CUDA build, the current
device that ``set_device`` moves, ``Module.to``/``Module.cuda`` recording the device they would move
to, ``init_process_group`` and ``DistributedDataParallel`` recording their device arguments).
Nothing of dalistream's own logic is replaced. The batches' device is the DALI pipeline's
``device_id``: dalistream hands DALI's GPU outputs to torch on that device (DLPack)."""

import importlib.util
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.parallel

from dalistream.dali import device

visible = int(sys.argv[1])
state = {"current": 0, "set_device": [], "moved_to": [], "ddp_device_ids": [], "process_group": []}


def as_device(device):
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # torch's rule: the current device
        device = torch.device("cuda", state["current"])
    return device


def module_to(self, *args, **kwargs):
    device = torch._C._nn._parse_to(*args, **kwargs)[0]
    if device is not None:
        state["moved_to"].append(str(as_device(device)))
    return self


def module_cuda(self, device=None):
    state["moved_to"].append(str(as_device(torch.device("cuda", device) if device is not None else "cuda")))
    return self


def set_device(device):
    state["current"] = as_device(torch.device("cuda", device) if isinstance(device, int) else device).index
    state["set_device"].append(state["current"])


def init_process_group(backend=None, *args, device_id=None, **kwargs):
    state["process_group"].append({"backend": backend, "device_id": None if device_id is None else str(device_id)})


def ddp(module, device_ids=None, **kwargs):
    state["ddp_device_ids"].append(None if device_ids is None else [int(getattr(d, "index", d)) for d in device_ids])
    return module


device.gpu_count = lambda: visible
torch.version.cuda = "12.8"
torch.backends.cuda.is_built = lambda: True
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: visible
torch.cuda.set_device = set_device
torch.cuda.current_device = lambda: state["current"]
torch.nn.Module.to = module_to
torch.nn.Module.cuda = module_cuda
dist.init_process_group = init_process_group
torch.nn.parallel.DistributedDataParallel = ddp


def old_outline(data: str):
    """The README's multi-node outline before #39: NCCL and ``model.cuda()`` on torch's current device."""
    import dalistream

    dist.init_process_group("nccl")
    stream = dalistream.Stream.open(data, fields={"image": "jpg;png", "label": "cls"}, batch_size=8, workers=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda())
    return dalistream.Loader(stream), model


if sys.argv[2] == "--old-outline":
    loader, model = old_outline(sys.argv[3])
else:
    spec = importlib.util.spec_from_file_location("recipe", sys.argv[2])
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    loader, device, model = recipe.setup(recipe.parse(sys.argv[3:]))
    state["torch_device"] = str(device)
with loader:
    pipe = loader.pipeline_fn(loader.stream, **loader.pipeline_kwargs)  # defined, not built: no GPU here
    state.update(stream_device_id=loader.stream.device_id, pipeline_device_id=pipe.device_id,
                 local_processes=loader.stream.local_processes)
print(json.dumps(state))
