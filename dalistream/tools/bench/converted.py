"""The peers that read a format of their own: litdata and MosaicML streaming in ``dalistream bench``.

Each converts the same samples (the rank's shards, read with :func:`~dalistream.tar.samples.iter_samples`:
the encoded image bytes and the integer label) into its own format in a temporary folder,
with the writer its documentation names, timed (``convert_s``, before the loader's clock and
outside it), then reads them back with its own loader and the same per-sample work as the
webdataset peer (:class:`~.peers.Augment`: PIL decode of the whole image, random-resized-crop,
flip, normalize), the same number of worker processes (persistent), the same batch size, no
shuffle (as the webdataset peer), every sample of the rank's share once per epoch:

- ``litdata``: ``litdata.optimize`` (``num_workers`` = the bench's workers, its parallel writer),
  then ``litdata.StreamingDataset`` over the local folder in a ``litdata.StreamingDataLoader``;
- ``mosaicml``: ``streaming.MDSWriter`` (one process: MDS has no parallel writer of its own), then
  ``streaming.StreamingDataset`` (``local=`` the folder, no remote) in a torch ``DataLoader``.

The libraries are optional (``pip install 'dalistream[peers]'``); :func:`missing` names what is
absent so that the bench refuses the peer before any run.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import time
from typing import Any, Dict, Iterator, Optional, Tuple

from ...device import resolve_device
from .peers import IMAGE_EXTS, LABEL_EXTS, Augment, _feed, _raw, _raw_collate, rank_share, webdataset_loader
from .timing import Opened

MODULES = {"litdata": ("litdata", "litdata"), "mosaicml": ("streaming", "mosaicml-streaming")}


def missing(system: str) -> Optional[str]:
    """Why ``system``'s library cannot be imported here (None: it can)."""
    module, package = MODULES[system]
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001  (an installed library may fail with any error on import)
        return f"{system} needs {package} (pip install 'dalistream[peers]'): import {module} failed: {type(e).__name__}: {e}"
    return None


def shard_samples(url: str, options: Dict[str, Any]) -> Iterator[Tuple[bytes, int]]:
    """``(encoded image, label)`` of every sample of one shard, in order."""
    from ...io.streams import open_raw
    from ...tar.samples import iter_samples

    images, labels = IMAGE_EXTS.split(";"), LABEL_EXTS.split(";")
    wanted = set(images + labels)
    with open_raw(url, 0, options) as f:
        for sample in iter_samples(f, url, want_ext=wanted.__contains__):
            image = next(sample[e] for e in images if e in sample)
            label = next(sample[e] for e in labels if e in sample)
            yield image, int(label)


class _LitdataShard:
    """``litdata.optimize``'s ``fn``: a shard's URL to its samples (a generator: one chunk entry each)."""

    def __init__(self, options: Dict[str, Any]) -> None:
        self.options = options

    def __call__(self, url: str):
        for image, label in shard_samples(url, self.options):
            yield {"image": image, "label": label}


def _pair(item: Dict[str, Any]) -> Tuple[bytes, int]:
    return bytes(item["image"]), int(item["label"])


class _Transformed:
    """``Augment`` (or the read-only / feed ends) of a peer's ``{"image", "label"}`` item."""

    def __init__(self, then) -> None:
        self.then = then

    def __call__(self, item: Dict[str, Any]):
        return self.then(_pair(item))


def _convert_litdata(urls, options: Dict[str, Any], folder: str, workers: int) -> None:
    from litdata import optimize

    optimize(fn=_LitdataShard(options), inputs=list(urls), output_dir=folder, chunk_bytes="64MB",
             num_workers=max(1, workers), mode="overwrite")


def _convert_mosaicml(urls, options: Dict[str, Any], folder: str, workers: int) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=folder, columns={"image": "bytes", "label": "int"}, size_limit="64mb") as writer:
        for url in urls:
            for image, label in shard_samples(url, options):
                writer.write({"image": image, "label": label})


def _litdata_loader(folder: str, transform, spec: Dict[str, Any], read_only: bool, pin_memory: bool):
    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(input_dir=f"local:{folder}", shuffle=False, drop_last=False, transform=transform)
    workers = spec["workers"]
    return StreamingDataLoader(dataset, batch_size=spec["batch_size"], num_workers=workers,
                               persistent_workers=workers > 0, pin_memory=pin_memory,
                               collate_fn=_raw_collate if read_only else None)


def _mds_dataset_class():
    from streaming import StreamingDataset

    class MDSDataset(StreamingDataset):
        """MosaicML's StreamingDataset with a per-sample transform (its documented way: a subclass)."""

        def __init__(self, transform, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.transform = transform

        def __getitem__(self, index: int):
            return self.transform(super().__getitem__(index))

    return MDSDataset


def _mosaicml_loader(folder: str, transform, spec: Dict[str, Any], read_only: bool, pin_memory: bool):
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    dataset = _mds_dataset_class()(transform, local=folder, remote=None, shuffle=False, batch_size=spec["batch_size"])
    return webdataset_loader(dataset, spec, read_only, pin_memory)


CONVERTERS = {"litdata": (_convert_litdata, _litdata_loader), "mosaicml": (_convert_mosaicml, _mosaicml_loader)}


def open_converted(spec: Dict[str, Any]) -> Opened:
    """Convert the rank's shards into ``spec["system"]``'s format (timed: ``convert_s``), then
    read them with its loader; the folder is removed on close."""
    import torch

    system, pipeline = spec["system"], spec["pipeline"]
    convert, make_loader = CONVERTERS[system]
    folder = tempfile.mkdtemp(prefix=f"dalistream-bench-{system}-", dir=spec.get("convert_dir"))
    options = spec.get("storage_options") or {}
    started = time.perf_counter()
    convert(rank_share(spec), options, os.path.join(folder, "data"), spec["workers"])
    convert_s = time.perf_counter() - started
    read_only = pipeline == "read-only"
    then = _raw if read_only else _feed if pipeline == "feed" else Augment(spec["size"], spec["seed"])
    device, device_id = resolve_device(spec["device"])
    to_gpu = device == "gpu" and pipeline.startswith("classification")
    loader = make_loader(os.path.join(folder, "data"), _Transformed(then), spec, read_only, to_gpu)

    def batches():
        target = torch.device("cuda", device_id) if to_gpu else None
        for _ in range(spec["epochs"]):
            for images, labels in loader:
                if target is not None:
                    images, labels = images.to(target, non_blocking=True), labels.to(target, non_blocking=True)
                yield images, labels

    def close() -> None:
        shutil.rmtree(folder, ignore_errors=True)

    count = (lambda b: (len(b[1]), sum(len(x) for x in b[0]))) if read_only else (lambda b: (len(b[1]), 0))
    return Opened(batches(), count, close, lambda: {"device": "gpu" if to_gpu else "cpu", "convert_s": convert_s})
