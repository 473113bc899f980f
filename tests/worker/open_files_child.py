"""A DALI worker's life without DALI, for tests/worker/test_open_files.py: a pickled
:class:`~dalistream.worker.WorkerSource` (handed to DALI in the test's process) is unpickled here, as
DALI's worker unpickles it, and iterated for some epochs (``iter`` then ``next`` until
``StopIteration``, its entry point included). Every batch is hashed; the process's open
descriptors are counted (``/proc/self/fd``) after every ``os.open`` and after every batch.

    python open_files_child.py SOURCE_PICKLE EPOCHS

Prints one JSON line: ``digest`` (of every batch, in order), ``batches``, ``base`` (descriptors
open before the first epoch), ``peak`` (the most open at once), ``sockets`` (the most sockets open
after a batch), ``soft`` (the soft limit of open files after the entry point), ``budget`` (the
worker's table's).
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
    path, epochs = sys.argv[1], int(sys.argv[2])
    with open(path, "rb") as f:
        source = pickle.load(f)
    seen = {"peak": 0, "sockets": 0}
    real_open = os.open

    def counted_open(*args, **kwargs):  # (the count only grows where something is opened)
        fd = real_open(*args, **kwargs)
        seen["peak"] = max(seen["peak"], descriptors()[0])
        return fd

    base = descriptors()[0]
    os.open = counted_open
    digest, batches = hashlib.sha256(), 0
    try:
        for _ in range(epochs):
            for outputs in iter(source):
                batches += 1
                for output in outputs:
                    for array in (output if isinstance(output, list) else [output]):
                        array = np.asarray(array)
                        digest.update(f"{array.dtype}{array.shape}".encode() + array.tobytes())
                n, sockets = descriptors()
                seen["peak"], seen["sockets"] = max(seen["peak"], n), max(seen["sockets"], sockets)
    finally:
        os.open = real_open
    from dalistream.io.openfiles import files_table

    print(json.dumps({"digest": digest.hexdigest(), "batches": batches, "base": base, "peak": seen["peak"],
                      "sockets": seen["sockets"], "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                      "budget": files_table().limit}), flush=True)


if __name__ == "__main__":
    main()
