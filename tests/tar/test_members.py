import io
import os
import tarfile
import time

import pytest

from dalistream.errors import SampleError, ShardFormatError
from dalistream.io import open_shard
from dalistream.io import ReadClock
from dalistream.tar import iter_samples, split_name

from helpers import PEER_DATA, write_tar, write_wds


def samples_of(path, **kw):
    with open_shard(path) as f:
        return list(iter_samples(f, path, **kw))


@pytest.mark.parametrize("name,key,ext", [
    ("a.b/c.seg.png", "a.b/c", "seg.png"),
    ("x/y/z.jpg", "x/y/z", "jpg"),
    ("plain.cls", "plain", "cls"),
    ("noext", "noext", None),
    ("d/.hidden", "d/.hidden", None),
    ("a.", "a", ""),
    ("a.b/c", "a.b/c", None),
])
def test_split_name(name, key, ext):
    assert split_name(name) == (key, ext)


def test_case_insensitive_extensions_on_request():
    assert split_name("A/B.JPG", lowercase=True) == ("A/B", "jpg")
    assert split_name("A/B.JPG") == ("A/B", "JPG")


def test_webdataset_tarwriter_shards_group_into_samples(tmp_path):
    path = write_wds(str(tmp_path / "w.tar"), [
        {"__key__": f"k{i:03d}", "cls": str(i).encode(), "txt": f"caption {i}".encode(), "seg.png": b"\x89PNG" + bytes([i])}
        for i in range(5)
    ])
    out = samples_of(path)
    assert [s["__key__"] for s in out] == [f"k{i:03d}" for i in range(5)]
    assert out[3]["cls"] == b"3" and out[3]["txt"] == b"caption 3" and out[3]["seg.png"] == b"\x89PNG\x03"
    assert all(s["__url__"] == path for s in out)
    assert [s["__index__"] for s in out] == list(range(5))


class SlowStream(io.RawIOBase):
    """A byte stream that takes ``delay`` seconds per read (a slow disk or network)."""

    def __init__(self, data: bytes, delay: float) -> None:
        self.inner, self.delay, self.reads = io.BytesIO(data), delay, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        time.sleep(self.delay)
        self.reads += 1
        return self.inner.readinto(buffer)


def test_read_clock_counts_time_blocked_on_the_stream(tmp_path):
    path = write_wds(str(tmp_path / "w.tar"), [{"__key__": f"k{i}", "cls": b"1", "bin": bytes(3000)} for i in range(4)])
    with open(path, "rb") as f:
        data = f.read()
    slow = SlowStream(data, delay=0.02)
    clock = ReadClock()
    out = list(iter_samples(slow, path, clock=clock))
    assert len(out) == 4 and slow.reads >= 2  # (large reads: the data, then the end)
    assert clock.seconds >= 0.02 * slow.reads * 0.9  # every read waited; parsing is not counted
    assert samples_of(path) == out  # the clock changes nothing read


def test_long_names_pax_and_gnu(tmp_path):
    long = "d" * 150 + "/sample.with.dots/" + "k" * 120
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = write_tar(str(tmp_path / f"long{fmt}.tar"), [(long + ".jpg", b"abc"), (long + ".cls", b"7")], fmt=fmt)
        (s,) = samples_of(path)
        assert s["__key__"] == long and s["jpg"] == b"abc" and s["cls"] == b"7"


def test_peer_gzip_shard_streams(tmp_path):
    path = os.path.join(PEER_DATA, "sample.tgz")
    out = samples_of(path)
    assert len(out) == 90
    assert out[0]["__key__"] == "10" and out[0]["png"][:4] == b"\x89PNG"
    assert int(out[0]["cls"]) >= 0


def test_peer_shard_with_directory_entry_and_gz_members():
    path = os.path.join(PEER_DATA, "compressed.tar")
    out = samples_of(path)
    assert [s["__key__"] for s in out][:2] == ["compressed/0001", "compressed/0002"]
    assert all("txt.gz" in s for s in out)


def test_skip_by_header_reads_no_data(tmp_path):
    path = write_tar(str(tmp_path / "t.tar"), [(f"{i}.jpg", bytes(1000)) for i in range(6)])
    out = samples_of(path, keep=lambda i: i >= 4)
    assert [s["jpg"] is None for s in out] == [True] * 4 + [False] * 2
    assert [s["__index__"] for s in out] == list(range(6))


def test_unwanted_extensions_are_not_read(tmp_path):
    path = write_tar(str(tmp_path / "t.tar"), [("a.jpg", b"1"), ("a.txt", b"2")])
    (s,) = samples_of(path, want_ext=lambda e: e == "jpg")
    assert s["jpg"] == b"1" and s["txt"] is None


def test_non_seekable_stream_skips_by_reading(tmp_path):
    path = write_tar(str(tmp_path / "t.tar"), [(f"{i}.jpg", bytes([i]) * 700) for i in range(4)])
    stream = io.BufferedReader(io.BytesIO(open(path, "rb").read()))
    stream.seekable = lambda: False
    out = list(iter_samples(stream, "mem", keep=lambda i: i % 2 == 1))
    assert [s["jpg"] for s in out] == [None, bytes([1]) * 700, None, bytes([3]) * 700]


@pytest.mark.parametrize("cut,match", [(700, "header cut|member data cut"), (512 + 100, "member data cut"), (100, "header cut")])
def test_truncated_tars_name_shard_and_member(tmp_path, cut, match):
    path = write_tar(str(tmp_path / "t.tar"), [("a.jpg", bytes(300)), ("b.jpg", bytes(300))])
    data = open(path, "rb").read()
    cut_path = tmp_path / "cut.tar"
    cut_path.write_bytes(data[:cut])
    with pytest.raises(ShardFormatError, match=match) as e:
        samples_of(str(cut_path))
    assert str(cut_path) in str(e.value)


def test_tar_cut_at_member_boundary_is_reported(tmp_path):
    path = write_tar(str(tmp_path / "t.tar"), [("a.jpg", bytes(512))])
    data = open(path, "rb").read()
    (tmp_path / "cut.tar").write_bytes(data[:1024])
    with pytest.raises(ShardFormatError, match="end-of-archive"):
        samples_of(str(tmp_path / "cut.tar"))


def test_not_a_tar_and_empty(tmp_path):
    (tmp_path / "x.tar").write_bytes(os.urandom(2048))
    with pytest.raises(ShardFormatError, match="not a tar"):
        samples_of(str(tmp_path / "x.tar"))
    (tmp_path / "e.tar").write_bytes(b"")
    with pytest.raises(ShardFormatError, match="empty shard"):
        samples_of(str(tmp_path / "e.tar"))


def test_duplicate_keys_and_extensions(tmp_path):
    path = write_tar(str(tmp_path / "d.tar"), [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    with pytest.raises(SampleError, match="duplicate sample key") as e:
        samples_of(path)
    assert "a.cls" in str(e.value)
    path = write_tar(str(tmp_path / "e.tar"), [("a.jpg", b"1"), ("a.jpg", b"2")])
    with pytest.raises(SampleError, match="appears twice"):
        samples_of(path)


def test_member_larger_than_limit_is_refused(tmp_path):
    path = write_tar(str(tmp_path / "big.tar"), [("a.jpg", bytes(5000))])
    with pytest.raises(SampleError, match="exceeds the limit") as e:
        samples_of(path, max_member_bytes=4096)
    assert "a.jpg" in str(e.value)


def test_members_header_offsets(tmp_path):
    path = write_tar(str(tmp_path / "t.tar"), [("a.jpg", bytes(10)), ("b.jpg", bytes(600))])
    with open(path, "rb") as f:
        offsets = [s["__offset__"] for s in iter_samples(f, path)]
    assert offsets == [0, 1024]


@pytest.mark.parametrize("damaged", [0, 3, 5])
@pytest.mark.parametrize("start", ["shard", "sample before", "the sample"])
@pytest.mark.parametrize("field", ["magic", "checksum"])
def test_a_damaged_header_is_damage_wherever_the_read_starts(tmp_path, damaged, start, field):
    """A damaged member header is a damaged shard (``bad_tar``, its offset in the shard named)
    whether the read starts at the shard's start, at an earlier sample's offset, or at that very
    header (a part, a resume, a share's fallback start at a sample's offset); only a shard whose
    own first header is no tar header is ``not_tar``."""
    path = write_tar(str(tmp_path / "s.tar"), [(f"k{i}.bin", bytes([i]) * 700) for i in range(8)])
    with tarfile.open(path) as tar:
        at = [m.offset for m in tar.getmembers()]
    where = at[damaged] + (257 if field == "magic" else 148)  # the ustar magic, or the checksum field
    with open(path, "r+b") as f:
        f.seek(where)
        f.write(b"xxxxx")
    begin = {"shard": 0, "sample before": at[max(0, damaged - 2)], "the sample": at[damaged]}[start]
    with pytest.raises(ShardFormatError) as e, open_shard(path, begin) as f:
        list(iter_samples(f, path))
    if damaged == 0 and begin == 0:
        assert e.value.reason == "not_tar"
    else:
        assert e.value.reason == "bad_tar" and f"offset {at[damaged]}" in str(e.value)


@pytest.mark.parametrize("cut", ["at the sample", "inside its header"])
@pytest.mark.parametrize("start", ["shard", "sample before", "the sample"])
def test_a_shard_cut_short_is_truncated_wherever_the_read_starts(tmp_path, cut, start):
    """A shard whose bytes end at a sample, or inside its header, is a truncated shard wherever
    the read starts (a part, a resume, a share's fallback start at a sample's offset): never an
    empty shard or no tar, which only a shard read from its start can be."""
    path = write_tar(str(tmp_path / "s.tar"), [(f"k{i}.bin", bytes([i]) * 700) for i in range(8)])
    with tarfile.open(path) as tar:
        at = [m.offset for m in tar.getmembers()]
    with open(path, "r+b") as f:
        f.truncate(at[5] + (0 if cut == "at the sample" else 100))
    begin = {"shard": 0, "sample before": at[3], "the sample": at[5]}[start]
    with pytest.raises(ShardFormatError) as e, open_shard(path, begin) as f:
        list(iter_samples(f, path))
    assert e.value.reason == "truncated", str(e.value)
    assert "offset 0" not in str(e.value)
