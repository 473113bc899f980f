"""Manifest files: per-shard counts (and offsets) written once, read by every rank.

Manifests are read from a local path, ``s3://`` or ``http(s)://``, and written to local disk or
uploaded next to the shards (``s3://bucket/prefix/manifest.json``).

Manifest file format (JSON)::

    {"format": "dalistream-manifest", "version": 1,
     "shards": [{"url": "...", "samples": 1000, "bytes": 123456, "offsets": [0, 5120, ...]}, ...]}

``offsets`` (optional, ``dalistream index --offsets``) are the tar offsets of each sample's first
header: a mid-shard resume then opens the shard at the first sample it still needs (a seek, or
a ranged GET for remote shards) instead of reading the consumed part.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..errors import ManifestError, SourceError, redact
from ..io.remote import is_fetched, put_bytes, read_bytes
from ..sources import is_remote
from .rows import ShardInfo

FORMAT = "dalistream-manifest"


def write_manifest(infos: Sequence[ShardInfo], path: str, options: Optional[Mapping[str, Any]] = None) -> None:
    """Write a manifest file atomically: a local path, or ``s3://bucket/key`` (uploaded with
    ``options``, the storage options)."""
    rows = [{k: (list(v) if k == "offsets" else v) for k, v in asdict(i).items() if k != "offsets" or v is not None}
            for i in infos]
    payload = {"format": FORMAT, "version": 1, "shards": rows}
    if is_remote(path):
        put_bytes(path, json.dumps(payload, indent=1).encode(), options)
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def read_manifest(path: str, options: Optional[Mapping[str, Any]] = None) -> Dict[str, ShardInfo]:
    """Read a manifest (local path, ``s3://`` or ``http(s)://``) into ``{url: ShardInfo}``."""
    try:
        if is_fetched(path):
            payload = json.loads(read_bytes(path, options))
        else:
            with open(path) as f:
                payload = json.load(f)
    except FileNotFoundError:
        raise SourceError("manifest file does not exist", url=path) from None
    except SourceError as e:
        raise SourceError(f"cannot read manifest: {e.message}", url=path, hint=e.hint) from None
    except ValueError as e:
        raise ManifestError(f"manifest is not valid JSON: {e}", url=path) from None
    if not isinstance(payload, dict):
        raise ManifestError("not a dalistream manifest (not a JSON object)", url=path)
    if payload.get("format") != FORMAT:
        raise ManifestError("not a dalistream manifest (missing format marker)", url=path)
    return {row["url"]: ShardInfo(**row) for row in payload["shards"]}


def lookup(urls: Sequence[str], table: Mapping[str, ShardInfo], manifest_path: str) -> List[ShardInfo]:
    """Rows for ``urls`` from a manifest table; a URL may also match by its base name if unique."""
    by_base: Dict[str, List[ShardInfo]] = {}
    for info in table.values():
        by_base.setdefault(os.path.basename(info.url), []).append(info)
    counts = []
    for url in urls:
        info = table.get(url) or table.get(redact(url))
        if info is None:
            candidates = by_base.get(os.path.basename(url), [])
            if len(candidates) != 1:
                raise ManifestError("shard is not in the manifest", url=url, member=None,
                                    hint=f"rebuild it with `dalistream index ... -o {manifest_path}`")
            info = candidates[0]
        counts.append(info)
    return counts
