"""``dalistream bench DATA --pipeline video_clips_train`` (or ``audio_train``): clips per second
and CPU per clip of the ready media pipelines beside a torch ``DataLoader`` and DALI's own reader.

::

    dalistream bench /data/clips-{0000..0015}.tar --pipeline video_clips_train --workers 2 \\
        --batch-size 8 --size 112 --repeats 3 --epochs 2

Systems (every one reads every clip of the shards once per epoch, ``epochs`` epochs):

- ``dalistream``: the ready loader (``video_clips_train`` / ``audio_train``), its frames decoded
  in the DALI workers by PyAV (``decode="worker"``, what ``"auto"`` is on the CPU);
- ``dalistream-dali`` (video): the same loader with ``decode="dali"``: DALI's CPU video decoder
  (VP8, VP9, MJPEG only; other codecs are refused, so use VP9 clips);
- ``torch-pyav``: a torch ``DataLoader`` with as many worker processes, reading the shards with
  ``tarfile`` (each worker its own shards) and decoding in its workers with PyAV the *same*
  clips (:class:`~dalistream.kinds.video.Clips`: the same draw from ``(seed, epoch, key)``, the
  same decode) and the same audio crops (:class:`~dalistream.kinds.audio.Crops`), then the same
  resize of the shorter side, random crop, flip and normalize (video), or the same log-mel
  (audio: ``torch.stft``, a mel matrix, decibels), in torch;
- ``dali-files`` (video): DALI's own ``fn.readers.file`` over the same clips extracted as files
  (before the runs, not timed), the same frames (indices from the same draw, after a PyAV probe
  in the main process) decoded by ``fn.decoders.video`` on the CPU, then the pipeline's own resize
  and crop ops. (DALI 2.4's ``fn.readers.video`` has no CPU backend: "Operator readers__Video not
  registered for cpu".)

Runs alternate between the systems (``--repeats`` rounds), each in a fresh process under the
bench's monitor (:func:`~.monitor.watch`) and timed by the bench's one rule
(:func:`~.timing.run_system`); figures are medians over the rounds, ratios the median of each
round's dalistream / system. ``samples_per_s`` counts clips (audio crops).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from torch.utils.data import IterableDataset  # (a torch DataLoader's dataset: the peer's)

from ...errors import ConfigError, DalistreamError
from ...kinds import AUDIO_EXTS, VIDEO_EXTS
from ...lifetime import temp_folder
from .monitor import watch
from .report import fmt
from .timing import Opened, run_system

MEDIA_PIPELINES = ("video_clips_train", "audio_train")
SYSTEMS_OF = {"video_clips_train": ("dalistream", "dalistream-dali", "torch-pyav", "dali-files"),
              "audio_train": ("dalistream", "torch-pyav")}
FRAMES, STRIDE = 8, 2  # a clip: 8 frames 2 apart
SAMPLE_RATE, SECONDS = 16000, 4.0  # an audio crop: 4 s at 16 kHz
FIGURES = ("samples_per_s", "first_batch_s", "steady_cpu_ms_per_sample", "main_cpu_ms_per_sample",
           "workers_cpu_ms_per_sample", "peak_rss_mb", "peak_pss_mb")
CHILD = "import sys; from dalistream.tools.bench.media import main; sys.exit(main(sys.argv[1:]))"


def _kind(pipeline: str) -> Tuple[str, frozenset]:
    return ("video", VIDEO_EXTS) if pipeline == "video_clips_train" else ("audio", AUDIO_EXTS)


# -- dalistream ---------------------------------------------------------------------------------

def open_dalistream(spec: Dict[str, Any]) -> Opened:
    """The ready loader over the shards (``dalistream-dali``: DALI decodes the clips)."""
    common = dict(batch_size=spec["batch_size"], workers=spec["workers"], device="cpu", seed=spec["seed"],
                  policy="exact", text_exts=None)
    if spec["pipeline"] == "video_clips_train":
        from ...pipelines import video_clips_train

        loader = video_clips_train.loader(spec["urls"], frames=FRAMES, stride=STRIDE, size=spec["size"],
                                          decode="dali" if spec["system"] == "dalistream-dali" else "worker", **common)
        out = "video"
    else:
        from ...pipelines import audio_train

        loader = audio_train.loader(spec["urls"], sample_rate=SAMPLE_RATE, seconds=SECONDS, **common)
        out = "mel"

    def batches():
        for epoch in range(spec["epochs"]):
            loader.set_epoch(epoch)
            yield from loader

    return Opened(batches(), lambda b: (int(b[out].shape[0]), 0), loader.close)


# -- torch DataLoader, PyAV in its workers --------------------------------------------------------

def tar_samples(urls: Sequence[str], exts: frozenset) -> Any:
    """``(key, extension, bytes)`` of each member of ``exts`` in the tar files ``urls``, in order."""
    for url in urls:
        with tarfile.open(url) as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                if member.isfile() and ext.lower() in exts:
                    yield key, ext, tar.extractfile(member).read()


class ClipSet(IterableDataset):
    """An iterable dataset of the shards' clips for a torch ``DataLoader``: worker ``i`` of ``n``
    reads shards ``i, i+n, …``; each clip drawn and decoded by :class:`~dalistream.kinds.video.Clips` (PyAV), then resized,
    cropped, flipped and normalized in torch, as the dalistream pipeline's graph does."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        self.spec, self.epoch = spec, 0

    def _urls(self) -> List[str]:
        import torch.utils.data as tud

        info = tud.get_worker_info()
        return list(self.spec["urls"])[info.id::info.num_workers] if info else list(self.spec["urls"])

    def __iter__(self):
        import torch
        import torch.nn.functional as F

        from ...dali.ops import IMAGENET_MEAN, IMAGENET_STD
        from ...kinds.audio import Crops
        from ...kinds.video import Clips

        spec, size = self.spec, self.spec["size"]
        rng = torch.Generator().manual_seed(spec["seed"] * 1000 + self.epoch)
        if spec["pipeline"] == "video_clips_train":
            clips = Clips(frames=FRAMES, stride=STRIDE, decode="worker", seed=spec["seed"])
            mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
            std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
            for key, _, data in tar_samples(self._urls(), VIDEO_EXTS):
                frames = torch.from_numpy(clips(data, key, self.epoch)).permute(0, 3, 1, 2).float()  # F, 3, H, W
                h, w = frames.shape[-2:]
                scale = size / min(h, w)
                frames = F.interpolate(frames, size=(max(size, round(h * scale)), max(size, round(w * scale))),
                                       mode="bilinear", align_corners=False)
                y = int(torch.randint(frames.shape[-2] - size + 1, (1,), generator=rng))
                x = int(torch.randint(frames.shape[-1] - size + 1, (1,), generator=rng))
                frames = frames[..., y:y + size, x:x + size]
                if torch.rand(1, generator=rng) < 0.5:
                    frames = frames.flip(-1)
                yield (frames - mean) / std
        else:
            crops = Crops(seed=spec["seed"])
            length = int(SECONDS * SAMPLE_RATE)
            for key, _, data in tar_samples(self._urls(), AUDIO_EXTS):
                signal = pyav_audio(data)
                room = max(0, len(signal) - length)
                start = int(crops.start(key, self.epoch) * room)
                crop = torch.zeros(length)
                piece = torch.from_numpy(signal[start:start + length])
                crop[:len(piece)] = piece
                yield log_mel(crop)


def pyav_audio(data: bytes) -> Any:
    """Encoded audio as mono ``float32`` at :data:`SAMPLE_RATE` (PyAV's resampler)."""
    import av
    import numpy as np

    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        parts = [f.to_ndarray().reshape(-1) for frame in container.decode(audio=0) for f in resampler.resample(frame)]
        parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


_MEL: Dict[int, Any] = {}


def log_mel(signal: Any, n_fft: int = 400, hop: int = 160, mels: int = 80) -> Any:
    """The audio pipeline's log-mel in torch: power spectrogram (Hann window), ``mels`` triangular
    mel bands (HTK scale), decibels floored 80 dB below the peak."""
    import numpy as np
    import torch

    if mels not in _MEL:
        hz = lambda m: 700 * (10 ** (m / 2595) - 1)  # noqa: E731
        edges = hz(np.linspace(0, 2595 * np.log10(1 + SAMPLE_RATE / 2 / 700), mels + 2))
        bins = np.linspace(0, SAMPLE_RATE / 2, n_fft // 2 + 1)
        lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
        fb = np.maximum(0, np.minimum((bins - lower) / (centre - lower), (upper - bins) / (upper - centre)))
        _MEL[mels] = (torch.from_numpy(fb.astype(np.float32)), torch.hann_window(n_fft))
    fb, window = _MEL[mels]
    power = torch.stft(signal, n_fft, hop, window=window, center=True, return_complex=True).abs() ** 2
    db = 10 * torch.log10(torch.clamp(fb @ power, min=1e-10))
    return torch.maximum(db, db.max() - 80)


def open_torch(spec: Dict[str, Any]) -> Opened:
    """The torch ``DataLoader`` (``workers`` processes, the default collate)."""
    import torch.utils.data as tud

    iterable = ClipSet(spec)
    loader = tud.DataLoader(iterable, batch_size=spec["batch_size"], num_workers=spec["workers"])

    def batches():
        for epoch in range(spec["epochs"]):
            iterable.epoch = epoch
            yield from loader

    return Opened(batches(), lambda b: (int(b.shape[0]), 0))


# -- DALI's own reader over the clips as files ----------------------------------------------------

def open_dali_files(spec: Dict[str, Any]) -> Opened:
    """``fn.readers.file`` over the extracted clips, ``fn.decoders.video`` (CPU) of the same frames."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from ... import ops
    from ...kinds.video import Clips, probe

    files, keys = spec["files"], spec["keys"]
    clips = Clips(frames=FRAMES, stride=STRIDE, seed=spec["seed"])
    counts = []
    for path in files:  # the frame counts a draw needs: PyAV's probe, as dalistream's workers run it
        with open(path, "rb") as f:
            counts.append(probe(f.read()).frames)
    batch, n = spec["batch_size"], len(files)

    def indices(info):  # the reader's order (no shuffle), its last batch padded with its last file
        first = info.iteration * batch
        if first >= n:
            raise StopIteration
        rows = [min(first + i, n - 1) for i in range(batch)]
        return [clips.indices(counts[r], keys[r], info.epoch_idx) for r in rows]

    @pipeline_def(batch_size=batch, num_threads=spec["threads"], device_id=None, seed=spec["seed"])
    def graph():
        encoded, _ = fn.readers.file(files=list(files), random_shuffle=False, pad_last_batch=True, name="reader")
        frames = fn.external_source(source=indices, batch=True, batch_info=True, dtype=types.INT32)
        video = fn.decoders.video(encoded, device="cpu", frames=frames, pad_mode="constant", fill_value=[0])
        video = ops.resize_clips(video, "cpu", spec["size"])
        return ops.normalize_clips(video, "cpu", (spec["size"], spec["size"]), random_crop=True,
                                   mirror=ops.coin_flip(0.5))

    pipe = graph()
    loader = DALIGenericIterator(pipe, ["video"], reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                                 auto_reset=True)

    def batches():
        for _ in range(spec["epochs"]):
            for out in loader:
                yield out[0]["video"]

    return Opened(batches(), lambda b: (int(b.shape[0]), 0))


SYSTEMS: Dict[str, Tuple[Tuple[str, ...], Callable[[Dict[str, Any]], Opened]]] = {
    "dalistream": (("torch", "av", "nvidia.dali.fn", "nvidia.dali.plugin.pytorch", "dalistream"), open_dalistream),
    "dalistream-dali": (("torch", "av", "nvidia.dali.fn", "nvidia.dali.plugin.pytorch", "dalistream"), open_dalistream),
    "torch-pyav": (("torch", "av"), open_torch),
    "dali-files": (("torch", "av", "nvidia.dali.fn", "nvidia.dali.plugin.pytorch"), open_dali_files),
}


def main(argv: Optional[List[str]] = None) -> int:
    """Child entry point: run the spec (a JSON file named by ``argv[0]``); print one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    print(json.dumps(run_system(spec, SYSTEMS)), flush=True)
    return 0


# -- the comparison ------------------------------------------------------------------------------

def run_child(spec: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """One run of one system in a fresh process under the monitor: its figures and the tree's peaks."""
    tmp = temp_folder("bench")
    with contextlib.ExitStack() as stack, tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        stack.callback(shutil.rmtree, tmp, True)
        path = os.path.join(tmp, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        peaks = watch([sys.executable, "-c", CHILD, path], stdout=out, stderr=err, timeout=timeout)
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
        if peaks["returncode"] != 0 or not lines:
            raise DalistreamError(f"bench run of {spec['system']} failed (exit {peaks['returncode']}):\n"
                                  f"{err.read()[-3000:]}", hint="run it alone with --repeats 1 to see the whole error")
    return {**json.loads(lines[-1]), **peaks}


def extract(urls: Sequence[str], exts: frozenset, folder: str) -> Tuple[List[str], List[str]]:
    """The shards' media members as files in ``folder`` (in shard order), and their sample keys."""
    files, keys = [], []
    for i, (key, ext, data) in enumerate(tar_samples(urls, exts)):
        path = os.path.join(folder, f"{i:07d}.{ext}")
        with open(path, "wb") as f:
            f.write(data)
        files.append(path)
        keys.append(key)
    return files, keys


def _median(values: Sequence[Any]) -> Optional[float]:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(numbers) if numbers else None


def compare(spec: Dict[str, Any], systems: Sequence[str], repeats: int, timeout: float,
            log: Callable[[str], None]) -> Dict[str, Any]:
    """``repeats`` rounds of every system in turn; medians per system and the round ratios."""
    runs: Dict[str, List[Dict[str, Any]]] = {s: [] for s in systems}
    load = [round(os.getloadavg()[0], 2)]
    for repeat in range(repeats):
        for system in systems:
            result = run_child(dict(spec, system=system), timeout)
            runs[system].append(result)
            log(f"  [{repeat + 1}/{repeats}] {system:16s} {fmt(result.get('samples_per_s'), 8, 1)} clips/s  "
                f"CPU {fmt(result.get('steady_cpu_ms_per_sample'), 6, 1)} ms/clip  samples {result.get('samples')}")
    load.append(round(os.getloadavg()[0], 2))
    out: Dict[str, Any] = {}
    for system in systems:
        figures = {key: _median([r.get(key) for r in runs[system]]) for key in FIGURES}
        figures.update(samples=[r.get("samples") for r in runs[system]], runs=len(runs[system]),
                       samples_per_s_runs=[r.get("samples_per_s") for r in runs[system]])
        if system != systems[0]:
            figures["ratio"] = {key: _median([a[key] / b[key] for a, b in zip(runs[systems[0]], runs[system])
                                              if a.get(key) and b.get(key)]) for key in FIGURES}
        out[system] = figures
    return {"systems": out, "loadavg_1m": load}


def run_media(args: Any, log: Callable[[str], None]) -> int:
    """``dalistream bench --pipeline video_clips_train|audio_train``: the comparison; prints the
    table (and with ``--json`` one JSON object as the last stdout line)."""
    from ...manifest import count_shards
    from ...sources import expand_sources, is_remote

    pipeline = args.pipeline
    if not args.sources:
        raise ConfigError(f"dalistream bench --pipeline {pipeline} needs shard sources (local tar files)")
    if args.repeats < 1 or args.epochs < 1:
        raise ConfigError("--repeats and --epochs must be at least 1")
    urls = expand_sources(args.sources, {})
    if any(is_remote(u) for u in urls):
        raise ConfigError("the media bench reads local shards only (the torch peer opens them with tarfile)")
    infos, _ = count_shards(urls)
    kind, exts = _kind(pipeline)
    systems = SYSTEMS_OF[pipeline]
    spec = {"pipeline": pipeline, "urls": urls, "batch_size": args.batch_size, "workers": args.workers,
            "threads": args.threads, "seed": args.seed, "size": args.size, "epochs": args.epochs}
    with tempfile.TemporaryDirectory(prefix="dalistream-bench-media-") as folder:
        if "dali-files" in systems:
            spec["files"], spec["keys"] = extract(urls, exts, folder)
        log(f"bench: {len(urls)} shards, {sum(i.samples for i in infos)} samples, {pipeline}, batch "
            f"{args.batch_size}, workers {args.workers}, {args.repeats} alternating rounds of {', '.join(systems)}")
        started = time.perf_counter()
        report = compare(spec, systems, args.repeats, args.timeout, log)
    report["config"] = {**{k: v for k, v in spec.items() if k not in ("urls", "files", "keys")}, "shards": len(urls),
                        "frames": FRAMES if kind == "video" else None, "stride": STRIDE if kind == "video" else None,
                        "seconds": SECONDS if kind == "audio" else None, "cpus": os.cpu_count(),
                        "wall_s": round(time.perf_counter() - started, 1)}
    log(format_media(report))
    if args.json:
        print(json.dumps(report), flush=True)
    return 0


def format_media(report: Dict[str, Any]) -> str:
    """The table: per system the median clips/s, CPU per clip (main + workers), first batch, RSS."""
    lines = [f"{'system':16s} {'clips/s':>9s} {'CPU ms/clip':>12s} {'main':>8s} {'workers':>8s} "
             f"{'first s':>8s} {'RSS MB':>8s} {'vs dalistream':>14s}"]
    for name, f in report["systems"].items():
        ratio = f.get("ratio", {}).get("samples_per_s")
        lines.append(f"{name:16s} {fmt(f['samples_per_s'], 9, 1)} {fmt(f['steady_cpu_ms_per_sample'], 12, 1)} "
                     f"{fmt(f['main_cpu_ms_per_sample'], 8, 1)} {fmt(f['workers_cpu_ms_per_sample'], 8, 1)} "
                     f"{fmt(f['first_batch_s'], 8, 2)} {fmt(f['peak_rss_mb'], 8)} "
                     f"{fmt(1 / ratio if ratio else None, 14, 2)}")
    lines.append(f"load average (1 min) before, after: {report['loadavg_1m']}")
    return "\n".join(lines)
