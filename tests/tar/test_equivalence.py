"""The tar reader against Python's ``tarfile`` on random archives: the same samples (keys, offsets,
data, what is read and what is skipped), however the stream delivers its bytes (one large read, a
trickle of small reads, gzip, opened mid-shard at a sample's offset)."""

import gzip
import io
import random
import tarfile

from hypothesis import HealthCheck, given, settings, strategies as st

from dalistream.io.gunzip import decompressed
from dalistream.tar import iter_samples, split_name

KEYS = ["a", "b/c", "x.y/z", "d" * 120 + "/k", "caf\udce9", "na\u00efve", "s/" + "e" * 95]
EXTS = ["jpg", "cls", "txt", "seg.png", "JPG", "json.gz"]

member = st.tuples(st.sampled_from(EXTS), st.integers(0, 3000), st.sampled_from(["file"] * 6 + ["symlink", "hardlink"]))
sample = st.tuples(st.sampled_from(KEYS), st.lists(member, min_size=1, max_size=4, unique_by=lambda m: m[0].lower()),
                   st.booleans())  # (key, members, a directory entry before it)
archive = st.tuples(st.lists(sample, min_size=0, max_size=12, unique_by=lambda s: s[0]),
                    st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]), st.integers(0, 2 ** 32))


def build(spec) -> bytes:
    samples, fmt, seed = spec
    rng = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for n, (key, items, with_dir) in enumerate(samples):
            prefix = f"p{n}/"
            if with_dir:
                info = tarfile.TarInfo(prefix.rstrip("/"))
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            for ext, size, kind in items:
                info = tarfile.TarInfo(f"{prefix}{key}.{ext}")
                if kind == "file":
                    info.size = size
                    tar.addfile(info, io.BytesIO(rng.randbytes(size)))
                else:
                    info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                    info.linkname = "elsewhere"
                    tar.addfile(info)
            if rng.random() < 0.2:  # a member without an extension between samples: ignored
                info = tarfile.TarInfo(f"{prefix}README")
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    return buf.getvalue()


def reference(data: bytes, keep, want_ext, lowercase=False):
    """Samples as Python's tarfile reads the same archive, grouped by the WebDataset rule."""
    out, current = [], None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            if not m.isfile():  # folders, links: in no sample (as webdataset reads them)
                continue
            key, ext = split_name(m.name, lowercase)
            if ext is None:
                continue
            if current is None or key != current["__key__"]:
                current = {"__key__": key, "__url__": "u", "__index__": len(out), "__offset__": m.offset}
                out.append(current)
            wanted = keep(current["__index__"]) and want_ext(ext)
            current[ext] = tar.extractfile(m).read() if wanted else None
    return out


class Trickle(io.RawIOBase):
    """A stream that hands out its bytes a few at a time (a slow pipe), never seekable."""

    def __init__(self, data: bytes, seed: int) -> None:
        self.inner, self.rng = io.BytesIO(data), random.Random(seed)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.rng.choice([1, 7, 100, 511, 512, 513, 1500, 70000]))
        chunk = self.inner.read(n)
        buffer[:len(chunk)] = chunk
        return len(chunk)


def streams(data: bytes, seed: int):
    yield "buffered", io.BufferedReader(io.BytesIO(data))
    yield "trickle", Trickle(data, seed)
    yield "gzip", decompressed(io.BufferedReader(io.BytesIO(gzip.compress(data))), "u")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archive, st.integers(0, 2 ** 32), st.sets(st.sampled_from(EXTS)), st.booleans())
def test_samples_equal_pythons_tarfile(spec, seed, wanted, lowercase):
    data = build(spec)
    rng = random.Random(seed)
    skipped = {i for i in range(20) if rng.random() < 0.3}
    keep = lambda i: i not in skipped  # noqa: E731
    want_ext = wanted.__contains__
    expected = reference(data, keep, want_ext, lowercase)
    for how, stream in streams(data, seed):
        got = list(iter_samples(stream, "u", keep=keep, want_ext=want_ext, lowercase=lowercase))
        assert got == expected, how
    # a resume opens the shard at a sample's offset and numbers from there
    if expected:
        k = rng.randrange(len(expected))
        stream = io.BufferedReader(io.BytesIO(data))
        stream.seek(expected[k]["__offset__"])
        got = list(iter_samples(stream, "u", keep=keep, want_ext=want_ext, lowercase=lowercase, first_index=k))
        assert got == expected[k:]


@settings(max_examples=40, deadline=None)
@given(archive, st.integers(0, 2 ** 32))
def test_cut_archives_deliver_a_prefix_then_a_shard_error(spec, seed):
    """Cut anywhere: the samples before the cut, then a ShardFormatError; whatever the stream's
    read sizes. A cut inside a header ends the sample being grouped with the members it had (the
    missing-field policy judges it), a cut inside a member's data drops that sample."""
    from dalistream.errors import ShardFormatError

    data = build(spec)
    expected = reference(data, lambda i: True, lambda e: True)
    cut = random.Random(seed).randrange(len(data))
    results = []
    for how, stream in streams(data[:cut], seed):
        got = []
        try:
            for s in iter_samples(stream, "u", mark_errors=True):
                got.append(s)
            error = None
        except ShardFormatError as e:
            error = e.reason
        whole = got[:-1] if got and got[-1] != expected[len(got) - 1] else got
        assert whole == expected[:len(whole)], how
        if whole is not got:  # the last one: the sample in progress at the cut, with its first members
            last, full = got[-1], expected[len(got) - 1]
            assert {k: v for k, v in last.items()} == {k: v for k, v in full.items() if k in last}, how
            assert "__error__" not in last and set(last) < set(full)
        results.append((len(got), error))
    assert len(set(results[:2])) == 1  # the same samples and error whether read at once or in a trickle
    if cut < len(data) - 10240:  # (the end-of-archive padding may be cut without loss)
        assert results[0][1] in ("truncated", "empty", "not_tar")


def outcome(stream, mark_errors):
    from dalistream.errors import DalistreamError

    got = []
    try:
        for s in iter_samples(stream, "u", mark_errors=mark_errors, max_member_bytes=1 << 16):
            got.append({k: (v.reason if k == "__error__" else v) for k, v in s.items()})
    except DalistreamError as e:
        return got, (type(e).__name__, e.reason, e.member)
    return got, None


@settings(max_examples=60, deadline=None)
@given(archive, st.integers(0, 2 ** 32), st.integers(1, 6))
def test_damaged_archives_read_the_same_at_once_and_in_a_trickle(spec, seed, flips):
    """Bytes flipped anywhere (headers, sizes, zero blocks): the same samples and the same error
    however the bytes arrive, under raise and under skip (mark_errors); with raise, the samples
    before the error are those skip delivers without an error."""
    data = bytearray(build(spec))
    rng = random.Random(seed)
    for _ in range(flips):
        data[rng.randrange(len(data))] = rng.randrange(256)
    data = bytes(data)
    for mark_errors in (False, True):
        at_once = outcome(io.BufferedReader(io.BytesIO(data)), mark_errors)
        assert outcome(Trickle(data, seed), mark_errors) == at_once
    raised, marked = outcome(io.BufferedReader(io.BytesIO(data)), False), outcome(io.BufferedReader(io.BytesIO(data)), True)
    clean = [s for s in marked[0] if "__error__" not in s]
    assert raised[0] == clean[:len(raised[0])]
