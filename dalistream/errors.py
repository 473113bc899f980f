"""One exception hierarchy for every stage.

Every error carries, where known, the shard URL (credentials redacted), the tar member or
sample key, and the rank and worker that hit it, so a message from a cluster of hundreds of
loader workers still says where to look; ``hint`` says what to do about it and ``reason`` is a
short machine-readable kind (``"truncated"``, ``"missing_field"``, …) under which the error
policy counts skips. Catch by class::

    DalistreamError            anything raised by dalistream
    ├── ConfigError            invalid arguments (also a ValueError)
    ├── SourceError            a source cannot be listed, opened or read (missing file, 404, 403)
    ├── ShardFormatError       a shard is not a valid tar stream (empty, truncated, not a tar, bad gzip)
    ├── SampleError            one sample is unusable (missing field, bad value, bad image, too large, duplicate)
    ├── ManifestError          per-shard counts are missing or disagree with the data
    ├── StateError             a saved loader state does not fit the loader
    └── WorkerError            a DALI worker process died, or DALI failed outside dalistream's code

An error raised inside a DALI worker reaches the training loop as the same class with the same
fields (see :func:`dalistream.dali.diagnose.translate`); the worker's traceback is kept in
``worker_traceback`` and shown as a note under the error. URLs are redacted everywhere: user
info (``https://user:password@host``), secret-looking query parameters and, inside ``pipe:``
commands, ``-u``/``--user``/``--password`` values, ``Authorization``/token headers,
``user:password@host`` and ``NAME=value`` of secret-looking names become ``***``.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Dict, Optional

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
# ``user:password@host`` without a scheme (ssh, rsync, scp inside a ``pipe:`` command)
_BARE_USERINFO = re.compile(r"(?<![\w/@:.-])[\w.%+-]+:[^\s/@'\"]+@(?=[\w\[])")
_SECRET_NAME = (r"[\w.-]*(?:secret|token|passw(?:or)?d|pwd|api[_-]?key|apikey|access[_-]?key|private[_-]?key|"
                r"credential|signature|session[_-]?key|aws_access_key_id|auth[_-]?key)[\w.-]*")
# ``key=value`` in a query, or ``NAME=value`` assigned in a shell command
_SECRET_QUERY = re.compile(r"(?i)(?P<k>(?<![\w.-])(?:" + _SECRET_NAME + r"|sig)=)[^&\s'\"]+"
                           # short names, exactly, as query parameters (after ? & or ;): key=, auth=, …
                           r"|(?P<q>(?<=[?&;])(?:key|auth|jwt|bearer|code|sas)=)[^&\s'\"#]+")
# command-line options carrying a credential: ``-u user:pw``, ``--user=…``, ``--password …``, ``--oauth2-bearer …``
_SECRET_OPTION = re.compile(
    r"(?i)(?P<k>(?<!\S)(?:-u|--user|--proxy-user|--oauth2-bearer|--(?:" + _SECRET_NAME + r"))(?:=|\s+))"
    r"(?:'[^']*'|\"[^\"]*\"|[^\s'\"]+)"
)
# HTTP headers carrying a credential: ``-H "Authorization: Bearer …"``, ``X-Amz-Security-Token: …``
_HEADER_NAME = (r"(?:proxy-)?authorization|cookie|api-key|private-token|"
                r"x-[\w-]*(?:token|secret|key|signature|credential|auth[\w-]*)")
_QUOTED_HEADER = re.compile(r"(?i)(?P<q>['\"])(?P<k>(?:" + _HEADER_NAME + r")\s*:)[^'\"]*(?P=q)")
_BARE_HEADER = re.compile(r"(?i)(?<![\w-])(?P<k>(?:" + _HEADER_NAME + r")\s*:)\s*"
                          r"(?:(?:Bearer|Basic|Token|Digest|AWS4-HMAC-SHA256)\s+)?[^\s'\"]+")
# every pattern above needs one of these: userinfo an "@", queries, assignments and options an "="
# or white space, headers their name
_MAY_HOLD_SECRET = re.compile(r"[@=\s]|(?i:" + _HEADER_NAME + r")")
FIELDS_NOTE = "dalistream-error-fields: "  # marks the machine-readable note of a worker-side error


def redact(url: str) -> str:
    """Return ``url`` (or any text: a ``pipe:`` command, an error message) with credentials
    replaced by ``***``: user info (``scheme://user:pw@``, ``user:pw@host``), secret-looking
    ``key=value`` parameters and ``NAME=value`` assignments, ``-u``/``--user``/``--password``-like
    option values and ``Authorization``/token headers."""
    text = str(url)
    if not _MAY_HOLD_SECRET.search(text):  # most shard URLs and paths: nothing to look for (a fast path)
        return text
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    text = _BARE_USERINFO.sub("***@", text)
    text = _QUOTED_HEADER.sub(r"\g<q>\g<k> ***\g<q>", text)
    text = _BARE_HEADER.sub(r"\g<k> ***", text)
    text = _SECRET_OPTION.sub(r"\g<k>***", text)
    return _SECRET_QUERY.sub(lambda m: (m.group("k") or m.group("q")) + "***", text)


_SURROGATE = re.compile(r"(\\\\)|\\udc([89a-f][0-9a-f])")


_SHARD_NAME = re.compile(r"\.(?:tar|tar\.gz|tgz)$")


def place_word(url: str, member: Optional[str] = None) -> str:
    """How an error names the place its URL is: ``shard`` (a tar's name, a ``pipe:`` command, or
    a URL with a member in it), ``prefix`` (a folder or object prefix, ending in ``/``), else
    ``at`` (a listing, a manifest, a folder named without its ``/``): an error about listing a
    prefix or reading a manifest does not call it a shard."""
    if member is not None or url.startswith("pipe:") or _SHARD_NAME.search(url.split("?", 1)[0]):
        return "shard"
    return "prefix" if url.endswith("/") else "at"


def printable(name: Optional[str]) -> str:
    """``name`` quoted for messages, its undecodable bytes (kept as ``surrogateescape``
    surrogates, so distinct byte names stay distinct) shown as ``\\xe9``: ``'caf\\xe9.jpg'``."""
    return _SURROGATE.sub(lambda m: m.group(1) or "\\x" + m.group(2), repr(name))


def _in_subprocess() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None


class DalistreamError(Exception):
    """Base of all dalistream errors.

    Attributes ``url``, ``member``, ``rank`` and ``worker`` say where the error happened
    (``None`` where not known); ``hint`` says what to do about it; ``reason`` is the kind of
    problem, the key under which ``on_error="skip"`` counts it.
    """

    reason = "error"

    def __init__(
        self,
        message: str,
        *,
        url: Optional[str] = None,
        member: Optional[str] = None,
        rank: Optional[int] = None,
        worker: Optional[int] = None,
        hint: Optional[str] = None,
        reason: Optional[str] = None,
    ) -> None:
        self.message = redact(message)
        self.url = redact(url) if url is not None else None
        self.member = member
        self.rank = rank
        self.worker = worker
        self.hint = redact(hint) if hint else hint
        if reason is not None:
            self.reason = reason
        super().__init__(self.render())

    def render(self) -> str:
        """The message with its place (shard, member, rank, worker) and hint, as shown to users."""
        where = []
        if self.url is not None:
            where.append(f"{place_word(self.url, self.member)} {self.url}")
        if self.member is not None:
            where.append(f"member {printable(self.member)}")
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.worker is not None:
            where.append(f"worker {self.worker}")
        text = self.message
        if where:
            text += " [" + ", ".join(where) + "]"
        if self.hint:
            text += f". {self.hint}"
        return text

    def at(self, *, rank: Optional[int] = None, worker: Optional[int] = None) -> "DalistreamError":
        """Fill in rank and worker (if not yet known) and return self, for re-raising.

        In a worker process this also attaches a one-line machine-readable note (the fields as
        JSON) to the exception: DALI passes only the text of a worker's traceback to the main
        process, and the loader rebuilds the same error from that note.
        """
        if self.rank is None and rank is not None:
            self.rank = rank
        if self.worker is None and worker is not None:
            self.worker = worker
        self.args = (self.render(),)
        if _in_subprocess():
            notes = [n for n in getattr(self, "__notes__", []) if not n.startswith(FIELDS_NOTE)]
            notes.append(FIELDS_NOTE + json.dumps(self.fields()))
            self.__notes__ = notes
        return self

    def fields(self) -> Dict[str, Any]:
        """The error as plain data: class name, message, place, hint and reason."""
        return {"type": type(self).__name__, "message": self.message, "url": self.url, "member": self.member,
                "rank": self.rank, "worker": self.worker, "hint": self.hint, "reason": self.reason}

    @staticmethod
    def from_fields(fields: Dict[str, Any]) -> "DalistreamError":
        """Rebuild an error from :meth:`fields` (an unknown class name gives a :class:`WorkerError`)."""
        cls = _CLASSES.get(str(fields.get("type")), WorkerError)
        return cls(str(fields.get("message", "")), url=fields.get("url"), member=fields.get("member"),
                   rank=fields.get("rank"), worker=fields.get("worker"), hint=fields.get("hint"),
                   reason=fields.get("reason"))

    def __reduce__(self):  # keep the fields across process boundaries (pickle/dill)
        return (_rebuild, (type(self), self.message, self.url, self.member, self.rank, self.worker, self.hint,
                           self.reason))


def _rebuild(cls, message, url, member, rank, worker, hint, reason=None):
    return cls(message, url=url, member=member, rank=rank, worker=worker, hint=hint, reason=reason)


class ConfigError(DalistreamError, ValueError):
    """Invalid arguments: layout, batch size, fields, policy."""

    reason = "config"


class SourceError(DalistreamError):
    """A source could not be listed, opened or read (missing file, no shards matched, 404, 403)."""

    reason = "unreadable"


class ShardFormatError(DalistreamError):
    """A shard is not a valid tar stream (empty, truncated, not a tar, bad gzip, bad header)."""

    reason = "bad_tar"


class SampleError(DalistreamError):
    """A sample is unusable: missing field, duplicate key or member, undecodable value or image,
    member too large."""

    reason = "bad_sample"


class ManifestError(DalistreamError):
    """Per-shard counts are missing or disagree with the data."""

    reason = "manifest"


class StateError(DalistreamError):
    """A saved loader state does not fit the loader it is loaded into."""

    reason = "state"


class WorkerError(DalistreamError):
    """A DALI worker process died, or the DALI pipeline failed outside dalistream's own code;
    the message (and ``worker_traceback``) holds what DALI reported."""

    reason = "worker"


_CLASSES = {cls.__name__: cls for cls in (DalistreamError, ConfigError, SourceError, ShardFormatError, SampleError,
                                          ManifestError, StateError, WorkerError)}


# -- third-party loggers --------------------------------------------------------------------------

#: Loggers of the HTTP and S3 client libraries dalistream reads through: at DEBUG they print request
#: lines with presigned query strings and headers with the access key id.
CLIENT_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3", "requests", "aiobotocore", "fsspec", "s3fs", "azure",
                  "google", "huggingface_hub", "httpx", "httpcore")


def redact_client_logs() -> None:
    """Redact (as :func:`redact` does) every log record of :data:`CLIENT_LOGGERS` and their child
    loggers, from its creation: a log record factory, installed once per process (by
    ``Stream.open`` and in each DALI worker), so that no handler, level or filter configured later
    can print what the libraries log unredacted."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "dalistream_redacts", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        name = record.name
        if name.partition(".")[0] in CLIENT_LOGGERS:
            try:
                text = record.getMessage()
            except Exception:  # a malformed record: left to logging's own error report
                return record
            record.msg, record.args = redact(text), None
        return record

    factory.dalistream_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
