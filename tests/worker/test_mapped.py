"""A share read from one mapping of its shards (worker/mapped.py): the mapping itself (the files'
bytes side by side, unmapped with its last view, refused for an empty or missing file), kept
across shares and epochs while the files are the same, more files mapped after them while there
is room, and the next share
read in pieces over the steps of the one before: the columns' batches, byte for byte."""

import ctypes
import gc
import os
import shutil

import numpy as np
import pytest

from dalistream.worker import WorkerSource, epochfeed, mapped
from dalistream.worker.mapped import Region, ShareMaps

from tests.worker.test_epochfeed import by_columns, read, shares_read
from tests.worker.test_columns import config, data_set, make_shards


def mapped_ranges():
    """The start address of every mapping of this process."""
    with open("/proc/self/maps") as f:
        return {int(line.split("-", 1)[0], 16) for line in f}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux only")
def test_a_region_holds_the_files_side_by_side_and_is_unmapped_with_its_last_view(tmp_path):
    rng = np.random.default_rng(2)
    paths, contents = [], []
    for k, size in enumerate((1, 4095, 4096, 70_001)):
        contents.append(rng.bytes(size))
        paths.append(str(tmp_path / f"f{k}"))
        with open(paths[-1], "wb") as f:
            f.write(contents[-1])
    region = Region(paths)
    assert region.sizes == [len(c) for c in contents]
    for at, content in zip(region.offsets.tolist(), contents):
        assert bytes(region.array[at:at + len(content)]) == content and at % 4096 == 0
    assert np.all(np.diff(region.offsets) > np.array(region.sizes[:-1]))  # (a page apart at least)
    base = ctypes.addressof(region.buffer)
    view = region.array[region.offsets[3]:][:100]
    del region
    gc.collect()
    assert base in mapped_ranges() and bytes(view) == contents[3][:100]  # (the view keeps it mapped)
    del view
    gc.collect()
    assert base not in mapped_ranges()


def test_a_region_refuses_an_empty_or_missing_file(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "full").write_bytes(b"x" * 10)
    for paths in ([str(tmp_path / "full"), str(tmp_path / "empty")], [str(tmp_path / "full"), str(tmp_path / "no")]):
        with pytest.raises(OSError):
            Region(paths)


def test_a_mapping_serves_while_its_files_are_the_same_and_grows_while_there_is_room(tmp_path, monkeypatch):
    """A region serves every share whose files it maps as they are now; a file it lacks, or one
    replaced since, is mapped after the others, which stay where they are (their pages mapped:
    no fault again at their next touch); where there is no room left, a new region."""
    paths = []
    for k in range(3):
        paths.append(str(tmp_path / f"f{k}"))
        with open(paths[-1], "wb") as f:
            f.write(bytes([k]) * 5000)
    maps = ShareMaps()
    first = maps.region_of(paths[:2], 4000)
    at = dict(first.place)
    assert maps.region_of(paths[:2], 4000) is first and maps.region_of(paths[1:2], 10) is first
    assert maps.region_of(paths, 10) is first and {p: first.place[p] for p in paths[:2]} == at
    os.replace(shutil.copy(paths[1], str(tmp_path / "copy")), paths[1])  # (the same bytes, another file)
    assert maps.region_of(paths, 10) is first
    moved = first.place[paths[1]][0]
    assert moved > at[paths[1]][0] and bytes(first.array[moved:moved + 3]) == b"\x01" * 3
    assert first.place[paths[0]] == at[paths[0]]
    monkeypatch.setattr(mapped, "REGION_BYTES", 9000)  # (a file of 5,000 bytes takes two pages and one apart)
    maps = ShareMaps()
    small = maps.region_of(paths[:2], 10)
    assert maps.region_of(paths[:1], 10) is small
    full = maps.region_of(paths, 10)  # (no room for a third file)
    assert full is not small and sorted(full.place) == sorted(paths)
    assert maps.region_of(paths, 8000) is full  # (files over the bound: mapped anew once that many bytes are read)
    assert maps.region_of(paths, 1000) is not full


@pytest.mark.parametrize("workers", [1, 2])
def test_the_next_share_is_read_in_pieces_over_the_steps_of_the_one_before(tmp_path, monkeypatch, workers):
    """Shares of several steps, each in several pieces: the next share's pieces are read while
    this one is given out, a few at each step and all before its last step, none left for the
    share's own first step; the columns' batches."""
    paths = make_shards(tmp_path, n_shards=6, per_shard=60)
    data = data_set(paths, per_shard=60)
    c = config(paths, workers=workers)
    count, patch = shares_read(monkeypatch, 6000, 400_000)  # (shares of 8–16 steps of 25–50 kB)
    events = []
    piece, finish, take = mapped.MappedShare.piece, mapped.MappedShare.finish, epochfeed.EpochFeed.take

    def logged_piece(self):
        events.append(("piece", self))  # (the share itself: an id may be reused once it is freed)
        piece(self)

    def logged_finish(self):
        events.append(("finish", self, self.done, self.pieces))
        return finish(self)

    def logged_take(self, step):
        events.append(("take", step))
        return take(self, step)

    for worker in range(workers):
        for e in (0, 1):
            events.clear()
            count[0] = 0
            patch()
            monkeypatch.setattr(mapped, "PIECE_BYTES", 20_000)
            monkeypatch.setattr(mapped.MappedShare, "piece", logged_piece)
            monkeypatch.setattr(mapped.MappedShare, "finish", logged_finish)
            monkeypatch.setattr(epochfeed.EpochFeed, "take", logged_take)
            batches = read(WorkerSource(c, data, worker), e, monkeypatch)[0]
            assert batches == by_columns(c, data, worker, (e,), monkeypatch)[0]
            finished = [ev for ev in events if ev[0] == "finish"]
            assert count[0] >= 3 and len(finished) == count[0]
            spread = 0
            for _, share, done, pieces in finished[1:]:  # (every share after the first: read before it is taken)
                assert done == pieces >= 1
                at = [i for i, ev in enumerate(events) if ev[0] == "piece" and ev[1] is share]
                steps = [sum(ev[0] == "take" for ev in events[:i]) for i in at]  # (the steps they came at)
                assert len(steps) == pieces and steps == sorted(steps)
                spread += len(set(steps)) >= 2
            assert spread >= 1  # (shares of several pieces, over several steps)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_first_batch_waits_for_the_first_share_alone(tmp_path, monkeypatch, workers):
    """Each epoch's first batch is given out once its first share is read, before any piece of the
    next share; the next batches read a piece of the next share each at most, shares growing from
    the first (the first steps of a job: what DALI waits for before its first batch). The columns'
    batches."""
    paths = make_shards(tmp_path, n_shards=6, per_shard=60)
    data = data_set(paths, per_shard=60)
    c = config(paths, workers=workers)
    count, patch = shares_read(monkeypatch, 300_000, 2_400_000, growth=4)  # (a first share of 4–9 steps)
    events = []
    piece, take = mapped.MappedShare.piece, epochfeed.EpochFeed.take

    def logged_piece(self):
        events.append(("piece", self))
        piece(self)

    def logged_take(self, step):
        events.append(("take", self))
        return take(self, step)

    for worker in range(workers):
        for e in (0, 1):
            events.clear()
            patch()
            monkeypatch.setattr(mapped, "PIECE_BYTES", 5_000)
            monkeypatch.setattr(mapped.MappedShare, "piece", logged_piece)
            monkeypatch.setattr(epochfeed.EpochFeed, "take", logged_take)
            batches = read(WorkerSource(c, data, worker), e, monkeypatch)[0]
            assert batches == by_columns(c, data, worker, (e,), monkeypatch)[0]
            takes = [i for i, ev in enumerate(events) if ev[0] == "take"]
            first_share = {ev[1] for ev in events[:takes[0]] if ev[0] == "piece"}
            assert len(first_share) == 1  # (before the first batch: the first share's own pieces only)
            between = [sum(ev[0] == "piece" for ev in events[a + 1:b]) for a, b in zip(takes[:3], takes[1:4])]
            assert max(between) <= 1, between  # (the second to fourth batches: a piece each at most)


def test_a_shard_rewritten_between_epochs_is_mapped_anew(tmp_path, monkeypatch):
    """A worker's shards stay mapped from one epoch to the next (nothing mapped anew); a shard
    replaced by another file between them is mapped anew, alone, and read as it is now."""
    paths = make_shards(tmp_path, n_shards=3, per_shard=30)
    data = data_set(paths, per_shard=30)
    c = config(paths, workers=1)
    made = []
    add = mapped.Region.add

    def counted(self, files):
        made.extend(files)
        return add(self, files)

    source = WorkerSource(c, data, 0)
    got = []
    for e in (0, 1, 2):
        if e == 2:  # (the same samples, another file: a copy renamed over it)
            os.replace(shutil.copy(paths[1], str(tmp_path / "copy.tar")), paths[1])
        made.clear()
        monkeypatch.setattr(mapped.Region, "add", counted)
        got.append(read(source, e, monkeypatch))
        assert got[-1][2] == 1 and sorted(made) == {0: sorted(paths), 1: [], 2: [paths[1]]}[e]
    assert [b for b, _, _, _ in got] == by_columns(c, data, 0, (0, 1, 2), monkeypatch)
