"""Real tools' archives, read by dalistream and by webdataset (the reference reader): the same
samples -- keys, extensions, bytes, order -- or a named error before the first batch.

Writers: GNU tar in every ``--format`` it has, Python's ``tarfile`` (GNU, PAX, USTAR), webdataset's
``TarWriter``, ``git archive``, gzip by name (``.tar.gz``) and by content only (gzip bytes named
``.tar``). Readers: dalistream's header walk; its worker reading by headers, by every sample's
offset and by the member layout, with the counts from a header scan, from dalistream's manifest,
from a wids index and from DALI's own ``wds2idx`` files, with 1 and 3 workers each owning a part;
and (slow) a DALI pipeline. The documented refusals are at the end.
"""

import gzip
import io
import json
import os
import random
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

import dalistream
from dalistream.errors import ShardFormatError
from dalistream.io import open_shard
from dalistream.manifest import build_manifest
from dalistream.manifest.files import write_manifest
from dalistream.tar import iter_samples
from dalistream.worker import WorkerSource

wds = pytest.importorskip("webdataset")

EXTS = ("jpg", "cls", "txt", "seg.json")  # what the samples below are made of (lowercased)


def _jpeg(rng, n):  # what the worker's cheap image check accepts: start, a scan, an end marker
    return b"\xff\xd8\xff\xda" + rng.randbytes(n) + b"\xff\xd9"


def make_samples(seed=0):
    """``[(key, [(ext as written, bytes), ...]), ...]``: keys in folders with dots, non-ASCII, one
    long enough to need a long-name (or split ustar) header, members of 0, 511, 512 and 513 bytes,
    an upper-case extension, a double extension, samples with different members."""
    rng = random.Random(seed)
    keys = ["k000", "a.b/k001", "caf\u00e9/na\u00efve002", "d" * 110 + "/k003", "k004", "x/y/z005", "k006",
            "k007", "\u65e5\u672c/k008", "k009"]
    out = []
    for i, key in enumerate(keys):
        members = [("jpg" if i != 6 else "JPG", _jpeg(rng, [0, 505, 506, 507, 3000][i % 5])), ("cls", str(i).encode())]
        if i % 3 == 0:
            members.append(("txt", b"" if i == 3 else f"caption {i}".encode()))
        if i % 4 == 1:
            members.append(("seg.json", json.dumps({"i": i, "pad": "x" * (i * 40)}).encode()))
        out.append((key, members))
    return out


SAMPLES = make_samples()
MEDIUM = [(k, m) for k, m in SAMPLES if all(len(f"{k}.{e}".encode()) < 100 for e, _ in m)]  # no long names
SHORT = [(k, m) for k, m in MEDIUM if k.isascii()]  # nor names in pax headers


def member_names(samples):
    return [(f"{key}.{ext}", data) for key, members in samples for ext, data in members]


def _tarfile(fmt):
    def write(path, samples):
        with tarfile.open(path, "w", format=fmt) as tar:
            for name, data in member_names(samples):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1700000000
                tar.addfile(info, io.BytesIO(data))
    return write


def _gnu_tar(fmt):
    def write(path, samples):
        src = path + ".src"
        names = []
        for name, data in member_names(samples):
            os.makedirs(os.path.join(src, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(src, name), "wb") as f:
                f.write(data)
            names.append(name)
        subprocess.run(["tar", f"--format={fmt}", "--no-recursion", "-cf", path, "-C", src, *names], check=True,
                       capture_output=True)
        shutil.rmtree(src)
    return write


def _tarwriter(path, samples):
    with wds.TarWriter(path) as sink:
        for key, members in samples:
            sink.write({"__key__": key, **{ext: data for ext, data in members}})


def _git_archive(path, samples):
    src = path + ".git-src"
    os.makedirs(src)
    for name, data in member_names(samples):
        os.makedirs(os.path.join(src, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
    git = ["git", "-C", src, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "core.quotepath=off"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "data"]):
        subprocess.run(git + args, check=True, capture_output=True)
    with open(path, "wb") as f:  # a pax global header (the commit id), folder entries, members in path order
        subprocess.run(git + ["archive", "--format=tar", "HEAD"], check=True, stdout=f)
    shutil.rmtree(src)


def _gzipped(inner):
    def write(path, samples):
        inner(path + ".plain", samples)
        with open(path + ".plain", "rb") as f, open(path, "wb") as out:
            out.write(gzip.compress(f.read()))
        os.remove(path + ".plain")
    return write


def _gnu_formats():
    if shutil.which("tar") is None:
        return []
    text = subprocess.run(["tar", "--help"], capture_output=True, text=True).stdout
    return [f for f in ("gnu", "oldgnu", "pax", "posix", "ustar", "v7") if f"  {f} " in text or f"\n    {f}" in text]


# name -> (writer, file name, the samples it can hold)
WRITERS = {
    "tarfile-gnu": (_tarfile(tarfile.GNU_FORMAT), "t.tar", SAMPLES),
    "tarfile-pax": (_tarfile(tarfile.PAX_FORMAT), "t.tar", SAMPLES),
    "tarfile-ustar": (_tarfile(tarfile.USTAR_FORMAT), "t.tar", SAMPLES),
    "tarwriter": (_tarwriter, "t.tar", SAMPLES),
    "gzip-by-name": (_gzipped(_tarfile(tarfile.PAX_FORMAT)), "t.tar.gz", SAMPLES),
    "gzip-by-content": (_gzipped(_tarfile(tarfile.GNU_FORMAT)), "t.tar", SAMPLES),
    **{f"gnu-tar-{f}": (_gnu_tar(f), "t.tar", SHORT if f == "v7" else SAMPLES) for f in _gnu_formats()},
}
# the same with short ASCII names only (no long-name or pax path headers): shards with a member layout
WRITERS.update({f"{name}-short": (write, filename, SHORT) for name, (write, filename, _) in list(WRITERS.items())
                if name in ("tarfile-gnu", "tarfile-ustar", "tarwriter", "gnu-tar-gnu", "gnu-tar-ustar",
                            "gnu-tar-posix", "gnu-tar-v7")})
# non-ASCII names under 100 bytes: in pax path headers (tarfile PAX, TarWriter), raw UTF-8 in GNU's
WRITERS.update({f"{name}-medium": (write, filename, MEDIUM) for name, (write, filename, _) in list(WRITERS.items())
                if name in ("tarfile-pax", "tarfile-gnu", "tarwriter", "gnu-tar-posix")})
if shutil.which("git"):
    WRITERS["git-archive"] = (_git_archive, "t.tar", SAMPLES)


def test_gnu_tar_has_every_format_it_is_asked_for():
    """The suite writes every format GNU tar has here; say so loudly when one is missing."""
    if shutil.which("tar") is None:
        pytest.skip("no GNU tar on this machine: its formats are not tested")
    assert set(_gnu_formats()) == {"gnu", "oldgnu", "pax", "posix", "ustar", "v7"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """One shard per writer, written once for the module: ``{writer: path}``."""
    out = {}
    for name, (write, filename, samples) in WRITERS.items():
        folder = tmp_path_factory.mktemp(name)
        path = str(folder / filename)
        write(path, samples)
        out[name] = path
    return out


def by_webdataset(path):
    """``[(key, {ext: bytes})]`` as webdataset reads the shard (extensions lowercased, its default)."""
    return [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
            for s in wds.WebDataset(path, shardshuffle=False)]


def by_header_walk(path):
    with open_shard(path) as f:
        return [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
                for s in iter_samples(f, path, lowercase=True)]


FIELDS = {"key": "__key__", **{e.replace(".", "_"): {"exts": e, "kind": "bytes"} for e in EXTS}}


def by_workers(stream):
    """Every worker of one rank through its whole epoch (no DALI): the samples in epoch order."""
    config = stream.config
    out = []
    for w in range(config.workers):
        source = WorkerSource(config, stream.data, w)
        lo = config.layout.slot_offsets[w]
        hi = lo + config.layout.slots[w]
        for *values, valid in source.epoch_batches(0):
            for i in range(lo, hi):
                if int(valid[i]):
                    row = {name: bytes(np.asarray(v[i])) for name, v in zip(FIELDS, values)}
                    key = row.pop("key").decode("utf-8", "surrogateescape")
                    out.append((key, {e: row[e.replace(".", "_")] for e in EXTS if row[e.replace(".", "_")]}))
    return out


def reference(path, nonempty=True):
    """webdataset's samples; ``nonempty``: without empty members, which a worker's field with
    ``missing="empty"`` cannot tell from missing ones (the header walk is compared whole)."""
    return [(k, {e: v for e, v in s.items() if v or not nonempty}) for k, s in by_webdataset(path)]


def open_stream(path, workers, tmp_path, **kw):
    return dalistream.Stream.open(path, fields=FIELDS, batch_size=workers, workers=workers, policy="exact",
                                  device="cpu", lowercase_ext=True, missing="empty",
                                  cache_dir=str(tmp_path / "cache"), **kw)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_header_walk_reads_what_webdataset_reads(shards, writer):
    expected = reference(shards[writer], nonempty=False)
    assert len(expected) == len(WRITERS[writer][2])  # webdataset itself sees every sample written
    assert by_header_walk(shards[writer]) == expected


@pytest.mark.parametrize("workers", [1, 3, "one sample each"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_workers_read_what_webdataset_reads_by_scan_offsets_and_layout(shards, writer, workers, tmp_path):
    """Counts, offsets and member layouts from a header scan; every worker's part read by layout
    where the shard has one, else from its first sample's offset, else by skipping headers. With
    one sample per worker, a part starts at every sample of the shard."""
    path = shards[writer]
    expected = reference(path)
    stream = open_stream(path, len(expected) if workers == "one sample each" else workers, tmp_path)
    info, = build_manifest([path], offsets=True, lowercase=True)
    if writer.endswith("-short") and writer != "gnu-tar-v7-short":
        assert info.members is not None  # short ASCII names behind ustar headers: cut out by layout
    if "v7" in writer:
        assert info.members is None  # an old-format header carries no ustar magic: read by header walk
    if writer.startswith("gzip"):
        assert info.members is None and (info.offsets is None) == (writer == "gzip-by-content")
    assert by_workers(stream) == expected


@pytest.mark.parametrize("kind", ["dalistream", "wids", "wds2idx"])
@pytest.mark.parametrize("writer", ["tarfile-gnu", "tarfile-pax", "tarwriter", "gnu-tar-posix", "gnu-tar-gnu",
                                    "gzip-by-content", "tarfile-pax-medium", "tarfile-gnu-medium", "tarwriter-medium",
                                    "gnu-tar-posix-medium", "tarfile-gnu-short", "tarwriter-short"])
def test_workers_read_what_webdataset_reads_with_each_manifest_format(shards, writer, kind, tmp_path):
    if writer not in shards:
        pytest.skip(f"{writer} is not available here")
    if kind == "wds2idx" and writer.startswith("gzip"):
        pytest.skip("wds2idx indexes uncompressed tars only")
    path = shards[writer]
    expected = reference(path)
    folder = tmp_path / "index"
    folder.mkdir()
    if kind == "dalistream":
        manifest = str(folder / "m.json")
        write_manifest(build_manifest([path], offsets=True), manifest)
    elif kind == "wids":
        manifest = str(folder / "w.json")
        with open(manifest, "w") as f:
            json.dump({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [
                {"url": path, "nsamples": len(expected), "filesize": os.path.getsize(path)}]}, f)
    else:
        from wds2idx import IndexCreator  # DALI's own tool, installed with nvidia-dali

        manifest = str(folder / "t.idx")
        with IndexCreator(path, manifest, verbose=False) as creator:
            creator.create_index()
    for workers in (1, 3, len(expected)):  # the last: a part starts at every sample
        stream = open_stream(path, workers, tmp_path, manifest=manifest)
        assert by_workers(stream) == expected, (kind, workers)


# -- what dalistream refuses that webdataset accepts (README: "What dalistream refuses") ------------

def _cat(tmp_path, parts):
    path = str(tmp_path / "cat.tar")
    with open(path, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                out.write(f.read())
    return path


@pytest.mark.parametrize("tail", ["second archive", "junk", "second archive, gzip"])
def test_data_after_the_end_marker_is_refused_before_the_first_batch(shards, tmp_path, tail):
    """tar and webdataset stop at the first end-of-archive marker, silently dropping a second
    archive appended to the first (``cat a.tar b.tar``): dalistream names it at Stream.open."""
    first = shards["tarfile-pax"]
    if tail == "junk":
        extra = str(tmp_path / "junk")
        with open(extra, "wb") as f:
            f.write(b"trailing bytes that are no tar" * 20)
    else:
        extra = str(tmp_path / "b.tar")
        _tarfile(tarfile.GNU_FORMAT)(extra, make_samples(seed=1)[:2])
    path = _cat(tmp_path, [first, extra])
    if tail.endswith("gzip"):
        with open(path, "rb") as f:
            data = f.read()
        path = str(tmp_path / "cat.tar.gz")
        with open(path, "wb") as f:
            f.write(gzip.compress(data))
    assert len(by_webdataset(path)) == len(SAMPLES)  # what webdataset gives: the first archive only
    with pytest.raises(ShardFormatError, match="end-of-archive marker") as e:
        open_stream(path, 1, tmp_path)
    assert e.value.url == path and e.value.reason == "bad_tar"


def test_non_adjacent_members_of_one_key_are_refused(tmp_path):
    """webdataset yields a key twice when its members are not adjacent (two samples, each
    incomplete); dalistream names the member at Stream.open."""
    path = str(tmp_path / "split.tar")
    _tarfile(tarfile.PAX_FORMAT)(path, [("a", [("jpg", b"\xff\xd8\xff\xda\xff\xd9")]), ("b", [("cls", b"1")]),
                                        ("a", [("cls", b"2")])])
    assert [k for k, _ in by_webdataset(path)] == ["a", "b", "a"]
    with pytest.raises(dalistream.SampleError, match="duplicate sample key") as e:
        open_stream(path, 1, tmp_path)
    assert e.value.member == "a.cls"


@pytest.mark.slow
@pytest.mark.dali
@pytest.mark.parametrize("writer", ["tarwriter", "gzip-by-content"])
def test_a_dali_pipeline_delivers_what_webdataset_reads(shards, writer, tmp_path):
    path = shards[writer]
    expected = reference(path)
    stream = dalistream.Stream.open(path, fields=FIELDS, batch_size=4, workers=2, policy="exact", device="cpu",
                                    lowercase_ext=True, missing="empty", cache_dir=str(tmp_path / "cache"))
    got = []
    with dalistream.Loader(stream, dalistream.raw_pipeline) as loader:
        for batch in loader:
            for i, key in enumerate(batch["key"]):
                got.append((key, {e: batch[e.replace(".", "_")][i] for e in EXTS if batch[e.replace(".", "_")][i]}))
    assert sorted(got) == sorted(expected)
    assert len(got) == len(expected)


def odd_tar(path, fmt):
    """Members that make no sample, or no field, as webdataset reads them: links, a fifo, folders,
    webdataset's metadata paths, names without an extension, a trailing dot."""
    jpg = b"\xff\xd8\xff\xda\xff\xd9"
    with tarfile.open(path, "w", format=fmt) as tar:
        def add(name, data=None, kind=tarfile.REGTYPE):
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "a.jpg"
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        add("__info__/meta.json", b"{}")
        add("__index__", b"0")
        add("a.jpg", jpg)
        add("a.lnk.jpg", kind=tarfile.SYMTYPE)  # a link between a sample's members
        add("a.cls", b"1")
        add("b.jpg", kind=tarfile.SYMTYPE)  # a sample of links only
        add("b.cls", kind=tarfile.LNKTYPE)
        add("f.pipe", kind=tarfile.FIFOTYPE)
        add("dir", kind=tarfile.DIRTYPE)
        add("dir/c.jpg", jpg)
        add("dir/c.cls", b"2")
        add("README", b"no extension")
        add("d.", b"a trailing dot")  # webdataset: sample 'd' with a field named ''
        add("e.jpg", jpg)
        add("e.cls", b"3")
    return path


def without_empty_ext(samples):
    return [(k, {e: v for e, v in s.items() if e}) for k, s in samples]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_members_that_make_no_sample_as_webdataset_reads_them(tmp_path, fmt):
    path = odd_tar(str(tmp_path / "odd.tar"), fmt)
    expected = by_webdataset(path)
    assert [k for k, _ in expected] == ["a", "dir/c", "d", "e"]
    assert by_header_walk(path) == expected  # a trailing dot: in sample 'd', under the extension ''
    for workers in (1, 2, 4):
        stream = open_stream(path, workers, tmp_path)
        assert stream.counts == (4,)
        assert by_workers(stream) == without_empty_ext(reference(path))  # no field can ask for ''


def test_a_hidden_file_in_a_folder_is_no_sample(tmp_path):
    """Documented difference: a basename starting with a dot belongs to no sample here; webdataset's
    pattern turns ``dir/.DS_Store`` into a sample keyed ``dir/`` with extension ``ds_store``."""
    path = str(tmp_path / "hidden.tar")
    _tarfile(tarfile.PAX_FORMAT)(path, [("dir/a", [("jpg", b"\xff\xd8\xff\xda\xff\xd9")])])
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("dir/.DS_Store")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"mac"))
    assert [k for k, _ in by_webdataset(path)] == ["dir/a", "dir/"]
    assert [k for k, _ in by_header_walk(path)] == ["dir/a"]


@pytest.mark.parametrize("reading", ["scan", "manifest with layouts"])
def test_extensions_equal_but_for_case_are_refused_with_lowercase_ext(tmp_path, reading):
    """``k.JPG`` and ``k.jpg`` in one sample: webdataset (which lowercases) raises on the duplicate;
    with ``lowercase_ext=True`` dalistream names the member -- by the count scan at Stream.open, and
    through a member layout indexed without lowercasing, in the worker, never keeping one silently."""
    path = str(tmp_path / "case.tar")
    jpg = b"\xff\xd8\xff\xda\xff\xd9"
    _tarfile(tarfile.USTAR_FORMAT)(path, [("a", [("jpg", jpg), ("cls", b"0")]),
                                          ("k", [("JPG", jpg), ("jpg", jpg + b"x"), ("cls", b"1")])])
    with pytest.raises(ValueError, match="duplicate"):
        by_webdataset(path)
    if reading == "scan":
        with pytest.raises(dalistream.SampleError, match="appears twice") as e:
            open_stream(path, 1, tmp_path)
        assert e.value.reason == "duplicate_member"
        return
    manifest = str(tmp_path / "m.json")
    info, = build_manifest([path], offsets=True)  # extensions as written: a layout with JPG and jpg
    assert info.members is not None
    write_manifest([info], manifest)
    stream = open_stream(path, 1, tmp_path, manifest=manifest)
    with pytest.raises(dalistream.SampleError, match="appears twice") as e:
        by_workers(stream)
    assert e.value.member == "k.jpg"
