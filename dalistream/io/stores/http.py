"""``http(s)://``: any web server, read by ranged GETs (urllib3). Basic auth from the URL's user
info; the version of an object is its ``ETag`` (or ``Last-Modified``), pinned by ``If-Range``.
No listing (name each URL, or a brace pattern) and no writing."""

from __future__ import annotations

import base64
import os
import threading
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ...errors import SourceError
from ..options import RemoteOptions
from ..retry import Retry, changed, status_error
from .base import ObjectStore, Answer, Data, Empty, ObjectInfo, no_write, range_header, total_size

#: Query parameters that sign or authorize a URL rather than name the object (presigned S3 and
#: GCS URLs, Azure SAS tokens, bearer tokens): left out of the byte cache's name of the object.
SIGNATURE_PARAMS = ("x-amz-", "x-goog-", "signature", "expires", "awsaccesskeyid", "sig", "se", "sp", "sv", "sr",
                    "st", "spr", "srt", "ss", "skoid", "sktid", "skt", "ske", "sks", "skv", "token", "access_token")
_pools: Dict[tuple, Any] = {}
_pools_lock = threading.Lock()


def http_pool(opts: RemoteOptions) -> Any:
    """The urllib3 pool manager for ``opts`` (one per process and timeouts; retries are ours)."""
    size = opts.connections
    key = (os.getpid(), opts.connect_timeout_s, opts.read_timeout_s, size)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            import urllib3

            pool = _pools[key] = urllib3.PoolManager(
                num_pools=16, maxsize=size, timeout=urllib3.Timeout(connect=opts.connect_timeout_s, read=opts.read_timeout_s),
                retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5))
        return pool


def http_parts(url: str) -> Tuple[str, Dict[str, str]]:
    """The URL without user info, and the headers (basic auth from the user info, if any)."""
    parts = urlsplit(url)
    headers: Dict[str, str] = {}
    if parts.username is not None:
        userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url, headers


def skip(body: Any, n: int) -> None:
    """Read and drop ``n`` bytes of ``body`` (a server that ignored the range)."""
    while n > 0:
        got = body.read(min(n, 1 << 20))
        if not got:
            raise Retry("short answer while skipping to the resume offset")
        n -= len(got)


def ranged_get(pool: Any, url: str, headers: Dict[str, str], start: int, end: Optional[int],
               version: Optional[str], credentials: str, shown: Optional[str] = None) -> Answer:
    """A GET of bytes ``[start, end)`` with ``headers``, pinned to ``version`` (an ETag) by
    ``If-Range``; a server that ignores ranges is read up to ``start``. Errors name ``shown``
    (the URL as the user wrote it; redacted), else ``url``."""
    wanted = range_header(start, end)
    if wanted:
        headers["Range"] = wanted
        if version:
            headers["If-Range"] = version  # a changed object comes back whole (200), caught below
    answer = pool.request("GET", url, headers=headers, preload_content=False, decode_content=False)
    return range_answer(answer, shown or url, start, end, version, credentials)


def given_back(answer: Any) -> None:
    """Give ``answer``'s connection back to the pool with its (short) body read and dropped: a
    connection given back with bytes unread would hand them to the next request on it as the start
    of its answer."""
    answer.drain_conn()
    answer.release_conn()


def range_answer(answer: Any, shown: str, start: int, end: Optional[int], version: Optional[str],
                 credentials: str) -> Answer:
    """The :class:`Answer` of a ranged GET's response (see :func:`ranged_get`)."""
    wanted = range_header(start, end)
    if answer.status == 416 and wanted:
        given_back(answer)
        return Answer(Empty(), start, version)
    if answer.status not in (200, 206):
        given_back(answer)
        raise status_error(answer.status, "", shown, "object", credentials)
    length = answer.headers.get("Content-Length")
    new_version = answer.headers.get("ETag") or answer.headers.get("Last-Modified")
    if version and new_version and new_version != version:
        answer.close()  # its body is the whole new object: not worth reading to keep the connection
        raise changed(shown)
    if wanted and answer.status == 200:
        try:
            skip(answer, start)  # the server ignores ranges: read up to the offset
        except BaseException:
            answer.close()
            raise
        return Answer(answer, int(length) if length else None, new_version, ranged=False)
    size = total_size(answer.headers.get("Content-Range"), start, length)
    return Answer(answer, size, new_version or version, ranged=answer.status == 206 or not wanted)


class HTTPStore(ObjectStore):
    """``http://`` and ``https://`` (see module doc)."""

    scheme = "http"
    listable = False
    writable = False
    credential_source = "the URL's user info (https://USER:PASSWORD@host/…)"

    def list(self, prefix: str) -> List[ObjectInfo]:
        raise SourceError("web servers cannot be listed", url=prefix,
                          hint="name each shard URL, or a brace pattern (https://host/train-{0000..0099}.tar)")

    def stat(self, url: str) -> ObjectInfo:
        plain, headers = http_parts(url)
        answer = http_pool(self.opts).request("HEAD", plain, headers=headers, preload_content=False)
        given_back(answer)  # (released unread, a HEAD's answer stays open: the next request on it fails)
        if answer.status != 200:
            raise status_error(answer.status, "", url, "object", self.credential_source)
        length = answer.headers.get("Content-Length")
        return ObjectInfo(url, int(length) if length else None,
                          answer.headers.get("ETag") or answer.headers.get("Last-Modified"))

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        plain, headers = http_parts(url)
        return ranged_get(http_pool(self.opts), plain, headers, start, end, version, self.credential_source, url)

    @staticmethod
    def cache_name(url: str) -> str:
        """``url`` without user info and without the query parameters that sign it
        (:data:`SIGNATURE_PARAMS`): a URL signed anew names the same cached blocks."""
        parts = urlsplit(url)
        if not parts.query and "@" not in parts.netloc:
            return url
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                 if not k.lower().startswith(SIGNATURE_PARAMS[:2]) and k.lower() not in SIGNATURE_PARAMS[2:]]
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, urlencode(query), ""))

    def write(self, url: str, data: Data) -> None:
        raise no_write("http(s)://", url)

    def delete(self, url: str) -> None:
        raise no_write("http(s)://", url)

