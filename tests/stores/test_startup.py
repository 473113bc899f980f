"""Start-up at scale on every store: with a manifest beside the shards, ``Stream.open`` on a
folder (a prefix) of 50,000 shards takes the shard list from the manifest and asks the store a
bounded number of questions per rank, never a listing of every object. The shards themselves are
not there: a listing would find none (and fail), so passing proves nothing was listed."""

from __future__ import annotations

import json

import pytest

import dalistream
from dalistream.io.remote import TOTALS

pytestmark = [pytest.mark.stores, pytest.mark.timeout(300)]
SHARDS = 50_000


def _manifest(shards: int) -> bytes:
    rows = [{"url": f"part-{i:06d}.tar", "samples": 10 + i % 7, "bytes": 40960} for i in range(shards)]
    return json.dumps({"format": "dalistream-manifest", "version": 1, "shards": rows}).encode()


@pytest.mark.parametrize("warm", [False, True], ids=["first rank", "next rank"])
def test_a_prefix_of_50000_shards_opens_with_a_few_requests(backend, tmp_path_factory, warm):
    folder = "big-warm/" if warm else "big/"
    backend.put(folder + "dalistream-manifest.json", _manifest(SHARDS))
    cache = str(tmp_path_factory.getbasetemp() / f"startup-cache-{backend.name}")
    options = dict(fields={"key": "__key__"}, batch_size=8, workers=2, rank=3, world_size=8, device="cpu",
                   storage_options=backend.options, cache_dir=cache)
    if warm:  # another rank of the node read it first: the parsed manifest is in the cache
        dalistream.Stream.open(backend.url(folder), **options)
    before = TOTALS.requests
    stream = dalistream.Stream.open(backend.url(folder), **options)
    asked = TOTALS.requests - before
    assert len(stream.urls) == SHARDS and sum(stream.counts) == sum(10 + i % 7 for i in range(SHARDS))
    assert stream.urls[0].endswith("/part-000000.tar")
    # states and the manifest's own read (and on the Hub the commit the names are pinned to); no listing
    assert asked <= (2 if warm else 3) + (backend.name == "hf"), asked
    if backend.name == "hf":
        assert not [r for r in backend.server.hub.requests[-10:] if "/tree/" in r]


def test_without_a_manifest_a_prefix_is_listed(backend):
    before = TOTALS.requests
    with pytest.raises(dalistream.errors.SourceError, match="holds no"):
        dalistream.Stream.open(backend.url("empty-prefix/"), fields={"key": "__key__"}, batch_size=8, device="cpu",
                               rank=0, world_size=1, storage_options=backend.options, cache_dir=None)
    assert TOTALS.requests - before >= 1  # asked for a listing
