"""One suite of store tests, run against every store's real server on 127.0.0.1 (see conftest) and
local files: listing (folders, globs, braces), ranged reads, a connection cut mid-read and
resumed, an object replaced mid-read, a missing object, a wrong credential, writing shards and a
manifest there, and (test_store_epochs.py) a training epoch whose keys equal the local copy's.
What a store cannot do is asserted as the named error it gives (a web server is neither listed
nor written); what does not exist for it (a connection of local files, their credential) is a
skip saying so."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import dalistream
from dalistream.errors import ConfigError, SourceError, redact, redact_client_logs
from dalistream.io import IOCounters
from dalistream.io.readahead import ReadAhead
from dalistream.io.retry import classify
from dalistream.io.stores import canonical, store_for
from dalistream.io.stores.base import read_all
from dalistream.io.remote import TOTALS, RemoteRaw, open_remote, read_bytes, stat_object
from dalistream.io.streams import open_raw
from dalistream.manifest import read_manifest, scan_shard
from dalistream.sources import expand_sources, is_shard_name
from dalistream.tools.proxy import ShapingProxy
from conftest import SECRET

pytestmark = [pytest.mark.stores, pytest.mark.timeout(300)]
KEYS = {"key": "__key__"}


def _local(local_set, name: str) -> bytes:
    with open(os.path.join(local_set["folder"], name), "rb") as f:
        return f.read()


def _shards(local_set) -> list:
    return [n for n in local_set["names"] if is_shard_name(n)]


def test_listing_folders_globs_and_braces(backend, local_set):
    opts = backend.options
    flat = [backend.listed(f"ds/{n}") for n in _shards(local_set)]
    train = [u for u in flat if "/train-" in u]
    before = TOTALS.requests
    assert expand_sources(backend.url("ds/train-{00001..00002}.tar"), opts) == train[1:3]
    # braces name objects: no request (on the Hub one, for the commit the names are pinned to)
    assert TOTALS.requests - before == (1 if backend.name == "hf" else 0)
    if not backend.listable:  # a web server: a folder or a glob is a named error saying what to write
        for source in ("ds/", "nested/"):
            with pytest.raises(SourceError, match="cannot be listed") as info:
                expand_sources(backend.url(source), opts)
            assert "brace pattern" in info.value.hint
        # (glob characters are a URL's own: "?" begins its query, as in a presigned URL)
        assert expand_sources(backend.url("ds/*.tar?sig=1"), opts) == [backend.url("ds/*.tar?sig=1")]
        return
    assert expand_sources(backend.url("ds/"), opts) == flat  # README.txt is no shard
    assert expand_sources(backend.url("ds"), opts) == flat  # a folder without its slash
    assert expand_sources(backend.url("ds/train-0000[0-2].tar"), opts) == train[:3]
    assert expand_sources(backend.url("ds/*.tar"), opts) == [u for u in flat if u.endswith(".tar")]
    nested = [backend.listed("nested/a/x-00000.tar"), backend.listed("nested/b/y-00000.tar")]
    assert expand_sources(backend.url("nested/"), opts) == nested  # folders below are listed too
    with pytest.raises(SourceError, match="glob matched no"):
        expand_sources(backend.url("nested/*.tar"), opts)  # a * stays in its folder
    assert expand_sources(backend.url("nested/**/*.tar"), opts) == nested
    with pytest.raises(SourceError, match="glob matched no"):
        expand_sources(backend.url("ds/none-*.tar"), opts)


def test_unknown_scheme_lists_the_supported_ones():
    with pytest.raises(ConfigError) as info:
        expand_sources(["/data/a.tar", "ftp://host/a.tar"])
    assert "ftp://" in str(info.value) and all(s in str(info.value) for s in ("s3://", "gs://", "az://", "hf://"))


def _read_range(backend, url: str, start: int, end):
    """Bytes ``[start, end)`` of ``url`` as a worker reads them (an object store: ranged requests
    with retries and resumes; a local file: positional reads), and the object's size."""
    if not backend.remote:
        answer = store_for(url, backend.options).open_range(url, start, end, None)
        try:
            return read_all(answer.body), answer.size
        finally:
            answer.body.close()
    raw = RemoteRaw(url, start, backend.options, end=end)
    try:
        return b"".join(iter(lambda: raw.read_chunk(1 << 14), b"")), raw.size
    finally:
        raw.close()


def test_ranged_reads_and_stat(backend, local_set):
    name = "wds-00000.tar"
    data = _local(local_set, name)
    url = backend.url(f"ds/{name}")
    found = stat_object(url, backend.options)
    assert found.size == len(data) and found.version
    for start, end in [(0, 10), (512, 70000), (len(data) - 7, None), (1000, len(data)), (len(data), None)]:
        got, size = _read_range(backend, url, start, end)
        assert got == data[start:end], (start, end)
        assert size == len(data)
    assert read_bytes(backend.url("ds/README.txt"), backend.options) == b"not a shard"


def test_ranged_reads_through_the_byte_cache(backend, local_set, tmp_path):
    """Every store's ranged reads go through the node-local cache: the second time, the same
    ranges come from its blocks (the store is asked only for the object's version)."""
    from dalistream.io.cache import ByteCache

    if not backend.remote:
        pytest.skip("local files are never cached (the page cache holds them): tests/io/test_cache_loader.py")
    name = "wds-00000.tar"
    data = _local(local_set, name)
    url = backend.url(f"ds/{name}")
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    cache = ByteCache(str(folder), None, block_bytes=16384)
    ranges = [(0, 10), (512, 70000), (len(data) - 7, None), (1000, len(data))]

    def read_all(options):  # (``url`` is the object through the proxy)
        counters, before = IOCounters(), proxy.counts()
        for start, end in ranges:
            raw = RemoteRaw(url, start, options, counters, end=end)
            try:
                assert b"".join(iter(lambda: raw.read_chunk(1 << 14), b"")) == data[start:end], (start, end)
            finally:
                raw.close()
        return counters, proxy.counts()["body_bytes"] - before["body_bytes"]

    with ShapingProxy(backend.endpoint) as proxy:
        through = backend.via(proxy.endpoint)
        url = through.url(f"ds/{name}")
        options = {**through.options, "cache": cache}
        first, sent = read_all(options)
        assert first.cache_misses == -(-len(data) // 16384) and first.bytes == len(data) <= sent
        again, sent = read_all(options)
        assert (again.bytes, again.cache_misses, again.cache_hits) == (0, 0, first.cache_misses + first.cache_hits)
        assert sent < 4 * 4096  # the versions' metadata alone, no object bytes


def test_a_connection_cut_mid_read_is_resumed(backend, local_set):
    if not backend.remote:
        pytest.skip("local files are read without a connection")
    name = "wds-00000.tar"
    data = _local(local_set, name)
    counters = IOCounters()
    with ShapingProxy(backend.endpoint, cut_after=30000, faults=2) as proxy:
        through = backend.via(proxy.endpoint)
        options = {**through.options, "chunk_bytes": 4096}
        with open_remote(through.url(f"ds/{name}"), 0, options, counters) as f:
            assert f.read() == data
    assert proxy.injected >= 1
    if backend.name != "az":  # (Azure's SDK asks again for a cut chunk itself, from the chunk's start)
        assert counters.resumes >= 1


def test_an_object_replaced_mid_read_is_a_named_error(backend):
    first, second = np.random.default_rng(1).bytes(200_000), np.random.default_rng(2).bytes(200_000)
    url = backend.url("ds/replaced.bin")
    backend.put("ds/replaced.bin", first)
    if not backend.remote:  # a local file read goes on in the file it opened: the old bytes, whole
        before = stat_object(url).version
        with open_raw(url, 0, backend.options) as stream:
            head = stream.read(8192)
            backend.put("ds/replaced.bin", second)
            assert head + stream.read() == first
        with pytest.raises(SourceError) as info:  # a range pinned to the old version: a named error
            store_for(url, backend.options).open_range(url, 8192, None, before)
        assert info.value.reason == "changed" and "replaced.bin" in str(info.value)
        return
    options = {**backend.options, "part_bytes": 16384, "read_ahead_bytes": 16384, "parts_in_flight": 1,
               "chunk_bytes": 4096}
    ahead = ReadAhead([url], options)
    try:
        stream = ahead.open(0)
        head = stream.read(8192)
        assert head == first[:8192]
        backend.put("ds/replaced.bin", second)
        if backend.name == "hf":  # a read of the Hub is pinned to one commit: the old bytes, whole
            assert head + stream.read() == first
            return
        with pytest.raises(SourceError) as info:
            stream.read()
        assert info.value.reason == "changed" and "replaced.bin" in str(info.value)
    finally:
        ahead.close()


def test_a_missing_object_is_named(backend):
    url = backend.url("ds/none-00000.tar")
    with pytest.raises(SourceError) as info:
        open_raw(url, 0, backend.options).read(10)
    assert info.value.reason == "missing" and "none-00000.tar" in str(info.value)
    with pytest.raises(SourceError) as info:
        stat_object(url, backend.options)
    assert info.value.reason == "missing"


def test_a_ranged_read_after_an_error_answer_reads_its_own_bytes(backend, local_set):
    """An error answer's body (a 404's text) is never left on a pooled connection for the next
    request to read as its answer ('BadStatusLine: not foundHTTP/1.1 206'), and an answer past the
    end (416) or to a stat (a HEAD's, released unread: 'ResponseNotReady') neither: each read
    after one is the object's bytes or the error's own answer, asked once (no retry to hide it)."""
    if not backend.remote:
        pytest.skip("local files are read without a connection")
    name = "wds-00000.tar"
    data = _local(local_set, name)
    store = store_for(backend.url(f"ds/{name}"), backend.options)
    missing = backend.url("ds/none-00000.tar")
    for i in range(6):
        store.stat(backend.url(f"ds/{name}"))
        with pytest.raises(Exception) as info:  # (the store's own error: the retry wrapper maps it)
            store.open_range(missing, 0, 100, None).body.read()
        assert getattr(classify(info.value, missing, True, "object", store), "reason", None) == "missing"
        past = store.open_range(backend.url(f"ds/{name}"), len(data) + 10, None, None)
        assert read_all(past.body) == b""
        answer = store.open_range(backend.url(f"ds/{name}"), 100 * i, 100 * i + 500, None)
        assert read_all(answer.body) == data[100 * i:100 * i + 500]


def test_a_wrong_credential_is_named_and_never_printed(backend, caplog):
    if not backend.credential:
        pytest.skip("local files are read with the file system's permissions, not a credential")
    redact_client_logs()
    caplog.set_level(logging.DEBUG)
    with backend.wrong_credential() as wrong:
        listing = (lambda: expand_sources(wrong.url("ds/"), wrong.options)) if backend.listable else \
            (lambda: stat_object(wrong.url("ds/wds-00000.tar"), wrong.options))
        for call in (lambda: open_remote(wrong.url("ds/wds-00000.tar"), 0, wrong.options).read(10), listing):
            with pytest.raises(SourceError) as info:
                call()
            error = info.value
            assert error.reason in ("denied", "no_credentials"), error
            text = str(error) + repr(error) + repr(error.__reduce__())
            assert backend.secret not in text and SECRET not in text and "credential" in text.lower()
    assert backend.secret not in caplog.text and SECRET not in caplog.text
    assert any(r.levelno == logging.DEBUG for r in caplog.records)  # the DEBUG records were there to look at


def test_scan_of_a_remote_shard_equals_the_local_scan(backend, local_set):
    for name in ("train-00001.tar", "sample.tgz"):
        remote = scan_shard(backend.url(f"ds/{name}"), backend.options, offsets=True)
        local = scan_shard(os.path.join(local_set["folder"], name), offsets=True)
        assert (remote.samples, remote.bytes, remote.offsets) == (local.samples, local.bytes, local.offsets)


def _image_folder(root: str) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        os.makedirs(os.path.join(root, label))
        for i in range(5):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                os.path.join(root, label, f"{i}.jpg"))


@pytest.mark.slow
def test_write_shards_and_index_a_manifest_there(backend, local_set, tmp_path, monkeypatch, capsys):
    from dalistream import cli
    from dalistream.writer import write

    _image_folder(str(tmp_path / "images"))
    out = backend.url(f"written-{tmp_path.name}/")
    for name, value in backend.env.items():  # the CLI takes the store's configuration from its environment
        monkeypatch.setenv(name, value)
    target = backend.url("ds/dalistream-manifest.json")
    if not backend.writable:  # a web server: a named error before anything is written, the manifest put there by hand
        with pytest.raises(SourceError, match="cannot be written") as info:
            write(str(tmp_path / "images"), out, samples_per_shard=4, processes=1, storage_options=backend.options)
        assert "local folder or an object store" in info.value.hint
        shards = [backend.url(f"ds/{n}") for n in _shards(local_set)]
        assert cli.main(["index", *shards, "-o", target]) == 2
        assert "cannot be written" in capsys.readouterr().err
        assert cli.main(["index", *shards, "-o", str(tmp_path / "m.json")]) == 0
        with open(tmp_path / "m.json", "rb") as f:  # (its rows name the shards by full URL)
            backend.put("ds/dalistream-manifest.json", f.read())
        listed = expand_sources(shards, backend.options)
    else:
        done = write(str(tmp_path / "images"), out, samples_per_shard=4, processes=1, storage_options=backend.options)
        assert done["manifest"] == out + "dalistream-manifest.json" and done["shards"] == 3
        rows = read_manifest(done["manifest"], backend.options)
        assert [int(n) for n in rows.samples] == [4, 4, 2] and rows.urls == done["urls"]
        stream = dalistream.Stream.open(out, fields=KEYS, batch_size=2, rank=0, world_size=1, device="cpu",
                                        storage_options=backend.options, cache_dir=None)
        assert sum(stream.counts) == 10 and "manifest" in stream.data.count_source
        assert cli.main(["index", backend.url("ds/"), "-o", target]) == 0
        listed = expand_sources(backend.url("ds/"), backend.options)
    indexed = read_manifest(target, backend.options)
    assert [canonical(u) for u in indexed.urls] == [canonical(redact(u)) for u in listed]  # (never a credential)
    source = [backend.url(f"ds/{n}") for n in _shards(local_set)] if not backend.listable else backend.url("ds/")
    stream = dalistream.Stream.open(source, fields=KEYS, batch_size=2, rank=0, world_size=1,
                                    device="cpu", storage_options=backend.options, cache_dir=None)
    assert stream.data.count_source.startswith("manifest") and list(stream.urls) == listed
