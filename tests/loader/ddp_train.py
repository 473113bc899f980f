"""Run under torchrun by tests/test_distributed.py: a small DDP model over dalistream batches.

Writes ``OUT/rank-<r>.json`` with the keys and number of steps of each epoch.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dalistream


def main(data: str, out_dir: str, epochs: int = 2) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stream = dalistream.Stream.open(data, fields={"key": "__key__", "label": "cls"}, batch_size=6, workers=2,
                                    device="auto", shuffle=8, seed=5)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.ReLU(), torch.nn.Linear(16, 7)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    record = {"rank": rank, "world_size": dist.get_world_size(), "device": stream.device,
              "layout": [stream.config.rank, stream.config.world_size], "epochs": []}
    with dalistream.Loader(stream) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            keys, losses, expected = [], [], len(loader)
            for batch in loader:
                labels = batch["label"]
                loss = torch.nn.functional.cross_entropy(model(labels.float()[:, None] / 7), labels)
                optimizer.zero_grad()
                loss.backward()  # all-reduce: a rank with fewer batches would hang here
                optimizer.step()
                keys.append(batch["key"])
                losses.append(loss.item())
            record["epochs"].append({"epoch": epoch, "steps": len(keys), "len": expected, "keys": keys,
                                     "first_loss": losses[0], "last_loss": losses[-1]})
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
