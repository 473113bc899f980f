"""Local shards a manifest names, listed without a ``stat`` per file.

A folder, a glob or a long list of paths (a brace pattern) in one folder that a manifest names is
listed from the manifest and one read of the folder's entries (:func:`read_folder`: the file
system's entry types, no ``stat``, no Python per entry beyond set arithmetic): the plain files the
manifest lists are taken as its shards, distinct files, as the manifest says; only entries it
does not name are looked at one by one. A listed path that is not in its folder is a
:class:`~dalistream.errors.SourceError` naming it (:func:`missing_shard`), as without a manifest.
Anything these shortcuts cannot settle exactly as the entry-by-entry listing would (a shard the
manifest does not name, a named entry that is a link or a folder, a folder below, a named shard
that is gone from a folder, paths not directly in one folder) returns ``None``, and the caller
lists entry by entry. At 500,000 shards the difference is seconds
(:doc:`the manifests guide <guide/manifests>`).
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Callable, List, Optional, Sequence, Tuple

from ..errors import SourceError
from ..io.local import local_path
from ..io.stores.base import has_magic
from .unfinished import MANIFEST, MARKER, PART, is_shard_name, refuse_unfinished

#: ``named(folder)``: the shard URLs the manifest in ``folder`` (a URL ending in ``/``) names, or None
Named = Callable[[str], Optional[List[str]]]

FOLDER_SCAN_MIN = 64  # listed paths in one folder from which that folder's entries are read instead
WRITE_NAMES = (MARKER, MANIFEST)


def names_in(rows: Sequence[str], prefix: str) -> Optional[List[str]]:
    """The names of ``rows`` when every one lies directly in the folder ``prefix`` (absolute,
    normal, ending in ``/``), else ``None``: checked over the joined text at once."""
    if not rows:
        return None
    text = "\n".join(rows)
    n = len(rows)
    if (not text.startswith(prefix) or text.count("\n") != n - 1 or text.count("\n" + prefix) != n - 1
            or text.count("/") != n * prefix.count("/") or text.endswith("/") or "/\n" in text):
        return None
    return text[len(prefix):].replace("\n" + prefix, "\n").split("\n")


def _joined(base: str, names: List[str]) -> List[str]:
    """``base + name`` for every name, as one string operation."""
    return (base + ("\n" + base).join(names)).split("\n") if names else []


def missing_shard(path: str) -> SourceError:
    """The error for a listed local shard that is not there (named at start-up, whatever lists it)."""
    return SourceError("no such shard file", url=path, hint="check the path, or quote a glob so the shell does not expand it")


def read_folder(folder: str) -> Optional[Tuple[List[str], List[os.DirEntry]]]:
    """The names of the plain files directly in ``folder`` and its other entries (links, folders,
    FIFOs …), from one pass over its entries whose types the file system records (no ``stat``
    per entry where it does); ``None`` when it cannot be read."""
    other: List[os.DirEntry] = []
    try:
        with os.scandir(folder) as entries:  # (one comprehension: 500,000 entries in about 0.15 s)
            files = [e.name for e in entries if e.is_file(follow_symlinks=False) or other.append(e)]
    except OSError:
        return None
    return files, other


def _listed(folder: str, named: Named) -> Optional[Tuple[List[str], List[str], List[os.DirEntry]]]:
    """The names of the shards the manifest for ``folder`` (a path as given) lists directly in it,
    and the folder's plain files and other entries (:func:`read_folder`); ``None`` without such a
    manifest or folder."""
    real = os.path.abspath(folder) + "/"  # (the manifest's rows are absolute and normal)
    rows = named(os.path.join(folder, ""))
    if not rows or len(rows) < FOLDER_SCAN_MIN:
        return None
    names = names_in(rows, "/" if real == "//" else real)
    if names is None:
        return None
    read = read_folder(folder)
    return None if read is None else (names, *read)


def named_folder(path: str, named: Named) -> Optional[List[str]]:
    """The shards of the local folder ``path`` as the entry-by-entry walk lists them (sorted, below
    it), from its manifest and one read of its entries; ``None`` where that cannot be told so."""
    listed = _listed(path, named)
    if listed is None:
        return None
    names, files, other = listed
    unnamed = _unnamed(files, names)
    if len(files) - len(unnamed) != len(names):
        return None  # a named shard is gone, or is a link or a folder: the walk settles it
    written = []
    for entry in other:
        if entry.is_dir(follow_symlinks=False):
            return None  # a folder below: its shards are walked
        unnamed.add(entry.name)
    for name in unnamed:
        if name in WRITE_NAMES or name.endswith(PART):
            written.append(name)
        if is_shard_name(name):
            return None  # a shard (or a link to one) the manifest does not name
    refuse_unfinished(path, written)
    names.sort()  # (a manifest's rows are sorted already: one pass)
    return _joined(os.path.join(path, ""), names)


def _unnamed(files: List[str], names: List[str]) -> set:
    """The ``files`` that are not among ``names`` (a manifest's: each once): every one of ``names``
    is among ``files`` (each once: a folder's entries) when ``len(files) - len(unnamed) == len(names)``
    (one set made and one pass over ``names``, the least a check of both costs)."""
    unnamed = set(files)
    unnamed.difference_update(names)
    return unnamed


def _matching(pattern: str, names: List[str]) -> List[str]:
    """``fnmatch.filter(names, pattern)`` (case-sensitive, as on POSIX), its match run by C code
    over the list (no Python per name)."""
    return list(filter(re.compile(fnmatch.translate(pattern)).match, names))


def named_glob(pattern: str, named: Named) -> Optional[List[str]]:
    """The files a glob matches in one local folder (its last component holds the glob
    characters) as ``glob.glob`` and a check that each is a file give them, when the folder's
    manifest names every match and every match is a plain file; ``None`` otherwise."""
    folder, _, last = pattern.rpartition("/")
    if not folder or "**" in last or has_magic(folder):
        return None
    listed = _listed(folder, named)
    if listed is None:
        return None
    names, files, other = listed
    if last[0] != "." and "\n." in "\n" + "\n".join(names):
        names = [n for n in names if n[0] != "."]  # glob leaves hidden names out
    unnamed = _unnamed(files, names)
    everywhere = len(files) - len(unnamed) == len(names)  # every named shard there
    visible = [n for n in unnamed if last[0] == "." or n[0] != "."]
    if _matching(last, visible + [e.name for e in other if last[0] == "." or e.name[0] != "."]):
        return None  # a match the manifest does not name, or a link or a folder: listed entry by entry
    matched = _matching(last, names)
    if not everywhere:
        present = set(files)
        matched = [n for n in matched if n in present]  # a named shard that is gone: glob matches what is there
    if not matched:
        return None  # no match (named by the caller's error)
    matched.sort()  # (a manifest's rows are sorted already: one pass)
    return _joined(folder + "/", matched)


def named_list(items: List[str], named: Named) -> bool:
    """True when ``items`` are many paths of one folder, each once, all of them named by the
    manifest for that folder and plain files in it: checked over the whole list at once and one
    read of the folder's entries (a brace pattern of 500,000 shards costs no ``stat`` and no
    Python per path). A path that is not in the folder is an error naming it (:func:`missing_shard`)."""
    if len(items) < FOLDER_SCAN_MIN:
        return False
    head = items[0][:items[0].rfind("/") + 1]
    if ":" in head or head.startswith("~"):
        return False  # a file:// URL, a home folder: path by path
    names = names_in(items, head) if head else (items if "/" not in "".join(items) else None)
    if names is None or "." in names or ".." in names or "" in names:
        return False  # not all directly in one folder
    folder = head or "./"
    rows = named(folder)
    if not rows:
        return False
    if items != rows:  # (the manifest's own list: its rows are unique and normal)
        if len(set(items)) != len(items):
            return False  # repeated: read once, with a warning
        real = os.path.join(os.path.abspath(folder), "")
        if not set(rows).issuperset(_joined(real, names)):
            return False
    read = read_folder(folder)
    if read is None:
        return False
    files, other = read
    present = set(files)
    if not present.issuperset(names):
        if not {e.name for e in other}.isdisjoint(names):
            return False  # a link, a folder, a FIFO …: path by path, as without a manifest
        gone = next(head + n for n in names if n not in present)
        if has_magic(gone):
            return False  # (a glob, then)
        raise missing_shard(gone)
    return True


def named_locally(items: List[str], named: Named) -> Optional[List[str]]:
    """Local ``items`` listed from the manifests that name them (:func:`named_list`, or one folder
    or glob), or ``None``: list them entry by entry."""
    if named_list(items, named):
        return items
    if len(items) != 1:
        return None
    path = local_path(items[0])
    if has_magic(path):
        return named_glob(path, named) if not os.path.lexists(path) else None
    return named_folder(path, named) if os.path.isdir(path) else None
