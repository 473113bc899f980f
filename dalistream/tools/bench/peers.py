"""The measured side of ``dalistream bench``: one run of one system, in its own process.

:func:`main` (the child process's entry point) runs one measurement and prints one JSON line.
Every system is an *opener* (spec → :class:`~.timing.Opened`) timed by the one function
:func:`~.timing.run_system` (see :mod:`.timing` for the rule). Systems:

- ``dalistream``: :class:`dalistream.Loader` over the sharded parallel sources;
- ``dali-native``: DALI's own ``fn.readers.webdataset`` feeding the *same* graph (the same
  :mod:`dalistream.ops` calls, via :func:`classification_graph`), read through
  ``DALIGenericIterator`` as DALI's users do;
- ``webdataset``: the ``webdataset`` library in a torch ``DataLoader`` with the same number of
  worker processes, PIL decode and the equivalent augmentation by hand (RandomResizedCrop,
  horizontal flip, normalize: no torchvision);
- ``litdata``, ``mosaicml``: the same samples converted to litdata's chunks and MosaicML's MDS
  shards by the bench before the run (timed apart, outside the measured process), then read by their own loaders with the webdataset peer's per-sample work
  (:mod:`.converted`);
- ``sequential-read``: plain sequential reads of the shard files (the I/O limit, read-only);
- ``fake``: batches of a known cost (the rule's own test);
- ``merge``: W parallel sources of tiny payloads merged by :func:`dalistream.dali.graph.merge`
  (:mod:`dalistream.tools.bench.merge`; its own steady-state timing, no first batch).

``pipeline``: ``"classification_train"`` decodes and augments (DALI's decode fused with the random
crop: only the window is decoded); ``"classification_full"`` the same with the whole image decoded
first, as every PIL peer does in both (the graph for comparing with them); ``"feed"`` brings the encoded
bytes into the graph and ends in a cheap op (:func:`feed_graph`: the byte count of each image)
plus the labels, so that only the cost of feeding remains; ``"read-only"`` delivers the encoded
bytes to Python (counted). Every system runs ``epochs`` of its own epochs, of rank ``rank``'s
share of a job of ``world_size`` ranks (measured alone: :func:`rank_share`).
Module-level imports stay light: DALI worker processes (spawned) import this module as their
main module.
"""

from __future__ import annotations

import io
import json
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from ...buckets import parse_buckets
from ...dali import ops
from ...dali.compat import shutdown
from ...dali.device import resolve_device, start_method
from .mds import base as mds_base
from .timing import Opened, open_fake, run_system
from .torchside import IMAGE_EXTS, LABEL_EXTS, Augment, feed_item, raw_item, rank_of, rank_share, torch_loader



# -- the shared DALI graph ---------------------------------------------------------------------

def classification_graph(images, valid, device: str, size: int, padded: bool, fused: bool = True):
    """A random-resized-crop (area 0.08–1, aspect 3/4–4/3) to ``size``², random flip, normalize to
    CHW float. ``fused``: only the crop window is decoded (``classification_train``); otherwise the
    whole image is decoded and then cropped (``classification_full``: the work the PIL peers do).

    Used verbatim by both the dalistream and the DALI-native pipelines.
    """
    if fused:
        images = ops.decode_images(images, valid, device, random_crop=True, padded=padded)
        images = ops.random_resized_crop(images, device, (size, size))
    else:
        from nvidia.dali import fn, types

        images = ops.decode_images(images, valid, device, random_crop=False, padded=padded)
        images = fn.random_resized_crop(images, device=device, size=[size, size], random_area=[0.08, 1.0],
                                        random_aspect_ratio=[3 / 4, 4 / 3], interp_type=types.INTERP_LINEAR,
                                        antialias=False)
    return ops.normalize(images, device, mirror=ops.coin_flip())


def feed_graph(images, device: str):
    """The feed pipeline's cheap end: the byte count of each encoded image (``fn.shapes``), after
    moving the bytes to the GPU on a GPU. Nothing per sample is left for the torch side."""
    from nvidia.dali import fn

    return fn.shapes(images.gpu() if device == "gpu" else images)


def _dalistream_feed(stream):
    import dalistream

    data = dalistream.read(stream)
    return {"shape": feed_graph(data["image"], stream.device), "label": data["label"]}


def _dalistream_train(stream, size: int = 224, fused: bool = True):
    import dalistream

    data = dalistream.read(stream)
    image = classification_graph(data["image"], data["valid"], stream.device, size, stream.may_pad, fused)
    return {"image": image, "label": data["label"]}


# -- dalistream ----------------------------------------------------------------------------------

def _byte_count(values) -> int:
    return sum(len(v) for v in values)


def open_dalistream(spec: Dict[str, Any]) -> Opened:
    """dalistream's Loader; adds ``loader.stats()`` (per-worker counters) to the result."""
    import dalistream

    pipeline = spec["pipeline"]
    mix = spec.get("mix")
    mixed = {"per_batch": spec.get("per_batch", "sample"), "samples_per_epoch": spec.get("samples_per_epoch")} if mix else {}
    rank, world = rank_of(spec)
    buckets = spec.get("buckets") and parse_buckets(spec["buckets"], spec.get("bucket_per", "rank"), spec.get("lookahead"))
    scan_cache = {"cache_dir": spec["cache_dir"]} if "cache_dir" in spec else {}  # (else Stream.open's default)
    stream = dalistream.Stream.open(
        {name: (list(urls), weight) for name, (urls, weight) in mix.items()} if mix else spec["urls"],
        cache=spec.get("cache"), cache_limit=spec.get("cache_limit"), **scan_cache,
        fields={"image": IMAGE_EXTS, "label": LABEL_EXTS}, batch_size=spec["batch_size"],
        workers=spec["workers"], device=spec["device"], seed=spec["seed"], shuffle=spec.get("shuffle"),
        interleave=spec.get("interleave"), policy=spec.get("policy", "even"), batches_per_epoch=spec.get("batches_per_epoch"),
        on_error=spec.get("on_error", "raise"), storage_options=spec.get("storage_options") or {},
        manifest=spec.get("manifest"), start_method=spec.get("start_method", "auto"), affinity=spec.get("affinity"),
        ranks_per_node=spec.get("ranks_per_node"), buckets=buckets, rank=rank, world_size=world, **mixed,
    )
    kwargs: Dict[str, Any] = {"num_threads": spec["threads"]}
    if pipeline == "read-only":
        graph, count = dalistream.raw_pipeline, (lambda b: (len(b["label"]), _byte_count(b["image"])))
    elif pipeline == "feed":
        graph, count = dalistream.pipeline_def(_dalistream_feed), (lambda b: (len(b["label"]), 0))
    else:
        graph, count = dalistream.pipeline_def(_dalistream_train), (lambda b: (len(b["label"]), 0))
        kwargs.update(size=spec["size"], fused=pipeline == "classification_train")
    loader = dalistream.Loader(stream, graph, **kwargs)
    loader.set_epoch(spec.get("epoch", 0))

    marks: List[Tuple[int, float]] = []  # (samples, time) at the first batch and at each epoch's end

    def batches():
        samples = 0
        for _ in range(spec["epochs"]):
            for batch in loader:
                samples += len(batch["label"])
                if not marks:
                    marks.append((samples, time.perf_counter()))
                yield batch
            marks.append((samples, time.perf_counter()))

    def extra() -> Dict[str, Any]:
        # each epoch's rate: the first from its first batch on (as samples_per_s), the others whole
        rates = [(b[0] - a[0]) / (b[1] - a[1]) if b[1] > a[1] else None for a, b in zip(marks, marks[1:])]
        return {"stats": loader.stats(wait_s=5), "device": stream.device, "epoch_samples_per_s": rates,
                "counts_from": (stream.data.count_source or "").split(", cached in ")[0],
                "start_method": start_method(stream.start_method, stream.device)}

    return Opened(batches(), count, loader.close, extra)


# -- DALI's own webdataset reader ----------------------------------------------------------------

def ascii_labels(labels):
    """``cls`` members (ASCII digits, zero-padded at the end by ``fn.pad``) as an int64 tensor,
    in a few tensor operations per batch (one per digit), nothing per sample."""
    import torch

    labels = labels.to(torch.int64)
    value = torch.zeros(labels.shape[0], dtype=torch.int64, device=labels.device)
    for j in range(labels.shape[1] if labels.ndim > 1 else 0):
        digit = labels[:, j]
        value = torch.where(digit != 0, value * 10 + digit - 48, value)
    return value


def open_dali_native(spec: Dict[str, Any]) -> Opened:
    """``fn.readers.webdataset`` over the same shards, then the same graph, as DALI's users write
    it: ``pipeline_def`` with DALI's defaults (batch size, threads, device and seed apart) and
    ``DALIGenericIterator`` (dropping the last partial batch, as dalistream's ``even`` policy
    does). Labels: ``fn.pad`` makes the ASCII ``cls`` bytes dense, :func:`ascii_labels` reads them."""
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    device, device_id = resolve_device(spec["device"])
    pipeline = spec["pipeline"]
    rank, world = rank_of(spec)

    @pipeline_def(batch_size=spec["batch_size"], num_threads=spec["threads"], device_id=device_id,
                  seed=spec["seed"] & 0x7FFFFFFF)
    def native():
        image, label = fn.readers.webdataset(paths=list(spec["urls"]), ext=[IMAGE_EXTS, LABEL_EXTS], name="reader",
                                             missing_component_behavior="error", shard_id=rank, num_shards=world)
        if pipeline == "read-only":
            return image, label
        if pipeline == "feed":
            return feed_graph(image, device), fn.pad(label)
        return (classification_graph(image, None, device, spec["size"], padded=False,
                                     fused=pipeline == "classification_train"), fn.pad(label))

    pipe = native()
    if pipeline == "read-only":  # bytes of different lengths: no dense tensor, so per sample, as before
        pipe.build()
        total = pipe.epoch_size("reader")
        per_epoch = (total * (rank + 1) // world - total * rank // world) // spec["batch_size"]  # (its shard's share)

        def raw():
            for _ in range(spec["epochs"] * per_epoch):
                images, labels = pipe.run()
                yield ([np.array(images.at(i)).tobytes() for i in range(len(images))],
                       [np.array(labels.at(i)).tobytes() for i in range(len(labels))])

        return Opened(raw(), lambda b: (len(b[1]), _byte_count(b[0])), lambda: shutdown(pipe),
                      lambda: {"device": device})
    loader = DALIGenericIterator(pipe, ["image", "label"], reader_name="reader",
                                 last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def batches():
        for _ in range(spec["epochs"]):
            for out in loader:
                batch = out[0]
                yield batch["image"], ascii_labels(batch["label"])

    return Opened(batches(), lambda b: (len(b[1]), 0), lambda: shutdown(pipe), lambda: {"device": device})


# -- webdataset + torch DataLoader ---------------------------------------------------------------

def _register_s3_gopen(options: Dict[str, Any]) -> None:
    """Let webdataset open ``s3://`` URLs with one streaming boto3 GET per shard (its ``gopen``
    has no S3 handler; users add one, or write ``pipe:aws s3 cp URL -``). The client is built
    from the same storage options (endpoint, profile) as dalistream's; no read-ahead, no retries:
    the plain thing a webdataset user writes."""
    import webdataset.gopen  # noqa: F401  (the module; the package's ``gopen`` attribute is the function)

    from ...io.stores import store_for
    from ...io.stores.s3 import split_s3
    from ...io.options import remote_options

    opts = remote_options(options)

    def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any):
        bucket, key = split_s3(url)
        return store_for(url, opts).client.get_object(Bucket=bucket, Key=key)["Body"]  # a client per (forked) worker

    sys.modules["webdataset.gopen"].gopen_schemes["s3"] = gopen_s3


def open_webdataset(spec: Dict[str, Any]) -> Opened:
    """``webdataset.WebDataset`` in a ``DataLoader`` with ``workers`` processes (fork, persistent)."""
    import torch
    import webdataset as wds

    pipeline = spec["pipeline"]
    read_only = pipeline == "read-only"
    _register_s3_gopen(spec.get("storage_options") or {})
    dataset = wds.WebDataset(rank_share(spec), shardshuffle=False, empty_check=False).to_tuple(IMAGE_EXTS, LABEL_EXTS)
    dataset = dataset.map(raw_item if read_only else feed_item if pipeline == "feed" else Augment(spec["size"], spec["seed"]))
    device, device_id = resolve_device(spec["device"])  # decoding stays on the CPU, as usual with PIL
    use_gpu = device == "gpu"
    to_gpu = use_gpu and pipeline.startswith("classification")
    loader = torch_loader(dataset, spec, read_only, pin_memory=to_gpu)

    def batches():
        target = torch.device("cuda", device_id) if to_gpu else None
        for _ in range(spec["epochs"]):
            for images, labels in loader:
                if target is not None:  # from pinned memory: a copy the GPU runs while the host goes on
                    images, labels = images.to(target, non_blocking=True), labels.to(target, non_blocking=True)
                yield images, labels

    count = (lambda b: (len(b[1]), _byte_count(b[0]))) if read_only else (lambda b: (len(b[1]), 0))
    return Opened(batches(), count, extra=lambda: {"device": "gpu" if use_gpu else "cpu", "pin_memory": loader.pin_memory})


# -- plain sequential read (the I/O limit) ------------------------------------------------------

def open_sequential_read(spec: Dict[str, Any]) -> Opened:
    """Read every shard front to back in 1 MiB chunks, in one thread; one "batch" per shard,
    its samples from the counts."""
    from ...io.streams import open_raw

    def shards():
        for _ in range(spec["epochs"]):
            for url, n in zip(rank_share(spec), rank_share(spec, "counts")):
                nbytes = 0
                with open_raw(url, 0, spec.get("storage_options") or {}) as f:
                    while True:
                        chunk = f.read(1 << 20)
                        if not chunk:
                            break
                        nbytes += len(chunk)
                yield n, nbytes

    return Opened(shards(), lambda b: b, extra=lambda: {"device": "cpu"})


def _open_converted(spec: Dict[str, Any]) -> Opened:
    from .converted import open_converted

    return open_converted(spec)


# name -> (libraries imported before the clock: module names or functions that import, opener); every system
# runs through run_system
SYSTEMS: Dict[str, Tuple[Tuple[Union[str, Callable[[], Any]], ...], Callable[[Dict[str, Any]], Opened]]] = {
    "dalistream": (("torch", "nvidia.dali.fn", "nvidia.dali.plugin.pytorch", "dalistream"), open_dalistream),
    # (the bench's --cache, --local-copy and --buckets: dalistream without the cache, on the local copy, without
    # the buckets)
    **{name: (("torch", "nvidia.dali.fn", "nvidia.dali.plugin.pytorch", "dalistream"), open_dalistream)
       for name in ("dalistream-nocache", "dalistream-local", "dalistream-nobuckets")},
    "dali-native": (("torch", "nvidia.dali.fn", "nvidia.dali.plugin.pytorch"), open_dali_native),
    "webdataset": (("torch", "webdataset"), open_webdataset),
    # litdata and MosaicML streaming: the same samples converted to their formats first (.converted)
    "litdata": (("torch", "litdata"), _open_converted),
    "mosaicml": (("torch", mds_base), _open_converted),  # streaming.base, its package's __init__ unrun (.mds)
    "sequential-read": ((), open_sequential_read),
    "fake": ((), open_fake),
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
    if spec["system"] == "merge":
        from .merge import run_merge

        result = dict(run_merge(spec), system="merge")
    else:
        result = run_system(spec, SYSTEMS)
    print(json.dumps(result), flush=True)
    return 0
