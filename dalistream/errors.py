"""One exception hierarchy for every stage.

Every error carries, where known, the shard URL (credentials redacted), the tar member or
sample key, and the rank and worker that hit it, so a message from a cluster of hundreds of
loader workers still says where to look.
"""

from __future__ import annotations

import re
from typing import Optional

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_SECRET_QUERY = re.compile(
    r"(?i)(?P<k>(?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|"
    r"sig|token|access_token|secret|password|aws_secret_access_key|aws_access_key_id)=)[^&\s]+"
)


def redact(url: str) -> str:
    """Return ``url`` with user info and secret-looking query parameters replaced by ``***``."""
    url = _USERINFO.sub(r"\g<scheme>***@", str(url))
    return _SECRET_QUERY.sub(r"\g<k>***", url)


class DalistreamError(Exception):
    """Base of all dalistream errors.

    Attributes ``url``, ``member``, ``rank`` and ``worker`` say where the error happened
    (``None`` where not known); ``hint`` says what to do about it.
    """

    def __init__(
        self,
        message: str,
        *,
        url: Optional[str] = None,
        member: Optional[str] = None,
        rank: Optional[int] = None,
        worker: Optional[int] = None,
        hint: Optional[str] = None,
    ) -> None:
        self.message = message
        self.url = redact(url) if url is not None else None
        self.member = member
        self.rank = rank
        self.worker = worker
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.url is not None:
            where.append(f"shard {self.url}")
        if self.member is not None:
            where.append(f"member {self.member!r}")
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
        """Fill in rank and worker (if not yet known) and return self, for re-raising."""
        if self.rank is None and rank is not None:
            self.rank = rank
        if self.worker is None and worker is not None:
            self.worker = worker
        self.args = (self._render(),)
        return self

    def __reduce__(self):  # keep the fields across process boundaries (pickle/dill)
        return (
            _rebuild,
            (type(self), self.message, self.url, self.member, self.rank, self.worker, self.hint),
        )


def _rebuild(cls, message, url, member, rank, worker, hint):
    return cls(message, url=url, member=member, rank=rank, worker=worker, hint=hint)


class ConfigError(DalistreamError, ValueError):
    """Invalid arguments: layout, batch size, fields, policy."""


class SourceError(DalistreamError):
    """A source could not be listed or opened (missing file, no shards matched, 404, 403)."""


class ShardFormatError(DalistreamError):
    """A shard is not a valid tar stream (truncated, not a tar, bad header)."""


class SampleError(DalistreamError):
    """A sample is unusable: missing field, duplicate member, undecodable value, too large."""


class ManifestError(DalistreamError):
    """Per-shard counts are missing or disagree with the data."""


class StateError(DalistreamError):
    """A saved loader state does not fit the loader it is loaded into."""


class WorkerError(DalistreamError):
    """A DALI worker process failed; the message holds the worker's own traceback."""
