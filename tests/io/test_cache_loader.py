"""The node-local byte cache under a real loader: shards on a real S3 server (moto, on 127.0.0.1)
behind the shaping proxy, which counts what the store sends; DALI on the CPU. Epoch 2 reads
nothing from the store and delivers what a run without the cache delivers; under a limit the
bytes fetched again are what least-recently-used over the plan's order predicts; two ranks of one
node fetch each block once; a worker killed while writing blocks leaves nothing a later run
trusts; a replaced object is fetched again; a limit below one block, a full disk and a folder
others could write are handled as the guide says."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal

import numpy as np
import pytest

import dalistream
from dalistream.errors import ConfigError
from dalistream.io.cache import BLOCK_BYTES, ByteCache
from dalistream.io.cachefiles import NAMESPACE, block_size, length_of
from dalistream.io.cachesim import LRUModel, eviction_slack
from dalistream.plan import worker_plan
from dalistream.tools.proxy import ShapingProxy

from cache_helpers import block_files, cache_folder, digests, run_children, start_child
from helpers import end_group, index_on_s3, small_disk, wait_until, write_tar

pytestmark = [pytest.mark.s3, pytest.mark.dali, pytest.mark.timeout(900)]
BUCKET = "cache-loader"
FIELDS = {"key": "__key__", "data": "bin"}
SHARDS, SAMPLES, SIZE = 6, 30, 60_000  # 6 shards of ~1.8 MB: 11 MB


def shard_members(shard: int, seed: int = 0):
    """A shard's members: the same sizes for every ``seed``, other bytes."""
    sizes = np.random.default_rng(shard).integers(SIZE, SIZE + 4000, SAMPLES)
    rng = np.random.default_rng([shard, seed])
    return [(f"s{shard}/{i:03d}.bin", rng.bytes(int(n))) for i, n in enumerate(sizes)]


@pytest.fixture(scope="module")
def store(moto_endpoint, tmp_path_factory):
    """The shards on S3 (a manifest with offsets beside them, written by `dalistream index`), read
    through a counting proxy: ``(source, options, proxy, client, sizes)``."""
    import boto3

    folder = tmp_path_factory.mktemp("shards")
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket=BUCKET)
    sizes = {}
    for s in range(SHARDS):
        path = write_tar(str(folder / f"c-{s:05d}.tar"), shard_members(s))
        client.upload_file(path, BUCKET, f"ds/c-{s:05d}.tar")
        sizes[f"s3://{BUCKET}/ds/c-{s:05d}.tar"] = os.path.getsize(path)
    index_on_s3(moto_endpoint, f"s3://{BUCKET}/ds/")
    with ShapingProxy(moto_endpoint) as proxy:
        yield f"s3://{BUCKET}/ds/", {"endpoint_url": proxy.endpoint}, proxy, client, sizes


def open_stream(store, **options):
    source, storage, *_ = store
    options.setdefault("storage_options", storage)
    return dalistream.Stream.open(source, fields=FIELDS, batch_size=4, workers=2, rank=options.pop("rank", 0),
                                  world_size=options.pop("world_size", 1), device="cpu", seed=5, policy="exact",
                                  cache_dir=None, **options)


def run_epochs(stream, epochs, first=0):
    """The (key, digest) lists of ``epochs`` epochs' batches from epoch ``first`` and the stats."""
    with dalistream.Loader(stream) as loader:
        loader.set_epoch(first)
        out = [[digests(b) for b in loader] for _ in range(epochs)]
        return out, loader.stats(wait_s=10)


def fetched(proxy, run):
    """What the store sent (answer body bytes, GETs) while ``run()`` ran, and its result."""
    before = proxy.counts()
    result = run()
    after = proxy.counts()
    return after["body_bytes"] - before["body_bytes"], after.get("GET", 0) - before.get("GET", 0), result


@pytest.fixture(scope="module")
def reference(store):
    """Two epochs read without a cache."""
    return run_epochs(open_stream(store), 2)[0]


# -- epoch 2 from the cache --------------------------------------------------------------------

@pytest.mark.slow
def test_the_second_epoch_reads_nothing_from_the_store_and_delivers_the_same_samples(store, reference, tmp_path):
    *_, proxy, _, sizes = store
    folder = cache_folder(tmp_path)
    opening, opening_gets, _ = fetched(proxy, lambda: open_stream(store, cache=folder))  # listing, manifest
    first_bytes, _, (first, stats) = fetched(proxy, lambda: run_epochs(open_stream(store, cache=folder), 1))
    assert first == reference[:1]
    assert first_bytes >= opening + sum(sizes.values()) and stats["by_epoch"][0]["io"]["cache_written_bytes"] > 0
    # a new run on the same node, its epoch 1 (the second): every block from the local disk
    second_bytes, gets, (second, stats) = fetched(proxy, lambda: run_epochs(open_stream(store, cache=folder), 1, 1))
    assert second == reference[1:]
    assert (second_bytes, gets) == (opening, opening_gets), "the shards' bytes came from the store again"
    io = stats["by_epoch"][1]["io"]
    assert io["bytes"] == 0 and io["cache_misses"] == 0 and io["cache_hits"] > 0
    assert io["cache_bytes"] >= sum(sizes.values()) - SHARDS * 1024  # all of every shard but its tar end
    assert stats["io"]["cache_hits"] == io["cache_hits"]


def test_one_run_of_two_epochs_counts_each_epochs_reads_apart(store, reference, tmp_path):
    """loader.stats() sums the cache's counters per epoch: the first epoch fetched, the second hit."""
    *_, sizes = store
    got, stats = run_epochs(open_stream(store, cache=cache_folder(tmp_path)), 2)
    assert got == reference
    first, second = stats["by_epoch"][0]["io"], stats["by_epoch"][1]["io"]
    assert first["bytes"] == first["cache_written_bytes"] >= sum(sizes.values()) - SHARDS * 1024
    assert second["cache_hits"] > 0 and second["cache_bytes"] > 0
    assert second["bytes"] <= BLOCK_BYTES  # (a worker may reach a block of epoch 2 before another's epoch 1 did)


# -- under a limit: what LRU over the plan's order predicts ---------------------------------------

def predicted(sizes, stream, block, limit, epochs):
    """Remote bytes per epoch of LRU (the cache's model) over one worker's reading order: each
    epoch's shards in the plan's order, each read whole, block by block."""
    model = LRUModel(limit, eviction_slack(limit, block))
    urls, counts, c = list(stream.data.urls), stream.data.counts, stream.config
    out = []
    for epoch in range(epochs):
        plan = worker_plan(counts, len(urls), c.plan_layout, c.schedule, epoch, 0, 0)
        fetched_bytes = 0
        for shard, _, _ in plan.parts:
            size = sizes[urls[shard]]
            for b in range(-(-size // block)):
                length = min(block, size - b * block)
                if not model.access((shard, b), block_size(length)):
                    fetched_bytes += length
        out.append(fetched_bytes)
    return out


@pytest.mark.slow
def test_a_limit_at_half_the_data_refetches_what_lru_over_the_plan_predicts(store, reference, tmp_path):
    *_, sizes = store
    block = 128 << 10
    limit = sum(sizes.values()) // 2
    cache = ByteCache(cache_folder(tmp_path), limit, block_bytes=block)
    source, storage, *_ = store
    stream = dalistream.Stream.open(source, fields=FIELDS, batch_size=4, workers=1, rank=0, world_size=1, device="cpu",
                                    seed=5, policy="exact", cache_dir=None, interleave=False, shuffle=0,
                                    storage_options={**storage, "parts_in_flight": 1, "cache": cache})
    epochs = 4
    got, stats = run_epochs(stream, epochs)
    expected = predicted(sizes, stream, block, limit, epochs)
    real = [stats["by_epoch"][e]["io"]["bytes"] for e in range(epochs)]
    assert all(len(batches) == len(got[0]) for batches in got)  # no epoch stalled or came short
    assert sorted(k for b in got[1] for k in b) == sorted(k for b in reference[1] for k in b)
    for e in range(1, epochs):
        assert abs(real[e] - expected[e]) <= 0.1 * expected[e], (real, expected)
    total = sum(sizes.values())
    assert real[0] == expected[0] == total and 0 < sum(expected[1:]) < (epochs - 1) * total  # (the limit bites)
    assert stats["io"]["cache_evictions"] > 0


# -- two ranks of one node ----------------------------------------------------------------------

def child_spec(tmp_path, store, folder, rank=0, world_size=1, epochs=1, name="out", options=None, **extra):
    source, storage, *_ = store
    spec = dict(source=source, options=options or storage, cache=folder, rank=rank, world_size=world_size,
                epochs=epochs, out=str(tmp_path / f"{name}-{rank}.json"), **extra)
    path = tmp_path / f"{name}-{rank}.spec.json"
    path.write_text(json.dumps(spec))
    return str(path), spec["out"]


@pytest.mark.slow
def test_two_ranks_of_one_node_fetch_each_block_once(store, tmp_path):
    *_, proxy, _, sizes = store
    folder = cache_folder(tmp_path)
    opening, _, _ = fetched(proxy, lambda: open_stream(store, cache=folder, rank=0, world_size=2))
    # (the ranks end together, as a DDP job's do: a rank closing its loader while one of its
    # workers fetched a block would end that fetch, and the other rank would fetch the block again)
    specs = [child_spec(tmp_path, store, folder, rank, 2, together=str(tmp_path)) for rank in range(2)]
    before = proxy.counts()
    run_children([spec for spec, _ in specs])
    after = proxy.counts()
    results = [json.loads(open(out).read()) for _, out in specs]
    blocks = block_files(folder)
    stored = sum(length_of(os.path.getsize(b)) for b in blocks)
    assert len(blocks) == SHARDS and stored == sum(sizes.values())  # a block each (shards are under 4 MiB)
    # what the store sent while both ran: each block once, and each process's listing and manifest
    assert after["body_bytes"] - before["body_bytes"] == stored + 2 * opening
    # (the workers' counters, as last written: a worker's read-ahead into the next epoch may have
    # fetched a block the other rank then found, and not written its counters since)
    io = [w["io"] for r in results for w in r["stats"]["workers"]]
    assert sum(i["cache_misses"] for i in io) <= len(blocks) and sum(i["cache_hits"] for i in io) > 0
    keys = [k for r in results for batch in r["epochs"][0] for k, _ in batch]
    assert sorted(keys) == sorted(f"s{s}/{i:03d}" for s in range(SHARDS) for i in range(SAMPLES))


# -- a worker killed while it fetches or writes blocks ---------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill -9 while fetching", "killed inside a block's write"])
def test_a_worker_killed_mid_write_leaves_nothing_a_new_run_trusts(store, reference, tmp_path, how):
    source, options, proxy, *_ = store
    folder = cache_folder(tmp_path)
    with contextlib.ExitStack() as stack:
        if how == "kill -9 while fetching":  # a slow link: blocks take seconds to arrive
            slow = stack.enter_context(ShapingProxy(proxy.endpoint, rate=300_000))
            spec, _ = child_spec(tmp_path, store, folder, epochs=2, options={"endpoint_url": slow.endpoint})
        else:  # the kernel kills the worker in the middle of writing a block (RLIMIT_FSIZE, SIGXFSZ)
            spec, _ = child_spec(tmp_path, store, folder, epochs=2, fsize=1_500_000)
        proc = start_child(spec)
        try:
            if how == "kill -9 while fetching":
                root = os.path.join(folder, NAMESPACE)
                locked = lambda: any(n.endswith(".lock") for _, _, names in os.walk(root) for n in names)  # noqa: E731
                assert wait_until(locked, 300), "no block fetch began"
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=600)
            assert proc.returncode != 0
        finally:
            end_group(proc)
    leftovers = [n for _, _, names in os.walk(folder) for n in names if n.endswith((".partial", ".lock"))]
    if how != "kill -9 while fetching":
        assert any(n.endswith(".partial") for n in leftovers), "no write was cut: the case is not met"
    got, stats = run_epochs(open_stream(store, cache=folder), 2)
    assert got == reference
    assert stats["io"]["cache_hits"] + stats["io"]["cache_misses"] > 0


# -- a replaced object ----------------------------------------------------------------------------

@pytest.mark.slow
def test_an_object_replaced_between_epochs_is_fetched_again(store, tmp_path, moto_endpoint):
    """The same key, the same size and layout (so the manifest still holds), other bytes: the next
    epoch fetches that shard again and delivers its new bytes; the other shards come from the cache."""
    _, _, _, client, sizes = store
    folder = cache_folder(tmp_path)
    key = "ds/c-00002.tar"
    url = f"s3://{BUCKET}/{key}"
    original = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    replaced = write_tar(str(tmp_path / "new.tar"), shard_members(2, seed=1))
    assert os.path.getsize(replaced) == len(original) and open(replaced, "rb").read() != original
    try:
        old, _ = run_epochs(open_stream(store, cache=folder), 1)
        client.upload_file(replaced, BUCKET, key)
        new, stats = run_epochs(open_stream(store, cache=folder), 1, 1)
        plain, _ = run_epochs(open_stream(store), 1, 1)
    finally:
        client.put_object(Bucket=BUCKET, Key=key, Body=original)
    assert new == plain  # the new bytes, not the cached old ones
    old_digests = {k: d for batch in old[0] for k, d in batch}
    changed = {k for batch in new[0] for k, d in batch if old_digests[k] != d}
    assert changed == {f"s2/{i:03d}" for i in range(SAMPLES)}
    io = stats["by_epoch"][1]["io"]
    assert sizes[url] - 1024 <= io["bytes"] <= sizes[url]  # that shard alone (its tar end is not read)


# -- limits, a full disk, folders -------------------------------------------------------------------

@pytest.mark.slow
def test_a_limit_below_one_block_streams_and_says_so_once(store, reference, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="dalistream.io.cache"):
        stream = open_stream(store, cache=cache_folder(tmp_path), cache_limit="1MB")  # a block is 4 MiB
        got, stats = run_epochs(stream, 1)
    said = [r for r in caplog.records if "below one block" in r.getMessage()]
    assert len(said) == 1 and got == reference[:1]
    assert stats["io"]["cache_written_bytes"] == 0 and stats["io"]["cache_uncached_bytes"] == stats["io"]["bytes"] > 0
    assert block_files(tmp_path / "cache") == []


@pytest.mark.slow
def test_a_limit_smaller_than_one_shard_evicts_and_goes_on(store, reference, tmp_path):
    *_, sizes = store
    source, storage, *_ = store
    block = 64 << 10
    cache = ByteCache(cache_folder(tmp_path), min(sizes.values()) // 4, block_bytes=block)  # a quarter of a shard
    got, stats = run_epochs(open_stream(store, storage_options={**storage, "cache": cache}), 2)
    assert got == reference
    assert stats["io"]["cache_evictions"] > 0 and cache.usage() <= cache.limit_bytes


@pytest.mark.slow
def test_a_full_disk_turns_the_cache_off_and_the_job_goes_on(store, reference, tmp_path):
    """A 1 MB file system under a limit of 1 GB: the first block that does not fit turns writing
    off in that worker (one warning each, checked in test_cache.py); what is cached is still read,
    the rest is fetched, and every sample arrives."""
    folder = str(tmp_path / "small")
    with small_disk(folder, "1m"):
        got, stats = run_epochs(open_stream(store, cache=folder, cache_limit="1GB"), 2)
    assert got == reference
    assert stats["io"]["cache_uncached_bytes"] > 0 and stats["io"]["cache_written_bytes"] < 1 << 20


@pytest.mark.parametrize("mode", [0o777, 0o757])
def test_a_cache_folder_others_can_write_is_refused_before_any_worker_starts(store, tmp_path, mode):
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(ConfigError, match="cannot hold the byte cache"):
        open_stream(store, cache=str(folder))


def test_a_cache_folder_of_another_user_is_refused(store, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(ConfigError, match="cannot hold the byte cache"):
        open_stream(store, cache=str(folder))


def test_local_shards_are_never_cached(tmp_path):
    paths = [write_tar(str(tmp_path / f"l-{s}.tar"), shard_members(s)[:5]) for s in range(2)]
    folder = cache_folder(tmp_path)
    stream = dalistream.Stream.open(paths, fields=FIELDS, batch_size=2, workers=1, device="cpu", cache=folder,
                                    cache_dir=None)
    got, stats = run_epochs(stream, 1)
    assert sum(len(b) for b in got[0]) == 10
    assert block_files(folder) == [] and stats["io"]["cache_misses"] == stats["io"]["cache_hits"] == 0
