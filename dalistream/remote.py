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

import base64
import io
import os
import random
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple
from urllib.parse import unquote, urlsplit, urlunsplit

from .errors import ConfigError, SourceError
from .shards import SHARD_SUFFIXES
from .streams import IOCounters

TOTALS = IOCounters()  # every remote request of this process (see IOCounters)
SECRET_OPTIONS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


@dataclass(frozen=True, repr=False)
class RemoteOptions:
    """The ``storage_options`` understood here, with their defaults."""

    endpoint_url: Optional[str] = None
    profile: Optional[str] = None
    region: Optional[str] = None
    anon: bool = False
    aws_access_key_id: Optional[str] = None
    aws_secret_access_key: Optional[str] = None
    aws_session_token: Optional[str] = None
    read_ahead_bytes: int = 64 << 20
    chunk_bytes: int = 1 << 20
    max_attempts: int = 8
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def __repr__(self) -> str:
        shown = [f"{f.name}={'***' if f.name in SECRET_OPTIONS else getattr(self, f.name)!r}" for f in fields(self)]
        return "RemoteOptions(" + ", ".join(shown) + ")"

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): full jitter."""
        return rng.uniform(0, min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 1))))


def remote_options(options: Optional[Mapping[str, Any]]) -> RemoteOptions:
    """Validate ``storage_options`` (unknown keys are a :class:`ConfigError`)."""
    if isinstance(options, RemoteOptions):
        return options
    options = dict(options or {})
    known = {f.name for f in fields(RemoteOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown storage_options {unknown}; known: {sorted(known)}")
    opts = RemoteOptions(**options)
    if opts.max_attempts < 1 or opts.chunk_bytes < 1 or opts.read_ahead_bytes < 0:
        raise ConfigError("storage_options: max_attempts and chunk_bytes must be >= 1, read_ahead_bytes >= 0")
    return opts


# -- clients (per process, lazily) ------------------------------------------------------------------

_clients: Dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def s3_client(opts: RemoteOptions) -> Any:
    """The boto3 S3 client for ``opts`` (cached per process; boto3's own retries off)."""
    key = ("s3", os.getpid()) + tuple(getattr(opts, f.name) for f in fields(opts))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            import boto3
            import botocore
            from botocore.config import Config
            from botocore.exceptions import ProfileNotFound

            try:
                session = boto3.session.Session(
                    profile_name=opts.profile, aws_access_key_id=opts.aws_access_key_id,
                    aws_secret_access_key=opts.aws_secret_access_key, aws_session_token=opts.aws_session_token)
            except ProfileNotFound:
                raise ConfigError(f"AWS profile {opts.profile!r} is not configured") from None
            config = Config(retries={"total_max_attempts": 1}, connect_timeout=opts.connect_timeout_s,
                            read_timeout=opts.read_timeout_s, max_pool_connections=32, tcp_keepalive=True,
                            signature_version=botocore.UNSIGNED if opts.anon else None)
            client = _clients[key] = session.client("s3", endpoint_url=opts.endpoint_url,
                                                    region_name=opts.region, config=config)
        return client


def http_pool(opts: RemoteOptions) -> Any:
    """The urllib3 pool manager for ``opts`` (cached per process; retries are ours)."""
    key = ("http", os.getpid(), opts.connect_timeout_s, opts.read_timeout_s)
    with _clients_lock:
        pool = _clients.get(key)
        if pool is None:
            import urllib3

            pool = _clients[key] = urllib3.PoolManager(
                num_pools=16, maxsize=16, timeout=urllib3.Timeout(connect=opts.connect_timeout_s, read=opts.read_timeout_s),
                retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5))
        return pool


def split_s3(url: str) -> Tuple[str, str]:
    """``("bucket", "key")`` of ``s3://bucket/key``."""
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise SourceError("S3 URL has no bucket", url=url, hint="write s3://bucket/key")
    return bucket, key


# -- errors ------------------------------------------------------------------------------------

class _Retry(Exception):
    """Internal: a failure worth another attempt (throttling, 5xx, cut connection)."""


_THROTTLE = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestThrottled",
             "TooManyRequests", "ServiceUnavailable", "InternalError", "RequestTimeout", "503", "500"}
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_DENIED_HINT = "check the credentials in use (profile, environment, instance role) and the bucket policy"


def _status_error(status: int, code: str, url: str, what: str) -> Exception:
    """The exception for an HTTP status (and S3 error code) answered to a request for ``url``."""
    label = f"{status} {code}".strip()
    if status in _RETRY_STATUS or code in _THROTTLE:
        return _Retry(f"{label} answered")
    if code == "NoSuchBucket":
        return SourceError(f"bucket does not exist ({label})", url=url, hint="check the bucket name and endpoint")
    if status in (404, 410) or code in ("NoSuchKey", "NotFound"):
        return SourceError(f"{what} does not exist ({label})", url=url)
    if status in (401, 403):
        return SourceError(f"access denied ({label})", url=url, hint=_DENIED_HINT)
    if status == 301 or code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"):
        return SourceError(f"bucket lives in another region ({label})", url=url,
                           hint="set storage_options region (or AWS_REGION) to the bucket's region")
    if status == 412:
        return SourceError("object changed while it was being read (ETag mismatch)", url=url,
                           hint="do not overwrite shards while a job reads them")
    return SourceError(f"request failed ({label})", url=url)


def _classify(error: BaseException, url: str, first: bool, what: str = "object") -> Exception:
    """Map a client library exception to a :class:`SourceError` (fatal) or :class:`_Retry`."""
    import urllib3.exceptions as u3
    from botocore import exceptions as bc

    if isinstance(error, (SourceError, ConfigError, _Retry)):
        return error
    if isinstance(error, bc.ClientError):
        meta = error.response.get("ResponseMetadata", {})
        code = str(error.response.get("Error", {}).get("Code", ""))
        return _status_error(int(meta.get("HTTPStatusCode") or 0), code, url, what)
    if isinstance(error, (bc.NoCredentialsError, bc.PartialCredentialsError)):
        return SourceError("no usable AWS credentials found", url=url,
                           hint="configure a profile, environment variables or an instance role; anon=True for public buckets")
    if isinstance(error, bc.FlexibleChecksumError):
        return SourceError("checksum mismatch: the object arrived corrupted", url=url)
    if isinstance(error, bc.ParamValidationError):
        return SourceError("invalid S3 bucket or key", url=url)
    if isinstance(error, u3.MaxRetryError) and error.reason is not None:
        error = error.reason
    if isinstance(error, (bc.SSLError, u3.SSLError)):
        return SourceError("TLS error talking to the server", url=url, hint="check the endpoint URL and certificates")
    # urllib3's NewConnectionError subclasses its ConnectTimeoutError; botocore's is the other way round
    connect_failed = (isinstance(error, u3.NewConnectionError)
                      or (isinstance(error, bc.EndpointConnectionError) and not isinstance(error, bc.ConnectTimeoutError)))
    if connect_failed and first:
        inner = getattr(error, "kwargs", {}).get("error", error)
        dns = isinstance(inner, u3.NameResolutionError) or "resolve" in str(inner).lower()
        kind = "name resolution failed" if dns else "connection refused"
        return SourceError(f"cannot connect to the server ({kind})", url=url,
                           hint="check the endpoint URL (storage_options endpoint_url / AWS_ENDPOINT_URL) and network")
    if isinstance(error, (bc.BotoCoreError, u3.HTTPError, OSError, EOFError)) or type(error).__module__ == "http.client":
        return _Retry(f"{type(error).__name__}")
    return error if isinstance(error, Exception) else SourceError(repr(error), url=url)


def call_with_retries(fn: Callable[[], Any], url: str, opts: RemoteOptions, counters: List[IOCounters],
                      rng: random.Random, *, first: bool = True, what: str = "object") -> Any:
    """``fn()`` with retries of :class:`_Retry` failures: backoff with jitter, bounded attempts."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below
            mapped = _classify(e, url, first, what)
            if not isinstance(mapped, _Retry):
                raise mapped from None
            attempt += 1
            if attempt >= opts.max_attempts:
                raise SourceError(f"giving up after {attempt} attempts (last: {mapped})", url=url,
                                  hint="the server is throttling or failing: retry later or raise max_attempts") from None
            for c in counters:
                c.add(retries=1)
            time.sleep(opts.backoff(attempt, rng))


# -- one GET -----------------------------------------------------------------------------------

class _Empty:
    def read(self, n: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        pass


def _s3_get(url: str, opts: RemoteOptions, offset: int, etag: Optional[str]) -> Tuple[Any, Optional[int], Optional[str]]:
    from botocore.exceptions import ClientError

    bucket, key = split_s3(url)
    args: Dict[str, Any] = {"Bucket": bucket, "Key": key}
    if offset:
        args["Range"] = f"bytes={offset}-"
    if etag:
        args["IfMatch"] = etag
    try:
        answer = s3_client(opts).get_object(**args)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "InvalidRange" and offset:
            return _Empty(), offset, etag  # opened exactly at the end
        raise
    total = answer.get("ContentRange", "").rpartition("/")[2]
    size = int(total) if total.isdigit() else offset + int(answer["ContentLength"])
    return answer["Body"], size, answer.get("ETag")


def _http_parts(url: str) -> Tuple[str, Dict[str, str]]:
    """The URL without user info, and the headers (basic auth from the user info, if any)."""
    parts = urlsplit(url)
    headers: Dict[str, str] = {}
    if parts.username is not None:
        userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url, headers


def _http_get(url: str, opts: RemoteOptions, offset: int, etag: Optional[str]) -> Tuple[Any, Optional[int], Optional[str]]:
    plain, headers = _http_parts(url)
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if etag:
            headers["If-Range"] = etag  # a changed object comes back whole (200), caught below
    answer = http_pool(opts).request("GET", plain, headers=headers, preload_content=False, decode_content=False)
    if answer.status == 416 and offset:
        answer.release_conn()
        return _Empty(), offset, etag
    if answer.status not in (200, 206):
        answer.release_conn()
        raise _status_error(answer.status, "", url, "object")
    length = answer.headers.get("Content-Length")
    new_etag = answer.headers.get("ETag")
    if offset and answer.status == 200:
        if etag and new_etag != etag:
            answer.release_conn()
            raise _status_error(412, "", url, "object")
        try:
            _skip(answer, offset)  # the server ignores ranges: read up to the offset
        except BaseException:
            answer.close()
            raise
        return answer, int(length) if length else None, new_etag
    total = answer.headers.get("Content-Range", "").rpartition("/")[2]
    size = int(total) if total.isdigit() else (offset + int(length) if length else None)
    return answer, size, new_etag or etag


def _skip(body: Any, n: int) -> None:
    while n > 0:
        got = body.read(min(n, 1 << 20))
        if not got:
            raise _Retry("short answer while skipping to the resume offset")
        n -= len(got)


class RemoteRaw(io.RawIOBase):
    """One remote object as a raw stream from byte ``offset``; resumes cut transfers.

    ``size`` is the object's size in bytes (``None`` if the server does not say).
    """

    def __init__(self, url: str, offset: int = 0, options: Any = None, counters: Optional[IOCounters] = None) -> None:
        self.url = url
        self.opts = remote_options(options)
        self._get = _s3_get if url.startswith("s3://") else _http_get
        self._counters = [TOTALS] + ([counters] if counters is not None else [])
        self._rng = random.Random()  # jitter only: never decides data
        self.pos = offset
        self.size: Optional[int] = None
        self.etag: Optional[str] = None
        self._body: Any = None
        self._resumed = False
        self._connect(first=True)

    def _connect(self, first: bool) -> None:
        def attempt() -> Tuple[Any, Optional[int], Optional[str]]:
            self._add(requests=1)
            return self._get(self.url, self.opts, self.pos, self.etag)

        self._body, size, etag = call_with_retries(attempt, self.url, self.opts, self._counters, self._rng, first=first)
        self.size = size if size is not None else self.size
        self.etag = etag or self.etag

    def _add(self, **amounts: int) -> None:
        for c in self._counters:
            c.add(**amounts)

    def readable(self) -> bool:
        return True

    def read_chunk(self, n: int) -> bytes:
        """Up to ``n`` bytes (``b""`` only at the end of the object), resuming after cuts."""
        failures = 0
        while True:
            if self.size is not None and self.pos >= self.size:
                return b""
            try:
                data = self._body.read(n)
            except Exception as e:  # noqa: BLE001 - classified: fatal errors re-raised
                mapped = _classify(e, self.url, first=False)
                if not isinstance(mapped, _Retry):
                    raise mapped from None
                data = None
            if data:
                self.pos += len(data)
                self._add(bytes=len(data), resumed_bytes=len(data) if self._resumed else 0)
                return data
            if data is not None and self.size is None:
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
    """Open ``s3://`` or ``http(s)://`` ``url`` as a buffered stream at byte ``offset``."""
    raw = RemoteRaw(url, offset, options, counters)
    return io.BufferedReader(raw, min(raw.opts.chunk_bytes, 8 << 20))


# -- listing, metadata, small objects -----------------------------------------------------------

def list_s3_prefix(url: str, options: Optional[Mapping[str, Any]] = None) -> List[str]:
    """The ``.tar``/``.tar.gz``/``.tgz`` objects under ``s3://bucket/prefix/``, sorted (all pages)."""
    opts = remote_options(options)
    bucket, prefix = split_s3(url)

    def listing() -> List[str]:
        pages = s3_client(opts).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", []) if obj["Key"].endswith(SHARD_SUFFIXES)]

    keys = call_with_retries(listing, url, opts, [TOTALS], random.Random(), what="prefix")
    if not keys:
        raise SourceError("S3 prefix holds no .tar/.tar.gz/.tgz objects", url=url)
    return [f"s3://{bucket}/{key}" for key in sorted(keys)]


def stat_remote(url: str, options: Optional[Mapping[str, Any]] = None) -> Tuple[Optional[int], Optional[str]]:
    """``(size, version tag)`` of a remote object by HEAD; the tag is the ETag (or Last-Modified)."""
    opts = remote_options(options)

    def head() -> Tuple[Optional[int], Optional[str]]:
        if url.startswith("s3://"):
            bucket, key = split_s3(url)
            answer = s3_client(opts).head_object(Bucket=bucket, Key=key)
            return int(answer["ContentLength"]), answer.get("ETag")
        plain, headers = _http_parts(url)
        answer = http_pool(opts).request("HEAD", plain, headers=headers, preload_content=False)
        answer.release_conn()
        if answer.status != 200:
            raise _status_error(answer.status, "", url, "object")
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

