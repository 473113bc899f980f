"""Whole or absent: where a set is written, what is there already, and the order a set lands in.

A write begins by putting the writer's marker (:data:`~dalistream.sources.unfinished.MARKER`)
into the output and removing the set it replaces; shards are written under temporary names
(``NAME.tar.part``, or a local folder for an ``s3://`` output) and put under their final names
once all are written; the manifest comes last. At every moment a read of the output finds
either a whole set or a marker without its manifest, which it refuses
(:func:`dalistream.sources.unfinished.refuse_unfinished`). On an object store each PUT is
atomic, so shards are uploaded under their final names; the manifest is still last.

:func:`begin` and :func:`commit` are the only steps that write into the output, through a
:class:`Target` (the output's own listing, put, place and delete).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..io.local import local_path
from ..io.remote import delete_object, list_objects, read_bytes, write_bytes
from ..io.stores import check_writable, is_local
from ..lifetime import alive, host_tag, owner_tag
from ..sources import is_shard_name
from ..sources.unfinished import MANIFEST, MARKER, is_part

log = logging.getLogger(__name__)


class Target:
    """A local folder, or a folder of any object store (``s3://``, ``gs://``, ``az://``, ``hf://``),
    that a set is written into. A local output is written by renames; an object store's through
    the store protocol (:mod:`dalistream.io.remote`), where each object's write is atomic."""

    def __init__(self, output: str, options: Optional[Mapping[str, Any]] = None) -> None:
        check_writable(output)  # (before anything is listed or written)
        self.remote = not is_local(output)
        self.options = options
        self.url = output.rstrip("/") + "/" if self.remote else os.path.abspath(local_path(output))

    def url_of(self, name: str) -> str:
        return self.url + name if self.remote else os.path.join(self.url, name)

    def names(self) -> List[str]:
        """What the output holds: names relative to it (those in sub-folders with their ``/``)."""
        if self.remote:
            return [o.url[len(self.url):] for o in list_objects(self.url, self.options)]
        out: List[str] = []
        for folder, dirs, files in os.walk(self.url):
            rel = os.path.relpath(folder, self.url)
            out.extend(f if rel == "." else f"{rel}/{f}" for f in files)
        return out

    def read(self, name: str) -> Optional[bytes]:
        try:
            return read_bytes(self.url_of(name), self.options)
        except Exception:  # noqa: BLE001 - an unreadable marker is an unknown owner
            return None

    def put(self, name: str, data: bytes) -> None:
        """A whole small object (the marker), atomically."""
        if not self.remote:
            os.makedirs(self.url, exist_ok=True)
        write_bytes(self.url_of(name), data, self.options)

    def place(self, name: str, path: str) -> None:
        """A shard written at ``path`` (a temporary name), under its final ``name``."""
        if self.remote:
            write_bytes(self.url_of(name), path, self.options)
            os.remove(path)
        else:
            os.replace(path, self.url_of(name))

    def delete(self, name: str) -> None:
        delete_object(self.url_of(name), self.options)


@dataclass
class Found:
    """What an output holds before a write: the old set's shards, temporary files and marker."""

    shards: List[str] = field(default_factory=list)
    parts: List[str] = field(default_factory=list)
    nested: List[str] = field(default_factory=list)  # shards in sub-folders (a read of the folder reads them too)
    manifest: bool = False
    marker: Optional[dict] = None  # the marker's content ({} when unreadable)

    @property
    def unfinished(self) -> bool:
        return (self.marker is not None and not self.manifest) or bool(self.parts)

    @property
    def old(self) -> List[str]:
        """What a new write removes: the old set's manifest first, then its shards and temporary files."""
        return ([MANIFEST] if self.manifest else []) + self.shards + self.parts


def survey(target: Target) -> Found:
    found = Found()
    for name in target.names():
        top = "/" not in name
        if name == MANIFEST:
            found.manifest = True
        elif name == MARKER:
            raw = target.read(MARKER)
            try:
                found.marker = json.loads(raw or b"") if raw else {}
            except ValueError:
                found.marker = {}
        elif is_shard_name(name):
            (found.shards if top else found.nested).append(name)
        elif is_part(name) and top:
            found.parts.append(name)
    return found


def owner_ended(marker: Optional[dict]) -> bool:
    """True when the write a marker belongs to ran on this host and its process has ended."""
    if not marker or not isinstance(marker.get("owner"), str):
        return False
    host, _, pid = marker["owner"].rpartition(".")
    return host == host_tag() and pid.isdigit() and not alive(int(pid))


def check_output(target: Target, found: Found, overwrite: bool) -> None:
    """Refuse to write where another set (whole, or a write still running or of another host)
    would be replaced without ``overwrite``, or where shards in sub-folders would be read with the
    new set."""
    where = target.url
    if found.nested:
        raise ConfigError(f"{len(found.nested)} shards in sub-folders ({', '.join(found.nested[:3])}) would be read "
                          "together with the new set", url=where, hint="write into another folder")
    if found.unfinished:
        if owner_ended(found.marker):
            log.warning("%s holds a write that did not finish (its process %s ended): replacing it", where,
                        found.marker.get("pid"))  # type: ignore[union-attr]
            return
        if not overwrite:
            who = found.marker
            what = (f"a write that did not finish (started by process {who.get('pid', '?')} on "
                    f"{who.get('host', 'an unknown host')} at {who.get('started', '?')}), which may still be running"
                    if who is not None else f"{len(found.parts)} shards under temporary names ({found.parts[0]}, …): "
                                            "a write or copy that did not finish")
            raise ConfigError(f"the folder holds {what}", url=where,
                              hint="pass --overwrite (overwrite=True) to replace it, or write into another folder")
        return
    if (found.shards or found.manifest or found.marker is not None) and not overwrite:
        what = f"{len(found.shards)} shards" + (" and a manifest" if found.manifest else "")
        raise ConfigError(f"the folder already holds a set ({what}): a new one would replace it", url=where,
                          hint="pass --overwrite (overwrite=True) to replace it, or write into another folder")


def marker(planned: int) -> bytes:
    """The marker's content: who writes, since when, how many shards it plans."""
    return json.dumps({"format": "dalistream-write", "version": 1, "owner": owner_tag(), "pid": os.getpid(),
                       "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "shards": planned}).encode()


def begin(target: Target, found: Found, planned: int) -> None:
    """Before the first shard: the marker (from now on a read refuses the output until the new
    manifest is there), then the old set's manifest, shards and temporary files removed."""
    target.put(MARKER, marker(planned))
    for name in found.old:
        target.delete(name)


def commit(target: Target, staged: Sequence[Tuple[str, str]], write_manifest: Callable[[], None]) -> None:
    """Every shard under its final name (``staged``: ``(name, temporary path)``), then the
    manifest, last: with it the set is whole."""
    for name, path in staged:
        target.place(name, path)
    write_manifest()
