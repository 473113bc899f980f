"""A process's descriptors of cache block files (dalistream.io.cache through
dalistream.io.openfiles): one per block file, shared by the streams reading it, within the budget
of the process's table of open files; a block evicted, removed or replaced while the table had
closed its descriptor is taken again (fetched and counted, or checked as a new block), never
read as other bytes. Real files, a real folder, eviction by a cache of a smaller limit."""

import os

import pytest

from dalistream.io import cachefiles, openfiles
from dalistream.io.cache import ByteCache
from dalistream.io.openfiles import FileTable

from cache_helpers import Origin, block_files

KB = 1 << 10
BLOCK = 64 * KB
BUDGET = 2


def block_descriptors():
    """This process's open descriptors of cache block files."""
    out = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            out += ".blk" in os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


def objects_of(objects, paths):
    """The objects whose blocks' files are ``paths``."""
    return {url for url in objects
            if any(os.path.basename(p).startswith(cachefiles.key_name(url, "v", BLOCK)) for p in paths)}


@pytest.fixture
def table(monkeypatch):
    """This process's table of open files, with a budget of :data:`BUDGET` descriptors."""
    small = FileTable(BUDGET)
    monkeypatch.setattr(openfiles, "_table", small)
    return small


def replace(path, flip: bool) -> None:
    """Put a copy of the block file at ``path`` in its place (another inode), a data byte flipped if ``flip``."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if flip:
        data[cachefiles.HEADER.size + 5] ^= 0xFF
    with open(path + ".new", "wb") as f:
        f.write(data)
    os.rename(path + ".new", path)


@pytest.mark.parametrize("streams_per_block", [1, 3])
def test_streams_on_cached_blocks_share_one_descriptor_per_block_within_the_budget(tmp_path, table,
                                                                                  streams_per_block):
    """Many streams, each on a block of its object's kept in the cache, hold no more descriptors of
    block files than the table's budget (one per block file, shared), and read their bytes."""
    origin = Origin(tmp_path / "origin")
    objects = {f"o{i}.tar": origin.put(f"o{i}.tar", os.urandom(2 * BLOCK)) for i in range(6)}
    cache = ByteCache(tmp_path / "c", None, block_bytes=BLOCK)
    for url in objects:
        cache.read(url, "v", 0, 2 * BLOCK, origin.fetch)  # kept and checked: read from the files from now on
    base = block_descriptors()
    streams = []
    for url, data in objects.items():
        for k in range(streams_per_block):
            s = cache.open(url, "v", 100 * k, 2 * BLOCK, origin.fetch)
            streams.append((s, data, 100 * k))
            assert s.read(1000) == data[100 * k:100 * k + 1000]
            assert block_descriptors() - base <= BUDGET
    assert table.peak <= BUDGET
    for s, data, at in streams:  # each reads on, its block's descriptor opened again where it was closed
        assert s.read() == data[at + 1000:]
        assert block_descriptors() - base <= BUDGET
        s.close()
    assert block_descriptors() == base
    assert cache.counters()["misses"] == 2 * len(objects)  # (the first reads: nothing fetched again)


@pytest.mark.parametrize("how", ["evicted", "removed", "replaced-damaged", "replaced-same"])
def test_a_block_gone_while_its_descriptor_is_closed_is_taken_again_never_other_bytes(tmp_path, table, how):
    """Streams on five kept blocks, the table keeping two descriptors: the other three blocks are no
    longer locked, so another cache's eviction (a smaller limit), a removal or a copy put in their
    place meets them. Read on, each stream gives its object's bytes: an evicted or removed block
    fetched again and counted as a miss; a copy put in its place (another inode) checked as a new
    block: one whose bytes do not match is counted damaged and fetched, a good one read from the
    cache."""
    origin = Origin(tmp_path / "origin")
    objects = {f"o{i}.tar": origin.put(f"o{i}.tar", os.urandom(BLOCK)) for i in range(5)}
    folder = tmp_path / "c"
    cache = ByteCache(folder, None, block_bytes=BLOCK)
    for url in objects:
        cache.read(url, "v", 0, BLOCK, origin.fetch)
    base = block_descriptors()
    streams = [(cache.open(url, "v", 0, BLOCK, origin.fetch), data) for url, data in objects.items()]
    for s, data in streams:
        assert s.read(BLOCK // 2) == data[:BLOCK // 2]
    assert block_descriptors() - base == BUDGET  # the last two streams' blocks; the first three closed
    closed = [p for p in block_files(folder)
              if not any(e.fd is not None and e.path == p for e in table.open)]
    assert len(closed) == len(objects) - BUDGET
    if how == "evicted":
        other = ByteCache(folder, BUDGET * cachefiles.block_size(BLOCK), block_bytes=BLOCK)  # trims the folder
        assert other.counters()["evictions"] == len(closed)  # (the blocks still open are locked: passed over)
        assert not any(os.path.exists(p) for p in closed)
    for p in closed:
        if how == "removed":
            os.unlink(p)
        elif how.startswith("replaced"):
            replace(p, flip=how == "replaced-damaged")
    before = cache.counters()
    calls = len(origin.calls)
    for s, data in streams:
        assert s.read() == data[BLOCK // 2:]
        s.close()
    after = cache.counters()
    taken = {k: after[k] - before[k] for k in after}
    again = 0 if how == "replaced-same" else len(closed)
    assert taken["misses"] == again and taken["remote_bytes"] == again * BLOCK
    fetched = {c[0] for c in origin.calls[calls:]}  # (a block is fetched from where its stream is, then its head)
    assert len(fetched) == again and fetched <= objects_of(objects, closed)
    assert taken["damaged"] == (len(closed) if how == "replaced-damaged" else 0)
    assert taken["hits"] == (len(closed) if how == "replaced-same" else 0)  # (checked whole: its CRC-32)
    for url, data in objects.items():  # the blocks kept now are the store's bytes
        assert cache.read(url, "v", 0, BLOCK, origin.fetch) == data
    assert {c[0] for c in origin.calls[calls:]} == fetched
