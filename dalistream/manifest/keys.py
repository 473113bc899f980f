"""Per-sample keys for buckets, known before an epoch: an image's width and height (from its
header: :mod:`.imagesize`) and the byte length of chosen members (a caption, a token array).

A :class:`KeySpec` says which: ``"image"`` records ``width`` and ``height`` of each sample's
image (its first member in tar order with a JPEG, PNG or WebP extension), ``"image:EXT"`` of
member ``EXT``; any other name ``EXT`` records ``length:EXT``, the byte length of member ``EXT``.
Keys are integers, ``-1`` where unknown (the sample has no such member, or its image is of
another format). ``dalistream index --keys image,txt`` records them in the manifest, one list
per key per shard (:mod:`.formats`), and :func:`with_keys` is what it (and ``dalistream write``)
calls. Reading keys reads the chosen members' data, not only the headers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError, DalistreamError, ManifestError, SampleError, redact
from ..io.gunzip import decompressed
from ..io.streams import open_raw
from ..sources import is_remote
from ..tar import iter_samples
from .imagesize import image_size
from .rows import ShardInfo

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
WIDTH, HEIGHT = "width", "height"


def length_key(ext: str) -> str:
    """The key column of member ``ext``'s byte length: ``length:EXT``."""
    return f"length:{ext}"


@dataclass(frozen=True)
class KeySpec:
    """Which keys to record: ``image`` (the extensions an image is looked for under, or ``None``:
    no width and height) and ``lengths`` (members whose byte length is recorded)."""

    image: Optional[Tuple[str, ...]] = None
    lengths: Tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "KeySpec":
        """``"image,txt"``, ``"image:png"``, ``"tok.npy"``: see the module doc."""
        image: Optional[Tuple[str, ...]] = None
        lengths: List[str] = []
        for item in (t.strip() for t in str(text).split(",")):
            if not item:
                continue
            if item == "image":
                image = IMAGE_EXTS
            elif item.startswith("image:"):
                ext = item[len("image:"):].strip().lower()
                if not ext:
                    raise ConfigError(f"--keys {text!r}: 'image:' needs a member extension, e.g. image:png")
                image = (ext,)
            elif item.startswith(".") or "/" in item:
                raise ConfigError(f"--keys {text!r}: {item!r} is not a member extension (write e.g. txt, tok.npy)")
            else:
                lengths.append(item)
        if image is None and not lengths:
            raise ConfigError(f"--keys {text!r} names no key", hint="e.g. --keys image,txt")
        return cls(image, tuple(dict.fromkeys(lengths)))

    @property
    def columns(self) -> Tuple[str, ...]:
        """The key columns recorded, in order."""
        return ((WIDTH, HEIGHT) if self.image else ()) + tuple(length_key(e) for e in self.lengths)

    def wants(self, ext: str) -> bool:
        """Whether member ``ext``'s data is read."""
        return (self.image is not None and ext.lower() in self.image) or ext in self.lengths


def sample_keys(sample: Mapping[str, Any], spec: KeySpec, url: Optional[str] = None) -> Dict[str, int]:
    """One sample's keys (``-1`` unknown); a damaged image header raises :class:`SampleError`
    naming the shard and member."""
    out = {name: -1 for name in spec.columns}
    if spec.image is not None:
        ext = next((e for e in sample if not e.startswith("__") and e.lower() in spec.image), None)
        if ext is not None:
            size = image_size(sample[ext], url=url, member=f"{sample.get('__key__')}.{ext}")
            if size is not None:
                out[WIDTH], out[HEIGHT] = size
    for ext in spec.lengths:
        if ext in sample:
            out[length_key(ext)] = len(sample[ext])
    return out


def shard_keys(url: str, spec: KeySpec, options: Optional[Mapping[str, Any]] = None, lowercase: bool = False,
               tolerant: bool = False) -> Tuple[Dict[str, Tuple[int, ...]], List[DalistreamError]]:
    """Every sample's keys in shard ``url`` (columns), and, with ``tolerant``, the samples'
    problems met (their keys left at ``-1``); without it the first problem raises."""
    columns: Dict[str, List[int]] = {name: [] for name in spec.columns}
    problems: List[DalistreamError] = []
    with decompressed(open_raw(url, 0, options), url) as stream:
        for sample in iter_samples(stream, url, want_ext=spec.wants, lowercase=lowercase, mark_errors=tolerant):
            try:
                if "__error__" in sample:
                    raise sample["__error__"]
                keys = sample_keys(sample, spec, redact(url) if is_remote(url) else url)
            except SampleError as e:
                if not tolerant:
                    raise
                problems.append(e)
                keys = {name: -1 for name in spec.columns}
            for name, value in keys.items():
                columns[name].append(value)
    return {name: tuple(values) for name, values in columns.items()}, problems


def with_keys(infos: Sequence[ShardInfo], spec: KeySpec, options: Optional[Mapping[str, Any]] = None,
              lowercase: bool = False, tolerant: bool = False, threads: int = 8,
              progress: Optional[Callable[[ShardInfo], None]] = None) -> Tuple[List[ShardInfo], List[DalistreamError]]:
    """``infos`` (counted rows) with their samples' keys (:func:`shard_keys`), read in parallel
    threads; key columns that are ``-1`` for every sample of a shard are left out of its row.
    ``tolerant``: a shard that cannot be read to its end keeps the keys read before its problem
    (the rest ``-1``) and its problems are returned; otherwise they raise. A shard whose sample
    count differs from its row's raises :class:`ManifestError` (it changed between the scans)."""
    def one(info: ShardInfo):
        try:
            keys, problems = shard_keys(info.url, spec, options, lowercase, tolerant)
        except DalistreamError as e:
            if not tolerant or isinstance(e, SampleError):
                raise
            return None, [e]
        return keys, problems

    out: List[ShardInfo] = []
    problems: List[DalistreamError] = []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(infos)))) as pool:
        for info, (keys, found) in zip(infos, pool.map(one, infos)):
            problems += found
            keys = keys if keys is not None else {name: () for name in spec.columns}
            n = len(keys[spec.columns[0]])
            if n != info.samples:
                if not tolerant or n > info.samples:
                    raise ManifestError(f"{n} samples read for keys where the count says {info.samples}: the shard "
                                        "changed between the two reads", url=info.url, hint="run `dalistream index` again")
                keys = {name: values + (-1,) * (info.samples - n) for name, values in keys.items()}
            kept = {name: values for name, values in keys.items() if any(v >= 0 for v in values)}
            row = replace(info, keys=kept or None)
            out.append(row)
            if progress is not None:
                progress(row)
    return out, problems


def written_keys(infos: Sequence[ShardInfo]) -> List[ShardInfo]:
    """For ``dalistream write``: its freshly written shards' rows with ``image,txt`` keys; an
    image whose header cannot be read keeps ``-1`` (the write does not fail on it)."""
    return with_keys(infos, KeySpec(IMAGE_EXTS, ("txt",)), tolerant=True)[0]
