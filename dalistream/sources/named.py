"""Local shards a manifest names, listed without a ``stat`` per file.

A folder, a glob or a long list of paths whose folder holds a manifest naming them is listed from
the manifest and one read of the folder's names (``os.listdir``: one system call per few hundred
entries, no Python per entry beyond set arithmetic): the names the manifest lists are taken as
its shards, whole files, as the manifest says; only entries it does not name are looked at one by
one. Anything these shortcuts cannot settle exactly as the entry-by-entry listing would (a shard
the manifest does not name, a folder below, a named shard that is gone, paths not directly in one
folder or not in normal form) returns ``None``, and the caller lists entry by entry. At 500,000
shards the difference is seconds (:doc:`the manifests guide <guide/manifests>`).
"""

from __future__ import annotations

import fnmatch
import os
from typing import Callable, List, Optional, Sequence, Tuple

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


def _listed(folder: str, named: Named) -> Optional[Tuple[List[str], List[str]]]:
    """The names of the shards the manifest in ``folder`` (a path as given) lists directly in it,
    and the names of the folder's entries; ``None`` without such a manifest or folder."""
    real = os.path.abspath(folder) + "/"  # (the manifest's rows are absolute and normal)
    rows = named(os.path.join(folder, ""))
    if not rows or len(rows) < FOLDER_SCAN_MIN:
        return None
    names = names_in(rows, "/" if real == "//" else real)
    if names is None:
        return None
    try:
        return names, os.listdir(folder)
    except OSError:
        return None


def named_folder(path: str, named: Named) -> Optional[List[str]]:
    """The shards of the local folder ``path`` as the entry-by-entry walk lists them (sorted, below
    it), from its manifest and one read of its names; ``None`` where that cannot be told so."""
    listed = _listed(path, named)
    if listed is None:
        return None
    names, entries = listed
    present = set(entries)
    if len(present) < len(names) or not present.issuperset(names):
        return None  # a named shard is gone
    written = []
    for name in present.difference(names):  # the entries the manifest does not name: few
        if name in WRITE_NAMES or name.endswith(PART):
            written.append(name)
        if is_shard_name(name):
            return None  # a shard (or a link to one) the manifest does not name
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            return None  # a folder below: its shards are walked
    refuse_unfinished(path, written)
    names.sort()  # (a manifest's rows are sorted already: one pass)
    return _joined(os.path.join(path, ""), names)


def named_glob(pattern: str, named: Named) -> Optional[List[str]]:
    """The files a glob matches in one local folder (its last component holds the glob
    characters) as ``glob.glob`` and a check that each is a file give them, when the folder's
    manifest names every match; ``None`` otherwise."""
    folder, _, last = pattern.rpartition("/")
    if not folder or "**" in last or has_magic(folder):
        return None
    listed = _listed(folder, named)
    if listed is None:
        return None
    names, entries = listed
    if last[0] != "." and "\n." in "\n" + "\n".join(entries):
        entries = [e for e in entries if e[0] != "."]  # glob leaves hidden names out
    matched = fnmatch.filter(entries, last)
    if not matched or not set(names).issuperset(matched):
        return None  # no match (named by the caller's error), or a match the manifest does not name
    matched.sort()
    return _joined(folder + "/", matched)


def named_list(items: List[str], named: Named) -> bool:
    """True when ``items`` are many absolute paths of one folder, each once, all of them named by
    the manifest in that folder: checked over the whole list at once (a brace pattern of 500,000
    shards costs no ``stat`` and no Python per path)."""
    if len(items) < FOLDER_SCAN_MIN or not items[0].startswith("/"):
        return False
    folder = items[0][:items[0].rfind("/") + 1]
    rows = named(folder)
    if not rows:
        return False
    if items == rows:
        return True  # the manifest's own list (its rows are unique and normal)
    text = "\n".join(items)
    if text.count("\n" + folder) != len(items) - 1 or text.count("/") != len(items) * folder.count("/") \
            or "/./" in text or "/../" in text or "//" in text or len(set(items)) != len(items):
        return False  # not all directly in one folder, or not in normal form, or repeated
    return not set(items).difference(rows)


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
