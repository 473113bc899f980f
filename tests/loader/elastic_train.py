"""Run under torchrun by tests/loader/test_resume.py: one rank of a layout that loads rank 0's
saved state (if any), reads ``STOP`` batches (or to the epoch's end), and writes its keys;
rank 0 also writes its state. Arguments: SOURCE OUT_DIR WORKERS BATCH STOP STATE_IN STATE_OUT
(``-`` for none); the rank and world size come from the launcher. :func:`run_rank` is the loop,
shared with tests/loader/bucket_train.py."""

import json
import os
import sys
from typing import Any, Callable, Dict

import dalistream


def run_rank(loader: "dalistream.Loader", out_dir: str, stop: str, state_in: str, state_out: str,
             record: Callable[[Dict[str, Any]], Any] = lambda batch: None) -> None:
    """Resume ``loader`` from ``state_in``, read ``stop`` batches (or to the epoch's end), write
    rank 0's state to ``state_out`` and ``OUT_DIR/rank-R.json``: the keys, and ``record(batch)``
    of each batch."""
    rank = loader.stream.config.rank
    keys, batches = [], []
    with loader:
        if state_in != "-":
            with open(state_in) as f:
                loader.load_state_dict(json.load(f))
        expected = len(loader)
        for n, batch_ in enumerate(loader, 1):
            keys += batch_["key"]
            batches.append(record(batch_))
            if stop != "-" and n == int(stop):
                break
        if rank == 0 and state_out != "-":
            with open(state_out, "w") as f:
                json.dump(loader.state_dict(), f)
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "layout": [rank, loader.stream.config.world_size], "len": expected, "keys": keys,
                   "batches": batches}, f)


def main(source, out_dir, workers, batch, stop, state_in, state_out):
    options = {"endpoint_url": os.environ["ELASTIC_ENDPOINT"]} if "ELASTIC_ENDPOINT" in os.environ else {}
    stream = dalistream.Stream.open(source, fields={"key": "__key__"}, batch_size=int(batch), workers=int(workers),
                                    device="cpu", shuffle=6, seed=9, policy="exact", storage_options=options)
    run_rank(dalistream.Loader(stream), out_dir, stop, state_in, state_out)


if __name__ == "__main__":
    main(*sys.argv[1:8])
