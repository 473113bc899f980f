"""Train with DistributedDataParallel on every rank of a job started by torchrun (or srun).

Each process finds its rank and world size from torch.distributed, which torchrun's environment
starts, and its GPU from LOCAL_RANK; every rank yields the same number of batches, computed from
the shards' counts, without talking to the others, so DDP never waits on a rank that ran out.

    torchrun --nproc-per-node 2 torchrun_train.py --data data                      # CPU: gloo
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        torchrun_train.py --data s3://bucket/train/ --batch-size 256                # GPUs: nccl
"""
# run: torchrun --nproc-per-node 2 {recipe} --data data --epochs 2

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dalistream.pipelines import classification_train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data", help="shards: a folder, a pattern, s3://…")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda" if gpu else "cpu")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 10)).to(device)
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    steps = 0
    with classification_train.loader(args.data, batch_size=args.batch_size, size=32, workers=1, seed=0,
                                     device="gpu" if gpu else "cpu") as loader:  # rank, world size: torch.distributed
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
    print(f"rank {dist.get_rank()}: {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
