"""The storage protocol every store implements, and what it returns.

A store is one URL scheme's way to list a prefix, state an object (its size and a version token:
an ETag, a generation, or a local file's ``(mtime_ns, inode)``), open a byte range of it and write
one. Everything above it (globs and folders, manifests, the scan cache, parallel ranged parts,
read-ahead, retries, version pinning, stall warnings and give-up bounds, redaction, counters) is
written once, in :mod:`dalistream.io` and :mod:`dalistream.sources`, for every store.

A store raises :class:`~dalistream.errors.SourceError` (named by ``reason``: ``missing``,
``denied``, ``no_credentials``, ``changed``) or, for a failure worth another attempt, lets its
client's exception out for :meth:`Store.classify` to map; it never retries itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, BinaryIO, List, Optional, Protocol, Union, runtime_checkable

from ...errors import SourceError


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its URL, its size in bytes (``None`` if unknown) and its version token
    (``None`` where the store has none): what changes when the object is rewritten."""

    url: str
    size: Optional[int]
    version: Optional[str]


@dataclass
class Answer:
    """An opened byte range: ``body`` (``read(n)`` and ``close()``), the whole object's ``size``
    (``None`` if the server does not say), its ``version``, and ``ranged``: False when the server
    ignored the range and sent the whole object from byte 0 (the bytes before the range were
    then read and dropped by the store)."""

    body: Any
    size: Optional[int]
    version: Optional[str]
    ranged: bool = True


class Empty:
    """The body of a range opened exactly at the end of an object (or of an empty object)."""

    def read(self, n: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        pass


Data = Union[bytes, str]  # bytes, or the path of a local file to upload


@runtime_checkable
class Store(Protocol):
    """What a store module provides (one instance per process, scheme and options).

    ``local``: objects are files on this machine (read by positional reads, no read-ahead);
    ``ranged``: byte ranges are fetched by requests (read-ahead, parallel parts and resume
    above apply); ``credential_source`` names where the credentials come from, for errors.
    """

    scheme: str
    local: bool
    ranged: bool
    credential_source: str
    environment: "tuple[str, ...]"

    def list(self, prefix: str) -> List[ObjectInfo]:
        """Every object whose URL starts with ``prefix`` (recursively), sorted by URL."""

    def stat(self, url: str) -> ObjectInfo:
        """The object's size and version (a :class:`SourceError` ``missing`` if it is not there)."""

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        """Bytes ``[start, end)`` (``end`` None: to the end); with ``version``, a changed object is
        a :class:`SourceError` with reason ``changed``."""

    def write(self, url: str, data: Data) -> None:
        """Store ``data`` (bytes, or a local file's path) as the object ``url``, whole or not at all."""

    def delete(self, url: str) -> None:
        """Remove the object ``url``; none there is no error (``dalistream write --overwrite``)."""

    def classify(self, error: BaseException, url: str, first: bool, what: str) -> Optional[Exception]:
        """The client's exception as a :class:`SourceError` (fatal) or ``Retry``; ``None``: not
        this client's (the common mapping of connection errors applies)."""


class ObjectStore:
    """What most stores share: remote, read by ranged requests, listable, their options kept,
    no client exceptions of their own to map. A store module subclasses it and says what differs."""

    scheme = ""
    local = False
    ranged = True
    listable = True
    writable = True
    credential_source = ""
    environment: "tuple[str, ...]" = ()  # the variables its client reads when it is made

    def __init__(self, opts: Any) -> None:
        self.opts = opts

    def classify(self, error: BaseException, url: str, first: bool, what: str) -> Optional[Exception]:
        return None


def split_bucket(url: str) -> "tuple[str, str]":
    """``("bucket", "key")`` of ``SCHEME://bucket/key``."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise SourceError(f"{scheme}:// URL has no bucket", url=url, hint=f"write {scheme}://bucket/key")
    return bucket, key


def read_all(body: Any) -> bytes:
    """Everything left in ``body``."""
    chunks = []
    while True:
        data = body.read(1 << 20)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def data_bytes(data: Data) -> bytes:
    """``data`` as bytes (a path is read)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    with open(data, "rb") as f:
        return f.read()


def data_file(data: Data) -> BinaryIO:
    """``data`` as a readable binary file (a path is opened; bytes wrapped)."""
    import io

    if isinstance(data, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(data))
    return open(data, "rb")


def range_header(start: int, end: Optional[int]) -> Optional[str]:
    """The HTTP ``Range`` value for ``[start, end)`` (None: the whole object)."""
    if end is not None:
        return f"bytes={start}-{end - 1}"
    return f"bytes={start}-" if start else None


def total_size(content_range: Optional[str], start: int, length: Optional[str]) -> Optional[int]:
    """The object's size from a ``Content-Range`` answer, else from where the range started and
    its ``Content-Length``."""
    total = (content_range or "").rpartition("/")[2]
    if total.isdigit():
        return int(total)
    return start + int(length) if length and length.isdigit() else None


def no_write(scheme: str, url: str) -> SourceError:
    """The error of a store that cannot be written."""
    return SourceError(f"{scheme} URLs cannot be written", url=url,
                       hint="write to a local folder or an object store (s3://, gs://, az://, hf://)")


_MAGIC = re.compile(r"[*?[]")


def has_magic(text: str) -> bool:
    """True when ``text`` holds glob characters."""
    return _MAGIC.search(text) is not None


def glob_regex(pattern: str) -> str:
    """A glob as a regular expression over whole URLs: ``*`` and ``?`` stay within one path
    segment, ``**`` crosses them, ``[...]`` is a class (``[!...]`` negated)."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if pattern.startswith("/", i):  # "**/": any number of folders, none included
                    out.append("(?:[^\n]*/)?")
                    i += 1
                else:
                    out.append("[^\n]*")
                continue
            out.append("[^/\n]*")
        elif c == "?":
            out.append("[^/\n]")
        elif c == "[":
            close = pattern.find("]", i + 2 if pattern.startswith("[!", i) else i + 1)
            if close < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:close]
                body = "^" + body[1:] if body.startswith("!") else body
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = close
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def match_glob(pattern: str, urls: List[str]) -> List[str]:
    """The ``urls`` a glob matches, in their order: one regular expression run over all of them
    at once (no Python per URL, which counts at 500,000 objects)."""
    if not urls:
        return []
    text = "\n".join(urls)
    if text.count("\n") != len(urls) - 1:
        raise SourceError("an object name holds a line break", url=next(u for u in urls if "\n" in u))
    return re.findall("(?m)^" + glob_regex(pattern) + "$", text)


def glob_prefix(pattern: str) -> str:
    """The part of a glob before its first glob character: the prefix to list."""
    magic = _MAGIC.search(pattern)
    return pattern[:magic.start()] if magic else pattern
