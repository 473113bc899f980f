"""Per-shard sample counts: the manifest behind ``even``/``exact`` epochs and ``len()``.

Counts come from, in order: a manifest file the user names; a cached header scan of local
shards (keyed by path, size and mtime, so an edited shard is scanned again); or a header scan
of the stream. A scan reads tar headers only and seeks over member data.

Manifest file format (JSON)::

    {"format": "dalistream-manifest", "version": 1,
     "shards": [{"url": "...", "samples": 1000, "bytes": 123456}, ...]}
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .errors import ManifestError, SourceError
from .shards import is_remote
from .streams import open_shard
from .tario import iter_samples

FORMAT = "dalistream-manifest"


@dataclass(frozen=True)
class ShardInfo:
    """One manifest row: shard URL, number of samples, size in bytes (as stored)."""

    url: str
    samples: int
    bytes: int


def scan_shard(url: str, options: Optional[Mapping[str, Any]] = None, lowercase: bool = False) -> ShardInfo:
    """Count the samples of one shard by reading its tar headers only."""
    count = 0
    with open_shard(url, 0, options) as stream:
        for _ in iter_samples(stream, url, keep=lambda i: False, lowercase=lowercase):
            count += 1
    size = os.path.getsize(url) if not is_remote(url) else -1
    return ShardInfo(url, count, size)


def _cache_path(cache_dir: str, url: str) -> Optional[str]:
    try:
        st = os.stat(url)
    except OSError:
        return None
    ident = f"{os.path.abspath(url)}|{st.st_size}|{st.st_mtime_ns}".encode()
    return os.path.join(cache_dir, "manifests", hashlib.sha256(ident).hexdigest()[:32] + ".json")


def _scan_cached(url: str, cache_dir: Optional[str], options, lowercase: bool) -> ShardInfo:
    path = _cache_path(cache_dir, url) if cache_dir and not is_remote(url) else None
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                return ShardInfo(**json.load(f))
        except (OSError, ValueError, TypeError):
            pass  # a broken cache entry is rescanned
    info = scan_shard(url, options, lowercase)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(info), f)
        os.replace(tmp, path)
    return info


def build_manifest(
    urls: Sequence[str], *, cache_dir: Optional[str] = None, options: Optional[Mapping[str, Any]] = None,
    lowercase: bool = False, threads: int = 8,
) -> List[ShardInfo]:
    """Scan every shard (in parallel threads; cached for local shards when ``cache_dir`` is set)."""
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        return list(pool.map(lambda u: _scan_cached(u, cache_dir, options, lowercase), urls))


def write_manifest(infos: Sequence[ShardInfo], path: str) -> None:
    """Write a manifest file atomically."""
    payload = {"format": FORMAT, "version": 1, "shards": [asdict(i) for i in infos]}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def read_manifest(path: str) -> Dict[str, ShardInfo]:
    """Read a manifest file into ``{url: ShardInfo}``."""
    try:
        with open(path) as f:
            payload = json.load(f)
    except FileNotFoundError:
        raise SourceError("manifest file does not exist", url=path) from None
    except ValueError as e:
        raise ManifestError(f"manifest is not valid JSON: {e}", url=path) from None
    if payload.get("format") != FORMAT:
        raise ManifestError("not a dalistream manifest (missing format marker)", url=path)
    return {row["url"]: ShardInfo(**row) for row in payload["shards"]}


def lookup_counts(urls: Sequence[str], table: Mapping[str, ShardInfo], manifest_path: str) -> List[int]:
    """Counts for ``urls`` from a manifest table; a URL may also match by its base name if unique."""
    by_base: Dict[str, List[ShardInfo]] = {}
    for info in table.values():
        by_base.setdefault(os.path.basename(info.url), []).append(info)
    counts = []
    for url in urls:
        info = table.get(url)
        if info is None:
            candidates = by_base.get(os.path.basename(url), [])
            if len(candidates) != 1:
                raise ManifestError("shard is not in the manifest", url=url, member=None,
                                    hint=f"rebuild it with `dalistream index ... -o {manifest_path}`")
            info = candidates[0]
        counts.append(info.samples)
    return counts


def shard_counts(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False,
) -> List[int]:
    """Sample count of every shard: from ``manifest`` if given, else a (cached) header scan."""
    if manifest:
        return lookup_counts(urls, read_manifest(manifest), manifest)
    return [i.samples for i in build_manifest(urls, cache_dir=cache_dir, options=options, lowercase=lowercase)]
