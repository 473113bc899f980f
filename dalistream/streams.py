"""Byte streams: open one shard as a sequential binary stream.

Local files are opened with a large buffer; ``.tar.gz``/``.tgz`` (any stream starting with the
gzip magic) are decompressed on the fly; ``pipe:CMD`` runs a shell command and reads its
stdout (as in the webdataset library); ``s3://`` and ``http(s)://`` are served by
:mod:`dalistream.remote`, imported only when such a URL is opened.
"""

from __future__ import annotations

import gzip
import io
import subprocess
from typing import Any, BinaryIO, Mapping, Optional, Sequence

from .errors import SourceError

CHUNK = 1 << 20


class PipeStream(io.RawIOBase):
    """stdout of a shell command; a non-zero exit at the end is an error naming the URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._proc = subprocess.Popen(url[len("pipe:"):], shell=True, stdout=subprocess.PIPE, bufsize=CHUNK)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._proc.stdout.readinto(buffer)
        if n == 0:
            code = self._proc.wait()
            if code != 0:
                raise SourceError(f"pipe command exited with status {code}", url=self.url)
        return n

    def close(self) -> None:
        if not self.closed and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        super().close()


def open_raw(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None) -> BinaryIO:
    """Open ``url`` as a buffered binary stream positioned at byte ``offset`` (not decompressed)."""
    options = options or {}
    if url.startswith(("s3://", "http://", "https://")):
        from .remote import open_remote

        return open_remote(url, offset, options)
    if url.startswith("pipe:"):
        if offset:
            raise SourceError("pipe: sources cannot be opened at an offset", url=url)
        return io.BufferedReader(PipeStream(url), CHUNK)
    path = url[len("file://"):] if url.startswith("file://") else url
    try:
        f = open(path, "rb", buffering=CHUNK)
    except FileNotFoundError:
        raise SourceError("shard file does not exist", url=url, hint="check the path and that every node sees the same files") from None
    except OSError as e:
        raise SourceError(f"cannot open shard: {e.strerror}", url=url) from None
    if offset:
        f.seek(offset)
    return f


def is_gzip(stream: BinaryIO) -> bool:
    """True if the stream starts with the gzip magic (peeked, not consumed)."""
    return stream.peek(2)[:2] == b"\x1f\x8b"


def open_shard(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None) -> BinaryIO:
    """Open a shard for tar parsing: decompressed if gzip, positioned at ``offset`` of the tar.

    Offsets are positions in the *uncompressed* tar. A shard named ``.tar`` is opened directly
    at the offset (a seek, or a ranged GET for remote data); a gzip shard is read and discarded
    up to it, since gzip has no random access.
    """
    if offset and not url.endswith((".gz", ".tgz")):
        return open_raw(url, offset, options)
    stream = open_raw(url, 0, options)
    try:
        if is_gzip(stream):
            stream = io.BufferedReader(gzip.GzipFile(fileobj=stream, mode="rb"), CHUNK)  # type: ignore[arg-type]
        if offset:
            _discard(stream, offset)
    except OSError as e:
        stream.close()
        raise SourceError(f"cannot read shard: {e}", url=url) from None
    return stream


def _discard(stream: BinaryIO, n: int) -> None:
    while n > 0:
        got = stream.read(min(n, CHUNK))
        if not got:
            return
        n -= len(got)


class ShardSequence:
    """Opens one worker's shards in order; the hook where remote read-ahead lives.

    ``open(i)`` returns the stream of ``urls[i]``. Local shards are simply opened; remote
    backends may start fetching ``urls[i + 1]`` in the background while ``urls[i]`` is parsed.
    """

    def __init__(self, urls: Sequence[str], options: Optional[Mapping[str, Any]] = None) -> None:
        self.urls = list(urls)
        self.options = dict(options or {})

    def open(self, i: int) -> BinaryIO:
        return open_shard(self.urls[i], 0, self.options)

    def close(self) -> None:
        """Stop any background fetches."""
