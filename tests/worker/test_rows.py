"""Samples decoded a run at a time are the samples decoded one by one, value for value: every
field kind, images good and bad (JPEG, PNG and the others), labels plain and odd, members
missing or gzipped; in bulk and row by row. And the reader and the worker deliver the same
batches, skips and errors either way: every missing policy and error policy, damaged shards,
padding, resume, elastic resume, W = 1, 2, 3, read in spans or interleaved."""

import contextlib
import gzip
import io

import numpy as np
import pytest
from PIL import Image

from dalistream.config import StreamConfig, parse_field
from dalistream.errors import DalistreamError, SampleError
from dalistream.manifest import build_manifest, scan_shard
from dalistream.manifest.offsets import SampleOffsets
from dalistream.manifest.rows import ShardRows
from dalistream.tar import runs
from dalistream.tar.runs import Run, sliced_runs
from dalistream.worker import WorkerSource
from dalistream.worker.fields import FieldDecoder
from dalistream.worker.rows import BULK_ROWS, RowDecoder, Rows

from helpers import data_set, short_runs, write_tar


def image(fmt, seed):
    out = io.BytesIO()
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (8 + seed % 5, 9, 3), dtype=np.uint8)).save(out, format=fmt)
    return out.getvalue()


JPEG, PNG = image("JPEG", 1), image("PNG", 2)
THUMB = b"\xff\xd8\xff\xe1\x00\x20Exif\x00\x00" + b"\xff\xd8\xff\xda\x00\x02" + b"x" * 14 + b"\xff\xd9" + b"\xff\xd9"
IMAGES = [  # (bytes, what image_problem says of them)
    JPEG, JPEG[:-2], JPEG[:len(JPEG) // 2], JPEG + b"motion photo", JPEG[:2] + b"\xff\xff" + JPEG[2:], PNG, PNG[:-12],
    image("GIF", 3), image("BMP", 4), b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"x" * 8, b"RIFF\xff\x00\x00\x00WEBPxx",
    b"P6\n1 1\n255\nxyz", b"", b"not an image at all", THUMB, b"\xff\xd8\xff", JPEG[:4] + b"\xff" * 3 + JPEG[7:],
]
LABELS = [b"7", b"7\n", b" 7", b"+7", b"-7", b"1_000", b"", b"abc", b"0007", b"12 ", b"7\x00", b"123456789012345678",
          b"1234567890123456789", b"99999999999999999999", b"\xd9\xa3", b"1" * 40, b"3\r\n", b"4\t", b"5\x0b"]


def npy(value):
    out = io.BytesIO()
    np.save(out, value)
    return out.getvalue()


FIELDS = {"image": "jpg;png;gif;bmp;webp;ppm", "label": {"exts": "cls", "kind": "int"}, "key": "__key__",
          "url": "__url__", "vec": {"exts": "npy", "kind": "npy", "dtype": "float32", "ndim": 1},
          "text": {"exts": "txt", "decoder": lambda b: np.frombuffer(b.upper(), np.uint8) if b != b"boom" else 1 / 0},
          "raw": "bin"}


def sample_members(i, rng):
    """One sample's members: every kind of content, now and then a member missing or gzipped."""
    key = f"d/k{i:04d}"
    members = []
    ext = ["jpg", "png", "gif", "bmp", "webp", "ppm"][int(rng.integers(0, 6))]
    members.append((f"{key}.{ext}", IMAGES[int(rng.integers(0, len(IMAGES)))] if rng.random() < 0.6 else JPEG))
    label = LABELS[int(rng.integers(0, len(LABELS)))] if rng.random() < 0.5 else str(i).encode()
    members.append((f"{key}.cls.gz" if rng.random() < 0.03 else f"{key}.cls", gzip.compress(label) if rng.random() < 0.03 else label))
    if rng.random() < 0.95:
        vec = npy(np.arange(i % 4, dtype=np.float64)) if rng.random() < 0.9 else b"junk"
        members.append((f"{key}.npy", vec))
    members.append((f"{key}.txt", b"boom" if rng.random() < 0.05 else b"caption %d" % i))
    if rng.random() < 0.9:
        members.append((f"{key}.bin", bytes(rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8))))
    return members


def runs_of(tmp_path, seed, n, monkeypatch, run_bytes):
    short_runs(monkeypatch, run_bytes)
    rng = np.random.default_rng(seed)
    path = write_tar(str(tmp_path / f"rows-{seed}.tar"), [m for i in range(n) for m in sample_members(i, rng)])
    info = scan_shard(path, offsets=True)
    assert info.members is not None
    patterns, kinds, sizes, _ = ShardRows.from_infos([info]).members.at(0)
    decoder = FieldDecoder([parse_field(k, v) for k, v in FIELDS.items()])
    with open(path, "rb") as f:
        items = list(sliced_runs(f, path, patterns, kinds, sizes, first=0, offset=0, want_ext=decoder.wants,
                                 last=True, chunk=4096))
    assert all(isinstance(r, Run) for r in items)
    return items, decoder


def same(a, b):
    """The run's value ``a`` is the per-sample value ``b``: the same number, or the same dtype, shape and bytes."""
    if isinstance(a, (int, np.integer)) or np.ndim(b) == 0:
        return int(a) == int(b)
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("run_bytes", [0, 1 << 20])  # runs of a few samples (checked row by row), and of all (in bulk)
def test_a_run_decodes_to_what_each_sample_decodes_to(tmp_path, monkeypatch, seed, run_bytes):
    items, decoder = runs_of(tmp_path, seed, 120, monkeypatch, run_bytes)
    if run_bytes:
        assert max(len(r) for r in items) >= BULK_ROWS
    rows = RowDecoder(decoder.fields)
    checked = bad_seen = 0
    for run in items:
        columns, bad = rows.decode(run)
        for i in range(len(run)):
            try:
                expected = decoder.decode(run.sample(i, False, decoder.wants))
            except SampleError:
                expected = None
            # a sample refused alone is in bad (settled alone); so is one the run cannot read (gzipped)
            assert i in bad or expected is not None, run.sample(i)
            bad_seen += i in bad
            if i in bad:
                continue
            for f, value in enumerate(expected):
                assert same(columns[f][i], value), (decoder.fields[f].name, run.sample(i))
            checked += 1
    assert checked > 40 and bad_seen > 20


@contextlib.contextmanager
def reading(blocks):
    """Runs as configured (``blocks``), or every part read sample by sample: the per-sample path."""
    saved = runs.MIN_RUN_SAMPLES
    if not blocks:
        runs.MIN_RUN_SAMPLES = 1 << 40  # a part of samples larger than a run of this many is read one by one
    try:
        yield
    finally:
        runs.MIN_RUN_SAMPLES = saved


def reader_output(config, paths, counts, offsets, blocks, worker=0, start_step=0):
    """Everything one worker's source gives for an epoch: its padded batches, or its error; and its skips."""
    src = WorkerSource(config, data_set(paths, counts, offsets), worker, start_step=start_step)
    out = []
    with reading(blocks):
        try:
            for batch in src.epoch_batches(0, start_step):
                out.append([np.asarray(o).tolist() if not isinstance(o, list) else
                            [(np.asarray(v).dtype.str, np.asarray(v).shape, np.asarray(v).tobytes()) for v in o]
                            for o in batch])
        except DalistreamError as e:
            out.append((type(e).__name__, str(e)))
    return out, dict(src._stats.skipped_by_epoch.get(0, {}))


def shards_with_problems(tmp_path, seed, counts):
    rng = np.random.default_rng(seed)
    paths = []
    for s, n in enumerate(counts):
        members = [m for i in range(n) for m in sample_members(s * 1000 + i, rng)]
        paths.append(write_tar(str(tmp_path / f"p{seed}-{s}.tar"), members))
    infos = build_manifest(paths, offsets=True)
    rows = ShardRows.from_infos(infos)
    return paths, [i.samples for i in infos], SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)


@pytest.mark.parametrize("on_error,missing", [("skip", "skip"), ("skip", "empty"), ("skip", "error"), ("raise", "error")])
@pytest.mark.parametrize("workers,interleave,policy", [(1, False, "exact"), (2, True, "even"), (3, False, "even"),
                                                       (3, True, "exact"), (2, False, "fixed")])
@pytest.mark.slow
def test_blocks_and_single_samples_give_the_same_batches_skips_and_errors(tmp_path, monkeypatch, on_error, missing,
                                                                         workers, interleave, policy):
    short_runs(monkeypatch, 6000)  # runs of a few samples: many runs, and runs across steps
    paths, counts, offsets = shards_with_problems(tmp_path, workers, [37, 23, 41])
    fields = {k: v for k, v in FIELDS.items() if k != "text"} if on_error == "raise" else FIELDS
    config = StreamConfig(sources=tuple(paths), fields=fields, batch_size=8, workers=workers, policy=policy,
                          shuffle=0, interleave=interleave, on_error=on_error, missing=missing, seed=5,
                          **({"batches_per_epoch": 9} if policy == "fixed" else {}))
    for w in range(workers):
        singles = reader_output(config, paths, counts, offsets, False, w)
        blocks = reader_output(config, paths, counts, offsets, True, w)
        assert blocks == singles
        assert reader_output(config, paths, counts, None, True, w) == singles  # the header walk: no layouts
        assert singles[0], "the worker delivered something"
        if on_error == "skip":
            assert sum(singles[1].values()) > 0, "some samples were skipped"
        for start_step in (1, 3):  # resume: the same batches from there
            assert reader_output(config, paths, counts, offsets, True, w, start_step) == \
                reader_output(config, paths, counts, offsets, False, w, start_step)


def test_a_shard_damaged_mid_run_gives_the_same_batches_and_skips(tmp_path, monkeypatch):
    short_runs(monkeypatch, 20000)
    paths, counts, offsets = shards_with_problems(tmp_path, 7, [30, 30])
    data = bytearray(open(paths[0], "rb").read())
    at = offsets.at(0, 12)
    data[at + 257:at + 262] = b"xxxxx"  # sample 12's header is no tar header any more
    with open(paths[0], "wb") as f:
        f.write(bytes(data))
    fields = {"key": "__key__", "raw": "bin"}  # (bin missing now and then: skipped)
    for on_error in ("skip", "raise"):
        config = StreamConfig(sources=tuple(paths), fields=fields, batch_size=4, workers=1, policy="exact",
                              shuffle=0, interleave=False, on_error=on_error, missing="skip", shuffle_shards=False)
        singles = reader_output(config, paths, counts, offsets, False)
        assert reader_output(config, paths, counts, offsets, True) == singles
        if on_error == "skip":
            assert singles[1].get("shards:bad_tar") == 1
        else:
            assert "no tar header at offset" in singles[0][-1][1]


@pytest.mark.parametrize("damage", ["header", "cut"])
def test_a_problem_met_at_a_run_s_bounds_comes_where_read_one_by_one(tmp_path, monkeypatch, damage):
    """A run's last sample waits for the next read: a shard damaged at the first sample of a run
    (its header, or the file cut there), or at the one after, gives the same batches, skips and
    errors read in runs as one sample at a time, on error skip and raise, in spans and interleaved."""
    short_runs(monkeypatch, 20000)
    paths, counts, offsets = shards_with_problems(tmp_path, 11, [30, 30])
    info = scan_shard(paths[0], offsets=True)
    patterns, kinds, sizes, _ = ShardRows.from_infos([info]).members.at(0)
    with open(paths[0], "rb") as f:
        firsts = [r.first for r in sliced_runs(f, paths[0], patterns, kinds, sizes, first=0, offset=0, last=True,
                                               chunk=4096)]
    assert len(firsts) >= 3, "the shard is read in several runs"
    original = open(paths[0], "rb").read()
    fields = {"key": "__key__", "raw": "bin"}
    for victim in (firsts[1], firsts[1] + 1, firsts[2]):
        data = bytearray(original)
        at = offsets.at(0, victim)
        if damage == "header":
            data[at + 257:at + 262] = b"xxxxx"  # no tar header any more
        else:
            del data[at + 700:]  # the shard ends inside this sample
        with open(paths[0], "wb") as f:
            f.write(bytes(data))
        for on_error, workers, interleave in (("skip", 1, False), ("raise", 1, False), ("skip", 2, True),
                                              ("raise", 2, True)):
            config = StreamConfig(sources=tuple(paths), fields=fields, batch_size=4, workers=workers, policy="exact",
                                  shuffle=0, interleave=interleave, on_error=on_error, missing="skip",
                                  shuffle_shards=False, storage_options={"chunk_bytes": 4096})  # (runs of 20 kB)
            met = 0
            for w in range(workers):
                singles = reader_output(config, paths, counts, offsets, False, w)
                assert reader_output(config, paths, counts, offsets, True, w) == singles, (victim, on_error, w)
                met += sum(singles[1].values()) if on_error == "skip" else isinstance(singles[0][-1], tuple)
            assert met > 0, "the damage was met"


def test_an_elastic_resume_s_dropped_positions_read_the_same_either_way(tmp_path, monkeypatch):
    """Samples delivered before a preemption are dropped by raw position inside a part (a run
    is then read sample by sample): the same samples either way, none of the dropped."""
    import dataclasses

    from dalistream.plan import worker_plan
    from dalistream.worker.policy import ErrorPolicy
    from dalistream.worker.reader import PlanReader
    from dalistream.worker.stats import WorkerStats

    short_runs(monkeypatch, 6000)
    paths, counts, offsets = shards_with_problems(tmp_path, 3, [40, 40])
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=8, workers=1, policy="exact",
                          shuffle=0, interleave=False)
    plan = worker_plan(counts, 2, config.plan_layout, config.schedule, 0, 0, 0)
    plan = dataclasses.replace(plan, drop=(3, 4, 5, 17, 41, 79))
    out = []
    for blocks in (False, True):
        reader = PlanReader(config, data_set(paths, counts, offsets), 0)
        with reading(blocks):
            items = list(reader.blocks(plan, ErrorPolicy("raise"), WorkerStats(None, 0, 0)))
        keys = []
        for item in items:
            keys += [bytes(k).decode() for k in item.columns[0]]
        out.append(keys)
    assert out[0] == out[1] and len(out[0]) == 80 - 6
    raw = [f"d/k{shard * 1000 + i:04d}" for shard, first, stop in plan.parts for i in range(first, stop)]
    assert out[0] == [k for q, k in enumerate(raw) if q not in plan.drop]


def test_a_mix_of_indexed_sources_reads_the_same_either_way(tmp_path, monkeypatch):
    """Each source of a mix read run by run (its ``__source__`` on every row) gives the batches
    of the sample-by-sample path."""
    from dalistream import Stream
    from dalistream.manifest import default_location, write_manifest

    short_runs(monkeypatch, 6000)
    mix = {}
    for name, counts, weight in (("a", [30, 25], 0.6), ("b", [12, 9], 0.4)):
        d = tmp_path / name
        d.mkdir()
        paths, _, _ = shards_with_problems(d, len(name), counts)
        write_manifest(build_manifest(paths, offsets=True), default_location(paths))
        mix[name] = (str(d), weight)
    stream = Stream.open(mix, fields={"key": "__key__", "src": "__source__", "label": FIELDS["label"]}, batch_size=8,
                         workers=2, device="cpu", shuffle=0, on_error="skip", seed=3)
    assert all(s.data.offsets is not None and s.data.offsets.members is not None for s in stream.mix.sources)
    sources = set()
    for w in range(2):
        out = []
        for blocks in (False, True):
            src = WorkerSource(stream.config, stream.data, w, mix=stream.mix)
            with reading(blocks):
                out.append([[bytes(np.asarray(v)) for v in b[0]] + [bytes(np.asarray(v)) for v in b[1]]
                            for b in src.epoch_batches(0)])
        assert out[0] == out[1] and out[0]
        sources |= {v for b in out[1] for v in b}
    assert sources >= {b"a", b"b"}


def test_rows_count_as_samples_passed(tmp_path, monkeypatch):
    items, decoder = runs_of(tmp_path, 9, 40, monkeypatch, 1 << 20)
    from dalistream.worker.policy import ErrorPolicy

    policy = ErrorPolicy("skip")
    assert list(policy.watched(iter([Rows([[1, 2, 3]], 3), Rows([[1]], 1)]))) and policy.passed == 4


def halves(run, geometry):
    """``run``'s samples as two runs over its bytes, all but the last and the last, made as
    :func:`~dalistream.tar.runs.sliced_runs` makes a part's runs (:meth:`~dalistream.tar.runs.Geometry.run`)."""
    a, m, b = run.first, run.first + len(run) - 1, run.first + len(run)
    cut = int(geometry.sample_start[m] - geometry.sample_start[a])
    return [geometry.run(run.url, 0, a, m, run.data, 0, (run.buffer, run.at)),
            geometry.run(run.url, 0, m, b, memoryview(run.data)[cut:], 0, (run.buffer, run.at + cut))]


def test_runs_of_shards_with_other_layouts_decode_together_as_alone(tmp_path, monkeypatch):
    """Runs of several shards (each its own member layout) read into one arena, and parts cut
    from runs, decode together to what each decodes to alone (the rows a worker's round holds)."""
    from dalistream.tar.runs import Arena
    from dalistream.worker.rows import decode_runs

    short_runs(monkeypatch, 20000)  # runs of a few samples
    arena = Arena()
    decoder = FieldDecoder([parse_field(k, v) for k, v in FIELDS.items()])
    items, geometries = [], {}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        path = write_tar(str(tmp_path / f"layout-{seed}.tar"), [m for i in range(30) for m in sample_members(i, rng)])
        patterns, kinds, sizes, _ = ShardRows.from_infos([scan_shard(path, offsets=True)]).members.at(0)
        geometries[path] = runs.Geometry(patterns, kinds, sizes, decoder.wants)
        with open(path, "rb") as f:
            items += [(r, f"source-{seed % 2}") for r in sliced_runs(f, path, patterns, kinds, sizes, first=0, offset=0,
                                                                     want_ext=decoder.wants, last=True, chunk=4096,
                                                                     arena=arena)]
    assert len({id(r.names) for r, _ in items}) == 3 and len({id(r.buffer) for r, _ in items}) == 1
    rows = RowDecoder(decoder.fields)
    alone = [rows.decode(r, source) for r, source in items]
    cut, parts_of = [], []
    for k, (r, source) in enumerate(items):  # some runs cut in two over the same bytes (as a part's runs are)
        parts = halves(r, geometries[r.url]) if len(r) > 1 and k % 3 else [r]
        cut += [(part, source) for part in parts]
        parts_of.append(parts)
    assert any(len(p) == 2 for p in parts_of) and any(len(p) == 1 for p in parts_of)
    decode_runs(rows, cut[::-1])  # (in any order)
    for (run, _), parts, (columns, bad) in zip(items, parts_of, alone):
        assert sum(len(p) for p in parts) == len(run)
        assert [i + (p.first - run.first) for p in parts for i in p.decoded[1]] == bad
        for f, column in enumerate(columns):
            together = [v for p in parts for v in p.decoded[0][f]]
            assert len(together) == len(column)
            assert all(i in bad or same(a, b) for i, (a, b) in enumerate(zip(together, column)))
