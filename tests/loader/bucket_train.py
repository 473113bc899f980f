"""Run under torchrun by tests/loader/test_buckets.py: one rank of a layout bucketed by aspect
ratio (:func:`elastic_train.run_rank`: rank 0's saved state loaded, ``STOP`` batches read, its
state saved) reading images resized to their bucket; each batch's bucket and image shape are
written with its keys. Arguments: SOURCE OUT_DIR BATCH STOP STATE_IN STATE_OUT CACHE_DIR (``-``
for none); the rank and world size come from the launcher."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/helpers.py

import dalistream  # noqa: E402
from dalistream.pipelines import aspect_bucket_train  # noqa: E402
from elastic_train import run_rank  # noqa: E402

from helpers import PHOTO_SIZES  # noqa: E402


def main(source, out_dir, batch, stop, state_in, state_out, cache_dir):
    loader = aspect_bucket_train.loader(source, batch_size=int(batch), workers=2, device="cpu", policy="exact",
                                        seed=7, cache_dir=cache_dir, buckets=dalistream.AspectBuckets(PHOTO_SIZES),
                                        fields={"key": "__key__"}, label_exts=None)
    run_rank(loader, out_dir, stop, state_in, state_out,
             lambda b: {"keys": b["key"], "bucket": int(b["bucket"][0]), "shape": list(b["image"].shape[2:])})


if __name__ == "__main__":
    main(*sys.argv[1:8])
