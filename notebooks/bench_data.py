"""The data sets of the performance report (docs/performance.md) that dalistream's own commands do
not make: ``small`` (8 shards x 1,500 samples of one 32 x 32 JPEG of about 1.46 kB and a label,
written by webdataset's ``TarWriter``) and ``photos`` (4,096 JPEGs of about 418 x 355, random
windows of matplotlib's sample photograph, in 10 class folders, for ``dalistream write``)::

    python notebooks/bench_data.py small DIR     # then: dalistream index DIR (the manifest), or not
    python notebooks/bench_data.py photos DIR    # then: dalistream write DIR DATA --samples-per-shard 512

Both are the same every time (seeded).
"""

from __future__ import annotations

import argparse
import io
import os

import numpy as np
from PIL import Image


def small(folder: str) -> None:
    """8 shards x 1,500 samples of a 32 x 32 JPEG and a ``cls`` label (60 MB)."""
    import webdataset as wds

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(35)
    for s in range(8):
        with wds.TarWriter(os.path.join(folder, f"small-{s:05d}.tar")) as w:
            for i in range(1500):
                base = np.linspace(0, 255, 32)[None, :, None] * rng.random(3)[None, None, :]
                img = np.clip(base + rng.normal(0, 30, (32, 32, 3)), 0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(img).save(buf, format="JPEG", quality=95)
                w.write({"__key__": f"s{s:02d}/{i:06d}", "jpg": buf.getvalue(),
                         "cls": str(int(rng.integers(0, 100))).encode()})


def photos(folder: str) -> None:
    """4,096 JPEGs of about 418 x 355 (164 MB) in class folders ``c0`` .. ``c9``."""
    import matplotlib

    src = Image.open(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")).convert("RGB")
    width, height = src.size
    rng = np.random.default_rng(63)
    for i in range(4096):
        os.makedirs(os.path.join(folder, f"c{i % 10}"), exist_ok=True)
        w, h = int(418 * rng.uniform(0.85, 1.15)), int(355 * rng.uniform(0.85, 1.15))
        cw = int(rng.uniform(0.5, 1.0) * width)
        ch = min(int(cw * h / w), height)
        x, y = int(rng.integers(0, width - cw + 1)), int(rng.integers(0, height - ch + 1))
        image = src.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BICUBIC)
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        image.save(os.path.join(folder, f"c{i % 10}", f"{i:05d}.jpg"), quality=int(rng.integers(80, 96)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("set", choices=["small", "photos"])
    parser.add_argument("folder")
    args = parser.parse_args()
    {"small": small, "photos": photos}[args.set](args.folder)
