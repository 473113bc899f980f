"""A DDP evaluation loop over an ``exact`` stream, on CPUs (gloo): a collective per batch, as every
DDP evaluation loop has. Every rank yields ``len(loader)`` batches, the ranks that no sample is left
for in the last step an empty one, so the per-batch ``all_reduce`` always meets every rank and the
total counts every sample once.

    torchrun --standalone --nproc-per-node 3 docs/recipes/ddp_evaluation.py --data data

With 256 samples on 3 ranks of batch 85, the last step holds one sample: ranks 1 and 2 yield an
empty last batch. The loader is built before the process group, as PyTorch Lightning does: it
takes its rank and world size from the group when it starts.
"""
# run: torchrun --nproc-per-node 3 {recipe} --data data --batch-size 85

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import dalistream


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="shards: paths, folders, globs, s3://…")
    p.add_argument("--batch-size", type=int, default=85, help="samples per batch and rank")
    p.add_argument("--workers", type=int, default=1, help="DALI worker processes per rank")
    args = p.parse_args()
    stream = dalistream.Stream.open(args.data, fields={"key": "__key__", "label": "cls"}, batch_size=args.batch_size,
                                    workers=args.workers, policy="exact", device="cpu")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seen = torch.zeros(2, dtype=torch.int64)  # samples, label sum
    steps = 0
    with dalistream.Loader(stream) as loader:
        expected = len(loader)
        for batch in loader:
            here = torch.tensor([len(batch["label"]), int(batch["label"].sum())], dtype=torch.int64)
            dist.all_reduce(here)  # the per-batch metric: every rank meets here, the empty batch too
            seen += here
            steps += 1
    assert steps == expected, (steps, expected)
    print(f"rank {rank}: {steps} steps, {int(seen[0])} samples over all ranks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
