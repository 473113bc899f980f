"""A DALI worker's life without DALI, for tests/worker/test_open_files.py: a pickled
:class:`~dalistream.worker.WorkerSource` (handed to DALI in the test's process) is unpickled here, as
DALI's worker unpickles it, and iterated for some epochs (``iter`` then ``next`` until
``StopIteration``, its entry point included). Every batch is hashed.

Once the entry point has set the worker's budget of open shard files (the first ``iter``), the
process's soft limit of open files is lowered to the descriptors it had open before plus
``MORE`` (``budget+N``: that budget and N more, for the client's sockets, a module imported on the
way): the kernel itself then refuses any descriptor past them (``Too many open files``), however
briefly it would be open. The descriptors open (``/proc/self/fd``) are counted after every batch too.

    python open_files_child.py SOURCE_PICKLE EPOCHS MORE [RUN_BYTES]

``RUN_BYTES``: runs of about that many bytes (as ``helpers.short_runs`` makes them), so that tiny
shards are read as large ones are: a part of more than a run and a half cut out of its file's
mapping.

Prints one JSON line: ``digest`` (of every batch, in order), ``batches``, ``base`` (descriptors
open before the first epoch), ``peak`` (the most open after a batch), ``sockets`` (the most sockets
open after a batch), ``soft`` (the soft limit of open files the entry point left), ``budget`` (the
worker's table's), ``io_by_epoch`` (the worker's I/O counters per epoch: bytes fetched, the byte
cache's hits and misses).
"""

import hashlib
import json
import os
import pickle
import resource
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def descriptors():
    """This process's open descriptors, and how many of them are sockets."""
    names = os.listdir("/proc/self/fd")
    sockets = 0
    for name in names:
        try:
            sockets += os.readlink(f"/proc/self/fd/{name}").startswith("socket:")
        except OSError:
            pass  # (listdir's own descriptor, closed by now)
    return len(names) - 1, sockets


def main() -> None:
    path, epochs, more = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if len(sys.argv) > 4:
        from dalistream.tar import runs

        runs.MIN_RUN_BYTES, runs.MAPPED_RUN_BYTES, runs.MIN_RUN_SAMPLES = int(sys.argv[4]), 0, 0
    with open(path, "rb") as f:
        source = pickle.load(f)
    from dalistream.io.openfiles import files_table

    base = descriptors()[0]
    peak = sockets = 0
    digest, batches = hashlib.sha256(), 0
    soft = None
    for _ in range(epochs):
        batch_of = iter(source)
        if soft is None:  # (the entry point has run: the limit it left, and the budget it set)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            extra = files_table().limit + int(more[len("budget+"):]) if more.startswith("budget+") else int(more)
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, base + extra), hard))
        for outputs in batch_of:
            batches += 1
            for output in outputs:
                for array in (output if isinstance(output, list) else [output]):
                    array = np.asarray(array)
                    digest.update(f"{array.dtype}{array.shape}".encode() + array.tobytes())
            n, s = descriptors()
            peak, sockets = max(peak, n), max(sockets, s)
    print(json.dumps({"digest": digest.hexdigest(), "batches": batches, "base": base, "peak": peak,
                      "sockets": sockets, "soft": soft, "budget": files_table().limit,
                      "io_by_epoch": source._stats.io_epochs()}), flush=True)


if __name__ == "__main__":
    main()
