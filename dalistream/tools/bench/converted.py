"""The peers that read a format of their own: litdata and MosaicML streaming in ``dalistream bench``.

Each converts the same samples (the rank's shards, read with :func:`~dalistream.tar.samples.iter_samples`:
the encoded image bytes and the integer label) into its own format in a temporary folder,
with the writer its documentation names, in a process of its own (:func:`convert_apart`), timed
(``convert_s``, before the loader's clock and outside it), then reads them back with its own loader and the same per-sample work as the
webdataset peer (:class:`~.torchside.Augment`: PIL decode of the whole image, random-resized-crop,
flip, normalize), the same number of worker processes (persistent), the same batch size, no
shuffle (as the webdataset peer), every sample of the rank's share once per epoch:

- ``litdata``: ``litdata.optimize`` (``num_workers`` = the bench's workers, its parallel writer),
  then ``litdata.StreamingDataset`` over the local folder in a ``litdata.StreamingDataLoader``;
- ``mosaicml``: ``streaming.MDSWriter`` (one process: MDS has no parallel writer of its own), then
  ``streaming.StreamingDataset`` (``local=`` the folder, no remote) in a torch ``DataLoader``.

The libraries are optional (the ``peers`` extra: :func:`install_command`); :func:`missing` names what is
absent so that the bench refuses the peer before any run. MosaicML's comes through :mod:`.mds`
(``streaming.base`` without the ``streaming`` package's ``__init__``, which imports torchvision).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Any, Dict, Iterator, Optional, Tuple

from ...dali.device import resolve_device
from ...errors import SampleError
from . import mds
from .torchside import IMAGE_EXTS, LABEL_EXTS, Augment, feed_item, raw_collate, raw_item, rank_share, torch_loader
from .timing import Opened

# system -> (the module its opener uses, the distribution in the `peers` extra that provides it)
MODULES = {"litdata": ("litdata", "litdata"), "mosaicml": ("streaming.base", "mosaicml-streaming")}


def import_library(system: str) -> ModuleType:
    """The module ``system``'s opener uses: litdata, or MosaicML's ``streaming.base`` imported
    without the ``streaming`` package's ``__init__`` (:func:`.mds.base`: that one imports torchvision)."""
    return mds.base() if system == "mosaicml" else importlib.import_module(MODULES[system][0])


def install_command() -> str:
    """The command, run in dalistream's clone, that adds the ``peers`` extra beside this environment's
    torch. torch is pinned on the same line: otherwise pip takes the newest torchvision (which
    mosaicml-streaming requires) and the torch that one requires, replacing the installed torch."""
    from importlib import metadata

    try:
        torch = f'"torch=={metadata.version("torch").split("+")[0]}" '
    except metadata.PackageNotFoundError:
        torch = ""
    return f'pip install {torch}-e ".[peers]"'


def missing(system: str) -> Optional[str]:
    """Why ``system``'s library cannot be imported here (None: it can)."""
    package = MODULES[system][1]
    try:
        import_library(system)
    except Exception as e:  # noqa: BLE001  (an installed library may fail with any error on import)
        return f"{system} needs {package} ({install_command()}): importing it failed: {type(e).__name__}: {e}"
    return None


def shard_samples(url: str, options: Dict[str, Any]) -> Iterator[Tuple[bytes, int]]:
    """``(encoded image, label)`` of every sample of one shard, in order."""
    from ...io.streams import open_raw
    from ...tar.samples import iter_samples

    images, labels = IMAGE_EXTS.split(";"), LABEL_EXTS.split(";")
    wanted = set(images + labels)
    with open_raw(url, 0, options) as f:
        for sample in iter_samples(f, url, want_ext=wanted.__contains__):
            image = next((sample[e] for e in images if e in sample), None)
            label = next((sample[e] for e in labels if e in sample), None)
            if image is None or label is None:
                raise SampleError(f"sample {sample['__key__']!r} has no {'image' if image is None else 'label'} "
                                  f"({IMAGE_EXTS if image is None else LABEL_EXTS}): the bench's peers read both",
                                  url=url, member=sample["__key__"])
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
    with mds.base().MDSWriter(out=folder, columns={"image": "bytes", "label": "int"}, size_limit="64mb") as writer:
        for url in urls:
            for image, label in shard_samples(url, options):
                writer.write({"image": image, "label": label})


def _litdata_loader(folder: str, transform, spec: Dict[str, Any], read_only: bool, pin_memory: bool):
    from litdata import StreamingDataLoader, StreamingDataset

    # a plain path: litdata reads the chunks where they lie ("local:" would copy them to its cache first)
    dataset = StreamingDataset(input_dir=folder, shuffle=False, drop_last=False, transform=transform)
    workers = spec["workers"]
    return StreamingDataLoader(dataset, batch_size=spec["batch_size"], num_workers=workers,
                               persistent_workers=workers > 0, pin_memory=pin_memory,
                               collate_fn=raw_collate if read_only else None)


def _mds_dataset_class():
    class MDSDataset(mds.base().StreamingDataset):
        """MosaicML's StreamingDataset with a per-sample transform (its documented way: a subclass)."""

        def __init__(self, transform, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.transform = transform

        def __getitem__(self, index: int):
            return self.transform(super().__getitem__(index))

    return MDSDataset


def _mosaicml_loader(folder: str, transform, spec: Dict[str, Any], read_only: bool, pin_memory: bool):
    mds.base().util.clean_stale_shared_memory()
    dataset = _mds_dataset_class()(transform, local=folder, remote=None, shuffle=False, batch_size=spec["batch_size"])
    return torch_loader(dataset, spec, read_only, pin_memory)


CONVERTERS = {"litdata": (_convert_litdata, _litdata_loader), "mosaicml": (_convert_mosaicml, _mosaicml_loader)}


def convert_apart(system: str, urls, options: Dict[str, Any], folder: str, workers: int) -> float:
    """Convert in a process of its own, as a user converts before training; its seconds (libraries
    imported first, as for every measured system). Apart, because a converter may change the
    process's state: ``litdata.optimize`` sets multiprocessing's start method to ``spawn``, which
    would then start the reading ``DataLoader``'s workers by spawning, not forking as they do in a
    training process that converted nothing."""
    job = {"system": system, "urls": list(urls), "options": options, "folder": folder, "workers": workers}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        proc = subprocess.run([sys.executable, "-c", "from dalistream.tools.bench.converted import convert_main; "
                               "convert_main()", f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"converting to {system} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])["convert_s"]


def convert_main() -> None:
    """The converting process: the job (a JSON file named by ``argv[1]``) done; prints ``{"convert_s": …}``."""
    with open(sys.argv[1]) as f:
        job = json.load(f)
    import_library(job["system"])
    started = time.perf_counter()
    CONVERTERS[job["system"]][0](job["urls"], job["options"], job["folder"], job["workers"])
    print(json.dumps({"convert_s": time.perf_counter() - started}), flush=True)


@contextlib.contextmanager
def converted(spec: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The rank's shards converted to ``spec["system"]``'s format in a new temporary folder, by the
    bench before the measured process starts (so that neither the converter's time, CPU nor memory
    counts as the loader's): the spec with ``converted`` (the folder) and ``convert_s``; the
    folder is removed after the run."""
    folder = tempfile.mkdtemp(prefix=f"dalistream-bench-{spec['system']}-", dir=spec.get("convert_dir"))
    try:
        data = os.path.join(folder, "data")
        convert_s = convert_apart(spec["system"], rank_share(spec), spec.get("storage_options") or {}, data,
                                  spec["workers"])
        yield dict(spec, converted=data, convert_s=convert_s)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def open_converted(spec: Dict[str, Any]) -> Opened:
    """Read ``spec["converted"]`` (:func:`converted`) with ``spec["system"]``'s own loader."""
    import torch

    system, pipeline = spec["system"], spec["pipeline"]
    read_only = pipeline == "read-only"
    then = raw_item if read_only else feed_item if pipeline == "feed" else Augment(spec["size"], spec["seed"])
    device, device_id = resolve_device(spec["device"])
    to_gpu = device == "gpu" and pipeline.startswith("classification")
    loader = CONVERTERS[system][1](spec["converted"], _Transformed(then), spec, read_only, to_gpu)

    def batches():
        target = torch.device("cuda", device_id) if to_gpu else None
        for _ in range(spec["epochs"]):
            for images, labels in loader:
                if target is not None:
                    images, labels = images.to(target, non_blocking=True), labels.to(target, non_blocking=True)
                yield images, labels

    count = (lambda b: (len(b[1]), sum(len(x) for x in b[0]))) if read_only else (lambda b: (len(b[1]), 0))
    return Opened(batches(), count, extra=lambda: {"device": "gpu" if to_gpu else "cpu", "convert_s": spec["convert_s"]})
