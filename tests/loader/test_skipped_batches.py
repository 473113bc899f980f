"""Through the real loader: a typo in a field's extension stops training with an error naming
the reason (not epochs of empty batches), and a batch whose samples were all skipped is yielded
empty, so that every rank yields len() batches."""

import io
import logging
import time

import pytest

from dalistream import Loader, Stream
from dalistream.errors import SampleError

from helpers import write_tar

pytestmark = [pytest.mark.dali]


def png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buf, "PNG")
    return buf.getvalue()


def write(d, n_shards, per_shard, bad=()):
    data, paths = png(), []
    for s in range(n_shards):
        members = []
        for i in range(per_shard):
            n = s * per_shard + i
            members += [(f"x{n:04d}.png", data), (f"x{n:04d}.cls", b"dog" if n in bad else str(n % 4).encode())]
        paths.append(write_tar(str(d / f"t-{s}.tar"), members))
    return paths


def test_a_typo_stops_the_loader_naming_the_reason(tmp_path):
    paths = write(tmp_path, 2, 12)
    stream = Stream.open(paths, fields={"image": "jpg", "label": "cls"}, batch_size=4, workers=2, device="cpu",
                         missing="skip", cache_dir=str(tmp_path))
    with Loader(stream) as loader:
        with pytest.raises(SampleError) as info:
            for _ in loader:
                pass
    e = info.value
    assert e.reason == "too_many_skips" and "'missing_field'" in str(e) and "max_skip_fraction" in str(e)
    assert "typo" in (e.hint or "")


@pytest.mark.parametrize("policy", ["even", "exact", "fixed"])
def test_a_batch_of_only_skipped_samples_is_yielded_empty(tmp_path, policy):
    """Every rank yields len() batches, skips or not: a batch whose samples were all skipped comes
    empty (first dimension 0), never left out (a DDP loop's collective would wait for it)."""
    # one shard of 8, its last 4 samples damaged: counted 8 → 2 steps of 4, the second all skipped
    paths = write(tmp_path, 1, 8, bad={4, 5, 6, 7})
    stream = Stream.open(paths, fields={"key": "__key__", "label": "cls"}, batch_size=4, workers=1, device="cpu",
                         on_error="skip", shuffle_shards=False, cache_dir=str(tmp_path), interleave=False, shuffle=0,
                         policy=policy, batches_per_epoch=2 if policy == "fixed" else None)
    assert stream.steps(0) == 2
    with Loader(stream) as loader:
        assert len(loader) == 2
        batches = list(loader)
        assert len(batches) == 2
        assert batches[0]["key"] == ["x0000", "x0001", "x0002", "x0003"]
        if policy != "fixed":  # fixed reads its span again: the good samples come back
            assert batches[1]["key"] == [] and tuple(batches[1]["label"].shape) == (0,)
            stats = loader.stats(wait_s=5)
            assert stats["by_epoch"][0]["skipped"]["samples"] == {"bad_value": 4}
            assert stats["loader"]["batches"] == 2 and stats["loader"]["empty_batches"] == 1
        assert (loader.epoch, loader.step) == (1, 0)  # the epoch ended as planned


def test_a_bad_sample_of_a_one_epoch_run_is_counted_once(tmp_path):
    """The workers read ahead into the next epoch and meet the bad sample again there: that skip
    belongs to epoch 1 (``by_epoch``), not to the totals of the epoch delivered."""
    paths = write(tmp_path, 1, 16, bad={0})
    stream = Stream.open(paths, fields={"key": "__key__", "label": "cls"}, batch_size=4, workers=1, device="cpu",
                         on_error="skip", shuffle_shards=False, shuffle=0, policy="exact", cache_dir=str(tmp_path))
    with Loader(stream) as loader:
        keys = [k for b in loader for k in b["key"]]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the read-ahead reaches epoch 1's first (bad) sample
            stats = loader.stats()
            if stats["by_epoch"].get(1, {}).get("skipped_samples"):
                break
            time.sleep(0.05)
        assert stats["by_epoch"][1]["skipped_samples"] == 1, "no read-ahead into epoch 1: the case is not met"
        assert len(keys) == 15 and stats["skipped_samples"] == 1 and stats["skipped"]["samples"] == {"bad_value": 1}
        assert stats["samples"] == 15 == stats["by_epoch"][0]["samples"]  # read = delivered, read-ahead apart
        assert stats["padded"] == stats["by_epoch"][0]["padded"] == 1


@pytest.mark.parametrize("warn_empty", [True, False])
@pytest.mark.parametrize("cause", ["exact", "skipped"])
def test_empty_batches_are_counted_per_epoch_and_warned_of_when_asked(tmp_path, caplog, warn_empty, cause):
    """An empty batch, of exact's last step (rank 1 of 2, no sample left for it) or of samples all
    skipped: counted per epoch in stats()['by_epoch'] and the summary; with warn_empty=True one
    warning per epoch that had one, naming rank, epoch and step; none without."""
    if cause == "exact":  # 9 samples on 2 ranks x 4: 2 steps, rank 1's second one empty
        paths = write(tmp_path, 1, 9)
        options = dict(policy="exact", rank=1, world_size=2)
    else:  # the last 4 of 8 samples damaged: the second batch all skipped
        paths = write(tmp_path, 1, 8, bad={4, 5, 6, 7})
        options = dict(policy="even", on_error="skip")
    stream = Stream.open(paths, fields={"key": "__key__", "label": "cls"}, batch_size=4, workers=1, device="cpu",
                         shuffle_shards=False, cache_dir=str(tmp_path), interleave=False, shuffle=0, **options)
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        with Loader(stream, warn_empty=warn_empty) as loader:
            for epoch in range(3):
                loader.set_epoch(epoch)
                sizes = [len(batch["key"]) for batch in loader]
                assert sizes[-1] == 0 and 0 not in sizes[:-1]
                assert loader.summary().startswith(f"rank {stream.config.rank}, epoch {epoch}: ")
                assert f"in {len(sizes)} batches (1 empty)" in loader.summary()
            stats = loader.stats(wait_s=5)
    assert [stats["by_epoch"][e]["empty_batches"] for e in range(3)] == [1, 1, 1]
    assert stats["loader"]["empty_batches"] == 3 and stats["loader"]["by_epoch"][2]["empty_batches"] == 1
    said = [r.getMessage() for r in caplog.records if "an empty batch" in r.getMessage()]
    if warn_empty:
        assert [m.split(":")[0] for m in said] == [f"rank {stream.config.rank}, epoch {e}, step {len(sizes)} of "
                                                   f"{len(sizes)}" for e in range(3)]
    else:
        assert said == []
