"""Samples of the header walk gathered into runs are the samples the walk gives, in order: for
every tar writer, with members wanted or not, samples passed over, marked problems and damage;
a run's parts (a worker cuts its last sample off) are the same samples; and a problem of the
stream comes after the samples gathered before it."""

import io

import numpy as np
import pytest

from dalistream.errors import DalistreamError
from dalistream.tar import iter_samples, runs
from dalistream.tar.runs import Arena, Run
from dalistream.tar.walked import WalkedRun, walked_runs

from helpers import shard, write_tar


def flattened(items):
    """Each item's samples as the walk gives them (a run's by its ``sample``), and its key by ``key``."""
    out = []
    for item in items:
        if isinstance(item, Run):
            assert isinstance(item, WalkedRun)
            for i in range(len(item)):
                sample = item.sample(i)
                assert item.key(i) == sample["__key__"] and sample["__index__"] == item.first + i
                start, stop = int(item.member_base[i]), int(item.member_base[i + 1])
                wanted = [k for k, v in sample.items() if v is not None and not k.startswith("__")]
                assert list(item.names[int(item.kinds[i])]) == wanted
                for ext, at, size in zip(wanted, item.member_at[start:stop], item.member_size[start:stop]):
                    assert bytes(item.data[int(at):int(at) + int(size)]) == sample[ext]  # its bytes, side by side
                out.append(sample)
        else:
            out.append(item)
    return out


def walked(path, arena, run_bytes, **kw):
    with open(path, "rb") as f:
        return list(walked_runs(iter_samples(f, path, mark_errors=True, **kw), path, arena, run_bytes))


@pytest.mark.parametrize("writer", ["ustar", "gnu", "pax", "webdataset"])
@pytest.mark.parametrize("run_bytes", [1, 2000, 1 << 20])
def test_runs_of_the_walk_hold_the_samples_it_gives(tmp_path, writer, run_bytes, monkeypatch):
    monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 1)
    path = shard(tmp_path, writer, 3, n=60)
    for kw in ({}, {"want_ext": {"jpg", "cls"}.__contains__}, {"keep": lambda i: i % 7 != 3}):
        with open(path, "rb") as f:
            expected = list(iter_samples(f, path, mark_errors=True, **kw))
        for arena in (Arena(), None):
            items = walked(path, arena, run_bytes, **kw)
            assert flattened(items) == expected
            if run_bytes == 1 << 20 and not kw:
                assert max(len(i) for i in items if isinstance(i, Run)) > 10  # (gathered, not one by one)


def test_samples_passed_over_marked_or_large_stay_alone(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    members = []
    for i in range(30):
        members += [(f"k{i:03d}.jpg", bytes(rng.integers(0, 256, 5000 if i == 17 else 300, dtype=np.uint8))),
                    (f"k{i:03d}.cls", b"%d" % i)]
    members.insert(20, ("k009.cls", b"twice"))  # sample 9: an extension twice (a marked problem)
    path = write_tar(str(tmp_path / "alone.tar"), members)
    monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 4)  # 1 << 14 bytes a run: a sample over 4 kB stays alone
    items = walked(path, Arena(), 1 << 14, keep=lambda i: i != 25)
    alone = [item["__index__"] for item in items if not isinstance(item, Run)]
    assert alone == [9, 17, 25]
    assert "__error__" in items[[i for i, item in enumerate(items) if not isinstance(item, Run)][0]]
    assert [len(r) for r in items if isinstance(r, Run)] == [9, 7, 7, 4]  # the runs between them


def test_a_stream_problem_comes_after_the_samples_gathered_before_it(tmp_path):
    path = shard(tmp_path, "ustar", 2, n=20)
    data = open(path, "rb").read()
    cut = io.BytesIO(data[:len(data) // 2])
    got = []
    with pytest.raises(DalistreamError) as error:
        for item in walked_runs(iter_samples(cut, path, mark_errors=True), path, Arena(), 1 << 20):
            got.append(item)
    with open(path, "rb") as f:
        whole = list(iter_samples(f, path))
    delivered = flattened(got)
    assert delivered and delivered == whole[:len(delivered)] and len(delivered) < 20
    assert error.value.reason == "truncated"
