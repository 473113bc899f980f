"""Samples read a run at a time are exactly the samples cut out one by one, which are exactly
the samples the header walk reads: for every tar writer, mixed patterns, runs of every length,
any part of a shard, any extensions wanted; and a damaged shard gives the same samples up to
the damage and the same error, at the same offsets."""

import io

import numpy as np
import pytest

from dalistream.errors import DalistreamError
from dalistream.io.local import open_range
from dalistream.manifest import scan_shard
from dalistream.manifest.rows import ShardRows
from dalistream.tar import runs
from dalistream.tar.runs import Run, sliced_runs
from dalistream.tar.samples import sliced_samples

from helpers import by_headers, maps_file, random_samples, shard, short_runs, write_tarfile


def layout(info):
    return ShardRows.from_infos([info]).members.at(0)


def read(reader, path, info, first, stop, stream=None, **kw):
    """``reader``'s samples ``first`` to ``stop`` as dicts, then the error that ended them
    (``None``), and how many runs came."""
    patterns, kinds, sizes, starts = layout(info)
    offset = info.offsets[first]
    out, error, n_runs = [], None, 0
    with (stream or open(path, "rb")) as f:
        f.seek(offset)
        try:
            for item in reader(f, path, patterns, kinds[first:stop], sizes[starts[first]:starts[stop]], first=first,
                               offset=offset, last=stop == info.samples, **kw):
                if isinstance(item, Run):
                    n_runs += 1
                    want = kw.get("want_ext", lambda e: True)
                    out += [item.sample(i, kw.get("lowercase", False), want) for i in range(len(item))]
                else:
                    out.append(item)
        except DalistreamError as e:
            error = (type(e), str(e), e.reason, e.member)
    return out, error, n_runs


@pytest.fixture(params=[0, 3000, 20000])
def small_runs(request, monkeypatch):
    """Runs of one sample (0), a few, many: the run length is the larger of chunk and MIN_RUN_BYTES."""
    short_runs(monkeypatch, request.param)
    return request.param


def opener(how):
    """How a part is opened: a plain file (its runs read into buffers), or as a worker opens a
    local shard (:func:`~dalistream.io.local.open_range`: its runs views of the file's mapping)."""
    return (lambda path: open(path, "rb")) if how == "file" else (lambda path: open_range(path, 0, None))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["file", "mapped"])
@pytest.mark.parametrize("writer", ["ustar", "gnu", "pax", "webdataset"])
@pytest.mark.parametrize("seed", range(3))
def test_runs_deliver_what_the_header_walk_reads(tmp_path, writer, seed, small_runs, how):
    path = shard(tmp_path, writer, seed)
    info = scan_shard(path, offsets=True)
    rng = np.random.default_rng(200 + seed)
    parts = [(0, info.samples)] + [tuple(sorted(rng.integers(0, info.samples + 1, 2))) for _ in range(5)]
    for first, stop in parts:
        for want, lowercase in ((None, False), ({"jpg", "cls"}, False), ({"png"}, True)):
            kw = dict(lowercase=lowercase, chunk=4096, **({"want_ext": want.__contains__} if want else {}))
            got, error, n_runs = read(sliced_runs, path, info, first, stop, stream=opener(how)(path), **kw)
            assert error is None
            assert got == by_headers(path, first, stop, lowercase=lowercase, **({"want_ext": want.__contains__} if want else {}))
            if stop > first and small_runs == 0:
                assert n_runs >= (stop - first) // 3  # (a sample over a chunk is a run of its own)


def damaged_copies(tmp_path, path, info):
    """The shard with one kind of damage each, after sample 5: cut mid-member, a header's magic
    gone, another size in a header, an end-of-archive marker early, one sample more."""
    data = bytearray(open(path, "rb").read())
    at = info.offsets[5]
    out = {}

    def save(name, blob):
        out[name] = str(tmp_path / f"{name}.tar")
        with open(out[name], "wb") as f:
            f.write(bytes(blob))

    save("cut", data[:at + 700])
    bad_magic = bytearray(data)
    bad_magic[at + 257:at + 262] = b"xxxxx"
    save("magic", bad_magic)
    other_size = bytearray(data)
    other_size[at + 124:at + 135] = b"%011o" % 3
    save("size", other_size)
    save("short", data[:at] + bytes(1024))
    longer = str(tmp_path / "longer.tar")
    write_tarfile(longer, random_samples(1, 10) + [{"__key__": "extra", "cls": b"1"}], "ustar")
    out["longer"] = longer
    return out


@pytest.mark.parametrize("how", ["stream", "mapped"])
def test_a_damaged_shard_gives_the_same_samples_and_error_run_by_run(tmp_path, small_runs, how):
    path = shard(tmp_path, "ustar", 1, n=10)
    info = scan_shard(path, offsets=True)
    for name, copy in damaged_copies(tmp_path, path, info).items():
        for first in (0, 3, 5):
            # (as the reader opens a part: a remote one, a stream of unknown size, which a seek past
            # the end does not tell; a local one, of known size, which names a cut one member earlier)
            def opened():
                return io.BytesIO(open(copy, "rb").read()) if how == "stream" else open_range(copy, 0, None)
            expected = read(sliced_samples, copy, info, first, 10, stream=opened(), chunk=4096)
            got = read(sliced_runs, copy, info, first, 10, stream=opened(), chunk=4096)
            assert got[:2] == expected[:2], name
            assert expected[1] is not None or name in ("short", "longer"), name
    assert expected[0][-1]["__index__"] == 10  # one more than counted: the caller reports it


class Failing(io.RawIOBase):
    """A file whose reads fail after ``limit`` bytes (a network drop mid-run)."""

    def __init__(self, path, limit):
        self.f = open(path, "rb")
        self.limit = limit

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self.f.seek(offset, whence)

    def tell(self):
        return self.f.tell()

    def readinto(self, buffer):
        if self.f.tell() >= self.limit:
            raise ConnectionResetError("connection reset by peer")
        view = memoryview(buffer)[:max(0, min(len(buffer), self.limit - self.f.tell()))]
        return self.f.readinto(view)

    def close(self):
        self.f.close()
        super().close()


def test_a_read_error_mid_run_comes_after_the_samples_before_it(tmp_path, small_runs):
    path = shard(tmp_path, "ustar", 2, n=12)
    info = scan_shard(path, offsets=True)
    limit = info.offsets[7] + 100
    expected = read(sliced_samples, path, info, 0, 12, stream=Failing(path, limit), chunk=4096)
    got = read(sliced_runs, path, info, 0, 12, stream=Failing(path, limit), chunk=4096)
    assert [s["__key__"] for s in got[0]] == [s["__key__"] for s in expected[0]]
    assert len(got[0]) == 7 and got[1][0] is expected[1][0] and got[1][2] == expected[1][2]


def test_parts_of_large_samples_are_read_sample_by_sample(tmp_path, monkeypatch):
    path = shard(tmp_path, "ustar", 3, n=6)
    info = scan_shard(path, offsets=True)
    total = int(ShardRows.from_infos([info]).members.spans().sum())  # the part's bytes in the tar: 6 samples
    monkeypatch.setattr(runs, "MIN_RUN_BYTES", 0)  # runs of one chunk
    fits = -(-total * runs.MIN_RUN_SAMPLES // 6)  # the smallest chunk a run of MIN_RUN_SAMPLES mean samples fits
    got, error, n_runs = read(sliced_runs, path, info, 0, 6, chunk=fits - 1)  # it does not: one by one
    assert n_runs == 0 and error is None and got == by_headers(path, 0, 6)
    got, error, n_runs = read(sliced_runs, path, info, 0, 6, chunk=fits)  # it does: runs
    assert n_runs >= 1 and error is None and got == by_headers(path, 0, 6)


def test_a_run_holds_views_of_its_own_buffer(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "MIN_RUN_BYTES", 0)
    monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 0)
    path = shard(tmp_path, "pax", 0, n=30)
    info = scan_shard(path, offsets=True)
    patterns, kinds, sizes, starts = layout(info)
    with open(path, "rb") as f:
        got = list(sliced_runs(f, path, patterns, kinds, sizes, first=0, offset=0, last=True, chunk=4096))
    assert all(isinstance(r, Run) for r in got) and len({id(r.data) for r in got}) == len(got)
    assert [r.sample(i) for r in got for i in range(len(r))] == by_headers(path, 0, 30)  # still intact after all reads


def test_an_arena_reuses_a_buffer_only_once_nothing_refers_to_it():
    arena = runs.Arena(size=64)
    a = arena.take(40)
    a[:] = b"a" * 40
    kept = np.frombuffer(a, np.uint8)[:10]  # a view of a view: it holds the buffer too
    first = arena.last[0]
    del a
    b = arena.take(40)  # no room left: a second buffer (the first is still referred to)
    assert arena.last[0] is not first
    b[:] = b"b" * 40
    c = arena.take(40)  # no room again: the first buffer is still held by `kept`
    assert arena.last[0] is not first and bytes(kept) == b"a" * 10
    del kept, b
    arena.take(40)  # the first buffer is free now (the second too): one of them is reused
    assert len(arena._pool) == 3 and any(arena.last[0] is buf for buf in arena._pool[:2])
    del c
    big = arena.take(100)  # larger than a buffer: one of its own, not kept
    assert len(big) == 100 and len(arena._pool) == 3


def test_a_part_read_in_two_runs_gives_the_samples_of_one_run(tmp_path):
    """A part cut into two runs (a first run as long as asked) over one arena: their samples,
    keys and wanted bytes are those of the part read as one run."""
    path = shard(tmp_path, "pax", 1, n=12)
    info = scan_shard(path, offsets=True)
    patterns, kinds, sizes, _ = layout(info)
    starts = runs.Geometry(patterns, kinds, sizes).sample_start.tolist()

    def read(first_runs=()):
        with open(path, "rb") as f:
            return list(sliced_runs(f, path, patterns, kinds, sizes, first=0, offset=0, last=True, chunk=1 << 20,
                                    arena=runs.Arena(), first_runs=first_runs))

    (run,) = read()
    whole = [run.sample(i) for i in range(len(run))]
    for k in (1, 5, 11):
        head, tail = read((starts[k],))
        assert (len(head), len(tail), tail.first) == (k, 12 - k, k)
        assert [head.sample(i) for i in range(k)] + [tail.sample(i) for i in range(12 - k)] == whole
        assert head.buffer is tail.buffer and head.nbytes + tail.nbytes == run.nbytes
        assert [tail.key(i) for i in range(12 - k)] == [s["__key__"] for s in whole[k:]]


def test_a_part_s_first_runs_have_the_lengths_asked(tmp_path):
    """A short first run (a first batch), then a phased one, then runs of the usual length."""
    path = shard(tmp_path, "ustar", 4, n=40)
    info = scan_shard(path, offsets=True)
    patterns, kinds, sizes, starts = layout(info)
    spans = ShardRows.from_infos([info]).members.spans()
    with open(path, "rb") as f:
        got = list(sliced_runs(f, path, patterns, kinds, sizes, first=0, offset=0, last=True, chunk=0,
                               first_runs=(1, int(spans[:10].sum()))))
    assert [len(r) for r in got][:2] == [1, 10]  # (a run holds one sample at least)
    assert sum(len(r) for r in got) == 40 and [r.sample(i) for r in got for i in range(len(r))] == by_headers(path, 0, 40)


def test_a_local_part_of_several_runs_is_read_as_views_of_the_file_s_mapping(tmp_path, monkeypatch):
    """A local part that would take several runs is cut into long runs of the file's mapped bytes,
    no byte copied nor any buffer taken; one of at most one run and a half is read into a buffer."""
    path = shard(tmp_path, "pax", 2, n=40)
    info = scan_shard(path, offsets=True)
    patterns, kinds, sizes, starts = layout(info)
    spans = ShardRows.from_infos([info]).members.spans()
    arena = runs.Arena(size=1 << 20)
    taken = []
    monkeypatch.setattr(arena, "take", lambda n, take=arena.take: taken.append(n) or take(n))
    monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 0)
    run_bytes = int(spans[:8].sum())  # a run of about 8 samples if read into buffers

    def part(first, stop):
        f = open_range(path, int(info.offsets[first]), int(info.offsets[stop]) if stop < 40 else None)
        with f:
            return list(sliced_runs(f, path, patterns, kinds[first:stop], sizes[starts[first]:starts[stop]], first=first,
                                    offset=int(info.offsets[first]), last=stop == 40, chunk=run_bytes, arena=arena))

    got = part(0, 40)  # 40 samples, 5 runs' worth: views, runs of up to MAPPED_RUN_BYTES (one here)
    assert len(got) == 1 and not taken and maps_file(got[0].buffer, path)
    assert got[0].data.readonly and [got[0].sample(i) for i in range(40)] == by_headers(path, 0, 40)
    monkeypatch.setattr(runs, "MAPPED_RUN_BYTES", 2 * run_bytes)
    got = part(0, 40)  # mapped runs of 16 samples or so, one mapping for all
    assert len(got) >= 2 and not taken and len({id(r.buffer) for r in got}) == 1
    assert [r.sample(i) for r in got for i in range(len(r))] == by_headers(path, 0, 40)
    got = part(0, 10)  # a run and a quarter: one run, read into the arena
    assert len(got) == 1 and taken and not maps_file(got[0].buffer, path)
    assert [got[0].sample(i) for i in range(10)] == by_headers(path, 0, 10)


def test_a_file_that_cannot_be_mapped_is_read_into_buffers(tmp_path, monkeypatch):
    """A file system that maps nothing (``mmap`` fails): the part's runs are read into buffers,
    the same samples; the file is not asked again."""
    import errno

    from dalistream.io import openfiles

    def no_maps(*args, **kwargs):
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(openfiles, "Region", no_maps)
    short_runs(monkeypatch, 0)  # runs of one chunk: a part of several
    path = shard(tmp_path, "gnu", 1, n=30)
    info = scan_shard(path, offsets=True)
    got, error, n_runs = read(sliced_runs, path, info, 0, 30, stream=open_range(path, 0, None), chunk=2048)
    assert error is None and n_runs >= 2 and got == by_headers(path, 0, 30)
    f = open_range(path, 0, None)
    assert f.view(100) is None and f._file.mapping is False and f.tell() == 0
    f.close()
