"""Start-up at scale on every store: with a manifest beside the shards, ``Stream.open`` on a
folder (a prefix) of 50,000 shards takes the shard list from the manifest and asks the store a
bounded number of questions per rank, never a listing of every object. On a remote store the
shards themselves are not there: a listing would find none (and fail), so passing proves nothing
was listed. A local folder is read once (a listed shard that is not there is named at open), so
there they are empty files."""

from __future__ import annotations

import json
import os

import pytest

import dalistream
from dalistream.io.remote import TOTALS

pytestmark = [pytest.mark.stores, pytest.mark.timeout(300)]
SHARDS = 50_000


def _manifest(shards: int) -> bytes:
    rows = [{"url": f"part-{i:06d}.tar", "samples": 10 + i % 7, "bytes": 40960} for i in range(shards)]
    return json.dumps({"format": "dalistream-manifest", "version": 1, "shards": rows}).encode()


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["first rank", "next rank"])
def test_a_prefix_of_50000_shards_opens_with_a_few_requests(backend, tmp_path_factory, warm):
    """(A web server cannot be listed, and a local folder is read: there the shards are named by a
    brace pattern, which the manifest's rows and one read of the folder settle, without a request
    or a stat each.)"""
    folder = "big-warm/" if warm else "big/"
    backend.put(folder + "dalistream-manifest.json", _manifest(SHARDS))
    if not backend.remote:
        where = os.path.dirname(backend.url(folder + "dalistream-manifest.json"))
        for i in range(SHARDS):
            open(os.path.join(where, f"part-{i:06d}.tar"), "wb").close()
    source = backend.url(folder) if backend.listable and backend.remote else \
        backend.url(folder + f"part-{{000000..{SHARDS - 1:06d}}}.tar")
    cache = str(tmp_path_factory.getbasetemp() / f"startup-cache-{backend.name}")
    options = dict(fields={"key": "__key__"}, batch_size=8, workers=2, rank=3, world_size=8, device="cpu",
                   storage_options=backend.options, cache_dir=cache)
    if warm:  # another rank of the node read it first: the parsed manifest is in the cache
        dalistream.Stream.open(source, **options)
    before = TOTALS.requests
    stream = dalistream.Stream.open(source, **options)
    asked = TOTALS.requests - before
    assert len(stream.urls) == SHARDS and sum(stream.counts) == sum(10 + i % 7 for i in range(SHARDS))
    assert stream.urls[0].endswith("/part-000000.tar")
    # the manifest's version and its read, once for the listing and the counts (and on the Hub the
    # commit the names are pinned to); no listing
    assert asked <= (1 if warm else 2) + (backend.name == "hf"), asked
    if backend.name == "hf":
        assert not [r for r in backend.server.hub.requests[-10:] if "/tree/" in r]


def test_without_a_manifest_a_prefix_is_listed(backend):
    if not backend.listable:
        pytest.skip("a web server cannot be listed (test_stores.py: its named error)")
    if not backend.remote:
        backend.put("empty-prefix/notes.txt", b"no shard")
    before = TOTALS.requests
    with pytest.raises(dalistream.errors.SourceError, match="holds no"):
        dalistream.Stream.open(backend.url("empty-prefix/"), fields={"key": "__key__"}, batch_size=8, device="cpu",
                               rank=0, world_size=1, storage_options=backend.options, cache_dir=None)
    assert TOTALS.requests - before >= backend.remote  # asked for a listing (a local folder is read)
