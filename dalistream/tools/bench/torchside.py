"""What the torch ``DataLoader`` peers of ``dalistream bench`` share (webdataset, litdata, MosaicML
streaming), and the fields and rank share every system reads: the per-sample work in the loader's
worker processes (PIL decode and augmentation, or the read-only and feed ends) and the
``DataLoader`` itself. Module-level imports stay light (see :mod:`.peers`)."""

from __future__ import annotations

import io
import math
import random
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ...dali.ops import IMAGENET_MEAN, IMAGENET_STD

IMAGE_EXTS = "jpg;jpeg;png"
LABEL_EXTS = "cls"


def rank_of(spec: Dict[str, Any]) -> Tuple[int, int]:
    """The rank measured and the job's ranks (rank 0 of 1 where the spec names none)."""
    return spec.get("rank", 0), spec.get("world_size", 1)


def rank_share(spec: Dict[str, Any], key: str = "urls") -> list:
    """``spec[key]`` (the shards, or their counts) one rank reads where a system has no rank of its
    own to split by (webdataset, the sequential read): every ``world_size``-th from ``rank``, as
    ``webdataset.split_by_node`` gives them (DALI's reader takes ``shard_id``/``num_shards``)."""
    rank, world = rank_of(spec)
    return list(spec[key])[rank::world]


class Augment:
    """PIL decode, RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) with bilinear
    resampling, horizontal flip with p=0.5, ImageNet normalize, CHW float32 tensor: what
    torchvision's usual training transform does, written out by hand."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.seed = seed
        self.rng: Optional[random.Random] = None
        self.mean = np.array(IMAGENET_MEAN, np.float32)
        self.inv_std = 1.0 / np.array(IMAGENET_STD, np.float32)

    def window(self, width: int, height: int) -> Tuple[int, int, int, int]:
        """A random crop box (left, top, right, bottom) as torchvision's RandomResizedCrop picks it."""
        area = width * height
        log_ratio = (math.log(3 / 4), math.log(4 / 3))
        for _ in range(10):
            target = area * self.rng.uniform(0.08, 1.0)
            aspect = math.exp(self.rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                x, y = self.rng.randint(0, width - w), self.rng.randint(0, height - h)
                return x, y, x + w, y + h
        ratio = width / height  # fallback: central crop
        if ratio < 3 / 4:
            w, h = width, int(round(width / (3 / 4)))
        elif ratio > 4 / 3:
            h, w = height, int(round(height * (4 / 3)))
        else:
            w, h = width, height
        x, y = (width - w) // 2, (height - h) // 2
        return x, y, x + w, y + h

    def __call__(self, sample: Tuple[bytes, bytes]):
        import torch
        from PIL import Image

        if self.rng is None:
            info = torch.utils.data.get_worker_info()
            self.rng = random.Random(self.seed * 1000 + (info.id if info else 0))
        data, label = sample
        image = Image.open(io.BytesIO(data)).convert("RGB")
        image = image.resize((self.size, self.size), Image.BILINEAR, box=self.window(*image.size))
        if self.rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        array = (np.asarray(image, np.float32) - self.mean) * self.inv_std
        return torch.from_numpy(array.transpose(2, 0, 1).copy()), int(label)


def raw_item(sample: Tuple[bytes, bytes]):
    return sample[0], int(sample[1])


def feed_item(sample: Tuple[bytes, bytes]):
    return len(sample[0]), int(sample[1])  # the feed's cheap end, as in the DALI graphs


def raw_collate(batch):
    import torch

    return [x[0] for x in batch], torch.tensor([x[1] for x in batch])


def torch_loader(dataset: Any, spec: Dict[str, Any], read_only: bool, pin_memory: bool) -> Any:
    """The torch ``DataLoader`` of the webdataset and MosaicML peers (litdata's is its own subclass, with the
    same settings): ``workers`` processes (persistent), and
    batches in pinned memory when they go on to a GPU (``pin_memory``), as a GPU user sets it: a
    copy from pageable memory is slower and would flatter dalistream."""
    import torch

    workers = spec["workers"]
    return torch.utils.data.DataLoader(dataset, batch_size=spec["batch_size"], num_workers=workers,
                                       persistent_workers=workers > 0, pin_memory=pin_memory,
                                       collate_fn=raw_collate if read_only else None)
