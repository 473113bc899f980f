"""Samples cut out by the member layout are exactly the samples the header walk reads: for every
tar writer and format, mixed sample patterns, empty and large members, any part of a shard, any
extensions wanted; and a scan records a layout only where it holds."""

import gzip
import io
import os
import tarfile

import numpy as np
import pytest

from dalistream.errors import ShardFormatError
from dalistream.manifest import scan_shard
from dalistream.manifest.rows import ShardRows
from dalistream.tar.samples import sliced_samples

from helpers import by_headers, random_samples, shard, write_tarfile

def by_layout(path, info, first, stop, **kw):
    rows = ShardRows.from_infos([info])
    patterns, kinds, sizes, starts = rows.members.at(0)
    offset = info.offsets[first]
    with open(path, "rb") as f:
        f.seek(offset)
        return list(sliced_samples(f, path, patterns, kinds[first:stop], sizes[starts[first]:starts[stop]], first=first,
                                   offset=offset, last=stop == info.samples, **kw))


@pytest.mark.parametrize("writer", ["ustar", "gnu", "pax", "webdataset"])
@pytest.mark.parametrize("seed", range(4))
def test_slicing_delivers_what_the_header_walk_reads(tmp_path, writer, seed):
    path = shard(tmp_path, writer, seed)
    info = scan_shard(path, offsets=True)
    assert info.members is not None, "a regular shard has a layout"
    rng = np.random.default_rng(100 + seed)
    parts = [(0, info.samples)] + [tuple(sorted(rng.integers(0, info.samples + 1, 2))) for _ in range(6)]
    for first, stop in parts:
        for want, lowercase in ((None, False), ({"jpg", "cls"}, False), ({"png"}, True)):
            kw = dict(lowercase=lowercase, **({"want_ext": want.__contains__} if want else {}))
            expected = by_headers(path, first, stop, **kw)
            assert by_layout(path, info, first, stop, **kw) == expected


@pytest.mark.parametrize("case", ["long name", "non-ASCII name (pax path)", "folder", "symlink", "no extension", "gzip"])
def test_a_scan_records_no_layout_where_it_does_not_hold(tmp_path, case):
    path = str(tmp_path / "x.tar")
    samples = [{"__key__": f"k{i}", "jpg": b"j" * i, "cls": b"1"} for i in range(4)]
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT if case == "long name" else tarfile.PAX_FORMAT) as tar:
        for i, s in enumerate(samples):
            for ext in ("jpg", "cls"):
                name = f"{s['__key__']}.{ext}"
                if i == 2 and case == "long name":
                    name = "d" * 120 + name
                if i == 2 and case == "non-ASCII name (pax path)":
                    name = f"kë{i}.{ext}"
                info = tarfile.TarInfo(name)
                info.size = len(s[ext])
                tar.addfile(info, io.BytesIO(s[ext]))
            if i == 1 and case in ("folder", "symlink", "no extension"):
                info = tarfile.TarInfo({"folder": "k1.dir", "symlink": "k1.lnk", "no extension": "k1"}[case])
                if case == "folder":
                    info.type = tarfile.DIRTYPE
                elif case == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, "k0.jpg"
                tar.addfile(info, io.BytesIO(b""))
    if case == "gzip":
        with open(path, "rb") as f:
            data = gzip.compress(f.read())
        path += ".gz"
        with open(path, "wb") as f:
            f.write(data)
    info = scan_shard(path, offsets=True)
    assert info.samples >= 4 and info.members is None


def test_a_plain_shard_has_one_header_block_per_member_and_webdataset_three(tmp_path):
    plain = scan_shard(shard(tmp_path, "ustar", 7), offsets=True)
    wds = scan_shard(shard(tmp_path, "webdataset", 7), offsets=True)
    assert {h for _, headers in plain.members[0] for h in headers} == {1}
    assert {h for _, headers in wds.members[0] for h in headers} == {3}  # a pax header carries the mtime
    assert plain.samples == wds.samples and sum(plain.members[2]) == sum(wds.members[2])  # the same samples


def test_a_cut_shard_is_truncated_and_trailing_samples_show(tmp_path):
    path = shard(tmp_path, "ustar", 1, n=10)
    info = scan_shard(path, offsets=True)
    data = open(path, "rb").read()
    cut = str(tmp_path / "cut.tar")
    with open(cut, "wb") as f:
        f.write(data[:info.offsets[6] + 700])
    with pytest.raises(ShardFormatError) as e:
        by_layout(cut, info, 0, 10)
    assert e.value.reason == "truncated" and e.value.url == cut
    longer = str(tmp_path / "longer.tar")
    write_tarfile(longer, random_samples(1, 10) + [{"__key__": "extra", "cls": b"1"}], "ustar")
    got = by_layout(longer, info, 0, 10)
    assert len(got) == 11 and got[-1]["__index__"] == 10  # one more than counted: the reader reports it
    assert os.path.getsize(longer) > os.path.getsize(path)


@pytest.mark.parametrize("field", [b"0000xyz0000\0", b"00000000009\0", b"\xff" * 12])
def test_a_bad_size_field_names_its_header_where_the_shard_has_it(tmp_path, field):
    """A size field that is no number, read by the layout, names the tar offset of its header,
    whatever part is read and however large the reads: not a place in the reader's buffer."""
    path = shard(tmp_path, "ustar", 2, n=12)
    info = scan_shard(path, offsets=True)
    raw = bytearray(open(path, "rb").read())
    at = info.offsets[7]  # sample 7's first header
    raw[at + 124:at + 136] = field
    raw[at + 148:at + 156] = b" " * 8
    raw[at + 148:at + 156] = b"%06o\0 " % sum(raw[at:at + 512])
    bad = str(tmp_path / "bad.tar")
    with open(bad, "wb") as f:
        f.write(bytes(raw))
    for first, chunk in ((0, 1 << 20), (3, 1 << 20), (5, 8192), (0, 8192)):
        with pytest.raises(ShardFormatError) as e:
            by_layout(bad, info, first, 12, chunk=chunk)
        assert e.value.reason == "bad_tar" and e.value.url == bad
        assert f"in the header at offset {at} " in str(e.value), (first, chunk, str(e.value))
