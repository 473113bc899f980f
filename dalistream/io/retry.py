"""Which remote failures are retried, and how: throttling (SlowDown, 429, 503), other 5xx answers
and cut connections are retried with exponential backoff and full jitter, at most
``max_attempts`` times in a row; missing objects, 403s, unknown buckets, DNS failures and refused
connections fail at once with a :class:`SourceError` naming the URL (server messages, which may
quote request details, are never copied)."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable, List

from ..errors import ConfigError, SourceError, redact
from .counters import IOCounters
from .options import RemoteOptions

log = logging.getLogger(__name__)


class Retry(Exception):
    """Internal: a failure worth another attempt (throttling, 5xx, cut connection)."""


_THROTTLE = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestThrottled",
             "TooManyRequests", "ServiceUnavailable", "InternalError", "RequestTimeout", "503", "500"}
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_DENIED_HINT = "check the credentials in use (profile, environment, instance role) and the bucket policy"


def status_error(status: int, code: str, url: str, what: str) -> Exception:
    """The exception for an HTTP status (and S3 error code) answered to a request for ``url``."""
    label = f"{status} {code}".strip()
    if status in _RETRY_STATUS or code in _THROTTLE:
        return Retry(f"{label} answered")
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


def classify(error: BaseException, url: str, first: bool, what: str = "object") -> Exception:
    """Map a client library exception to a :class:`SourceError` (fatal) or :class:`Retry`."""
    import urllib3.exceptions as u3
    from botocore import exceptions as bc

    if isinstance(error, (SourceError, ConfigError, Retry)):
        return error
    if isinstance(error, bc.ClientError):
        meta = error.response.get("ResponseMetadata", {})
        code = str(error.response.get("Error", {}).get("Code", ""))
        return status_error(int(meta.get("HTTPStatusCode") or 0), code, url, what)
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
        return Retry(f"{type(error).__name__}")
    return error if isinstance(error, Exception) else SourceError(repr(error), url=url)


def call_with_retries(fn: Callable[[], Any], url: str, opts: RemoteOptions, counters: List[IOCounters],
                      rng: random.Random, *, first: bool = True, what: str = "object") -> Any:
    """``fn()`` with retries of :class:`Retry` failures: backoff with jitter, bounded attempts.

    Bounded in time too: an attempt unanswered for ``stall_warning_s`` is reported in the log
    (once per call), and no retry starts after ``give_up_s`` in all, so a server that accepts
    connections and never answers fails in at most about ``give_up_s + read_timeout_s``."""
    attempt = 0
    start = time.monotonic()
    warned = threading.Event()

    def stalled() -> None:
        if not warned.is_set():
            warned.set()
            log.warning("no answer from %s for %.0f s (attempt %d of %d, each waits up to %.0f s; giving up after "
                        "about %.0f s in all)", redact(url), opts.stall_warning_s, attempt + 1, opts.max_attempts,
                        opts.read_timeout_s, opts.give_up_s + opts.read_timeout_s)

    while True:
        timer = threading.Timer(opts.stall_warning_s, stalled)
        timer.daemon = True
        timer.start()
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below
            mapped = classify(e, url, first, what)
            if not isinstance(mapped, Retry):
                raise mapped from None
            attempt += 1
            elapsed = time.monotonic() - start
            if attempt >= opts.max_attempts or elapsed >= opts.give_up_s:
                why = (f"{attempt} attempts" if attempt >= opts.max_attempts
                       else f"{elapsed:.0f} s without an answer (give_up_s={opts.give_up_s:g})")
                raise SourceError(f"giving up after {why} (last: {mapped})", url=url,
                                  hint="the server is throttling, failing or not answering: retry later, or raise "
                                       "max_attempts / give_up_s") from None
            for c in counters:
                c.add(retries=1)
            time.sleep(min(opts.backoff(attempt, rng), max(0.0, opts.give_up_s - elapsed)))
        finally:
            timer.cancel()
