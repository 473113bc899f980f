"""The node-local byte cache (dalistream.io.cache): real files, real processes sharing one folder,
a real full file system. The "remote store" is a local origin file read by a fetch function that
counts its calls."""

import errno
import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from dalistream.errors import ConfigError
from dalistream.io import cachefiles
from dalistream.io.cache import ByteCache, parse_size
from dalistream.io.cachesim import LRUModel, blocks, eviction_slack

from cache_helpers import BOOKKEEPING, FolderWatch, Origin, block_files, damage
from helpers import small_disk

CHILD = os.path.join(os.path.dirname(__file__), "cache_child.py")
KB = 1 << 10


@pytest.fixture
def origin(tmp_path):
    return Origin(tmp_path / "origin")


# -- reads, versions, bad entries ---------------------------------------------------------------

@pytest.mark.parametrize("start,end", [(0, 1), (0, 64 * KB), (5, 64 * KB + 7), (64 * KB - 1, 64 * KB + 1),
                                       (100, 300 * KB), (290 * KB, 400 * KB), (300 * KB, 300 * KB)])
def test_a_range_reads_the_same_bytes_from_the_store_and_from_the_cache(tmp_path, origin, start, end):
    data = origin.put("a.tar", os.urandom(300 * KB))  # 4.7 blocks of 64 KiB
    cache = ByteCache(tmp_path / "c", "1GB", block_bytes=64 * KB)
    assert cache.read("a.tar", "v1", start, end, origin.fetch) == data[start:end]
    fetched = len(origin.calls)
    assert cache.read("a.tar", "v1", start, end, origin.fetch) == data[start:end]
    assert len(origin.calls) == fetched  # the second read fetched nothing
    # whole blocks, each fetched once: from where the read starts in it, then the bytes before that
    by_block = {}
    for _, _, a, b in origin.calls:
        by_block.setdefault(a // (64 * KB), []).append((a, b))
    for k, ranges in by_block.items():
        assert len(ranges) <= 2 and ranges[0][1] == (k + 1) * 64 * KB
        assert sorted(ranges)[0][0] == k * 64 * KB and sum(b - a for a, b in ranges) == 64 * KB
    with cache.open("a.tar", "v1", start, None, origin.fetch) as stream:
        assert stream.read() == data[start:]


def test_a_changed_version_is_fetched_again_never_served_stale(tmp_path, origin):
    cache = ByteCache(tmp_path / "c", "1GB", block_bytes=64 * KB)
    old = origin.put("a.tar", os.urandom(200 * KB))
    assert cache.read("a.tar", "etag-1", 0, 200 * KB, origin.fetch) == old
    new = origin.put("a.tar", os.urandom(150 * KB))  # replaced, shorter
    origin.calls.clear()
    assert cache.read("a.tar", "etag-2", 0, 200 * KB, origin.fetch) == new
    assert {c[1] for c in origin.calls} == {"etag-2"} and len(origin.calls) == 3
    origin.calls.clear()
    assert cache.read("a.tar", "etag-2", 0, 200 * KB, origin.fetch) == new and origin.calls == []
    # another URL with the same version shares nothing
    origin.put("b.tar", os.urandom(10))
    assert cache.read("b.tar", "etag-2", 0, 10, origin.fetch) != new[:10] and origin.calls


def test_an_object_without_a_version_is_never_cached(tmp_path, origin, caplog):
    data = origin.put("a.tar", os.urandom(100 * KB))
    cache = ByteCache(tmp_path / "c", "1GB", block_bytes=64 * KB)
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        for _ in range(3):
            assert cache.read("a.tar", None, 10, 100 * KB, origin.fetch) == data[10:]
    assert block_files(tmp_path / "c") == [] and cache.counters()["hits"] == 0
    assert caplog.text.count("no version") == 1
    assert origin.calls[0][1:] == (None, 10, 64 * KB)  # not cached: no byte before the range is fetched


@pytest.mark.parametrize("damage", ["truncated", "longer", "other block", "flipped byte", "empty", "not a block"])
def test_a_damaged_block_is_not_trusted_and_is_fetched_again(tmp_path, origin, damage):
    data = origin.put("a.tar", os.urandom(128 * KB))
    cache = ByteCache(tmp_path / "c", "1GB", block_bytes=64 * KB)
    assert cache.read("a.tar", "v", 0, 128 * KB, origin.fetch) == data
    first, second = block_files(tmp_path / "c")
    name = [p for p in (first, second) if p.endswith("-00000000.blk")][0]
    other = second if name == first else first
    with open(name, "r+b") as f:
        if damage == "truncated":
            f.truncate(cachefiles.HEADER.size + 1000)
        elif damage == "longer":
            f.seek(0, 2)
            f.write(b"x")
        elif damage == "empty":
            f.truncate(0)
        elif damage == "not a block":
            f.write(b"\0" * 64)
        elif damage == "other block":
            f.write(open(other, "rb").read())
        else:  # a byte changed in place (the size kept): caught by its chunk's CRC when read
            f.seek(cachefiles.block_size(64 * KB) - 64 * KB + 5)
            f.write(bytes([data[5] ^ 0xFF]))
    log = tmp_path / "fetches"  # the next job: a process of its own (this one trusts the blocks it wrote)
    job = Child("read", tmp_path / "c", 10**9, 64 * KB, origin, log, "a.tar", "v", 0, 128 * KB)
    job.go()
    digest, counters = job.result()
    assert digest == sha(data) and counters["damaged"] == 1
    assert [int(row[3]) for row in fetch_log(log)] == [0]


# -- limits, eviction, LRU ---------------------------------------------------------------------

def test_a_limit_below_one_block_streams_and_says_so_once(tmp_path, origin, caplog):
    data = origin.put("a.tar", os.urandom(200 * KB))
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        cache = ByteCache(tmp_path / "c", 64 * KB, block_bytes=64 * KB)  # header + block > limit
        for start in (0, 1000, 70 * KB, 0):
            assert cache.read("a.tar", "v", start, 200 * KB, origin.fetch) == data[start:]
    assert caplog.text.count("below one block") == 1
    assert block_files(tmp_path / "c") == [] and cache.usage() == 0
    c = cache.counters()
    assert c["hits"] == 0 and c["uncached_bytes"] == c["remote_bytes"] == sum(200 * KB - s for s in (0, 1000, 70 * KB, 0))


def test_a_full_limit_of_blocks_being_read_streams_instead_of_waiting(tmp_path, origin, caplog):
    """Room for one block, held open by a reader (reading its file: a stream that fetched the
    block itself reads it from memory): another block is read without caching (no deadlock, no
    eviction of the block being read), said once."""
    a, b = origin.put("a.tar", os.urandom(64 * KB)), origin.put("b.tar", os.urandom(128 * KB))
    cache = ByteCache(tmp_path / "c", cachefiles.block_size(64 * KB), block_bytes=64 * KB)
    assert cache.read("a.tar", "v", 0, 64 * KB, origin.fetch) == a
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        with cache.open("a.tar", "v", 0, 64 * KB, origin.fetch) as held:
            assert held.read(10) == a[:10]
            for _ in range(2):
                assert cache.read("b.tar", "v", 0, 128 * KB, origin.fetch) == b
            assert held.read() == a[10:]
    assert caplog.text.count("read without caching") == 1
    assert [os.path.basename(p)[-12:] for p in block_files(tmp_path / "c")] == ["00000000.blk"]
    assert cache.counters()["evictions"] == 0
    cache.read("b.tar", "v", 0, 64 * KB, origin.fetch)  # nothing held now: a.tar's block goes
    assert cache.counters()["evictions"] == 1


def epoch_orders(objects, blocks_per_object, epochs, seed):
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(range(objects))
        rng.shuffle(order)
        yield [(f"s{i:03d}.tar", b) for i in order for b in range(blocks_per_object)]


@pytest.mark.parametrize("objects,blocks_per_object,fraction", [(16, 4, 0.5), (24, 3, 0.5), (10, 8, 0.3)])
def test_lru_under_a_limit_refetches_what_the_model_predicts(tmp_path, origin, objects, blocks_per_object, fraction):
    block = 16 * KB
    for i in range(objects):
        origin.put(f"s{i:03d}.tar", os.urandom(block * blocks_per_object))
    size = cachefiles.block_size(block)
    limit = int(objects * blocks_per_object * size * fraction)
    cache = ByteCache(tmp_path / "c", limit, block_bytes=block)
    model = LRUModel(limit, eviction_slack(limit, block))
    for order in epoch_orders(objects, blocks_per_object, 6, seed=objects):
        before = cache.counters()
        for url, b in order:
            assert cache.read(url, "v", b * block, (b + 1) * block, origin.fetch) == \
                open(os.path.join(origin.folder, url), "rb").read()[b * block:(b + 1) * block]
        real = cache.counters()["remote_bytes"] - before["remote_bytes"]
        predicted = model.run(((url, b), size) for url, b in order)["misses"] * block
        assert abs(real - predicted) <= 0.1 * predicted, (real, predicted)
        assert cache.usage() <= limit
    assert cache.counters()["evictions"] > 0


def test_the_model_is_lru_by_size():
    m = LRUModel(30)
    assert [m.access(k, 10) for k in "abcab"] == [False, False, False, True, True]
    assert not m.access("d", 10)  # evicts c, the least recently used
    assert m.access("a", 10) and m.access("b", 10) and not m.access("c", 10)
    assert not m.access("big", 31) and m.counters["uncached_bytes"] == 31
    assert list(blocks(0, 1, 8)) == [0] and list(blocks(7, 9, 8)) == [0, 1] and list(blocks(8, 8, 8)) == []
    assert eviction_slack(32 * 8, 8) == 8 and eviction_slack(31 * 8, 8) == 0


# -- the folder ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o703])
def test_a_folder_writable_by_others_is_refused(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(ConfigError, match="writable by every user"):
        ByteCache(folder, "1GB")


def test_a_folder_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    for folder in (tmp_path / "theirs", tmp_path / "mine"):
        folder.mkdir(mode=0o755)
    os.chown(tmp_path / "theirs", 12345, 12345)
    with pytest.raises(ConfigError, match="owned by another user"):
        ByteCache(tmp_path / "theirs", "1GB")
    (tmp_path / "mine" / cachefiles.NAMESPACE).mkdir(mode=0o700)
    os.chown(tmp_path / "mine" / cachefiles.NAMESPACE, 12345, 12345)  # its own folder inside: the same check
    with pytest.raises(ConfigError, match="owned by another user"):
        ByteCache(tmp_path / "mine", "1GB")


def test_links_are_never_followed_and_nothing_else_is_removed(tmp_path, origin, caplog):
    folder, elsewhere = tmp_path / "c", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_bytes(b"keep")
    data = {u: origin.put(u, os.urandom(64 * KB)) for u in ("a.tar", "b.tar", "c.tar", "d.tar")}
    cache = ByteCache(folder, 2 * (cachefiles.block_size(64 * KB)), block_bytes=64 * KB)
    root = folder / cachefiles.NAMESPACE
    # a planted link where a.tar's blocks go, a link named like a block, files of the user
    key = cachefiles.key_name("a.tar", "v", 64 * KB)
    os.symlink(elsewhere, root / key[:2])
    bkey = cachefiles.key_name("b.tar", "v", 64 * KB)
    (root / bkey[:2]).mkdir()
    os.symlink(elsewhere / "precious", root / bkey[:2] / f"{'0' * 40}-00000000.blk")
    (root / bkey[:2] / "notes.blk").write_bytes(b"mine")
    (folder / "notes.txt").write_bytes(b"mine")
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        for _ in range(3):
            for url in data:
                assert cache.read(url, "v", 0, 64 * KB, origin.fetch) == data[url]
    assert os.listdir(elsewhere) == ["precious"] and (elsewhere / "precious").read_bytes() == b"keep"
    assert (root / bkey[:2] / "notes.blk").read_bytes() == b"mine" and (folder / "notes.txt").read_bytes() == b"mine"
    assert os.path.islink(root / bkey[:2] / f"{'0' * 40}-00000000.blk")
    assert cache.counters()["evictions"] > 0 and "symbolic link" in caplog.text
    ns_link = tmp_path / "c2"
    ns_link.mkdir(mode=0o700)
    os.symlink(elsewhere, ns_link / cachefiles.NAMESPACE)
    with pytest.raises(ConfigError, match="symbolic link"):
        ByteCache(ns_link, "1GB")


@pytest.mark.parametrize("text,expected", [("800GB", 800 * 10**9), ("1.5 TB", 1_500_000_000_000),
                                           ("512MiB", 512 << 20), ("10kb", 10_000), (4096, 4096), ("7", 7)])
def test_sizes_are_parsed(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["800 parsecs", "-1GB", "", "GB", -5, 1.5, True, None])
def test_a_bad_size_is_an_error_naming_the_option(bad):
    with pytest.raises(ConfigError, match="cache_limit"):
        parse_size(bad)


def test_a_full_disk_turns_the_cache_off_with_one_warning(tmp_path, origin, caplog):
    """A real full file system: a 1 MiB tmpfs (where this machine lets a test mount one)."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        data = {u: origin.put(u, os.urandom(1 << 20)) for u in ("a.tar", "b.tar")}
        cache = ByteCache(disk / "c", "1GB", block_bytes=128 * KB)
        with caplog.at_level(logging.WARNING, logger="dalistream"):
            assert cache.read("a.tar", "v", 0, 1 << 20, origin.fetch) == data["a.tar"]
            written = cache.counters()["written_bytes"]
            for url in ("b.tar", "a.tar", "b.tar"):
                assert cache.read(url, "v", 0, 1 << 20, origin.fetch) == data[url]
        assert 0 < written < 1 << 20 and cache.counters()["written_bytes"] == written  # stopped writing
        assert caplog.text.count("turned off") == 1 and "No space left on device" in caplog.text
        assert cache.counters()["hits"] >= written // (128 * KB)  # what it holds is still read
        c = cache.counters()  # the block whose write failed counted as fetched and not kept, not as written
        assert c["written_bytes"] + c["uncached_bytes"] == c["remote_bytes"] and c["uncached_bytes"] > 0
        assert not [p for p in os.listdir(disk / "c" / cachefiles.NAMESPACE) if p.endswith(".partial")]


# -- processes sharing one folder ----------------------------------------------------------------

class Child:
    def __init__(self, mode, folder, limit, block, origin, log, url, version, start, end, delay=0.0):
        args = [sys.executable, CHILD, mode, str(folder), str(limit), str(block), origin.folder, str(log), url,
                version, str(start), str(end), str(delay)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.expect("ready")

    def expect(self, word):
        line = self.proc.stdout.readline().strip()
        assert line == word, (word, line, self.proc.poll())

    def go(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self):
        out, _ = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, out
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        return lines["sha256"], json.loads(lines["counters"])


def fetch_log(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [tuple(line.split()) for line in f]


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("readers,ranges", [
    (2, [(0, 256 * KB), (0, 256 * KB)]),
    (4, [(0, 256 * KB), (10, 200 * KB), (64 * KB, 256 * KB), (100 * KB, 101 * KB)]),
    (3, [(0, 256 * KB), (0, 256 * KB), (0, 256 * KB)]),
])
def test_processes_racing_for_a_block_fetch_it_once(tmp_path, origin, readers, ranges):
    data = origin.put("a.tar", os.urandom(256 * KB))
    log = tmp_path / "fetches"
    children = [Child("read", tmp_path / "c", 10**9, 64 * KB, origin, log, "a.tar", "v", a, b, delay=0.2)
                for a, b in ranges]
    for c in children:
        c.go()  # all at once: the first to lock a block fetches it, the others wait and read it
    results = [c.result() for c in children]
    for (a, b), (digest, _) in zip(ranges, results):
        assert digest == sha(data[a:b])
    # a block is fetched from where its first reader starts, then the bytes before that
    fetches = [(int(row[3]), int(row[4])) for row in fetch_log(log)]
    got = sorted((a // (64 * KB), b - a) for a, b in fetches)
    wanted = {k for a, b in ranges for k in blocks(a, b, 64 * KB)}
    assert {k for k, _ in got} == wanted  # every block wanted, fetched
    assert all(sum(n for j, n in got if j == k) == 64 * KB for k in wanted)  # and once (its bytes once)
    assert sum(counters["hits"] for _, counters in results) > 0


@pytest.mark.slow
def test_two_jobs_of_other_block_sizes_share_a_folder(tmp_path, origin):
    data = origin.put("a.tar", os.urandom(512 * KB))
    log = tmp_path / "fetches"
    jobs = [Child("read", tmp_path / "c", 300 * KB, block, origin, log, "a.tar", "v", 0, 512 * KB, delay=0.01)
            for block in (16 * KB, 64 * KB, 16 * KB, 64 * KB)]
    for job in jobs:
        job.go()
    assert {job.result()[0] for job in jobs} == {sha(data)}
    held = sum(os.path.getsize(p) for p in block_files(tmp_path / "c"))
    assert held <= 300 * KB  # the limit, shared by the jobs


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stall", "fsize", "fetched"])
def test_a_writer_killed_mid_write_leaves_nothing_trusted(tmp_path, origin, mode):
    """``stall``: kill -9 of a writer stopped with half a block written; ``fsize``: the kernel kills
    it there (SIGXFSZ); ``fetched``: kill -9 right after its fetch, wherever that lands."""
    block = 8 << 20
    data = origin.put("a.tar", os.urandom(2 * block))
    folder, log = tmp_path / "c", tmp_path / "fetches"
    partials = set()
    for trial in range(5):
        writer = Child(mode, folder, 10**10, block, origin, log, "a.tar", f"v{trial}", 0, 2 * block)
        writer.go()
        if mode != "fsize":
            writer.expect("writing" if mode == "stall" else "fetched")
            writer.proc.send_signal(signal.SIGKILL)
        writer.proc.wait(timeout=60)
        assert writer.proc.returncode in (-signal.SIGKILL, -signal.SIGXFSZ)
        root = folder / cachefiles.NAMESPACE
        partials |= {n for _, _, names in os.walk(root) for n in names if n.endswith(".partial")}
        reader = Child("read", folder, 10**10, block, origin, log, "a.tar", f"v{trial}", 0, 2 * block)
        reader.go()
        assert reader.result()[0] == sha(data)
        for path in block_files(folder):  # every block trusted holds the bytes it names
            with open(path, "rb") as f:
                raw = f.read()
            index = int(path[-12:-4], 16)
            assert raw[cachefiles.block_size(block) - block:] == data[index * block:(index + 1) * block]
    if mode != "fetched":
        assert len(partials) == 5  # each kill landed inside a write
    cachefiles.scan(str(folder / cachefiles.NAMESPACE))  # a scan clears what dead writers left
    assert not [n for _, _, names in os.walk(folder) for n in names if cachefiles.is_ours(n) and not n.endswith(".blk")]


@pytest.mark.slow
def test_eviction_never_removes_a_block_another_process_reads(tmp_path, origin):
    block = 64 * KB
    a = origin.put("a.tar", os.urandom(2 * block))
    for u in "bcdef":
        origin.put(f"{u}.tar", os.urandom(block))
    folder = tmp_path / "c"
    limit = 3 * (cachefiles.block_size(block))
    holder = Child("hold", folder, limit, block, origin, tmp_path / "log", "a.tar", "v", 0, 2 * block)
    holder.go()
    holder.expect("holding")  # block 0 of a.tar open, locked shared, the oldest in the folder
    cache = ByteCache(folder, limit, block_bytes=block)
    (held_path,) = block_files(folder)
    for _ in range(2):
        for u in "bcdef":
            cache.read(f"{u}.tar", "v", 0, block, origin.fetch)
            assert os.path.exists(held_path)
    assert cache.counters()["evictions"] >= 4
    holder.go()
    assert holder.result()[0] == sha(a)
    for u in "bcdef":
        cache.read(f"{u}.tar", "v", 0, block, origin.fetch)
    assert not os.path.exists(held_path)  # let go of: evicted as any other


def test_the_cache_pickles_as_its_settings(tmp_path, origin):
    import pickle

    data = origin.put("a.tar", os.urandom(100))
    cache = ByteCache(tmp_path / "c", "1MB", block_bytes=64 * KB)
    cache.read("a.tar", "v", 0, 100, origin.fetch)
    again = pickle.loads(pickle.dumps(cache))
    assert (again.folder, again.limit_bytes, again.block_bytes) == (cache.folder, 10**6, 64 * KB)
    assert again.read("a.tar", "v", 0, 100, origin.fetch) == data and again.counters()["hits"] == 1


def test_a_failing_store_leaves_the_ledger_as_it_was(tmp_path, origin):
    cache = ByteCache(tmp_path / "c", "1GB", block_bytes=64 * KB)

    def broken(url, version, start, end, progress=None):
        raise OSError(errno.ECONNRESET, "connection reset")

    with pytest.raises(OSError):
        cache.read("a.tar", "v", 0, 10, broken)
    assert cache.usage() == 0 and block_files(tmp_path / "c") == []
    assert not [n for _, _, names in os.walk(tmp_path / "c") for n in names if cachefiles.is_ours(n)]


# -- a block being fetched, read as its bytes arrive ------------------------------------------------

class Trickle(Origin):
    """A store that gives a range's first ``first`` bytes at once, then holds the rest until
    ``go`` is set (a far link: a block takes seconds to arrive)."""

    def __init__(self, folder, first):
        super().__init__(folder)
        self.first, self.go = first, threading.Event()

    def fetch(self, url, version, start, end, progress=None):
        data = super().fetch(url, version, start, end)
        if progress is not None and len(data) > self.first:
            progress(data[:self.first])
            assert self.go.wait(30), "the test never let the rest of the block come"
            progress(data[self.first:])
        return data


def test_a_stream_reads_a_block_being_fetched_as_its_bytes_arrive_from_where_it_starts(tmp_path):
    origin = Trickle(tmp_path / "origin", first=16 * KB)
    data = origin.put("a.tar", os.urandom(1 << 20))
    cache = ByteCache(tmp_path / "c", "1GB", block_bytes=1 << 20)
    with cache.open("a.tar", "v", 200 * KB, 1 << 20, origin.fetch) as stream:
        assert stream.read(10 * KB) == data[200 * KB:210 * KB]  # before the rest of the block came
        assert origin.calls[0][2] == 200 * KB  # the block fetched from where the stream starts
        origin.go.set()
        assert stream.read() == data[210 * KB:]
    assert sorted((a, b) for _, _, a, b in origin.calls) == [(0, 200 * KB), (200 * KB, 1 << 20)]
    assert cache.read("a.tar", "v", 0, 1 << 20, origin.fetch) == data and len(origin.calls) == 2  # kept whole


def test_a_stream_starting_far_into_a_block_in_flight_takes_its_first_bytes_directly(tmp_path):
    """Two streams in one block, the second far past what has come of it: its first reads are
    fetched straight from the store (not kept); it then reads the block; every byte as stored."""
    origin = Trickle(tmp_path / "origin", first=16 * KB)
    data = origin.put("a.tar", os.urandom(1 << 20))
    cache = ByteCache(tmp_path / "c", "1GB", block_bytes=1 << 20)
    with cache.open("a.tar", "v", 0, 1 << 20, origin.fetch) as first, \
            cache.open("a.tar", "v", 600 * KB, 1 << 20, origin.fetch) as second:
        assert first.read(8 * KB) == data[:8 * KB]
        assert second.read(8 * KB) == data[600 * KB:608 * KB]  # while the block is held back
        assert (600 * KB, 608 * KB) in [(a, b) for _, _, a, b in origin.calls]
        assert cache.counters()["uncached_bytes"] == 8 * KB
        origin.go.set()
        assert second.read() == data[608 * KB:] and first.read() == data[8 * KB:]
    assert cache.counters()["misses"] == 1 and cache.counters()["written_bytes"] == 1 << 20


# -- the limit at every moment -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("limit_blocks,block,readers", [(1, 64 * KB, 4), (2, 64 * KB, 4), (3, 256 * KB, 3),
                                                         (5, 64 * KB, 6)])
def test_processes_fetching_at_once_never_take_more_than_the_limit(tmp_path, origin, limit_blocks, block, readers):
    """Readers in processes of their own fetch other objects at once, through a limit of a few
    blocks: the folder (blocks, blocks being written) never passes the limit, measured all along."""
    limit = limit_blocks * cachefiles.block_size(block)
    data = {f"o{i}.tar": origin.put(f"o{i}.tar", os.urandom(3 * block)) for i in range(readers)}
    folder, log = tmp_path / "c", tmp_path / "fetches"
    ByteCache(folder, limit, block_bytes=block)
    with FolderWatch(folder) as watch:
        for _ in range(2):
            children = [Child("read", folder, limit, block, origin, log, url, "v", 0, 3 * block, delay=0.02)
                        for url in data]
            for c in children:
                c.go()
            results = [c.result() for c in children]
            assert [digest for digest, _ in results] == [sha(d) for d in data.values()]
    assert watch.samples > 10
    assert watch.blocks <= limit and watch.files <= limit + BOOKKEEPING, (watch.blocks, watch.files, limit)
    assert ByteCache(folder, limit, block_bytes=block).usage() <= limit
    assert sum(c["evictions"] + c["no_room"] for _, c in results) > 0  # (the limit bit)


@pytest.mark.parametrize("before,after", [(8, 2), (8, 1), (3, 0)])
def test_a_job_with_a_smaller_limit_brings_the_folder_under_it_when_it_opens(tmp_path, origin, before, after):
    """A folder left by a job with a larger limit: the next job's cache is built with the folder
    under its own limit (0: below one block, nothing cached), the blocks evicted counted."""
    block = 64 * KB
    room = cachefiles.block_size(block)
    data = origin.put("a.tar", os.urandom(8 * block))
    ByteCache(tmp_path / "c", before * room, block_bytes=block).read("a.tar", "v", 0, 8 * block, origin.fetch)
    assert len(block_files(tmp_path / "c")) == before
    cache = ByteCache(tmp_path / "c", after * room, block_bytes=block)
    assert len(block_files(tmp_path / "c")) == after and cache.usage() <= after * room
    assert cache.counters()["evictions"] == before - after
    assert cache.read("a.tar", "v", 0, 8 * block, origin.fetch) == data


def test_a_block_that_finds_no_room_is_read_without_caching_and_counted(tmp_path, origin):
    """Room for one block, held open by a reader: each block of another object is read without
    caching and counted in ``no_room``; with the reader gone, they are kept again."""
    block = 64 * KB
    a, b = origin.put("a.tar", os.urandom(block)), origin.put("b.tar", os.urandom(3 * block))
    cache = ByteCache(tmp_path / "c", cachefiles.block_size(block), block_bytes=block)
    cache.read("a.tar", "v", 0, block, origin.fetch)
    with cache.open("a.tar", "v", 0, block, origin.fetch) as held:
        assert held.read(1) == a[:1]
        assert cache.read("b.tar", "v", 0, 3 * block, origin.fetch) == b
        c = cache.counters()
        assert c["no_room"] == 3 and c["uncached_bytes"] == 3 * block and c["evictions"] == 0
    assert cache.read("b.tar", "v", 0, block, origin.fetch) == b[:block]
    assert cache.counters()["no_room"] == 3 and cache.counters()["evictions"] == 1


# -- every byte read from a block is checked ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("how", ["zero", "flip", "truncate"])
@pytest.mark.parametrize("at", [0, 100 * KB, 256 * KB - 4096])
@pytest.mark.parametrize("reads", ["whole", "in small reads", "from an offset"])
def test_a_changed_block_is_fetched_again_and_counted_never_delivered(tmp_path, origin, how, at, reads):
    """A block changed on the disk after a job kept it: the next job (a process of its own)
    checks it the first time it reads it, fetches it again, counts it, and gives the store's bytes."""
    block = 256 * KB
    data = origin.put("a.tar", os.urandom(2 * block))
    ByteCache(tmp_path / "c", "1GB", block_bytes=block).read("a.tar", "v", 0, 2 * block, origin.fetch)
    path = [p for p in block_files(tmp_path / "c") if p.endswith("-00000000.blk")][0]
    damage(path, how, at)
    log = tmp_path / "fetches"
    start = {"whole": 0, "in small reads": 0, "from an offset": 7 * KB + 3}[reads]
    job = Child("pieces" if reads == "in small reads" else "read", tmp_path / "c", 10**9, block, origin, log,
                "a.tar", "v", start, 2 * block)
    job.go()
    digest, c = job.result()
    assert digest == sha(data[start:])
    assert c["damaged"] == 1 and c["misses"] == 1 and c["hits"] == 1  # the damaged one fetched, the other kept
    assert sum(int(row[4]) - int(row[3]) for row in fetch_log(log)) == block  # that block again, nothing else
    fetched = len(fetch_log(log))
    again = Child("read", tmp_path / "c", 10**9, block, origin, log, "a.tar", "v", 0, 2 * block)
    again.go()
    assert again.result()[0] == sha(data) and len(fetch_log(log)) == fetched  # kept again, whole


@pytest.mark.slow
@pytest.mark.parametrize("how", ["zero", "flip", "truncate"])
def test_another_process_reads_the_stores_bytes_from_a_changed_block(tmp_path, origin, how):
    block = 128 * KB
    data = origin.put("a.tar", os.urandom(3 * block))
    log = tmp_path / "fetches"
    writer = Child("read", tmp_path / "c", 10**9, block, origin, log, "a.tar", "v", 0, 3 * block)
    writer.go()
    assert writer.result()[0] == sha(data)
    for path in block_files(tmp_path / "c"):
        damage(path, how, 5000)
    reader = Child("read", tmp_path / "c", 10**9, block, origin, log, "a.tar", "v", 0, 3 * block)
    reader.go()
    digest, counters = reader.result()
    assert digest == sha(data) and counters["damaged"] == 3 and counters["remote_bytes"] == 3 * block
