"""Manifest formats read as manifests, each validated row by row: every problem is a
:class:`ManifestError` naming the manifest file and the row.

- dalistream's own JSON (``dalistream index``)::

    {"format": "dalistream-manifest", "version": 1,
     "shards": [{"url": "part-0.tar", "samples": 1000, "bytes": 123456, "offsets": [0, 5120, …],
                 "members": {"patterns": [{"exts": ["jpg", "cls"], "headers": [1, 1]}, …],
                             "kinds": [0, 0, 1, …], "sizes": [4035, 1, 3950, 2, …]}}, …]}

  (``members``, for a regular shard only: its sample patterns (member extensions in tar order and
  the 512-byte header blocks before each one's data, 1 each if left out), each sample's pattern
  (``kinds``; left out when there is one pattern) and every member's size, which let a worker cut
  samples out of the bytes without parsing headers: :mod:`.members`; ``keys``, written by
  ``dalistream index --keys``: per-sample key columns for buckets, one integer per sample each,
  ``-1`` where unknown, e.g. ``{"width": [640, …], "height": [480, …], "length:txt": [31, …]}``:
  :mod:`.keys`);

- webdataset's ``wids`` shard index: ``{"__kind__": "wids-shard-index-v1", "wids_version": 1,
  "shardlist": [{"url": …, "nsamples": …, "filesize": …}, …]}`` (no offsets);
- DALI's ``wds2idx`` index files, one per shard: ``v1.2 N``, then per sample its members as
  ``ext data_offset size name`` groups: counts, and offsets (``data_offset - 512`` of the first
  member, when no member name needs a long-name or pax header: every name ASCII and under 100
  bytes; otherwise the shard's samples are found by walking its headers).

Row URLs that are relative are resolved against the manifest's own location; rows are matched
to shards by full URL (see :mod:`.files`).
"""

from __future__ import annotations

import os
import posixpath
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ManifestError
from ..io.local import local_path
from ..sources import is_remote
from .members import MemberLayout, check_members, pattern_problem
from .offsets import running_starts
from .rows import ShardInfo, ShardRows

FORMAT = "dalistream-manifest"
WIDS_KIND = "wids-shard-index-v1"


def _folder(manifest: str) -> str:
    """The folder relative row URLs are resolved against."""
    return manifest if is_remote(manifest) else os.path.dirname(os.path.abspath(local_path(manifest)))


def resolve(url: str, manifest: str, folder: Optional[str] = None) -> str:
    """A row's URL as a shard URL: relative ones joined to the manifest's folder; local paths absolute."""
    if is_remote(url):
        return url
    url = local_path(url)  # (a file:// row: its path)
    if is_remote(manifest):
        scheme, rest = manifest.split("://", 1)
        host, _, key = rest.partition("/")
        joined = posixpath.normpath(url.lstrip("/") if url.startswith("/") else posixpath.join(posixpath.dirname(key), url))
        parts = joined.split("/")
        while parts and parts[0] in ("..", "."):  # above the bucket's root: clamped to it
            parts.pop(0)
        return f"{scheme}://{host}/" + "/".join(parts)
    if url.startswith("~"):
        url = os.path.expanduser(url)
    if not url.startswith("/"):
        url = os.path.join(folder if folder is not None else _folder(manifest), url)
    return os.path.normpath(url) if ("/." in url or "//" in url) else url


def _count(value: Any, what: str, manifest: str, row: int, url: Optional[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
        raise ManifestError(f"manifest row {row}: {what} must be a non-negative integer, got {value!r}",
                            url=url, reason="bad_manifest", hint=f"manifest {manifest}: rebuild it with `dalistream index`")
    return value


def _bad(message: str, manifest: str, row: Optional[int] = None, url: Optional[str] = None) -> ManifestError:
    where = f"manifest row {row}: " if row is not None else ""
    return ManifestError(f"{where}{message}", url=url, reason="bad_manifest",
                         hint=f"manifest {manifest}: rebuild it with `dalistream index`")


def _checked_row(raw: Any, manifest: str, row: int, url_key: str, samples_key: str, bytes_key: str,
                 folder: Optional[str] = None) -> ShardInfo:
    if not isinstance(raw, dict):
        raise _bad(f"not an object: {raw!r}", manifest, row)
    url = raw.get(url_key)
    if not isinstance(url, str) or not url:
        raise _bad(f"no {url_key!r}", manifest, row)
    url = resolve(url, manifest, folder)
    if samples_key not in raw:
        raise _bad(f"no {samples_key!r} (sample count)", manifest, row, url)
    samples = _count(raw[samples_key], samples_key, manifest, row, url)
    size = raw.get(bytes_key, -1)
    if size != -1:
        _count(size, bytes_key, manifest, row, url)
    offsets = raw.get("offsets")
    if offsets is not None:
        if not isinstance(offsets, list) or len(offsets) != samples:
            raise _bad(f"'offsets' must list one offset per sample ({samples})", manifest, row, url)
    members = raw.get("members")
    if members is not None:
        members = _row_members(members, samples)
        if isinstance(members, str):
            raise _bad(f"'members': {members}", manifest, row, url)
    keys = raw.get("keys")
    if keys is not None:
        problem = key_problem(keys, samples)
        if problem:
            raise _bad(f"'keys': {problem}", manifest, row, url)
    return ShardInfo(url, samples, size, tuple(offsets) if offsets is not None else None, members, keys)


def key_problem(keys: Any, samples: int) -> Optional[str]:
    """What is wrong with a row's ``keys`` (``None``: nothing): an object of named lists, one
    integer from -1 (unknown) up per sample."""
    if not isinstance(keys, dict) or not all(isinstance(k, str) and k for k in keys):
        return "must be an object of named lists"
    for name, values in keys.items():
        if not isinstance(values, list) or len(values) != samples:
            return f"{name!r} must list one value per sample ({samples})"
        if not all(type(v) is int and -1 <= v < 1 << 62 for v in values):
            return f"{name!r} must hold integers >= -1 (-1: unknown)"
    return None


def _key_columns(rows: list, samples: list, starts: np.ndarray) -> Any:
    """The rows' keys as flat columns (``None``: no row has keys), or ``False`` when one row's are
    not plainly valid (the row-by-row check then names it)."""
    raw = _column(rows, "keys")
    if raw.count(None) == len(raw):
        return None
    if not all(k is None or (type(k) is dict and all(type(v) is list and len(v) == n for v in k.values()))
               for k, n in zip(raw, samples)):
        return False
    names = sorted({name for k in raw if k for name in k})
    if not all(type(name) is str and name for name in names):
        return False
    out = {}
    for name in names:
        column = np.full(int(starts[-1]), -1, dtype=np.int64)
        for s, k in enumerate(raw):
            values = k.get(name) if k else None
            if values:
                column[starts[s]:starts[s + 1]] = values if all(type(v) is int for v in values) else -2
        if (column < -1).any():
            return False
        out[name] = column
    return out


def _row_members(raw: Any, samples: int) -> Any:
    """A row's ``members`` as :data:`~.members.Members` (checked with the offsets later), or what is
    wrong with its shape."""
    patterns = raw.get("patterns") if isinstance(raw, dict) else None
    if not isinstance(patterns, list) or not isinstance(raw.get("sizes"), list) \
            or not all(isinstance(p, dict) and isinstance(p.get("exts"), list) for p in patterns):
        return "must be an object with 'patterns' (objects with a list 'exts') and a list 'sizes'"
    headers = [p.get("headers", [1] * len(p["exts"])) for p in patterns]
    kinds = raw.get("kinds", [0] * samples if len(patterns) == 1 else None)
    if not isinstance(kinds, list) or not all(isinstance(h, list) for h in headers):
        return "'kinds' (one pattern per sample) and each pattern's 'headers' must be lists"
    return tuple((tuple(p["exts"]), tuple(h)) for p, h in zip(patterns, headers)), tuple(kinds), tuple(raw["sizes"])


def _check_members(infos: List[ShardInfo], manifest: str) -> None:
    """Every row's member layout (after its offsets were checked): extensions, sizes, and sizes
    that add up to the distances between the row's offsets."""
    for row, info in enumerate(infos):
        if info.members is not None:
            problem = check_members(info.members, info.samples, info.offsets)
            if problem:
                raise _bad(f"'members': {problem}", manifest, row, info.url)


def _check_flat_offsets(flat: np.ndarray, starts: np.ndarray, manifest: str, urls: Sequence[str],
                        row_ids: Optional[Sequence[int]] = None) -> None:
    """Offsets of all rows at once (``flat``, row ``k``'s at ``starts[k]:starts[k + 1]``):
    increasing multiples of 512 within each row; the first bad row is named."""
    wrong = (flat % 512 != 0) | (flat < 0)
    step = np.diff(flat) <= 0
    firsts = starts[1:-1]
    step[firsts[(firsts > 0) & (firsts < len(flat))] - 1] = False  # a row's first offset need not exceed the last row's last
    wrong[1:] |= step
    if not wrong.any():
        return
    k = int(np.searchsorted(starts, int(np.argmax(wrong)), side="right")) - 1
    row = row_ids[k] if row_ids is not None else k
    raise _bad("'offsets' must be increasing multiples of 512", manifest, row, urls[k])


def _check_offsets(infos: List[ShardInfo], manifest: str) -> None:
    """Every row's offsets increasing multiples of 512 from 0 on, checked for all rows at once
    (a per-row check costs more than the parse at 100,000 rows)."""
    rows = [i for i, info in enumerate(infos) if info.offsets]
    if not rows:
        return
    bad = next((k for k, i in enumerate(rows)
                if any(isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < 1 << 62 for o in infos[i].offsets)),
               None)
    if bad is not None:
        raise _bad("'offsets' must be increasing multiples of 512", manifest, rows[bad], infos[rows[bad]].url)
    flat = np.array([o for i in rows for o in infos[i].offsets], dtype=np.int64)
    starts = running_starts([len(infos[i].offsets) for i in rows])
    _check_flat_offsets(flat, starts, manifest, [infos[i].url for i in rows], rows)


def _simple(url: str) -> bool:
    """A relative row URL that joins to its folder as is: no scheme, ``~``, ``.``/``..``, ``//`` or
    trailing ``/`` (which normalizing would change)."""
    return (bool(url) and url[0] not in "/~." and ":" not in url and "/." not in url and "//" not in url
            and not url.endswith("/"))


def _all_simple(urls: List[str]) -> bool:
    """:func:`_simple` for every one of ``urls``, checked over their joined text and their first
    and last characters at once."""
    text = "\n".join(urls)
    if text.count("\n") != len(urls) - 1 or ":" in text or "/." in text or "//" in text:
        return False
    firsts = set(map(itemgetter(slice(0, 1)), urls))  # ("" for an empty URL)
    return firsts.isdisjoint(("/", "~", ".", "")) and "/" not in set(map(itemgetter(slice(-1, None)), urls))


def _column(rows: list, key: str, default: Any = None) -> list:
    """``row.get(key, default)`` of every row (a list of dicts), without a Python loop."""
    return list(map(dict.get, rows, repeat(key, len(rows)), repeat(default, len(rows))))


def _only(values: list, kind: type) -> bool:
    """True when every value is exactly of type ``kind`` (``bool`` is no ``int``)."""
    return set(map(type, values)) <= {kind}


def _columns(rows: list, manifest: str, folder: str, keys: Tuple[str, str, str]) -> Optional[ShardRows]:
    """The rows as columns when every row is plainly valid (the common case, checked a column at a
    time, without Python per row where the rows are plain); ``None`` sends the manifest through
    the row-by-row check, which names the bad row."""
    url_key, samples_key, bytes_key = keys
    if not _only(rows, dict):
        return None
    urls, samples, sizes = _column(rows, url_key), _column(rows, samples_key), _column(rows, bytes_key, -1)
    if not (_only(urls, str) and "" not in urls and _only(samples, int) and _only(sizes, int)):
        return None
    try:
        counts = np.array(samples, dtype=np.int64) if samples else np.zeros(0, dtype=np.int64)
        size_col = np.array(sizes, dtype=np.int64) if sizes else np.zeros(0, dtype=np.int64)
    except OverflowError:
        return None
    if (counts < 0).any() or ((size_col < 0) & (size_col != -1)).any():
        return None
    # no row holds more than its URL, count and size (a wids index, a counts-only manifest): no
    # offsets, members or keys to look for, row by row
    sized = sum(map(dict.__contains__, rows, repeat(bytes_key, len(rows))))
    plain = sum(map(len, rows)) == 2 * len(rows) + sized
    offsets = None
    lists = [None] if plain else _column(rows, "offsets")
    if lists.count(None) != len(lists):
        if not _only(lists, list) or list(map(len, lists)) != samples:
            return None
        flat = np.array(list(chain.from_iterable(lists)))
        if flat.size and (flat.ndim != 1 or flat.dtype.kind != "i"):
            return None
        offsets = flat.astype(np.int64, copy=False) if flat.size else np.zeros(0, dtype=np.int64)
    members = None if plain else _member_columns(rows, samples, offsets, running_starts(counts))
    if members is False:
        return None
    try:
        keys = None if plain else _key_columns(rows, samples, running_starts(counts))
    except (OverflowError, TypeError, ValueError):
        return None
    if keys is False:
        return None
    prefix = resolve("x", manifest, folder)[:-1]  # what a plain relative name is joined to, worked out once
    if _all_simple(urls) and "\n" not in prefix:  # (the common case: names relative to the manifest's folder)
        resolved = (prefix + ("\n" + prefix).join(urls)).split("\n") if urls else []
    else:
        resolved = [prefix + u if _simple(u) else resolve(u, manifest, folder) for u in urls]
    if len(set(resolved)) != len(resolved):
        return None
    return ShardRows(resolved, counts, size_col, offsets, members, keys)


def _member_columns(rows: list, samples: list, offsets: Optional[np.ndarray], starts: np.ndarray) -> Any:
    """The rows' member layouts as a :class:`MemberLayout` (``None``: no row has one), or ``False``
    when one is not plainly valid (the row-by-row check then names it)."""
    raw = _column(rows, "members")
    if raw.count(None) == len(raw):
        return None
    table: dict = {}
    local_to_global: List[int] = []  # every row's patterns, in row order, as global pattern numbers
    base, width, kinds, sizes = [], [], [], []
    for m, n in zip(raw, samples):
        base.append(len(local_to_global))
        if m is None:
            width.append(0)
            kinds.append(None)
            continue
        shaped = _row_members(m, n)
        if isinstance(shaped, str):
            return False
        patterns, row_kinds, row_sizes = shaped
        for exts, headers in patterns:
            if pattern_problem(exts, headers):
                return False
            local_to_global.append(table.setdefault((exts, headers), len(table)))
        if not patterns or len(row_kinds) != n:
            return False
        width.append(len(patterns))
        kinds.append(row_kinds)
        sizes.append(row_sizes)
    counts = np.array(samples, dtype=np.int64)
    local = np.array(list(chain.from_iterable(k if k is not None else [-1] * n for k, n in zip(kinds, samples))))
    flat_sizes = np.array(list(chain.from_iterable(sizes)))
    if (local.size and (local.dtype.kind != "i" or local.ndim != 1)) or \
            (flat_sizes.size and (flat_sizes.dtype.kind != "i" or flat_sizes.ndim != 1 or (flat_sizes < 0).any())):
        return False
    row_width = np.repeat(np.array(width, dtype=np.int64), counts)
    regular = np.repeat(np.array([k is not None for k in kinds]), counts)
    if ((local >= row_width) | (regular & (local < 0))).any():
        return False
    mapping = np.array(local_to_global + [-1], dtype=np.int32)
    kind = np.where(regular, mapping[np.where(regular, np.repeat(np.array(base, dtype=np.int64), counts) + local, -1)], -1)
    try:
        layout = MemberLayout(list(table), kind, flat_sizes.astype(np.int64, copy=False), counts)
    except ValueError:  # sizes that do not match the samples' patterns
        return False
    listed = np.zeros(len(rows), dtype=np.int64)  # member sizes each row lists
    listed[[i for i, k in enumerate(kinds) if k is not None]] = [len(r) for r in sizes]
    if not np.array_equal(layout.member_starts[starts[1:]] - layout.member_starts[starts[:-1]], listed):
        return False
    if layout.first_mismatch(offsets, starts) >= 0:
        return False
    return layout


def parse_json(payload: Any, manifest: str) -> ShardRows:
    """Rows of a dalistream manifest or a wids index (already parsed JSON), validated."""
    if not isinstance(payload, dict):
        raise _bad("not a manifest (not a JSON object)", manifest)
    if payload.get("__kind__") == WIDS_KIND:
        rows = payload.get("shardlist")
        keys = ("url", "nsamples", "filesize")
    elif payload.get("format") == FORMAT:
        if payload.get("version") != 1:
            raise _bad(f"manifest version {payload.get('version')!r} is not supported (1 is)", manifest)
        rows = payload.get("shards")
        keys = ("url", "samples", "bytes")
    else:
        raise _bad(f"not a manifest: neither format {FORMAT!r} nor a wids index ({WIDS_KIND!r})", manifest)
    if not isinstance(rows, list):
        raise _bad("its list of shards is missing", manifest)
    folder = _folder(manifest)
    table = _columns(rows, manifest, folder, keys)
    if table is not None:
        if table.offsets is not None and len(table.offsets):
            _check_flat_offsets(table.offsets, table.starts, manifest, table.urls)
        return table
    infos = [_checked_row(raw, manifest, i, *keys, folder=folder) for i, raw in enumerate(rows)]
    _check_offsets(infos, manifest)
    _check_members(infos, manifest)
    seen: dict = {}
    for i, info in enumerate(infos):
        if info.url in seen:
            raise _bad(f"shard listed twice (rows {seen[info.url]} and {i})", manifest, i, info.url)
        seen[info.url] = i
    return ShardRows.from_infos(infos)


def parse_idx(text: str, index: str, shard_url: str) -> ShardInfo:
    """A shard's row from its ``wds2idx`` index file's text."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or not head[0].startswith("v1.") or not head[1].isdigit():
        raise _bad(f"not a wds2idx index file (first line {lines[0][:40]!r})" if lines else "empty index file",
                   index, url=shard_url)
    samples = int(head[1])
    if len(lines) - 1 < samples:
        raise _bad(f"index file lists {len(lines) - 1} samples, its header says {samples}", index, url=shard_url)
    offsets: Optional[List[int]] = []
    for row, line in enumerate(lines[1:samples + 1], start=1):
        fields = line.split()
        if not fields or len(fields) % 4:
            raise _bad(f"line {row + 1}: expected 'ext offset size name' groups", index, url=shard_url)
        try:
            data = [int(fields[i]) for i in range(1, len(fields), 4)]
        except ValueError:
            raise _bad(f"line {row + 1}: offsets are not integers", index, url=shard_url) from None
        if offsets is not None:
            if any(len(fields[i].encode()) > 99 or not fields[i].isascii() for i in range(3, len(fields), 4)):
                # a long or non-ASCII name lives in a GNU long-name or pax header before the member's
                # own (whose name field then holds something else): where the sample starts is unknown
                offsets = None
            else:
                offsets.append(min(data) - 512)
    return ShardInfo(shard_url, samples, -1, tuple(offsets) if offsets is not None else None)
