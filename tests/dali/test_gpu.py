"""The GPU path (mixed decode, GPU augmentation, CUDA tensors), checked where DALI sees a GPU.

Every test here is skipped on a machine without one, and each skip says what it needs (how many
GPUs). Run them alone on a GPU machine: ``python -m pytest -q tests/dali/test_gpu.py`` (see
docs/guide/gpu.md); a figure a test measures (the throughput ratio against DALI's own reader) is
printed and, when ``DALISTREAM_GPU_FIGURES`` names a file, appended to it as a JSON line.
No timing assertion: speed is reported, never asserted.
"""

import json
import math
import os
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import dalistream
from dalistream import ops
from dalistream.tools.synth import SynthSpec, write_dataset

# The GPU count is asked when a test runs, not at collection: asking initializes CUDA in the
# asking process, after which DALI cannot fork workers (conftest.py also runs these tests last).
pytestmark = [pytest.mark.dali, pytest.mark.gpu]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "docs", "recipes", "torchrun_train.py")
LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
            "SLURM_NTASKS_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def needs_gpus(request):
    """Skip unless DALI sees the GPUs the test asks for: ``@pytest.mark.gpu(n)``, else one."""
    marker = request.node.get_closest_marker("gpu")
    wanted = marker.args[0] if marker is not None and marker.args else 1
    found = ops.gpu_count()
    if found < wanted:
        pytest.skip(f"needs {wanted} CUDA device{'s' if wanted > 1 else ''} visible to DALI, found {found}")


@dalistream.pipeline_def
def decoded(stream, size=48, decoder_options=None, resize=True):
    data = dalistream.read(stream)
    images = ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad,
                               decoder_options=decoder_options)
    if resize:  # no randomness: the same shards give the same pixels
        images = ops.random_resized_crop(images, stream.device, (size, size))
    return {"image": images, "key": data["key"]}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gpu"))
    write_dataset(d, SynthSpec(shards=4, samples_per_shard=12, uneven=True, seed=3))
    return d


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """Enough samples for many batches in one epoch."""
    d = str(tmp_path_factory.mktemp("gpu-many"))
    write_dataset(d, SynthSpec(shards=8, samples_per_shard=24, uneven=True, seed=4))
    return d


def keys_in(folder: str) -> list:
    """Every sample key in the folder's shards, read with Python's tarfile."""
    keys = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(folder, name)) as tar:
                keys += sorted({m.name.rsplit(".", 1)[0] for m in tar.getmembers() if m.isfile()})
    return keys


def open_stream(shards, device, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("workers", 2)
    return dalistream.Stream.open(shards, fields={"image": "jpg;png", "key": "__key__", "label": "cls"},
                                  device=device, **kw)


def child_env(**launcher) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env.update({k: str(v) for k, v in launcher.items()})
    return env


def run_child(code: str, timeout: int = 300, **launcher) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
                          env=child_env(**launcher), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Which GPUs hold a CUDA context of this process: torch, DALI and nvImageCodec all use the runtime
# API, whose context on a device is that device's primary context.
ACTIVE_CONTEXTS = """
import ctypes
def active_contexts():
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    out = []
    for i in range(count.value):
        device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(device), i)
        cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active))
        out.append(bool(active.value))
    return out
"""


# -- the basics --------------------------------------------------------------------------------

def test_auto_picks_the_gpu(shards):
    assert open_stream(shards, "auto").device == "gpu"


def test_classification_train_yields_cuda_tensors(shards):
    from dalistream.pipelines import classification_train

    with classification_train.loader(shards, batch_size=8, size=32, workers=2, device="gpu") as loader:
        device = dalistream.torch_device(loader.stream)
        batch = next(iter(loader))
    assert batch["image"].device == batch["label"].device == device
    assert batch["image"].shape == (8, 3, 32, 32) and str(batch["label"].dtype) == "torch.int64"


def test_gpu_decode_matches_cpu_decode_and_padding_is_trimmed(shards):
    out = {}
    for device in ("cpu", "gpu"):
        # DALI's GPU decoder upsamples chroma without smoothing unless told: the same setting on both
        with dalistream.Loader(open_stream(shards, device, policy="exact"), decoded,
                               decoder_options={"jpeg_fancy_upsampling": True}) as loader:
            images = {}
            for batch in loader:
                for key, image in zip(batch["key"], batch["image"]):
                    images[key] = image.cpu().numpy().astype(np.float32)
            out[device] = images
    assert out["cpu"].keys() == out["gpu"].keys()
    diff = np.mean([np.abs(out["cpu"][k] - out["gpu"][k]).mean() for k in out["cpu"]])
    assert diff < 4.0  # nvJPEG and libjpeg-turbo differ by rounding only


@pytest.mark.parametrize("dynamic", [True, False])
def test_gpu_outputs_reach_torch_without_a_copy_under_the_dynamic_executor(dynamic):
    """The dynamic executor's outputs stay valid while referenced: torch gets the same memory
    (DLPack); the other executor reuses its buffers, so its outputs are copied once."""
    import torch
    from nvidia.dali import fn, pipeline_def

    from dalistream.dali import compat
    from dalistream.loader.convert import to_torch

    @pipeline_def(batch_size=2, num_threads=1, device_id=0, exec_dynamic=dynamic)
    def graph():
        return fn.random.uniform(range=[0.0, 1.0], shape=[4, 3]).gpu()

    pipe = graph()
    pipe.build()
    (out,) = compat.run_batch(pipe, compat.consumer_stream(pipe))
    dali_ptr = out.as_tensor().data_ptr()
    batch = to_torch([("x", "tensor")], [out], zero_copy=compat.exec_dynamic(pipe))
    assert compat.exec_dynamic(pipe) is dynamic
    assert (compat.consumer_stream(pipe) is not None) is dynamic  # DALI 2.4 takes a stream under that executor only
    assert batch["x"].is_cuda and tuple(batch["x"].shape) == (2, 4, 3)
    assert (batch["x"].data_ptr() == dali_ptr) is dynamic
    assert torch.equal(batch["x"].cpu(), torch.from_numpy(out.as_cpu().as_array()))


def test_ragged_gpu_outputs_stay_on_the_gpu(shards):
    """Decoded images of different sizes (no resize) come as a list of CUDA tensors, one per sample,
    equal to the CPU decode's: never copied through the host."""
    out = {}
    for device in ("cpu", "gpu"):
        with dalistream.Loader(open_stream(shards, device, policy="exact"), decoded, resize=False,
                               decoder_options={"jpeg_fancy_upsampling": True}) as loader:
            out[device] = {k: v for batch in loader for k, v in zip(batch["key"], batch["image"])}
    assert out["cpu"].keys() == out["gpu"].keys()
    for key, image in out["gpu"].items():
        assert image.is_cuda and image.device.index == 0
        assert image.shape == out["cpu"][key].shape
        assert float((image.cpu().float() - out["cpu"][key].float()).abs().mean()) < 4.0


# -- every sample once ------------------------------------------------------------------------

def test_exact_delivers_every_sample_once_per_epoch_on_the_gpu(shards):
    """``exact`` on a GPU stream: each epoch holds every key of the shards once, none empty, the
    images of a batch as many as its keys; two ranks together the same, without overlap."""
    expected = keys_in(shards)
    with dalistream.Loader(open_stream(shards, "gpu", policy="exact", shuffle=16), decoded) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            keys = []
            for batch in loader:
                assert batch["image"].is_cuda and batch["image"].shape[0] == len(batch["key"])
                keys += batch["key"]
            assert all(keys) and len(keys) == len(set(keys)) == len(expected)
            assert sorted(keys) == expected
    per_rank = []
    for rank in range(2):
        with dalistream.Loader(open_stream(shards, "gpu", policy="exact", rank=rank, world_size=2), decoded) as loader:
            per_rank.append([k for batch in loader for k in batch["key"]])
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == expected


# -- which GPU -----------------------------------------------------------------------------------

PLACEMENT = ACTIVE_CONTEXTS + """
import json, sys
import dalistream
from dalistream.pipelines import classification_train
loader = classification_train.loader({data!r}, batch_size=8, size=32, workers=1)
device = dalistream.torch_device(loader.stream)
devices = set()
with loader:
    for i, batch in enumerate(loader):
        devices |= {{str(batch["image"].device), str(batch["label"].device)}}
        (batch["image"].float().mean() + batch["label"].float().mean()).item()
        if i == 3:
            break
print(json.dumps({{"device_id": loader.stream.device_id, "torch_device": str(device),
                  "batch_devices": sorted(devices), "contexts": active_contexts()}}))
"""


@pytest.mark.gpu(2)
def test_local_rank_1_of_two_visible_gpus_uses_gpu_1_and_nothing_on_gpu_0(many):
    seen = run_child(PLACEMENT.format(data=many), LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, RANK=1, WORLD_SIZE=2)
    assert seen["device_id"] == 1 and seen["torch_device"] == "cuda:1"
    assert seen["batch_devices"] == ["cuda:1"]
    assert seen["contexts"][0] is False, "this process made a CUDA context on GPU 0"
    assert seen["contexts"][1] is True


@pytest.mark.parametrize("visible", [pytest.param("1", marks=pytest.mark.gpu(2)), "0"])
def test_one_visible_gpu_is_the_process_own_whatever_its_local_rank(many, visible):
    """srun --gpus-per-task=1 (or Kubernetes) leaves one GPU visible: local rank 3 uses it, as cuda:0."""
    seen = run_child(PLACEMENT.format(data=many), CUDA_VISIBLE_DEVICES=visible, LOCAL_RANK=3, LOCAL_WORLD_SIZE=4,
                     RANK=3, WORLD_SIZE=4)
    assert seen["device_id"] == 0 and seen["torch_device"] == "cuda:0"
    assert seen["batch_devices"] == ["cuda:0"] and seen["contexts"] == [True]


@pytest.mark.gpu(2)
def test_two_processes_under_torchrun_train_with_nccl_and_ddp(many, tmp_path):
    """docs/recipes/torchrun_train.py over classification_train, 2 ranks on 2 GPUs, NCCL: rank r's
    model and batches on cuda:r, both ranks the same steps every epoch."""
    report = tmp_path / "report"
    report.mkdir()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           RECIPE, "--data", many, "--batch-size", "16", "--size", "64", "--workers", "2",
                           "--epochs", "2", "--classes", "10", "--report", str(report)],
                          capture_output=True, text=True, timeout=600, env=child_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((report / f"rank-{r}.json").read_text()) for r in range(2)]
    for r, seen in enumerate(ranks):
        assert (seen["device"], seen["model_device"], seen["batch_devices"]) == (f"cuda:{r}", f"cuda:{r}", [f"cuda:{r}"])
    for epoch in range(2):
        assert ranks[0]["epochs"][epoch]["steps"] == ranks[1]["epochs"][epoch]["steps"] > 0


# -- buffers and streams -------------------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [True, False])
def test_batches_the_loop_keeps_are_never_overwritten(many, dynamic):
    """Keep the first batches (and clones made on arrival), run three times the prefetch depth
    more: the kept batches still equal their clones, under either executor."""
    import torch

    depth, keep = 2, 3
    kept, clones = [], []
    with dalistream.Loader(open_stream(many, "gpu"), decoded, exec_dynamic=dynamic, prefetch_queue_depth=depth) as loader:
        assert len(loader) >= keep + 3 * depth
        for n, batch in enumerate(loader):
            if len(kept) < keep:
                kept.append(batch)
                clones.append({"image": batch["image"].clone(), "key": list(batch["key"])})
            else:
                (batch["image"].float() * 2).sum()  # GPU work of later batches meanwhile
            if n + 1 >= keep + 3 * depth:
                break
        torch.cuda.synchronize()
        for batch, clone in zip(kept, clones):
            assert batch["key"] == clone["key"]
            assert torch.equal(batch["image"], clone["image"])


def test_a_consumer_on_its_own_stream_with_a_long_kernel_queued_reads_the_right_pixels(many):
    """The loop runs on a non-default stream and queues a long kernel before reading each batch
    (and drops the batch before the kernel ran): what it reads is what a synchronous loop reads.
    DALI's outputs are ordered on, and their buffers freed in the order of, the consumer's stream."""
    import torch

    def sums(stream, cycles):
        out = []
        with dalistream.Loader(open_stream(many, "gpu"), decoded) as loader, torch.cuda.stream(stream):
            for batch in loader:
                if cycles:
                    torch.cuda._sleep(cycles)  # a long kernel ahead of this batch's reading on the stream
                    out.append(batch["image"].double().sum())  # queued; the batch itself is dropped
                else:
                    out.append(batch["image"].double().sum().item())
        torch.cuda.synchronize()
        return [float(s) for s in out]

    reference = sums(torch.cuda.current_stream(), 0)
    side = torch.cuda.Stream()
    assert sums(side, 50_000_000) == reference


# -- padding only ------------------------------------------------------------------------------

@pytest.mark.parametrize("load", [0.0, 1.0])
def test_batches_made_only_of_padding_decode_with_either_decoder_engine(load):
    """Every position a placeholder: the mixed decoder takes it on the hardware engine
    (``hw_decoder_load`` 1, A100/H100) and on the CUDA one (0)."""
    from nvidia.dali import fn, pipeline_def

    rows = [np.zeros(0, np.uint8)] * 4
    valid = [np.array(0, np.uint8)] * 4

    @pipeline_def(batch_size=4, num_threads=2, device_id=0)
    def pipe():
        data, flags = fn.external_source(source=lambda: (rows, valid), num_outputs=2, batch=True)
        return ops.decode_images(data, flags, "gpu", decoder_options={"hw_decoder_load": load})

    p = pipe()
    p.build()
    for _ in range(3):
        (images,) = p.run()
        host = images.as_cpu()
        assert [np.array(host[i]).shape for i in range(4)] == [(16, 16, 3)] * 4


@pytest.mark.parametrize("load", [0.0, 1.0])
def test_a_rank_whose_batch_is_all_padding_yields_nothing_and_fails_nothing(tmp_path, load):
    """3 samples over 4 ranks, ``exact``: one rank's only batch is padding; on the GPU it decodes the
    placeholders and yields nothing, the others one sample each."""
    write_dataset(str(tmp_path), SynthSpec(shards=1, samples_per_shard=3, seed=1))
    seen = []
    for rank in range(4):
        stream = open_stream(str(tmp_path), "gpu", batch_size=2, policy="exact", rank=rank, world_size=4)
        with dalistream.Loader(stream, decoded, decoder_options={"hw_decoder_load": load}) as loader:
            seen.append([k for batch in loader for k in batch["key"]])
    assert sorted(len(keys) for keys in seen) == [0, 1, 1, 1]
    assert sorted(k for keys in seen for k in keys) == keys_in(str(tmp_path))


# -- memory and lifetime ---------------------------------------------------------------------------

def test_gpu_memory_is_steady_over_epochs(many):
    """After the first epochs fill DALI's pools, the memory in use on the GPU stays where it is."""
    import torch

    from dalistream.pipelines import classification_train

    used = []
    with classification_train.loader(many, batch_size=16, size=64, workers=2, device="gpu") as loader:
        device = dalistream.torch_device(loader.stream)
        for epoch in range(8):
            loader.set_epoch(epoch)
            for batch in loader:
                batch["image"].float().mean()
            torch.cuda.synchronize(device)
            free, total = torch.cuda.mem_get_info(device)
            used.append(total - free)
    settled = used[3:]
    assert max(settled) - min(settled) <= 64 << 20, [u >> 20 for u in used]


def test_a_batch_that_outlives_close_stays_valid_and_the_process_exits_cleanly(many):
    code = """
    import json, torch, dalistream
    from dalistream.pipelines import classification_train
    loader = classification_train.loader({data!r}, batch_size=8, size=32, workers=2, device="gpu")
    device = dalistream.torch_device(loader.stream)
    batch = next(iter(loader))
    before = batch["image"].double().sum().item()
    loader.close()
    after = batch["image"].double().sum().item()  # read after the pipeline and its workers are gone
    doubled = (batch["image"] * 2).double().sum().item()
    print(json.dumps({{"before": before, "after": after, "doubled": doubled}}))
    # and the interpreter exits with `batch` still alive
    """.format(data=many)
    seen = run_child(code, timeout=180)
    assert seen["before"] == seen["after"] and math.isclose(seen["doubled"], 2 * seen["before"], rel_tol=1e-6)


# -- video and audio ------------------------------------------------------------------------------

MEDIA_CODECS = ("h264", "av1")


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Per codec (H.264, AV1: NVDEC's): a folder of one shard of 128×128 clips at 24, 30 and 60 fps
    (frame ``i`` says it is ``i``: tests/media.py), and {key: bytes}."""
    pytest.importorskip("av")
    from helpers import write_tar
    from media import make_clip

    out = {}
    for codec in MEDIA_CODECS:
        folder = tmp_path_factory.mktemp(f"gpu-{codec}")
        truth = {f"{codec}{i:02d}": make_clip(codec, 14 + i, blue=20 * i, size=128, rate=(24, 30, 60)[i % 3])
                 for i in range(6)}
        write_tar(str(folder / "clips-0.tar"), [(f"{key}.mp4", data) for key, data in truth.items()])
        out[codec] = (str(folder), truth)
    return out


MEDIA_PLACEMENT = ACTIVE_CONTEXTS + """
import json
import dalistream
from dalistream.pipelines import video_clips_train
loader = video_clips_train.loader({data!r}, batch_size=2, frames=4, size=32, workers=1, text_exts=None)
devices, shapes = set(), set()
with loader:
    for i, batch in enumerate(loader):
        devices.add(str(batch["video"].device))
        shapes.add(tuple(batch["video"].shape))
        batch["video"].float().mean().item()
        if i == 1:
            break
decode = [f.decoder.decode for f in loader.stream.config.fields if f.name == "video"][0]
print(json.dumps({{"device_id": loader.stream.device_id, "torch_device": str(dalistream.torch_device(loader.stream)),
                  "decode": decode, "batch_devices": sorted(devices), "shapes": sorted(shapes),
                  "contexts": active_contexts()}}))
"""


@pytest.mark.gpu(2)
def test_video_clips_train_on_local_rank_1_of_two_gpus_is_on_gpu_1_and_nothing_on_gpu_0(clips):
    seen = run_child(MEDIA_PLACEMENT.format(data=clips["h264"][0]), LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, RANK=1,
                     WORLD_SIZE=2)
    assert seen["device_id"] == 1 and seen["torch_device"] == "cuda:1" and seen["decode"] == "dali"
    assert seen["batch_devices"] == ["cuda:1"] and seen["shapes"] == [[2, 4, 3, 32, 32]]
    assert seen["contexts"][0] is False, "this process made a CUDA context on GPU 0"
    assert seen["contexts"][1] is True


@pytest.mark.parametrize("visible", [pytest.param("1", marks=pytest.mark.gpu(2)), "0"])
def test_video_clips_train_with_one_visible_gpu_is_on_cuda_0(clips, visible):
    seen = run_child(MEDIA_PLACEMENT.format(data=clips["h264"][0]), CUDA_VISIBLE_DEVICES=visible, LOCAL_RANK=3,
                     LOCAL_WORLD_SIZE=4, RANK=3, WORLD_SIZE=4)
    assert seen["device_id"] == 0 and seen["torch_device"] == "cuda:0" and seen["decode"] == "dali"
    assert seen["batch_devices"] == ["cuda:0"] and seen["contexts"] == [True]


@pytest.mark.parametrize("codec", MEDIA_CODECS)
def test_nvdec_decodes_h264_and_av1_through_the_ready_eval_pipeline(clips, codec):
    """``video_clips_eval`` on the GPU (NVDEC, ``mixed``), several clips a video at a target fps:
    each clip is PyAV's frames at the spaced indices, on the GPU, ``(B, N, F, C, H, W)``."""
    from dalistream.kinds.video import Clips, probe
    from dalistream.pipelines import video_clips_eval
    from media import frame_ids, pyav_frames

    folder, truth = clips[codec]
    frames, per_video, fps = 4, 2, 12
    reference = Clips(frames=frames, fps=fps, per_video=per_video, train=False)
    keys = []
    with video_clips_eval.loader(folder, batch_size=2, frames=frames, fps=fps, per_video=per_video, size=128,
                                 workers=2, device="gpu", text_exts=None, fields={"key": "__key__"},
                                 dali_options={"mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}) as loader:
        for batch in loader:
            video = batch["video"]
            assert video.is_cuda and tuple(video.shape[1:]) == (per_video, frames, 3, 128, 128)
            for key, got in zip(batch["key"], video.permute(0, 1, 2, 4, 5, 3).cpu().numpy()):
                taken = reference.indices(probe(truth[key]), key, 0).tolist()
                got = got.reshape(per_video * frames, 128, 128, 3)
                assert frame_ids(got) == taken, key
                decoded = pyav_frames(truth[key])
                for frame, i in zip(got, taken):
                    assert np.abs(frame - decoded[i]).mean() < 4, (key, i)
            keys += batch["key"]
    assert sorted(keys) == sorted(truth)


def test_audio_train_log_mel_on_the_gpu_equals_the_cpus(tmp_path):
    """``audio_train``'s log-mel computed on the GPU is the CPU's within float error (dB)."""
    pytest.importorskip("av")
    from dalistream.pipelines import audio_train
    from helpers import write_tar
    from media import make_flac, make_wav

    members = []
    for i in range(6):
        data = make_wav(3000 + 700 * i, rate=(8000, 22050)[i % 2], seed=i) if i % 3 else make_flac(4000, seed=i)
        members += [(f"a{i}.{'wav' if i % 3 else 'flac'}", data), (f"a{i}.txt", f"say {i}".encode())]
    tar = write_tar(str(tmp_path / "audio-0.tar"), members)
    mels = {}
    for device in ("cpu", "gpu"):
        with audio_train.loader([tar], batch_size=2, sample_rate=8000, seconds=0.5, train=False, device=device,
                                workers=1, fields={"key": "__key__"}) as loader:
            for batch in loader:
                assert batch["mel"].is_cuda == (device == "gpu")
                for key, mel in zip(batch["key"], batch["mel"].cpu().numpy()):
                    mels[device, key] = mel
    keys = sorted(k for d, k in mels if d == "cpu")
    assert len(keys) == 6 and keys == sorted(k for d, k in mels if d == "gpu")
    worst = max(float(np.abs(mels["gpu", k] - mels["cpu", k]).max()) for k in keys)
    print(json.dumps({"test": "audio_log_mel_gpu_vs_cpu", "max_abs_db": worst}))
    for k in keys:
        assert mels["gpu", k].shape == mels["cpu", k].shape == (80, 4000 // 160 + 1)
        assert np.allclose(mels["gpu", k], mels["cpu", k], rtol=1e-3, atol=0.05), (k, worst)


# -- speed, reported ---------------------------------------------------------------------------

def test_throughput_against_dali_native_in_the_same_run(tmp_path):
    """``dalistream bench --device gpu --compare dali-native``: both run on the GPU; the ratio of
    their rates is printed (and kept in ``DALISTREAM_GPU_FIGURES``), never asserted."""
    data = str(tmp_path / "data")
    write_dataset(data, SynthSpec(shards=16, samples_per_shard=64, seed=9))
    done = subprocess.run([sys.executable, "-m", "dalistream", "bench", data, "--device", "gpu", "--pipeline",
                           "classification_train", "--workers", "4", "--batch-size", "64", "--epochs", "3",
                           "--compare", "dali-native", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=900, env=child_env(DALISTREAM_CACHE=str(tmp_path / "c")),
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    native = report["peers"]["dali-native"]
    assert report["config"]["device"] == "gpu"  # dali-native was asked for the GPU too (--device gpu)
    ratio = native["ratio"]["samples_per_s"]
    assert isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0
    figure = {"test": "throughput_against_dali_native", "dalistream_samples_per_s": report["samples_per_s"],
              "dali_native_samples_per_s": native["samples_per_s"], "ratio": ratio,
              "config": report.get("config")}
    print(json.dumps(figure))
    if os.environ.get("DALISTREAM_GPU_FIGURES"):
        with open(os.environ["DALISTREAM_GPU_FIGURES"], "a") as f:
            f.write(json.dumps(figure) + "\n")
