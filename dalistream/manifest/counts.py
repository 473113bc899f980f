"""Per-shard sample counts (and offsets), the front of the manifest stage, found without reading
the data set on every rank:

1. a manifest named by the user: dalistream JSON or a wids index, or DALI ``.idx`` files (a
   pattern ending in ``.idx``, one per shard, in order);
2. else a manifest where ``dalistream index`` writes by default (next to the shards), or a
   ``.idx`` file beside every ``.tar`` shard;
3. else a header scan (local shards: headers only, cached per file); remote shards are scanned
   only while their total size is below ``scan_limit_bytes``, else a :class:`ManifestError` gives
   the one ``dalistream index`` command to run.
"""

from __future__ import annotations

import glob
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import braceexpand

from ..errors import ManifestError, SourceError, redact
from ..io.local import local_path
from ..io.remote import list_objects, stat_object
from ..io.stores import any_ranged, is_local, is_ranged
from ..io.stores.base import glob_prefix, has_magic, match_glob
from ..sources.unfinished import MARKER, refuse_unfinished
from .files import Reader, default_location, lookup, manifest_reader, read_idx
from .rows import ShardInfo, ShardRows
from .scan import build_manifest, scan_tolerant

log = logging.getLogger(__name__)


@dataclass
class Counted:
    """Rows for every shard (as columns), where they came from (for messages) and the scan's
    problems (``skip``)."""

    rows: ShardRows
    source: str
    problems: list = field(default_factory=list)

    @property
    def infos(self) -> List[ShardInfo]:
        """The rows one :class:`ShardInfo` each (for the commands; the stream uses the columns)."""
        return self.rows.infos()


def _exists(url: str, options: Optional[Mapping[str, Any]]) -> bool:
    try:
        stat_object(url, options)
        return True
    except SourceError:
        return False


def _manifest_at(path: str, read: Reader) -> Optional[ShardRows]:
    """The rows of the manifest at ``path``, or None where none can be read (then counted otherwise)."""
    try:
        return read(path)
    except SourceError:
        return None


def _idx_beside(urls: Sequence[str], options: Optional[Mapping[str, Any]]) -> Optional[List[str]]:
    if not all(u.endswith(".tar") for u in urls):
        return None
    paths = [u[:-len(".tar")] + ".idx" for u in urls]
    if not _exists(paths[0], options):  # one probe decides: remote stores are not asked N times
        return None
    return paths


def _expand_idx(pattern: str, options: Optional[Mapping[str, Any]]) -> List[str]:
    out: List[str] = []
    for p in braceexpand.braceexpand(pattern):
        if not has_magic(p):
            out.append(p)
        elif is_local(p):
            out.extend(sorted(glob.glob(local_path(p))))
        else:
            out.extend(match_glob(p, [o.url for o in list_objects(glob_prefix(p), options)]))
    return out


def _remote_bytes(urls: Sequence[str], options: Optional[Mapping[str, Any]], limit: int) -> int:
    """Total size of the remote shards by HEAD requests, 32 at a time, stopping once past ``limit``
    (a large data set costs a few requests per rank, not one per shard)."""
    remote = [u for u in urls if is_ranged(u)]
    total = 0
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(remote)))) as pool:
        for i in range(0, len(remote), 32):
            total += sum(o.size or 0 for o in pool.map(lambda u: stat_object(u, options), remote[i:i + 32]))
            if total > limit:
                break
    return total


def count_samples(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False, tolerant: bool = False,
    scan_limit_bytes: Optional[int] = 1 << 30, progress: Optional[Callable[[ShardInfo], None]] = None,
    discover: bool = True, read: Optional[Reader] = None,
) -> Counted:
    """Every shard's row, found as the module doc says. ``tolerant`` (``on_error="skip"``): a
    scanned shard that cannot be read to its end is counted up to its problem (see
    :func:`~.scan.scan_tolerant`), its error logged as a warning and returned; ``scan_limit_bytes``
    None: always scan; ``progress`` is called with each scanned row; ``discover=False`` skips step 2
    (``dalistream index`` scans even where a manifest already lies); ``read``: how manifests are
    read (the resolution's :func:`~.files.manifest_reader`, shared with its listing)."""
    read = read or manifest_reader(cache_dir, options)
    if manifest and manifest.endswith(".idx"):
        return Counted(ShardRows.from_infos(read_idx(_expand_idx(manifest, options), urls, options)), f"index files {redact(manifest)}")
    if manifest:
        return Counted(lookup(urls, read(manifest), manifest),
                       f"manifest {redact(manifest)}")
    found = default_location(urls)
    beside = _manifest_at(found, read) if discover and found else None
    if beside is not None:
        return Counted(lookup(urls, beside, found), f"manifest {redact(found)}")
    if found and is_ranged(found):  # remote shards named one by one: their folder was not listed
        folder = found.rsplit("/", 1)[0]
        if _exists(f"{folder}/{MARKER}", options) and (discover or not _exists(found, options)):
            refuse_unfinished(folder + "/", [MARKER])
    idx = _idx_beside(urls, options) if discover else None
    if idx:
        return Counted(ShardRows.from_infos(read_idx(idx, urls, options)), "index files (.idx) beside the shards")
    if scan_limit_bytes is not None and any_ranged(urls):
        total = _remote_bytes(urls, options, scan_limit_bytes)
        if total > scan_limit_bytes:
            target = found or "FOLDER/dalistream-manifest.json"
            raise ManifestError(
                f"{len(urls)} remote shards (more than {scan_limit_bytes / 2**30:.2f} GiB: scan_limit_bytes) and no "
                f"manifest: counting them would read the whole data set on every rank", url=redact(urls[0]), reason="no_manifest",
                hint=f"run once: `dalistream index SOURCES -o {redact(target)}` (then it is found without being named), "
                     "or use policy='fixed' with batches_per_epoch")
    source = "header scan" + (f", cached in {cache_dir}" if cache_dir else "")
    if tolerant:
        infos, problems = scan_tolerant(urls, cache_dir=cache_dir, options=options, lowercase=lowercase, offsets=True,
                                        progress=progress)
        for problem in problems:
            log.warning("shard cannot be read to its end; counting the samples before the problem: %s", problem)
        return Counted(ShardRows.from_infos(infos), source, problems)
    return Counted(ShardRows.from_infos(build_manifest(urls, cache_dir=cache_dir, options=options, lowercase=lowercase,
                                                       offsets=True, progress=progress)), source)


def count_shards(
    urls: Sequence[str], *, manifest: Optional[str] = None, cache_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None, lowercase: bool = False, tolerant: bool = False,
    offsets: bool = True, progress: Optional[Callable[[ShardInfo], None]] = None, discover: bool = True,
) -> Tuple[List[ShardInfo], list]:
    """Every shard's row and the problems met, for the commands (``plan``, ``index``, ``bench``):
    :func:`count_samples` without the remote scan limit (a command the user runs on purpose);
    ``offsets=False`` drops the sample offsets from the rows."""
    counted = count_samples(urls, manifest=manifest, cache_dir=cache_dir, options=options, lowercase=lowercase,
                            tolerant=tolerant, scan_limit_bytes=None, progress=progress, discover=discover)
    infos = counted.infos if offsets else [ShardInfo(i.url, i.samples, i.bytes) for i in counted.infos]
    return infos, counted.problems
