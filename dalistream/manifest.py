"""Per-shard sample counts: the manifest behind ``even``/``exact`` epochs and ``len()``.

Counts come from, in order: a manifest file the user names (a local path, ``s3://`` or
``http(s)://``); a cached header scan (local shards keyed by path, size and mtime; remote ones
by URL, size and ETag from a HEAD request, so an edited shard is scanned again); or a header
scan of the stream. A scan reads tar headers only and seeks over member data where it can
(remote shards are read through once, sequentially). Manifests can be written to local disk
or uploaded next to the shards (``s3://bucket/prefix/manifest.json``).

Manifest file format (JSON)::

    {"format": "dalistream-manifest", "version": 1,
     "shards": [{"url": "...", "samples": 1000, "bytes": 123456, "offsets": [0, 5120, ...]}, ...]}

``offsets`` (optional, ``dalistream index --offsets``) are the tar offsets of each sample's first
header: a mid-shard resume then opens the shard at the first sample it still needs (a seek, or
a ranged GET for remote shards) instead of reading the consumed part.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import ManifestError, SourceError, redact
from .shards import is_remote
from .streams import FETCHED, decompressed, open_raw
from .tario import iter_samples

FORMAT = "dalistream-manifest"


@dataclass(frozen=True)
class ShardInfo:
    """One manifest row: shard URL, number of samples, size in bytes (as stored), and optionally
    the tar offset of every sample."""

    url: str
    samples: int
    bytes: int
    offsets: Optional[Tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if self.offsets is not None:
            object.__setattr__(self, "offsets", tuple(self.offsets))
            if len(self.offsets) != self.samples:
                raise ManifestError(f"manifest row has {len(self.offsets)} offsets for {self.samples} samples",
                                    url=self.url)


def scan_shard(url: str, options: Optional[Mapping[str, Any]] = None, lowercase: bool = False,
               offsets: bool = False) -> ShardInfo:
    """Count the samples of one shard by reading its tar headers only (``offsets``: and record
    where each sample starts).

    ``bytes`` is the stored (possibly compressed) size: from the file system for local shards,
    from the server's answer for remote ones, ``-1`` for ``pipe:``. Remote URLs are recorded
    with credentials redacted.
    """
    count = 0
    starts: List[int] = []
    raw = open_raw(url, 0, options)
    size = getattr(getattr(raw, "raw", None), "size", None) if url.startswith(FETCHED) else None
    with decompressed(raw, url) as stream:
        for sample in iter_samples(stream, url, keep=lambda i: False, lowercase=lowercase):
            count += 1
            if offsets:
                starts.append(sample["__offset__"])
    if not is_remote(url):
        size = os.path.getsize(url[len("file://"):] if url.startswith("file://") else url)
    return ShardInfo(redact(url) if is_remote(url) else url, count, size if size is not None else -1,
                     tuple(starts) if offsets else None)


def _cache_path(cache_dir: str, url: str, options: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    if url.startswith(FETCHED):
        from .remote import stat_remote

        try:
            size, tag = stat_remote(url, options)
        except SourceError:
            return None  # e.g. a presigned URL valid for GET only: the scan reports real errors
        if size is None or not tag:
            return None  # no way to tell an edited object: always scan
        ident = f"{url}|{size}|{tag}".encode()
    else:
        try:
            st = os.stat(url)
        except OSError:
            return None
        ident = f"{os.path.abspath(url)}|{st.st_size}|{st.st_mtime_ns}".encode()
    return os.path.join(cache_dir, "manifests", hashlib.sha256(ident).hexdigest()[:32] + ".json")


def _scan_cached(url: str, cache_dir: Optional[str], options, lowercase: bool, offsets: bool = False) -> ShardInfo:
    path = _cache_path(cache_dir, url, options) if cache_dir and not url.startswith("pipe:") else None
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                cached = ShardInfo(**json.load(f))
            if cached.offsets is not None or not offsets:
                return cached
        except (OSError, ValueError, TypeError, ManifestError):
            pass  # a broken cache entry is rescanned
    info = scan_shard(url, options, lowercase, offsets)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(info), f)
        os.replace(tmp, path)
    return info


def build_manifest(
    urls: Sequence[str], *, cache_dir: Optional[str] = None, options: Optional[Mapping[str, Any]] = None,
    lowercase: bool = False, threads: int = 8, offsets: bool = False,
    progress: Optional[Callable[[ShardInfo], None]] = None,
) -> List[ShardInfo]:
    """Scan every shard (in parallel threads; cached when ``cache_dir`` is set); ``offsets``:
    record each sample's tar offset too; ``progress`` is called with each row as it is done."""
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        rows = []
        for info in pool.map(lambda u: _scan_cached(u, cache_dir, options, lowercase, offsets), urls):
            rows.append(info)
            if progress is not None:
                progress(info)
        return rows


def write_manifest(infos: Sequence[ShardInfo], path: str, options: Optional[Mapping[str, Any]] = None) -> None:
    """Write a manifest file atomically: a local path, or ``s3://bucket/key`` (uploaded with
    ``options``, the storage options)."""
    rows = [{k: (list(v) if k == "offsets" else v) for k, v in asdict(i).items() if k != "offsets" or v is not None}
            for i in infos]
    payload = {"format": FORMAT, "version": 1, "shards": rows}
    if is_remote(path):
        from .remote import put_bytes

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
        if path.startswith(FETCHED):
            from .remote import read_bytes

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


def shard_infos(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False,
) -> List[ShardInfo]:
    """Every shard's row (sample count, size): from ``manifest`` if given, else a (cached) header scan."""
    if manifest:
        return lookup(urls, read_manifest(manifest, options), manifest)
    return build_manifest(urls, cache_dir=cache_dir, options=options, lowercase=lowercase)


def shard_counts(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False,
) -> List[int]:
    """Sample count of every shard (see :func:`shard_infos`)."""
    return [i.samples for i in shard_infos(urls, manifest=manifest, cache_dir=cache_dir, options=options,
                                           lowercase=lowercase)]


def scan_tolerant(
    urls: Sequence[str], *, cache_dir: Optional[str] = None, options: Optional[Mapping[str, Any]] = None,
    lowercase: bool = False, threads: int = 8,
) -> "tuple[List[ShardInfo], list]":
    """:func:`build_manifest` for ``on_error="skip"``: a shard that cannot be scanned to its end
    (empty, truncated, not a tar, unreadable, duplicate keys) is not an error but is counted up
    to its problem — exactly the samples a worker delivers (or skips one by one) before it skips
    the rest of that shard — and not cached. Returns the infos and the errors met, in URL order."""
    from .errors import DalistreamError

    def one(url: str):
        try:
            return _scan_cached(url, cache_dir, options, lowercase), None
        except DalistreamError as e:
            return _scan_partial(url, options, lowercase), e

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        results = list(pool.map(one, urls))
    return [info for info, _ in results], [error for _, error in results if error is not None]


def _scan_partial(url: str, options: Optional[Mapping[str, Any]], lowercase: bool) -> ShardInfo:
    from .errors import DalistreamError

    count = 0
    try:
        with decompressed(open_raw(url, 0, options), url) as stream:
            for _ in iter_samples(stream, url, keep=lambda i: False, lowercase=lowercase, mark_errors=True):
                count += 1
    except DalistreamError:
        pass
    size = -1
    if not is_remote(url):
        try:
            size = os.path.getsize(url[len("file://"):] if url.startswith("file://") else url)
        except OSError:
            pass
    return ShardInfo(redact(url) if is_remote(url) else url, count, size)
