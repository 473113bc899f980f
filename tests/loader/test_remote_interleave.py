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
