"""A DDP evaluation loop over an ``exact`` stream (the ready ``classification_eval`` pipeline), on
CPUs (gloo): a collective per batch, as every DDP evaluation loop has. Every rank yields
``len(loader)`` batches, the ranks that no sample is left for in the last step an empty one, so the
per-batch ``all_reduce`` always meets every rank, and the totals count every sample once.

    torchrun --standalone --nproc-per-node 3 docs/recipes/ddp_evaluation.py --data data

With 256 samples on 3 ranks of batch 85, the last step holds one sample: ranks 1 and 2 yield an
empty last batch. The loader is built before the process group, as PyTorch Lightning does: it
takes its rank and world size from the group when it starts. Each sample's key comes with it
(``fields={"key": "__key__"}``): the ranks' keys together are the data set's, each once.
docs/guide/evaluation.md shows the loop (between the ``--8<--`` lines) from this file.
"""
# run: torchrun --nproc-per-node 3 {recipe} --data data --batch-size 85

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from dalistream.pipelines import classification_eval


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="shards: paths, folders, globs, s3://…")
    p.add_argument("--batch-size", type=int, default=85, help="samples per batch and rank")
    p.add_argument("--workers", type=int, default=1, help="DALI worker processes per rank")
    args = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))  # stands in for yours
    # --8<-- [start:loop]
    loader = classification_eval.loader(args.data, batch_size=args.batch_size, size=32, workers=args.workers,
                                        device="cpu", fields={"key": "__key__"})  # rank, world size: the group's
    dist.init_process_group("gloo")   # before or after the loader: it checks them again when it starts
    totals = torch.zeros(2, dtype=torch.int64)          # correct, samples: over all ranks, so far
    keys = []                                           # this rank's samples (to write predictions by key)
    with loader, torch.no_grad():
        for batch in loader:                            # len(loader) batches on every rank, the last maybe empty
            here = torch.zeros(2, dtype=torch.int64)    # this batch, this rank
            if len(batch["label"]):
                here[0] = (model(batch["image"]).argmax(1) == batch["label"]).sum()
            here[1] = len(batch["label"])
            dist.all_reduce(here)                       # a collective per batch: every rank meets here
            totals += here                              # this step's sums over all ranks, added once
            keys += batch["key"]
    # --8<-- [end:loop]
    samples = sum(loader.stream.counts)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, keys)
    read = [key for part in everyone for key in part]
    assert int(totals[1]) == samples, f"the totals count {int(totals[1])} samples, the data set holds {samples}"
    assert len(read) == len(set(read)) == samples, "every sample's key once over all ranks"
    assert 0 <= int(totals[0]) <= samples
    rank = dist.get_rank()
    print(f"rank {rank}: {len(loader)} steps, {int(totals[1])} samples over all ranks "
          f"(accuracy {int(totals[0]) / samples:.3f})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
