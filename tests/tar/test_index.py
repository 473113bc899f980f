"""The scan's header index (:mod:`dalistream.tar.index`, read by :func:`manifest.scan.scan_shard`)
against two references on archives real tools write, odd ones, and damaged ones:

- the sequential tar reader (:func:`dalistream.tar.iter_samples`, what every worker reads with):
  the same sample count and offsets, or the same error (type, reason, member, message);
- Python's ``tarfile``: the member layout of a regular shard worked out from its members
  (offsets, sizes, names, type flags and magic read from their own headers), or none.

Every archive is scanned from a local file (read through its mapping) and as a stream (a
``pipe:`` shard: read once, in pieces), with and without ``lowercase_ext``."""

import gzip
import io
import random
import shutil
import tarfile

import numpy as np
import pytest

from dalistream.errors import DalistreamError
from dalistream.io.gunzip import decompressed
from dalistream.io.streams import open_raw
from dalistream.manifest.scan import scan_shard
from dalistream.tar import iter_samples
from dalistream.tar.headers import header_name
from dalistream.tar.samples import is_meta, split_name
from tests.tar.test_differential import SAMPLES, SHORT, WRITERS

BLOCK = 512


def by_reader(url, lowercase):
    """``(count, offsets)`` as the sequential reader finds them, or its error."""
    try:
        with decompressed(open_raw(url), url) as stream:
            starts = [s["__offset__"] for s in iter_samples(stream, url, keep=lambda i: False, lowercase=lowercase)]
        return len(starts), tuple(starts)
    except DalistreamError as e:
        return e


def by_tarfile(path):
    """The member layout of a regular shard, as the scan must record it, worked out from
    ``tarfile``'s members: every member a plain file (type ``0``, NUL or ``7``, not sparse) named by
    its own header (no long-name or pax ``path`` record), which has the ``ustar`` magic; a sample a
    run of adjacent members of one key, each with a non-empty extension; ``None`` otherwise."""
    raw = open(path, "rb").read()
    with tarfile.open(path) as t:
        members = t.getmembers()
        end = t.offset
    if not members:
        return None
    table, kinds, sizes = {}, [], []
    key, exts, heads = None, [], []
    for i, m in enumerate(members):
        own = raw[m.offset_data - BLOCK:m.offset_data]
        following = members[i + 1].offset if i + 1 < len(members) else end
        renamed = header_name(own) != m.name or "path" in m.pax_headers  # (a pax path: even one that repeats it)
        if (own[156] not in b"0\x007" or m.issparse() or own[257:262] != b"ustar" or renamed
                or following != m.offset_data + (m.size + BLOCK - 1) // BLOCK * BLOCK):
            return None
        k, ext = split_name(m.name)
        if not ext or is_meta(m.name):
            return None
        if k != key:
            if key is not None:
                kinds.append(table.setdefault((tuple(exts), tuple(heads)), len(table)))
            key, exts, heads = k, [], []
        if ext in exts:
            return None
        exts.append(ext)
        heads.append((m.offset_data - m.offset) // BLOCK)
        sizes.append(m.size)
    kinds.append(table.setdefault((tuple(exts), tuple(heads)), len(table)))
    return tuple(table), tuple(kinds), tuple(sizes)


def scanned(url, lowercase):
    try:
        return scan_shard(url, lowercase=lowercase, offsets=True)
    except DalistreamError as e:
        return e


def same_error(got, expected):
    assert isinstance(got, DalistreamError), f"the scan found nothing amiss, the reader raised {expected!r}"
    assert (type(got), got.reason, got.member, str(got)) == (type(expected), expected.reason, expected.member,
                                                               str(expected))


def check(path, layout=True):
    """The scan of ``path`` (a local file, and a ``pipe:`` stream) against the references."""
    gzipped = open(path, "rb").read(2) == b"\x1f\x8b"
    for lowercase in (False, True):
        for url in (path, f"pipe:cat {path}"):
            expected = by_reader(url, lowercase)
            got = scanned(url, lowercase)
            if isinstance(expected, Exception):
                same_error(got, expected)
                continue
            assert not isinstance(got, Exception), (url, got)
            count, starts = expected
            assert got.samples == count
            assert got.offsets == (starts if not gzipped or url.endswith(".gz") else None), url
            if layout and not gzipped:
                assert got.members == by_tarfile(path), url
            elif gzipped:
                assert got.members is None


# -- archives real tools write ---------------------------------------------------------------

@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_s_archive(tmp_path, writer):
    write, filename, samples = WRITERS[writer]
    path = str(tmp_path / filename)
    write(path, samples)
    check(path)


def _tar(path, entries, fmt=tarfile.PAX_FORMAT):
    """``entries``: ``(name, bytes)`` files, or ``(name, None, tarfile type, linkname)`` others."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry[0])
            info.mtime = 1700000000
            if entry[1] is None:
                info.type, info.linkname = entry[2], entry[3]
                tar.addfile(info)
            else:
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
    return path


ODD = {
    "folders and links": [("d", None, tarfile.DIRTYPE, ""), ("d/a.jpg", b"x" * 700), ("d/a.cls", b"1"),
                          ("d/a.lnk", None, tarfile.SYMTYPE, "d/a.jpg"), ("d/b.jpg", None, tarfile.LNKTYPE, "d/a.jpg"),
                          ("d/c.jpg", b"y"), ("fifo.x", None, tarfile.FIFOTYPE, "")],
    "no dot, hidden, trailing dot, meta": [("README", b"r"), ("a.jpg", b"a"), ("a.", b"t"), (".hidden", b"h"),
                                           ("x/.DS_Store", b"d"), ("__info__/x.json", b"{}"), ("b.jpg", b"b"),
                                           ("__index__", b"i")],
    "meta only": [("__info__/x.json", b"{}")],
    "no sample at all": [("README", b"r"), ("d", None, tarfile.DIRTYPE, "")],
    "empty members, block edges": [(f"k{i}.{e}", bytes(n)) for i, n in enumerate([0, 1, 511, 512, 513, 1024])
                                   for e in ("a", "b")],
    "different members per sample": [("k0.jpg", b"1"), ("k0.cls", b"2"), ("k1.png", b"3"), ("k2.jpg", b"4"),
                                     ("k2.cls", b"5"), ("k2.txt", b"6"), ("k3.jpg", b"7")],
    "case of extensions": [("k0.JPG", b"1"), ("k0.cls", b"2"), ("k1.jpg", b"3")],
    "case twice": [("k0.JPG", b"1"), ("k0.jpg", b"2")],
    "long and non-ASCII names": [("d" * 150 + "/k0.jpg", b"1"), ("d" * 150 + "/k0.cls", b"2"),
                                 ("caf\u00e9/k1.jpg", b"3"), ("\u65e5/" + "e" * 120 + ".jpg", b"4")],
    "names with dots in folders": [("a.b/c.seg.json", b"1"), ("a.b/c.jpg", b"2"), ("a.b/d.jpg", b"3")],
    "non-UTF-8 name bytes": [("caf\udce9.jpg", b"1"), ("caf\udce9.cls", b"2")],
    "a key again, apart": [("k0.jpg", b"1"), ("k1.jpg", b"2"), ("k0.cls", b"3")],
    "an extension twice": [("k0.jpg", b"1"), ("k0.jpg", b"2")],
}


@pytest.mark.parametrize("fmt", ["GNU", "PAX", "USTAR"])
@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_archives(tmp_path, case, fmt):
    entries = ODD[case]
    try:
        path = _tar(str(tmp_path / "odd.tar"), entries, getattr(tarfile, f"{fmt}_FORMAT"))
    except (ValueError, UnicodeError):
        pytest.skip(f"{fmt} cannot hold these names")
    check(path)
    gz = str(tmp_path / "odd.tar.gz")
    with open(path, "rb") as f, open(gz, "wb") as out:
        out.write(gzip.compress(f.read()))
    check(gz)


def test_a_ustar_prefix_and_a_name_field_with_bytes_after_its_nul(tmp_path):
    """A name split into the ustar prefix; a name field whose bytes after the NUL are not zeros
    (the name ends at the NUL): both read as the sequential reader reads them."""
    path = _tar(str(tmp_path / "u.tar"), [("p" * 120 + "/k0.jpg", b"1"), ("k1.jpg", b"2"), ("k1.cls", b"3"),
                                          ("q" * 120 + "/k0.jpg", b"4")], tarfile.USTAR_FORMAT)
    raw = bytearray(open(path, "rb").read())
    second = 512 + 512  # the second member's header
    raw[second + 7:second + 20] = b"\0garbage-tail"
    _fix_checksum(raw, second)
    open(path, "wb").write(bytes(raw))
    check(path)
    assert scan_shard(path, offsets=True).samples == 3  # (two keys apart only in their prefixes)


# -- damage -----------------------------------------------------------------------------------

def _fix_checksum(raw, at):
    raw[at + 148:at + 156] = b" " * 8
    raw[at + 148:at + 156] = b"%06o\0 " % sum(raw[at:at + BLOCK])


def _headers(raw):
    """Offsets of every header block (extended ones included) of a whole archive, and of its end
    marker last."""
    out, pos = [], 0
    while pos + BLOCK <= len(raw) and raw[pos:pos + BLOCK] != bytes(BLOCK):
        out.append(pos)
        size = int(raw[pos + 124:pos + 135].decode() or "0", 8)
        pos += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    return out + [pos]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A PAX archive (pax headers for long and non-ASCII names) and a TarWriter one (a pax header
    before every member), as bytes."""
    folder = tmp_path_factory.mktemp("base")
    pax = str(folder / "pax.tar")
    WRITERS["tarfile-pax"][0](pax, SAMPLES)
    wds = str(folder / "wds.tar")
    WRITERS["tarwriter"][0](wds, SHORT)
    return {"pax": open(pax, "rb").read(), "tarwriter": open(wds, "rb").read()}


def _field(raw, at, start, value):
    raw[at + start:at + start + len(value)] = value
    _fix_checksum(raw, at)


DAMAGE = {
    "empty": lambda raw, h: bytearray(),
    "not a tar": lambda raw, h: bytearray(b"<html>not found</html>\n" * 50),
    "cut in the first header": lambda raw, h: raw[:300],
    "cut in a later header": lambda raw, h: raw[:h[3] + 200],
    "cut in member data": lambda raw, h: raw[:h[3] + 600],
    "cut in the padding": lambda raw, h: raw[:h[-1] - 1],
    "no end marker": lambda raw, h: raw[:h[-1]],
    "cut in the end marker": lambda raw, h: raw[:h[-1] + 700],
    "a checksum wrong": lambda raw, h: raw[:h[2] + 150] + bytes([raw[h[2] + 150] ^ 1]) + raw[h[2] + 151:],
    "a name byte flipped": lambda raw, h: raw[:h[4] + 3] + bytes([raw[h[4] + 3] ^ 0x20]) + raw[h[4] + 4:],
    "a lone zero block": lambda raw, h: raw[:h[3]] + bytes(BLOCK) + raw[h[3] + BLOCK:],
    "a second archive after the end": lambda raw, h: raw + raw,
    "bytes after the end": lambda raw, h: raw + b"trailing garbage",
    "a size of 8s and 9s": lambda raw, h: _with(raw, lambda r: _field(r, h[1], 124, b"00000000089\0")),
    "a size in base-256": lambda raw, h: _with(raw, lambda r: _field(
        r, h[-2], 124, b"\x80" + int(r[h[-2] + 124:h[-2] + 135].decode(), 8).to_bytes(11, "big"))),
    "a negative base-256 size": lambda raw, h: _with(raw, lambda r: _field(r, h[1], 124, b"\xff" * 12)),
    "a size larger than the shard": lambda raw, h: _with(raw, lambda r: _field(r, h[1], 124, b"77777777777\0")),
    "a size with spaces": lambda raw, h: _with(raw, lambda r: _field(
        r, h[-2], 124, b" " + r[h[-2] + 125:h[-2] + 135] + b" \0")),
    "a size with a sign": lambda raw, h: _with(raw, lambda r: _field(r, h[-2], 124, b"+" + r[h[-2] + 125:h[-2] + 136])),
    "a checksum field with spaces": lambda raw, h: _with(raw, lambda r: _spaced_checksum(r, h[2])),
}


def _with(raw, change):
    raw = bytearray(raw)
    change(raw)
    return raw


def _spaced_checksum(raw, at):
    raw[at + 148:at + 156] = b" " * 8
    raw[at + 148:at + 156] = b"  %04o\0" % sum(raw[at:at + BLOCK]) + b" "


@pytest.mark.parametrize("archive", ["pax", "tarwriter"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_archives(tmp_path, base, archive, damage):
    raw = bytearray(base[archive])
    path = str(tmp_path / "d.tar")
    with open(path, "wb") as f:
        f.write(bytes(DAMAGE[damage](raw, _headers(raw))))
    check(path, layout=False)


PAX_DAMAGE = {
    "a pax size that is no number": b"12 size=1x\n",
    "a malformed pax record": b"99 path=x\n",
    "a pax record without =": b"10 pathx\n\n",
    "a pax path": b"16 path=zz.jpg\n\n",
    "a pax size": b"11 size=3\n\n",
    "a pax sparse map": b"22 GNU.sparse.size=0\n",
}


@pytest.mark.parametrize("case", sorted(PAX_DAMAGE))
def test_pax_records(tmp_path, base, case):
    """A TarWriter archive's first pax header rewritten (its block's checksum fixed)."""
    raw = bytearray(base["tarwriter"])
    record = PAX_DAMAGE[case]
    assert raw[156] == ord("x")
    raw[124:136] = b"%011o\0" % len(record)
    _fix_checksum(raw, 0)
    raw[BLOCK:2 * BLOCK] = record + bytes(BLOCK - len(record))
    path = str(tmp_path / "p.tar")
    open(path, "wb").write(bytes(raw))
    check(path, layout=False)


def test_an_implausible_extended_header(tmp_path):
    raw = open(_tar(str(tmp_path / "x.tar"), [("k0.jpg", b"1")]), "rb").read()
    header = bytearray(tarfile.TarInfo("././@PaxHeader").tobuf(tarfile.USTAR_FORMAT))
    header[156] = ord("x")
    header[124:136] = b"%011o\0" % (2 << 20)
    _fix_checksum(header, 0)
    path = str(tmp_path / "big.tar")
    open(path, "wb").write(bytes(header) + bytes(2 << 20) + bytes(raw))
    check(path, layout=False)


def test_gnu_sparse_members(tmp_path):
    """GNU tar's sparse files, old (``S`` with extension blocks) and pax formats: in no layout,
    counted as the reader counts them."""
    if shutil.which("tar") is None:
        pytest.skip("no GNU tar")
    import subprocess

    src = tmp_path / "src"
    src.mkdir()
    with open(src / "k0.img", "wb") as f:
        for i in range(30):  # many holes: the old format's map needs extension blocks
            f.seek(i * 65536)
            f.write(b"x" * 10)
    (src / "k0.cls").write_bytes(b"1")
    (src / "k1.cls").write_bytes(b"2")
    for fmt in ("oldgnu", "gnu", "pax"):
        path = str(tmp_path / f"{fmt}.tar")
        subprocess.run(["tar", f"--format={fmt}", "--sparse", "-cf", path, "-C", str(src), "k0.img", "k0.cls",
                        "k1.cls"], check=True, capture_output=True)
        check(path, layout=False)
        assert scan_shard(path, offsets=True).members is None


@pytest.mark.parametrize("seed", range(40))
def test_random_damage(tmp_path, base, seed):
    """Random bytes of random header blocks changed (the checksum fixed or not), or the archive cut
    anywhere: the scan agrees with the reader."""
    rng = random.Random(seed)
    raw = bytearray(base["pax" if seed % 2 else "tarwriter"])
    heads = _headers(raw)[:-1]
    for _ in range(rng.randint(1, 3)):
        what = rng.random()
        if what < 0.2:
            raw = raw[:rng.randrange(len(raw))]
            break
        at = rng.choice(heads)
        field = rng.choice([(0, 100), (124, 136), (148, 156), (156, 157), (257, 265), (345, 500), (0, 512)])
        pos = at + rng.randrange(*field)
        raw[pos] = rng.choice([0, 32, 48, 55, 56, 0x80, 0xFF, rng.randrange(256)])
        if what < 0.8:
            _fix_checksum(raw, at)
    path = str(tmp_path / "r.tar")
    open(path, "wb").write(bytes(raw))
    check(path, layout=False)
    try:
        info = scan_shard(path, offsets=True)
    except DalistreamError:
        return
    if info.members is not None:  # a layout recorded: it is tarfile's
        assert info.members == by_tarfile(path)


def test_a_big_regular_shard_is_laid_out(tmp_path):
    """Thousands of members: the layout is every member's, the offsets every sample's."""
    rng = np.random.default_rng(0)
    entries = []
    for i in range(3000):
        entries.append((f"s{i:05d}.jpg", bytes(int(rng.integers(0, 3000)))))
        if i % 3:
            entries.append((f"s{i:05d}.cls", str(i).encode()))
    path = _tar(str(tmp_path / "big.tar"), entries, tarfile.USTAR_FORMAT)
    check(path)
    info = scan_shard(path, offsets=True)
    assert info.samples == 3000 and len(info.members[2]) == len(entries) and len(info.members[0]) == 2


@pytest.mark.parametrize("writer", ["tarwriter", "tarfile-gnu", "gnu-tar-posix", "tarfile-ustar-short"])
def test_headers_read_in_batches(tmp_path, monkeypatch, writer):
    """Header blocks are checked and read a batch at a time (so that a shard's memory is not its
    headers'): batches of 3 read what one batch reads, damage in any batch found."""
    from dalistream.tar import index

    monkeypatch.setattr(index, "_BATCH", 3)
    write, filename, samples = WRITERS[writer]
    path = str(tmp_path / filename)
    write(path, samples)
    check(path)
    raw = bytearray(open(path, "rb").read())
    for at in _headers(raw)[:-1]:  # a checksum wrong in each header block in turn
        damaged = bytearray(raw)
        damaged[at + 150] ^= 1
        open(path, "wb").write(bytes(damaged))
        check(path, layout=False)
