"""Source listing: turn what the user typed into an ordered list of shard URLs.

Accepted forms, on every store (:mod:`dalistream.io.stores`): a shard, a folder (its
``.tar``/``.tar.gz``/``.tgz`` files, sorted; on an object store a prefix, with or without its
trailing ``/``), a glob (``data/*.tar``, ``gs://b/train-0000*.tar``; ``**`` crosses folders) and a
brace pattern (``part-{00000..00127}.tar``); ``http(s)://`` URLs (which cannot be listed) and
``pipe:`` commands as given; and lists of any of these. The order is the order given, each folder
or glob sorted, so the same arguments always give the same list. An unknown URL scheme is a
:class:`~dalistream.errors.ConfigError` listing the supported ones.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import stat
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import braceexpand

from ..errors import SourceError, redact
from ..io.local import check_regular, local_path
from ..io.stores import check_schemes, store_class, store_for
from ..io.stores.base import glob_prefix, has_magic, match_glob
from .named import FOLDER_SCAN_MIN, WRITE_NAMES, Named, missing_shard, named_locally
from .unfinished import MARKER, PART, is_shard_name, refuse_unfinished

log = logging.getLogger(__name__)



def is_remote(url: str) -> bool:
    """True for URLs that are not local files (an object store, a web server, a ``pipe:``)."""
    return not store_class(url).local


Identity = Any  # (device, inode) of a local file, its path where it cannot be read, a remote URL


def _file_identity(path: str) -> Identity:
    """(device, inode) of a local shard: one ``stat`` (a real path costs one per path component)."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        return os.path.abspath(path)  # missing: reported when it is opened


def _walk(folder: str) -> List[Tuple[str, Identity]]:
    """Shard files below ``folder`` with their identity. The directory entries say both where the
    file system records file types (no ``stat`` per file); a symlink is followed with one."""
    found: List[Tuple[str, Identity]] = []
    pending = [folder]
    while pending:
        here = pending.pop()
        device = None
        written: List[str] = []  # the names that say whether a write into this folder finished
        with os.scandir(here) as entries:
            for entry in entries:
                if entry.is_symlink():  # a linked folder is not entered (as os.walk)
                    if is_shard_name(entry.name):
                        try:
                            st = entry.stat()
                        except OSError:  # a dangling link: listed, so that opening it names it
                            found.append((entry.path, os.path.abspath(entry.path)))
                            continue
                        if stat.S_ISREG(st.st_mode):
                            found.append((entry.path, (st.st_dev, st.st_ino)))
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif is_shard_name(entry.name) and entry.is_file(follow_symlinks=False):
                    if device is None:
                        device = os.stat(here).st_dev
                    found.append((entry.path, (device, entry.inode())))
                elif entry.name in WRITE_NAMES or entry.name.endswith(PART):
                    written.append(entry.name)
        refuse_unfinished(here, written)
    found.sort(key=lambda item: item[0])
    return found


def _known_files(paths: Sequence[str]) -> Dict[str, Identity]:
    """Identity of listed paths that are plain (not linked) files, read from their folder's entries
    where a folder holds many of them: one folder scan instead of a ``stat`` per path (a brace
    pattern of 100,000 shards). A scan stops after a few entries per listed path, so a few paths
    in a huge folder cost no more than their own ``stat``s; what it does not settle is left out."""
    by_folder: Dict[str, set] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        by_folder.setdefault(folder, set()).add(name)
    known: Dict[str, Identity] = {}
    for folder, names in by_folder.items():
        if len(names) < FOLDER_SCAN_MIN or not folder:
            continue
        budget, left = max(4 * len(names), 1024), len(names)
        try:
            with os.scandir(folder) as entries:
                device = os.stat(folder).st_dev
                for entry in entries:
                    budget -= 1
                    if entry.name in names:
                        left -= 1
                        if not entry.is_symlink() and entry.is_file(follow_symlinks=False):
                            known[entry.path] = (device, entry.inode())
                    if not left or not budget:
                        break
        except OSError:
            continue
    return known


def _expand_local(pattern: str, known: Optional[Mapping[str, Identity]] = None) -> List[Tuple[str, Identity]]:
    path = local_path(pattern)
    if known and path in known:
        return [(path, known[path])]
    try:
        st: Optional[os.stat_result] = os.stat(path)  # one stat says folder, file and identity
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        found = _walk(path)
        if not found:
            raise SourceError("directory holds no .tar/.tar.gz/.tgz shards", url=path)
        return found
    if st is not None:  # an existing file is itself, even when its name holds glob characters
        check_regular(path, st)
        return [(path, (st.st_dev, st.st_ino))]
    if glob.has_magic(path):
        matched = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        if not matched:
            raise SourceError("glob matched no files", url=path)
        return [(p, _file_identity(p)) for p in matched]
    raise missing_shard(path)


def _from_manifest(item: str, named: Optional[Named], storage_options: Mapping[str, Any],
                   pins: Dict[Any, str]) -> Optional[List[str]]:
    """A folder's or a glob's shards as the manifest beside them names them: one read, where a
    listing would ask for every object (500,000 of them, on every rank); None without one."""
    if named is None:
        return None
    store = store_for(item, storage_options)
    if hasattr(store, "pin"):  # the manifest read at the commit the listing is pinned to: its rows name it
        item = store.pin([item], pins)[0]
    glob_item = has_magic(item)
    folder = glob_prefix(item) if glob_item else item if item.endswith("/") else item + "/"
    rows = named(folder[:folder.rfind("/") + 1])
    if not rows:
        return None
    return match_glob(item if glob_item else folder + "**", rows) or None


def _expand_objects(item: str, storage_options: Mapping[str, Any], pins: Dict[Any, str],
                    named: Optional[Named] = None) -> List[str]:
    """The shards ``item`` names on a store that is not local: a glob's matches, a folder's (a
    prefix's) shards (as the manifest beside them names them, where there is one), or the object
    itself; a store that cannot be listed takes it as given."""
    from ..io.remote import list_objects  # network clients only when needed

    cls = store_class(item)
    if not getattr(cls, "listable", True):
        if item.endswith("/") and cls.ranged:  # a web server's folder (a command's output is taken as given)
            store_for(item, storage_options).list(item)  # raises: it cannot be listed, and what to write instead
        return [item]
    if has_magic(item) or item.endswith("/") or not is_shard_name(item):
        found = _from_manifest(item, named, storage_options, pins)
        if found is not None:
            return found
    if has_magic(item):
        urls = _whole_sets([o.url for o in list_objects(glob_prefix(item), storage_options)])
        canon = getattr(cls, "canonical", None)  # listed at a version the pattern does not name (the Hub)
        if canon is None:
            urls = match_glob(item, urls)
        else:
            named = {canon(u): u for u in urls}
            urls = [named[u] for u in match_glob(canon(item), list(named))]
        if not urls:
            raise SourceError("glob matched no objects", url=item)
        return urls
    if is_shard_name(item) and not item.endswith("/"):
        return _pinned(item, storage_options, pins)  # a shard by name: no request (a missing one is named when opened)
    folder = item if item.endswith("/") else item + "/"
    urls = [u for u in _whole_sets([o.url for o in list_objects(folder, storage_options)]) if is_shard_name(u)]
    if not urls:
        if not item.endswith("/"):
            return _pinned(item, storage_options, pins)  # not a folder: an object whose name does not say it is a shard
        raise SourceError("folder holds no .tar/.tar.gz/.tgz objects", url=item)
    return urls


def _whole_sets(urls: List[str]) -> List[str]:
    """``urls`` (a listing of an object store), after the finished-write check of every folder
    in it (:func:`.unfinished.refuse_unfinished`: a writer's marker without its manifest, or
    shards under temporary names, is an unfinished write)."""
    written: Dict[str, List[str]] = {}
    for url in urls:
        folder, _, name = url.rpartition("/")
        if name in WRITE_NAMES or name.endswith(PART):
            written.setdefault(folder, []).append(name)
    for folder, names in written.items():
        refuse_unfinished(folder + "/", names)
    return urls


def _pinned(url: str, storage_options: Mapping[str, Any], pins: Dict[Any, str]) -> List[str]:
    """``[url]``, named at one version where its store pins reads to one (the Hub: a commit;
    ``pins`` keeps those found during one listing)."""
    store = store_for(url, storage_options)
    return store.pin([url], pins) if hasattr(store, "pin") else [url]


def _is_brace_pattern(source: str) -> bool:
    """``{a..b}``/``{x,y}`` to expand, unless it names an existing local file (braces in a name)."""
    if "{" not in source:
        return False
    store = store_class(source)
    if not (store.local or store.ranged):
        return False  # a command (pipe:), whose braces are its shell's
    return is_remote(source) or not os.path.lexists(local_path(source))


def expand_sources(sources: Union[str, Sequence[str]], storage_options: Optional[Mapping[str, Any]] = None,
                   named: Optional[Named] = None) -> List[str]:
    """Expand sources into the ordered list of shard URLs, each shard once (see :func:`_first_of_each`).

    ``storage_options`` configure the stores' listing (endpoint, credentials). ``named`` (see
    :data:`Named`) gives the shards a manifest names: an object store's folder or glob is then
    taken from it instead of listed, and local shards it names are not stated one by one.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    _check_named_folders([source for source in map(os.fspath, sources) if not is_remote(source)])
    items = [item for source in map(os.fspath, sources)
             for item in (expand_braces(source) if _is_brace_pattern(source) else [source])]
    stores = [store_class(u) for u in check_schemes(items).values()]
    if all(s.local for s in stores) and named is not None:
        found = named_locally(items, named)
        if found is not None:
            return found  # shards the manifest names: no stat per file
    local = [i for i in items if store_class(i).local] if len(stores) > 1 else items if stores and stores[0].local else []
    known = _known_files([local_path(i) for i in local]) if len(local) >= FOLDER_SCAN_MIN else {}
    listed: List[Tuple[str, Identity]] = []
    pins: Dict[Any, str] = {}
    for item in items:
        ident = known.get(item)
        if ident is not None:
            listed.append((item, ident))
        elif store_class(item).local:
            listed.extend(_expand_local(item, known))
        else:
            listed.extend((url, url) for url in _expand_objects(item, storage_options or {}, pins, named))
    if not listed:
        raise SourceError("the source list is empty", hint="pass shard paths, globs, brace patterns or URLs")
    return _first_of_each(listed)


def _check_named_folders(sources: Sequence[str]) -> None:
    """The finished-write check (:func:`.unfinished.refuse_unfinished`) for shards named by a glob,
    a brace pattern or their paths, whose folders were not listed entry by entry: one ``stat``
    per folder for the writer's marker, whatever the number of shards (a pattern's folders come
    from the pattern; ``.part`` files are seen only where a folder is listed)."""
    named = set()
    for source in sources:
        path = local_path(source)
        if is_shard_name(path) or not os.path.isdir(path):  # (a folder is listed entry by entry: _walk)
            named.add(path.rpartition("/")[0] if "/" in path else ".")
    folders = set()
    for folder in named:
        expanded = braceexpand.braceexpand(folder) if "{" in folder and not os.path.lexists(folder) else [folder]
        for each in expanded:
            folders.update(glob.glob(each) if glob.has_magic(each) else [each])
    for folder in folders:
        if os.path.exists(os.path.join(folder or "/", MARKER)):
            refuse_unfinished(os.path.abspath(folder or "/"),
                              [n for n in WRITE_NAMES if os.path.exists(os.path.join(folder or "/", n))])


def expand_braces(pattern: str) -> List[str]:
    """``braceexpand``'s expansion of ``pattern``; one numeric range (``part-{000000..499999}.tar``,
    the common case) is written out directly, 20 times faster."""
    ranged = re.fullmatch(r"([^{}]*)\{(\d+)\.\.(\d+)\}([^{}]*)", pattern)
    if not ranged or "\\" in pattern:
        return list(braceexpand.braceexpand(pattern))
    head, low, high, tail = ranged.groups()
    width = max(len(low), len(high)) if any(s.startswith("0") and s != "0" for s in (low, high)) else 0
    step = 1 if int(high) >= int(low) else -1
    form = head.replace("%", "%%") + f"%0{width}d" + tail.replace("%", "%%")
    return list(map(form.__mod__, range(int(low), int(high) + step, step)))


def _first_of_each(listed: Sequence[Tuple[str, Identity]]) -> List[str]:
    """The listed URLs with every shard once: a local shard by its file's identity (a symlink to
    another listed shard, one file matched by two globs or folders, a hard link), a remote one by
    its URL. The first occurrence is kept; the others are dropped with a warning. A copy of a
    shard under another path (``backup/``) is another file, not a duplicate."""
    idents = [ident for _, ident in listed]
    if len(dict.fromkeys(idents)) == len(idents):
        return [url for url, _ in listed]  # nothing twice (the common case: no Python loop per shard)
    first: dict = {}
    dropped = []
    for url, ident in listed:
        if ident in first:
            dropped.append((url, first[ident]))
        else:
            first[ident] = url
    if dropped:
        shown = "; ".join(f"{redact(url)} is {redact(kept)}" for url, kept in dropped[:5])
        log.warning("%d shards listed more than once (a symlink, overlapping globs or directories) are read once: %s%s",
                    len(dropped), shown, " …" if len(dropped) > 5 else "")
    return list(first.values())
