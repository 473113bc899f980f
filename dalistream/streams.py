"""Byte streams: open one shard as a sequential binary stream.

Local files are opened with a large buffer; ``.tar.gz``/``.tgz`` (any stream starting with the
gzip magic) are decompressed on the fly; ``pipe:CMD`` runs a shell command and reads its
stdout (as in the webdataset library); ``s3://`` and ``http(s)://`` are served by
:mod:`dalistream.remote`, imported only when such a URL is opened.
"""

from __future__ import annotations

import io
import subprocess
import threading
import zlib
from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Sequence

from .errors import SourceError

CHUNK = 1 << 20
FETCHED = ("s3://", "http://", "https://")  # served by dalistream.remote, with read-ahead


class IOCounters:
    """Counters of remote I/O: ``requests`` (GETs started), ``retries`` (requests repeated after
    throttling, 5xx answers or connection failures), ``resumes`` (ranged GETs that continued a
    transfer cut mid-object), ``resumed_bytes`` (bytes those resumed GETs delivered) and
    ``bytes`` (bytes received). Thread-safe; :meth:`as_dict` gives a snapshot."""

    FIELDS = ("requests", "retries", "resumes", "resumed_bytes", "bytes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Dict[str, int] = dict.fromkeys(self.FIELDS, 0)

    def add(self, **amounts: int) -> None:
        """Add to some counters, e.g. ``add(retries=1)``."""
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def as_dict(self) -> Dict[str, int]:
        """A snapshot of all counters."""
        with self._lock:
            return dict(self._values)

    def __getattr__(self, name: str) -> int:
        if name in IOCounters.FIELDS:
            return self.as_dict()[name]
        raise AttributeError(name)

    def __getstate__(self) -> dict:
        return {"values": self.as_dict()}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self._values.update(state["values"])

    def __repr__(self) -> str:
        return "IOCounters(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"


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
    if url.startswith(FETCHED):
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
        raise SourceError("shard file does not exist", url=url, reason="missing",
                          hint="check the path and that every node sees the same files") from None
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
    return decompressed(open_raw(url, 0, options), url, offset)


def decompressed(stream: BinaryIO, url: str, offset: int = 0) -> BinaryIO:
    """``stream`` (raw shard bytes from the start) decompressed if gzip, then advanced to
    ``offset`` of the tar."""
    try:
        if is_gzip(stream):
            stream = _Gunzipped(stream)
        if offset:
            _discard(stream, offset)
    except OSError as e:
        stream.close()
        raise SourceError(f"cannot read shard: {e}", url=url) from None
    except BaseException:
        stream.close()
        raise
    return stream


class _Gunzipped(io.BufferedReader):
    """Decompressed view of a gzip stream; closing it closes the compressed stream too.

    Every byte that decompresses is delivered before a cut or corrupt stream raises
    (``EOFError``/``zlib.error``, which the tar reader reports as a damaged shard): Python's
    ``GzipFile`` drops what it decompressed in a read that then meets the end of a truncated file
    (up to its buffer size), so a ``.tar.gz`` cut at 800 kB would deliver no sample at all."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        super().__init__(_GunzipRaw(source), CHUNK)  # type: ignore[arg-type]

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._source.close()


class _GunzipRaw(io.RawIOBase):
    """Streaming gzip decoder (concatenated members too) as a raw stream."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._input = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        while not self._done:
            if self._zlib.eof:  # end of one gzip member: another may follow (padding zeros are ignored)
                rest = self._zlib.unused_data.lstrip(b"\0")  # (at the end, the unconsumed tail is the same)
                if not rest:
                    rest = self._source.read(CHUNK).lstrip(b"\0")
                    if not rest:
                        self._done = True
                        break
                self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._input = rest
            if not self._input:
                self._input = self._source.read(CHUNK)
                if not self._input:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            out = self._zlib.decompress(self._input, len(view))
            self._input = self._zlib.unconsumed_tail
            if out:
                view[:len(out)] = out
                return len(out)
        return 0


def _discard(stream: BinaryIO, n: int) -> None:
    while n > 0:
        got = stream.read(min(n, CHUNK))
        if not got:
            return
        n -= len(got)


class ShardSequence:
    """Opens one worker's shards in order; the hook where remote read-ahead lives.

    ``open(i)`` returns the (decompressed) stream of ``urls[i]``. Local and ``pipe:`` shards are
    simply opened. ``s3://`` and ``http(s)://`` shards are fetched by one background thread, one
    GET per shard in list order, running ahead of the reader by at most
    ``options["read_ahead_bytes"]`` (default 64 MiB) across shard boundaries, so the next shard's
    first-byte latency is hidden while the current one is parsed. Opening shards in order is
    the fast path; opening any other index restarts the fetcher there. ``counters`` (an
    :class:`IOCounters`) receives this sequence's retries and resumes.
    """

    def __init__(self, urls: Sequence[str], options: Optional[Mapping[str, Any]] = None,
                 counters: Optional[IOCounters] = None) -> None:
        self.urls: List[str] = list(urls)
        self.options = dict(options or {})
        self.counters = counters
        self._ahead = None

    def open(self, i: int) -> BinaryIO:
        """The stream of ``urls[i]``, decompressed if gzip (a :class:`SourceError` if it cannot be opened)."""
        url = self.urls[i]
        if not url.startswith(FETCHED):
            return open_shard(url, 0, self.options)
        if self._ahead is None:
            from .readahead import ReadAhead

            self._ahead = ReadAhead(self.urls, self.options, self.counters)
        return decompressed(self._ahead.open(i), url)

    def close(self) -> None:
        """Stop any background fetches."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()

    def __del__(self) -> None:  # a generator dropped mid-epoch must not leave a fetcher running
        try:
            self.close()
        except Exception:
            pass
