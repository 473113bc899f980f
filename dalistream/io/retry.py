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
_DENIED_HINT = "check the credentials in use ({}) and the bucket's access policy"


def status_error(status: int, code: str, url: str, what: str, credentials: str = "") -> Exception:
    """The exception for an HTTP status (and a store's error code) answered to a request for
    ``url``; ``credentials`` names where the credentials came from (for 401/403)."""
    label = f"{status} {code}".strip()
    if status in _RETRY_STATUS or code in _THROTTLE:
        return Retry(f"{label} answered")
    if code == "NoSuchBucket":
        return SourceError(f"bucket does not exist ({label})", url=url, hint="check the bucket name and endpoint")
    if status in (404, 410) or code in ("NoSuchKey", "NotFound"):
        return SourceError(f"{what} does not exist ({label})", url=url, reason="missing")
    if status in (401, 403):
        return SourceError(f"access denied ({label})", url=url, reason="denied",
                           hint=_DENIED_HINT.format(credentials or "the store's credential chain"))
    if status == 301 or code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"):
        return SourceError(f"bucket lives in another region ({label})", url=url,
                           hint="set storage_options region (or AWS_REGION) to the bucket's region")
    if status == 412:
        return changed(url)
    return SourceError(f"request failed ({label})", url=url)


def changed(url: str) -> SourceError:
    """The error of an object whose version changed while it was being read."""
    return SourceError("object changed while it was being read (its version is not the one the read began with)",
                       url=url, reason="changed", hint="do not overwrite shards while a job reads them")


def classify(error: BaseException, url: str, first: bool, what: str = "object",
             store: Any = None) -> Exception:
    """Map an exception to a :class:`SourceError` (fatal) or :class:`Retry`: the store's own
    client exceptions by ``store.classify``, then connection failures and cut transfers."""
    import urllib3.exceptions as u3

    if isinstance(error, (SourceError, ConfigError, Retry)):
        return error
    if store is not None:
        mapped = store.classify(error, url, first, what)
        if mapped is not None:
            return mapped
    if isinstance(error, u3.MaxRetryError) and error.reason is not None:
        error = error.reason
    if isinstance(error, u3.LocationValueError):
        return SourceError("not a usable URL", url=url)
    if isinstance(error, u3.SSLError):
        return SourceError("TLS error talking to the server", url=url, hint="check the endpoint URL and certificates")
    if isinstance(error, u3.NewConnectionError) and first:
        dns = isinstance(error, u3.NameResolutionError) or "resolve" in str(error).lower()
        kind = "name resolution failed" if dns else "connection refused"
        return SourceError(f"cannot connect to the server ({kind})", url=url, hint=CONNECT_HINT)
    if isinstance(error, (u3.HTTPError, OSError, EOFError)) or type(error).__module__ == "http.client":
        return Retry(f"{type(error).__name__}")
    return error if isinstance(error, Exception) else SourceError(repr(error), url=url)


CONNECT_HINT = "check the endpoint URL (storage_options endpoint_url, or the store's endpoint variable) and network"


def call_with_retries(fn: Callable[[], Any], url: str, opts: RemoteOptions, counters: List[IOCounters],
                      rng: random.Random, *, first: bool = True, what: str = "object", store: Any = None) -> Any:
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
            mapped = classify(e, url, first, what, store)
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
