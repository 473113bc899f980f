"""Stores: one module per URL scheme behind one protocol (:mod:`.base`), found by scheme here.

============  ==========================================  ==============================
scheme        what                                        extra to install
============  ==========================================  ==============================
(a path)      local files; ``file://`` the same           —
``s3://``     Amazon S3 and S3-compatible stores (boto3)  —
``gs://``     Google Cloud Storage                        ``dalistream[gcs]``
``az://``     Azure Blob Storage (``abfs://`` the same)   ``dalistream[azure]``
``hf://``     Hugging Face Hub data sets                  ``dalistream[hf]``
``http(s)``   any web server (read only, no listing)      —
``pipe:``     a shell command's output (read only)        —
============  ==========================================  ==============================

Adding a store is one module and one entry in :data:`SCHEMES`. A store is created lazily, once
per process, scheme and options (DALI workers are spawned processes); its client library is
imported only then, and a missing one is a :class:`~dalistream.errors.ConfigError` naming the
extra to install.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ...errors import ConfigError, redact
from ..options import RemoteOptions, remote_options
from .base import Answer, ObjectInfo, Store

#: scheme -> (module under dalistream.io.stores, class name)
SCHEMES: Dict[str, Tuple[str, str]] = {
    "file": ("local", "LocalStore"),
    "s3": ("s3", "S3Store"),
    "gs": ("gcs", "GCSStore"),
    "az": ("azure", "AzureStore"),
    "abfs": ("azure", "AzureStore"),
    "hf": ("hf", "HubStore"),
    "http": ("http", "HTTPStore"),
    "https": ("http", "HTTPStore"),
    "pipe": ("pipe", "PipeStore"),
}

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_stores: Dict[tuple, Any] = {}
_lock = threading.Lock()


def scheme_of(url: str) -> str:
    """The registry scheme of ``url``: ``s3``, ``gs``, …, ``pipe``, or ``file`` for a path."""
    if url.startswith("pipe:"):
        return "pipe"
    match = _SCHEME.match(url)
    return match.group(1).lower() if match else "file"


def supported() -> str:
    """The supported URL forms, for messages."""
    return ", ".join(f"{s}://" if s != "pipe" else "pipe:" for s in SCHEMES) + " and local paths"


def store_class(url: str) -> type:
    """The store class serving ``url`` (no client created): a :class:`ConfigError` listing the
    supported schemes for any other."""
    scheme = scheme_of(url)
    cls = _classes.get(scheme)
    if cls is None:
        entry = SCHEMES.get(scheme)
        if entry is None:
            raise ConfigError(f"unknown URL scheme {scheme + '://'!r}", url=redact(url),
                              hint=f"supported: {supported()}")
        cls = _classes[scheme] = getattr(importlib.import_module(f"{__name__}.{entry[0]}"), entry[1])
    return cls


_classes: Dict[str, type] = {}


def schemes_in(urls: Sequence[str]) -> Dict[str, str]:
    """``{scheme: first URL of it}`` over ``urls`` (an unknown scheme is a :class:`ConfigError`),
    by substring searches over all of them at once (no Python per URL: a list of 500,000 paths
    costs milliseconds)."""
    if not urls:
        return {}
    text = "\n" + "\n".join(urls)
    if "://" not in text and "\npipe:" not in text:
        return {"file": urls[0]}  # paths only (the common case: two scans)
    found: Dict[str, str] = {}
    lines = marks = 0  # lines that start with a known scheme; the "://" of those
    for scheme in SCHEMES:
        mark = "\npipe:" if scheme == "pipe" else f"\n{scheme}://"
        at = text.find(mark)
        if at >= 0:
            end = text.find("\n", at + 1)
            found[scheme] = text[at + 1:end if end >= 0 else len(text)]
            n = text.count(mark)
            lines += n
            marks += 0 if scheme == "pipe" else n
    if text.count("://") != marks:  # an unknown scheme, or a URL inside a path or a command: URL by URL
        for url in urls:
            store_class(url)  # raises for an unknown scheme
    if lines < len(urls):  # the others are paths
        found.setdefault("file", next(u for u in urls if scheme_of(u) == "file"))
    return found


def check_schemes(urls: Sequence[str]) -> Dict[str, str]:
    """Raise for the first URL no store serves (before any worker starts); else
    :func:`schemes_in`."""
    found = schemes_in(urls)
    for url in found.values():
        store_class(url)
    return found


def store_for(url: str, options: Optional[Mapping[str, Any]] = None) -> Store:
    """The store serving ``url`` with ``options`` (one per process, scheme and options)."""
    cls = store_class(url)
    opts = remote_options(options)
    # (a client reads its variables when it is made: another value is another store)
    key = (cls, os.getpid(), opts, tuple(os.environ.get(name) for name in cls.environment))
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = cls(opts)
        return store


def is_local(url: str) -> bool:
    """True for a local file (a path or ``file://``)."""
    return store_class(url).local


def canonical(url: str) -> str:
    """``url`` as the same object at any version its URL may name (the Hub's ``@revision`` left
    out); most stores: ``url`` itself."""
    fn = getattr(store_class(url), "canonical", None)
    return fn(url) if fn is not None else url


def cache_name(url: str) -> str:
    """The name of ``url``'s object in the node-local byte cache: the same object at any version
    its URL may name (:func:`canonical`) and however the URL is signed (a store's own
    ``cache_name``: a web server's URL without user info and signature parameters)."""
    fn = getattr(store_class(url), "cache_name", None)
    return fn(url) if fn is not None else canonical(url)


def check_writable(url: str) -> None:
    """The store's own error for ``url`` when its store cannot be written (before anything is
    listed or written there)."""
    cls = store_class(url)
    if not getattr(cls, "writable", True):
        cls(remote_options(None)).write(url, b"")  # raises, naming the stores that can be written


def any_ranged(urls: Sequence[str]) -> bool:
    """True when some of ``urls`` are read by ranged requests (without Python per URL)."""
    return any(store_class(u).ranged for u in schemes_in(urls).values())


def any_remote(urls: Sequence[str]) -> bool:
    """True when some of ``urls`` are not local files (without Python per URL)."""
    return any(not store_class(u).local for u in schemes_in(urls).values())


def is_ranged(url: str) -> bool:
    """True for objects read by ranged requests (object stores and HTTP): the read-ahead, parallel
    parts and resumes of :mod:`dalistream.io` apply."""
    return store_class(url).ranged


def missing_extra(package: str, extra: str) -> ConfigError:
    """The error for a store whose client library is not installed."""
    return ConfigError(f"this store needs the {package!r} package, which is not installed",
                       hint=f'pip install "dalistream[{extra}]"')


__all__ = ["Answer", "ObjectInfo", "any_ranged", "any_remote", "cache_name", "canonical", "check_writable", "RemoteOptions", "SCHEMES", "Store", "check_schemes", "is_local", "is_ranged",
           "missing_extra", "scheme_of", "schemes_in", "store_class", "store_for", "supported"]
