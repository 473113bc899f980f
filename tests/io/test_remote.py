"""S3 and HTTP(S) sources against real servers: moto in server mode and ``http.server``.

Shards written by ``dalistream.tools.synth``, by ``webdataset.TarWriter`` and a real peer shard
(``sample.tgz``) are uploaded to a moto S3 server on 127.0.0.1 and served over HTTP; keys read
through ``s3://``/``http://`` must equal, in order, those read from the same files on disk.
Faults come from the shaping proxy (``dalistream.tools.proxy``) between client and server, which
cuts connections after N bytes or answers 503 SlowDown a few times.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections import Counter

import numpy as np
import pytest

import dalistream
from dalistream import cli
from dalistream.errors import ConfigError, SourceError
from dalistream.manifest import read_manifest, scan_shard
from dalistream.io.options import RemoteOptions, remote_options
from dalistream.io.remote import open_remote
from dalistream.sources import expand_sources
from dalistream.io import IOCounters, ShardSequence
from dalistream.tools.proxy import ShapingProxy
from dalistream.tools.synth import SynthSpec, write_dataset
from dalistream.tar import iter_samples
from helpers import PEER_DATA, REPO, data_set, free_port, sequence_keys, served_folder


PEER_SHARD = os.path.join(PEER_DATA, "sample.tgz")
BUCKET = "shards"
FAKE_KEY_ID = "TESTONLY-not-a-key-id-42"
FAKE_SECRET = "fakeSecretDoNotPrint42"
KEYS = {"key": "__key__"}

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]


def _write_wds_shards(directory: str, shards: int = 2, samples: int = 15) -> None:
    import webdataset as wds

    rng = np.random.default_rng(7)
    for s in range(shards):
        with wds.TarWriter(os.path.join(directory, f"wds-{s:05d}.tar")) as sink:
            for i in range(samples):
                sink.write({"__key__": f"wds{s}/{i:04d}", "bin": rng.bytes(int(rng.integers(100, 20000))),
                            "cls": str(i % 5).encode()})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, moto_endpoint):
    """Local shards in ``local``; the same files under ``s3://shards/ds/``; ``opts`` for moto."""
    import boto3

    local = str(tmp_path_factory.mktemp("shards"))
    write_dataset(local, SynthSpec(shards=6, samples_per_shard=14, uneven=True, seed=3))
    _write_wds_shards(local)
    shutil.copy(PEER_SHARD, os.path.join(local, "sample.tgz"))
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket=BUCKET)
    names = sorted(os.listdir(local))
    for name in names:
        client.upload_file(os.path.join(local, name), BUCKET, f"ds/{name}")
    client.put_object(Bucket=BUCKET, Key="ds/README.txt", Body=b"not a shard")
    return {"local": local, "names": names, "opts": {"endpoint_url": moto_endpoint}, "client": client,
            "cache": str(tmp_path_factory.mktemp("cache"))}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    seen_auth: list = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        _QuietHandler.seen_auth.append(self.headers.get("Authorization"))
        super().do_GET()


@pytest.fixture(scope="module")
def http_base(dataset):
    """``http.server`` serving the local shard directory from a thread."""
    with served_folder(dataset["local"], _QuietHandler) as base:
        yield base


# -- helpers -----------------------------------------------------------------------------------------

def local_keys(paths) -> list:
    keys = []
    for path in paths:
        with dalistream.io.open_shard(path) as f:
            keys += [s["__key__"] for s in iter_samples(f, path, keep=lambda i: False)]
    return keys


def reference_batches(stream, epoch: int) -> list:
    """Keys per batch computed without DALI from the workers' own iterables (local shards)."""
    from dalistream.worker import WorkerSource

    c = stream.config
    data = data_set(stream.urls, stream.counts)
    per_worker = [list(WorkerSource(c, data, w).epoch_batches(epoch)) for w in range(c.workers)]
    batches = []
    for step in range(stream.steps(epoch)):
        keys = []
        for outputs in (per_worker[w][step] for w in range(c.workers)):
            keys += [np.asarray(k).tobytes().decode() for k, v in zip(outputs[0], outputs[-1]) if int(v)]
        batches.append(keys)
    return batches


def loader_batches(stream, epochs: int = 1):
    with dalistream.Loader(stream) as loader:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([list(b["key"]) for b in loader])
        return out, loader.stats()


def open_stream(source, dataset, **kw):
    kw.setdefault("cache_dir", dataset["cache"])
    kw.setdefault("device", "cpu")
    return dalistream.Stream.open(source, fields=KEYS, **kw)


def io_totals(stats) -> Counter:
    total: Counter = Counter()
    for w in stats["workers"]:
        total.update(w.get("io", {}))
    return total


# -- end to end through DALI ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.dali
def test_s3_prefix_equals_local_through_dali(dataset):
    kw = dict(batch_size=8, workers=2, rank=0, world_size=1, seed=1)
    local = open_stream(dataset["local"], dataset, **kw)
    remote = open_stream(f"s3://{BUCKET}/ds/", dataset, storage_options=dataset["opts"], **kw)
    assert [u.rsplit("/", 1)[1] for u in remote.urls] == dataset["names"]
    assert remote.counts == local.counts and remote.steps(0) == local.steps(0) > 0
    (got,), stats = loader_batches(remote)
    (want,), _ = loader_batches(local)
    assert got == want == reference_batches(local, 0)
    assert io_totals(stats)["requests"] >= len(remote.urls)


@pytest.mark.slow
@pytest.mark.dali
def test_s3_two_ranks_two_workers_exact_two_epochs(dataset):
    kw = dict(batch_size=6, workers=2, world_size=2, seed=4, shuffle=8, policy="exact")
    every_key = Counter(local_keys(sorted(os.path.join(dataset["local"], n) for n in dataset["names"])))
    seen = [Counter(), Counter()]
    for rank in (0, 1):
        local = open_stream(dataset["local"], dataset, rank=rank, **kw)
        remote = open_stream(f"s3://{BUCKET}/ds/", dataset, rank=rank, storage_options=dataset["opts"], **kw)
        got, _ = loader_batches(remote, epochs=2)
        for epoch in (0, 1):
            assert got[epoch] == reference_batches(local, epoch)
            seen[epoch].update(k for batch in got[epoch] for k in batch)
    assert seen[0] == seen[1] == every_key  # every sample exactly once per epoch over both ranks


@pytest.mark.slow
@pytest.mark.dali
def test_s3_three_ranks_last_rank(dataset):
    kw = dict(batch_size=4, workers=1, rank=2, world_size=3, seed=9)
    local = open_stream(dataset["local"], dataset, **kw)
    remote = open_stream([f"s3://{BUCKET}/ds/{n}" for n in dataset["names"]], dataset,
                         storage_options=dataset["opts"], **kw)
    (got,), _ = loader_batches(remote)
    assert got == reference_batches(local, 0) and got


@pytest.mark.slow
@pytest.mark.dali
def test_s3_cut_connections_through_dali_deliver_exactly_once(dataset):
    kw = dict(batch_size=8, workers=2, rank=0, world_size=1, seed=2)
    local = open_stream(dataset["local"], dataset, **kw)
    remote = open_stream(f"s3://{BUCKET}/ds/", dataset, storage_options=dataset["opts"], **kw)
    with ShapingProxy(dataset["opts"]["endpoint_url"], cut_after=30_000, faults=4) as proxy:  # inside a part
        # (4 columns a worker: parts of 64 KiB, each cut once past 30,000 bytes)
        opts = {"endpoint_url": proxy.endpoint, "chunk_bytes": 16 << 10, "read_ahead_bytes": 512 << 10,
                "backoff_s": 0.01}
        through_proxy = dataclasses.replace(remote, config=remote.config.replace(storage_options=opts))
        (got,), stats = loader_batches(through_proxy)
    assert got == reference_batches(local, 0)
    assert proxy.injected == 4
    totals = io_totals(stats)
    assert totals["resumes"] >= 1 and totals["resumed_bytes"] > 0


@pytest.mark.slow
@pytest.mark.dali
def test_s3_behind_a_far_link_with_default_parts_equals_local(dataset):
    kw = dict(batch_size=8, workers=1, rank=0, world_size=1, seed=3, shuffle=5)
    local = open_stream(dataset["local"], dataset, **kw)
    remote = open_stream(f"s3://{BUCKET}/ds/", dataset, storage_options=dataset["opts"], **kw)
    with ShapingProxy(dataset["opts"]["endpoint_url"], latency_s=0.04, rate=3e6) as proxy:  # 40 ms, 3 MB/s
        options = {"endpoint_url": proxy.endpoint}  # default parts_in_flight, part_bytes, read_ahead_bytes
        through_proxy = dataclasses.replace(remote, config=remote.config.replace(storage_options=options))
        (got,), stats = loader_batches(through_proxy)
    assert got == reference_batches(local, 0)
    totals = io_totals(stats)
    assert totals["parts"] >= len(remote.urls) and totals["retries"] == 0
    assert 0 < totals["peak_buffered_bytes"] <= RemoteOptions().read_ahead_bytes


@pytest.mark.dali
@pytest.mark.slow
def test_cli_keys_s3_equals_local(dataset, tmp_path):
    env = dict(os.environ, AWS_ENDPOINT_URL=dataset["opts"]["endpoint_url"], DALISTREAM_CACHE=str(tmp_path))

    def keys(source):
        args = [sys.executable, "-m", "dalistream", "keys", source, "-W", "1", "-B", "8", "--seed", "5",
                "--shuffle", "4", "--rank", "0", "--world-size", "1", "--json"]
        done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        return [line for line in lines if "keys" in line]  # (the closing stats line differs: I/O counters)

    remote = keys(f"s3://{BUCKET}/ds/")
    assert remote == keys(dataset["local"]) and len(remote) > 3


# -- streams, read-ahead and faults without DALI -----------------------------------------------------------

@pytest.mark.slow
def test_sequence_reads_s3_http_and_local_in_order(dataset, http_base):
    paths = [os.path.join(dataset["local"], n) for n in dataset["names"]]
    want = local_keys(paths)
    counters = IOCounters()
    s3 = [f"s3://{BUCKET}/ds/{n}" for n in dataset["names"]]
    assert sequence_keys(s3, dataset["opts"]) == want
    small = {**dataset["opts"], "read_ahead_bytes": 1, "chunk_bytes": 4096}  # one chunk at a time
    assert sequence_keys(s3, small) == want
    http = [f"{http_base}/{n}" for n in dataset["names"]]
    assert sequence_keys(http, {}) == want
    mixed = [s3[0], paths[1], http[2]] + s3[3:]
    assert sequence_keys(mixed, dataset["opts"]) == want
    seq = ShardSequence(s3, dataset["opts"], counters=counters)
    with seq.open(2) as f:  # out of order, closed early, then reopened: fetcher restarts
        f.read(1000)
    with seq.open(2) as f:
        assert [s["__key__"] for s in iter_samples(f, s3[2])] == local_keys([paths[2]])
    seq.close()
    assert counters.requests >= 2 and counters.retries == 0


def test_open_remote_at_offset_and_scan_bytes(dataset, http_base):
    name = dataset["names"][1]
    data = open(os.path.join(dataset["local"], name), "rb").read()
    for url, opts in ((f"s3://{BUCKET}/ds/{name}", dataset["opts"]), (f"{http_base}/{name}", {})):
        with open_remote(url, 0, opts) as f:
            assert f.read() == data
        with open_remote(url, 12345, opts) as f:
            assert f.read() == data[12345:]
        with open_remote(url, len(data), opts) as f:
            assert f.read() == b""
        info = scan_shard(url, opts)
        assert (info.samples, info.bytes) == (len(local_keys([os.path.join(dataset["local"], name)])), len(data))


def test_cut_connection_resumes_at_exact_offset(dataset):
    name = dataset["names"][2]
    data = open(os.path.join(dataset["local"], name), "rb").read()
    with ShapingProxy(dataset["opts"]["endpoint_url"], cut_after=50_000, faults=3) as proxy:
        counters = IOCounters()
        opts = {"endpoint_url": proxy.endpoint, "backoff_s": 0.01}
        with open_remote(f"s3://{BUCKET}/ds/{name}", 0, opts, counters) as f:
            got = f.read()
    assert got == data
    assert proxy.injected == 3 and counters.resumes == 3
    assert 0 < counters.resumed_bytes < len(data) and counters.bytes == len(data)


@pytest.mark.slow
def test_cut_connections_with_read_ahead_lose_and_duplicate_nothing(dataset, http_base):
    names = dataset["names"]
    want = local_keys([os.path.join(dataset["local"], n) for n in names])
    with ShapingProxy(dataset["opts"]["endpoint_url"], cut_after=40_000, faults=6) as proxy:
        counters = IOCounters()
        opts = {"endpoint_url": proxy.endpoint, "chunk_bytes": 8192, "read_ahead_bytes": 100_000, "backoff_s": 0.01}
        seq = ShardSequence([f"s3://{BUCKET}/ds/{n}" for n in names], opts, counters)
        keys = []
        for i, n in enumerate(names):
            with seq.open(i) as f:
                keys += [s["__key__"] for s in iter_samples(f, n)]
        seq.close()
    assert keys == want and proxy.injected == 6 and counters.resumes + counters.retries >= 6
    # http.server ignores Range: a resumed GET reads up to the offset and goes on from there
    with ShapingProxy(http_base, cut_after=30_000, faults=3) as proxy:
        counters = IOCounters()
        urls = [f"{proxy.endpoint}/{n}" for n in names]
        keys = []
        seq = ShardSequence(urls, {"backoff_s": 0.01}, counters)
        for i, url in enumerate(urls):
            with seq.open(i) as f:
                keys += [s["__key__"] for s in iter_samples(f, url)]
        seq.close()
    assert keys == want and proxy.injected == 3 and counters.resumes == 3


def test_throttling_is_retried_with_backoff(dataset):
    name = dataset["names"][0]
    data = open(os.path.join(dataset["local"], name), "rb").read()
    with ShapingProxy(dataset["opts"]["endpoint_url"], status=503, faults=3) as proxy:
        counters = IOCounters()
        opts = {"endpoint_url": proxy.endpoint, "backoff_s": 0.01, "max_attempts": 5}
        with open_remote(f"s3://{BUCKET}/ds/{name}", 0, opts, counters) as f:
            assert f.read() == data
    assert proxy.injected == 3 and counters.retries == 3 and counters.requests == 4


def test_throttling_gives_up_after_max_attempts(dataset):
    url = f"s3://{BUCKET}/ds/{dataset['names'][0]}"
    with ShapingProxy(dataset["opts"]["endpoint_url"], status=503, faults=100) as proxy:
        counters = IOCounters()
        with pytest.raises(SourceError) as info:
            open_remote(url, 0, {"endpoint_url": proxy.endpoint, "backoff_s": 0.01, "max_attempts": 3}, counters)
    assert "giving up after 3 attempts" in str(info.value) and url in str(info.value)
    assert "SlowDown" in str(info.value) and counters.retries == 2 and proxy.injected == 3


@pytest.mark.slow
def test_clear_immediate_errors(dataset, http_base):
    opts = dataset["opts"]
    cases = [
        (f"s3://{BUCKET}/ds/missing.tar", opts, "does not exist"),
        ("s3://no-such-bucket-here/x.tar", opts, "bucket does not exist"),
        (f"s3://{BUCKET}/ds/x.tar", {"endpoint_url": f"http://127.0.0.1:{free_port()}"}, "connection refused"),
        (f"s3://{BUCKET}/ds/x.tar", {"endpoint_url": "http://no-such-host.invalid:9000"}, "name resolution failed"),
        (f"{http_base}/missing.tar", {}, "does not exist (404"),
        (f"http://127.0.0.1:{free_port()}/x.tar", {}, "connection refused"),
    ]
    for url, options, text in cases:
        counters = IOCounters()
        with pytest.raises(SourceError) as info:
            open_remote(url, 0, {**options, "max_attempts": 4}, counters)
        assert text in str(info.value) and url in str(info.value)
        assert counters.retries == 0 and counters.requests == 1, url


def test_credentials_never_in_errors_or_reprs(dataset, http_base):
    secret_opts = {**dataset["opts"], "aws_access_key_id": FAKE_KEY_ID, "aws_secret_access_key": FAKE_SECRET}
    endpoint = dataset["opts"]["endpoint_url"]

    def set_auth(count: str) -> None:
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()

    set_auth("0")  # moto now checks signatures: the fake keys get a real 403
    try:
        with pytest.raises(SourceError) as info:
            open_remote(f"s3://{BUCKET}/ds/{dataset['names'][0]}", 0, secret_opts)
    finally:
        set_auth("inf")
    text = str(info.value) + repr(info.value) + repr(info.value.__reduce__())
    assert "access denied (403" in text
    assert FAKE_KEY_ID not in text and FAKE_SECRET not in text

    _QuietHandler.seen_auth.clear()
    url = f"http://someone:{FAKE_SECRET}@{http_base[len('http://'):]}/missing.tar"
    with pytest.raises(SourceError) as info:
        open_remote(url, 0, {})
    assert FAKE_SECRET not in str(info.value) + repr(info.value) and "***@" in str(info.value)
    assert _QuietHandler.seen_auth[-1].startswith("Basic ")  # user info became a header
    with pytest.raises(SourceError) as info:
        open_remote(f"http://someone:{FAKE_SECRET}@127.0.0.1:{free_port()}/x.tar", 0, {})
    assert FAKE_SECRET not in str(info.value)

    config = dalistream.StreamConfig(sources=("s3://b/x.tar",), fields=KEYS, batch_size=2,
                                     storage_options=secret_opts)
    options = remote_options(secret_opts)
    for text in (repr(config), repr(options)):
        assert FAKE_SECRET not in text and FAKE_KEY_ID not in text


@pytest.mark.slow
def test_profile_and_anonymous_options(dataset, tmp_path, monkeypatch):
    url = f"s3://{BUCKET}/ds/{dataset['names'][0]}"
    data = open(os.path.join(dataset["local"], dataset["names"][0]), "rb").read()
    config = tmp_path / "aws-config"
    config.write_text(f"[profile otherstore]\nendpoint_url = {dataset['opts']['endpoint_url']}\nregion = us-east-1\n"
                      "aws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    with open_remote(url, 0, {"profile": "otherstore"}) as f:  # endpoint and keys from the profile
        assert f.read() == data
    anon = {**dataset["opts"], "anon": True}  # unsigned requests: public objects only
    dataset["client"].put_object(Bucket=BUCKET, Key="public/x.tar", Body=data, ACL="public-read")
    with open_remote(f"s3://{BUCKET}/public/x.tar", 0, anon) as f:
        assert f.read() == data
    with pytest.raises(SourceError, match="access denied"):
        open_remote(url, 0, anon)
    with pytest.raises(ConfigError, match="not configured"):
        open_remote(url, 0, {"profile": "no-such-profile"})


def test_unknown_storage_option_is_a_config_error():
    with pytest.raises(ConfigError, match="endpoint"):
        remote_options({"endpoint": "http://x"})
    assert isinstance(remote_options(None), RemoteOptions)


# -- listing and manifests ---------------------------------------------------------------------------

def test_list_prefix_paginates_filters_and_sorts(dataset):
    from moto.s3.models import s3_backends

    names = [f"many/part-{i:05d}.tar" for i in range(1003)] + ["many/x.tar.gz", "many/y.tgz", "many/z.json"]
    # > 1000 keys (one page): stored straight into the in-process server's backend, since 1000
    # PUTs take long on a busy machine; the listing itself goes through the server
    backend = s3_backends["123456789012"]["global"]
    for key in names[::-1]:
        backend.put_object(BUCKET, key, b"x")
    dataset["client"].put_object(Bucket=BUCKET, Key="many/part-00500.tar", Body=b"y")  # and one real PUT
    urls = expand_sources(f"s3://{BUCKET}/many/", dataset["opts"])
    assert urls == sorted(f"s3://{BUCKET}/{k}" for k in names if not k.endswith(".json"))
    with pytest.raises(SourceError, match="holds no"):
        expand_sources(f"s3://{BUCKET}/nothing-here/", dataset["opts"])


def test_brace_patterns_in_s3_keys(dataset):
    urls = expand_sources(f"s3://{BUCKET}/ds/synth-{{00001..00003}}.tar", dataset["opts"])
    assert urls == [f"s3://{BUCKET}/ds/synth-0000{i}.tar" for i in (1, 2, 3)]
    local = open_stream(os.path.join(dataset["local"], "synth-{00001..00003}.tar"), dataset, batch_size=2, workers=1,
                        rank=0, world_size=1)
    remote = open_stream(urls, dataset, batch_size=2, workers=1, rank=0, world_size=1, storage_options=dataset["opts"])
    assert remote.counts == local.counts


def test_index_writes_manifest_next_to_shards(dataset, capsys):
    target = f"s3://{BUCKET}/ds/manifest.json"
    code = cli.main(["index", f"s3://{BUCKET}/ds/", "--endpoint-url", dataset["opts"]["endpoint_url"],
                     "-o", target, "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    table = {info.url: info for info in read_manifest(target, dataset["opts"]).infos()}
    assert [info["url"] for info in printed["shards"]] == list(table)
    for name in dataset["names"]:
        path = os.path.join(dataset["local"], name)
        info = table[f"s3://{BUCKET}/ds/{name}"]
        assert (info.samples, info.bytes) == (len(local_keys([path])), os.path.getsize(path))
    kw = dict(batch_size=4, workers=2, rank=0, world_size=1)
    local = open_stream(dataset["local"], dataset, **kw)
    remote = open_stream(f"s3://{BUCKET}/ds/", dataset, manifest=target, storage_options=dataset["opts"],
                         cache_dir=None, **kw)
    assert remote.counts == local.counts and remote.steps(0) == local.steps(0)
    with pytest.raises(SourceError, match="manifest file does not exist"):
        read_manifest(f"s3://{BUCKET}/ds/none.json", dataset["opts"])


@pytest.mark.slow
@pytest.mark.dali
def test_http_sources_through_stream_open(dataset, http_base):
    kw = dict(batch_size=4, workers=2, rank=0, world_size=1)
    local = open_stream(dataset["local"], dataset, **kw)
    remote = open_stream([f"{http_base}/{n}" for n in dataset["names"]], dataset, **kw)
    assert remote.counts == local.counts
    cached = open_stream([f"{http_base}/{n}" for n in dataset["names"]], dataset, **kw)  # from the scan cache
    assert cached.counts == local.counts
