"""Video and audio batched by duration (``LengthBuckets(key="duration_ms")``) and video by
resolution (``AspectBuckets`` over the probed ``width``/``height``), through the loader and DALI
(CPU), from the keys ``dalistream index --keys video`` / ``audio`` records: every batch one
bucket, every clip once (policy ``exact``), and an epoch saved mid-way goes on with the batches
it would have had."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dalistream import AspectBuckets, LengthBuckets, Loader, Stream
from dalistream.cli import main
from dalistream.errors import ManifestError

from helpers import write_tar
from media import make_clip, make_wav

pytestmark = [pytest.mark.dali]
pytest.importorskip("av")
EDGES = (1000, 2000, 3000)
SIZES = ((48, 32), (32, 32), (32, 48))


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """Shards of 41 clips (H.264 and VP9, 3 to 43 frames at 12 fps, three resolutions) and of 37
    WAV files (0.1 to 3.7 s), indexed with their keys; returns each set's folder and truth."""
    root = tmp_path_factory.mktemp("media-buckets")
    rng = np.random.default_rng(3)
    sets = {}
    for kind, n in (("video", 41), ("audio", 37)):
        truth, members = {}, []
        for k, i in enumerate(rng.permutation(n)):
            key = f"{kind[0]}{k:03d}"
            if kind == "video":
                width, height = SIZES[k % 3]
                codec, ext = ("h264", "mp4") if k % 2 else ("vp9", "webm")
                members.append((f"{key}.{ext}", make_clip(codec, 3 + int(i), size=width, height=height)))
                truth[key] = {"ms": round(1000 * (3 + int(i)) / 12), "size": (width, height)}
            else:
                members.append((f"{key}.wav", make_wav(800 * (1 + int(i)), rate=8000, channels=1)))
                truth[key] = {"ms": 100 * (1 + int(i))}
            members.append((f"{key}.txt", key.encode()))
        folder = root / kind
        folder.mkdir()
        for s in range(0, len(members), 20):
            write_tar(str(folder / f"{kind}-{s // 20:02d}.tar"), members[s:s + 20])
        assert main(["index", str(folder), "--keys", kind]) == 0  # the manifest beside the shards
        sets[kind] = (str(folder), truth, str(root / f"cache-{kind}"))
    return sets


def stream(media, kind, buckets, rank=0, world=1, batch=3, workers=2):
    folder, _, cache = media[kind]
    return Stream.open(folder, fields={"key": "__key__"}, batch_size=batch, workers=workers, rank=rank,
                       world_size=world, device="cpu", seed=5, policy="exact", cache_dir=cache, buckets=buckets)


def duration_bucket(ms):
    return int(np.searchsorted(EDGES, ms, side="left"))


def aspect_bucket(size):
    w, h = size
    return int(np.argmin([abs(np.log(w / h) - np.log(a / b)) for a, b in SIZES]))


@pytest.mark.parametrize("kind", ["video", "audio"])
@pytest.mark.parametrize("world", [1, 2])
def test_one_duration_range_a_batch_every_clip_once(media, kind, world):
    truth = media[kind][1]
    keys = []
    for rank in range(world):
        with Loader(stream(media, kind, LengthBuckets(key="duration_ms", edges=EDGES), rank, world)) as loader:
            for b in loader:
                if not b["key"]:  # policy exact: a rank's step of padding only (another rank's batch)
                    continue
                buckets = {duration_bucket(truth[k]["ms"]) for k in b["key"]}
                assert buckets <= {int(b["bucket"][0])} and len(set(b["bucket"].tolist())) == 1
                edge = EDGES[int(b["bucket"][0])] if int(b["bucket"][0]) < len(EDGES) else -1
                assert set(b["bucket_length"].tolist()) == {edge}  # the bucket's upper edge, in ms
                keys += b["key"]
    assert sorted(keys) == sorted(truth)
    assert len({duration_bucket(t["ms"]) for t in truth.values()}) == len(EDGES) + 1  # every bucket used


def test_video_by_resolution_with_aspect_buckets(media):
    truth = media["video"][1]
    keys = []
    with Loader(stream(media, "video", AspectBuckets(SIZES))) as loader:
        for b in loader:
            assert {aspect_bucket(truth[k]["size"]) for k in b["key"]} <= {int(b["bucket"][0])}
            keys += b["key"]
    assert sorted(keys) == sorted(truth)


@pytest.mark.parametrize("kind,stop", [("video", 2), ("video", 5), ("audio", 4)])
def test_saved_mid_epoch_goes_on_with_the_same_batches(media, kind, stop):
    buckets = LengthBuckets(key="duration_ms", edges=EDGES)
    with Loader(stream(media, kind, buckets)) as loader:
        full = [b["key"] for b in loader]
    with Loader(stream(media, kind, buckets)) as first:
        it = iter(first)
        head = [next(it)["key"] for _ in range(stop)]
        state = first.state_dict()
    assert state["plan"]["buckets"] == {"kind": "LengthBuckets", "per": "rank", "field": None,
                                        "edges": list(EDGES), "key": "duration_ms"}
    with Loader(stream(media, kind, buckets)) as rest:
        rest.load_state_dict(state)
        assert len(rest) == len(full) - stop
        assert head + [b["key"] for b in rest] == full


def test_a_set_without_durations_asks_for_the_keys(media, tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    write_tar(str(folder / "p-0.tar"), [("a.mp4", make_clip("h264", 4)), ("b.mp4", make_clip("h264", 5))])
    with pytest.raises(ManifestError, match=r"--keys video \(or audio\)"):
        Stream.open(str(folder), fields={"key": "__key__"}, batch_size=2, device="cpu", policy="exact",
                    cache_dir=str(tmp_path / "cache"), buckets=LengthBuckets(key="duration_ms", edges=EDGES))
