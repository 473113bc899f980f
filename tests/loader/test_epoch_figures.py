"""What a loader says about each epoch, from shards on a real S3 server (moto, on 127.0.0.1),
with and without the node-local byte cache (issue 63): ``summary()`` is one rank's one epoch,
numbered as ``set_epoch`` numbers it (a cold epoch's cache figure labelled as its own blocks read
back, a warm one's store figure 0), and what the workers read ahead into an epoch the loader never
entered is marked ``read_ahead`` in ``stats()["by_epoch"]``, in no total and no summary."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import dalistream

from helpers import index_on_s3, write_tar

pytestmark = [pytest.mark.s3, pytest.mark.dali]
BUCKET = "epoch-figures"
SHARDS, SAMPLES, SIZE = 6, 30, 60_000  # shards of ~1.8 MB: each one block


@pytest.fixture(scope="module")
def source(moto_endpoint, tmp_path_factory):
    import boto3

    folder = tmp_path_factory.mktemp("shards")
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket=BUCKET)
    for s in range(SHARDS):
        rng = np.random.default_rng(s)
        members = []
        for i in range(SAMPLES):
            members += [(f"s{s}/{i:03d}.bin", rng.bytes(SIZE + int(rng.integers(0, 2000)))),
                        (f"s{s}/{i:03d}.cls", str(i % 5).encode())]
        client.upload_file(write_tar(str(folder / f"e-{s:05d}.tar"), members), BUCKET, f"ds/e-{s:05d}.tar")
    # a manifest beside them: without one, Stream.open's count scan would read every shard (through
    # the cache, when there is one) before any epoch
    index_on_s3(moto_endpoint, f"s3://{BUCKET}/ds/")
    return f"s3://{BUCKET}/ds/", {"endpoint_url": moto_endpoint}


def open_stream(source, rank=0, world_size=1, **options):
    url, storage = source
    return dalistream.Stream.open(url, fields={"key": "__key__", "data": "bin"}, batch_size=4, workers=2, rank=rank,
                                  world_size=world_size, device="cpu", seed=5, storage_options=storage,
                                  cache_dir=None, **options)


def cache_folder(tmp_path, name="cache"):
    path = tmp_path / name
    path.mkdir(mode=0o700, exist_ok=True)
    return str(path)


def megabytes(text, where):
    m = re.search(r"([\d.]+) (B|kB|MB) " + where, text)
    return float(m.group(1)) * {"B": 1e-6, "kB": 1e-3, "MB": 1.0}[m.group(2)]


def check_line(line, io, rank, epoch, samples):
    """``line`` names ``rank`` and ``epoch``, and its figures are that epoch's ``io`` counters."""
    assert line.startswith(f"rank {rank}, epoch {epoch}: {samples} samples in "), line
    assert megabytes(line, "from the store") == pytest.approx(io["bytes"] / 1e6, abs=0.051)
    assert megabytes(line, "from the cache") == pytest.approx(io["cache_bytes"] / 1e6, abs=0.051)
    # an epoch that fetched blocks and read from the cache: its own blocks read back, labelled
    labelled = line.endswith(" from the cache (blocks this epoch fetched included)")
    assert labelled == bool(io["cache_misses"] and io["cache_bytes"]), (line, io)


def one_epoch(stream, epoch):
    with dalistream.Loader(stream) as loader:
        loader.set_epoch(epoch)
        samples = sum(len(batch["key"]) for batch in loader)
        io = loader.stats(wait_s=10)["by_epoch"][epoch]["io"]
        return loader.summary(), io, samples


@pytest.mark.parametrize("interleave", [True, False])
def test_summary_of_a_cold_and_a_warm_epoch(source, tmp_path, interleave):
    """Epoch 0 fetches every block (its reads of a block after the fetch read the block's file:
    cache hits, labelled as its own); a later run's epoch 1 reads every byte from the cache: 0 B
    from the store, unlabelled."""
    # Whether a cold epoch reads a block back after fetching it is timing: a read that arrives while
    # its block is still being fetched is served by that fetch (no hit), which on a loaded machine
    # can be every read. Every try checks its line; some try must show the labelled case.
    for attempt in range(6):
        folder = cache_folder(tmp_path, f"cache{attempt}")
        line, io, samples = one_epoch(open_stream(source, cache=folder, interleave=interleave), 0)
        check_line(line, io, 0, 0, samples)
        assert io["cache_misses"] > 0 and io["bytes"] > 0
        if io["cache_hits"] > 0:  # the case: hits in the cold epoch
            break
    assert io["cache_hits"] > 0, f"no cold epoch of {attempt + 1} read a block back: {line}"
    assert "(blocks this epoch fetched included)" in line
    line, io, samples = one_epoch(open_stream(source, cache=folder, interleave=interleave), 1)
    check_line(line, io, 0, 1, samples)
    assert io["bytes"] == io["cache_misses"] == 0 and io["cache_hits"] > 0
    assert "0 B from the store" in line and line.endswith("from the cache")


@pytest.mark.parametrize("interleave", [True, False])
def test_summary_lines_of_two_ranks_sharing_a_cache(source, tmp_path, interleave):
    """Two ranks of one node, one cache: each line names its rank and says that rank's epoch
    (what it fetched, what it read from blocks there, its own or the other rank's)."""
    folder = cache_folder(tmp_path)
    lines = []
    for rank in range(2):
        line, io, samples = one_epoch(open_stream(source, rank, 2, cache=folder, interleave=interleave), 0)
        check_line(line, io, rank, 0, samples)
        lines.append(line.split(":", 1)[0])
    assert lines == ["rank 0, epoch 0", "rank 1, epoch 0"]


def wait_for_read_ahead(loader, epoch):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = loader.stats()
        io = stats["by_epoch"].get(epoch, {}).get("io", {})
        if io.get("bytes") or io.get("cache_bytes"):  # from the store, or from blocks already cached
            return stats
        time.sleep(0.05)
    pytest.fail(f"no read-ahead into epoch {epoch}: the case is not met")


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("first", [0, 3])
def test_what_the_workers_read_ahead_into_an_epoch_never_entered_is_marked(source, tmp_path, cached, interleave,
                                                                           first):
    """The workers' prefetch runs past the epoch's end into the next: its bytes are counted there,
    marked ``read_ahead`` while the loader has not entered it, kept out of the totals and the
    summary, and unmarked once the loop takes a batch of it."""
    stream = open_stream(source, interleave=interleave, **({"cache": cache_folder(tmp_path)} if cached else {}))
    with dalistream.Loader(stream) as loader:
        loader.set_epoch(first)
        for _ in loader:
            pass
        stats = wait_for_read_ahead(loader, first + 1)
        done, ahead = stats["by_epoch"][first], stats["by_epoch"][first + 1]
        assert ahead["read_ahead"] is True and done["read_ahead"] is False
        assert stats["io"] == done["io"] and stats["samples"] == done["samples"]  # the totals: entered epochs only
        line = loader.summary()
        assert line.startswith(f"rank 0, epoch {first}: ")
        assert megabytes(line, "from the store") == pytest.approx(done["io"]["bytes"] / 1e6, abs=0.051)
        assert loader.summary(first + 1).startswith(f"rank 0, epoch {first + 1} (read ahead, not entered): 0 samples")
        batches = iter(loader)  # the next epoch, entered: its read-ahead is its own
        next(batches)
        stats = loader.stats()
        assert stats["by_epoch"][first + 1]["read_ahead"] is False
        assert stats["io"]["bytes"] >= done["io"]["bytes"] + ahead["io"]["bytes"]
        del batches
