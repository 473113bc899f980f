"""``dalistream write`` from videos and audio files (class folders, or a CSV/JSONL with
captions): each file written under its own extension and probed, its keys (size, frames,
duration, rate, codec; sample rate, channels) in the manifest; a zero-length, cut, random or
stream-less file refused naming every one at once, or left out, counted and named; the written
set batches by duration."""

import csv
import json
import os
import tarfile

import numpy as np
import pytest

from dalistream import LengthBuckets, Loader, Stream
from dalistream.cli import main
from dalistream.errors import SampleError
from dalistream.kinds.audio import probe_audio
from dalistream.kinds.video import probe
from dalistream.writer import write

from media import make_clip, make_flac, make_wav

pytest.importorskip("av")
CODEC_IDS = {"h264": 27, "vp9": 167}


@pytest.fixture
def media(tmp_path):
    """Class folders ``walk``/``talk`` of H.264 and VP9 clips (several lengths and sizes) and WAV
    and FLAC files; returns the folder and each file's expected keys by its path."""
    root = tmp_path / "media"
    truth = {}
    for c, name in enumerate(("talk", "walk")):
        (root / name).mkdir(parents=True)
        for i in range(4):
            codec, ext = ("h264", "mp4") if i % 2 else ("vp9", "webm")
            frames, width = 4 + 5 * i + c, 32 + 16 * (i % 2)
            path = root / name / f"clip{i}.{ext}"
            path.write_bytes(make_clip(codec, frames, size=width, height=32))
            truth[str(path)] = {"width": width, "height": 32, "frames": frames, "duration_ms": round(frames * 1000 / 12),
                                "fps_milli": 12000, "codec": CODEC_IDS[codec], "sample_rate": -1, "channels": -1}
        for i, (ext, samples, rate) in enumerate([("wav", 4000, 8000), ("flac", 24000, 16000), ("wav", 900, 8000)]):
            path = root / name / f"sound{i}.{ext}"
            path.write_bytes(make_wav(samples, rate=rate, seed=i + c) if ext == "wav" else make_flac(samples, rate=rate))
            truth[str(path)] = {"width": -1, "height": -1, "frames": -1, "duration_ms": round(samples * 1000 / rate),
                                "fps_milli": -1, "codec": -1, "sample_rate": rate, "channels": 2 if ext == "wav" else 1}
    return root, truth


def written(out):
    """``{key: {ext: bytes}}`` of the shards and ``{key: {column: value}}`` of the manifest's keys,
    and the manifest's ``source.keys`` (key -> file relative to the source root)."""
    members = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(out, name)) as tar:
                for m in tar:
                    key, ext = m.name.split(".", 1)
                    members.setdefault(key, {})[ext] = tar.extractfile(m).read()
    manifest = json.load(open(os.path.join(out, "dalistream-manifest.json")))
    keys = {}
    for row in manifest["shards"]:
        names = members_of(out, row["url"])
        for j, key in enumerate(names):
            keys[key] = {column: values[j] for column, values in (row.get("keys") or {}).items()}
    return members, keys, manifest["source"]


def members_of(out, url):
    """The keys of shard ``url``'s samples, in tar order (the manifest row's order)."""
    with tarfile.open(os.path.join(out, os.path.basename(url))) as tar:
        return list(dict.fromkeys(m.name.split(".", 1)[0] for m in tar))


@pytest.mark.parametrize("processes", [1, 2])
def test_a_folder_of_videos_and_audio_is_written_and_probed(media, tmp_path, processes):
    root, truth = media
    out = tmp_path / "out"
    done = write(str(root), str(out), samples_per_shard=4, processes=processes)
    assert done["samples"] == len(truth) == 14 and done["classes"] == ["talk", "walk"] and done["bad"] == []
    members, keys, source = written(out)
    for key, rel in source["keys"].items():
        path = str(root / rel)
        ext = path.rsplit(".", 1)[1]
        assert members[key][ext] == open(path, "rb").read()  # under its own extension, byte for byte
        assert members[key]["cls"] == str(["talk", "walk"].index(rel.split("/")[0])).encode()
        assert {c: keys[key].get(c, -1) for c in truth[path]} == truth[path], rel


@pytest.mark.parametrize("form", ["csv", "jsonl"])
def test_a_listing_with_captions(media, tmp_path, form):
    root, truth = media
    paths = sorted(truth)
    listing = tmp_path / f"list.{form}"
    with open(listing, "w", newline="") as f:
        for i, path in enumerate(paths):
            caption = f"sample {i} " + "x" * i
            if form == "csv":
                csv.writer(f).writerow([os.path.relpath(path, tmp_path), i % 3, caption])
            else:
                f.write(json.dumps({"path": os.path.relpath(path, tmp_path), "label": i % 3, "caption": caption}) + "\n")
    out = tmp_path / "out"
    write(str(listing), str(out), samples_per_shard=5, processes=1, shuffle=False)
    members, keys, source = written(out)
    for key, rel in source["keys"].items():
        i = paths.index(str(tmp_path / rel))
        assert members[key]["txt"].decode() == f"sample {i} " + "x" * i
        assert keys[key]["length:txt"] == len(members[key]["txt"])
        assert keys[key]["duration_ms"] == truth[paths[i]]["duration_ms"]


BAD = {
    "walk/clip0.webm": lambda: b"",  # zero-length video
    "walk/clip1.mp4": lambda: make_clip("h264", 9)[:-200],  # cut: the MP4's index is at its end
    "talk/clip2.webm": lambda: make_clip("vp9", 12)[:300],  # cut a few packets in
    "talk/clip3.mp4": lambda: os.urandom(3000),  # random bytes named .mp4
    "talk/sound0.wav": lambda: b"",  # zero-length audio
    "walk/sound1.flac": lambda: make_flac(24000, rate=16000)[:2000],  # cut FLAC
    "walk/sound2.wav": lambda: make_wav(9000)[:5000],  # cut WAV
    "talk/sound1.flac": lambda: make_clip("vp9", 3),  # a video named .flac
}
BAD_SETS = [("walk/clip0.webm",), ("walk/sound1.flac",), ("walk/clip1.mp4", "talk/clip2.webm", "talk/clip3.mp4"),
            ("talk/sound0.wav", "walk/sound2.wav", "talk/sound1.flac"), tuple(BAD)]


def spoil(root, names):
    for name in names:
        (root / name).write_bytes(BAD[name]())
    return [str(root / name) for name in names]


@pytest.mark.parametrize("names", BAD_SETS, ids=[str(len(s)) + "-" + s[0].split("/")[1] for s in BAD_SETS])
@pytest.mark.parametrize("processes", [1, 2])
def test_bad_media_stop_the_write_naming_every_one(media, tmp_path, names, processes):
    root, _ = media
    bad = spoil(root, names)
    with pytest.raises(SampleError) as caught:
        write(str(root), str(tmp_path / "out"), samples_per_shard=3, processes=processes)
    text = str(caught.value)
    assert f"{len(bad)} bad " in text and "nothing written" in text and all(p in text for p in bad), text
    kinds = {"video" if p.endswith(("mp4", "webm")) else "audio" for p in bad}
    assert caught.value.reason == (f"bad_{kinds.pop()}" if len(kinds) == 1 else "bad_sample")
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith((".tar", ".part"))]


@pytest.mark.parametrize("processes", [1, 2])
def test_bad_media_skipped_are_counted_named_and_the_rest_written(media, tmp_path, processes):
    root, truth = media
    bad = spoil(root, BAD)
    done = write(str(root), str(tmp_path / "out"), samples_per_shard=3, processes=processes, on_bad="skip")
    assert done["skipped"] == len(bad) and {p for p, _ in done["bad"]} == set(bad)
    problems = dict(done["bad"])
    assert "empty (0 bytes)" in problems[str(root / "walk/clip0.webm")]
    assert "0 bytes" in problems[str(root / "talk/sound0.wav")]
    members, keys, source = written(tmp_path / "out")
    assert len(members) == len(truth) - len(bad) and set(source["skipped"]) == set(BAD)
    for key, rel in source["keys"].items():  # every written file probes again, and its keys are its own
        data = open(root / rel, "rb").read()
        info = probe(data) if rel.endswith(("mp4", "webm")) else probe_audio(data)
        assert keys[key]["duration_ms"] == truth[str(root / rel)]["duration_ms"] and info is not None


def test_the_cli_names_bad_media(media, tmp_path, capsys):
    root, _ = media
    videos = spoil(root, ["walk/clip0.webm", "talk/clip3.mp4"])
    assert main(["write", str(root), str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "2 bad videos, nothing written" in err and all(p in err for p in videos), err
    sounds = spoil(root, ["walk/sound1.flac"])
    assert main(["write", str(root), str(tmp_path / "out"), "--on-bad", "skip"]) == 0
    said = capsys.readouterr().out
    assert "3 bad files left out" in said and all(p in said for p in videos + sounds), said


@pytest.mark.dali
def test_the_written_set_batches_by_duration(media, tmp_path):
    root, truth = media
    write(str(root), str(tmp_path / "out"), samples_per_shard=4, processes=1)
    _, keys, source = written(tmp_path / "out")
    edges = (500, 1000, 2000)
    seen = []
    stream = Stream.open(str(tmp_path / "out"), fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                         policy="exact", cache_dir=str(tmp_path / "cache"),
                         buckets=LengthBuckets(key="duration_ms", edges=edges))
    with Loader(stream) as loader:
        for b in loader:
            ranges = {int(np.searchsorted(edges, keys[k]["duration_ms"])) for k in b["key"]}
            assert ranges <= {int(b["bucket"][0])}
            seen += b["key"]
    assert sorted(seen) == sorted(source["keys"])
