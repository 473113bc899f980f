"""A process that reads through a ByteCache, for tests/io/test_cache.py: one of several readers of a
node, a writer to kill, a reader that holds a block open.

    python cache_child.py MODE FOLDER LIMIT BLOCK ORIGIN LOG URL VERSION START END [DELAY]

The "remote store" is ORIGIN/URL (a local file); every fetch appends ``pid url version start end``
to LOG (one line, O_APPEND) and then sleeps DELAY seconds. The child builds its cache, prints
``ready``, waits for a line on stdin, then:

- ``read``: reads [START, END) and prints ``sha256 <hex>`` and ``counters <json>``;
- ``pieces``: as ``read``, through a stream read 5,000 bytes at a time;
- ``hold``: reads byte START into the cache, then opens [START, END) and reads one byte (its
  block, now read from its file, stays open, locked shared), prints ``holding``, waits for a line on
  stdin, reads the rest, prints ``sha256 <hex>``;
- ``fetched``: as ``read``, but each fetch prints ``fetched`` before returning its bytes (a test
  kills the process then, while it writes the block);
- ``fsize``: as ``read``, with the largest file it may write set to half a block (the kernel
  kills it with SIGXFSZ in the middle of writing a block);
- ``stall``: as ``fsize``, but SIGXFSZ is caught: the process prints ``writing`` and waits there,
  half a block written, for the test's ``kill -9`` (it fills the cache with ``warm``, which
  fetches and writes in the calling thread, where Python runs the signal's handler).
"""

import hashlib
import json
import os
import resource
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from dalistream.io.cache import ByteCache  # noqa: E402


def stalled(signum, frame):
    print("writing", flush=True)
    while True:
        time.sleep(60)


def main() -> None:
    mode, folder, limit, block, origin, log, url, version, start, end = sys.argv[1:11]
    delay = float(sys.argv[11]) if len(sys.argv) > 11 else 0.0
    start, end, block = int(start), int(end), int(block)

    def fetch(u, v, a, b, progress=None):
        with open(os.path.join(origin, u), "rb") as f:
            f.seek(a)
            data = f.read(b - a)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{os.getpid()} {u} {v} {a} {b}\n".encode())
        os.close(fd)
        if mode == "fetched":
            print("fetched", flush=True)
        time.sleep(delay)
        return data

    cache = ByteCache(folder, int(limit), block_bytes=block)
    if mode in ("fsize", "stall"):
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL if mode == "fsize" else stalled)
        resource.setrlimit(resource.RLIMIT_FSIZE, (block // 2, block // 2))
    print("ready", flush=True)
    sys.stdin.readline()
    if mode == "hold":
        cache.read(url, version, start, start + 1, fetch)
        stream = cache.open(url, version, start, end, fetch)
        first = stream.read(1)
        print("holding", flush=True)
        sys.stdin.readline()
        data = first + stream.read()
        stream.close()
    elif mode == "pieces":
        with cache.open(url, version, start, end, fetch) as stream:
            data = b"".join(iter(lambda: stream.read(5000), b""))
    else:
        if mode == "stall":
            cache.warm(url, version, start, end, fetch)
        data = cache.read(url, version, start, end, fetch)
    print("sha256", hashlib.sha256(data).hexdigest(), flush=True)
    print("counters", json.dumps(cache.counters()), flush=True)


if __name__ == "__main__":
    main()
