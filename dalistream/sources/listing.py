"""Source listing: turn what the user typed into an ordered list of shard URLs.

Accepted forms: a local path, a directory (its ``.tar``/``.tar.gz``/``.tgz`` files, sorted), a
glob (``data/*.tar``), a brace pattern (``part-{00000..00127}.tar``), ``file://`` URLs,
``s3://`` (a key, or a prefix ending in ``/``), ``http(s)://`` and ``pipe:`` URLs, and lists of
any of these. The order is the order given, each directory or glob sorted, so the same
arguments always give the same list.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any, List, Mapping, Optional, Sequence, Union

import braceexpand

from ..errors import SourceError, redact
from ..io.local import local_path

log = logging.getLogger(__name__)

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
REMOTE_SCHEMES = ("s3://", "http://", "https://", "pipe:")


def is_remote(url: str) -> bool:
    """True for URLs that are not local files."""
    return url.startswith(REMOTE_SCHEMES)


def is_shard_name(name: str) -> bool:
    """True for file or object names that look like shards (``.tar``, ``.tar.gz``, ``.tgz``)."""
    return name.endswith(SHARD_SUFFIXES)


def _expand_local(pattern: str) -> List[str]:
    path = local_path(pattern)
    if os.path.isdir(path):
        found = sorted(
            os.path.join(root, name)
            for root, _dirs, files in os.walk(path)
            for name in files
            if is_shard_name(name)
        )
        if not found:
            raise SourceError("directory holds no .tar/.tar.gz/.tgz shards", url=path)
        return found
    if glob.has_magic(path):
        found = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        if not found:
            raise SourceError("glob matched no files", url=path)
        return found
    if not os.path.exists(path):
        raise SourceError("no such shard file", url=path, hint="check the path, or quote a glob so the shell does not expand it")
    return [path]


def _list_s3(prefix: str, storage_options: Mapping[str, Any]) -> List[str]:
    from ..io.remote import list_s3_keys  # network clients only when needed

    urls = [url for url in list_s3_keys(prefix, storage_options) if is_shard_name(url)]
    if not urls:
        raise SourceError("S3 prefix holds no .tar/.tar.gz/.tgz objects", url=prefix)
    return urls


def expand_sources(sources: Union[str, Sequence[str]], storage_options: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Expand sources into the ordered list of shard URLs, each shard once (see :func:`deduplicated`).

    ``storage_options`` configure remote listing (``s3://bucket/prefix/``): endpoint, profile.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    urls: List[str] = []
    for source in sources:
        source = os.fspath(source)
        for item in braceexpand.braceexpand(source) if "{" in source and not source.startswith("pipe:") else [source]:
            if is_remote(item):
                if item.startswith("s3://") and item.endswith("/"):
                    urls.extend(_list_s3(item, storage_options or {}))
                else:
                    urls.append(item)
            else:
                urls.extend(_expand_local(item))
    if not urls:
        raise SourceError("the source list is empty", hint="pass shard paths, globs, brace patterns or URLs")
    return deduplicated(urls)


def _file_identity(url: str):
    """(device, inode) of a local shard: one ``stat`` (a real path costs one per path component)."""
    try:
        st = os.stat(local_path(url))
        return (st.st_dev, st.st_ino)
    except OSError:
        return os.path.abspath(local_path(url))  # missing: reported when it is opened


def deduplicated(urls: Sequence[str]) -> List[str]:
    """``urls`` with every shard once: a local shard by its real path (a symlink to another
    listed shard, or one file matched by two globs or directories), a remote one by its URL.
    The first occurrence is kept; the others are dropped with a warning. A copy of a shard
    under another path (``backup/``) is another file, not a duplicate."""
    first: dict = {}
    out: List[str] = []
    dropped = []
    for url in urls:
        ident = url if is_remote(url) else _file_identity(url)
        if ident in first:
            dropped.append((url, first[ident]))
            continue
        first[ident] = url
        out.append(url)
    if dropped:
        shown = "; ".join(f"{redact(url)} is {redact(kept)}" for url, kept in dropped[:5])
        log.warning("%d shards listed more than once (a symlink, overlapping globs or directories) are read once: %s%s",
                    len(dropped), shown, " …" if len(dropped) > 5 else "")
    return out
