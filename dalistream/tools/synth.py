"""A small synthetic WebDataset of varied images, so everything can be tried without data.

Each sample has an image (JPEG mostly; also PNG, grayscale and CMYK JPEG), a ``cls`` label and
a ``txt`` caption. The image's colour and pattern depend on the label, so a small model can
learn from it (the demo does). Deterministic for a given seed.
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

COLOURS = ["red", "green", "blue", "yellow", "magenta", "cyan", "orange", "purple", "white", "grey"]
_RGB = [(220, 30, 30), (30, 200, 40), (40, 60, 230), (230, 220, 40), (220, 40, 200), (40, 210, 220),
        (240, 140, 20), (120, 40, 160), (235, 235, 235), (128, 128, 128)]


@dataclass(frozen=True)
class SynthSpec:
    """What :func:`write_dataset` writes."""

    shards: int = 8
    samples_per_shard: int = 64
    classes: int = 10
    uneven: bool = False
    min_size: int = 48
    max_size: int = 160
    seed: int = 0
    prefix: str = "synth"


def make_image(label: int, rng: np.random.Generator, size: tuple) -> np.ndarray:
    """An ``HxWx3`` uint8 image: a label-coloured disc or bar on a noisy gradient."""
    h, w = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x / w * 90, y / h * 90, (x + y) / (w + h) * 90], -1)
    base += rng.normal(0, 12, (h, w, 3))
    colour = np.array(_RGB[label % len(_RGB)], np.float32)
    cy, cx = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w
    radius = rng.uniform(0.2, 0.4) * min(h, w)
    if (label // len(_RGB)) % 2 == 0:
        mask = (y - cy) ** 2 + (x - cx) ** 2 < radius ** 2
    else:
        mask = np.abs(y - cy) < radius / 2
    base[mask] = colour + rng.normal(0, 8, (int(mask.sum()), 3))
    return np.clip(base, 0, 255).astype(np.uint8)


def encode(image: np.ndarray, kind: str) -> bytes:
    """Encode as ``jpg`` (RGB), ``gray`` (1-channel JPEG), ``cmyk`` (CMYK JPEG) or ``png``."""
    from PIL import Image

    out = io.BytesIO()
    pil = Image.fromarray(image)
    if kind == "png":
        pil.save(out, format="PNG")
    elif kind == "gray":
        pil.convert("L").save(out, format="JPEG", quality=90)
    elif kind == "cmyk":
        pil.convert("CMYK").save(out, format="JPEG", quality=90)
    else:
        pil.save(out, format="JPEG", quality=90)
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_dataset(out_dir: str, spec: SynthSpec = SynthSpec()) -> List[str]:
    """Write ``spec.shards`` tar shards to ``out_dir``; return their paths."""
    return [path for path, _ in write_shards(out_dir, spec)]


def write_shards(out_dir: str, spec: SynthSpec = SynthSpec()) -> List[Tuple[str, int]]:
    """Write ``spec.shards`` tar shards to ``out_dir``; return ``(path, samples)`` per shard."""
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    paths = []
    index = 0
    for s in range(spec.shards):
        n = spec.samples_per_shard
        if spec.uneven:
            n = int(rng.integers(max(1, n // 3), n * 2))
        path = os.path.join(out_dir, f"{spec.prefix}-{s:05d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(n):
                label = int(rng.integers(spec.classes))
                size = tuple(int(v) for v in rng.integers(spec.min_size, spec.max_size + 1, 2))
                image = make_image(label, rng, size)
                kind = ["jpg"] * 7 + ["png", "gray", "cmyk"]
                k = kind[index % len(kind)]
                key = f"{spec.prefix}{s:05d}/{index:08d}"
                ext = "png" if k == "png" else "jpg"
                _add(tar, f"{key}.{ext}", encode(image, k))
                _add(tar, f"{key}.cls", str(label).encode())
                _add(tar, f"{key}.txt", f"a {COLOURS[label % len(COLOURS)]} {'disc' if (label // 10) % 2 == 0 else 'bar'}".encode())
                index += 1
        paths.append((path, n))
    return paths
