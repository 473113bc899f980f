"""The byte cache's limit and checks under real jobs: shards of about 6 MB on a real S3 server
(moto, on 127.0.0.1), read by loaders of two workers (DALI on the CPU), the cache folder measured
all along (tests/cache_helpers.py's FolderWatch): a job, jobs one after another with other limits,
jobs at once on one folder never make the folder pass the limit; a block changed on the disk
between jobs is fetched again, counted, and the next job delivers the store's bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dalistream
from dalistream.io.cache import BLOCK_BYTES, ByteCache
from dalistream.io.cachefiles import parse_size

from cache_helpers import BOOKKEEPING, FolderWatch, block_files, cache_folder, damage, digests, run_children
from helpers import index_on_s3, write_tar

pytestmark = [pytest.mark.s3, pytest.mark.dali, pytest.mark.slow, pytest.mark.timeout(900)]
BUCKET = "cache-limits"
FIELDS = {"key": "__key__", "data": "bin"}
SHARDS, SAMPLES, SIZE = 3, 50, 120_000  # 3 shards of about 6.1 MB (the issue's): two 4 MiB blocks each


def shard_members(shard: int):
    rng = np.random.default_rng(shard)
    return [(f"s{shard}/{i:03d}.bin", rng.bytes(int(n))) for i, n in enumerate(rng.integers(SIZE, SIZE + 4000, SAMPLES))]


@pytest.fixture(scope="module")
def store(moto_endpoint, tmp_path_factory):
    """The shards on S3 with a manifest beside them: ``(source, storage options)``."""
    import boto3

    folder = tmp_path_factory.mktemp("shards")
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket=BUCKET)
    for s in range(SHARDS):
        client.upload_file(write_tar(str(folder / f"l-{s:05d}.tar"), shard_members(s)), BUCKET, f"ds/l-{s:05d}.tar")
    index_on_s3(moto_endpoint, f"s3://{BUCKET}/ds/")
    return f"s3://{BUCKET}/ds/", {"endpoint_url": moto_endpoint}


def open_stream(store, folder=None, limit=None, block=BLOCK_BYTES):
    """Two workers; through a cache in ``folder`` (as ``Stream.open(cache=, cache_limit=)`` builds
    it, or of another block size given in the storage options)."""
    source, storage = store
    cache = {}
    if folder is not None and block == BLOCK_BYTES:
        cache = dict(cache=folder, cache_limit=limit)
    elif folder is not None:
        storage = {**storage, "cache": ByteCache(folder, limit, block_bytes=block)}
    return dalistream.Stream.open(source, fields=FIELDS, batch_size=4, workers=2, device="cpu", seed=5,
                                  policy="exact", cache_dir=None, storage_options=storage, **cache)


def run_epochs(stream, epochs):
    with dalistream.Loader(stream) as loader:
        return [[digests(b) for b in loader] for _ in range(epochs)], loader.stats(wait_s=10)


@pytest.fixture(scope="module")
def reference(store):
    """Two epochs read without a cache."""
    return run_epochs(open_stream(store), 2)[0]


def within(watch, limit):
    assert watch.samples > 10, "the folder was hardly measured"
    assert watch.blocks <= limit and watch.files <= limit + BOOKKEEPING, (watch.blocks, watch.files, limit)


@pytest.mark.parametrize("limit,block", [("1MiB", 512 << 10), ("5MiB", BLOCK_BYTES), ("16MiB", 8 << 20)])
def test_a_job_never_makes_the_folder_pass_the_limit(store, reference, tmp_path, limit, block):
    folder = cache_folder(tmp_path)
    with FolderWatch(folder) as watch:
        got, stats = run_epochs(open_stream(store, folder, limit, block), 2)
    assert got == reference
    within(watch, parse_size(limit))
    io = stats["io"]
    assert io["cache_evictions"] + io["cache_no_room"] > 0  # (the limit bit)
    assert io["cache_written_bytes"] + io["cache_uncached_bytes"] == io["bytes"]


@pytest.mark.parametrize("limits", [("5MiB", "5MiB", "5MiB"), ("16MiB", "5MiB", "1MiB")])
def test_jobs_one_after_another_on_one_folder_keep_each_ones_limit(store, reference, tmp_path, limits):
    """Each job's limit holds from when its stream is opened (a folder a job with a larger limit
    left is brought under it then) to its end."""
    folder = cache_folder(tmp_path)
    for limit in limits:
        stream = open_stream(store, folder, limit)
        with FolderWatch(folder) as watch:
            got, _ = run_epochs(stream, 1)
        assert got == reference[:1]
        within(watch, parse_size(limit))


@pytest.mark.parametrize("limit", ["5MiB", "16MiB"])
def test_jobs_at_once_on_one_folder_share_its_limit(store, reference, tmp_path, limit):
    folder = cache_folder(tmp_path)
    source, storage = store
    specs = []
    for job in range(2):
        spec = dict(source=source, options=storage, cache=folder, cache_limit=limit, rank=0, world_size=1, epochs=2,
                    out=str(tmp_path / f"job-{job}.json"))
        (tmp_path / f"job-{job}.spec.json").write_text(json.dumps(spec))
        specs.append((str(tmp_path / f"job-{job}.spec.json"), spec["out"]))
    with FolderWatch(folder) as watch:
        run_children([path for path, _ in specs])
    for _, out in specs:
        with open(out) as f:
            assert [[[tuple(s) for s in b] for b in e] for e in json.load(f)["epochs"]] == reference
    within(watch, parse_size(limit))


@pytest.mark.parametrize("how", ["zero", "flip", "truncate"])
def test_a_block_changed_between_jobs_is_fetched_again_and_counted(store, reference, tmp_path, how):
    """4 KiB zeroed, one bit flipped, or the file cut short, in a block a job cached: the next job
    delivers every sample as the store has it, and counts the block."""
    folder = cache_folder(tmp_path)
    got, _ = run_epochs(open_stream(store, folder, "1GB"), 1)
    assert got == reference[:1]
    blocks = block_files(folder)
    assert len(blocks) == 2 * SHARDS
    damage(blocks[0], how, 1 << 20)
    got, stats = run_epochs(open_stream(store, folder, "1GB"), 1)
    assert got == reference[:1]
    io = stats["io"]
    assert io["cache_damaged"] == 1 and BLOCK_BYTES // 2 <= io["bytes"] <= BLOCK_BYTES
