"""Byte streams: open one shard as a sequential binary stream, the top of the I/O chain.

Local files are opened with a large buffer; ``.tar.gz``/``.tgz`` (any stream starting with the
gzip magic) are decompressed on the fly; ``pipe:CMD`` runs a shell command and reads its
stdout; ``s3://`` and ``http(s)://`` are served by :mod:`.remote` (through :mod:`.readahead`
for a worker's sequence of shards).
"""

from __future__ import annotations

from typing import Any, BinaryIO, List, Mapping, Optional, Sequence

from ..errors import SourceError
from .counters import IOCounters
from .gunzip import decompressed
from .local import open_file, open_pipe
from .readahead import ReadAhead
from .remote import is_fetched, open_remote


def open_raw(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None) -> BinaryIO:
    """Open ``url`` as a buffered binary stream positioned at byte ``offset`` (not decompressed)."""
    if is_fetched(url):
        return open_remote(url, offset, options or {})
    if url.startswith("pipe:"):
        if offset:
            raise SourceError("pipe: sources cannot be opened at an offset", url=url)
        return open_pipe(url)
    return open_file(url, offset)


def open_shard(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None) -> BinaryIO:
    """Open a shard for tar parsing: decompressed if gzip, positioned at ``offset`` of the tar.

    Offsets are positions in the *uncompressed* tar. A shard named ``.tar`` is opened directly
    at the offset (a seek, or a ranged GET for remote data); a gzip shard is read and discarded
    up to it, since gzip has no random access.
    """
    if offset and not url.endswith((".gz", ".tgz")):
        return open_raw(url, offset, options)
    return decompressed(open_raw(url, 0, options), url, offset)


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
        if not is_fetched(url):
            return open_shard(url, 0, self.options)
        if self._ahead is None:
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
