"""Local files: a path or a ``file://`` URL. Read by positional reads (no read-ahead or parts:
the page cache does that); the version of a file is its ``(mtime_ns, inode)``; writes land under
a temporary name and are renamed into place."""

from __future__ import annotations

import os
import stat as file_mode
from typing import List, Optional

from ...errors import SourceError
from ..local import local_path, open_range, write_atomic
from .base import ObjectStore, Answer, Data, ObjectInfo, data_bytes


def file_version(st: os.stat_result) -> str:
    """A local file's version token: which file it is (device, inode) and when it was last
    written (mtime in ns): what changes when it is rewritten or replaced."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}"


class LocalStore(ObjectStore):
    """Local files (see module doc)."""

    scheme = "file"
    local = True
    ranged = False
    credential_source = "the file system's permissions"

    def list(self, prefix: str) -> List[ObjectInfo]:
        path = local_path(prefix)
        folder = path if path.endswith("/") else os.path.dirname(path) or "."
        found = []
        for here, dirs, files in os.walk(folder):
            dirs.sort()
            for name in files:
                full = os.path.join(here, name)
                if full.startswith(path) or (folder == "." and full[2:].startswith(path)):
                    try:
                        st = os.stat(full)
                    except OSError:
                        continue
                    found.append(ObjectInfo(full, st.st_size, file_version(st)))
        return sorted(found, key=lambda o: o.url)

    def stat(self, url: str) -> ObjectInfo:
        try:
            st = os.stat(local_path(url))
            if not file_mode.S_ISREG(st.st_mode):
                raise FileNotFoundError
        except FileNotFoundError:
            raise SourceError("file does not exist", url=url, reason="missing") from None
        except OSError as e:
            raise SourceError(f"cannot read file: {e.strerror}", url=url) from None
        return ObjectInfo(url, st.st_size, file_version(st))

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        part = open_range(url, start, end, marker=False)
        st = part.stat()
        if version is not None and file_version(st) != version:
            part.close()
            from ..retry import changed

            raise changed(url)
        return Answer(part, st.st_size, file_version(st))  # type: ignore[arg-type]

    def write(self, url: str, data: Data) -> None:
        path = local_path(url)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        payload = data_bytes(data)
        write_atomic(path, lambda f: f.write(payload))

    def delete(self, url: str) -> None:
        try:
            os.remove(local_path(url))
        except FileNotFoundError:
            pass

    def classify(self, error: BaseException, url: str, first: bool, what: str) -> Optional[Exception]:
        if isinstance(error, OSError):  # a local failure is not a network hiccup: never retried
            return SourceError(f"cannot read {what}: {error.strerror or error}", url=url)
        return None
