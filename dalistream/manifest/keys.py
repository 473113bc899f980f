"""Per-sample keys for buckets, known before an epoch: an image's width and height (from its
header: :mod:`.imagesize`), what a video or an audio file holds (probed with PyAV: the ``video``
extra) and the byte length of chosen members (a caption, a token array).

A :class:`KeySpec` says which: ``"image"`` records ``width`` and ``height`` of each sample's
image (its first member in tar order with a JPEG, PNG or WebP extension), ``"image:EXT"`` of
member ``EXT``; ``"video"`` (``"video:EXT"``) records of its video (``.mp4``, ``.webm``,
``.mkv``, ``.mov``) :data:`VIDEO_COLUMNS`: ``width``, ``height``, ``frames``, ``duration_ms``
(frames over the frame rate), ``fps_milli`` (frames per 1000 s) and ``codec`` (FFmpeg's codec
id: 27 H.264, 167 VP9, 173 HEVC, 226 AV1); ``"audio"`` (``"audio:EXT"``) records of its audio
(``.wav``, ``.flac``, ``.ogg``, ``.mp3``, decoded whole) :data:`AUDIO_COLUMNS`:
``duration_ms``, ``sample_rate`` and ``channels``. A sample with both an image and a video
takes ``width``/``height`` from the image, one with a video and an audio file ``duration_ms``
from the video. Any other name ``EXT`` records ``length:EXT``, the byte length of member ``EXT``.
Keys are integers, ``-1`` where unknown (the sample has no such member, or its image is of
another format); a member that is damaged (an image header, a video or audio file that does not
probe) is a :class:`~dalistream.errors.SampleError` naming shard and member. ``dalistream index --keys image,txt`` records them in the manifest, one list
per key per shard (:mod:`.formats`), and :func:`with_keys` is what it (and ``dalistream write``)
calls (``dalistream write`` records the same keys from its own check of each file). Reading keys reads the chosen members' data, not only the headers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError, DalistreamError, ManifestError, SampleError, redact
from ..io.gunzip import decompressed
from ..io.streams import open_raw
from ..sources import is_remote
from ..kinds.audio import AUDIO_EXTS, AudioProblem, probe_audio
from ..kinds.video import VIDEO_EXTS, VideoProblem, probe
from ..tar import iter_samples
from .imagesize import image_size
from .rows import ShardInfo

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
WIDTH, HEIGHT = "width", "height"
#: The key columns ``video`` records (module doc).
VIDEO_COLUMNS = (WIDTH, HEIGHT, "frames", "duration_ms", "fps_milli", "codec")
#: The key columns ``audio`` records (module doc).
AUDIO_COLUMNS = ("duration_ms", "sample_rate", "channels")
_MEDIA = {"image": IMAGE_EXTS, "video": tuple(sorted(VIDEO_EXTS)), "audio": tuple(sorted(AUDIO_EXTS))}


def length_key(ext: str) -> str:
    """The key column of member ``ext``'s byte length: ``length:EXT``."""
    return f"length:{ext}"


@dataclass(frozen=True)
class KeySpec:
    """Which keys to record: ``image``, ``video``, ``audio`` (the extensions each is looked for
    under, or ``None``: not recorded) and ``lengths`` (members whose byte length is recorded)."""

    image: Optional[Tuple[str, ...]] = None
    lengths: Tuple[str, ...] = ()
    video: Optional[Tuple[str, ...]] = None
    audio: Optional[Tuple[str, ...]] = None

    @classmethod
    def parse(cls, text: str) -> "KeySpec":
        """``"image,txt"``, ``"image:png"``, ``"video"``, ``"audio:flac"``, ``"tok.npy"``: see the module doc."""
        media: Dict[str, Tuple[str, ...]] = {}
        lengths: List[str] = []
        for item in (t.strip() for t in str(text).split(",")):
            if not item:
                continue
            kind, colon, ext = item.partition(":")
            if kind in _MEDIA:
                ext = ext.strip().lower()
                if colon and not ext:
                    raise ConfigError(f"--keys {text!r}: '{kind}:' needs a member extension, e.g. {kind}:{_MEDIA[kind][0]}")
                media[kind] = (ext,) if colon else _MEDIA[kind]
            elif item.startswith(".") or "/" in item:
                raise ConfigError(f"--keys {text!r}: {item!r} is not a member extension (write e.g. txt, tok.npy)")
            else:
                lengths.append(item)
        if not media and not lengths:
            raise ConfigError(f"--keys {text!r} names no key", hint="e.g. --keys image,txt")
        return cls(media.get("image"), tuple(dict.fromkeys(lengths)), media.get("video"), media.get("audio"))

    @property
    def columns(self) -> Tuple[str, ...]:
        """The key columns recorded, in order."""
        names = (((WIDTH, HEIGHT) if self.image else ()) + (VIDEO_COLUMNS if self.video else ())
                 + (AUDIO_COLUMNS if self.audio else ()) + tuple(length_key(e) for e in self.lengths))
        return tuple(dict.fromkeys(names))

    def wants(self, ext: str) -> bool:
        """Whether member ``ext``'s data is read."""
        low = ext.lower()
        return any(exts is not None and low in exts for exts in (self.image, self.video, self.audio)) or ext in self.lengths


def _member(sample: Mapping[str, Any], exts: Optional[Tuple[str, ...]]) -> Optional[str]:
    """The sample's first member (tar order) of one of ``exts``, or ``None``."""
    if exts is None:
        return None
    return next((e for e in sample if not e.startswith("__") and e.lower() in exts), None)


def media_keys(data: bytes, kind: str) -> Dict[str, int]:
    """A video's (:data:`VIDEO_COLUMNS`) or audio file's (:data:`AUDIO_COLUMNS`) keys; raises
    :class:`~dalistream.kinds.video.VideoProblem` or :class:`~dalistream.kinds.audio.AudioProblem`
    for one that does not probe."""
    if kind == "video":
        info = probe(data)
        return {WIDTH: info.width, HEIGHT: info.height, "frames": info.frames,
                "duration_ms": round(1000 * info.duration) if info.rate > 0 else -1,
                "fps_milli": round(1000 * info.rate) if info.rate > 0 else -1, "codec": info.codec_id}
    sound = probe_audio(data)
    return {"duration_ms": round(1000 * sound.duration), "sample_rate": sound.sample_rate, "channels": sound.channels}


def sample_keys(sample: Mapping[str, Any], spec: KeySpec, url: Optional[str] = None) -> Dict[str, int]:
    """One sample's keys (``-1`` unknown); a damaged image header raises :class:`SampleError`
    naming the shard and member."""
    out = {name: -1 for name in spec.columns}
    ext = _member(sample, spec.image)
    if ext is not None:
        size = image_size(sample[ext], url=url, member=f"{sample.get('__key__')}.{ext}")
        if size is not None:
            out[WIDTH], out[HEIGHT] = size
    for kind, exts in (("video", spec.video), ("audio", spec.audio)):
        ext = _member(sample, exts)
        if ext is None:
            continue
        try:
            found = media_keys(sample[ext], kind)
        except (VideoProblem, AudioProblem) as e:
            raise SampleError(f"{kind} {e}", url=url, member=f"{sample.get('__key__')}.{ext}",
                              reason=e.reason) from None
        for name, value in found.items():
            if out[name] == -1:  # an image's size, a video's duration come first
                out[name] = value
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
