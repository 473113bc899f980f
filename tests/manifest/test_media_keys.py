"""Per-sample keys of video and audio members (``dalistream index --keys video,audio``): what
PyAV probes (size, frames, duration, frame rate, codec; sample rate, channels, duration) per
codec and container, the rules between kinds, and damaged media named by shard and member, or
left unknown and reported with ``--on-error skip``."""

import json

import pytest

from dalistream.errors import ConfigError, SampleError
from dalistream.manifest import build_manifest, read_manifest
from dalistream.manifest.keys import AUDIO_COLUMNS, VIDEO_COLUMNS, KeySpec, with_keys
from tests.helpers import write_tar
from tests.media import make_clip, make_flac, make_wav

pytest.importorskip("av")
CODEC_IDS = {"h264": 27, "vp9": 167}


def media_shard(tmp_path, name="s.tar"):
    """One shard: H.264 and VP9 clips of several lengths, sizes and rates, WAV and FLAC audio of
    several lengths and rates, a sample with neither; returns its path and the keys expected."""
    members, want = [], []
    cases = [("h264", 6, 32, 24, 12), ("vp9", 30, 48, 32, 12), ("h264", 25, 64, 32, 25), ("vp9", 9, 32, 32, 6)]
    for k, (codec, frames, width, height, rate) in enumerate(cases):
        ext = "mp4" if codec == "h264" else "webm"
        members.append((f"{k:03d}.{ext}", make_clip(codec, frames, size=width, height=height, rate=rate)))
        want.append({"width": width, "height": height, "frames": frames, "duration_ms": round(1000 * frames / rate),
                     "fps_milli": 1000 * rate, "codec": CODEC_IDS[codec],
                     "sample_rate": -1, "channels": -1})
    for k, (ext, samples, rate) in enumerate([("wav", 11025, 22050), ("flac", 48000, 16000), ("wav", 800, 8000)], 10):
        data = make_wav(samples, rate=rate) if ext == "wav" else make_flac(samples, rate=rate)
        members.append((f"{k:03d}.{ext}", data))
        want.append({**{c: -1 for c in VIDEO_COLUMNS}, "duration_ms": round(1000 * samples / rate),
                     "sample_rate": rate, "channels": 2 if ext == "wav" else 1})
    members.append(("020.txt", b"neither"))
    want.append({c: -1 for c in VIDEO_COLUMNS + AUDIO_COLUMNS})
    return write_tar(str(tmp_path / name), members), want


def test_video_and_audio_keys_per_codec_and_container(tmp_path):
    path, want = media_shard(tmp_path)
    spec = KeySpec.parse("video,audio")
    assert spec.columns == ("width", "height", "frames", "duration_ms", "fps_milli", "codec", "sample_rate", "channels")
    (row,), problems = with_keys(build_manifest([path]), spec)
    assert problems == []
    for name in spec.columns:
        assert list(row.keys[name]) == [w[name] for w in want], name


def test_one_kind_alone_and_an_extension_chosen(tmp_path):
    path, want = media_shard(tmp_path)
    (row,), _ = with_keys(build_manifest([path]), KeySpec.parse("audio"))
    assert set(row.keys) == set(AUDIO_COLUMNS)
    assert list(row.keys["duration_ms"]) == [-1] * 4 + [w["duration_ms"] for w in want[4:7]] + [-1]
    (row,), _ = with_keys(build_manifest([path]), KeySpec.parse("video:webm"))
    assert list(row.keys["frames"]) == [-1, 30, -1, 9, -1, -1, -1, -1]


def test_a_sample_with_a_video_and_its_audio_takes_the_video_s_duration(tmp_path):
    path = write_tar(str(tmp_path / "s.tar"), [("a.mp4", make_clip("h264", 24)), ("a.wav", make_wav(22050 * 5)),
                                               ("b.wav", make_wav(22050 * 3))])
    (row,), _ = with_keys(build_manifest([path]), KeySpec.parse("audio,video"))
    assert list(row.keys["duration_ms"]) == [2000, 3000]
    assert list(row.keys["sample_rate"]) == [22050, 22050]


@pytest.mark.parametrize("member,data,reason", [
    ("x.mp4", b"", "bad_video"), ("x.webm", make_clip("vp9", 12)[:300], "bad_video"),
    ("x.mp4", b"\x00" * 4000, "bad_video"), ("x.wav", make_wav(4000)[:3000], "bad_audio"),
    ("x.flac", make_flac(8000)[:2000], "bad_audio"), ("x.wav", b"", "bad_audio")])
def test_damaged_media_names_shard_and_member_or_is_left_unknown(tmp_path, member, data, reason):
    ext = member.split(".")[1]
    path = write_tar(str(tmp_path / "s.tar"), [("a.txt", b"a"), (member, data), ("z." + ext, make_wav(800)
                                               if ext in ("wav", "flac") else make_clip("vp9", 3))])
    kind = "audio" if ext in ("wav", "flac") else "video"
    rows = build_manifest([path])
    with pytest.raises(SampleError) as info:
        with_keys(rows, KeySpec.parse(kind))
    assert info.value.url == path and info.value.member == member and info.value.reason == reason
    (row,), problems = with_keys(rows, KeySpec.parse(kind), tolerant=True)
    assert [p.member for p in problems] == [member]
    assert list(row.keys["duration_ms"])[:2] == [-1, -1] and row.keys["duration_ms"][2] > 0


@pytest.mark.parametrize("text", ["video:", "audio:", "video,.mp4"])
def test_bad_media_key_specs(text):
    with pytest.raises(ConfigError):
        KeySpec.parse(text)


def test_index_cli_records_media_keys(tmp_path, capsys):
    from dalistream.cli import main

    path, want = media_shard(tmp_path)
    manifest = str(tmp_path / "m.json")
    assert main(["index", path, "-o", manifest, "--keys", "video,audio", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key_errors"] == []
    rows = read_manifest(manifest)
    assert rows.keys["duration_ms"].tolist() == [w["duration_ms"] for w in want]
    assert rows.keys["codec"].tolist() == [w["codec"] for w in want]
