"""Tar damage that used to pass in silence, names that are not UTF-8, sizes that lie, members that
are not files: each as the tar reader, the count scan and a worker (raise and skip) see it."""

import io
import shutil
import subprocess
import tarfile

import pytest

from dalistream.config import StreamConfig
from dalistream.errors import SampleError, ShardFormatError
from dalistream.io import open_shard
from dalistream.manifest import scan_shard, scan_tolerant
from dalistream.tar import iter_samples
from dalistream.worker import WorkerSource

from helpers import data_set, write_tar

FIELDS = {"image": "jpg", "label": "cls", "key": "__key__"}


def samples_of(path, **kw):
    with open_shard(path) as f:
        return list(iter_samples(f, path, **kw))


def members(n, start=0, image=lambda i: b"\xff\xd8\xff" + bytes([i % 256]) * 700 + b"\xff\xda\x00\xff\xd9"):
    out = []
    for i in range(start, start + n):
        out += [(f"k{i:03d}.jpg", image(i)), (f"k{i:03d}.cls", str(i % 7).encode())]
    return out


def header_offsets(path):
    with tarfile.open(path) as tar:
        return {m.name: (m.offset, m.offset_data, m.size) for m in tar.getmembers()}


def worker_run(paths, counts, fields=FIELDS, **kw):
    """Every sample of one worker without DALI: keys delivered, skips counted."""
    options = dict(sources=tuple(paths), fields=fields, batch_size=1, workers=1, policy="exact", shuffle_shards=False)
    options.update(kw)
    source = WorkerSource(StreamConfig(**options), data_set(paths, counts), 0)
    keys = []
    for *values, valid in source.epoch_batches(0):
        if int(valid[0]):
            keys.append(bytes(values[-1][0]))
    return keys, dict(source._stats.skipped)


def damage(path, out, at, data):
    raw = bytearray(open(path, "rb").read())
    raw[at:at + len(data)] = data
    with open(out, "wb") as f:
        f.write(bytes(raw))
    return out


# -- 1. a zero block where a header should be -------------------------------------------------

@pytest.mark.parametrize("variant", ["zero header before a valid header", "two zero blocks then data",
                                     "zero header before member data"])
def test_a_lone_zero_block_mid_shard_is_damage_under_raise_and_skip(tmp_path, variant):
    items = members(3) + [("k003.txt", b"")] + members(3, start=4)  # k003.txt: a member with no data block
    good = write_tar(str(tmp_path / "good.tar"), items)
    table = header_offsets(good)
    # zeroed blocks name nothing they took: the sample in progress may have lost members and is
    # not delivered (k002 may have had more than its image, k003 more than its txt)
    if variant == "zero header before a valid header":  # the empty member's header: the next block is a header
        at, blocks, after = table["k003.txt"][0], 1, "member 'k004.jpg'"
        counted, whole = 2, 2
    elif variant == "two zero blocks then data":  # a label's header and its (one-block) data
        at, blocks, after = table["k002.cls"][0], 2, "member 'k003.txt'"
        counted, whole = 2, 2
    else:  # an image header: its data follow
        at, blocks, after = table["k004.jpg"][0], 1, f"data at offset {table['k004.jpg'][0] + 512}"
        counted, whole = 3, 3
    bad = damage(good, str(tmp_path / "bad-0000.tar"), at, bytes(512 * blocks))
    with pytest.raises(ShardFormatError) as e:
        samples_of(bad)
    assert e.value.reason == "bad_tar" and e.value.url == bad
    said = (f"end-of-archive marker (zero blocks) at offset {at}" if blocks == 2  # a marker, then more archive
            else f"zero block at offset {at} where a member header should be")
    assert said in str(e.value) and after in str(e.value)
    with pytest.raises(ShardFormatError, match="lone zero block" if blocks == 1 else "end-of-archive marker"):
        scan_shard(bad)
    other = write_tar(str(tmp_path / "other.tar"), members(2, start=10))
    (info, _), problems = scan_tolerant([bad, other])
    assert [p.reason for p in problems] == ["bad_tar"] and info.samples == counted
    got, skipped = worker_run([bad, other], [info.samples, 2], on_error="skip")  # the samples before it, counted
    assert got == [f"k{i:03d}".encode() for i in list(range(whole)) + [10, 11]]
    assert skipped == {"shards:bad_tar": 1, **({"samples:missing_field": 1} if whole < counted else {})}
    with pytest.raises(ShardFormatError, match="lone zero block" if blocks == 1 else "end-of-archive marker"):
        worker_run([bad], [info.samples])


@pytest.mark.parametrize("zeros", [1, 2])
@pytest.mark.parametrize("name", ["k004.jpg", "d" * 120 + "/k004.jpg", "e" * 90 + "/" + "f" * 60 + ".jpg"])
def test_the_member_after_zero_blocks_is_named_whole(tmp_path, zeros, name):
    """The member found after a lone zero block or an end-of-archive marker is named as the walk
    names it, with the ustar prefix of a long name (``prefix/name``), not its last 100 bytes."""
    good = write_tar(str(tmp_path / "good.tar"), members(3) + [(name, b"x" * 600)] + members(2, start=5))
    at = header_offsets(good)["k002.cls"][0]  # a label's header and its one data block, or the header alone
    bad = damage(good, str(tmp_path / "bad.tar"), at, bytes(512 * zeros) if zeros == 2 else bytes(512))
    if zeros == 1:  # (the label's data follow the zeroed header: zero the block with the name behind it)
        bad = damage(bad, bad, at + 512, bytes(512))
    with pytest.raises(ShardFormatError) as e:
        samples_of(bad)
    assert e.value.member == name and f"followed by member {name!r}" in str(e.value)


def test_zero_blocks_at_the_real_end_are_the_end(tmp_path):
    path = write_tar(str(tmp_path / "t.tar"), members(3))
    data = open(path, "rb").read()
    assert len(data) % 10240 == 0  # tarfile pads the archive to a whole record of zeros
    for extra in (0, 512, 10240, 700):  # more zero padding, even a length no tar block divides
        (tmp_path / "p.tar").write_bytes(data + bytes(extra))
        assert [s["__key__"] for s in samples_of(str(tmp_path / "p.tar"))] == ["k000", "k001", "k002"]
    last = max(m[1] + m[2] for m in header_offsets(path).values())
    marker = -(-last // 512) * 512
    (tmp_path / "short.tar").write_bytes(data[:marker + 1024])  # just the two-block marker
    assert len(samples_of(str(tmp_path / "short.tar"))) == 3
    (tmp_path / "lone.tar").write_bytes(data[:marker + 512])  # a lone zero block at the end: an end, as in GNU tar
    assert len(samples_of(str(tmp_path / "lone.tar"))) == 3
    (tmp_path / "junk.tar").write_bytes(data + b"junk")  # the marker, then something else
    with pytest.raises(ShardFormatError, match=f"data at offset {len(data)}"):
        samples_of(str(tmp_path / "junk.tar"))


def test_members_full_of_zeros_are_data(tmp_path):
    path = write_tar(str(tmp_path / "z.tar"), [("a.jpg", bytes(5000)), ("a.cls", b"1"), ("b.jpg", bytes(512))])
    out = samples_of(path)
    assert [s["__key__"] for s in out] == ["a", "b"] and out[0]["jpg"] == bytes(5000)


# -- 2. names that are not UTF-8 --------------------------------------------------------------

def latin1_tar(path, names, fmt=tarfile.USTAR_FORMAT):
    with tarfile.open(path, "w", format=fmt, encoding="latin-1") as tar:
        for name, data in names:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def decoded(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def test_latin1_keys_stay_as_distinct_as_their_bytes(tmp_path):
    jpg = b"\xff\xd8\xff\xda\xff\xd9"
    path = latin1_tar(str(tmp_path / "l.tar"), [("café.jpg", jpg), ("café.cls", b"1"), ("cafè.jpg", jpg + b"2"),
                                                 ("cafè.cls", b"2")])
    out = samples_of(path)
    assert [s["__key__"] for s in out] == [decoded(b"caf\xe9"), decoded(b"caf\xe8")]
    assert [s["jpg"] for s in out] == [jpg, jpg + b"2"]
    with tarfile.open(path) as tar:  # the names Python's tarfile gives (utf-8, surrogateescape) are ours
        assert [m.name for m in tar.getmembers()][::2] == [s["__key__"] + ".jpg" for s in out]
    got, skipped = worker_run([path], [2])  # the key field carries the name's own bytes
    assert got == [b"caf\xe9", b"caf\xe8"] and skipped == {}


def test_mixed_encodings_and_a_bad_extension(tmp_path):
    path = str(tmp_path / "m.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for raw, data in [(b"na\xc3\xafve.jpg", b"1"), (b"na\xefve.jpg", b"2"), (b"k.jpg", b"3"), (b"k.jp\xe9", b"4")]:
            info = tarfile.TarInfo(decoded(raw))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = samples_of(path)
    assert [s["__key__"] for s in out] == ["naïve", decoded(b"na\xefve"), "k"]
    assert out[2]["jpg"] == b"3" and out[2][decoded(b"jp\xe9")] == b"4"


def test_pax_path_with_raw_bytes(tmp_path):
    path = str(tmp_path / "p.tar")
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape") as tar:
        for raw, data in [(b"d/\xff\xfe.jpg", b"1"), (b"d/\xff\xfd.jpg", b"2")]:
            info = tarfile.TarInfo(decoded(raw))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert b"hdrcharset=BINARY" in open(path, "rb").read()  # written as raw bytes in pax path= records
    assert [s["__key__"] for s in samples_of(path)] == [decoded(b"d/\xff\xfe"), decoded(b"d/\xff\xfd")]


def test_errors_show_undecodable_bytes_escaped(tmp_path):
    path = latin1_tar(str(tmp_path / "d.tar"), [("café.jpg", b"1"), ("café.jpg", b"2")])
    with pytest.raises(SampleError) as e:
        samples_of(path)
    text = str(e.value)
    assert e.value.reason == "duplicate_member" and "'caf\\xe9'" in text and "'caf\\xe9.jpg'" in text
    assert "\\udc" not in text


# -- 3. sizes that lie -----------------------------------------------------------------------

def with_pax_size(path, value, big=6000):
    """A shard whose middle member carries a pax ``size`` record of ``value`` (raw text)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members(2) + [("k002.jpg", b"\xff" * big)] + members(3, start=3):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if name == "k002.jpg":
                info.pax_headers = {"size": value}
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("value", ["-1", "-5", "-100000", "12abc", "0x10", "1_000", "", "99999999999999"])
def test_a_pax_size_that_is_negative_not_a_number_or_beyond_the_shard_is_bad_tar(tmp_path, value):
    path = with_pax_size(str(tmp_path / "x-0000.tar"), value)
    for run in (lambda: samples_of(path), lambda: scan_shard(path), lambda: worker_run([path], [6])):
        with pytest.raises(ShardFormatError) as e:
            run()
        assert (e.value.reason, e.value.url, e.value.member) == ("bad_tar", path, "k002.jpg"), str(e.value)
        assert "size" in str(e.value)
    (info, _), problems = scan_tolerant([path, write_tar(str(tmp_path / "good.tar"), members(2))])
    # the bad header names k002.jpg: k001 was whole before it, and is delivered
    assert info.samples == 2 and [p.reason for p in problems] == ["bad_tar"]
    got, skipped = worker_run([path, str(tmp_path / "good.tar")], [info.samples, 2], on_error="skip")
    assert got == [b"k000", b"k001", b"k000", b"k001"] and skipped == {"shards:bad_tar": 1}


def test_a_pax_size_beyond_an_unsized_stream_is_refused_unread(tmp_path):
    """Without a known stream size, a huge size is still never read: max_member_bytes refuses it."""
    data = open(with_pax_size(str(tmp_path / "h.tar"), str(10 << 30)), "rb").read()
    stream = io.BufferedReader(io.BytesIO(data))
    stream.seekable = lambda: False
    with pytest.raises(SampleError, match="exceeds the limit"):
        list(iter_samples(stream, "mem"))


def patched_header(info, fmt, offset, field):
    """``info``'s header with bytes at ``offset`` replaced and the checksum made right again."""
    header = bytearray(info.tobuf(format=fmt)[-512:] if fmt != tarfile.GNU_FORMAT else info.tobuf(format=fmt))
    header[offset:offset + len(field)] = field
    header[148:156] = b"        "
    header[148:156] = b"%06o\0" % sum(header) + b" "
    return bytes(header[:512])


@pytest.mark.parametrize("field", [b"-0000000005\0", b"00000000zz1\0", b"\xff" * 12, b"\x81" + bytes(11)])
def test_a_ustar_size_that_is_negative_or_not_octal_is_bad_tar(tmp_path, field):
    info = tarfile.TarInfo("k001.jpg")
    info.size = 5
    header = patched_header(info, tarfile.USTAR_FORMAT, 124, field)
    raw = open(write_tar(str(tmp_path / "a.tar"), members(1)), "rb").read()
    first = max(d + -(-z // 512) * 512 for _, d, z in header_offsets(str(tmp_path / "a.tar")).values())  # after k000
    path = tmp_path / "b.tar"
    path.write_bytes(raw[:first] + header + b"hello".ljust(512, b"\0") + bytes(10240))
    with pytest.raises(ShardFormatError) as e:
        samples_of(str(path))
    assert e.value.reason == "bad_tar" and "size field" in str(e.value) and f"offset {first}" in str(e.value)
    with pytest.raises(ShardFormatError, match="size field"):
        scan_shard(str(path))


# -- 4. members that are not files ------------------------------------------------------------

def linked_tar(path, kind):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members(1):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for ext in ("jpg", "cls"):
            info = tarfile.TarInfo(f"k001.{ext}")
            info.type = kind
            info.linkname = f"k000.{ext}"
            tar.addfile(info)
        for name, data in members(1, start=2):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
def test_a_sample_of_links_only_is_no_sample_as_in_webdataset(tmp_path, kind):
    """Links, devices and fifos are in no sample (webdataset, Python's tarfile and DALI's reader
    pass over them): a sample made only of them does not exist, for the count and the worker alike."""
    path = linked_tar(str(tmp_path / "l.tar"), kind)
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples_of(path)] == [
        ("k000", ["cls", "jpg"]), ("k002", ["cls", "jpg"])]
    assert scan_shard(path).samples == 2  # counted, as the worker sees it
    assert worker_run([path], [2]) == ([b"k000", b"k002"], {})
    import webdataset as wds
    assert [s["__key__"] for s in wds.WebDataset(path, shardshuffle=False)] == ["k000", "k002"]


def gnu_sparse_tar(tmp_path, fmt):
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is needed to write sparse members")
    d = tmp_path / f"src-{fmt}"
    d.mkdir()
    (d / "a.jpg").write_bytes(b"\xff\xd8\xff\xda\xff\xd9")
    (d / "a.cls").write_bytes(b"1")
    with open(d / "s.bin", "wb") as f:
        f.truncate(2 << 20)
        f.seek(1 << 20)
        f.write(b"hello")
    (d / "s.cls").write_bytes(b"2")
    (d / "z.jpg").write_bytes(b"\xff\xd8\xff\xda\xff\xd9")
    (d / "z.cls").write_bytes(b"3")
    path = str(tmp_path / f"sparse-{fmt}.tar")
    subprocess.run(["tar", f"--format={fmt}", "-S", "-cf", path, "-C", str(d), "a.jpg", "a.cls", "s.bin", "s.cls",
                    "z.jpg", "z.cls"], check=True)
    with tarfile.open(path) as tar:
        if not tar.getmember("s.bin").issparse():
            pytest.skip("this file system keeps no holes: tar wrote no sparse member")
    return path


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_a_gnu_sparse_member_is_unsupported_not_damage(tmp_path, fmt):
    path = gnu_sparse_tar(tmp_path, fmt)
    with pytest.raises(SampleError) as e:
        samples_of(path)
    assert (e.value.reason, e.value.member) == ("unsupported_member", "s.bin")
    assert "unsupported member type" in str(e.value) and "GNU sparse" in str(e.value)
    out = samples_of(path, mark_errors=True)  # the rest of the shard goes on
    assert [s["__key__"] for s in out] == ["a", "s", "z"] and out[2]["cls"] == b"3"
    assert out[1]["__error__"].reason == "unsupported_member"
    assert [s["__key__"] for s in samples_of(path, want_ext=lambda e: e != "bin")] == ["a", "s", "z"]
    assert scan_shard(path).samples == 3
    fields = {"bin": "bin", "label": "cls", "key": "__key__"}
    with pytest.raises(SampleError, match="unsupported member type"):
        worker_run([path], [3], fields=fields, missing="empty")
    assert worker_run([path], [3], fields=fields, on_error="skip", missing="empty") == (
        [b"a", b"z"], {"samples:unsupported_member": 1})
    assert worker_run([path], [3], fields={"label": "cls", "key": "__key__"}) == ([b"a", b"s", b"z"], {})


# -- every complete sample before damage arrives under skip (issue #23) ---------------------------

def _flip_checksum(raw, at):
    raw[at + 148:at + 156] = b"0000000\0"  # a header whose checksum no longer adds up; its name still reads


def _cut_header(raw, at):
    del raw[at + 300:]  # the stream ends inside a header, after its name field


def _zero_header(raw, at):
    raw[at:at + 512] = bytes(512)


@pytest.mark.parametrize("damage", [_flip_checksum, _cut_header, _zero_header])
@pytest.mark.parametrize("member", ["k003.jpg", "k003.cls", "k001.jpg"])
def test_the_last_complete_sample_before_damage_arrives_under_skip(tmp_path, damage, member):
    """Damage at a header: the sample before it arrives when it is known whole -- the damaged (or
    cut) header still names a member of another sample. When the header names a member of the
    sample being read (k003.cls after k003.jpg), or names nothing (zeroed), that sample may have
    lost members and is not delivered: never a sample with a member lost to damage."""
    good = write_tar(str(tmp_path / "good.tar"), members(5))
    at = header_offsets(good)[member][0]
    raw = bytearray(open(good, "rb").read())
    damage(raw, at)
    bad = str(tmp_path / "bad-0000.tar")
    open(bad, "wb").write(bytes(raw))
    other = write_tar(str(tmp_path / "other.tar"), members(2, start=10))
    whole = {  # samples known whole before the damage
        ("k003.jpg", True): 3, ("k003.jpg", False): 2,   # k002 is whole if the header says k003 came next
        ("k003.cls", True): 3, ("k003.cls", False): 3,   # k003 lost its label: k000-k002 either way
        ("k001.jpg", True): 1, ("k001.jpg", False): 0,
    }[member, damage is not _zero_header]
    (info, _), problems = scan_tolerant([bad, other])
    assert info.samples == whole and len(problems) == 1
    got, skipped = worker_run([bad, other], [info.samples, 2], on_error="skip")
    assert got == [f"k{i:03d}".encode() for i in list(range(whole)) + [10, 11]]
    assert len(skipped) == 1 and next(iter(skipped)).startswith("shards:") and sum(skipped.values()) == 1
