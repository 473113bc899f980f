"""Tiny video clips and audio files for the media tests, made here with PyAV and ``wave``.

Frame ``i`` of a clip is one flat colour whose red channel is ``frame_red(i)`` (blue names the
clip), so a decoded frame says which frame it is (:func:`frame_ids`) within any codec's error."""

from __future__ import annotations

import io
import wave
from typing import List

import numpy as np

#: (PyAV encoder, container, FFmpeg codec name, extension)
CODECS = {"h264": ("libx264", "mp4", "mp4"), "vp9": ("libvpx-vp9", "webm", "webm"), "av1": ("libsvtav1", "mp4", "mp4")}
SIZE = 32


def frame_red(i: int) -> int:
    return 30 + 9 * i


def make_clip(codec: str, frames: int, blue: int = 0, size: int = SIZE, gop: int = 4, bframes: int = 0,
              rate: int = 12, height: int = 0) -> bytes:
    """A clip of ``frames`` flat frames (:func:`frame_red`) in ``codec``'s container, ``rate`` fps
    (12), ``size`` wide and ``height`` (``size``) high, a key frame every ``gop`` frames (so that a decoder seeks into it); ``bframes``: H.264's B-frames (its
packets then come out of presentation order)."""
    import av

    encoder, container, _ = CODECS[codec]
    out = io.BytesIO()
    with av.open(out, "w", format=container) as c:
        stream = c.add_stream(encoder, rate=rate)
        stream.width, stream.height = size, height or size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        if encoder == "libx264":
            stream.options = {"preset": "ultrafast", "x264-params": f"keyint={gop}:min-keyint={gop}:bframes={bframes}"}
        if encoder == "libsvtav1":
            stream.options = {"svtav1-params": f"log-level=0:keyint={gop}"}
        for i in range(frames):
            image = np.zeros((height or size, size, 3), np.uint8)
            image[..., 0], image[..., 1], image[..., 2] = frame_red(i % 25), 128, blue  # (ids repeat past 25)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    return out.getvalue()


def pyav_frames(data: bytes) -> List[np.ndarray]:
    """Every frame of a clip as PyAV decodes it (RGB)."""
    import av

    # (converted without threads: PyAV 18.1.1's per-thread converter, made with threads in the test
    # process, would hang a DALI worker forked later from another thread: see dalistream.kinds.video)
    one = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}
    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24", **one) for f in c.decode(video=0)]


def frame_ids(clip: np.ndarray) -> List[int]:
    """Which frame each of a decoded clip's ``(F, H, W, 3)`` frames is (-1: black)."""
    reds = np.asarray(clip, np.float64)[..., 0].reshape(len(clip), -1).mean(axis=1)
    return [int(round((r - 30) / 9)) if r > 15 else -1 for r in reds]


def make_wav(samples: int, rate: int = 22050, channels: int = 2, seed: int = 0) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.random.default_rng(seed).integers(-8000, 8000, (samples, channels)).astype("<i2").tobytes())
    return out.getvalue()


def make_flac(samples: int, rate: int = 22050, seed: int = 0) -> bytes:
    """Mono FLAC (PyAV) of the same samples :func:`make_wav` writes for one channel and ``seed``."""
    import av

    signal = np.random.default_rng(seed).integers(-8000, 8000, (samples, 1)).astype(np.int16).T
    out = io.BytesIO()
    with av.open(out, "w", format="flac") as c:
        stream = c.add_stream("flac", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal), format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    return out.getvalue()
