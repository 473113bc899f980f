"""Interleaved reading needs every sample's offset for remote shards: without them each column
would fetch its shard from byte 0 up to its part, so a stream whose remote counts came without
offsets reads one span per worker through the buffer, and says so."""

import os

import pytest

from dalistream import Stream

from helpers import key_shards

pytestmark = [pytest.mark.s3]
B = 10


@pytest.fixture
def data(tmp_path):
    key_shards(str(tmp_path / "shards" / "big"), [40, 37, 25], prefix="b")
    return str(tmp_path / "shards")


def test_remote_shards_without_offsets_are_not_read_interleaved(data, moto_endpoint, tmp_path, caplog):
    """Counts without offsets (a manifest someone else wrote): every column would fetch its shard
    from byte 0 to its part, so the stream reads one span per worker through the buffer and says
    why; with offsets it reads interleaved."""
    import json
    import logging

    import boto3

    from dalistream.manifest import build_manifest, write_manifest

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="plain")
    folder = os.path.join(data, "big")
    names = sorted(os.listdir(folder))
    for name in names:
        s3.upload_file(os.path.join(folder, name), "plain", f"big/{name}")
    urls = [f"s3://plain/big/{n}" for n in names]
    options = {"endpoint_url": moto_endpoint}
    counts_only = str(tmp_path / "counts.json")
    infos = build_manifest([os.path.join(folder, n) for n in names], offsets=False)
    write_manifest([type(i)(u, i.samples, i.bytes, None, None) for i, u in zip(infos, urls)], counts_only)
    assert all("offsets" not in row for row in json.load(open(counts_only))["shards"])
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        stream = Stream.open(urls, fields={"key": "__key__"}, batch_size=B, device="cpu", manifest=counts_only,
                             storage_options=options, cache_dir=str(tmp_path / "c"))
    assert (stream.config.interleave, stream.config.shuffle) == (False, 1000)
    assert "needs every sample's offset" in caplog.text
    with_offsets = str(tmp_path / "offsets.json")
    infos = build_manifest([os.path.join(folder, n) for n in names], offsets=True)
    write_manifest([type(i)(u, i.samples, i.bytes, i.offsets, i.members) for i, u in zip(infos, urls)], with_offsets)
    stream = Stream.open(urls, fields={"key": "__key__"}, batch_size=B, device="cpu", manifest=with_offsets,
                         storage_options=options, cache_dir=str(tmp_path / "c"))
    assert stream.config.interleave and stream.data.offsets is not None


# -- a worker's columns read from a far store, together ---------------------------------------------

COLUMNS = 8  # batch positions of the one worker: its interleaved columns


@pytest.fixture
def far(tmp_path, moto_endpoint):
    """Four shards of 40 samples (4–12 kB each) on disk and under ``s3://far/``, with a manifest
    (offsets: the columns read by ranged reads); ``stream(options, **kw)`` opens either copy."""
    import boto3
    import numpy as np

    from dalistream.manifest import build_manifest, write_manifest
    from helpers import write_wds

    folder = tmp_path / "far"
    folder.mkdir()
    rng = np.random.default_rng(35)
    paths = [write_wds(str(folder / f"f-{s}.tar"),
                       [{"__key__": f"f{s}/{i:03d}", "bin": rng.bytes(int(rng.integers(4000, 12000))),
                         "cls": str(i % 3).encode()} for i in range(40)]) for s in range(4)]
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="far")
    for path in paths:
        s3.upload_file(path, "far", os.path.basename(path))
    urls = [f"s3://far/{os.path.basename(p)}" for p in paths]
    infos = build_manifest(paths, offsets=True)
    manifest = str(tmp_path / "far.json")
    write_manifest([type(i)(u, i.samples, i.bytes, i.offsets, i.members) for i, u in zip(infos, urls)], manifest)
    common = dict(fields={"key": "__key__", "bin": "bin"}, batch_size=COLUMNS, workers=1, rank=0, world_size=1,
                  device="cpu", seed=5, cache_dir=str(tmp_path / "c"))

    def stream(options=None, **kw):
        if options is None:
            return Stream.open(paths, **common, **kw)
        return Stream.open(urls, manifest=manifest, storage_options=options, **common, **kw)

    return {"stream": stream, "urls": urls, "paths": paths, "client": s3, "endpoint": moto_endpoint}


def worker_batches(stream, epochs=1):
    """The keys of each batch one worker's source (no DALI) yields, epoch after epoch, and the source."""
    from dalistream.worker.source import WorkerSource

    source = WorkerSource(stream.config, stream.data, 0)
    out = [[[bytes(k).decode() for k, v in zip(b[0], b[-1]) if int(v)] for b in source.epoch_batches(epoch)]
           for epoch in range(epochs)]
    return out, source


@pytest.mark.slow
def test_a_workers_columns_are_fetched_together_within_its_budget(far):
    """Behind a far link (0.25 s to each answer's first byte), a worker's 8 interleaved columns
    have their first parts asked for at once (requests wait for their answers together, as the
    proxy sees them), hold no more than the worker's read-ahead budget between them, and deliver
    the local copy's batches, in order, epoch after epoch."""
    from dalistream.tools.proxy import ShapingProxy

    local = far["stream"]()
    budget = 128 << 10  # 16 kB a column, in parts of 8 kB
    with ShapingProxy(far["endpoint"], latency_s=0.25, rate=4e6) as proxy:
        remote = far["stream"]({"endpoint_url": proxy.endpoint, "read_ahead_bytes": budget})
        assert remote.config.interleave and remote.config.layout.slots == (COLUMNS,)
        got, source = worker_batches(remote, epochs=2)
    assert got == worker_batches(local, epochs=2)[0] and [len(e) for e in got] == [20, 20]
    io = source._stats.io.as_dict()
    assert proxy.peak_waiting >= COLUMNS // 2  # one column after the other: 1
    assert 2 <= io["peak_in_flight"] <= 32 and 0 < io["peak_buffered_bytes"] <= budget
    assert io["parts"] == io["requests"] and io["retries"] == io["resumes"] == 0
    sent = proxy.counts()["body_bytes"]
    assert io["bytes"] <= sent <= 2 * sum(os.path.getsize(p) for p in far["paths"])
    # (what the reader left untaken: at most a tar record's padding after each shard's end marker, per epoch)
    assert sent - io["bytes"] < 2 * len(far["paths"]) * 10240


@pytest.mark.slow
def test_parts_in_flight_given_bounds_a_workers_columns(far):
    """A store that throttles: ``parts_in_flight`` given is the most requests the worker's 8
    columns keep in flight together (the proxy sees at most 2 waiting), with the same batches."""
    from dalistream.tools.proxy import ShapingProxy

    with ShapingProxy(far["endpoint"], latency_s=0.1) as proxy:
        remote = far["stream"]({"endpoint_url": proxy.endpoint, "read_ahead_bytes": 128 << 10, "parts_in_flight": 2})
        got, source = worker_batches(remote)
    assert got == worker_batches(far["stream"]())[0]
    assert 1 <= proxy.peak_waiting <= 2 and source._stats.io.as_dict()["peak_in_flight"] <= 2


def test_a_cut_connection_and_a_replaced_object_are_handled_by_their_column(far, monkeypatch):
    """Columns read together still resume a cut transfer from its byte (the same batches), and a
    shard replaced while the epoch reads it is a named error where it is met, raised in its place
    (the epoch is read in shares of a step or two: the bytes after the first batch's are fetched
    after the replacement)."""
    from dalistream.errors import SourceError
    from dalistream.tools.proxy import ShapingProxy
    from dalistream.worker import epochfeed

    want = worker_batches(far["stream"]())[0][0]
    options = {"read_ahead_bytes": 128 << 10, "backoff_s": 0.01}
    with ShapingProxy(far["endpoint"], cut_after=5000, faults=6) as proxy:  # (one connection a request: inside a part)
        (got,), source = worker_batches(far["stream"]({**options, "endpoint_url": proxy.endpoint}))
    assert got == want and proxy.injected == 6
    assert source._stats.io.resumes >= 6 and source._stats.io.resumed_bytes > 0
    remote = far["stream"]({**options, "endpoint_url": far["endpoint"]})
    from dalistream.worker.source import WorkerSource

    monkeypatch.setattr(epochfeed, "FIRST_SHARE_BYTES", 1)  # (remote shares: a step or two each)
    monkeypatch.setattr(epochfeed, "WALKED_SHARE_BYTES", 1)
    batches = WorkerSource(remote.config, remote.data, 0).epoch_batches(0)
    next(batches)
    with open(far["paths"][2], "rb") as f:
        far["client"].put_object(Bucket="far", Key="f-2.tar", Body=f.read()[::-1])
    with pytest.raises(SourceError) as info:
        list(batches)
    assert info.value.reason == "changed" and info.value.url == far["urls"][2]


@pytest.mark.parametrize("shares", ["one", "a step or two each"])
def test_a_remote_epoch_is_read_at_once_by_ranges_and_delivers_the_columns_batches(far, monkeypatch, shares):
    """An interleaved epoch of remote shards with offsets is read at once, each share's parts of a
    shard as one range fetched by the worker's read-ahead: the batches its columns deliver, epoch
    after epoch, in one share (a request a shard, fewer than the columns' parts) or in many."""
    from dalistream.worker import epochfeed

    remote = far["stream"]({"endpoint_url": far["endpoint"]})
    read, real = [], epochfeed._read
    monkeypatch.setattr(epochfeed, "_read", lambda *a: read.append(real(*a)) or read[-1])
    if shares != "one":
        monkeypatch.setattr(epochfeed, "FIRST_SHARE_BYTES", 1)
        monkeypatch.setattr(epochfeed, "WALKED_SHARE_BYTES", 1)
    got, source = worker_batches(remote, epochs=2)
    assert len(read) >= (2 if shares == "one" else 20) and all(r is not None for r in read)
    monkeypatch.setattr(epochfeed, "EPOCH_BYTES", 0)  # (no share read at once: the columns read every epoch)
    columns, by_columns = worker_batches(remote, epochs=2)
    assert got == columns and [len(e) for e in got] == [20, 20]
    if shares == "one":  # (each shard's parts of the share one range: a request a shard and epoch)
        assert source._stats.io.requests == 2 * len(far["paths"]) < by_columns._stats.io.requests
