"""Manifest files: per-shard counts (and offsets) written once, read by every rank.

Read from and written to any store (:mod:`dalistream.io.stores`), next to the shards. The formats read are listed in :mod:`.formats`. Rows are matched to shards by full
URL (relative row URLs resolved against the manifest's location), never by base name: the
manifest of another split with the same file names is an error, not silently wrong counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import zipfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..errors import ManifestError, SourceError, redact
from ..io.local import cache_write, local_path, new_file_mode
from ..io.remote import read_bytes, write_bytes
from ..io.stores import canonical, schemes_in, store_class
from ..sources import is_remote
from .formats import FORMAT, parse_idx, parse_json
from .members import MemberLayout
from .rows import ShardInfo, ShardRows
from .scan import version_of

DEFAULT_NAME = "dalistream-manifest.json"


def default_location(urls: Sequence[str]) -> Optional[str]:
    """Where ``dalistream index`` writes and where a manifest is looked for unnamed: the folder
    (or key prefix) holding all the shards. ``None`` for ``pipe:`` sources or mixed places."""
    stores = [store_class(u) for u in schemes_in(urls).values()]
    if not urls or not all(s.local or s.ranged for s in stores):
        return None  # a command's output (pipe:) lies in no folder
    one = _one_folder(urls)
    if one is not None:
        return one + DEFAULT_NAME
    if not any(s.local for s in stores):
        folders = {u.rsplit("/", 1)[0] for u in urls}
        if len(folders) != 1:
            scheme, _, _ = urls[0].partition("://")  # (URL syntax: SCHEME://PATH)
            common = posixpath.commonpath([f.partition("://")[2] for f in folders])
            if not common or len(stores) != 1:
                return None
            folders = {f"{scheme}://{common}"}
        return f"{folders.pop()}/{DEFAULT_NAME}"
    if len(stores) > 1:
        return None
    folders = {u.rpartition("/")[0] for u in urls}  # a few folders for many shards: each checked once
    if not all(f.startswith("/") and "/." not in f and "//" not in f for f in folders):
        folders = {os.path.dirname(os.path.abspath(local_path(u))) for u in urls}
    folder = folders.pop() if len(folders) == 1 else os.path.commonpath(sorted(folders))
    return os.path.join(folder, DEFAULT_NAME)


def _one_folder(urls: Sequence[str]) -> Optional[str]:
    """The folder (ending in ``/``) all of ``urls`` lie directly in, if they do and are absolute
    and normal; found over the whole list at once (500,000 shards: milliseconds)."""
    first = urls[0]
    folder = first[:first.rfind("/") + 1]
    if not folder or not (folder.startswith("/") or "://" in folder) or "/." in folder:
        return None
    text = "\n" + "\n".join(urls)
    if text.count("\n" + folder) != len(urls) or text.count("/") != len(urls) * folder.count("/") or "/." in text:
        return None
    return folder


def _relative(url: str, manifest: str) -> str:
    """A shard URL as written into a manifest: relative to it when below its folder."""
    if is_remote(manifest) or is_remote(url):
        folder = canonical(manifest).rsplit("/", 1)[0] + "/"
        return canonical(url)[len(folder):] if canonical(url).startswith(folder) else url
    folder = os.path.dirname(os.path.abspath(local_path(manifest)))
    path = os.path.abspath(local_path(url))
    return os.path.relpath(path, folder) if path.startswith(folder + os.sep) else path


def write_manifest(infos: Sequence[ShardInfo], path: str, options: Optional[Mapping[str, Any]] = None,
                   extra: Optional[Mapping[str, Any]] = None) -> None:
    """Write a manifest file whole or not at all, to any store (``options``: the storage
    options). Shard URLs below the manifest's folder are written relative to it, so the folder
    can be moved or mounted elsewhere. ``extra``: more top-level fields (``dalistream write``
    records the class names and each key's source file)."""
    rows = []
    for info in infos:
        row = {"url": _relative(info.url, path), "samples": info.samples, "bytes": info.bytes}
        if info.offsets is not None:
            row["offsets"] = list(info.offsets)
        if info.members is not None:
            patterns, kinds, sizes = info.members
            row["members"] = {"patterns": [{"exts": list(e), "headers": list(h)} for e, h in patterns],
                              **({"kinds": list(kinds)} if len(patterns) > 1 else {}), "sizes": list(sizes)}
        if info.keys:
            row["keys"] = {name: list(values) for name, values in info.keys.items()}
        rows.append(row)
    payload = json.dumps({**(extra or {}), "format": FORMAT, "version": 1, "shards": rows}, separators=(",", ":"))
    write_bytes(path, payload.encode(), options)
    if not is_remote(path):  # a manifest beside the shards can be read by whoever can read them
        os.chmod(local_path(path), shard_mode(infos))


def shard_mode(infos: Sequence[ShardInfo]) -> int:
    """The read and write permissions of the first local shard of ``infos``, else those of any
    new file of this process."""
    for info in infos:
        if not is_remote(info.url):
            try:
                return os.stat(local_path(info.url)).st_mode & 0o666
            except OSError:
                continue
    return new_file_mode()


def _read_text(path: str, options: Optional[Mapping[str, Any]]) -> str:
    try:
        return read_bytes(path, options).decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError("manifest is not UTF-8 text", url=path, reason="bad_manifest") from None
    except SourceError as e:
        if e.reason == "missing":
            raise SourceError("manifest file does not exist", url=path, reason="missing") from None
        raise SourceError(f"cannot read manifest: {e.message}", url=path, hint=e.hint, reason=e.reason) from None


def read_manifest(path: str, options: Optional[Mapping[str, Any]] = None) -> ShardRows:
    """Read a manifest (dalistream JSON or a wids index; local, ``s3://`` or ``http(s)://``) into
    its rows (URLs resolved), validated."""
    try:
        payload = json.loads(_read_text(path, options))
    except ValueError as e:
        raise ManifestError(f"manifest is not valid JSON: {e}", url=path, reason="bad_manifest") from None
    return parse_json(payload, path)


# the column layout of a parsed manifest kept in the cache directory: bump when it changes
PARSED_LAYOUT = "rows-4"  # rows-2: member layouts; rows-3: key columns; rows-4: URLs as one UTF-8 text


def read_manifest_cached(path: str, cache_dir: Optional[str], options: Optional[Mapping[str, Any]] = None) -> ShardRows:
    """:func:`read_manifest`, with the manifest's validated rows kept in ``cache_dir`` as arrays,
    keyed by a local file's path, size, mtime and inode, or a remote one's URL, size and ETag (one
    HEAD request): every later run (every rank of a node) maps them back instead of fetching,
    parsing and checking the JSON again. No cache directory, a remote object without an ETag,
    or a cache that cannot be written: read as usual."""
    if not cache_dir:
        return read_manifest(path, options)
    version = version_of(path, options)  # remote: one HEAD instead of a GET of the whole file
    if version is None:
        return read_manifest(path, options)  # cannot tell an edited manifest (or its error comes next)
    return _read_cached(path, version, cache_dir, options)


Reader = Callable[[str], ShardRows]  # a manifest's path -> its rows


def manifest_reader(cache_dir: Optional[str], options: Optional[Mapping[str, Any]] = None) -> Reader:
    """:func:`read_manifest_cached` with ``cache_dir`` and ``options``, each path read once: what
    one resolution of a data set uses, so that its listing and its counts, which ask for the same
    manifest, read it once."""
    read: Dict[str, ShardRows] = {}

    def rows(path: str) -> ShardRows:
        key = _key(path)  # (the listing names it as given, the counts by its absolute path)
        if key not in read:
            read[key] = read_manifest_cached(path, cache_dir, options)
        return read[key]

    return rows


def _read_cached(path: str, version: str, cache_dir: str, options: Optional[Mapping[str, Any]]) -> ShardRows:
    """:func:`read_manifest_cached` from ``cache_dir`` (the rows mapped back), else parsed and kept there."""
    key = f"{PARSED_LAYOUT}|{version}".encode()
    base = os.path.join(cache_dir, "parsed", hashlib.sha256(key).hexdigest()[:32])
    try:
        with np.load(base + ".npz") as z:
            # offsets (8 bytes per sample) are mapped, not loaded: workers map the same file
            offsets = np.load(base + ".offsets.npy", mmap_mode="r") if bool(z["has_offsets"]) else None
            members = None
            if "member_exts" in z:
                members = MemberLayout.from_arrays(z, z["samples"], np.load(base + ".kinds.npy", mmap_mode="r"),
                                                   np.load(base + ".members.npy", mmap_mode="r"))
            keys = {name: np.load(f"{base}.key{i}.npy", mmap_mode="r") for i, name in enumerate(z["key_names"].tolist())}
            urls = z["urls"].tobytes().decode("utf-8", "surrogateescape").split("\n") if len(z["samples"]) else []
            return ShardRows(urls, z["samples"], z["sizes"], offsets, members, keys)
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        pass  # not there yet (or unreadable): parse, then keep
    rows = read_manifest(path, options)
    written = rows.offsets is None or cache_write(base + ".offsets.npy", lambda f: np.save(f, rows.offsets))
    layout = {}
    if written and rows.members is not None:  # (first the parts; the table below says they are there)
        written = (cache_write(base + ".kinds.npy", lambda f: np.save(f, np.asarray(rows.members.kind)))
                   and cache_write(base + ".members.npy", lambda f: np.save(f, np.asarray(rows.members.sizes))))
        layout = rows.members.pattern_arrays()
    names = sorted(rows.keys or {})
    for i, name in enumerate(names):
        written = written and cache_write(f"{base}.key{i}.npy", lambda f, name=name: np.save(f, np.asarray(rows.keys[name])))
    text = "\n".join(rows.urls)
    if written and text.count("\n") == len(rows.urls) - 1:  # (a URL holding a line break is not kept)
        urls = np.frombuffer(text.encode("utf-8", "surrogateescape"), dtype=np.uint8)
        cache_write(base + ".npz", lambda f: np.savez(f, urls=urls, samples=rows.samples, sizes=rows.sizes,
                                                        has_offsets=np.array(rows.offsets is not None),
                                                        key_names=np.array(names, dtype=str), **layout))
    return rows


def read_idx(index_paths: Sequence[str], urls: Sequence[str], options: Optional[Mapping[str, Any]] = None) -> List[ShardInfo]:
    """Rows from DALI ``wds2idx`` index files, one per shard, paired in order (as DALI pairs them)."""
    if len(index_paths) != len(urls):
        raise ManifestError(f"{len(index_paths)} index files for {len(urls)} shards: give one per shard, in order",
                            url=index_paths[0] if index_paths else None, reason="bad_manifest")
    return [parse_idx(_read_text(p, options), p, u) for p, u in zip(index_paths, urls)]


def _key(url: str) -> str:
    if url.startswith("/") and "/." not in url and "//" not in url:
        return url  # already absolute and normal (most listed paths)
    if is_remote(url):
        return canonical(redact(url))
    return os.path.normpath(os.path.abspath(local_path(url)))


def manifest_urls(folder: str, read: Reader, manifest: Optional[str] = None) -> Optional[List[str]]:
    """The shard URLs the manifest in ``folder`` (a URL or path ending in ``/``) names, or None
    when there is none there: what a listing takes instead of asking for every object (``read``:
    the resolution's :func:`manifest_reader`). With ``manifest`` (the manifest the user named, which
    counts the shards and so must name every one of them), a local folder's are its rows."""
    if manifest and not manifest.endswith(".idx") and not is_remote(folder):
        return read(manifest).urls
    try:
        return read(folder + DEFAULT_NAME).urls
    except SourceError as e:
        if e.reason == "missing":
            return None
        raise


def lookup(urls: Sequence[str], table: ShardRows, manifest_path: str) -> ShardRows:
    """Rows for ``urls`` from a manifest's rows, matched by full URL (credentials aside)."""
    if len(urls) == len(table.urls) and list(urls) == table.urls:
        return table  # listed from the manifest itself, or in its order: nothing to match
    index = {u if u.startswith("/") else _key(u): i for i, u in enumerate(table.urls)}  # rows: resolved
    if len(index) < len(table.urls):
        raise ManifestError(f"manifest {redact(manifest_path)} lists a shard twice (at two revisions?)",
                            url=redact(manifest_path), reason="bad_manifest")
    found = [index.get(url, -1) for url in urls]  # rows are absolute and normal, as most listed URLs are
    if -1 in found:
        found = [i if i >= 0 else index.get(_key(url), -1) for i, url in zip(found, urls)]
    if -1 in found:
        url = urls[found.index(-1)]
        listed = sorted(index)[:2]
        raise ManifestError(
            f"shard is not in the manifest {redact(manifest_path)} ({len(index)} rows, e.g. "
            f"{', '.join(listed)}): is it the manifest of another split or folder?", url=url,
            reason="not_in_manifest",
            hint=f"rebuild it with `dalistream index SOURCES -o {redact(manifest_path)}`")
    return table.take(np.array(found, dtype=np.int64))
