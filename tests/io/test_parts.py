"""Parallel ranged parts (``dalistream.io.parts``) against a real S3 server (moto) behind the
shaping proxy (``dalistream.tools.proxy``): the bytes and keys a worker reads equal a direct read
of the same files, whatever the latency, the cuts and the 503 bursts on the way; buffered bytes
stay within ``read_ahead_bytes``; byte ranges of shards (plain, gzip, local) are exact."""

from __future__ import annotations

import gzip
import os
import shutil

import numpy as np
import pytest

from dalistream.errors import ConfigError, ShardFormatError, SourceError
from dalistream.io import IOCounters, ShardSequence, open_shard
from dalistream.io.local import END_OF_ARCHIVE
from dalistream.io.options import remote_options
from dalistream.tar import iter_samples
from dalistream.tools.proxy import ShapingProxy, parse_shape
from helpers import passed_over_shard, sequence_keys, write_wds

BUCKET = "parts"
KiB = 1 << 10

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, moto_endpoint):
    """Four shards of 0.3–1.2 MB (one gzip) on disk and under ``s3://parts/``."""
    import boto3

    local = str(tmp_path_factory.mktemp("parts"))
    rng = np.random.default_rng(16)
    names = []
    for s, count in enumerate((40, 12, 25, 30)):
        path = write_wds(os.path.join(local, f"p-{s}.tar"),
                         [{"__key__": f"p{s}/{i:04d}", "bin": rng.bytes(int(rng.integers(5_000, 60_000))),
                           "cls": str(i % 7).encode()} for i in range(count)])
        names.append(os.path.basename(path))
    with open(os.path.join(local, names[1]), "rb") as f, gzip.open(os.path.join(local, "p-1.tar.gz"), "wb") as g:
        shutil.copyfileobj(f, g)
    names[1] = "p-1.tar.gz"
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket=BUCKET)
    for name in sorted(os.listdir(local)):
        client.upload_file(os.path.join(local, name), BUCKET, name, ExtraArgs={"ACL": "public-read"})  # for http://
    return {"local": local, "names": names, "endpoint": moto_endpoint, "client": client,
            "s3": [f"s3://{BUCKET}/{n}" for n in names], "paths": [os.path.join(local, n) for n in names]}


def bytes_of(urls, options, counters=None, ranges=None):
    seq = ShardSequence(urls, options, counters, ranges)
    try:
        out = []
        for i in range(len(urls)):
            with seq.open(i) as f:
                out.append(f.read())
        return out
    finally:
        seq.close()


def tar_bytes(path):
    with open_shard(path) as f:  # decompressed for the gzip shard
        return f.read()


@pytest.mark.slow
def test_shaped_link_parallel_parts_deliver_the_keys_of_a_direct_read(shards):
    direct = sequence_keys(shards["paths"], {})
    counters = IOCounters()
    with ShapingProxy(shards["endpoint"], latency_s=0.04, rate=1e6) as proxy:
        options = {"endpoint_url": proxy.endpoint, "part_bytes": 128 * KiB, "parts_in_flight": 4}
        assert sequence_keys(shards["s3"], options, counters) == direct
    got = counters.as_dict()
    sizes = [os.path.getsize(p) for p in shards["paths"]]
    assert got["bytes"] == sum(sizes)  # nothing fetched twice
    assert got["parts"] == sum(-(-size // (128 * KiB)) for size in sizes)
    assert 2 <= got["peak_in_flight"] <= 4 and proxy.peak_open >= 2  # parts overlapped, at most K at once
    assert got["retries"] == got["resumes"] == 0


def test_buffered_bytes_stay_within_read_ahead_bytes(shards):
    counters = IOCounters()
    budget = 300 * KiB
    options = {"endpoint_url": shards["endpoint"], "part_bytes": 64 * KiB, "parts_in_flight": 16,
               "read_ahead_bytes": budget, "chunk_bytes": 16 * KiB}
    assert bytes_of(shards["s3"], options, counters) == [tar_bytes(p) for p in shards["paths"]]
    got = counters.as_dict()
    assert 0 < got["peak_buffered_bytes"] <= budget
    assert got["peak_in_flight"] < 16  # the budget, not K, bounds the parts in flight
    # a stalled reader: the fetcher fills the budget and waits
    seq = ShardSequence(shards["s3"], options, counters := IOCounters())
    f = seq.open(0)
    f.read(1)
    fetcher = seq._ahead._fetcher
    with fetcher.cond:
        fetcher.cond.wait_for(lambda: fetcher.in_flight == 0 and fetcher.held > budget - 64 * KiB, timeout=60)
        assert fetcher.held <= budget
    f.close()
    seq.close()
    assert counters.peak_buffered_bytes <= budget


@pytest.mark.slow
def test_cuts_in_mid_part_lose_and_duplicate_nothing(shards):
    want = [tar_bytes(p) for p in shards["paths"]]
    counters = IOCounters()
    with ShapingProxy(shards["endpoint"], latency_s=0.01, cut_after=90_000, faults=8) as proxy:
        options = {"endpoint_url": proxy.endpoint, "part_bytes": 200 * KiB, "parts_in_flight": 4,
                   "chunk_bytes": 32 * KiB, "backoff_s": 0.01}
        seq = ShardSequence(shards["s3"], options, counters)
        got = []
        for i in range(len(shards["s3"])):
            with seq.open(i) as f:
                got.append(f.read())
        seq.close()
    assert got == want
    assert proxy.injected == 8 and counters.resumes + counters.retries >= 8 and counters.resumed_bytes > 0
    with ShapingProxy(shards["endpoint"], cut_after=70_000, faults=5) as proxy:
        options = {"endpoint_url": proxy.endpoint, "part_bytes": 100 * KiB, "backoff_s": 0.01}
        assert sequence_keys(shards["s3"], options) == sequence_keys(shards["paths"], {})
    assert proxy.injected == 5


@pytest.mark.slow
def test_503_bursts_lose_and_duplicate_nothing(shards):
    counters = IOCounters()
    with ShapingProxy(shards["endpoint"], status=503, faults=12) as proxy:
        options = {"endpoint_url": proxy.endpoint, "part_bytes": 128 * KiB, "parts_in_flight": 4,
                   "backoff_s": 0.01, "max_attempts": 30}
        assert sequence_keys(shards["s3"], options, counters) == sequence_keys(shards["paths"], {})
    assert proxy.injected == 12 and counters.retries == 12
    assert counters.bytes == sum(os.path.getsize(p) for p in shards["paths"])


@pytest.mark.slow
def test_object_changed_between_parts_is_an_error(shards):
    path = shards["paths"][0]
    data = open(path, "rb").read()
    shards["client"].put_object(Bucket=BUCKET, Key="changing.tar", Body=data)
    options = {"endpoint_url": shards["endpoint"], "part_bytes": 64 * KiB, "read_ahead_bytes": 128 * KiB,
               "chunk_bytes": 16 * KiB}
    seq = ShardSequence([f"s3://{BUCKET}/changing.tar"], options)
    try:
        f = seq.open(0)
        head = f.read(1)
        fetcher = seq._ahead._fetcher
        with fetcher.cond:  # the first parts arrived; the rest waits for room
            fetcher.cond.wait_for(lambda: fetcher.in_flight == 0 and fetcher.held > 64 * KiB, timeout=60)
        shards["client"].put_object(Bucket=BUCKET, Key="changing.tar", Body=data[::-1])
        with pytest.raises(SourceError, match="changed while it was being read"):
            f.read()
        assert head == data[:1]
    finally:
        seq.close()


@pytest.mark.parametrize("replaced", [False, True])
def test_a_fetcher_s_later_streams_of_an_object_are_pinned_to_its_first_version(shards, replaced):
    """A worker's fetcher reads an object in one stream (an epoch's share), then in another (the
    next share, the next epoch): the later stream is pinned to the version the first one learned,
    so an object replaced in between is a ``changed`` error naming it, not the new bytes read at
    the old offsets; an object left alone reads the same bytes again."""
    from dalistream.io.parts import PartFetcher

    path = next(p for p in shards["paths"] if not p.endswith(".gz"))
    data = open(path, "rb").read()
    key = f"pinned-{int(replaced)}.tar"
    shards["client"].put_object(Bucket=BUCKET, Key=key, Body=data)
    url = f"s3://{BUCKET}/{key}"
    options = {"endpoint_url": shards["endpoint"], "part_bytes": 64 * KiB}
    fetcher = PartFetcher()
    try:
        first = ShardSequence([url], options, ranges=[(0, 4096)], fetcher=fetcher)
        with first.open(0) as f:  # (a part with an end reads as a tar of its own: its end marker follows)
            assert f.read(4096) == data[:4096]
        first.close()
        if replaced:
            shards["client"].put_object(Bucket=BUCKET, Key=key, Body=data[::-1])
        later = ShardSequence([url], options, ranges=[(4096, None)], fetcher=fetcher)
        try:
            if replaced:
                with pytest.raises(SourceError) as info:
                    with later.open(0) as f:
                        f.read()
                assert info.value.reason == "changed" and info.value.url == url
            else:
                with later.open(0) as f:
                    assert f.read() == data[4096:]
        finally:
            later.close()
    finally:
        fetcher.stop()


@pytest.mark.slow
def test_http_ranges_give_parts_else_one_stream(shards, tmp_path):
    import functools
    import http.server
    import threading

    direct = sequence_keys(shards["paths"], {})
    counters = IOCounters()
    urls = [f"{shards['endpoint']}/{BUCKET}/{n}" for n in shards["names"]]  # moto answers ranges (206)
    assert sequence_keys(urls, {"part_bytes": 64 * KiB}, counters) == direct
    assert counters.parts > len(urls)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=shards["local"])
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # ignores Range: 200, whole file
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        counters = IOCounters()
        urls = [f"http://127.0.0.1:{server.server_address[1]}/{n}" for n in shards["names"]]
        budget = 200 * KiB
        options = {"part_bytes": 64 * KiB, "read_ahead_bytes": budget, "chunk_bytes": 16 * KiB}
        assert sequence_keys(urls, options, counters) == direct
        assert counters.parts == counters.requests == len(urls)  # one stream per shard
        assert counters.peak_buffered_bytes <= budget + 16 * KiB
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_ranges_of_plain_gzip_and_local_shards(shards):
    tars = [tar_bytes(p) for p in shards["paths"]]
    ranges = [(1000, 250_000), (512, None), (0, None), (300_000, None)]
    want = [t[s:e] + (END_OF_ARCHIVE if e is not None else b"") for t, (s, e) in zip(tars, ranges)]  # a part is a tar
    counters = IOCounters()
    options = {"endpoint_url": shards["endpoint"], "part_bytes": 48 * KiB, "parts_in_flight": 3}
    assert bytes_of(shards["s3"], options, counters, ranges) == want
    # never a byte past a range's end (the gzip shard is read whole: its ranges are in the tar)
    raw_sizes = [os.path.getsize(p) for p in shards["paths"]]
    fetched = (250_000 - 1000) + raw_sizes[1] + raw_sizes[2] + (raw_sizes[3] - 300_000)
    assert counters.bytes == fetched
    assert bytes_of(shards["paths"], {}, None, ranges) == want
    mixed = [shards["s3"][0], shards["paths"][1], shards["s3"][2], shards["paths"][3]]
    assert bytes_of(mixed, options, None, ranges) == want
    for url, path, (start, end), expected in zip(shards["s3"], shards["paths"], ranges, want):
        with open_shard(url, start, options, end) as f:
            assert f.read() == expected
        with open_shard(path, start, None, end) as f:
            assert f.read() == expected
    empty = [(5000, 5000), (10, 10), (0, 0), (raw_sizes[3], None)]
    assert bytes_of(shards["s3"], options, None, empty) == [END_OF_ARCHIVE] * 3 + [b""]
    with pytest.raises(ValueError, match="ranges"):
        ShardSequence(shards["s3"], options, None, ranges[:2])


def test_a_part_whose_last_member_is_passed_over_ends_with_its_marker_from_every_store(shards, tmp_path):
    """A part's last member not wanted, larger than the read buffer (passed over by a seek, not
    read): its samples, then its end, from S3, a gzip shard and the disk alike."""
    path = str(tmp_path / "q.tar")
    offsets = passed_over_shard(path, n=7)
    with open(path, "rb") as f, gzip.open(str(tmp_path / "q.tar.gz"), "wb") as g:
        shutil.copyfileobj(f, g)
    for name in ("q.tar", "q.tar.gz"):
        shards["client"].upload_file(str(tmp_path / name), BUCKET, name)
    options = {"endpoint_url": shards["endpoint"], "part_bytes": 8 * KiB, "chunk_bytes": 1 * KiB}
    n = len(offsets)
    for url, opts in ((f"s3://{BUCKET}/q.tar", options), (f"s3://{BUCKET}/q.tar.gz", options),
                      (str(tmp_path / "q.tar.gz"), None), (path, None)):
        for i in range(n):
            for j in range(i + 1, n + 1):
                with open_shard(url, offsets[i], opts, offsets[j] if j < n else None) as f:
                    keys = [s["__key__"] for s in iter_samples(f, url, want_ext=lambda e: e == "cls",
                                                               first_index=i, chunk=1024)]
                assert keys == [f"p/{k:03d}" for k in range(i, j)], (url, i, j)


@pytest.mark.slow
def test_a_part_cut_inside_its_passed_over_last_member_is_truncated_from_every_store(shards, tmp_path):
    """The same parts, their shard cut inside the last member of part ``[offsets[i], offsets[j])``
    (not wanted, passed over): its end never comes, so the shard reads as truncated (an error
    naming it), from S3, a gzip shard and the disk alike; the parts before the cut still read whole."""
    path = str(tmp_path / "c.tar")
    offsets = passed_over_shard(path, n=5, prefix="c")
    with open(path, "rb") as f:
        whole = f.read()
    for j in range(1, len(offsets)):
        cut = offsets[j] - 700  # (inside sample j - 1's passed-over member)
        with open(path, "wb") as f:
            f.write(whole[:cut])
        with open(path, "rb") as f, gzip.open(str(tmp_path / "c.tar.gz"), "wb") as g:
            shutil.copyfileobj(f, g)
        for name in ("c.tar", "c.tar.gz"):
            shards["client"].upload_file(str(tmp_path / name), BUCKET, name)
        options = {"endpoint_url": shards["endpoint"], "part_bytes": 8 * KiB, "chunk_bytes": 1 * KiB}
        for url, opts in ((f"s3://{BUCKET}/c.tar", options), (f"s3://{BUCKET}/c.tar.gz", options),
                          (str(tmp_path / "c.tar.gz"), None), (path, None)):
            for i in range(j):
                with open_shard(url, offsets[i], opts, offsets[j]) as f:
                    with pytest.raises(ShardFormatError, match="truncated") as raised:
                        list(iter_samples(f, url, want_ext=lambda e: e == "cls", first_index=i, chunk=1024))
                assert raised.value.url == url, (url, i, j)
                if i + 1 < j:  # a part ending before the cut: whole
                    with open_shard(url, offsets[i], opts, offsets[i + 1]) as f:
                        keys = [s["__key__"] for s in iter_samples(f, url, want_ext=lambda e: e == "cls",
                                                                   first_index=i, chunk=1024)]
                    assert keys == [f"c/{i:03d}"], (url, i, j)


def test_failed_shard_is_raised_in_its_place_and_the_next_one_is_read(shards):
    urls = [shards["s3"][0], f"s3://{BUCKET}/missing.tar", shards["s3"][2]]
    seq = ShardSequence(urls, {"endpoint_url": shards["endpoint"], "part_bytes": 64 * KiB})
    try:
        with seq.open(0) as f:
            assert f.read() == tar_bytes(shards["paths"][0])
        with pytest.raises(SourceError, match="does not exist"):
            with seq.open(1) as f:
                f.read()
        with seq.open(2) as f:
            assert f.read() == tar_bytes(shards["paths"][2])
    finally:
        seq.close()


def test_options_and_shape_parsing():
    assert remote_options({}).in_flight >= 4 and remote_options({}).part_bytes >= 1 << 20
    for bad in ({"parts_in_flight": 0}, {"part_bytes": 10}):
        with pytest.raises(ConfigError, match="parts_in_flight"):
            remote_options(bad)
    assert parse_shape("40ms,3MB/s") == (0.04, 3e6)
    assert parse_shape("0.1s, 500kB/s") == (0.1, 5e5)
    with pytest.raises(ConfigError, match="LATENCY,RATE"):
        parse_shape("fast")
    with pytest.raises(ConfigError, match="plain http"):
        ShapingProxy("https://s3.amazonaws.com")


@pytest.mark.parametrize("part_kib", [100, 48, 64, 200])
def test_through_a_byte_cache_the_reader_reads_what_the_read_ahead_fetched(shards, tmp_path, part_kib):
    """Through a cache the read-ahead fetches parts of any size into it (each block once, parts on
    its blocks' bounds) and the reader reads them from there: the bytes of a direct read; read
    again, nothing is fetched, no read-ahead starts and no version is asked again (this process
    stated them less than version_check_s ago)."""
    from dalistream.io.cache import ByteCache
    from dalistream.io.cachesim import blocks

    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    cache = ByteCache(str(folder), None, block_bytes=64 * KiB)
    urls = [u for u in shards["s3"] if not u.endswith(".gz")]
    sizes = [os.path.getsize(os.path.join(shards["local"], u.rsplit("/", 1)[1])) for u in urls]
    ranges = [(1000, None), (70_000, sizes[1] - 5000), (0, 131_072)]
    options = {"endpoint_url": shards["endpoint"], "part_bytes": part_kib * KiB, "parts_in_flight": 4, "cache": cache}
    direct = bytes_of(urls, {"endpoint_url": shards["endpoint"]}, ranges=ranges)
    cold, warm = IOCounters(), IOCounters()
    assert bytes_of(urls, options, cold, ranges) == direct
    wanted = sum(len(blocks(s, sizes[i] if e is None else e, 64 * KiB)) for i, (s, e) in enumerate(ranges))
    assert cold.cache_misses == wanted and cold.bytes == cold.cache_written_bytes  # each block fetched once
    assert cold.cache_hits <= wanted  # read from the cache by the reader (but those it reached first and fetched)
    assert bytes_of(urls, options, warm, ranges) == direct
    assert (warm.cache_misses, warm.bytes, warm.cache_hits) == (0, 0, wanted)
    assert (warm.parts, warm.requests) == (0, 0)  # no read-ahead started, versions known: not a request


def test_aligned_part_sizes():
    from dalistream.io.partstate import aligned_part

    assert aligned_part(8 << 20, 4 << 20) == 8 << 20 and aligned_part(10 << 20, 4 << 20) == 8 << 20
    assert aligned_part(1 << 20, 4 << 20) == 1 << 20 and aligned_part(3 << 20, 4 << 20) == 2 << 20
    assert aligned_part(5000, 12288) == 4096  # (a divisor of the block)
    for part in range(1000, 20000, 777):
        size = aligned_part(part, 12288)
        assert size <= max(part, 12288) and (size % 12288 == 0 or 12288 % size == 0)
    from dalistream.io.partstate import StreamState

    stream = StreamState(0, 0, 0, remote_options({"part_bytes": 30000}), None)
    assert stream.part_length(5000, None) == 30000  # without a cache: part_bytes from anywhere
    stream.align = aligned_part(30000, 12288)  # (what a cache of 12 KiB blocks sets)
    assert [stream.part_length(p, 100_000) for p in (5000, 24576, 90000)] == [19576, 24576, 8304]  # to the next bound


@pytest.mark.slow
def test_a_workers_streams_share_one_fetcher_and_its_budget(shards):
    """Six columns' sequences on one fetcher (a worker's): opened and not read, they fetch their
    first parts together and no more than the worker's budget between them; read a chunk of each
    in turn (as a worker's rounds do), each gives exactly its range's bytes, the bytes held never
    above the budget; a sequence closed early stops being fetched."""
    from dalistream.io.options import shared_budget
    from dalistream.io.parts import PartFetcher

    urls = [u for u in shards["s3"] if not u.endswith(".gz")]
    tars = {u: tar_bytes(p) for u, p in zip(shards["s3"], shards["paths"]) if u in urls}
    cuts = [(u, (0, len(tars[u]) // 2)) for u in urls] + [(u, (len(tars[u]) // 2, None)) for u in urls]
    budget = 192 * KiB
    with ShapingProxy(shards["endpoint"], latency_s=0.2) as proxy:
        options = shared_budget({"endpoint_url": proxy.endpoint, "read_ahead_bytes": budget, "chunk_bytes": 8 * KiB},
                                len(cuts))  # 32 KiB a column, parts of 16 KiB
        fetcher, counters = PartFetcher(), IOCounters()
        seqs = [ShardSequence([u], options, counters, [r], fetcher=fetcher) for u, r in cuts]
        with fetcher.cond:  # nothing read: the columns' first parts, then as much as the budget holds
            fetcher.cond.wait_for(lambda: fetcher.in_flight == 0 and fetcher.held == budget, timeout=60)
        assert proxy.peak_waiting == len(cuts) and proxy.counts()["body_bytes"] == budget
        streams = [seq.open(0) for seq in seqs]
        got = [b""] * len(seqs)
        while any(s is not None for s in streams):
            for k, stream in enumerate(streams):
                data = stream.read(4 * KiB) if stream is not None else b""
                if stream is not None and not data:
                    stream.close()
                    streams[k] = None
                got[k] += data
        assert got == [tars[u][s:e] + (END_OF_ARCHIVE if e is not None else b"") for u, (s, e) in cuts]
        assert 0 < counters.peak_buffered_bytes <= budget and counters.retries == 0
        assert counters.bytes == sum(len(tars[u]) for u in urls)  # nothing fetched twice
        before = proxy.counts()["requests"]
        late = ShardSequence([urls[0]], options, counters, [(0, None)], fetcher=fetcher)
        late.close()  # closed before it is read: nothing more of it is fetched (at most its first parts)
        fetcher.stop()
        assert proxy.counts()["requests"] - before <= 2
        for seq in seqs:
            seq.close()


def test_the_next_part_goes_to_the_stream_with_the_fewest_bytes_ahead(shards):
    """The scheduling order of a fetcher of three streams (its threads held back): each stream's
    first part in the order the streams were added, then each one's next in the same turn (the
    order a reader taking a little of each in turn needs them), never past a stream's budget."""
    from dalistream.io.parts import PartFetcher

    opts = remote_options({"endpoint_url": shards["endpoint"], "read_ahead_bytes": 96 * KiB, "part_bytes": 24 * KiB})
    fetcher = PartFetcher()
    fetcher.stopped = True  # (no thread fetches: the order is read from the scheduler alone)
    bases = [fetcher.add(shards["s3"][:1] + shards["s3"][2:3], opts) for _ in range(3)]
    with fetcher.cond:
        order = []
        while (slot := fetcher._next_part()) is not None:
            order.append((bases.index(slot.owner.lo), slot.index - slot.owner.lo, slot.offset))
    # each stream: its first shard's first part, then (its size unknown until that part answers)
    # the next shard's first part, ahead, within the stream's budget less a part
    assert order == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 1, 0), (1, 1, 0), (2, 1, 0)]
    assert fetcher.held == 3 * 48 * KiB and all(s.held == 48 * KiB for s in fetcher.streams)
