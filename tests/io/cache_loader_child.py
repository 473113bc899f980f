"""A training process that reads shards from S3 through the node-local byte cache, for
tests/io/test_cache_loader.py: one rank of a job, or a process to kill while it writes blocks.

    python cache_loader_child.py SPEC.json

SPEC holds ``source``, ``options`` (storage options), ``cache``, ``cache_limit``, ``rank``,
``world_size``, ``epochs``, ``out`` and optionally ``fsize`` (the largest file the process and its
DALI workers may write: a worker writing a block past it is killed by SIGXFSZ in the middle of
the write) and ``together`` (a folder: the ranks end as a DDP job's do, together — each, its epochs
read, waits there for the others, then for the node's block fetches in flight to end, before it
closes its loader). It prints ``started`` after its first batch, and writes ``out``: the keys and
payload digests of every epoch's batches and ``loader.stats()``.
"""

import glob
import hashlib
import json
import os
import resource
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import dalistream  # noqa: E402
from dalistream.io.cachefiles import NAMESPACE  # noqa: E402

FIELDS = {"key": "__key__", "data": "bin"}


def batches_of(loader):
    """One epoch: per batch, the ``(key, sha256 of data)`` of its samples."""
    out = []
    for batch in loader:
        out.append([[str(k), hashlib.sha256(d if isinstance(d, bytes) else bytes(d.numpy())).hexdigest()[:16]]
                    for k, d in zip(batch["key"], batch["data"])])
        if len(out) == 1:
            print("started", flush=True)
    return out


def end_together(folder: str, rank: int, world_size: int, cache: str, seconds: float = 300) -> None:
    """Wait in ``folder`` until every rank has read its epochs, then until no block of the cache is
    being fetched (a worker's fetch lock gone): a rank that closed its loader at once could end a
    fetch the other rank then makes again, whole, and the node would fetch a block twice."""
    open(os.path.join(folder, f"done-{rank}"), "w").close()
    deadline = time.monotonic() + seconds
    while not all(os.path.exists(os.path.join(folder, f"done-{r}")) for r in range(world_size)):
        if time.monotonic() > deadline:
            sys.exit("the other ranks did not end their epochs")
        time.sleep(0.05)
    while glob.glob(os.path.join(cache, NAMESPACE, "*", "*.lock")):
        if time.monotonic() > deadline:
            sys.exit("block fetches did not end")
        time.sleep(0.05)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if spec.get("fsize"):  # (Python ignores SIGXFSZ: a write past the limit would fail, not kill)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec["fsize"], spec["fsize"]))
    stream = dalistream.Stream.open(spec["source"], fields=FIELDS, batch_size=4, workers=2, rank=spec["rank"],
                                    world_size=spec["world_size"], device="cpu", seed=5, policy="exact",
                                    storage_options=spec["options"], cache=spec["cache"],
                                    cache_limit=spec.get("cache_limit"), cache_dir=None)
    with dalistream.Loader(stream) as loader:
        epochs = [batches_of(loader) for _ in range(spec["epochs"])]
        if spec.get("together"):
            end_together(spec["together"], spec["rank"], spec["world_size"], spec["cache"])
        stats = loader.stats(wait_s=10)
    with open(spec["out"], "w") as f:
        json.dump({"epochs": epochs, "stats": stats}, f, default=str)


if __name__ == "__main__":
    main()
