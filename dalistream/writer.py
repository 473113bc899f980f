"""From a user's own images to WebDataset shards: :func:`write` (``dalistream write SOURCE OUTPUT``).

The input is an image folder in the ImageFolder layout (one sub-folder per class, its name the
class; classes numbered in sorted order), or a CSV/JSONL file of ``path,label[,caption]`` rows
(relative paths against the file's folder). Samples are shuffled across shards by default
(seeded): shards written from a class-sorted folder then hold mixed classes, which is what a
training stream needs from its shards. Shards are written in parallel (one process per core),
each a plain ustar tar of ``KEY.jpg|png|…``, ``KEY.cls`` and ``KEY.txt`` members, and a
``dalistream-manifest.json`` with counts, offsets and member layouts is written beside them, so
that every rank finds its counts without scanning. ``OUTPUT`` is a folder or an ``s3://`` prefix.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import tarfile
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .config import IMAGE_EXTS, is_image_ext
from .errors import ConfigError, SourceError
from .sources import is_remote

MANIFEST = "dalistream-manifest.json"


@dataclass(frozen=True)
class Item:
    """One sample to write: an image file, its label, an optional caption."""

    path: str
    label: int
    caption: Optional[str] = None


def image_folder(root: str) -> tuple:
    """``(items, classes)`` of an ImageFolder tree: ``root/<class>/<image>``, classes sorted."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    if not classes:
        raise SourceError("no class folders: an image folder holds one sub-folder per class", url=root,
                          hint="lay it out as ROOT/CLASS/IMAGE.jpg, or give a CSV/JSONL of path,label rows")
    items = []
    for label, name in enumerate(classes):
        for folder, _, files in sorted(os.walk(os.path.join(root, name))):
            for f in sorted(files):
                if _image_ext(f):
                    items.append(Item(os.path.join(folder, f), label))
    if not items:
        raise SourceError(f"no images ({', '.join(sorted(IMAGE_EXTS))}) in the class folders", url=root)
    return items, classes


def listing(path: str) -> tuple:
    """``(items, None)`` from a CSV (``path,label[,caption]``, a header row allowed) or JSONL file
    (``{"path", "label"[, "caption"]}`` per line); relative paths against the file's folder."""
    base = os.path.dirname(os.path.abspath(path))
    items = []
    with open(path, newline="", encoding="utf-8") as f:
        rows: Any = ([json.loads(line) for line in f if line.strip()] if path.endswith((".jsonl", ".json"))
                     else list(csv.reader(f)))
    for n, row in enumerate(rows, start=1):
        if isinstance(row, dict):
            fields = [row.get("path"), row.get("label"), row.get("caption")]
        else:
            fields = (list(row) + [None, None])[:3]
        if n == 1 and not isinstance(row, dict) and str(fields[1]).strip().lower() == "label":
            continue  # a header
        image, label, caption = fields
        try:
            label = int(str(label).strip())
        except ValueError:
            raise ConfigError(f"row {n}: label {label!r} is not an integer", url=path) from None
        if not image or not _image_ext(str(image)):
            raise ConfigError(f"row {n}: {image!r} is not an image path", url=path)
        items.append(Item(os.path.join(base, str(image)), label, caption or None))
    if not items:
        raise ConfigError("no rows", url=path)
    return items, None


def _image_ext(name: str) -> Optional[str]:
    """The member extension an image file is written under (``jpeg`` as ``jpg``), or None."""
    if "." not in name or not is_image_ext(name):
        return None
    ext = name.rsplit(".", 1)[-1].lower()
    return "jpg" if ext == "jpeg" else ext


def plan_shards(items: Sequence[Item], *, samples_per_shard: int, shuffle: bool, seed: int) -> List[List[int]]:
    """The item indices of each shard: a seeded permutation (identity without ``shuffle``) cut into
    shards of ``samples_per_shard`` (the last may be shorter)."""
    order = list(range(len(items)))
    if shuffle:
        random.Random(seed).shuffle(order)
    return [order[i:i + samples_per_shard] for i in range(0, len(order), samples_per_shard)]


def _write_shard(path: str, items: Sequence[Item], keys: Sequence[str]) -> int:
    """One shard: for each item ``KEY.<image ext>``, ``KEY.cls`` and ``KEY.txt`` (with a caption)."""
    with tarfile.open(path + ".part", "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, item in zip(keys, items):
            with open(item.path, "rb") as f:
                image = f.read()
            members = [(_image_ext(item.path), image), ("cls", str(item.label).encode())]
            if item.caption is not None:
                members.append(("txt", item.caption.encode("utf-8")))
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    os.replace(path + ".part", path)
    return len(items)


def write(source: str, output: str, *, samples_per_shard: int = 1000, shuffle: bool = True, seed: int = 0,
          prefix: str = "train", processes: Optional[int] = None,
          storage_options: Optional[Mapping[str, Any]] = None,
          progress: Optional[Callable[[int], None]] = None,
          on_listed: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
    """Write ``source`` (an ImageFolder tree or a CSV/JSONL listing) as WebDataset shards into
    ``output`` (a folder or an ``s3://`` prefix) with a manifest beside them; returns a summary
    (``shards``, ``samples``, ``classes``, ``manifest``). ``on_listed(total)`` is called once the
    source is listed, ``progress(n)`` as shards are written, with their sample counts."""
    from .manifest import build_manifest, write_manifest

    if samples_per_shard < 1:
        raise ConfigError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    remote = is_remote(output)
    if not remote and os.path.isdir(output) and any(n.startswith(prefix + "-") and n.endswith(".tar")
                                                     for n in os.listdir(output)):
        raise ConfigError(f"{output} already holds {prefix}-*.tar shards: a new set beside them would be read together",
                          url=output, hint="write into an empty folder, or pass another prefix")
    items, classes = image_folder(source) if os.path.isdir(source) else listing(source)
    if on_listed:
        on_listed(len(items))
    shards = plan_shards(items, samples_per_shard=samples_per_shard, shuffle=shuffle, seed=seed)
    width = max(5, len(str(len(shards) - 1)))
    names = [f"{prefix}-{i:0{width}d}.tar" for i in range(len(shards))]
    folder = tempfile.mkdtemp(prefix="dalistream-write-") if remote else output
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, name) for name in names]
    digits = len(str(len(items)))
    jobs = [(path, [items[i] for i in shard], [f"{i:0{digits}d}" for i in shard]) for path, shard in zip(paths, shards)]
    workers = max(1, min(processes or os.cpu_count() or 1, len(jobs)))
    try:
        if workers == 1:
            for job in jobs:
                n = _write_shard(*job)
                if progress:
                    progress(n)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for n in pool.map(_write_shard, *zip(*jobs)):
                    if progress:
                        progress(n)
        infos = build_manifest(paths, offsets=True)
        if remote:
            from .io.remote import write_bytes

            prefix_url = output.rstrip("/") + "/"
            for path, name in zip(paths, names):
                write_bytes(prefix_url + name, path, storage_options)
            infos = [type(info)(prefix_url + name, info.samples, info.bytes, info.offsets, info.members)
                     for info, name in zip(infos, names)]
            manifest = prefix_url + MANIFEST
        else:
            manifest = os.path.join(output, MANIFEST)
        write_manifest(infos, manifest, storage_options)
    finally:
        if remote:
            for path in paths:
                if os.path.exists(path):
                    os.remove(path)
            os.rmdir(folder)
    return {"shards": len(names), "samples": len(items), "classes": classes, "manifest": manifest,
            "urls": [(output.rstrip("/") + "/" + n) if remote else os.path.join(output, n) for n in names]}
