"""Helpers of the byte cache's tests (tests/io/test_cache*.py): the cache folder measured all
along, a block changed in place, a store's objects in a folder (:class:`Origin`), the loader's outputs digested, a training process started."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import subprocess
import sys

CHILD = os.path.join(os.path.dirname(__file__), "io", "cache_loader_child.py")
#: what the folder holds beyond its blocks (docs/guide/cache.md): the ledger, the tag, 8 bytes per fetch
BOOKKEEPING = 4096


def measure(root):
    """``(blocks, files)``: the bytes of the folder's blocks and partials, and of all its files."""
    blocks = files = 0
    for top, _, names in os.walk(root):
        for n in names:
            try:
                size = os.lstat(os.path.join(top, n)).st_size
            except FileNotFoundError:
                continue
            files += size
            blocks += size if n.endswith((".blk", ".partial")) else 0
    return blocks, files


def watch(root):
    """Measure ``root`` under the ledger's lock (a ``flock`` of its file ``usage``) until stdin
    closes; print the most seen and the samples."""
    most, samples = (0, 0), 0
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0.002)[0]:
        try:
            fd = os.open(os.path.join(root, "usage"), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            now = measure(root)
        finally:
            os.close(fd)
        most, samples = (max(most[0], now[0]), max(most[1], now[1])), samples + 1
    print(json.dumps([*most, samples]), flush=True)


class FolderWatch:
    """A process that measures the cache folder until stopped: the most its blocks and partials
    took (``blocks``) and the most all its files took (``files``), each measured under the
    ledger's lock (the blocks are put in place and removed under it: a measure that walked the
    folder while a block was evicted and another written could count both, a moment that never
    was). A process of its own, not a thread: a DALI worker forked while a thread of the test held
    the ledger's lock would hold it forever (a ``flock`` belongs to the open file, which a fork shares)."""

    def __init__(self, folder):
        self.root = os.path.join(str(folder), "dalistream-bytes-v1")
        self.blocks = self.files = self.samples = 0

    def __enter__(self):
        self._proc = subprocess.Popen([sys.executable, __file__, self.root], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc):
        out, _ = self._proc.communicate(timeout=60)
        self.blocks, self.files, self.samples = json.loads(out.strip().splitlines()[-1])
        blocks, files = measure(self.root)
        self.blocks, self.files = max(self.blocks, blocks), max(self.files, files)


def damage(path, how, at):
    """Change a block's file in place: ``zero`` 4 KiB of its bytes from ``at`` (its size kept),
    ``flip`` one bit at ``at``, or ``truncate`` it at ``at``."""
    from dalistream.io import cachefiles

    length = cachefiles.length_of(os.path.getsize(path))
    start = cachefiles.block_size(length) - length
    with open(path, "r+b") as f:
        if how == "truncate":
            f.truncate(start + at)
        elif how == "zero":
            f.seek(start + at)
            f.write(bytes(min(4096, length - at)))
        else:
            f.seek(start + at)
            byte = f.read(1)[0]
            f.seek(start + at)
            f.write(bytes([byte ^ 0x10]))


def cache_folder(tmp_path, name="cache"):
    path = tmp_path / name
    path.mkdir(mode=0o700)
    return str(path)


def digests(batch):
    return [(str(k), hashlib.sha256(d if isinstance(d, bytes) else bytes(d.numpy())).hexdigest()[:16]) for k, d in zip(batch["key"], batch["data"])]


class Origin:
    """Objects in a folder standing in for a store; ``fetch`` counts calls per (url, version, start)."""

    def __init__(self, folder):
        self.folder = str(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.calls = []

    def put(self, url, data):
        with open(os.path.join(self.folder, url), "wb") as f:
            f.write(data)
        return data

    def fetch(self, url, version, start, end, progress=None):
        self.calls.append((url, version, start, end))
        with open(os.path.join(self.folder, url), "rb") as f:
            f.seek(start)
            return f.read(end - start)


def block_files(folder):
    return sorted(os.path.join(r, n) for r, _, names in os.walk(folder) for n in names if n.endswith(".blk"))


def start_child(spec_path):
    return subprocess.Popen([sys.executable, CHILD, spec_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))


def run_children(spec_paths):
    """One job per spec file (:func:`start_child`), all at once; each must exit 0 (its stderr's end
    shown otherwise); whatever any of them left running is killed."""
    from helpers import end_group  # (here, not at the top: this file also runs alone as the folder's watch)

    procs = [start_child(path) for path in spec_paths]
    try:
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            end_group(p)


if __name__ == "__main__":
    watch(sys.argv[1])
