"""Buckets: batches by shape. Every batch holds samples of one bucket, so a pipeline resizes each
batch to its bucket's size (images) or pads it to its bucket's length (text) instead of
squashing or padding everything to one shape. A bucket is chosen per sample from its keys
(recorded before the epoch by ``dalistream index --keys``: :mod:`dalistream.manifest.keys`);
which samples form which batch is the pure plan's (:mod:`dalistream.plan.buckets`).

- :class:`AspectBuckets`: target sizes ``(width, height)``; a sample goes to the size whose
  aspect ratio is nearest its own on a log scale (``|log(w/h) − log(W/H)|``, ties to the first).
  :meth:`AspectBuckets.auto` computes ``n`` sizes from the data set's own distribution.
- :class:`LengthBuckets`: a member's byte length (or another key column: a clip's
  ``duration_ms``) against ``edges``: bucket ``i`` holds values up to ``edges[i]`` (and above
  ``edges[i-1]``), the last one those above ``edges[-1]``. A video's resolution buckets with
  :class:`AspectBuckets` over the ``width``/``height`` its probe records.

``per="rank"`` (default): each rank's batch is one bucket (ranks may hold different buckets at
the same step); ``per="global"``: the whole global batch is one bucket. A stream opened with
``buckets=`` carries each batch's bucket in the outputs ``outputs`` names, at every position. All values are frozen,
picklable and checked when made (:class:`~dalistream.errors.ConfigError`).

Users import them from :mod:`dalistream` (or :mod:`dalistream.buckets`); they live in the plan
package, below the config that carries them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, ManifestError

PER = ("rank", "global")
MAX_BUCKETS = 1 << 15


def _check_per(per: Any) -> None:
    if per not in PER:
        raise ConfigError(f"buckets: per must be one of {PER}, got {per!r}")


def check_bucket_schedule(policy: str, per: Any) -> None:
    """Buckets plan ``even`` and ``exact`` epochs, ``per`` rank or global."""
    if policy == "fixed":
        raise ConfigError("buckets need policy 'even' or 'exact' (a 'fixed' number of batches has no bucket plan)",
                          hint="use policy='even'")
    _check_per(per)


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"buckets: {what} must be a positive integer, got {value!r}")
    return int(value)


class _Buckets:
    """What both kinds of buckets share: ``per`` and ``lookahead`` checked, and :meth:`table`."""

    per: str
    lookahead: Optional[int]
    outputs: Tuple[str, ...]
    _positive: Tuple[str, ...] = ()  # other fields that must be positive integers

    def _check(self) -> None:
        _check_per(self.per)
        for name in self._positive:
            _positive_int(getattr(self, name), name)
        if self.lookahead is not None:
            _positive_int(self.lookahead, "lookahead")

    def table(self) -> np.ndarray:
        """Per bucket, then for a step of padding only (index ``-1``, bucket 0's values), the values
        of :attr:`outputs`: its index, then its :meth:`describe` values."""
        rows = [[k] + [self.describe(k)[name[len("bucket_"):]] for name in self.outputs[1:]]  # type: ignore[attr-defined]
                for k in range(len(self))]  # type: ignore[arg-type]
        return np.array(rows + [[-1] + rows[0][1:]], dtype=np.int32)


#: Which ``--keys`` item records a key column other than ``length:EXT`` (:mod:`dalistream.manifest.keys`).
_KEY_SPECS = {"width": "image", "height": "image", "frames": "video", "fps_milli": "video", "codec": "video",
              "duration_ms": "video (or audio)", "sample_rate": "audio", "channels": "audio"}


def missing_keys(columns: Sequence[str], keys: Optional[Mapping[str, np.ndarray]], what: str,
                 url: Optional[str] = None) -> ManifestError:
    """The error for buckets asked of a data set whose manifest lacks their keys (``url``: one of its shards)."""
    spec = ",".join(dict.fromkeys(_KEY_SPECS.get(c, c.split(":", 1)[-1]) for c in columns))
    have = f"it has {sorted(keys)}" if keys else "it has none (a counts-only or older manifest)"
    return ManifestError(f"{what} need the per-sample keys {list(columns)} in the manifest; {have}",
                         url=url, reason="no_keys", hint=f"run `dalistream index SOURCES --keys {spec}` (writes the "
                                                         f"manifest beside the shards), or give that manifest")


def _columns(keys: Optional[Mapping[str, np.ndarray]], columns: Sequence[str], what: str) -> list:
    if not keys or any(c not in keys for c in columns):
        raise missing_keys(columns, keys, what)
    return [np.asarray(keys[c], dtype=np.int64) for c in columns]


def _unknown(mask: np.ndarray, what: str, columns: Sequence[str], urls: Optional[Sequence[str]],
             starts: Optional[np.ndarray]) -> None:
    if not mask.any():
        return
    i = int(np.argmax(mask))
    url, where = None, f"sample {i}"
    if urls is not None and starts is not None:
        s = int(np.searchsorted(starts, i, side="right")) - 1
        url, where = urls[s], f"sample {i - int(starts[s])} of its shard"
    raise ManifestError(f"{what}: {where} has no {'/'.join(columns)} ({int(mask.sum())} samples have none: no such "
                        "member, an image of another format, or a header or media file that could not be read)", url=url,
                        reason="no_keys", hint="give every sample the member, or leave those samples out of the set")


def _kmeans_1d(values: np.ndarray, weights: np.ndarray, k: int) -> np.ndarray:
    """Centres of the ``k`` runs of sorted ``values`` (with ``weights``) of least total weighted
    squared distance to their means (dynamic programming, O(k·n²))."""
    n = len(values)
    sw = np.r_[0, np.cumsum(weights)]
    sx = np.r_[0, np.cumsum(weights * values)]
    sxx = np.r_[0, np.cumsum(weights * values ** 2)]

    def cost(i: np.ndarray, j: int) -> np.ndarray:  # runs values[i..j], for every i at once
        w, x = sw[j + 1] - sw[i], sx[j + 1] - sx[i]
        return (sxx[j + 1] - sxx[i]) - x * x / w

    best = np.full((k, n), np.inf)
    start = np.zeros((k, n), dtype=np.int64)
    best[0] = cost(np.zeros(n, dtype=np.int64), 0) if n == 1 else np.array([cost(np.array([0]), j)[0] for j in range(n)])
    for c in range(1, k):
        for j in range(c, n):
            i = np.arange(c, j + 1)
            total = best[c - 1, i - 1] + cost(i, j)
            pick = int(np.argmin(total))
            best[c, j], start[c, j] = total[pick], i[pick]
    centres, j = [], n - 1
    for c in range(k - 1, -1, -1):
        i = int(start[c, j]) if c else 0
        centres.append((sx[j + 1] - sx[i]) / (sw[j + 1] - sw[i]))
        j = i - 1
    return np.array(centres[::-1])


#: :meth:`AspectBuckets.auto`'s sizes hold between ``area / AREA_TOLERANCE`` and
#: ``area * AREA_TOLERANCE`` pixels.
AREA_TOLERANCE = 1.25


def _size(ratio: float, area: int, multiple: int) -> Tuple[int, int]:
    """Sides, multiples of ``multiple``, of ``area`` pixels within :data:`AREA_TOLERANCE`, whose
    ratio is nearest ``ratio`` (an area off by a factor counts half as much as a ratio off by it).
    Raises when no such sides exist (an area too small for the multiple)."""
    units = area / (multiple * multiple)  # the area in squares of multiple x multiple
    low, high = units / AREA_TOLERANCE, units * AREA_TOLERANCE
    h0 = math.sqrt(units / ratio)

    def best_of(heights: range) -> Optional[Tuple[float, int, int]]:
        best = None
        for h in heights:
            first, last = max(1, math.ceil(low / h - 1e-9)), math.floor(high / h + 1e-9)  # widths in tolerance
            if first > last:
                continue
            for w in {min(max(math.floor(h * ratio), first), last), min(max(math.ceil(h * ratio), first), last)}:
                score = abs(math.log(w / h / ratio)) + 0.5 * abs(math.log(w * h / units))
                if best is None or score < best[0]:
                    best = (score, w * multiple, h * multiple)
        return best

    best = best_of(range(max(1, int(h0 / 2)), int(2 * h0) + 3)) or best_of(range(1, math.floor(high) + 1))
    if best is None:
        raise ConfigError(f"AspectBuckets.auto: no sides in multiples of {multiple} make {area} pixels within a "
                          f"factor of {AREA_TOLERANCE}", hint="ask for a larger area or a smaller multiple")
    return best[1], best[2]


@dataclass(frozen=True)
class AspectBuckets(_Buckets):
    """Target image sizes ``(width, height)``; each sample goes to the size of nearest aspect
    ratio (log scale). ``sizes=None`` with ``n``: :meth:`auto`, resolved from the data set's keys
    by :meth:`resolve`. ``lookahead``: the most samples a worker may hold (read, not yet emitted);
    the plan refuses a layout that would need more (``None``: its bound, see the plan)."""

    sizes: Optional[Tuple[Tuple[int, int], ...]] = None
    per: str = "rank"
    n: Optional[int] = None
    area: int = 1024 * 1024
    multiple: int = 64
    lookahead: Optional[int] = None

    def __post_init__(self) -> None:
        self._check()
        if self.sizes is None:
            if self.n is None:
                raise ConfigError("AspectBuckets needs sizes [(width, height), …], or use AspectBuckets.auto(n=8)")
            if _positive_int(self.n, "n") > MAX_BUCKETS:
                raise ConfigError(f"AspectBuckets.auto: n must be at most {MAX_BUCKETS}, got {self.n}")
            _size(1.0, self.area, self.multiple)  # an area the multiple cannot make is refused now, not once resolved
            return
        if isinstance(self.sizes, (str, bytes)) or not isinstance(self.sizes, (list, tuple)) or not self.sizes:
            raise ConfigError(f"AspectBuckets: sizes must be a non-empty list of (width, height), got {self.sizes!r}")
        sizes = []
        for s in self.sizes:
            if not isinstance(s, (list, tuple)) or len(s) != 2:
                raise ConfigError(f"AspectBuckets: each size must be (width, height), got {s!r}")
            sizes.append((_positive_int(s[0], "a width"), _positive_int(s[1], "a height")))
        ratios = [w / h for w, h in sizes]
        if len(set(ratios)) != len(ratios):
            twin = next(s for s, r in zip(sizes, ratios) if ratios.count(r) > 1)
            raise ConfigError(f"AspectBuckets: two sizes have the aspect ratio of {twin}: a sample could not choose")
        if len(sizes) > MAX_BUCKETS:
            raise ConfigError(f"AspectBuckets: at most {MAX_BUCKETS} sizes, got {len(sizes)}")
        object.__setattr__(self, "sizes", tuple(sizes))

    @classmethod
    def auto(cls, n: int = 8, *, area: int = 1024 * 1024, multiple: int = 64, per: str = "rank",
             lookahead: Optional[int] = None) -> "AspectBuckets":
        """``n`` sizes computed from the data set's aspect ratios (:meth:`resolve`): the ``n``
        groups of its log aspect ratios (in steps of 1%) of least squared spread (1-D k-means,
        solved exactly), each group's size of ``area`` pixels at the group's mean ratio, sides
        multiples of ``multiple``. Every size's area is within a factor of :data:`AREA_TOLERANCE`
        (1.25) of ``area``: the ratio is the nearest these sides can make within it (a coarse
        multiple for the area, ``area=128*128, multiple=64``, leaves few ratios to choose from).
        An area no sides of that multiple make within it is refused."""
        return cls(None, per, n, area, multiple, lookahead)

    columns = ("width", "height")
    _positive = ("area", "multiple")

    def resolve(self, keys: Optional[Mapping[str, np.ndarray]]) -> "AspectBuckets":
        """These buckets with their sizes known: itself, or :meth:`auto`'s computed from ``keys``."""
        if self.sizes is not None:
            return self
        width, height = _columns(keys, self.columns, "AspectBuckets.auto")
        known = (width > 0) & (height > 0)
        if not known.any():
            raise ManifestError("AspectBuckets.auto: no sample has a known width and height", reason="no_keys")
        values, weights = np.unique(np.round(np.log(width[known] / height[known]), 2), return_counts=True)
        sizes: Dict[float, Tuple[int, int]] = {}
        for c in _kmeans_1d(values, weights.astype(np.float64), min(int(self.n), len(values))):  # type: ignore[arg-type]
            w, h = _size(math.exp(float(c)), self.area, self.multiple)
            sizes.setdefault(w / h, (w, h))  # groups that round to one ratio share its bucket
        return AspectBuckets(tuple(sorted(sizes.values(), key=lambda s: s[0] / s[1])), self.per, None, self.area,
                             self.multiple, self.lookahead)

    def assign(self, keys: Optional[Mapping[str, np.ndarray]], urls: Optional[Sequence[str]] = None,
               starts: Optional[np.ndarray] = None) -> np.ndarray:
        """Every sample's bucket (``int16``), from the ``width``/``height`` key columns; a sample
        without them raises, naming its shard when ``urls``/``starts`` (its rows) are given."""
        if self.sizes is None:
            return self.resolve(keys).assign(keys, urls, starts)
        width, height = _columns(keys, self.columns, "AspectBuckets")
        _unknown((width <= 0) | (height <= 0), "AspectBuckets", self.columns, urls, starts)
        targets = np.log(np.array([w / h for w, h in self.sizes]))
        order = np.argsort(targets, kind="stable")
        sorted_t = targets[order]
        x = np.log(width / height)
        j = np.clip(np.searchsorted(sorted_t, x), 1, max(1, len(sorted_t) - 1))
        if len(sorted_t) == 1:
            return np.zeros(len(x), dtype=np.int16)
        left, right = sorted_t[j - 1], sorted_t[j]
        pick = np.where(np.abs(x - left) <= np.abs(right - x), j - 1, j)
        return order[pick].astype(np.int16)

    def __len__(self) -> int:
        if self.sizes is None:
            raise ConfigError("AspectBuckets.auto: the number of buckets is known once resolved from the keys")
        return len(self.sizes)

    def describe(self, bucket: int) -> Dict[str, int]:
        """What a batch of ``bucket`` carries: its target ``width`` and ``height``."""
        w, h = self.sizes[bucket]  # type: ignore[index]
        return {"width": w, "height": h}

    #: The outputs of a stream bucketed by these that carry each batch's bucket, at every position:
    #: its index (``-1``: a step of padding only) and target size.
    outputs = ("bucket", "bucket_height", "bucket_width")

    def plain(self) -> Dict[str, Any]:
        """These (resolved) buckets as plain data, as a loader state records them."""
        return {"kind": "AspectBuckets", "per": self.per, "sizes": [list(s) for s in self.sizes or ()]}


@dataclass(frozen=True)
class LengthBuckets(_Buckets):
    """Buckets by the byte length of member ``field`` (key ``length:FIELD``), or by any other
    integer key column of the manifest named by ``key`` instead (a video's or audio file's
    ``duration_ms`` or ``frames``, recorded by ``dalistream index --keys video`` / ``audio`` or
    by ``dalistream write``): bucket ``i`` holds values in ``(edges[i-1], edges[i]]`` (bucket 0
    from 0), the last bucket those above ``edges[-1]``. ``lookahead`` as for :class:`AspectBuckets`.

    ``LengthBuckets("txt", (32, 64, 128))``: captions by length;
    ``LengthBuckets(key="duration_ms", edges=(2000, 4000, 8000, 16000))``: clips by duration."""

    field: Optional[str] = None
    edges: Tuple[int, ...] = ()
    per: str = "rank"
    lookahead: Optional[int] = None
    key: Optional[str] = None

    def __post_init__(self) -> None:
        self._check()
        if (self.field is None) == (self.key is None):
            raise ConfigError(f"LengthBuckets: give a member field (its byte length) or a key column, one of them; "
                              f"got field={self.field!r}, key={self.key!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ConfigError(f"LengthBuckets: key must name a manifest key column such as 'duration_ms', got {self.key!r}")
        if self.field is not None and (not isinstance(self.field, str) or not self.field or self.field.startswith(".")):
            raise ConfigError(f"LengthBuckets: field must be a member extension such as 'txt', got {self.field!r}")
        if isinstance(self.edges, (str, bytes)) or not isinstance(self.edges, (list, tuple)) or not self.edges:
            raise ConfigError(f"LengthBuckets: edges must be a non-empty list of lengths, got {self.edges!r}")
        edges = tuple(_positive_int(e, "an edge") for e in self.edges)
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise ConfigError(f"LengthBuckets: edges must increase, got {list(edges)}")
        if len(edges) >= MAX_BUCKETS:
            raise ConfigError(f"LengthBuckets: at most {MAX_BUCKETS - 1} edges, got {len(edges)}")
        object.__setattr__(self, "edges", edges)

    @property
    def columns(self) -> Tuple[str, ...]:
        return (self.key,) if self.key is not None else (f"length:{self.field}",)

    def resolve(self, keys: Optional[Mapping[str, np.ndarray]]) -> "LengthBuckets":
        return self

    def assign(self, keys: Optional[Mapping[str, np.ndarray]], urls: Optional[Sequence[str]] = None,
               starts: Optional[np.ndarray] = None) -> np.ndarray:
        """Every sample's bucket (``int16``) from its length (its key); a sample without it raises."""
        (length,) = _columns(keys, self.columns, "LengthBuckets")
        _unknown(length < 0, "LengthBuckets", self.columns, urls, starts)
        return np.searchsorted(np.asarray(self.edges), length, side="left").astype(np.int16)

    def __len__(self) -> int:
        return len(self.edges) + 1

    def describe(self, bucket: int) -> Dict[str, int]:
        """What a batch of ``bucket`` carries: its ``length`` (the bucket's upper edge; ``-1`` for
        the last, open bucket: pad to the batch's longest)."""
        return {"length": self.edges[bucket] if bucket < len(self.edges) else -1}

    #: As :attr:`AspectBuckets.outputs`: the index and the length (``-1``: the open last bucket).
    outputs = ("bucket", "bucket_length")

    def plain(self) -> Dict[str, Any]:
        """These buckets as plain data, as a loader state records them."""
        out = {"kind": "LengthBuckets", "per": self.per, "field": self.field, "edges": list(self.edges)}
        return out if self.key is None else {**out, "key": self.key}


def check_stream(config: Any) -> None:
    """Raise :class:`ConfigError` for a stream config whose ``buckets`` cannot be planned: not a
    bucket value, policy ``fixed``, a shuffle buffer or one span per worker asked for (a bucket
    plan reads its own columns), node affinity, or a field named as a bucket output."""
    b = config.buckets
    if not isinstance(b, (AspectBuckets, LengthBuckets)):
        raise ConfigError(f"buckets must be a dalistream.AspectBuckets or LengthBuckets, got {b!r}")
    check_bucket_schedule(config.policy, b.per)
    if config.interleave is False or (config.shuffle or 0) > 1:
        raise ConfigError("buckets read in columns, one per batch position, whose batches form as each bucket "
                          "fills: there is no shuffle buffer nor one span per worker to choose",
                          hint="leave shuffle and interleave unset")
    if getattr(config, "affinity", None) is not None:
        raise ConfigError("buckets with affinity='node' are not planned: a bucket plan deals every bucket over all "
                          "the ranks' columns, not over each node's shards", hint="leave affinity unset with buckets")
    clash = sorted({f.name for f in config.fields} & set(b.outputs))
    if clash:
        raise ConfigError(f"fields {clash}: with buckets those names are the batch's bucket outputs",
                          hint="rename the fields")


def parse_buckets(text: str, per: str = "rank", lookahead: Optional[int] = None):
    """Buckets from a command line's ``--buckets``: ``aspect:1024x1024,1152x896,896x1152``,
    ``auto:8`` (:meth:`AspectBuckets.auto`), ``length:txt:32,64,128,256`` or, over another key
    column, ``key:duration_ms:2000,4000,8000``."""
    usage = "expected aspect:WxH,WxH,…, auto:N, length:FIELD:EDGE,EDGE,… or key:COLUMN:EDGE,EDGE,…"
    kind, _, rest = str(text).partition(":")
    try:
        if kind == "aspect":
            sizes = [tuple(int(v) for v in item.lower().split("x")) for item in rest.split(",") if item.strip()]
            return AspectBuckets(tuple(sizes), per, lookahead=lookahead)  # type: ignore[arg-type]
        if kind == "auto":
            return AspectBuckets.auto(int(rest or 8), per=per, lookahead=lookahead)
        if kind in ("length", "key"):
            name, _, text_edges = rest.rpartition(":")
            edges = tuple(int(e) for e in text_edges.split(",") if e.strip())
            if kind == "length":
                return LengthBuckets(name, edges, per, lookahead)
            return LengthBuckets(None, edges, per, lookahead, key=name or None)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"--buckets {text!r}: {e}", hint=usage) from None
    raise ConfigError(f"--buckets {text!r}: unknown kind {kind!r}", hint=usage)
