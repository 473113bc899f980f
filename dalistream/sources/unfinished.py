"""A set whose write did not finish is refused, never read as whole.

``dalistream write`` puts a marker (:data:`MARKER`) into the folder (or key prefix) before its
first shard and the manifest (:data:`MANIFEST`) after its last: a folder holding the marker
without the manifest is a write that did not finish (interrupted, killed, its store gone
away). Shards written under temporary names (``NAME.tar.part``, :data:`PART`) are shards not
yet whole, whoever wrote them (an interrupted write or download). Sets made by hand or by other
tools carry no marker, and are never refused for lacking a manifest.

:func:`refuse_unfinished` is the one check; every listing of a folder's (or a prefix's) entries
calls it with the entry names it has seen.
"""

from __future__ import annotations

from typing import Collection, Optional

from ..errors import SourceError

MARKER = "dalistream-write.json"
MANIFEST = "dalistream-manifest.json"
PART = ".part"
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def is_shard_name(name: str) -> bool:
    """True for file or object names that look like shards (``.tar``, ``.tar.gz``, ``.tgz``)."""
    return name.endswith(SHARD_SUFFIXES)


def is_part(name: str) -> bool:
    """True for a shard's temporary name (``NAME.tar.part``): a shard not yet whole."""
    return name.endswith(PART) and is_shard_name(name[:-len(PART)])


def unfinished(names: Collection[str]) -> Optional[str]:
    """Why a folder whose entries are ``names`` (base names) holds a write that did not finish,
    in words; ``None`` when it does not."""
    parts = sorted(n for n in names if is_part(n))
    if MARKER in names and MANIFEST not in names:
        extra = f" ({len(parts)} shards still under temporary names)" if parts else ""
        return f"it holds {MARKER} (dalistream write's marker) but no {MANIFEST}, which the writer puts last{extra}"
    if parts:
        shown = ", ".join(parts[:3]) + (" …" if len(parts) > 3 else "")
        return f"it holds {len(parts)} shards under temporary names ({shown}), not yet whole"
    return None


def refuse_unfinished(folder: str, names: Collection[str]) -> None:
    """A :class:`SourceError` (reason ``unfinished_write``) when ``folder`` (a path or URL, for the
    message) with entries ``names`` holds a write that did not finish."""
    why = unfinished(names)
    if why is not None:
        raise SourceError(f"the write of this data set did not finish: {why}", url=folder, reason="unfinished_write",
                          hint="write it again (`dalistream write ... --overwrite`); if the set is whole and made by "
                               f"hand, remove {MARKER} and any .part files")
