"""The reader of one worker's parts: spans cut inside shards read exactly their samples, by
header without offsets (skipping headers), by header from offsets (a seek and an end), and cut
out by the manifest's member layout (no header parsed), and stale counts found where they show,
naming the shard, counted vs found, and where the count came from."""

import itertools
import os

import numpy as np
import pytest

from dalistream.config import StreamConfig
from dalistream.errors import ManifestError, ShardFormatError
from dalistream.io.streams import ShardSequence
from dalistream.manifest import build_manifest
from dalistream.manifest.offsets import SampleOffsets
from dalistream.manifest.rows import ShardRows
from dalistream.plan import worker_plan
from dalistream.tools.quality import rank_batches
from dalistream.worker import WorkerSource
from dalistream.worker.policy import ErrorPolicy
from dalistream.worker.numbering import Numbering
from dalistream.worker.part import read_part
from dalistream.worker.reader import PlanReader
from dalistream.worker.stats import WorkerStats

from helpers import data_set, key_shards, uneven_sizes, write_tar


def source_keys(config, paths, counts, rank, w, epoch, offsets=None, start_step=0, source=None):
    src = WorkerSource(config.replace(rank=rank), data_set(paths, counts, offsets, count_source=source), w,
                       start_epoch=epoch, start_step=start_step)
    out = []
    for keys, valid in src.epoch_batches(epoch, start_step):
        out.append([bytes(k).decode() for k, v in zip(keys, valid) if int(v)])
    return out


def indexed(paths, reading):
    """What the reader is given to read by: nothing (headers), every sample's offset (offsets),
    or the offsets and the member layout (members)."""
    if reading == "headers":
        return None
    infos = build_manifest(paths, offsets=True)
    if reading == "offsets":
        return [i.offsets for i in infos]
    rows = ShardRows.from_infos(infos)
    assert rows.members is not None and all(i.members is not None for i in infos if i.samples)
    return SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)


READINGS = ["headers", "offsets", "members"]


def expected_keys(counts, layout, schedule, epoch, rank, w, interleave=False):
    """Worker ``w``'s keys in delivery order: its span front to back; interleaved, the samples of
    its slot's positions step by step, as the shuffle-quality measure computes them."""
    if not interleave:  # its stretch of the sequence, the samples even leaves out passed over
        plan = worker_plan(counts, len(counts), layout, schedule, epoch, rank, w)
        raw = [f"s{s:03d}/{i:05d}" for s, a, b in plan.parts for i in range(a, b)]
        return [key for k, key in enumerate(raw) if k not in set(plan.drop)]
    lo = layout.slot_offsets[w]
    ids = rank_batches(counts, layout, schedule, epoch, 0, columns=True)[rank][:, lo:lo + layout.slots[w]]
    starts = np.concatenate([[0], np.cumsum(counts)])
    shard = lambda i: int(np.searchsorted(starts, i, side="right")) - 1  # noqa: E731
    return [f"s{shard(i):03d}/{i - starts[shard(i)]:05d}" for i in ids.ravel().tolist() if i >= 0]


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("reading", READINGS)
@pytest.mark.parametrize("R,W,B", [(1, 2, 4), (2, 3, 7), (3, 2, 5), (4, 4, 8)])
def test_every_worker_reads_exactly_its_span(tmp_path, reading, R, W, B, interleave):
    sizes = uneven_sizes(9, seed=R * 10 + W, low=1, high=14) + [0]
    paths = key_shards(str(tmp_path), sizes)
    offsets = indexed(paths, reading)
    for policy in ("even", "exact"):
        config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=B, workers=W,
                              world_size=R, policy=policy, seed=4, interleave=interleave, shuffle=0)
        seen = []
        for epoch, r, w in itertools.product(range(2), range(R), range(W)):
            got = [k for batch in source_keys(config, paths, sizes, r, w, epoch, offsets) for k in batch]
            assert got == expected_keys(sizes, config.layout, config.schedule, epoch, r, w, interleave)
            seen += [(epoch, k) for k in got]
        assert len(seen) == len(set(seen))  # no sample twice in an epoch
        if policy == "exact":
            assert len(seen) == 2 * sum(sizes)


@pytest.mark.parametrize("reading", ["offsets", "members"])
def test_a_part_with_offsets_never_reads_outside_itself(tmp_path, reading):
    # the bytes before the part's start and after its end are garbage: only a seek and a clean
    # end at the next sample's offset can read the part
    sizes = [12]
    paths = key_shards(str(tmp_path), sizes)
    index = indexed(paths, reading)
    offsets = build_manifest(paths, offsets=True)[0].offsets
    data = bytearray(open(paths[0], "rb").read())
    lo, hi = offsets[4], offsets[9]
    data[:lo] = b"\xff" * lo
    data[hi:] = b"\xee" * (len(data) - hi)
    with open(paths[0], "wb") as f:
        f.write(bytes(data))
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=1, workers=1)
    reader = PlanReader(config, data_set(paths, sizes, index), 0)
    stats = WorkerStats(None, 0, 0)
    start, end = reader.layouts.byte_range(0, 4, 9)
    assert (start, end) == (lo, hi)
    assert (reader.layouts.layout(0, 4, 9, start) is not None) == (reading == "members")
    shards = ShardSequence(paths, ranges=[(start, end)])
    got = [s["__key__"] for s in read_part(reader.context(), shards, 0, 0, 4, 9, start, end, stats, Numbering(4, 5))
           for s in ([s.sample(i) for i in range(len(s))] if hasattr(s, "sample") else [s])]
    assert got == [f"s000/{i:05d}" for i in range(4, 9)]


def _rewrite(path, n, prefix="s000"):
    write_tar(path, [m for i in range(n) for m in ((f"{prefix}/{i:05d}.cls", b"1"), (f"{prefix}/{i:05d}.bin", b"xy"))])


@pytest.mark.parametrize("found", [7, 13])
@pytest.mark.parametrize("source,hint", [("manifest /data/m.json", "dalistream index"),
                                         ("header scan, cached in /c", "rescan")])
def test_a_stale_count_names_the_shard_counted_found_and_the_source(tmp_path, found, source, hint):
    paths = key_shards(str(tmp_path), [10, 10])
    _rewrite(paths[1], found, "s001")  # shard 1 changed after it was counted
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=4, workers=1,
                          policy="exact", shuffle_shards=False)
    with pytest.raises(ManifestError) as e:
        source_keys(config, paths, [10, 10], 0, 0, 0, source=source)
    text = str(e.value)
    assert e.value.url == paths[1] and e.value.reason == "stale_count"
    assert f"holds {'at least 11' if found > 10 else found} samples but 10 were counted ({source})" in text
    assert hint in text


def test_a_stale_count_under_skip_is_counted_never_silent(tmp_path):
    paths = key_shards(str(tmp_path), [6, 6])
    _rewrite(paths[0], 9)  # longer: three samples no one owns
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=3, workers=1,
                          policy="exact", shuffle_shards=False, on_error="skip")
    reader = PlanReader(config, data_set(paths, [6, 6]), 0)
    plan = WorkerSource(config, data_set(paths, [6, 6]), 0).plans(0)[0]
    policy = ErrorPolicy("skip")
    got = [k for b in reader.blocks(plan, policy, WorkerStats(None, 0, 0)) for k in b.columns[0]]
    assert len(got) == 12
    assert dict(policy.skipped) == {"shards:stale_count": 1}


def test_a_cut_shard_is_cut_at_the_same_sample_by_offsets_by_members_and_by_headers(tmp_path):
    sizes = [5, 23, 2]
    paths = key_shards(str(tmp_path), sizes)
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=6, workers=3,
                          world_size=2, seed=1)
    for r, w in itertools.product(range(2), range(3)):
        by_headers = source_keys(config, paths, sizes, r, w, 1)
        for reading in ("offsets", "members"):
            assert source_keys(config, paths, sizes, r, w, 1, indexed(paths, reading)) == by_headers


def test_resume_in_the_middle_of_a_cut_shard(tmp_path):
    sizes = [7, 31, 4, 19]
    paths = key_shards(str(tmp_path), sizes)
    for shuffle in (0, 5):
        config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=4, workers=2,
                              world_size=2, seed=2, shuffle=shuffle)
        for r, w, off in itertools.product(range(2), range(2), [indexed(paths, x) for x in READINGS]):
            full = source_keys(config, paths, sizes, r, w, 1, off)
            for k in range(1, len(full)):
                assert source_keys(config, paths, sizes, r, w, 1, off, start_step=k) == full[k:]
    assert os.path.exists(paths[1])


@pytest.mark.parametrize("found", [7, 13])
def test_a_stale_count_is_found_when_reading_by_the_member_layout_too(tmp_path, found):
    paths = key_shards(str(tmp_path), [10, 10])
    index = indexed(paths, "members")  # indexed before shard 1 changed: more or fewer samples, the same sizes
    write_tar(paths[1], [m for i in range(found) for m in ((f"s001/{i:05d}.cls", b"1"), (f"s001/{i:05d}.bin", b"xyzxyz"))])
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=4, workers=1,
                          policy="exact", shuffle_shards=False)
    with pytest.raises(ManifestError) as e:
        source_keys(config, paths, [10, 10], 0, 0, 0, index, source="manifest /data/m.json")
    assert e.value.url == paths[1] and e.value.reason == "stale_count"
    assert f"holds {'at least 11' if found > 10 else found} samples but 10 were counted" in str(e.value)


def test_a_shard_rewritten_with_other_member_sizes_is_named_not_misread(tmp_path):
    """Same number of samples, other sizes: the member layout no longer fits. The reader finds
    another size in the member's header, or no header where the layout puts one, and says so,
    naming the shard: not one sample of that shard is delivered from misplaced bytes."""
    paths = key_shards(str(tmp_path), [10, 10])
    index = indexed(paths, "members")
    for size, found in ((700, "has 700 bytes, the manifest's member layout says 6"), (3, "has 3 bytes")):
        write_tar(paths[1], [m for i in range(10) for m in ((f"s001/{i:05d}.cls", b"1"), (f"s001/{i:05d}.bin", b"x" * size))])
        config = StreamConfig(sources=tuple(paths), fields={"key": "__key__", "data": "bin"}, batch_size=4, workers=1,
                              policy="exact", shuffle_shards=False)
        src = WorkerSource(config, data_set(paths, [10, 10], index), 0)
        delivered = []
        with pytest.raises(ShardFormatError) as e:
            for keys, data, valid in src.epoch_batches(0):
                delivered += [bytes(k).decode() for k, v in zip(keys, valid) if int(v)]
        assert not any(k.startswith("s001") for k in delivered)
        assert e.value.url == paths[1] and e.value.reason == "bad_tar" and e.value.member == "s001/00000.bin"
        assert found in str(e.value) and "dalistream index" in str(e.value)


def resumed_keys(config, paths, sizes, resume, r, w, off, start_step=0):
    src = WorkerSource(config.replace(rank=r), data_set(paths, sizes, off), w, start_epoch=1, start_step=start_step,
                       resume=resume)
    return [[bytes(k).decode() for k, v in zip(keys, valid) if int(v)] for keys, valid in src.epoch_batches(1, start_step)]


@pytest.mark.parametrize("reading", READINGS)
@pytest.mark.parametrize("shuffle", [0, 5])
def test_an_elastic_resume_reads_the_rest_once_by_every_reading(tmp_path, reading, shuffle):
    """Segment (2 ranks x 2 workers x batch 4, 3 steps), then 1 rank x 3 workers x batch 6: the
    workers of both deliver the epoch once, the drops read (or seeked past) but never delivered,
    whether parts open by offsets, by member layout or by headers; and a resume within the
    resumed segment yields the tail of its batches."""
    sizes = [7, 31, 0, 4, 19]
    paths = key_shards(str(tmp_path), sizes)
    off = indexed(paths, reading)
    first = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=4, workers=2, world_size=2,
                         seed=2, shuffle=shuffle, policy="exact")
    seen = [k for r, w in itertools.product(range(2), range(2))
            for batch in source_keys(first, paths, sizes, r, w, 1, off)[:3] for k in batch]
    second = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=6, workers=3, world_size=1,
                          seed=2, shuffle=shuffle, policy="exact")
    resume = ((2, 2, 4, 3),)
    for w in range(3):
        full = resumed_keys(second, paths, sizes, resume, 0, w, off)
        seen += [k for batch in full for k in batch]
        assert resumed_keys(second, paths, sizes, resume, 0, w, off, start_step=2) == full[2:]
    assert sorted(seen) == sorted(f"s{s:03d}/{i:05d}" for s, n in enumerate(sizes) for i in range(n))


def test_a_part_s_numbering_bisects_what_a_walk_over_its_samples_counts():
    """Ordinals, samples passed over and the head of a part, against a walk over its samples
    (drops take no ordinal; a start position and a shuffle buffer's window do)."""
    from dalistream.worker.numbering import Numbering

    rng = np.random.default_rng(3)
    for _ in range(300):
        first, size, raw, base = (int(x) for x in rng.integers(0, 40, 4))
        drop = sorted({int(x) for x in rng.integers(0, 120, int(rng.integers(0, 12)))})
        start = int(rng.integers(0, 60)) if rng.random() < 0.5 else 0
        gone = frozenset(int(x) for x in rng.integers(0, 80, int(rng.integers(0, 6)))) if rng.random() < 0.3 else frozenset()
        numbering = Numbering(first, size, raw, base, drop, start, gone)
        ordinal, walked, passed = base, [], []
        for i in range(size):
            walked.append(ordinal)
            if raw + i in drop:
                passed.append(first + i)
                continue
            if ordinal < start or ordinal in gone:
                passed.append(first + i)
            ordinal += 1
        head = 0
        while head < size and first + head in passed:
            head += 1
        assert numbering.head == head
        assert [numbering.skip(first + i) for i in range(size)] == [first + i in passed for i in range(size)]
        assert [numbering.ordinal(first + i) for i in range(size) if first + i not in passed] == \
            [o for i, o in enumerate(walked) if first + i not in passed]
        lo, hi = sorted(int(x) for x in rng.integers(first, first + size + 1, 2))
        assert numbering.passed(lo, hi) == [n for n in passed if lo <= n < hi]
