"""The measured side of ``dalistream bench``: one run of one system, in its own process.

:func:`main` (the child process's entry point) runs one measurement and prints one JSON line.
Systems:

- ``dalistream``: :class:`dalistream.Loader` over the sharded parallel sources;
- ``dali-native``: DALI's own ``fn.readers.webdataset`` feeding the *same* graph (the same
  :mod:`dalistream.ops` calls, via :func:`classification_graph`);
- ``webdataset``: the ``webdataset`` library in a torch ``DataLoader`` with the same number of
  worker processes, PIL decode and the equivalent augmentation by hand (RandomResizedCrop,
  horizontal flip, normalize: no torchvision);
- ``sequential-read``: plain sequential reads of the shard files (the I/O limit, read-only);
- ``merge``: W parallel sources of tiny payloads merged by :func:`dalistream.dali.graph.merge`
  (:mod:`dalistream.tools.bench.merge`).

``pipeline`` ``"classification_train"`` decodes and augments; ``"read-only"`` delivers the
encoded bytes (counted) without decoding. Every system runs ``epochs`` of its own epochs.
Module-level imports stay light: DALI worker processes (spawned) import this module as their
main module.
"""

from __future__ import annotations

import io
import json
import math
import random
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ...dali import ops
from ...dali.compat import torch_utils
from ...dali.ops import IMAGENET_MEAN, IMAGENET_STD
from ...device import resolve_device, start_method
from .monitor import tree_cpu_s

IMAGE_EXTS = "jpg;jpeg;png"
LABEL_EXTS = "cls"


# -- the shared DALI graph ---------------------------------------------------------------------

def classification_graph(images, valid, device: str, size: int, padded: bool):
    """Decode with a fused random crop, resize to ``size``², random flip, normalize to CHW float.

    Used verbatim by both the dalistream and the DALI-native pipelines.
    """
    images = ops.decode_images(images, valid, device, random_crop=True, padded=padded)
    images = ops.random_resized_crop(images, device, (size, size))
    return ops.normalize(images, device, mirror=ops.coin_flip())


def _dalistream_train(stream, size: int = 224):
    import dalistream

    data = dalistream.read(stream)
    image = classification_graph(data["image"], data["valid"], stream.device, size, stream.may_pad)
    return {"image": image, "label": data["label"]}


# -- measuring -----------------------------------------------------------------------------------

def measure(batches: Iterator[Any], count: Callable[[Any], Tuple[int, int]], t0: float) -> Dict[str, Any]:
    """Drain ``batches``; ``count(batch) -> (samples, payload bytes)``. Times are from ``t0``.

    Besides wall-clock rates, the CPU time of the whole process tree between the first batch and
    the end (``steady_cpu_ms_per_sample``) is taken: a figure that other load on the machine
    disturbs far less than wall-clock throughput.
    """
    import os

    samples = payload = n_batches = 0
    cpu_first = 0.0
    first_payload = 0
    first = None
    first_samples = 0
    for batch in batches:
        n, b = count(batch)
        samples += n
        payload += b
        n_batches += 1
        if first is None:
            first = time.perf_counter()
            first_samples, first_payload = n, payload
            cpu_first = tree_cpu_s(os.getpid())
    end = time.perf_counter()
    cpu_steady = tree_cpu_s(os.getpid()) - cpu_first
    if first is None:
        return {"samples": 0, "batches": 0, "first_batch_s": None, "samples_per_s": None}
    steady = end - first
    return {
        "samples": samples, "batches": n_batches, "payload_bytes": payload,
        "first_batch_s": first - t0, "total_s": end - t0,
        "samples_per_s": (samples - first_samples) / steady if steady > 0 else None,
        "overall_samples_per_s": samples / (end - t0),
        "payload_mb_per_s": (payload - first_payload) / steady / 1e6 if steady > 0 else None,
        "steady_cpu_ms_per_sample": cpu_steady / (samples - first_samples) * 1000 if samples > first_samples else None,
    }


def _byte_count(values) -> int:
    return sum(len(v) for v in values)


# -- dalistream ----------------------------------------------------------------------------------

def run_dalistream(spec: Dict[str, Any]) -> Dict[str, Any]:
    """dalistream's Loader; adds ``loader.stats()`` (per-worker counters) to the result."""
    t0 = time.perf_counter()
    import dalistream

    read_only = spec["pipeline"] == "read-only"
    stream = dalistream.Stream.open(
        spec["urls"], fields={"image": IMAGE_EXTS, "label": LABEL_EXTS}, batch_size=spec["batch_size"],
        workers=spec["workers"], device=spec["device"], seed=spec["seed"], shuffle=spec.get("shuffle", 0),
        policy=spec.get("policy", "even"), batches_per_epoch=spec.get("batches_per_epoch"),
        on_error=spec.get("on_error", "raise"), storage_options=spec.get("storage_options") or {},
        manifest=spec.get("manifest"), start_method=spec.get("start_method", "auto"),
    )
    dali_kwargs = {"num_threads": spec["threads"]}
    if read_only:
        pipeline, kwargs = dalistream.raw_pipeline, dali_kwargs
        count = lambda b: (len(b["label"]), _byte_count(b["image"]))  # noqa: E731
    else:
        pipeline = dalistream.pipeline_def(_dalistream_train)
        kwargs = dict(dali_kwargs, size=spec["size"])
        count = lambda b: (len(b["label"]), 0)  # noqa: E731
    with dalistream.Loader(stream, pipeline, **kwargs) as loader:
        loader.set_epoch(spec.get("epoch", 0))
        def batches():
            for _ in range(spec["epochs"]):
                yield from loader
        result = measure(batches(), count, t0)
        result["stats"] = loader.stats()
    result["device"] = stream.device
    result["start_method"] = start_method(stream.start_method, stream.device)
    return result


# -- DALI's own webdataset reader ----------------------------------------------------------------

def run_dali_native(spec: Dict[str, Any]) -> Dict[str, Any]:
    """``fn.readers.webdataset`` over the same shards, then the same graph (or nothing)."""
    t0 = time.perf_counter()
    import torch
    from nvidia.dali import fn, pipeline_def

    to_torch_tensor = torch_utils().to_torch_tensor
    device, device_id = resolve_device(spec["device"])
    read_only = spec["pipeline"] == "read-only"

    @pipeline_def(batch_size=spec["batch_size"], num_threads=spec["threads"], device_id=device_id,
                  prefetch_queue_depth=2, exec_dynamic=True, seed=spec["seed"] & 0x7FFFFFFF)
    def native():
        image, label = fn.readers.webdataset(paths=list(spec["urls"]), ext=[IMAGE_EXTS, LABEL_EXTS], name="reader",
                                             missing_component_behavior="error")
        if read_only:
            return image, label
        return classification_graph(image, None, device, spec["size"], padded=False), label

    pipe = native()
    pipe.build()
    per_epoch = pipe.epoch_size("reader") // spec["batch_size"]

    def batches():
        for _ in range(spec["epochs"] * per_epoch):
            images, labels = pipe.run()
            labels = labels.as_cpu() if hasattr(labels, "as_cpu") else labels
            label = torch.tensor([int(np.array(labels.at(i)).tobytes()) for i in range(len(labels))])
            if read_only:
                yield [np.array(images.at(i)).tobytes() for i in range(len(images))], label
            else:
                yield to_torch_tensor(images.as_tensor(), copy=True), label

    count = (lambda b: (len(b[1]), _byte_count(b[0]))) if read_only else (lambda b: (len(b[1]), 0))
    try:
        result = measure(batches(), count, t0)
    finally:
        pipe._shutdown()
    result["device"] = device
    return result


# -- webdataset + torch DataLoader ---------------------------------------------------------------

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


def _raw(sample: Tuple[bytes, bytes]):
    return sample[0], int(sample[1])


def _register_s3_gopen(options: Dict[str, Any]) -> None:
    """Let webdataset open ``s3://`` URLs with one streaming boto3 GET per shard (its ``gopen``
    has no S3 handler; users add one, or write ``pipe:aws s3 cp URL -``). The client is built
    from the same storage options (endpoint, profile) as dalistream's; no read-ahead, no retries:
    the plain thing a webdataset user writes."""
    import webdataset.gopen  # noqa: F401  (the module; the package's ``gopen`` attribute is the function)

    from ...io.clients import s3_client, split_s3
    from ...io.options import remote_options

    opts = remote_options(options)

    def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any):
        bucket, key = split_s3(url)
        return s3_client(opts).get_object(Bucket=bucket, Key=key)["Body"]  # a client per (forked) worker

    sys.modules["webdataset.gopen"].gopen_schemes["s3"] = gopen_s3


def run_webdataset(spec: Dict[str, Any]) -> Dict[str, Any]:
    """``webdataset.WebDataset`` in a ``DataLoader`` with ``workers`` processes (fork, persistent)."""
    t0 = time.perf_counter()
    import torch
    import webdataset as wds

    read_only = spec["pipeline"] == "read-only"
    _register_s3_gopen(spec.get("storage_options") or {})
    dataset = wds.WebDataset(list(spec["urls"]), shardshuffle=False, empty_check=False).to_tuple(IMAGE_EXTS, LABEL_EXTS)
    dataset = dataset.map(_raw if read_only else Augment(spec["size"], spec["seed"]))
    workers = spec["workers"]
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=spec["batch_size"], num_workers=workers, persistent_workers=workers > 0,
        collate_fn=(lambda b: ([x[0] for x in b], torch.tensor([x[1] for x in b]))) if read_only else None,
    )
    use_gpu = resolve_device(spec["device"])[0] == "gpu"  # decoding stays on the CPU, as usual with PIL

    def batches():
        for _ in range(spec["epochs"]):
            for images, labels in loader:
                if use_gpu and not read_only:
                    images = images.cuda(non_blocking=True)
                yield images, labels

    count = (lambda b: (len(b[1]), _byte_count(b[0]))) if read_only else (lambda b: (len(b[1]), 0))
    result = measure(batches(), count, t0)
    result["device"] = "gpu" if use_gpu else "cpu"
    return result


# -- plain sequential read (the I/O limit) ------------------------------------------------------

def run_sequential_read(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Read every shard front to back in 1 MiB chunks, in one thread; samples from the counts."""
    from ...io.streams import open_raw

    t0 = time.perf_counter()
    counts = spec["counts"]
    total_samples = 0
    nbytes = 0
    first = None
    for _ in range(spec["epochs"]):
        for url, n in zip(spec["urls"], counts):
            with open_raw(url, 0, spec.get("storage_options") or {}) as f:
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    nbytes += len(chunk)
            total_samples += n
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return {"samples": total_samples, "batches": total_samples // spec["batch_size"], "payload_bytes": nbytes,
            "first_batch_s": (first or end) - t0, "total_s": end - t0,
            "samples_per_s": total_samples / (end - t0), "overall_samples_per_s": total_samples / (end - t0),
            "payload_mb_per_s": nbytes / (end - t0) / 1e6, "device": "cpu"}


def run_merge(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Merge-only (see :func:`dalistream.tools.bench.merge.run_merge`)."""
    from .merge import run_merge as merge_only

    return merge_only(spec)


RUNNERS: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "dalistream": run_dalistream,
    "dali-native": run_dali_native,
    "webdataset": run_webdataset,
    "sequential-read": run_sequential_read,
    "merge": run_merge,
}


def main(argv: Optional[List[str]] = None) -> int:
    """Child entry point: run the spec (a JSON file named by ``argv[0]``); print the result as one JSON line.

    Started as ``python -c "from dalistream.tools.bench.peers import main; main()" SPEC`` (not ``-m``: the
    classes here must pickle by reference into DALI's spawned workers).
    """
    import warnings

    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    warnings.filterwarnings("ignore", message=".*produces .* outputs, but the output at the index .* is not used.*")
    if spec["system"] in ("dalistream", "dali-native", "webdataset"):
        import torch  # noqa: F401  (a training loop has imported torch before it builds its loader)
    result = RUNNERS[spec["system"]](spec)
    result["system"] = spec["system"]
    print(json.dumps(result), flush=True)
    return 0
