"""Remote byte streams: ``s3://bucket/key`` (boto3) and ``http(s)://`` (urllib3).

One GET per shard, read sequentially in large chunks. A transfer cut mid-object continues with
a ranged GET from the exact byte offset (``If-Match`` on the first answer's ETag, so two
versions of an object are never spliced). Throttling (SlowDown, 429, 503) and other 5xx
answers are retried with exponential backoff and full jitter, at most ``max_attempts`` times
in a row without progress, then a :class:`SourceError`. Missing objects, 403s, unknown buckets,
DNS failures and refused connections fail at once with a :class:`SourceError` naming the URL
(credentials redacted; server messages, which may quote request details, are never copied).

S3 uses boto3's normal credential chain and configuration (profiles, ``AWS_ENDPOINT_URL``,
``AWS_REGION``, instance roles); ``storage_options`` may name ``endpoint_url``, ``profile``,
``region``, ``anon`` (unsigned requests) or explicit keys. Clients are created lazily, once per
process and configuration (DALI workers are spawned processes), never at import time.
"""

from __future__ import annotations

import io
import random
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import SourceError
from .clients import http_parts, http_pool, s3_client, split_s3
from .counters import IOCounters
from .options import RemoteOptions, remote_options
from .retry import Retry, call_with_retries, classify, status_error

FETCHED = ("s3://", "http://", "https://")  # remote schemes served here (``pipe:`` is local)
TOTALS = IOCounters()  # every remote request of this process (see IOCounters)


def is_fetched(url: str) -> bool:
    """True for ``s3://`` and ``http(s)://`` URLs (read here, with read-ahead and resume)."""
    return url.startswith(FETCHED)


# -- one GET -----------------------------------------------------------------------------------

class _Empty:
    def read(self, n: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        pass


Answer = Tuple[Any, Optional[int], Optional[str], bool]  # body, object size, ETag, range honoured


def _range(offset: int, end: Optional[int]) -> Optional[str]:
    if end is not None:
        return f"bytes={offset}-{end - 1}"
    return f"bytes={offset}-" if offset else None


def _s3_get(url: str, opts: RemoteOptions, offset: int, etag: Optional[str], end: Optional[int]) -> Answer:
    from botocore.exceptions import ClientError

    bucket, key = split_s3(url)
    args: Dict[str, Any] = {"Bucket": bucket, "Key": key}
    wanted = _range(offset, end)
    if wanted:
        args["Range"] = wanted
    if etag:
        args["IfMatch"] = etag
    try:
        answer = s3_client(opts).get_object(**args)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "InvalidRange" and wanted:
            return _Empty(), offset, etag, True  # opened exactly at the end (or an empty object)
        raise
    total = answer.get("ContentRange", "").rpartition("/")[2]
    size = int(total) if total.isdigit() else offset + int(answer["ContentLength"])
    return answer["Body"], size, answer.get("ETag"), True


def _http_get(url: str, opts: RemoteOptions, offset: int, etag: Optional[str], end: Optional[int]) -> Answer:
    plain, headers = http_parts(url)
    wanted = _range(offset, end)
    if wanted:
        headers["Range"] = wanted
        if etag:
            headers["If-Range"] = etag  # a changed object comes back whole (200), caught below
    answer = http_pool(opts).request("GET", plain, headers=headers, preload_content=False, decode_content=False)
    if answer.status == 416 and wanted:
        answer.release_conn()
        return _Empty(), offset, etag, True
    if answer.status not in (200, 206):
        answer.release_conn()
        raise status_error(answer.status, "", url, "object")
    length = answer.headers.get("Content-Length")
    new_etag = answer.headers.get("ETag")
    if wanted and answer.status == 200:
        if etag and new_etag != etag:
            answer.release_conn()
            raise status_error(412, "", url, "object")
        try:
            _skip(answer, offset)  # the server ignores ranges: read up to the offset
        except BaseException:
            answer.close()
            raise
        return answer, int(length) if length else None, new_etag, False
    total = answer.headers.get("Content-Range", "").rpartition("/")[2]
    size = int(total) if total.isdigit() else (offset + int(length) if length else None)
    return answer, size, new_etag or etag, answer.status == 206 or not wanted


def _skip(body: Any, n: int) -> None:
    while n > 0:
        got = body.read(min(n, 1 << 20))
        if not got:
            raise Retry("short answer while skipping to the resume offset")
        n -= len(got)


class RemoteRaw(io.RawIOBase):
    """One remote object as a raw stream of bytes ``[offset, end)`` (``end`` None: to the end of
    the object); resumes cut transfers from the exact byte, pinned to ``etag`` (if given, else
    to the ETag of the first answer).

    ``size`` is the object's size in bytes (``None`` if the server does not say); ``ranged`` is
    False when an HTTP server ignored the range and sent the whole object (then the bytes before
    ``offset`` were read and dropped, and those after ``end`` are never read).
    """

    def __init__(self, url: str, offset: int = 0, options: Any = None, counters: Optional[IOCounters] = None,
                 end: Optional[int] = None, etag: Optional[str] = None) -> None:
        self.url = url
        self.opts = remote_options(options)
        self._get = _s3_get if url.startswith("s3://") else _http_get
        self._counters = [TOTALS] + ([counters] if counters is not None else [])
        self._rng = random.Random()  # jitter only: never decides data
        self.pos = offset
        self.end = end
        self.size: Optional[int] = None
        self.etag: Optional[str] = etag
        self.ranged = True
        self._body: Any = None
        self._resumed = False
        self._connect(first=True)

    def _connect(self, first: bool) -> None:
        def attempt() -> Answer:
            self._add(requests=1)
            return self._get(self.url, self.opts, self.pos, self.etag, self.end)

        self._body, size, etag, ranged = call_with_retries(attempt, self.url, self.opts, self._counters, self._rng,
                                                           first=first)
        self.size = size if size is not None else self.size
        self.etag = etag or self.etag
        self.ranged = self.ranged and ranged

    def limit(self) -> Optional[int]:
        """The byte offset where this stream ends, if known."""
        if self.end is None:
            return self.size
        return self.end if self.size is None else min(self.end, self.size)

    def _add(self, **amounts: int) -> None:
        for c in self._counters:
            c.add(**amounts)

    def readable(self) -> bool:
        return True

    def read_chunk(self, n: int) -> bytes:
        """Up to ``n`` bytes (``b""`` only at the end of the object), resuming after cuts."""
        failures = 0
        while True:
            limit = self.limit()
            if limit is not None:
                if self.pos >= limit:
                    return b""
                n = min(n, limit - self.pos)
            try:
                data = self._body.read(n)
            except Exception as e:  # noqa: BLE001 - classified: fatal errors re-raised
                mapped = classify(e, self.url, first=False)
                if not isinstance(mapped, Retry):
                    raise mapped from None
                data = None
            if data:
                self.pos += len(data)
                self._add(bytes=len(data), resumed_bytes=len(data) if self._resumed else 0)
                return data
            if data is not None and limit is None:
                return b""  # no length announced: the end of the body is the end
            failures += 1  # cut before the announced end: continue with a ranged GET
            if failures >= self.opts.max_attempts:
                raise SourceError(f"transfer cut {failures} times at byte {self.pos} without progress", url=self.url)
            self._close_body()
            if failures > 1:
                time.sleep(self.opts.backoff(failures - 1, self._rng))
            self._add(resumes=1)
            self._resumed = True
            self._connect(first=False)

    def readinto(self, buffer: Any) -> int:
        data = self.read_chunk(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _close_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close
                pass

    def close(self) -> None:
        self._close_body()
        super().close()


def open_remote(url: str, offset: int = 0, options: Optional[Mapping[str, Any]] = None,
                counters: Optional[IOCounters] = None) -> io.BufferedReader:
    """Open ``s3://`` or ``http(s)://`` ``url`` as a buffered stream of its bytes from ``offset``
    (one GET at a time; :class:`~dalistream.io.parts.PartFetcher` fetches parts in parallel)."""
    raw = RemoteRaw(url, offset, options, counters)
    return io.BufferedReader(raw, min(raw.opts.chunk_bytes, 8 << 20))


# -- listing, metadata, small objects -----------------------------------------------------------

def list_s3_keys(url: str, options: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Every object under ``s3://bucket/prefix/`` as an ``s3://`` URL, sorted (all pages)."""
    opts = remote_options(options)
    bucket, prefix = split_s3(url)

    def listing() -> List[str]:
        pages = s3_client(opts).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]

    keys = call_with_retries(listing, url, opts, [TOTALS], random.Random(), what="prefix")
    return [f"s3://{bucket}/{key}" for key in sorted(keys)]


def stat_remote(url: str, options: Optional[Mapping[str, Any]] = None) -> Tuple[Optional[int], Optional[str]]:
    """``(size, version tag)`` of a remote object by HEAD; the tag is the ETag (or Last-Modified)."""
    opts = remote_options(options)

    def head() -> Tuple[Optional[int], Optional[str]]:
        if url.startswith("s3://"):
            bucket, key = split_s3(url)
            answer = s3_client(opts).head_object(Bucket=bucket, Key=key)
            return int(answer["ContentLength"]), answer.get("ETag")
        plain, headers = http_parts(url)
        answer = http_pool(opts).request("HEAD", plain, headers=headers, preload_content=False)
        answer.release_conn()
        if answer.status != 200:
            raise status_error(answer.status, "", url, "object")
        length = answer.headers.get("Content-Length")
        return (int(length) if length else None), answer.headers.get("ETag") or answer.headers.get("Last-Modified")

    return call_with_retries(head, url, opts, [TOTALS], random.Random())


def read_bytes(url: str, options: Optional[Mapping[str, Any]] = None) -> bytes:
    """The whole content of a (small) remote object, e.g. a manifest."""
    with open_remote(url, 0, options) as f:
        return f.read()


def put_bytes(url: str, data: bytes, options: Optional[Mapping[str, Any]] = None) -> None:
    """Upload ``data`` as the S3 object ``url`` (HTTP URLs cannot be written)."""
    if not url.startswith("s3://"):
        raise SourceError("only s3:// URLs (or local paths) can be written", url=url)
    opts = remote_options(options)
    bucket, key = split_s3(url)
    call_with_retries(lambda: s3_client(opts).put_object(Bucket=bucket, Key=key, Body=data),
                      url, opts, [TOTALS], random.Random())



def delete_remote(url: str, options: Optional[Mapping[str, Any]] = None) -> None:
    """Delete the S3 object ``url`` (none there is no error)."""
    if not url.startswith("s3://"):
        raise SourceError("only s3:// URLs (or local paths) can be deleted", url=url)
    opts = remote_options(options)
    bucket, key = split_s3(url)
    call_with_retries(lambda: s3_client(opts).delete_object(Bucket=bucket, Key=key),
                      url, opts, [TOTALS], random.Random())
