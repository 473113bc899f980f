"""Run under torchrun by tests/loader/test_buckets.py: one rank of a layout bucketed by aspect
ratio that loads rank 0's saved state (if any), reads ``STOP`` batches (or to the epoch's end) of
images resized to their bucket, and writes its keys and each batch's bucket; rank 0 also writes
its state. Arguments: SOURCE OUT_DIR BATCH STOP STATE_IN STATE_OUT CACHE_DIR (``-`` for none); the
rank and world size come from the launcher."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/helpers.py

import dalistream  # noqa: E402
from dalistream.pipelines import aspect_bucket_train  # noqa: E402

from helpers import PHOTO_SIZES  # noqa: E402


def main(source, out_dir, batch, stop, state_in, state_out, cache_dir):
    loader = aspect_bucket_train.loader(source, batch_size=int(batch), workers=2, device="cpu", policy="exact",
                                        seed=7, cache_dir=cache_dir, buckets=dalistream.AspectBuckets(PHOTO_SIZES),
                                        fields={"key": "__key__"}, label_exts=None)
    rank = loader.stream.config.rank
    keys, buckets = [], []
    with loader:
        if state_in != "-":
            with open(state_in) as f:
                loader.load_state_dict(json.load(f))
        for n, b in enumerate(loader, 1):
            width, height = PHOTO_SIZES[int(b["bucket"][0])]
            assert tuple(b["image"].shape[2:]) == (height, width)
            keys.append(b["key"])
            buckets.append(int(b["bucket"][0]))
            if stop != "-" and n == int(stop):
                break
        if rank == 0 and state_out != "-":
            with open(state_out, "w") as f:
                json.dump(loader.state_dict(), f)
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"layout": [rank, loader.stream.config.world_size], "steps": len(keys), "keys": keys,
                   "buckets": buckets}, f)


if __name__ == "__main__":
    main(*sys.argv[1:8])
