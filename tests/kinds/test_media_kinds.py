"""The ``video`` and ``audio`` field kinds in the worker, without DALI: clips are a pure function
of (seed, epoch, key) and the frame count the probe reads; the frames PyAV decodes in the worker
are those frames; damaged, empty, random or refused media is a named error or a counted skip, per
sample and per run alike; audio is checked cheaply and its crop drawn the same way."""

import dataclasses
import io
import os
import signal
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import dalistream
from dalistream.config import StreamConfig, parse_fields
from dalistream.kinds.audio import Crops, audio_problem
from dalistream.kinds.video import Clips, VideoProblem, decode_frames, probe
from dalistream.manifest import build_manifest
from dalistream.manifest.offsets import SampleOffsets
from dalistream.manifest.rows import ShardRows
from dalistream.tar import runs
from dalistream.worker import WorkerSource

from helpers import data_set, short_runs, write_tar
from media import CODECS, frame_ids, frame_red, make_clip, make_wav, pyav_frames

pytest.importorskip("av")


def test_the_kinds_are_inferred_from_extensions_and_checked():
    fields = parse_fields({"v": "mp4;webm", "m": "mkv;mov", "a": "flac;wav", "b": "ogg;mp3", "t": "txt"})
    assert [f.kind for f in fields] == ["video", "video", "audio", "audio", "bytes"]
    assert all(f.spec.travels(f) == "blob" for f in fields)
    with pytest.raises(dalistream.ConfigError, match="ndim 4"):  # frames decoded in the worker are 4-d
        parse_fields({"v": {"exts": "mp4", "kind": "video", "decoder": Clips(decode="worker")}})
    with pytest.raises(dalistream.ConfigError, match="Clips"):
        parse_fields({"v": {"exts": "mp4", "kind": "video", "decoder": lambda b: b}})
    for bad in ({"frames": 0}, {"stride": -1}, {"short": "wrap"}, {"decode": "gpu"}, {"device": "cuda"},
                {"fps": 0}, {"fps": -2.5}, {"fps": "30"}, {"fps": 12, "stride": 2}, {"per_video": 0},
                {"per_video": 1.5}):
        with pytest.raises(dalistream.ConfigError):
            Clips(**bad)


@pytest.mark.parametrize("frames,stride", [(4, 1), (4, 3), (1, 1), (6, 2)])
def test_a_clip_is_a_pure_function_of_seed_epoch_key(frames, stride):
    clips = Clips(frames=frames, stride=stride, seed=5)
    keys = [f"shard-{i // 7}/{i:04d}" for i in range(300)]
    count = 40
    room = count - clips.span
    starts = {e: [clips.start(count, k, e) for k in keys] for e in range(3)}
    assert starts[0] == [Clips(frames=frames, stride=stride, seed=5).start(count, k, 0) for k in keys]  # pure
    assert all(0 <= s <= room for e in starts for s in starts[e])
    assert set(starts[0]) == set(range(room + 1))  # every start drawn
    assert sum(a != b for a, b in zip(starts[0], starts[1])) > len(keys) // 2  # a new clip each epoch
    assert starts[0] != [Clips(frames=frames, stride=stride, seed=6).start(count, k, 0) for k in keys]  # the seed counts
    for k in keys[:20]:
        taken = clips.indices(count, k, 1).tolist()
        assert taken == list(range(taken[0], taken[0] + clips.span, stride))
    centred = Clips(frames=frames, stride=stride, train=False)
    assert {centred.start(count, k, e) for k in keys[:30] for e in range(3)} == {room // 2}


@pytest.mark.parametrize("short,expected", [("loop", [0, 1, 2, 3, 4, 0]), ("edge", [0, 1, 2, 3, 4, 4]),
                                             ("black", [0, 1, 2, 3, 4, 5])])
def test_a_video_shorter_than_its_clip_is_looped_or_padded(short, expected):
    clips = Clips(frames=6, stride=1, train=False, short=short)
    assert clips.indices(5, "k", 0).tolist() == expected
    strided = Clips(frames=4, stride=2, train=True, short=short, seed=1)
    for key in ("a", "b", "c"):  # no room: the clip starts at 0 whatever the draw
        got = strided.indices(5, key, 3).tolist()
        assert got == {"loop": [0, 2, 4, 1], "edge": [0, 2, 4, 4], "black": [0, 2, 4, 6]}[short]


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("frames", [1, 5, 12])
def test_the_probe_reads_codec_and_frames_from_the_container(codec, frames):
    info = probe(make_clip(codec, frames))
    assert (info.codec, info.frames, info.width, info.height) == (codec, frames, 32, 32)


def _damaged():
    good = make_clip("h264", 12)
    webm = make_clip("vp9", 12)
    return {"empty": (b"", "mp4"), "random": (np.random.default_rng(1).bytes(3000), "webm"),
            "cut": (good[:len(good) // 2], "mp4"), "text": (b"not a video at all\n" * 20, "mkv"),
            "head": (webm[:40], "webm")}


@pytest.mark.parametrize("name", sorted(_damaged()))
def test_damaged_media_is_a_named_problem(name):
    data, _ = _damaged()[name]
    with pytest.raises(VideoProblem) as caught:
        probe(data)
    assert caught.value.reason == "bad_video"


def _shards(tmp_path, damaged: bool):
    """Two shards of clips of every codec (5 to 16 frames) with captions; with ``damaged``, a
    damaged member now and then. Returns (paths, {key: (codec, frames)} of the good ones, bad keys)."""
    codecs = sorted(CODECS)
    bad_media = _damaged()
    good, bad, paths = {}, {}, []
    for s in range(2):
        members = []
        for i in range(9):
            key = f"s{s}/{i:03d}"
            if damaged and i % 4 == 2:
                name = sorted(bad_media)[(s * 3 + i) % len(bad_media)]
                data, ext = bad_media[name]
                bad[key] = name
            else:
                codec, n = codecs[(s + i) % len(codecs)], 5 + (7 * i + s) % 12
                data, ext = make_clip(codec, n, blue=10 * i), CODECS[codec][2]
                good[key] = (codec, n)
            members += [(f"{key}.{ext}", data), (f"{key}.txt", key.encode())]
        paths.append(write_tar(str(tmp_path / f"v-{s}.tar"), members))
    return paths, good, bad


def _source(paths, clips, on_error="raise", workers=1, worker=0):
    rows = ShardRows.from_infos(build_manifest(paths, offsets=True))
    offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
    config = StreamConfig(sources=tuple(paths), batch_size=3, workers=workers, policy="exact", on_error=on_error,
                          interleave=False, shuffle=0, seed=clips.seed,
                          fields={"key": "__key__", "video": {"exts": "mp4;webm;mkv", "kind": "video",
                                                             "ndim": clips.ndim, "decoder": clips}})
    return WorkerSource(config, data_set(paths, [9, 9], offsets), worker)


def _clips(source, epoch):
    got = {}
    for keys, videos, valid in source.epoch_batches(epoch):
        got.update({bytes(k).decode(): v for k, v, ok in zip(keys, videos, valid) if int(ok)})
    return got


@pytest.mark.parametrize("blocks", [False, True])
def test_worker_decoded_clips_are_the_drawn_frames_each_epoch(tmp_path, monkeypatch, blocks):
    """Frames PyAV decodes in the worker are the frames the pure draw names for that epoch, per
    sample and per run alike (the epoch reaches both paths)."""
    short_runs(monkeypatch, 4000)
    if not blocks:
        monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 1 << 40)  # every part read sample by sample
    paths, good, _ = _shards(tmp_path, damaged=False)
    clips = Clips(frames=4, stride=2, train=True, short="loop", decode="worker", seed=11)
    source = _source(paths, clips)
    seen = {}
    for epoch in (0, 1, 2):
        got = _clips(source, epoch)
        assert sorted(got) == sorted(good)
        for key, clip in got.items():
            assert clip.shape == (4, 32, 32, 3) and clip.dtype == np.uint8
            assert frame_ids(clip) == clips.indices(good[key][1], key, epoch).tolist(), (key, epoch)
            seen.setdefault(key, set()).add(tuple(frame_ids(clip)))
    assert sum(len(s) > 1 for s in seen.values()) >= len(seen) // 2  # the clips change with the epoch


@pytest.mark.parametrize("workers", [1, 3])
def test_clips_do_not_depend_on_the_worker_count(tmp_path, workers):
    paths, good, _ = _shards(tmp_path, damaged=False)
    clips = Clips(frames=3, stride=3, decode="worker", seed=2)
    got = {}
    for w in range(workers):
        part = _clips(_source(paths, clips, workers=workers, worker=w), 4)
        assert not set(part) & set(got)
        got.update(part)
    assert {k: frame_ids(v) for k, v in got.items()} == {k: clips.indices(n, k, 4).tolist() for k, (_, n) in good.items()}


@pytest.mark.parametrize("blocks", [False, True])
@pytest.mark.parametrize("decode", ["worker", "dali"])
def test_bad_media_is_named_or_skipped_by_policy(tmp_path, monkeypatch, blocks, decode):
    """Empty, random, cut and text members are ``bad_video``; with ``decode='dali'`` on the CPU, a
    codec DALI's CPU decoder refuses is ``unsupported_codec``, named with its codec; under
    ``skip`` both are counted and every other sample is delivered whole."""
    short_runs(monkeypatch, 4000)
    if not blocks:
        monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 1 << 40)
    paths, good, bad = _shards(tmp_path, damaged=True)
    clips = Clips(frames=2, stride=1, decode=decode, device="cpu", seed=3)
    refused = {k for k, (codec, _) in good.items() if decode == "dali" and codec != "vp9"}
    with pytest.raises(dalistream.SampleError) as caught:
        _clips(_source(paths, clips), 0)
    error = caught.value
    first = min(set(bad) | refused)
    assert error.url == paths[0] and error.member.startswith(first + ".")
    assert error.reason == ("bad_video" if first in bad else "unsupported_codec")
    source = _source(paths, clips, on_error="skip")
    got = _clips(source, 0)
    assert sorted(got) == sorted(set(good) - refused)
    expected = {"samples:bad_video": len(bad)}
    if refused:
        expected["samples:unsupported_codec"] = len(refused)
    assert dict(source._stats.skipped) == expected
    for key, value in got.items():
        if decode == "worker":
            assert frame_ids(value) == clips.indices(good[key][1], key, 0).tolist()
        else:  # the indices, then the member's own bytes
            taken = np.asarray(value[:8]).view(np.int32).tolist()
            assert taken == clips.indices(good[key][1], key, 0).tolist()
            assert probe(bytes(np.asarray(value[8:]))).frames == good[key][1]


def test_an_unsupported_codec_error_names_the_codec(tmp_path):
    paths = [write_tar(str(tmp_path / "h.tar"), [("a/0.mp4", make_clip("h264", 3)), ("a/1.mp4", make_clip("av1", 3))])]
    for codec in ("h264", "av1"):
        clips = Clips(frames=2, decode="dali", device="cpu")
        (field,) = parse_fields({"v": {"exts": "mp4", "kind": "video", "decoder": clips}})
        with pytest.raises(Exception) as caught:
            field.spec.parse_at(field, make_clip(codec, 3), "mp4", "k", 0)
        assert caught.value.reason == "unsupported_codec" and codec in str(caught.value)
        assert "decode='worker'" in caught.value.hint
        gpu = Clips(frames=2, decode="dali", device="gpu")  # NVDEC takes them: the field is indices then bytes
        (field,) = parse_fields({"v": {"exts": "mp4", "kind": "video", "decoder": gpu}})
        assert len(field.spec.parse_at(field, make_clip(codec, 3), "mp4", "k", 0)) > 8


@pytest.mark.parametrize("case", ["empty", "cut_header", "cut_data", "random", "not_wave", "no_data"])
def test_damaged_audio_is_named(case):
    wav = make_wav(800)
    data = {"empty": b"", "cut_header": wav[:20], "cut_data": wav[:len(wav) // 2], "random": b"\x13" * 500,
            "not_wave": b"RIFF" + wav[4:8] + b"AVI " + wav[12:],
            "no_data": wav[:36].replace(wav[4:8], (28).to_bytes(4, "little"))}[case]
    assert audio_problem(wav) is None
    assert audio_problem(data) is not None
    (field,) = parse_fields({"a": {"exts": "wav", "kind": "audio", "decoder": Crops()}})
    with pytest.raises(Exception) as caught:
        field.spec.parse_at(field, data, "wav", "k", 0)
    assert caught.value.reason == "bad_audio"


def test_audio_signatures_pass_and_crops_are_drawn_like_clips():
    flac = b"fLaC\x80\x00\x00\x22" + bytes(34) + bytes(60)  # (the last metadata block: STREAMINFO, 34 bytes)
    for data in (flac, b"OggS" + bytes(60), b"ID3\x04" + bytes(60), b"\xff\xfb\x90" + bytes(60)):
        assert audio_problem(data) is None
    for data in (flac[:30], b"fLaC" + bytes(60), flac[:4] + b"\x81" + flac[5:], flac[:6] + b"\x10" + flac[7:]):
        assert audio_problem(data) is not None
    crops = Crops(train=True, seed=9)
    (field,) = parse_fields({"a": {"exts": "wav", "kind": "audio", "decoder": crops}})
    wav = make_wav(100)
    values = [field.spec.parse_at(field, wav, "wav", f"k{i}", e) for i in range(50) for e in (0, 1)]
    shares = [float(np.asarray(v[:4]).view(np.float32)[0]) for v in values]
    assert all(bytes(np.asarray(v[4:])) == wav for v in values)
    assert all(0 <= s < 1 for s in shares) and len(set(shares)) > 90
    assert shares[0] == float(np.float32(crops.start("k0", 0)))
    assert {float(np.asarray(Crops(train=False).__call__(wav, "x", 3)[:4]).view(np.float32)[0])} == {0.5}


@pytest.mark.parametrize("packets", [(3, 6), (0, 1), (10, 12)])
def test_damage_inside_the_stream_is_named_when_the_worker_decodes(packets):
    """Packets overwritten inside a VP9 stream pass the probe (the container is whole); decoded in
    the worker, the clip is ``bad_video`` for its own sample, not a dead pipeline."""
    import av
    import io

    good = make_clip("vp9", 12)
    with av.open(io.BytesIO(good)) as c:
        places = [(p.pos, p.size) for p in c.demux(video=0) if p.size]
    data = bytearray(good)
    rng = np.random.default_rng(packets[0])
    for pos, size in places[packets[0]:packets[1]]:
        data[pos + size // 3:pos + size - 2] = rng.integers(0, 256, size - 2 - size // 3, dtype=np.uint8).tobytes()
    assert probe(bytes(data)).frames == 12
    (field,) = parse_fields({"v": {"exts": "webm", "kind": "video", "ndim": 4,
                                   "decoder": Clips(frames=12, train=False, decode="worker")}})
    with pytest.raises(Exception) as caught:
        field.spec.parse_at(field, bytes(data), "webm", "k", 0)
    assert caught.value.reason == "bad_video" and "decode" in str(caught.value)


@pytest.mark.parametrize("codec,gop,bframes", [("h264", 1, 0), ("h264", 4, 2), ("h264", 7, 3), ("vp9", 4, 0),
                                                ("vp9", 16, 0), ("av1", 5, 0)])
def test_the_worker_decode_seeks_to_exactly_the_frames_asked_for(codec, gop, bframes):
    """Decoded with a seek to the key frame before the first frame asked for and placed by time
    stamp, every frame is the one a full decode gives at that index (B-frames included: packets
    out of presentation order), whatever the clip's place, stride, order and padding."""
    data = make_clip(codec, 19, blue=50, gop=gop, bframes=bframes)
    info = probe(data)
    reference = pyav_frames(data)
    assert info.frames == len(reference) == 19 and len(info.pts) == 19
    rng = np.random.default_rng(gop)
    cases = [[0, 1, 2], [5, 7, 9, 11], [18], [17, 18, 19, 20], [12, 3, 12, 8]]
    cases += [sorted(rng.choice(19, 4, replace=False).tolist()) for _ in range(6)]
    for wanted in cases:
        got = decode_frames(data, np.array(wanted), info)
        assert got.shape == (len(wanted), 32, 32, 3)
        for frame, i in zip(got, wanted):
            assert np.array_equal(frame, reference[i] if i < 19 else np.zeros_like(reference[0])), (wanted, i)


def make_vfr_clip(times_ms, codec: str = "vp9") -> bytes:
    """A clip whose frame ``i`` (:func:`frame_red`) is shown from ``times_ms[i]``: a variable frame rate."""
    import av

    encoder, container, _ = CODECS[codec]
    out = io.BytesIO()
    with av.open(out, "w", format=container) as c:
        stream = c.add_stream(encoder, rate=25)
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        for i, t in enumerate(times_ms):
            image = np.zeros((32, 32, 3), np.uint8)
            image[..., 0], image[..., 1] = frame_red(i), 128
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = t, Fraction(1, 1000)
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    return out.getvalue()


def pyav_times(data: bytes) -> list:
    """Each frame's time (seconds) as PyAV decodes the clip, in presentation order."""
    import av

    with av.open(io.BytesIO(data)) as c:
        return [float(f.time) for f in c.decode(video=0)]


def shown_at(times, fps, first, frames):
    """Reference: the frame shown at each of ``frames`` times ``1 / fps`` apart from frame
    ``first``'s, -1 past the video's end (its last frame lasts as long as the one before)."""
    end = times[-1] + (times[-1] - times[-2])
    out = []
    for k in range(frames):
        t = times[first] + k / fps
        out.append(max(i for i, ti in enumerate(times) if ti <= t + 1e-6) if t < end - 1e-6 else -1)
    return out


@pytest.mark.parametrize("codec,rate,fps", [("h264", 24, 12), ("h264", 30, 12), ("h264", 60, 12), ("vp9", 60, 24),
                                            ("vp9", 24, 30), ("av1", 30, 10), ("vfr", 0, 10), ("vfr-h264", 0, 25)])
def test_clips_at_a_target_fps_are_the_frames_shown_at_those_times(codec, rate, fps):
    """``Clips(fps=...)``: each clip's frames are those PyAV shows at times ``1 / fps`` apart from
    a drawn (or centred) first frame, whatever the source's rate (24, 30, 60 fps, or variable:
    placed by time stamps, not by an assumed constant rate), every start that fits drawn, and the
    frames the worker decodes are those frames."""
    if codec.startswith("vfr"):
        data = make_vfr_clip([0, 40, 80, 120, 300, 340, 380, 600, 640, 680, 720, 760, 1000, 1040, 1080, 1120, 1160,
                              1200], "h264" if codec == "vfr-h264" else "vp9")
    else:
        data = make_clip(codec, 25, rate=rate, gop=5, bframes=2 if codec == "h264" else 0)
    info, times, reference = probe(data), pyav_times(data), pyav_frames(data)
    assert len(times) == info.frames == len(reference)
    frames = 4
    clips = Clips(frames=frames, fps=fps, short="black", decode="worker", seed=3)
    end = times[-1] + (times[-1] - times[-2])
    fitting = [s for s in range(len(times)) if times[s] + (frames - 1) / fps < end - 1e-6]
    keys = [f"k{i}" for i in range(200)]
    firsts = set()
    for key in keys:
        taken = clips.indices(info, key, 2).tolist()
        assert taken[0] in fitting, key
        assert taken == shown_at(times, fps, taken[0], frames), key
        firsts.add(taken[0])
        if rate:  # a constant rate: the clip lasts (frames - 1) / fps, within one source frame
            assert abs(times[taken[-1]] - times[taken[0]] - (frames - 1) / fps) < 1 / rate + 1e-6
    assert firsts == set(fitting)  # every start that fits is drawn
    for key in keys[:3]:
        got = clips(data, key, 2)
        taken = clips.indices(info, key, 2).tolist()
        assert frame_ids(got) == taken, key
        for frame, i in zip(got, taken):
            assert np.array_equal(frame, reference[i]), (key, i)
    centred = Clips(frames=frames, fps=fps, train=False, short="black")
    assert centred.indices(info, "a", 0).tolist() == shown_at(times, fps, fitting[(len(fitting) - 1) // 2], frames)
    long = Clips(frames=40, fps=fps, train=False, short="black").indices(info, "a", 0).tolist()
    assert long == [i if i >= 0 else info.frames for i in shown_at(times, fps, 0, 40)]  # past the end: black
    with pytest.raises(dalistream.ConfigError, match="probe"):
        clips.indices(info.frames, "k", 0)


def test_a_target_fps_without_time_stamps_counts_frames_at_the_streams_rate():
    data = make_clip("vp9", 20, rate=30)
    info = probe(data)
    untimed = dataclasses.replace(info, pts=())
    clips = Clips(frames=5, fps=10, seed=1)
    for key in ("a", "b", "c", "d"):
        taken = clips.indices(untimed, key, 0).tolist()
        assert taken == list(range(taken[0], taken[0] + 13, 3)) and taken == clips.indices(info, key, 0).tolist()
    with pytest.raises(VideoProblem, match="frame rate"):
        clips.indices(dataclasses.replace(info, pts=(), rate=0.0), "a", 0)


@pytest.mark.parametrize("per_video,frames,stride,fps", [(3, 4, 2, None), (2, 1, 1, None), (5, 3, 1, None),
                                                         (3, 4, 1, 6)])
def test_several_clips_per_video_are_drawn_or_evenly_spaced(per_video, frames, stride, fps):
    """``Clips(per_video=N)``: N clips a video, clip after clip, each drawn from (seed, epoch, key, i)
    when training (clip 0 the one-clip draw), evenly spaced from the first start that fits to
    the last for evaluation; the worker decodes exactly those frames."""
    data = make_clip("h264", 24, gop=6, bframes=1)
    info, reference = probe(data), pyav_frames(data)
    many = Clips(frames=frames, stride=stride, fps=fps, per_video=per_video, decode="worker", seed=9)
    one = Clips(frames=frames, stride=stride, fps=fps, decode="worker", seed=9)
    keys = [f"v{i}" for i in range(60)]
    differ = 0
    for key in keys:
        taken = many.indices(info, key, 1).reshape(per_video, frames)
        assert taken[0].tolist() == one.indices(info, key, 1).tolist()
        for i, clip in enumerate(taken):
            assert clip.tolist() == [many.first(24 - (frames - 1) * (2 if fps else stride) - 1, key, 1, i) + j *
                                     (2 if fps else stride) for j in range(frames)], (key, i)  # 12 fps source
        differ += len({tuple(c) for c in taken.tolist()}) > 1
        assert taken.tolist() == many.indices(info, key, 1).reshape(per_video, frames).tolist()  # pure
    assert differ > len(keys) // 2
    assert [many.indices(info, k, 2).tolist() for k in keys] != [many.indices(info, k, 1).tolist() for k in keys]
    room = 24 - ((frames - 1) * (2 if fps else stride) + 1)
    spaced = Clips(frames=frames, stride=stride, fps=fps, per_video=per_video, train=False).indices(info, "a", 0)
    assert spaced.reshape(per_video, frames)[:, 0].tolist() == [int(i * room / (per_video - 1) + 0.5)
                                                                for i in range(per_video)]  # (half up)
    got = many(data, "v1", 1)
    assert got.shape == (per_video * frames, 32, 32, 3)
    assert all(np.array_equal(f, reference[i]) for f, i in zip(got, many.indices(info, "v1", 1).tolist()))


def test_the_placeholders_are_what_each_decoder_takes():
    """Padding positions decode a placeholder: on the CPU a codec DALI's CPU decoder takes; on a GPU
    H.264 at least NVDEC's smallest size (48×16); audio a WAV that passes the check."""
    from dalistream import ops
    from dalistream.kinds.video import DALI_CPU_CODECS

    cpu, gpu = probe(ops.PLACEHOLDER_VIDEO), probe(ops.PLACEHOLDER_VIDEO_GPU)
    assert cpu.codec in DALI_CPU_CODECS and cpu.frames == 1
    assert gpu.codec == "h264" and gpu.frames == 1 and gpu.width >= 48 and gpu.height >= 16
    assert audio_problem(ops.PLACEHOLDER_WAV) is None


def test_a_video_field_without_clips_holds_the_bytes_and_refuses_an_empty_member():
    (field,) = parse_fields({"v": "mp4;webm"})
    clip = make_clip("h264", 3)
    for data in (clip, b"any bytes: not probed"):
        value = field.spec.parse_at(field, data, "mp4", "k", 2)
        assert bytes(np.asarray(value)) == data and field.spec.to_torch([value]) == [data]
    with pytest.raises(Exception) as caught:
        field.spec.parse_at(field, b"", "mp4", "k", 0)
    assert caught.value.reason == "bad_video"


@pytest.mark.parametrize("call", ["probe(CLIP)", "Clips(decode='worker')(CLIP, 'k', 0)",
                                  "decode_frames(CLIP, [0], VideoInfo('vp9', 1, 32, 32))"])
def test_without_pyav_a_clip_is_a_config_error_naming_the_video_extra(call, tmp_path):
    """PyAV blocked from importing (``sys.modules['av'] = None``), in a fresh interpreter: each
    entry that needs it raises a ConfigError whose hint is the install command of the extra."""
    import subprocess
    import sys

    clip = tmp_path / "clip.webm"
    clip.write_bytes(make_clip("vp9", 3))
    script = (f"import sys; sys.modules['av'] = None\n"
              f"from dalistream.errors import ConfigError\n"
              f"from dalistream.kinds.video import Clips, VideoInfo, decode_frames, probe\n"
              f"CLIP = open({str(clip)!r}, 'rb').read()\n"
              f"try:\n    {call}\nexcept ConfigError as e:\n    print('HINT', e.hint)\n    print('TEXT', e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'HINT pip install "dalistream[video]"' in out.stdout, out.stdout
    assert "'video' extra" in out.stdout


@pytest.mark.parametrize("codec", ["h264", "vp9", "av1"])
def test_the_worker_decode_uses_slice_threads_only(codec, monkeypatch):
    """A decode left before the stream's end (the last frame asked for) with FFmpeg's frame
    threads can hang for ever (PyAV #1849, #1861; a DALI worker decoding H.264 clips stalled a CI
    run so): the worker decodes with slice threads only, whatever the codec and the frames."""
    import av

    from dalistream.kinds import video

    seen = []

    class Recorded:  # (a container that says which threads its stream decodes with)
        def __init__(self, container):
            self.container = container

        def __enter__(self):
            self.container.__enter__()
            return self

        def __exit__(self, *exc):
            return self.container.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self.container, name)

        def decode(self, stream):
            seen.append(str(stream.thread_type))
            return self.container.decode(stream)

    class Av:
        def __getattr__(self, name):
            return getattr(av, name)

        def open(self, *args, **kwargs):
            return Recorded(av.open(*args, **kwargs))

    monkeypatch.setattr(video, "pyav", lambda: Av())
    data = make_clip(codec, 12, gop=4)
    info = probe(data)
    for wanted in ([0, 1], [5, 6, 7], [11]):
        assert decode_frames(data, np.array(wanted), info).shape == (len(wanted), 32, 32, 3)
    assert len(seen) == 3 and all("SLICE" in s and "FRAME" not in s for s in seen), seen


FORKED = """
import os, sys, threading
import numpy as np
import av
from dalistream.kinds.video import decode_frames, probe
data = open(sys.argv[1], "rb").read()
info = probe(data)
if sys.argv[2] == "pyav":  # the parent converts with PyAV's own per-thread converter (threads: auto)
    with av.open(sys.argv[1]) as c:
        [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
parent = decode_frames(data, np.arange(8), info)
read, write = os.pipe()
def fork():
    if os.fork() == 0:
        os.write(write, b"same" if decode_frames(data, np.arange(8), info).tobytes() == parent.tobytes() else b"diff")
        os._exit(0)
if sys.argv[3] == "thread":
    t = threading.Thread(target=fork)
    t.start()
    t.join()
else:
    fork()
print(os.read(read, 4).decode())
os.wait()
"""


@pytest.mark.parametrize("codec", ["h264", "vp9"])
@pytest.mark.parametrize("parent,forked_from", [("pyav", "main"), ("dalistream", "main"), ("dalistream", "thread")])
def test_a_worker_forked_after_its_parent_converted_frames_decodes(tmp_path, codec, parent, forked_from):
    """PyAV 18.1.1 converts frames with one swscale context per thread, with threads: a DALI
    worker forked after its parent converted frames inherited it, and its first clip hung for
    ever freeing threads that do not exist in the child (a CI run stalled so). The worker's decode
    converts with a converter of its own without threads: a child forked from the main thread
    after PyAV's own converter ran, or from another thread after the main thread decoded clips,
    decodes as its parent did. (A child forked from another thread after PyAV's own converter ran
    in the main thread hangs in Python's own clean-up of that thread: PyAV's, not ours.)"""
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(make_clip(codec, 12, gop=4))
    proc = subprocess.Popen([sys.executable, "-c", FORKED, str(clip), parent, forked_from], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # (the hung child too)
        proc.communicate()
        pytest.fail("the forked child's decode hung")
    assert proc.returncode == 0, err
    assert out.strip() == "same"
