"""``pipe:CMD``: the standard output of a shell command (as in the webdataset library). Read from
its start only; no listing, no size, no version; not written."""

from __future__ import annotations

from typing import List, Optional

from ...errors import SourceError
from ..local import PipeStream
from .base import ObjectStore, Answer, Data, ObjectInfo, no_write


class PipeStore(ObjectStore):
    """``pipe:`` sources (see module doc)."""

    scheme = "pipe"
    ranged = False
    listable = False
    writable = False
    credential_source = "the command's own"

    def list(self, prefix: str) -> List[ObjectInfo]:
        raise SourceError("pipe: sources cannot be listed", url=prefix, hint="name each command's output as a source")

    def stat(self, url: str) -> ObjectInfo:
        return ObjectInfo(url, None, None)

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        if start:
            raise SourceError("pipe: sources cannot be opened at an offset", url=url)
        return Answer(PipeStream(url), None, None)

    def write(self, url: str, data: Data) -> None:
        raise no_write("pipe:", url)

    def delete(self, url: str) -> None:
        raise no_write("pipe:", url)

