"""How the byte cache is named, carried and counted: the key of an object (no signatures, no user
info), the cache travelling in the storage options (pickled as its settings, no part of a store's
identity), the worker's I/O counters split per epoch and summed by loader.stats()."""

from __future__ import annotations

import pickle

import pytest

from dalistream.errors import ConfigError
from dalistream.io.cache import ByteCache
from dalistream.io.counters import IOCounters
from dalistream.io.options import remote_options, with_cache
from dalistream.io.remote import cache_key
from dalistream.io.stores import store_for
from dalistream.loader.progress import worker_sums
from dalistream.worker.stats import IO_SUMS, WorkerStats, summarize


@pytest.mark.parametrize("url,key", [
    ("s3://bucket/a/b.tar", "s3://bucket/a/b.tar"),
    ("https://host/b.tar?X-Amz-Signature=abc&X-Amz-Expires=60&X-Amz-Credential=k", "https://host/b.tar"),
    ("https://acct.blob.core.windows.net/c/b.tar?sv=2020&se=2030&sr=b&sp=r&sig=zzz", "https://acct.blob.core.windows.net/c/b.tar"),
    ("https://storage.googleapis.com/b/o.tar?X-Goog-Signature=1&X-Goog-Date=2", "https://storage.googleapis.com/b/o.tar"),
    ("https://host/get?id=7&Signature=s&Expires=9&AWSAccessKeyId=a", "https://host/get?id=7"),
    ("https://user:secret@host/b.tar", "https://host/b.tar"),
    ("hf://datasets/org/set@main/b.tar", "hf://datasets/org/set/b.tar"),
    ("s3://bucket/odd?name.tar", "s3://bucket/odd?name.tar"),  # an object store's name is kept whole
])
def test_an_objects_key_leaves_out_what_signs_it(url, key):
    assert cache_key(url) == key


def test_a_url_signed_anew_names_the_same_blocks():
    a = cache_key("https://h/x.tar?part=2&X-Amz-Signature=one&X-Amz-Date=1")
    b = cache_key("https://h/x.tar?X-Amz-Date=2&part=2&X-Amz-Signature=two")
    assert a == b == "https://h/x.tar?part=2"


def test_the_cache_travels_in_the_storage_options(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir(mode=0o700)
    options = with_cache({"endpoint_url": "http://127.0.0.1:1"}, str(folder), "1GB")
    cache = options["cache"]
    assert isinstance(cache, ByteCache) and cache.limit_bytes == 10**9
    assert with_cache(options, str(folder), None)["cache"] is cache  # built once
    assert with_cache({"anon": True}, None, None) == {"anon": True}
    opts = remote_options(options)
    assert opts.cache is cache and "ByteCache(" in repr(opts)
    # not part of a store's identity: the same store with or without it, and after pickling
    plain = remote_options({"endpoint_url": "http://127.0.0.1:1"})
    assert opts == plain and hash(opts) == hash(plain)
    assert store_for("s3://b/k", options) is store_for("s3://b/k", {"endpoint_url": "http://127.0.0.1:1"})
    copy = pickle.loads(pickle.dumps(options))["cache"]
    assert (copy.folder, copy.limit_bytes, copy.block_bytes) == (cache.folder, cache.limit_bytes, cache.block_bytes)


def test_a_cache_given_in_the_storage_options_must_be_a_byte_cache():
    with pytest.raises(ConfigError, match="cache must be a ByteCache"):
        remote_options({"cache": "/tmp/somewhere"})


def test_a_bad_cache_folder_fails_when_the_options_are_made(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match="cannot hold the byte cache"):
        with_cache({}, str(folder), None)


def test_io_counters_are_split_per_epoch_and_summed():
    """What a worker reads is counted in the epoch it was reading when it read it (a worker reads
    ahead into the next epoch: that is counted there); summarize sums the epochs up to the loader's
    and gives every epoch's alone; peaks are not summed."""
    a, b = WorkerStats(None, 0, 0), WorkerStats(None, 0, 1)
    a.io.add(bytes=100, cache_misses=2, requests=3)
    a.io.peak(peak_in_flight=4)
    a.epoch = 1
    a.io.add(cache_hits=5, cache_bytes=500, requests=1)
    b.epoch = 1
    b.io.add(cache_hits=1, cache_bytes=70)
    b.epoch = 2
    b.io.add(bytes=9, cache_misses=1)
    workers = [a.as_dict(), b.as_dict()]
    assert workers[0]["io_by_epoch"]["0"]["bytes"] == 100 and workers[0]["io_by_epoch"]["1"]["cache_hits"] == 5
    assert "peak_in_flight" not in workers[0]["io_by_epoch"]["0"] and set(workers[0]["io_by_epoch"]["0"]) == set(IO_SUMS)
    out = summarize(workers, through=1)
    assert out["by_epoch"][0]["io"]["bytes"] == 100 and out["by_epoch"][1]["io"]["cache_hits"] == 6
    assert out["by_epoch"][2]["io"]["cache_misses"] == 1 and out["by_epoch"][1]["io"]["bytes"] == 0
    assert out["io"]["cache_hits"] == 6 and out["io"]["bytes"] == 100 and out["io"]["requests"] == 4  # epoch 2 apart
    sums = worker_sums(workers)
    assert (sums["cache_hits"], sums["cache_bytes"], sums["remote_bytes"]) == (6, 570, 109)


def test_without_a_cache_the_summary_says_nothing_of_one():
    stats = WorkerStats(None, 0, 0)
    stats.io.add(bytes=10, requests=1)
    assert "cache_hits" not in worker_sums([stats.as_dict()])
    assert IOCounters().since({}) == dict.fromkeys(IO_SUMS, 0)
