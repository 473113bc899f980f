"""The video and audio pipelines, built on the CPU over clips made here (H.264, VP9, AV1): the
decoded frames are PyAV's frames at the drawn indices, whichever place decodes them; clips are the
same across a resume, an elastic resume and another worker count; evaluation delivers every clip
once under ``exact``; audio is cropped where the worker drew it. GPU variants are marked ``gpu``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dalistream
from dalistream import ops
from dalistream.kinds.audio import Crops
from dalistream.kinds.video import Clips, probe

from helpers import write_tar
from media import CODECS, frame_ids, make_clip, make_flac, make_wav, pyav_frames

pytestmark = [pytest.mark.dali]

torch = pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")
pytest.importorskip("av")

EXTS = "mp4;webm"


@dalistream.pipeline_def
def raw_clips(stream, frames=4, decode="dali"):
    """The clips as decoded (uint8 FHWC), with their keys: no randomness in the graph."""
    data = dalistream.read(stream)
    clips = ops.decode_clips(data["video"], data["valid"], stream.device, frames, decode=decode, padded=stream.may_pad)
    return {"video": clips, "key": data["key"]}


def clip_shards(directory, codecs, n_shards=2, per_shard=7, sizes=(5, 9, 12, 16), rates=(12,)):
    """Shards of clips (codecs in turn, lengths from ``sizes``, frame rates from ``rates``) with
    captions; {key: bytes}."""
    truth, paths = {}, []
    for s in range(n_shards):
        members = []
        for i in range(per_shard):
            key = f"c{s}/{i:03d}"
            codec = codecs[(s * per_shard + i) % len(codecs)]
            data = make_clip(codec, sizes[(3 * s + i) % len(sizes)], blue=20 * i, rate=rates[i % len(rates)])
            members += [(f"{key}.{CODECS[codec][2]}", data), (f"{key}.txt", f"caption of {key}".encode())]
            truth[key] = data
        paths.append(write_tar(str(directory / f"clips-{s}.tar"), members))
    return paths, truth


def open_clips(paths, clips, workers=2, batch_size=3, **options):
    fields = {"video": {"exts": EXTS, "kind": "video", "ndim": clips.ndim, "decoder": clips}, "key": "__key__"}
    stream = dalistream.Stream.open(paths, fields=fields, batch_size=batch_size, workers=workers, device=clips.device,
                                    seed=clips.seed, **options)
    return dalistream.Loader(stream, raw_clips, frames=clips.length, decode=clips.decode)


def as_clips(video) -> list:
    """A batch's clips as arrays: a padded batch's placeholders are smaller, so the batch may come
    as a list of tensors (its real samples)."""
    return [np.asarray(v.cpu()) for v in video]


def check_frames(batch, truth, clips, epoch):
    """Each clip is PyAV's decode of its video at the drawn indices, within the codec's error."""
    assert len(as_clips(batch["video"])) == len(batch["key"])
    for key, clip in zip(batch["key"], as_clips(batch["video"])):
        reference = pyav_frames(truth[key])
        taken = clips.indices(probe(truth[key]), key, epoch).tolist()
        assert frame_ids(clip) == [i if i < len(reference) else -1 for i in taken], key
        for frame, i in zip(clip, taken):
            if i < len(reference):
                assert np.abs(frame.astype(np.int16) - reference[i]).mean() < 4, (key, i)


CLIP_CHOICES = {"stride": {"stride": 3}, "fps": {"fps": 10}, "per_video": {"stride": 2, "per_video": 3},
                "fps_per_video": {"fps": 8, "per_video": 2}}


@pytest.mark.parametrize("choice", sorted(CLIP_CHOICES))
@pytest.mark.parametrize("decode,codecs", [("worker", ("h264", "vp9", "av1")), ("dali", ("vp9",))])
def test_clips_are_pyavs_frames_at_the_drawn_indices(tmp_path, decode, codecs, choice):
    """Whichever place decodes: a stride, a target fps over 24/30/60 fps sources, several clips a
    video; each clip is PyAV's frames at the indices drawn for it."""
    paths, truth = clip_shards(tmp_path, codecs, rates=(24, 30, 60))
    clips = Clips(frames=4, decode=decode, short="black", seed=7, **CLIP_CHOICES[choice])
    seen = set()
    with open_clips(paths, clips, policy="exact") as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            for batch in loader:
                shape = (clips.length, 32, 32, 3)
                assert all(c.dtype == np.uint8 and c.shape == shape for c in as_clips(batch["video"]))
                check_frames(batch, truth, clips, epoch)
                seen.update(batch["key"])
    assert seen == set(truth)


def _epoch(loader, steps=None):
    out = []
    for batch in itertools.islice(loader, steps):
        out.append({key: tuple(frame_ids(clip)) for key, clip in zip(batch["key"], as_clips(batch["video"]))})
    return out


@pytest.mark.parametrize("choice", [{"stride": 2}, {"fps": 6, "per_video": 2}])
@pytest.mark.parametrize("decode", ["dali", "worker"])
def test_clips_survive_a_resume_an_elastic_resume_and_another_worker_count(tmp_path, decode, choice):
    paths, truth = clip_shards(tmp_path, ("vp9",), per_shard=9, rates=(12, 30))
    clips = Clips(frames=3, decode=decode, seed=4, **choice)
    with open_clips(paths, clips, workers=2, shuffle=5) as loader:
        loader.set_epoch(1)
        full = _epoch(loader)
    with open_clips(paths, clips, workers=2, shuffle=5) as loader:
        loader.set_epoch(1)
        head = _epoch(loader, steps=2)
        state = loader.state_dict()
    assert head == full[:2]
    with open_clips(paths, clips, workers=2, shuffle=5) as loader:
        loader.load_state_dict(state)
        assert _epoch(loader) == full[2:]  # the same batches, the same clips
    with open_clips(paths, clips, workers=1, shuffle=5) as loader:  # elastic: the rest re-planned on 1 worker
        loader.load_state_dict(state)
        rest = _epoch(loader)
    merged = {k: v for batch in head + rest for k, v in batch.items()}
    expected = {k: v for batch in full for k, v in batch.items()}
    assert {k: merged[k] for k in expected} == expected
    assert all(list(v) == clips.indices(probe(truth[k]), k, 1).tolist() for k, v in expected.items())


def test_eval_delivers_every_centred_clip_once_and_skips_bad_media(tmp_path):
    from dalistream.pipelines import video_clips_eval

    paths, truth = clip_shards(tmp_path, ("h264", "vp9", "av1"), per_shard=5)
    damaged = [b"", b"\x1aE\xdf\xa3" + bytes(90), truth["c0/000"][:300]]  # empty, a bare EBML head, cut
    bad = write_tar(str(tmp_path / "bad.tar"), [m for i, data in enumerate(damaged) for m in
                                                 ((f"b/{i}.{'webm' if i == 1 else 'mp4'}", data), (f"b/{i}.txt", b"x"))])
    with video_clips_eval.loader(paths + [bad], batch_size=4, frames=8, stride=1, size=24, workers=2, device="cpu",
                                 on_error="skip", fields={"key": "__key__"}, max_skip_fraction=0.5) as loader:
        keys = []
        for batch in loader:
            assert tuple(batch["video"].shape[1:]) == (8, 3, 24, 24) and batch["video"].dtype == torch.float32
            assert batch["text"] == [f"caption of {k}" for k in batch["key"]]
            keys += batch["key"]
        skipped = loader.stats()
    assert sorted(keys) == sorted(truth)  # every good clip once, none of the damaged ones
    assert skipped["skipped"]["samples"] == {"bad_video": 3}


def test_train_pipeline_layout_and_fp16(tmp_path):
    from dalistream.pipelines import video_clips_train

    paths, _ = clip_shards(tmp_path, ("vp9",), n_shards=1, per_shard=4)
    for decode, start in (("dali", "fork"), ("worker", "spawn")):  # (spawn: as on a GPU, the kinds and Clips travel)
        with video_clips_train.loader(paths, batch_size=2, frames=5, stride=2, size=16, resize=20, workers=1,
                                      device="cpu", decode=decode, fp16=True, text_exts=None,
                                      start_method=start) as loader:
            batch = next(iter(loader))
        assert set(batch) == {"video"}
        assert tuple(batch["video"].shape) == (2, 5, 3, 16, 16) and batch["video"].dtype == torch.float16


@pytest.mark.parametrize("decode", ["dali", "worker"])
def test_eval_gives_several_evenly_spaced_clips_a_video_laid_out_b_n_f_c_h_w(tmp_path, decode):
    """``video_clips_eval`` with ``per_video=N`` (clip-averaged evaluation): ``(B, N, F, C, H, W)``,
    clip ``i`` of a video the normalized frames at the ``i``-th evenly spaced start, at a target
    fps over sources of 24, 30 and 60 fps."""
    from dalistream.pipelines import video_clips_eval

    paths, truth = clip_shards(tmp_path, ("vp9",), n_shards=1, per_shard=5, sizes=(20, 25), rates=(24, 30, 60))
    frames, per_video, fps = 3, 3, 12
    reference = Clips(frames=frames, fps=fps, per_video=per_video, train=False)
    keys = []
    with video_clips_eval.loader(paths, batch_size=2, frames=frames, fps=fps, per_video=per_video, size=32,
                                 workers=1, device="cpu", decode=decode, fields={"key": "__key__"},
                                 dali_options={"mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}) as loader:
        for batch in loader:
            video = batch["video"]
            assert tuple(video.shape[1:]) == (per_video, frames, 3, 32, 32) and video.dtype == torch.float32
            for key, clips in zip(batch["key"], video):
                taken = reference.indices(probe(truth[key]), key, 0).reshape(per_video, frames)
                got = [frame_ids(np.asarray(c.permute(0, 2, 3, 1))) for c in clips]
                assert got == taken.tolist(), key
                assert len({tuple(t) for t in taken.tolist()}) == per_video  # three places in the video
            keys += batch["key"]
    assert sorted(keys) == sorted(truth)


GPU_OPS = {"video_dali": {("decoders__Video", "mixed"), ("Resize", "gpu"), ("CropMirrorNormalize", "gpu")},
           "video_worker": {("Resize", "gpu"), ("CropMirrorNormalize", "gpu")},
           "audio": {("Spectrogram", "gpu"), ("MelFilterBank", "gpu"), ("ToDecibels", "gpu")}}


@pytest.mark.parametrize("graph", sorted(GPU_OPS))
def test_the_ready_media_pipelines_put_their_ops_on_the_gpu_of_a_gpu_stream(tmp_path, graph):
    """The graph a ready media pipeline defines for a GPU stream (defined, not built: no GPU needed)
    decodes video on ``mixed`` (NVDEC) and resizes, crops and normalizes clips, or computes the
    log-mel, on the GPU; for a CPU stream, the same ops all on the CPU."""
    import dataclasses

    from dalistream.dali.compat import operators
    from dalistream.pipelines import audio_train, video_clips_train

    if graph == "audio":
        tar = write_tar(str(tmp_path / "a.tar"), [("a.wav", make_wav(400, rate=8000))])
        fields = {"audio": {"exts": "wav", "kind": "audio", "decoder": Crops()}}
        pipeline, options = audio_train.pipeline, {"sample_rate": 8000, "length": 400}
    else:
        decode = graph.split("_")[1]
        tar = write_tar(str(tmp_path / "v.tar"), [("v.webm", make_clip("vp9", 3))])
        fields = {"video": video_clips_train.clip_field("webm", Clips(frames=2, per_video=2, decode=decode))}
        pipeline, options = video_clips_train.pipeline, {"frames": 2, "size": 16, "decode": decode, "per_video": 2}
    cpu = dalistream.Stream.open([tar], fields=fields, batch_size=1, workers=1, device="cpu")
    gpu = dataclasses.replace(cpu, device="gpu", device_id=0)
    on_gpu, on_cpu = operators(pipeline(gpu, **options)), operators(pipeline(cpu, **options))
    assert GPU_OPS[graph] <= on_gpu, on_gpu
    assert {(name, "cpu") for name, _ in GPU_OPS[graph]} <= on_cpu, on_cpu
    assert not {device for _, device in on_cpu} - {"cpu"}
    if graph == "audio":
        assert ("decoders__Audio", "cpu") in on_gpu  # (DALI 2.4 decodes audio on the CPU only)


def test_audio_is_cropped_where_the_worker_drew_and_turned_to_log_mel(tmp_path):
    from dalistream.pipelines import audio_train

    rate, seconds = 8000, 0.25
    length = int(rate * seconds)
    members, truth = [], {}
    for i, n in enumerate((600, 2000, 3100, 5000)):
        wav = make_wav(n, rate=rate, channels=1, seed=i)
        key = f"a/{i}"
        audio = (f"{key}.flac", make_flac(n, rate=rate, seed=i)) if i % 2 else (f"{key}.wav", wav)  # the same samples
        members += [audio, (f"{key}.txt", f"words {i}".encode())]
        truth[key] = np.frombuffer(wav[44:], "<i2").astype(np.float32) / 32768
    paths = [write_tar(str(tmp_path / "a.tar"), members)]
    for train in (True, False):
        crops = Crops(train=train, seed=6)
        got = {}
        with audio_train.loader(paths, batch_size=3, sample_rate=rate, seconds=seconds, train=train, workers=1,
                                device="cpu", waveform=True, seed=6, mels=40, fields={"key": "__key__"},
                                policy="exact") as loader:
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                for batch in loader:
                    assert tuple(batch["mel"].shape[1:]) == (40, length // 160 + 1)
                    assert torch.isfinite(batch["mel"]).all()
                    for key, text, wave in zip(batch["key"], batch["text"], batch["audio"].numpy()):
                        assert text == f"words {key[2:]}"
                        signal = truth[key]
                        start = int(max(0, len(signal) - length) * np.float32(crops.start(key, epoch)))
                        expected = np.zeros(length, np.float32)
                        part = signal[start:start + length]
                        expected[:len(part)] = part
                        assert np.abs(wave - expected).max() < 1e-3, (key, epoch, train)
                        got[key, epoch] = start
        assert len(got) == 8


@pytest.mark.gpu
@pytest.mark.parametrize("codec", sorted(CODECS))
def test_nvdec_decodes_the_same_frames(tmp_path, codec):
    """On a GPU (``mixed``), every codec's clips are PyAV's frames at the drawn indices."""
    if ops.gpu_count() < 1:
        pytest.skip("needs a CUDA device visible to DALI")
    paths, truth = clip_shards(tmp_path, (codec,))
    clips = Clips(frames=4, stride=2, decode="dali", device="gpu", seed=1)
    with open_clips(paths, clips, policy="exact", start_method="spawn") as loader:
        for batch in loader:
            check_frames(batch, truth, clips, 0)


@pytest.mark.parametrize("decode", ["dali", "worker"])
def test_a_cut_webm_is_skipped_or_gives_its_own_frames(tmp_path, decode):
    """WebM cut anywhere: the probe refuses it (``bad_video``, counted), or counts the frames left,
    and the clip holds those frames: never another place's or another sample's, never a dead
    pipeline."""
    whole = {f"w/{i}": make_clip("vp9", 12, blue=15 * i) for i in range(8)}
    members, cut = [], {}
    for i, (key, data) in enumerate(whole.items()):
        cut[key] = data[:len(data) * (i + 3) // 11]
        members += [(f"{key}.webm", cut[key])]
    paths = [write_tar(str(tmp_path / "cut.tar"), members)]
    clips = Clips(frames=12, stride=1, train=False, short="black", decode=decode)
    fields = {"video": {"exts": "webm", "kind": "video", "ndim": clips.ndim, "decoder": clips}, "key": "__key__"}
    stream = dalistream.Stream.open(paths, fields=fields, batch_size=3, workers=1, device="cpu", policy="exact",
                                    on_error="skip", max_skip_fraction=1.0)
    got = {}
    with dalistream.Loader(stream, raw_clips, frames=12, decode=decode) as loader:
        for batch in loader:
            got.update(zip(batch["key"], as_clips(batch["video"])))
        skipped = loader.stats()["skipped"]["samples"]
    assert len(got) + skipped.get("bad_video", 0) == len(whole) and 0 < len(got) < len(whole)
    for key, clip in got.items():
        left = len(pyav_frames(cut[key]))
        assert frame_ids(clip) == list(range(left)) + [-1] * (12 - left), key


def damaged_inside(data: bytes, first: int, last: int, seed: int = 0) -> bytes:
    """``data`` with packets ``first .. last - 1`` of its video stream overwritten: the container
    stays whole (the workers' probe passes it), the stream does not decode."""
    import io

    import av

    with av.open(io.BytesIO(data)) as c:
        places = [(p.pos, p.size) for p in c.demux(video=0) if p.size]
    out = bytearray(data)
    rng = np.random.default_rng(seed)
    for pos, size in places[first:last]:
        out[pos + size // 3:pos + size - 2] = rng.integers(0, 256, size - 2 - size // 3, dtype=np.uint8).tobytes()
    return bytes(out)


@pytest.mark.parametrize("bad", [1, 4])
@pytest.mark.parametrize("per_video", [1, 3])
def test_a_clip_dalis_decoder_fails_on_is_named(tmp_path, bad, per_video):
    """Damage inside a VP9 stream passes the workers' probe and fails DALI's CPU video decoder for
    the whole batch; the error names the clip (shard, member: found by decoding the batch with
    PyAV), as ``bad_video``, with the worker decode as the way out."""
    from dalistream.kinds.video import probe

    whole = [make_clip("vp9", 12, blue=9 * i) for i in range(6)]
    members = [(f"d/{i}.webm", damaged_inside(data, 2, 5) if i == bad else data) for i, data in enumerate(whole)]
    assert probe(members[bad][1]).frames == 12
    paths = [write_tar(str(tmp_path / "d.tar"), members)]
    clips = Clips(frames=6, stride=2, train=False, decode="dali", per_video=per_video)
    fields = {"video": {"exts": "webm", "kind": "video", "decoder": clips}, "key": "__key__"}
    stream = dalistream.Stream.open(paths, fields=fields, batch_size=2, workers=1, device="cpu", policy="exact",
                                    interleave=False, shuffle=0)
    with pytest.raises(dalistream.SampleError) as caught:
        with dalistream.Loader(stream, raw_clips, frames=clips.length, decode="dali") as loader:
            for _ in loader:
                pass
    error = caught.value
    assert error.reason == "bad_video" and error.url == paths[0] and error.member == f"d/{bad}"
    assert "video decoder" in str(error) and "decode='worker'" in error.hint
