"""Local shard parts read by positional reads (``dalistream.io.local.FileRange``): exactly the
bytes of the range, seekable within it, then an end-of-archive marker, only after all of them
came (a cut shard stays a truncated tar); gzip content under a ``.tar`` name read through the
decompressor, a part of it a tar too; and the read budget a worker's columns share (``shared_budget``)."""

import gzip

import pytest

from dalistream.errors import ShardFormatError
from dalistream.io.local import END_OF_ARCHIVE, FileRange
from dalistream.io.options import MIN_SHARED_CHUNK, remote_options, shared_budget
from dalistream.io.streams import open_shard
from dalistream.tar import iter_samples
from dalistream.manifest import build_manifest

from helpers import key_shards


def read_all(stream, size=1000):
    out = bytearray()
    buf = bytearray(size)
    while True:
        n = stream.readinto(buf)
        if not n:
            return bytes(out)
        out += buf[:n]


def test_a_local_part_is_its_bytes_then_the_marker(tmp_path):
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    part = open_shard(path, 1536, None, 4096)
    assert isinstance(part, FileRange) and part.tell() == 1536 and part.remaining == 2560
    assert read_all(part, 700) == data[1536:4096] + END_OF_ARCHIVE
    part = open_shard(path, 1536, None, 4096)
    assert read_all(part, 333) == data[1536:4096] + END_OF_ARCHIVE
    part.seek(2000)
    assert part.tell() == 2000 and part.seek(99999) == 4096


def test_a_part_cut_short_has_no_marker_and_reads_as_truncated(tmp_path):
    path = key_shards(str(tmp_path), [9])[0]
    offsets = build_manifest([path], offsets=True)[0].offsets
    end = offsets[6]
    with open(path, "r+b") as f:
        f.truncate(offsets[4] + 700)  # the shard lost its end after it was indexed
    part = open_shard(path, offsets[2], None, end)
    with pytest.raises(ShardFormatError):
        list(iter_samples(part, path, first_index=2))


def test_gzip_content_under_a_tar_name_is_decompressed(tmp_path):
    path = key_shards(str(tmp_path), [5])[0]
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(gzip.compress(data))
    part = open_shard(path, 1024, None, 2048)
    assert not isinstance(part, FileRange)
    assert read_all(part) == data[1024:2048] + END_OF_ARCHIVE


def test_columns_share_one_streams_budget():
    """The columns' read-ahead adds up to the worker's (no floor that grows with the columns), each
    column's parts half its share (its next part fetched while it reads one), the requests in
    flight the worker's (not divided)."""
    one = remote_options({})
    for share in (2, 32, 128, 4096):
        shared = remote_options(shared_budget({}, share))
        assert shared.read_ahead_bytes * share <= max(one.read_ahead_bytes, 2048 * share)
        assert shared.part_bytes <= max(1024, shared.read_ahead_bytes // 2) and shared.part_bytes <= one.part_bytes
        assert shared.parts_in_flight == one.parts_in_flight
        assert shared.chunk_bytes == min(shared.read_ahead_bytes, max(MIN_SHARED_CHUNK, one.chunk_bytes // share))
    assert shared_budget({"endpoint_url": "http://x"}, 1) == {"endpoint_url": "http://x"}
    assert remote_options(shared_budget({"parts_in_flight": 16, "read_ahead_bytes": 128 << 20}, 4)).parts_in_flight == 16
    assert remote_options(shared_budget({"read_ahead_bytes": 128 << 20}, 4)).part_bytes == 8 << 20
