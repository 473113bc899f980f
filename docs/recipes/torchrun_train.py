"""Training on several GPUs and nodes with torchrun (or srun): each process finds its rank, its
world size and its GPU by itself, and every rank yields the same number of batches per epoch,
computed from the shards' counts without any communication.

    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        docs/recipes/torchrun_train.py --data "s3://bucket/train/" --epochs 90

On a node of several GPUs the order matters: open the loader (its stream's GPU is this process's
local rank's), make that GPU torch's current device with ``dalistream.torch_device``, and only then
start NCCL and build the model. ``model.cuda()`` or ``.to("cuda")`` before that would put every
rank's model, and NCCL, on GPU 0, while rank k's batches come out on GPU k.

The same script runs on CPUs (gloo): ``torchrun --standalone --nproc-per-node 2
docs/recipes/torchrun_train.py --data DIR --size 32 --batch-size 16``.
"""
# run: torchrun --nproc-per-node 2 {recipe} --data data --size 32 --batch-size 16 --workers 1 --epochs 2 --classes 10

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dalistream
from dalistream.pipelines import classification_train


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="shards: paths, folders, globs, s3://…")
    p.add_argument("--batch-size", type=int, default=256, help="samples per batch and rank")
    p.add_argument("--size", type=int, default=224, help="image side after the random-resized crop")
    p.add_argument("--workers", type=int, default=4, help="DALI worker processes per rank")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, help="write what each rank saw to REPORT/rank-<r>.json")
    return p.parse_args(argv)


def make_model(classes: int) -> torch.nn.Module:
    """A small CNN; put your own model here."""
    def block(cin: int, cout: int) -> List[torch.nn.Module]:
        return [torch.nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                torch.nn.ReLU(inplace=True)]

    return torch.nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(128, classes))


def setup(args: argparse.Namespace) -> Tuple[dalistream.Loader, torch.device, torch.nn.Module]:
    """The loader, this rank's device and the DDP model, in the order a node of several GPUs needs."""
    # rank and world size from torchrun's RANK/WORLD_SIZE (or srun's SLURM_PROCID/SLURM_NTASKS), the
    # GPU from LOCAL_RANK (or SLURM_LOCALID) among the visible ones
    loader = classification_train.loader(args.data, batch_size=args.batch_size, size=args.size,
                                         workers=args.workers, seed=args.seed)
    device = dalistream.torch_device(loader.stream)  # cuda:<this rank's GPU>, now torch's current device
    gpu = device.type == "cuda"
    dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(make_model(args.classes).to(device), device_ids=[device.index] if gpu else None)
    return loader, device, model


def train(loader: dalistream.Loader, device: torch.device, model: torch.nn.Module,
          args: argparse.Namespace) -> Dict[str, Any]:
    """``args.epochs`` epochs; what this rank saw, per epoch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    seen: Dict[str, Any] = {"epochs": [], "batch_devices": set()}
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        steps, samples, loss_sum = 0, 0, torch.zeros((), device=device)
        for batch in loader:
            images, labels = batch["image"], batch["label"]  # on `device` already
            out = model(images)
            # an empty batch (policy "exact": the last step of a rank no sample is left for; any
            # policy: every sample of the batch skipped) takes the same step: a zero loss that keeps
            # the graph, where the mean over no sample would be NaN, and every rank joins the all-reduce
            loss = criterion(out, labels) if len(labels) else out.sum() * 0.0
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP's all-reduce: every rank has the same number of batches
            optimizer.step()
            steps, samples = steps + 1, samples + int(labels.shape[0])
            loss_sum += loss.detach() * len(labels)
            seen["batch_devices"].update({str(images.device), str(labels.device)})
        seen["epochs"].append({"epoch": epoch, "steps": steps, "samples": samples,
                               "loss": float(loss_sum) / samples if samples else None})
    return seen


def main(argv: Optional[List[str]] = None) -> None:
    args = parse(argv)
    loader, device, model = setup(args)
    try:
        with loader:
            seen = train(loader, device, model, args)
        print(f"rank {dist.get_rank()}: {sum(e['steps'] for e in seen['epochs'])} steps", flush=True)
        if args.report:
            rank = dist.get_rank()
            record = {"rank": rank, "world_size": dist.get_world_size(), "device": str(device),
                      "model_device": str(next(model.parameters()).device), **seen,
                      "batch_devices": sorted(seen["batch_devices"])}
            with open(os.path.join(args.report, f"rank-{rank}.json"), "w") as f:
                json.dump(record, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
