"""Byte streams: open one shard as a sequential binary stream, the top of the I/O chain.

Local files are opened with a large buffer; ``.tar.gz``/``.tgz`` (any stream starting with the
gzip magic) are decompressed on the fly; ``pipe:CMD`` runs a shell command and reads its
stdout; objects of the stores read by ranged requests (``s3://``, ``gs://``, ``az://``, ``hf://``,
``http(s)://``) are served by :mod:`.remote`, as parallel ranged parts (:mod:`.parts`,
:mod:`.readahead`).

A shard may be opened as a byte range ``[start, end)`` (``end`` None: to the end). Positions are
in the *tar*: for gzip shards, in the decompressed bytes (read from the start, decompressed,
skipped up to ``start``, stopped at ``end``); for a plain ``.tar``, a seek or ranged GETs that
never fetch a byte past ``end``.
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO, List, Mapping, Optional, Sequence, Tuple

from .counters import IOCounters
from .gunzip import decompressed, file_is_gzip
from .local import CHUNK, END_OF_ARCHIVE, copy_tail, open_file, open_range
from .parts import PartFetcher
from .readahead import ReadAhead
from .remote import is_ranged, open_remote
from .stores import store_class, store_for


def chunk_bytes(options: Optional[Mapping[str, Any]]) -> int:
    """Bytes per read of a local file and of the tar parser's buffer (``chunk_bytes``; a worker
    reading many columns at once gets a share of it, :func:`~.options.shared_budget`)."""
    return int((options or {}).get("chunk_bytes", CHUNK))


def open_raw(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None) -> BinaryIO:
    """Open ``url`` as a buffered binary stream positioned at byte ``offset`` (not decompressed;
    one GET for remote data)."""
    store = store_class(url)
    if store.ranged:
        return open_remote(url, offset, options or {})
    if store.local:
        return open_file(url, offset, chunk_bytes(options))
    answer = store_for(url, options).open_range(url, offset, None, None)  # a stream store (pipe:)
    return io.BufferedReader(answer.body, CHUNK)


def is_gzip_name(url: str) -> bool:
    """True for shard names whose byte ranges are positions in the decompressed tar."""
    return url.endswith((".gz", ".tgz"))


class _Limited(io.RawIOBase):
    """A part as a tar of its own: the bytes of ``stream`` up to absolute position ``end``
    (seekable if ``stream`` is), then an end-of-archive marker when all of them came (a stream
    that ends before ``end`` stays a truncated tar); closing it closes ``stream``."""

    def __init__(self, stream: BinaryIO, end: int, pos: int) -> None:
        self._stream = stream
        self._end = end
        self._pos = pos
        self._tail = memoryview(END_OF_ARCHIVE)
        self._readinto = getattr(stream, "readinto1", None) or stream.readinto

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._stream.seekable()

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self._pos + offset if whence == 1 else self._end + offset
        self._pos = self._stream.seek(min(target, self._end))
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self._end - self._pos)
        if n <= 0:
            n, self._tail = copy_tail(view, self._tail)
            return n
        got = self._readinto(view[:n])  # (straight into the caller's buffer: no bytes made, none copied)
        if not got:  # the shard ended before the part did: no marker, the parser reports it
            self._tail = self._tail[:0]
            return 0
        self._pos += got
        return got

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


def _limited(stream: BinaryIO, start: int, end: Optional[int], chunk: int = CHUNK) -> BinaryIO:
    if end is None:
        return stream
    try:
        pos = stream.tell() if stream.seekable() else start
    except (OSError, ValueError):
        pos = start
    return io.BufferedReader(_Limited(stream, max(end, start), pos), chunk)  # type: ignore[arg-type]


class _Owned(io.BufferedReader):
    """A stream that stops its own read-ahead when closed."""

    def __init__(self, ahead: ReadAhead) -> None:
        self._ahead = ahead
        opened = ahead.open(0)
        raw = opened.detach() if isinstance(opened, io.BufferedReader) else opened
        super().__init__(raw, CHUNK)  # type: ignore[arg-type]

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._ahead.close()


def open_shard(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None,
               end: Optional[int] = None) -> BinaryIO:
    """Open a shard, or a part of it, for tar parsing: bytes ``[offset, end)`` of the tar,
    decompressed if gzip; with ``end``, a part as a tar of its own: an end-of-archive marker
    follows its bytes when all of them came. The one way a worker opens what it reads.

    Offsets are positions in the *uncompressed* tar. A shard named ``.tar`` is opened directly
    at the offset (a seek, or parallel ranged GETs for remote data, none past ``end``); a gzip
    shard is read and discarded up to it, since gzip has no random access. Compression is told by
    content for local files (a peek at the first bytes); remote gzip content under a ``.tar`` name
    gets no offsets from a scan (:func:`dalistream.manifest.scan.scan_shard`), so it is read from
    its start.
    """
    if is_gzip_name(url):
        stream = decompressed(open_raw(url, 0, options), url, offset)
    elif is_ranged(url):
        return _limited(_Owned(ReadAhead([url], options, None, [(offset, end)])), offset, end, chunk_bytes(options))
    else:
        if maps_parts(url):  # a local part or shard: positional reads or mapped views, no buffers
            part = open_range(url, offset, end)
            if not part.is_gzip():
                return part
            part.close()  # gzip content under a .tar name: read through the decompressor below
        stream = open_raw(url, 0, options)
        if offset and not file_is_gzip(stream):  # (gzip content under a .tar name: positions are in the tar)
            stream.seek(offset)
        else:
            stream = decompressed(stream, url, offset)
    return _limited(stream, offset, end, chunk_bytes(options))


def maps_parts(url: str) -> bool:
    """Whether :func:`open_shard` opens ``url``'s parts as local file ranges, whose runs can be
    views of the file's mapping (:meth:`~.local.FileRange.view`): a local shard not named as gzip
    (gzip content under a ``.tar`` name is told only once opened, and read through the decompressor)."""
    return not is_gzip_name(url) and store_class(url).local


class ShardSequence:
    """Opens one worker's shards in order; the hook where remote read-ahead lives.

    ``open(i)`` returns the (decompressed) stream of ``urls[i]``; with ``ranges`` (one
    ``(start, end_or_None)`` per url) the stream of bytes ``[start, end)`` of that shard's tar
    (see :func:`open_shard`). Local and ``pipe:`` shards are simply opened. ``s3://`` and
    ``http(s)://`` shards are fetched by one :class:`ReadAhead` for the whole list: parallel
    ranged GETs in list order (``parts_in_flight`` of ``part_bytes``), running ahead of the
    reader by at most ``options["read_ahead_bytes"]`` (default 64 MiB) across shard boundaries
    and never past a range's end. Opening shards in order is the fast path; opening any other
    index restarts the fetcher there. ``counters`` (an :class:`IOCounters`) receives this
    sequence's requests, retries, resumes and parts. ``fetcher``: a worker's
    :class:`~.parts.PartFetcher`, shared by its columns' sequences, which fetches this one's remote
    shards from now on, with theirs (see :mod:`.readahead`).
    """

    def __init__(self, urls: Sequence[str], options: Optional[Mapping[str, Any]] = None,
                 counters: Optional[IOCounters] = None,
                 ranges: Optional[Sequence[Tuple[int, Optional[int]]]] = None,
                 fetcher: Optional[PartFetcher] = None) -> None:
        self.urls: List[str] = list(urls)
        self.options = dict(options or {})
        self.counters = counters
        if ranges is not None and len(ranges) != len(self.urls):
            raise ValueError(f"{len(ranges)} ranges for {len(self.urls)} shards")
        self.ranges = [(int(s), None if e is None else int(e)) for s, e in ranges] if ranges is not None else None
        self.chunk = chunk_bytes(self.options)
        self._ahead: Optional[ReadAhead] = None
        self._fetcher = fetcher
        if fetcher is not None and any(is_ranged(u) for u in self.urls):
            self._read_ahead()

    def _read_ahead(self) -> ReadAhead:
        if self._ahead is None:
            fetched = None if self.ranges is None else [(0, None) if is_gzip_name(u) else r
                                                        for u, r in zip(self.urls, self.ranges)]
            self._ahead = ReadAhead(self.urls, self.options, self.counters, fetched, self._fetcher)
        return self._ahead

    def open(self, i: int) -> BinaryIO:
        """The stream of ``urls[i]`` (its range), decompressed if gzip (a :class:`SourceError` if
        it cannot be opened)."""
        url = self.urls[i]
        start, end = self.ranges[i] if self.ranges is not None else (0, None)
        if not is_ranged(url):
            return open_shard(url, start, self.options, end)
        raw = self._read_ahead().open(i)
        # (a worker's many columns share ``chunk_bytes``: each part's buffer is its share)
        return _limited(decompressed(raw, url, start) if is_gzip_name(url) else decompressed(raw, url), start, end,
                        self.chunk)

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
