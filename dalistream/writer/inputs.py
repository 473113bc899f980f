"""What ``dalistream write`` reads, listed and checked before any shard is written.

The input is a folder in the ImageFolder layout (one sub-folder per class, its name the class;
classes numbered in sorted order), or a CSV/JSONL file of ``path,label[,caption]`` rows
(relative paths against the file's folder). Its files are images, videos (``.mp4``, ``.webm``,
``.mkv``, ``.mov``) or audio (``.wav``, ``.flac``, ``.ogg``, ``.mp3``), mixed as they come: each
is written under its own extension (:func:`member_ext`). Every file is listed once: a second name of the
same file (a symbolic or hard link, a row naming it again) is dropped with a warning, and a
class folder that leads back into the tree (a link to the root or above it) is no class. Every
bad row of a listing (not JSON, no path, no image, video or audio extension, a label that is not an integer, a
file that is missing or not a file) is named with its row number, all in one error.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..errors import ConfigError, SourceError
from ..kinds import AUDIO_EXTS, IMAGE_EXTS, VIDEO_EXTS, is_image_ext

log = logging.getLogger(__name__)

SHOWN = 10  # problems named in one error (the count says how many more)
#: The extensions a written file may have, as ``dalistream write`` names them in its errors.
WRITTEN_EXTS = ", ".join(sorted(IMAGE_EXTS | VIDEO_EXTS | AUDIO_EXTS))


@dataclass(frozen=True)
class Item:
    """One sample to write: an image, video or audio file, its label, an optional caption."""

    path: str
    label: int
    caption: Optional[str] = None


@dataclass(frozen=True)
class Inputs:
    """The listed samples, the class names (an image folder's; ``None`` for a listing), the folder
    source paths are recorded against in the manifest, and what was left out while listing:
    ``duplicates`` (``(dropped, kept)`` names of one file) and ``loops`` (class folders that
    lead back into the tree)."""

    items: Tuple[Item, ...]
    classes: Optional[List[str]]
    root: str
    duplicates: List[Tuple[str, str]] = field(default_factory=list)
    loops: List[str] = field(default_factory=list)


def member_ext(name: str) -> Optional[str]:
    """The member extension a file is written under (lower case, ``jpeg`` as ``jpg``), or None
    for a name that is not an image's, a video's or an audio file's."""
    if "." not in name:
        return None
    ext = name.rsplit(".", 1)[-1].lower()
    if is_image_ext(name):
        return "jpg" if ext == "jpeg" else ext
    return ext if ext in VIDEO_EXTS or ext in AUDIO_EXTS else None


def file_kind(name: str) -> str:
    """``"image"``, ``"video"`` or ``"audio"``: what a written file is, by its name."""
    ext = member_ext(name)
    return "video" if ext in VIDEO_EXTS else "audio" if ext in AUDIO_EXTS else "image"


def read_inputs(source: str) -> Inputs:
    """An image folder (:func:`image_folder`) or a CSV/JSONL listing (:func:`listing`)."""
    return image_folder(source) if os.path.isdir(source) else listing(source)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def image_folder(root: str) -> Inputs:
    """The samples of an ImageFolder tree: ``root/<class>/<image>``, classes sorted. Folders
    below a class are read (linked ones are not entered); each file is listed once."""
    real_root = os.path.realpath(root)
    names = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    loops = [d for d in names if _inside(real_root, os.path.realpath(os.path.join(root, d)))]
    classes = [d for d in names if d not in loops]
    if loops:
        log.warning("class folders that lead back into the image folder (links to it or above it) are no class: %s",
                    ", ".join(os.path.join(root, d) for d in loops))
    if not classes:
        raise SourceError("no class folders: an image folder holds one sub-folder per class", url=root,
                          hint="lay it out as ROOT/CLASS/IMAGE.jpg (or CLIP.mp4, SOUND.flac), or give a CSV/JSONL "
                               "of path,label rows")
    items: List[Item] = []
    seen: Dict[tuple, str] = {}
    duplicates: List[Tuple[str, str]] = []
    for label, name in enumerate(classes):
        for folder, dirs, files in os.walk(os.path.join(root, name)):
            dirs.sort()
            for f in sorted(files):
                if not member_ext(f):
                    continue
                path = os.path.join(folder, f)
                try:
                    st = os.stat(path)
                except OSError:  # a dangling link: listed, so that writing it names it (a bad image)
                    items.append(Item(path, label))
                    continue
                kept = seen.setdefault((st.st_dev, st.st_ino), path)
                if kept != path:
                    duplicates.append((path, kept))
                elif stat.S_ISREG(st.st_mode):
                    items.append(Item(path, label))
    _warn_duplicates(duplicates)
    if not items:
        raise SourceError(f"no images, videos or audio files ({WRITTEN_EXTS}) in the class folders", url=root)
    return Inputs(tuple(items), classes, os.path.abspath(root), duplicates, loops)


def _rows(path: str) -> List[Tuple[int, Any]]:
    """``(row number, row)`` of a CSV or JSONL file; a JSONL line that is not JSON is a row whose
    value is the error, named with the others."""
    with open(path, newline="", encoding="utf-8") as f:
        if not path.endswith((".jsonl", ".json")):
            return list(enumerate(csv.reader(f), start=1))
        rows: List[Tuple[int, Any]] = []
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except ValueError as e:
                    rows.append((n, ValueError(f"not JSON ({e})")))
        return rows


def listing(path: str) -> Inputs:
    """The samples of a CSV (``path,label[,caption]``, a header row allowed) or JSONL file
    (``{"path", "label"[, "caption"]}`` per line); relative paths against the file's folder.
    Every bad row is named (row number, image path) in one :class:`ConfigError`."""
    base = os.path.dirname(os.path.abspath(path))
    try:
        rows = _rows(path)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"cannot read the listing: {e}", url=path) from None
    items: List[Item] = []
    problems: List[str] = []
    seen: Dict[tuple, str] = {}
    duplicates: List[Tuple[str, str]] = []
    for n, row in rows:
        if isinstance(row, Exception):
            problems.append(f"row {n}: {row}")
            continue
        if isinstance(row, dict):
            fields = [row.get("path"), row.get("label"), row.get("caption")]
        elif isinstance(row, list):
            fields = (list(row) + [None, None])[:3]
            if n == 1 and str(fields[1]).strip().lower() == "label":
                continue  # a header
        else:
            problems.append(f"row {n}: not an object with path and label: {row!r}")
            continue
        image, label, caption = fields
        if not image or not isinstance(image, str):
            problems.append(f"row {n}: no path")
            continue
        full = os.path.join(base, image)
        try:
            label = int(str(label).strip())
        except ValueError:
            problems.append(f"row {n}: {image}: label {label!r} is not an integer")
            continue
        if not member_ext(image):
            problems.append(f"row {n}: {image}: not an image, video or audio file name ({WRITTEN_EXTS})")
            continue
        try:
            st = os.stat(full)
        except OSError as e:
            problems.append(f"row {n}: {full}: {e.strerror or e}")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"row {n}: {full}: not a file")
            continue
        kept = seen.setdefault((st.st_dev, st.st_ino), f"row {n} ({full})")
        if not kept.startswith(f"row {n} "):
            duplicates.append((f"row {n} ({full})", kept))
            continue
        items.append(Item(full, label, str(caption) if caption else None))
    if problems:
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise ConfigError(f"{len(problems)} bad row{'s' if len(problems) > 1 else ''}, nothing written: " + "; ".join(problems[:SHOWN]) + more,
                          url=path, hint="fix or remove these rows; paths are relative to the listing's folder")
    _warn_duplicates(duplicates)
    if not items:
        raise ConfigError("no rows", url=path)
    return Inputs(tuple(items), None, base, duplicates)


def _warn_duplicates(duplicates: List[Tuple[str, str]]) -> None:
    if duplicates:
        shown = "; ".join(f"{a} is {b}" for a, b in duplicates[:5])
        log.warning("%d files listed more than once (links, or rows naming a file again) are written once: %s%s",
                    len(duplicates), shown, " …" if len(duplicates) > 5 else "")
