"""One rank of a DDP training run on CPUs (gloo) through the documented training loop: ``train``
of docs/recipes/torchrun_train.py (the loop the training guide shows), with a real
``DistributedDataParallel`` and a real DALI loader. Run by tests/loader/test_ddp_empty_batch.py,
one process per rank, as ``python ddp_empty_train.py RANK WORLD PORT DATA OUT POLICY``; writes
``OUT/rank-<r>.json``: the recipe's record per epoch, whether every weight and buffer is finite,
and the loader's empty batches per epoch."""

import argparse
import importlib.util
import json
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dalistream.pipelines import classification_train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def recipe():
    spec = importlib.util.spec_from_file_location("torchrun_train", os.path.join(REPO, "docs", "recipes",
                                                                                  "torchrun_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(rank: int, world: int, port: int, data: str, out: str, policy: str) -> None:
    # a rank left waiting in a collective fails after the timeout instead of hanging the test
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    train = recipe()
    loader = classification_train.loader(data, batch_size=4, size=16, workers=1, seed=0, policy=policy,
                                         on_error="skip", shuffle=0, shuffle_shards=False, interleave=False,
                                         warn_empty=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(train.make_model(10))
    with loader:
        seen = train.train(loader, torch.device("cpu"), model, argparse.Namespace(epochs=2, lr=0.05))
        stats = loader.stats(wait_s=10)
    record = {"rank": rank, "epochs": seen["epochs"],
              "losses_finite": all(e["loss"] is None or math.isfinite(e["loss"]) for e in seen["epochs"]),
              "weights_finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
              "buffers_finite": all(bool(torch.isfinite(b.float()).all()) for b in model.buffers()),
              "empty_batches": {str(e): stats["by_epoch"].get(e, {}).get("empty_batches", 0) for e in range(2)},
              "skipped_samples": stats["skipped_samples"]}
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:7])
