"""The catalogue of bad inputs: each one gives a clear error naming the place (on_error="raise") or
a counted skip (on_error="skip"), at the stage level (no DALI) and through the real loader.

Every bad shard is written with real tar writers (Python's tarfile, webdataset's TarWriter) and
then damaged the way real data gets damaged (cut copies, error pages saved as shards, …).
"""

import gzip
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import dalistream
from dalistream import Loader, Stream, ops
from dalistream.config import StreamConfig
from dalistream.errors import ConfigError, SampleError, ShardFormatError, SourceError
from dalistream.worker import image_problem
from dalistream.worker import WorkerSource
from dalistream.io import open_shard
from dalistream.tar import iter_samples

from helpers import PEER_DATA, data_set, write_tar, write_wds

FIELDS = {"image": "png;jpg", "label": "cls", "key": "__key__"}
MAX_MEMBER = 100_000
PEER_TGZ = os.path.join(PEER_DATA, "sample.tgz")


def png(i: int, size: int = 8) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (i * 37 % 256, i * 11 % 256, 200)).save(buf, "PNG")
    return buf.getvalue()


def jpeg(i: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (i * 37 % 256, 90, 10)).save(buf, "JPEG")
    return buf.getvalue()


def members(prefix: str, n: int, start: int = 0):
    out = []
    for i in range(start, start + n):
        out += [(f"{prefix}/{i:03d}.png", png(i)), (f"{prefix}/{i:03d}.cls", str(i % 5).encode())]
    return out


def offsets(path):
    with tarfile.open(path) as tar:
        return [(m.name, m.offset, m.offset_data, m.size) for m in tar.getmembers()]


# -- the catalogue: name -> (file name, builder, keys delivered with skip, skip counter or None) ----------

def build_catalogue(d):
    """Write every catalogue shard into ``d``; return ``{name: (path, good keys, counter)}``."""
    cat = {}

    def add(name, path, keys, counter):
        cat[name] = (path, keys, counter)

    # good data: webdataset's TarWriter, a gzip tar of our own, the peer's .tgz (90 png+cls samples)
    write_wds(os.path.join(d, "good.tar"), [{"__key__": f"good/{i:03d}", "png": png(i), "cls": str(i % 5).encode()}
                                            for i in range(6)])
    add("good", os.path.join(d, "good.tar"), [f"good/{i:03d}" for i in range(6)], None)
    raw = write_tar(os.path.join(d, "gz.raw"), members("gz", 5))
    with open(raw, "rb") as f, gzip.open(os.path.join(d, "gz.tar.gz"), "wb") as g:
        g.write(f.read())
    add("tar.gz", os.path.join(d, "gz.tar.gz"), [f"gz/{i:03d}" for i in range(5)], None)
    with tarfile.open(PEER_TGZ) as tar:
        peer_keys = sorted({m.name.split(".")[0] for m in tar.getmembers() if m.isfile()})
    shutil.copy(PEER_TGZ, os.path.join(d, "peer.tgz"))
    add("tgz", os.path.join(d, "peer.tgz"), peer_keys, None)

    # shard-level problems
    open(os.path.join(d, "empty.tar"), "wb").close()
    add("empty", os.path.join(d, "empty.tar"), [], "shards:empty")
    full = write_tar(os.path.join(d, "cut.raw"), members("cut", 4))
    data = open(full, "rb").read()
    table = offsets(full)
    _, header_4, _, _ = table[4]  # header of cut/002.png
    open(os.path.join(d, "cut_header.tar"), "wb").write(data[:header_4 + 100])
    # cut inside cut/002's header: cut/001 was whole before it and is delivered
    add("cut mid-header", os.path.join(d, "cut_header.tar"), ["cut/000", "cut/001"], "shards:truncated")
    _, _, data_4, size_4 = table[4]
    open(os.path.join(d, "cut_member.tar"), "wb").write(data[:data_4 + size_4 // 2])
    add("cut mid-member", os.path.join(d, "cut_member.tar"), ["cut/000", "cut/001"], "shards:truncated")
    page = b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>\n" * 12
    open(os.path.join(d, "error-page.tar"), "wb").write(page)
    add("not a tar", os.path.join(d, "error-page.tar"), [], "shards:not_tar")
    gz_full = gzip.compress(open(write_tar(os.path.join(d, "gzcut.raw"), members("gzcut", 30)), "rb").read())
    open(os.path.join(d, "gzcut.tar.gz"), "wb").write(gz_full[:len(gz_full) * 6 // 10])
    add("cut gzip", os.path.join(d, "gzcut.tar.gz"), None, "shards:bad_gzip")  # None: a prefix of its keys

    # sample-level problems: the shard goes on after the bad sample
    write_tar(os.path.join(d, "dup.tar"), members("dup", 2) + members("dup", 1) + members("dup", 1, start=2))
    add("duplicate key", os.path.join(d, "dup.tar"), ["dup/000", "dup/001", "dup/002"], "samples:duplicate_key")
    write_tar(os.path.join(d, "big.tar"), members("big", 1) + [("big/001.png", bytes(MAX_MEMBER + 1)),
                                                              ("big/001.cls", b"1")] + members("big", 1, start=2))
    add("member too large", os.path.join(d, "big.tar"), ["big/000", "big/002"], "samples:too_large")
    write_tar(os.path.join(d, "missing.tar"), members("miss", 1) + [("miss/001.png", png(1))] + members("miss", 1, 2))
    add("missing field", os.path.join(d, "missing.tar"), ["miss/000", "miss/002"], "samples:missing_field")
    write_tar(os.path.join(d, "label.tar"), members("lab", 1) + [("lab/001.png", png(1)), ("lab/001.cls", b"cat")]
              + members("lab", 1, 2))
    add("label not an integer", os.path.join(d, "label.tar"), ["lab/000", "lab/002"], "samples:bad_value")
    rng = np.random.default_rng(0)
    write_tar(os.path.join(d, "badimg.tar"), members("img", 1)
              + [("img/001.jpg", rng.bytes(3000)), ("img/001.cls", b"1"),
                 ("img/002.jpg", jpeg()[:300]), ("img/002.cls", b"2")] + members("img", 1, 3))
    add("undecodable image", os.path.join(d, "badimg.tar"), ["img/000", "img/003"], "samples:bad_image")
    return cat


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("catalogue"))
    cat = build_catalogue(d)
    for name in os.listdir(d):
        if name.endswith(".raw"):
            os.remove(os.path.join(d, name))
    return d, cat


def keys_of(cat, name):
    path, keys, _ = cat[name]
    if keys is None:  # a cut gzip: whatever decompressed before the cut, in order
        with open_shard(path) as f:
            keys = []
            try:
                for s in iter_samples(f, path, keep=lambda i: False):
                    keys.append(s["__key__"])
            except ShardFormatError:
                pass
        assert 0 < len(keys) < 30
    return keys


EXPECTED_SKIPS = {
    "skipped_shards": 5, "skipped_samples": 6,
    "skipped": {"shards": {"bad_gzip": 1, "empty": 1, "not_tar": 1, "truncated": 2},
                "samples": {"bad_image": 2, "bad_value": 1, "duplicate_key": 1, "missing_field": 1, "too_large": 1}},
}


# -- stage level: the raise behaviour of every entry, exactly -----------------------------------------

RAISES = {  # name -> (class, reason, words in the message, member named)
    "empty": (ShardFormatError, "empty", "empty shard (0 bytes)", None),
    "cut mid-header": (ShardFormatError, "truncated", "truncated tar: header cut after 100 bytes", None),
    "cut mid-member": (ShardFormatError, "truncated", "truncated tar: member data cut after", "cut/002.png"),
    "not a tar": (ShardFormatError, "not_tar", "not a tar stream", None),
    "cut gzip": (ShardFormatError, "bad_gzip", "corrupt or truncated gzip data", None),
    "duplicate key": (SampleError, "duplicate_key", "duplicate sample key in shard", "dup/000.png"),
    "member too large": (SampleError, "too_large", f"exceeds the limit of {MAX_MEMBER} bytes", "big/001.png"),
    "missing field": (SampleError, "missing_field", "no member for field 'label'", "miss/001"),
    "label not an integer": (SampleError, "bad_value", "label b'cat' is not an integer", "lab/001.cls"),
    "undecodable image": (SampleError, "bad_image", "not a decodable image: unknown image format", "img/001.jpg"),
}


def worker_run(paths, counts, **kw):
    """Every sample of one worker (the whole shard list), without DALI: keys delivered, skips."""
    options = dict(sources=tuple(paths), fields=FIELDS, batch_size=1, workers=1, policy="exact",
                   max_member_bytes=MAX_MEMBER, shuffle_shards=False)
    options.update(kw)
    source = WorkerSource(StreamConfig(**options), data_set(paths, counts), 0)
    keys = []
    for image, label, key, valid in source.epoch_batches(0):
        if int(valid[0]):
            keys.append(bytes(key[0]).decode())
    return keys, dict(source._stats.skipped)


@pytest.mark.parametrize("name", sorted(RAISES))
def test_raise_names_shard_member_rank_worker(catalogue, name):
    d, cat = catalogue
    path = cat[name][0]
    cls, reason, words, member = RAISES[name]
    with pytest.raises(cls) as info:
        worker_run([path], [50], rank=0, world_size=1)
    e = info.value
    assert (type(e), e.reason, e.url, e.member, e.rank, e.worker) == (cls, reason, path, member, 0, 0)
    assert words in str(e) and path in str(e) and "worker 0" in str(e)


@pytest.mark.parametrize("name", sorted(set(RAISES) - {"cut gzip"}))
def test_skip_counts_one_reason_and_delivers_the_rest(catalogue, name):
    d, cat = catalogue
    path, keys, counter = cat[name]
    from dalistream.manifest import scan_tolerant

    good, good_keys, _ = cat["good"]
    (info, _), problems = scan_tolerant([path, good])
    got, skipped = worker_run([path, good], [info.samples, 6], on_error="skip")
    n = 2 if name == "undecodable image" else 1  # (random bytes, a cut JPEG)
    assert got == keys + good_keys and skipped == {counter: n}
    if not keys:  # nothing to deliver from the bad shard: met when the reader goes past it
        assert worker_run([good, path], [6, info.samples], on_error="skip") == (good_keys, {counter: 1})
    # the tolerant scan counts what the worker will deliver or skip one by one
    assert info.samples == len(keys) + (n if counter.startswith("samples:") else 0)
    assert [p.url for p in problems] == ([path] if name in ("empty", "cut mid-header", "cut mid-member", "not a tar",
                                                            "duplicate key") else [])


def test_shard_gone_after_counting(catalogue, tmp_path):
    good, good_keys, _ = catalogue[1]["good"]
    gone = str(tmp_path / "gone-0000.tar")
    with pytest.raises(SourceError, match="shard file does not exist") as e:
        worker_run([gone, good], [3, 6], rank=0)
    assert (e.value.url, e.value.reason, e.value.worker) == (gone, "missing", 0)
    assert worker_run([gone, good], [3, 6], on_error="skip") == (good_keys, {"shards:missing": 1})


def test_a_warning_once_per_bad_shard(catalogue, caplog):
    d, cat = catalogue
    paths = [cat["undecodable image"][0], cat["empty"][0]]
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        worker_run(paths, [4, 0], on_error="skip")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # two bad images in one shard: one warning; the empty shard: one
    assert "img/001.jpg" in warnings[0] and "empty shard" in warnings[1]


def test_missing_policies_skip_and_empty(catalogue):
    d, cat = catalogue
    path = cat["missing field"][0]
    assert worker_run([path], [3], missing="skip") == (["miss/000", "miss/002"], {"samples:missing_field": 1})
    assert worker_run([path], [3], missing="empty") == (["miss/000", "miss/001", "miss/002"], {})


def test_member_size_is_refused_before_anything_is_read():
    """A header claiming 100 GiB: refused from the header alone (the data are not even there)."""
    info = tarfile.TarInfo("huge/0.png")
    info.size = 100 << 30
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    stream = io.BytesIO(header + b"\0" * 1024)
    with pytest.raises(SampleError, match="exceeds the limit of 268435456 bytes") as e:
        next(iter_samples(stream, "mem.tar"))
    assert e.value.reason == "too_large" and e.value.member == "huge/0.png"
    # with mark_errors the member is passed over by header (here its data are missing: truncated)
    stream = io.BytesIO(header + b"\0" * 1024)
    with pytest.raises(ShardFormatError, match="truncated"):
        list(iter_samples(stream, "mem.tar", mark_errors=True))


@pytest.mark.parametrize("data,problem", [
    (b"", "0 bytes"),
    (bytes(range(256)) * 4, "unknown image format"),
    (b"\xff\xd8\xff\xe0" + bytes(500), "without image data"),
    (None, "without its end-of-image marker"),
    (b"\x89PNG\r\n\x1a\n" + bytes(100), "without its IEND chunk"),
    (b"RIFF\x00\x10\x00\x00WEBPVP8 " + bytes(20), "cut short"),
])
def test_cheap_image_check(data, problem):
    data = jpeg()[:-10] if data is None else data  # a JPEG cut just before its end
    assert problem in image_problem(data)


def test_jpeg_end_marker_counts_only_after_the_scan():
    """The end-of-image marker is looked for from the end: one inside an EXIF thumbnail (before
    the first start-of-scan) does not make a cut JPEG whole; markers in trailing data are fine."""
    thumbnail = b"\xff\xd8\xff\xdb\x00\x04\x00\x00\xff\xda" + bytes(30) + b"\xff\xd9"
    exif = b"\xff\xe1" + (2 + 6 + len(thumbnail)).to_bytes(2, "big") + b"Exif\x00\x00" + thumbnail
    cut = b"\xff\xd8" + exif + b"\xff\xdb\x00\x04\x00\x00" + b"\xff\xda\x00\x02" + bytes(200)
    assert "without its end-of-image marker" in image_problem(cut)
    assert image_problem(cut + b"\xff\xd9") is None
    assert image_problem(cut + b"\xff\xd9" + b"video \xff\xd9 \xff\xda") is None
    assert "without its IEND chunk" in image_problem(png(1)[:-12])  # cut before its last chunk
    assert "without image data" in image_problem(b"\xff\xd8" + exif + b"\xff\xdb\x00\x04\x00\x00" + bytes(9))
    junk = b"\xff\xd8" + exif + b"junk" + b"\xff\xda\x00\x02" + bytes(9)  # bytes that are no marker: searched on
    assert "end-of-image" in image_problem(junk) and image_problem(junk + b"\xff\xd9") is None


def test_cheap_image_check_passes_real_images():
    from PIL import Image

    assert image_problem(jpeg()) is None and image_problem(png(1)) is None
    assert image_problem(jpeg() + b"trailing data, as in motion photos") is None
    for fmt in ("GIF", "BMP", "TIFF", "WEBP", "PPM"):
        buf = io.BytesIO()
        Image.new("RGB", (4, 4)).save(buf, fmt)
        assert image_problem(buf.getvalue()) is None, fmt


def test_corrupted_tars_only_ever_raise_dalistream_errors(catalogue):
    """Every cut and many bit flips of a real shard: a clean end or a dalistream error, never
    another exception (IndexError, UnicodeError, MemoryError, …) and never a hang."""
    d, cat = catalogue
    data = open(cat["good"][0], "rb").read()
    rng = np.random.default_rng(1)
    variants = [data[:n] for n in range(0, len(data), 97)]
    for _ in range(300):
        b = bytearray(data)
        for pos in rng.integers(0, len(b), 3):
            b[pos] = int(rng.integers(0, 256))
        variants.append(bytes(b))
    for v in variants + [gzip.compress(v)[: len(v) // 3] for v in variants[::20]]:
        stream = io.BufferedReader(io.BytesIO(v))
        if v[:2] == b"\x1f\x8b":
            stream = io.BufferedReader(gzip.GzipFile(fileobj=stream))
        try:
            for _ in iter_samples(stream, "v.tar", mark_errors=True, max_member_bytes=1 << 20):
                pass
        except (ShardFormatError, SampleError, SourceError):
            pass


# -- sources and layouts --------------------------------------------------------------------------

def test_source_and_layout_errors(catalogue, tmp_path):
    d, cat = catalogue
    kw = dict(fields=FIELDS, batch_size=4, workers=1, device="cpu", cache_dir=str(tmp_path))
    with pytest.raises(SourceError, match="no such shard file") as e:
        Stream.open(os.path.join(d, "nope-0000.tar"), **kw)
    assert "nope-0000.tar" in str(e.value) and e.value.hint
    with pytest.raises(SourceError, match="glob matched no files"):
        Stream.open(os.path.join(d, "nope-*.tar"), **kw)
    with pytest.raises(ConfigError, match="no sources given"):
        Stream.open([], **kw)
    with pytest.raises(ConfigError, match="2 shards cannot be split over 2 ranks x 2 workers = 4 global workers") as e:
        Stream.open([cat["good"][0], cat["tgz"][0]], **dict(kw, workers=2), rank=0, world_size=2, policy="fixed",
                    batches_per_epoch=3)  # whole shards (no counts); with counts the shards are cut
    assert "fewer workers" in e.value.hint and "manifest" in e.value.hint


@pytest.mark.parametrize("name", ["empty", "cut mid-header", "cut mid-member", "not a tar", "cut gzip", "duplicate key"])
def test_raise_stops_at_open_naming_the_shard(catalogue, tmp_path, name):
    """Counting samples reads every header: shard-level damage (and duplicate keys) is reported by
    Stream.open, before any pipeline starts."""
    d, cat = catalogue
    cls, reason, words, member = RAISES[name]
    with pytest.raises(cls) as e:
        Stream.open([cat["good"][0], cat[name][0]], fields=FIELDS, batch_size=2, workers=1, device="cpu",
                    cache_dir=str(tmp_path))
    assert e.value.reason == reason and e.value.url == cat[name][0] and words in str(e.value)


# -- through the real loader ---------------------------------------------------------------------------

@dalistream.pipeline_def
def decoded(stream):
    data = dalistream.read(stream)
    image = ops.decode_images(data["image"], data["valid"], stream.device)
    return {"image": image, "label": data["label"], "key": data["key"]}


@pytest.mark.dali
def test_loader_skip_run_over_the_whole_catalogue(catalogue, tmp_path):
    """One real pipeline (2 DALI workers, image decoding) over all the good and bad shards at once,
    plus a good shard deleted after it was counted: every good sample arrives exactly once, bad
    images never reach DALI's decoder, and the counters say what was skipped and why."""
    d, cat = catalogue
    run = str(tmp_path / "run")
    shutil.copytree(d, run)
    gone = write_tar(os.path.join(run, "gone.tar"), members("gone", 3))
    stream = Stream.open(run, fields=FIELDS, batch_size=8, workers=2, device="cpu", policy="exact",
                         on_error="skip", max_member_bytes=MAX_MEMBER, cache_dir=str(tmp_path / "cache"))
    os.remove(gone)  # counted, then gone before it is read: a source error at read time
    expected = sorted(k for name in cat for k in keys_of(cat, name))
    with Loader(stream, decoded) as loader:
        keys, shapes = [], set()
        for batch in loader:
            keys += batch["key"]
            assert len(batch["image"]) == len(batch["key"]) == len(batch["label"])
            shapes |= {tuple(im.shape[2:]) for im in batch["image"]}
        stats = loader.stats(wait_s=10)
    assert sorted(keys) == expected  # every good sample once; damaged shards up to the damage
    assert shapes == {(3,)}
    want = json.loads(json.dumps(EXPECTED_SKIPS))
    want["skipped_shards"] += 1
    want["skipped"]["shards"]["missing"] = 1
    assert {k: stats["by_epoch"][0][k] for k in want} == want  # (the workers read ahead into epoch 1: apart)
    assert {k: stats[k] for k in want} == want and stats["samples"] == len(keys)  # the totals: the epoch delivered
    assert sum(w["skipped_by_epoch"].get("0", {}).get("shards:missing", 0) for w in stats["workers"]) == 1


@pytest.mark.dali
def test_loader_raise_on_a_shard_damaged_after_indexing(tmp_path):
    """Counts from a manifest written while the shard was whole: the damage is met in a DALI worker
    and reaches the training loop as the same ShardFormatError, naming shard, member, rank, worker."""
    from dalistream.manifest import build_manifest, write_manifest

    paths = [write_tar(str(tmp_path / f"s{i}.tar"), members(f"s{i}", 12)) for i in range(2)]
    write_manifest(build_manifest(paths), str(tmp_path / "manifest.json"))
    data = open(paths[1], "rb").read()
    _, _, data_at, size = offsets(paths[1])[10]  # s1/005.png
    open(paths[1], "wb").write(data[:data_at + size // 2])
    stream = Stream.open(paths, fields=FIELDS, batch_size=4, workers=2, device="cpu", shuffle_shards=False,
                         manifest=str(tmp_path / "manifest.json"))
    got = []
    with Loader(stream) as loader:
        with pytest.raises(ShardFormatError) as info:
            for batch in loader:
                got += batch["key"]
    e = info.value
    assert (e.url, e.member, e.rank, e.worker, e.reason) == (paths[1], "s1/005.png", 0, 1, "truncated")
    assert "truncated tar: member data cut after" in str(e) and "re-write or re-upload" in str(e)
    # (the worker's traceback, down to where the part's reader met the damage)
    assert "Traceback (most recent call last)" in e.worker_traceback and "worker/part.py" in e.worker_traceback
    assert not any("DALI worker process" in note for note in getattr(e, "__notes__", ()))  # one message
    assert set(got) <= {f"s{i}/{j:03d}" for i in range(2) for j in range(12)}


def strict_about_size(error):
    """An on_error callable (runs in the DALI worker): skip everything but members over the limit."""
    if error.reason == "too_large":
        raise error


@pytest.mark.dali
def test_loader_with_an_on_error_callable(catalogue, tmp_path):
    d, cat = catalogue
    paths = [cat["missing field"][0], cat["member too large"][0]]
    stream = Stream.open(paths, fields=FIELDS, batch_size=2, workers=1, device="cpu", on_error=strict_about_size,
                         max_member_bytes=MAX_MEMBER, shuffle_shards=False, policy="exact",
                         cache_dir=str(tmp_path / "cache"))
    keys = []
    with Loader(stream) as loader:
        with pytest.raises(SampleError, match="exceeds the limit") as info:
            for batch in loader:
                keys += batch["key"]
        assert loader.stats(wait_s=5)["skipped"]["samples"] == {"missing_field": 1}
    assert info.value.member == "big/001.png" and info.value.worker == 0
    # the missing field was skipped, the shard went on (DALI prefetches: the failure of batch 1 may
    # surface before batch 0 is handed out)
    assert keys in ([], ["miss/000", "miss/002"])


def corrupt_inside_jpeg(seed: int = 3) -> bytes:
    """Passes the workers' cheap check (JPEG start, start-of-scan, end-of-image) yet cannot be decoded."""
    good = jpeg()
    rng = np.random.default_rng(seed)
    return good[:4] + rng.bytes(1500) + b"\xff\xda" + rng.bytes(64).replace(b"\xff", b"\x00") + b"\xff\xd9"


@pytest.mark.dali
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("interleave,first", [(False, [0, 1, 2, 3]), (True, [0, 2, 4, 6])])
def test_loader_undecodable_image_in_dali_is_located(tmp_path, interleave, first, on_error):
    """An image only DALI's decoder rejects kills the whole pipeline, and DALI does not say which
    sample it was: the loader re-reads the failed batch and names shard and key."""
    bad = corrupt_inside_jpeg()
    assert image_problem(bad) is None
    mem = []
    for i in range(8):
        mem += [(f"d/{i:03d}.jpg", bad if i == 5 else jpeg(i)), (f"d/{i:03d}.cls", b"1")]
    path = write_tar(str(tmp_path / "dec.tar"), mem)
    stream = Stream.open(path, fields=FIELDS, batch_size=4, workers=1, device="cpu", cache_dir=str(tmp_path),
                         interleave=interleave, shuffle=0, on_error=on_error)
    keys = []
    with Loader(stream, decoded) as loader:
        with pytest.raises(SampleError) as info:
            for batch in loader:
                keys += batch["key"]
    e = info.value
    assert keys == [f"d/{i:03d}" for i in first]  # interleaved: 4 columns of 2, d/005 in step 1 either way
    assert (e.url, e.member, e.reason, e.rank) == (path, "d/005", "bad_image", 0)
    assert "DALI's image decoder (fn.decoders.image) failed" in str(e) and "PIL" in str(e)
    assert "step 1" in str(e)
    # the hint says what skip does here, and never suggests it when it is on
    assert ("on_error='skip' is on" if on_error == "skip" else "on_error='skip' would not help") in e.hint


# -- the command line ------------------------------------------------------------------------------------

def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "dalistream", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, DALISTREAM_CACHE=os.devnull + "-nocache"))


@pytest.fixture(scope="module")
def cli_data(catalogue, tmp_path_factory):
    d, cat = catalogue
    run = str(tmp_path_factory.mktemp("cli"))
    for name in ("good", "tgz", "cut mid-member", "label not an integer", "empty"):
        shutil.copy(cat[name][0], run)
    return run, {name: os.path.join(run, os.path.basename(cat[name][0])) for name in cat}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["index", "keys"])
def test_cli_raise_exits_nonzero_naming_the_shard(cli_data, command):
    run, paths = cli_data
    proc = cli(command, run, "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"dalistream {command}: error: ")
    assert paths["cut mid-member"] in proc.stderr or paths["empty"] in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_index_skip_reports_the_bad_shards(cli_data):
    run, paths = cli_data
    proc = cli("index", run, "--on-error", "skip", "--json")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["skipped_shards"] == 2
    assert {(e["url"], e["reason"]) for e in payload["errors"]} == {(paths["cut mid-member"], "truncated"),
                                                                  (paths["empty"], "empty")}
    counts = {os.path.basename(s["url"]): s["samples"] for s in payload["shards"]}
    assert counts["cut_member.tar"] == 2 and counts["empty.tar"] == 0 and counts["label.tar"] == 3


@pytest.mark.dali
@pytest.mark.slow
def test_cli_keys_skip_json_ends_with_the_counters(cli_data):
    run, paths = cli_data
    proc = cli("keys", run, "--on-error", "skip", "--json", "-W", "2", "-B", "4", "--policy", "exact")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    keys = [k for line in lines[:-1] for k in line["keys"]]
    stats = lines[-1]["stats"]
    assert len(keys) == len(set(keys)) == 6 + 90 + 2 + 3  # keys only: the bad label is no problem here
    assert stats["skipped_shards"] == 2 and stats["skipped_samples"] == 0
    assert stats["skipped"]["shards"] == {"empty": 1, "truncated": 1}
