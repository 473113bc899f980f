"""Video clips: the ``video`` field kind's probe, clip choice and decode in the worker.

A video member (``.mp4``, ``.webm``, ``.mkv``, ``.mov``) travels as its encoded bytes, like an
image (an empty one is refused; nothing else is checked, and PyAV is not needed).

A field declared with a :class:`Clips` as its ``decoder`` gets a clip of each video instead,
after a probe in the worker (:func:`probe`: PyAV opens the container and counts the video
stream's packets, decoding nothing) that turns a zero-length, cut, random or stream-less file
into a named, per-sample error (``bad_video``) before any decoder sees it. The clip is
``frames`` frames ``stride`` source frames apart, or at a target frame rate ``fps`` (the
frames shown at times ``1 / fps`` apart, read from the probe's time stamps, so the clip lasts
as long whatever the video's own rate), whose first frame is drawn from ``(seed, epoch, key)``
(:meth:`Clips.first`: a pure function, so a resumed run, an elastic resume and another worker
count choose the same clips) when training, and centred for evaluation; ``per_video`` clips a
video (drawn from ``(seed, epoch, key, i)``, or evenly spaced for evaluation) lie end to end
in the row. A video shorter than the clip's span is looped, or padded by repeating its last
frame or with black frames (``short``). Two places decode (``decode``):

- ``"dali"``: the field is the clips' frame indices (``int32``, ``4 × per_video × frames``
  bytes) followed
  by the encoded bytes; DALI's ``fn.decoders.video`` decodes those frames
  (:func:`dalistream.ops.decode_clips`: ``cpu``, or ``mixed`` on NVDEC). DALI 2.4's CPU
  decoder takes only VP8, VP9 and MJPEG: with ``device="cpu"`` a clip of any other codec (the
  codec read from the stream by the probe, never found by trial) is refused here as
  ``unsupported_codec``, naming shard, member and codec.
- ``"worker"``: PyAV decodes the clip's frames in the worker (any codec FFmpeg has), and the
  field is those frames, ``uint8`` ``(per_video × frames, H, W, 3)`` RGB.

PyAV (the ``video`` extra: ``pip install "dalistream[video]"``) is imported by the first probe, in the worker; without it a
:class:`Clips` field is a :class:`~dalistream.errors.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import threading
from typing import Any, List, Optional, Tuple, Union

import numpy as np

from ..errors import ConfigError

VIDEO_EXTS = frozenset({"mp4", "webm", "mkv", "mov"})
#: Codecs DALI 2.4's CPU video decoder takes (its docs; H.264, HEVC, AV1, MPEG-4 only on ``mixed``).
DALI_CPU_CODECS = frozenset({"vp8", "vp9", "mjpeg"})
SHORT_MODES = ("loop", "edge", "black")  # what fills a clip longer than its video
DECODE_PLACES = ("dali", "worker")
_CONVERTERS = threading.local()  # each thread's frame converter (:func:`_to_rgb`)
#: The codec id the probe reads, by FFmpeg's codec name (a decoder such as ``libdav1d`` names its codec's id).
_CODEC_NAMES = ("h264", "hevc", "av1", "vp8", "vp9", "mjpeg", "mpeg4", "mpeg2video", "prores", "theora")


class VideoProblem(ValueError):
    """A member that is not a video the clip can come from: ``reason`` names why (``bad_video``,
    ``unsupported_codec``)."""

    def __init__(self, text: str, reason: str = "bad_video", hint: Optional[str] = None) -> None:
        super().__init__(text)
        self.reason, self.hint = reason, hint


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    """What :func:`probe` reads from a container: the video stream's codec (FFmpeg's name),
    its frame count (packets holding data), width and height, and each frame's presentation
    time stamp in presentation order (``()`` when a packet has none: then frames are counted
    from the start instead of found by time stamp); ``rate``: frames per second (the stream's
    average, else its guessed rate; 0: unknown) and ``codec_id``, FFmpeg's codec id."""

    codec: str
    frames: int
    width: int
    height: int
    pts: Tuple[int, ...] = ()
    rate: float = 0.0
    codec_id: int = -1
    time_base: float = 0.0

    def times(self) -> np.ndarray:
        """Each frame's time in seconds from the first, in presentation order: from the time
        stamps when the probe has them (so a variable frame rate is followed), else ``i / rate``;
        a :class:`VideoProblem` when neither is known."""
        if self.pts and self.time_base > 0:
            stamps = np.asarray(self.pts, np.float64)
            return (stamps - stamps[0]) * self.time_base
        if self.rate > 0:
            return np.arange(self.frames, dtype=np.float64) / self.rate
        raise VideoProblem("has neither frame time stamps nor a frame rate: a clip at a target fps cannot be placed")

    @property
    def duration(self) -> float:
        """Seconds the frames last at :attr:`rate` (0 when the rate is unknown)."""
        return self.frames / self.rate if self.rate > 0 else 0.0


def pyav() -> Any:
    """The ``av`` module; a :class:`ConfigError` naming the ``video`` extra when it is missing."""
    try:
        import av
    except ImportError:  # (a ConfigError stops the stream: it is no sample's fault)
        raise ConfigError("a video field needs PyAV (the 'video' extra) in the DALI workers",
                          hint='pip install "dalistream[video]"') from None
    return av


def _codec_name(av: Any, codec: Any) -> str:
    for name in _CODEC_NAMES:
        try:
            if av.codec.Codec(name, "r").id == codec.id:
                return name
        except Exception:  # noqa: BLE001 - a codec this FFmpeg lacks
            continue
    return codec.name


def probe(data: bytes) -> VideoInfo:
    """The container's first video stream: codec, frames, size; a :class:`VideoProblem` for
    empty, random or cut bytes, or a container without a video stream. Demuxes, never decodes:
    its cost grows with the packets (~0.1 ms for a dozen)."""
    if not data:
        raise VideoProblem("is empty (0 bytes)")
    av = pyav()
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise VideoProblem("has no video stream")
            stream = container.streams.video[0]
            ctx = stream.codec_context
            stamps = [packet.pts for packet in container.demux(stream) if packet.size]
            codec, width, height = _codec_name(av, ctx.codec), ctx.width, ctx.height
            rate = stream.average_rate or stream.guessed_rate or 0
            codec_id = ctx.codec.id
            time_base = float(stream.time_base) if stream.time_base else 0.0
    except VideoProblem:
        raise
    except Exception as e:  # noqa: BLE001 - FFmpeg's errors (InvalidDataError, EOFError, …), named below
        raise VideoProblem(f"is not a readable video container: {type(e).__name__}: {e}") from None
    frames = len(stamps)
    if frames == 0 or width <= 0 or height <= 0:
        raise VideoProblem(f"has no frames ({codec}, {width}x{height}): cut short?")
    known = None not in stamps and len(set(stamps)) == frames
    return VideoInfo(codec, frames, width, height, tuple(sorted(stamps)) if known else (), float(rate), int(codec_id),
                     time_base)


def draw(seed: int, epoch: int, key: str) -> float:
    """A uniform number in [0, 1) that is a pure function of ``(seed, epoch, key)`` (BLAKE2b)."""
    digest = hashlib.blake2b(f"{int(seed)}\0{int(epoch)}\0{key}".encode("utf-8", "surrogateescape"),
                             digest_size=8, person=b"dsclip").digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64


@dataclasses.dataclass(frozen=True)
class Clips:
    """How a ``video`` field becomes clips (the field's ``decoder``; see the module doc).

    ``frames``: frames per clip; ``stride``: source frames between two taken, or ``fps``: the
    clip's frame rate instead (per video, from its own frame times: a 60 fps and a 24 fps video
    both give clips of ``frames`` frames ``1 / fps`` seconds apart); ``per_video``: clips per
    video (their frames laid end to end: ``per_video × frames`` frames a row); ``train``: each
    clip's first frame drawn from ``(seed, epoch, key, i)``, else centred (one clip) or evenly
    spaced from the first to the last start that fits (several); ``short``: ``"loop"``,
    ``"edge"`` (repeat the last frame) or ``"black"``; ``decode``: ``"dali"`` or ``"worker"``;
    ``device``: ``"cpu"`` or ``"gpu"``, where DALI decodes (``"dali"``: on the CPU, the codecs
    of :data:`DALI_CPU_CODECS` only); ``seed``: the stream's seed.
    """

    frames: int = 8
    stride: int = 1
    train: bool = True
    short: str = "loop"
    decode: str = "dali"
    device: str = "cpu"
    seed: int = 0
    fps: Optional[float] = None
    per_video: int = 1

    def __post_init__(self) -> None:
        for name in ("frames", "stride", "per_video"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Clips: {name} must be an integer >= 1, got {value!r}")
        if self.fps is not None:
            if isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)) or not self.fps > 0:
                raise ConfigError(f"Clips: fps must be a number > 0, got {self.fps!r}")
            if self.stride != 1:
                raise ConfigError(f"Clips: give stride or fps, not both (stride={self.stride}, fps={self.fps})")
        if self.short not in SHORT_MODES:
            raise ConfigError(f"Clips: short must be one of {SHORT_MODES}, got {self.short!r}")
        if self.decode not in DECODE_PLACES:
            raise ConfigError(f"Clips: decode must be one of {DECODE_PLACES}, got {self.decode!r}")
        if self.device not in ("cpu", "gpu"):
            raise ConfigError(f"Clips: device must be 'cpu' or 'gpu', got {self.device!r}")

    @property
    def span(self) -> int:
        """Source frames from a clip's first to its last, both included (``stride`` clips)."""
        return (self.frames - 1) * self.stride + 1

    @property
    def length(self) -> int:
        """Frames a row holds: ``per_video × frames``."""
        return self.per_video * self.frames

    @property
    def ndim(self) -> int:
        """The field's ``ndim``: 1 (indices and bytes) for ``"dali"``, 4 (frames) for ``"worker"``."""
        return 1 if self.decode == "dali" else 4

    def first(self, room: int, key: str, epoch: int, i: int = 0) -> int:
        """Clip ``i``'s first start among ``room + 1`` that fit: drawn from ``(seed, epoch, key, i)``
        when training (clip 0's draw is ``(seed, epoch, key)``'s), else the centred one (one clip
        a video) or ``i`` of ``per_video`` evenly spaced from 0 to ``room``."""
        room = max(0, room)
        if self.train:
            return min(room, int(draw(self.seed, epoch, key if i == 0 else f"{key}\0{i}") * (room + 1)))
        if self.per_video == 1:
            return room // 2
        return (i * room + (self.per_video - 1) // 2) // (self.per_video - 1)

    def start(self, count: int, key: str, epoch: int, i: int = 0) -> int:
        """Clip ``i``'s first frame in a video of ``count`` frames (``stride`` clips): uniform over
        the starts whose span fits (0 when none does) when training, else as :meth:`first` says."""
        return self.first(count - self.span, key, epoch, i)

    def indices(self, video: Union[int, VideoInfo], key: str, epoch: int) -> np.ndarray:
        """The clips' frame indices (``int32``, ``per_video × frames``, clip after clip) in a video
        of ``video`` frames (a count, or :func:`probe`'s :class:`VideoInfo`, which ``fps``
        needs): from :meth:`first`, ``stride`` apart or, with ``fps``, the frame shown at each
        time ``1 / fps`` apart; those past the end looped, clamped to the last frame (``edge``),
        or left past it (``black``: the decoder pads them)."""
        if self.fps is not None:
            if not isinstance(video, VideoInfo):
                raise ConfigError("Clips(fps=...).indices needs the video's probe (its frame times), not a count")
            return self._timed(video, key, epoch)
        count = video.frames if isinstance(video, VideoInfo) else int(video)
        steps = self.stride * np.arange(self.frames, dtype=np.int64)
        taken = np.concatenate([self.start(count, key, epoch, i) + steps for i in range(self.per_video)])
        return self._short(taken, count).astype(np.int32)

    def _short(self, taken: np.ndarray, count: int) -> np.ndarray:
        if self.short == "loop":
            return taken % count
        if self.short == "edge":
            return np.minimum(taken, count - 1)
        return taken

    def _timed(self, info: VideoInfo, key: str, epoch: int) -> np.ndarray:
        times = info.times()
        count = len(times)
        # A frame lasts until the next one's time; the last one as long as the typical frame.
        last = float(np.median(np.diff(times))) if count > 1 else (1.0 / info.rate if info.rate > 0 else 1.0 / self.fps)
        end = times[-1] + last
        offsets = np.arange(self.frames, dtype=np.float64) / float(self.fps)
        tolerance = 1e-6 * max(1.0, end)  # (time stamps times a time base: rounding, never a frame)
        room = int(np.count_nonzero(times + offsets[-1] < end - tolerance)) - 1
        clips: List[np.ndarray] = []
        for i in range(self.per_video):
            when = times[self.first(room, key, epoch, i)] + offsets
            if self.short == "loop":
                when = np.mod(when, end)
            taken = np.searchsorted(times, when + tolerance, side="right") - 1
            past = when >= end - tolerance
            taken[past] = count - 1 if self.short == "edge" else count  # (black: past the end)
            clips.append(taken)
        return np.concatenate(clips).astype(np.int32)

    def __call__(self, data: bytes, key: str = "", epoch: int = 0) -> np.ndarray:
        """One member's value: see the module doc."""
        info = probe(data)
        if self.decode == "dali" and self.device == "cpu" and info.codec not in DALI_CPU_CODECS:
            raise VideoProblem(f"is {info.codec}, which DALI's CPU video decoder does not take "
                               f"(it takes {', '.join(sorted(DALI_CPU_CODECS))})", reason="unsupported_codec",
                               hint="decode it in the worker (decode='worker', PyAV), or on a GPU (NVDEC)")
        taken = self.indices(info, key, epoch)
        if self.decode == "worker":
            return decode_frames(data, taken, info)
        return np.concatenate([np.frombuffer(taken.tobytes(), np.uint8), np.frombuffer(data, np.uint8)])


def _to_rgb(av: Any, frame: Any) -> np.ndarray:
    """A decoded frame as ``uint8`` ``(H, W, 3)`` RGB, converted by this thread's converter, which
    runs no threads of its own. PyAV 18.1.1 converts with one swscale context per thread, with
    threads (PyAV 17 on): a process forked after such a context was made inherits it, and whoever
    frees it there (the child's first conversion, or Python clearing the other threads' state
    when the fork came from another thread) waits for ever on threads that do not exist in the
    child. A context without threads is only memory: safe to inherit, use and free."""
    made = getattr(_CONVERTERS, "made", None)
    if made is None:  # (no ``threads`` before PyAV 17: none run)
        one = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}
        made = _CONVERTERS.made = (av.video.reformatter.VideoReformatter(), one)
    rgb, one = made
    return rgb.reformat(frame, format="rgb24", **one).to_ndarray()


def decode_frames(data: bytes, indices: np.ndarray, info: VideoInfo) -> np.ndarray:
    """Frames ``indices`` of a video (:func:`probe`'s ``info``) as ``uint8``
    ``(len(indices), H, W, 3)`` RGB, decoded by PyAV; indices from ``info.frames`` on are black.

    With the frames' time stamps known, the decoder seeks to the key frame before the first frame
    asked for and each decoded frame is placed by its time stamp; otherwise frames are decoded
    from the start and counted. Either way it stops after the last frame asked for. A frame asked
    for that does not decode, a stream that fails or changes size: a :class:`VideoProblem`, never
    a frame of the wrong place."""
    av = pyav()
    wanted = np.asarray(indices, np.int64).tolist()
    needed = sorted({i for i in wanted if i < info.frames})
    place = {stamp: i for i, stamp in enumerate(info.pts)}
    got: dict = {}
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = container.streams.video[0]
            # slice threads only: with frame threads, leaving the decode before the stream's end
            # (the last frame asked for) can hang FFmpeg's decoder for ever (PyAV #1849, #1861)
            stream.thread_type = "SLICE"
            if place and needed and needed[0] > 0:
                container.seek(info.pts[needed[0]], stream=stream, backward=True, any_frame=False)
            counted = -1
            for frame in container.decode(stream):
                counted += 1
                i = place.get(frame.pts, -1) if place else counted
                if i in needed and i not in got:
                    got[i] = _to_rgb(av, frame)
                if needed and (len(got) == len(needed) or i > needed[-1]):
                    break
    except Exception as e:  # noqa: BLE001 - FFmpeg's errors, named by the caller with the sample
        raise VideoProblem(f"does not decode: {type(e).__name__}: {e}") from None
    missing = [i for i in needed if i not in got]
    if missing:
        raise VideoProblem(f"does not decode frame {missing[0]} of the {info.frames} its container holds: damaged?")
    shapes = {f.shape for f in got.values()}
    if len(shapes) > 1:
        raise VideoProblem(f"changes frame size within the clip ({sorted(shapes)})")
    shape = next(iter(shapes)) if shapes else (info.height, info.width, 3)
    black = np.zeros(shape, np.uint8)
    return np.stack([got[i] if i < info.frames else black for i in wanted])


def clip_problem(value: bytes, clips: Optional[Clips] = None) -> Optional[str]:
    """What PyAV finds wrong decoding a ``video`` field's value, or ``None``: a ``"dali"``
    :class:`Clips` row's frames (its indices, then the video), else every frame of the video.
    What names the sample after DALI's video decoder failed a batch (it says not which)."""
    head = 4 * clips.length if clips is not None and clips.decode == "dali" else 0
    data = value[head:]
    try:
        info = probe(data)
        indices = np.frombuffer(value[:head], np.int32) if head else np.arange(info.frames)
        decode_frames(data, indices, info)
    except VideoProblem as e:
        return str(e)
    return None
