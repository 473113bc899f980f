"""Run by tests/loader/test_ddp_eval.py as one of two real processes: a DDP evaluation loop (gloo,
CPU) with an ``all_reduce`` per batch, as every DDP evaluation loop has, over ``exact`` streams.

``python ddp_eval.py RANK PORT OUT CASE...`` where CASE is ``FOLDER:W:B``. The first case's stream
and loader are built *before* ``init_process_group`` (the PyTorch Lightning order: the data is
built, then ``Trainer.fit`` starts the group), with no RANK/WORLD_SIZE in the environment: the
loader must find rank and world size when it starts. Writes ``OUT/rank-<r>.json``.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import dalistream


def evaluate(loader):
    """The loop: a collective per batch (a rank with one batch fewer would leave the other waiting)."""
    expected = len(loader)
    keys, steps, total = [], 0, 0
    for batch in loader:
        count = torch.tensor([len(batch["key"])], dtype=torch.int64)
        dist.all_reduce(count)  # the per-batch metric sum
        total += int(count.item())
        keys += list(batch["key"])
        steps += 1
    done = torch.tensor([steps], dtype=torch.int64)
    dist.all_reduce(done, op=dist.ReduceOp.MAX)  # the final reduction: would wait for ever on a missing batch
    return {"len": expected, "steps": steps, "max_steps": int(done.item()), "total": total, "keys": keys,
            "layout": [loader.stream.config.rank, loader.stream.config.world_size]}


def open_case(case):
    folder, workers, batch = case.rsplit(":", 2)
    stream = dalistream.Stream.open(folder, fields={"key": "__key__"}, batch_size=int(batch), workers=int(workers),
                                    device="cpu", policy="exact", cache_dir=folder)
    return dalistream.Loader(stream)


def main(rank: int, port: int, out: str, cases) -> None:
    first = open_case(cases[0])  # before the group exists: world size 1 for now
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    results = []
    with first:
        results.append(evaluate(first))
    for case in cases[1:]:
        with open_case(case) as loader:
            results.append(evaluate(loader))
            loader.set_epoch(1)
            results.append(evaluate(loader))  # a second epoch on the same workers
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:])
