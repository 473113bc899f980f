"""Audio members: the ``audio`` field kind's cheap check and its crop draw.

An audio member (``.wav``, ``.flac``, ``.ogg``, ``.mp3``) travels as its encoded bytes, for
DALI's ``fn.decoders.audio`` (CPU only in DALI 2.4), after :func:`audio_problem`: a few
microseconds that catch an empty, random or cut file (WAV's RIFF and data sizes, FLAC's stream
info block, Ogg's signature, MP3's ID3 tag or frame sync) before the decoder, which fails the whole batch without
naming the sample.

:func:`probe_audio` (PyAV: the ``video`` extra) decodes a whole file to read its codec, sample
rate, channels and length: what ``dalistream write`` and ``dalistream index --keys audio`` record
per sample (a duration bucket reads it), not something a training step pays.

A field declared with a :class:`Crops` as its ``decoder`` gets, before the bytes, where its
fixed-length crop starts: a ``float32`` in [0, 1) drawn from ``(seed, epoch, key)`` when
training (a pure function, as a video clip's start), 0.5 (centred) otherwise;
:func:`dalistream.ops.decode_audio` cuts it off and crops there.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Optional

import numpy as np

from .video import draw, pyav

AUDIO_EXTS = frozenset({"wav", "flac", "ogg", "mp3"})


def audio_problem(data: bytes) -> Optional[str]:
    """What is wrong with encoded audio bytes, or ``None`` if they pass a cheap check (no decode)."""
    n = len(data)
    if n == 0:
        return "0 bytes"
    if data.startswith(b"RIFF"):
        if n < 12 or data[8:12] != b"WAVE":
            return "RIFF file that is not WAVE"
        announced = int.from_bytes(data[4:8], "little") + 8
        if announced > n:
            return f"WAV of {n} bytes, its header announces {announced}: cut short?"
        at = 12
        while at + 8 <= n:  # the chunks to the data chunk
            chunk, size = data[at:at + 4], int.from_bytes(data[at + 4:at + 8], "little")
            if chunk == b"data":
                return None if at + 8 + size <= n else f"WAV data chunk of {size} bytes, {n - at - 8} present: cut short?"
            at += 8 + size + (size & 1)
        return "WAV without a data chunk"
    if data.startswith(b"fLaC"):  # its first metadata block is the 34-byte STREAMINFO
        if n <= 42 or data[4] & 0x7F != 0 or int.from_bytes(data[5:8], "big") != 34:
            return f"FLAC of {n} bytes without its stream info block: cut short or damaged?"
        return None
    if data.startswith(b"OggS"):
        return None if n > 27 else f"Ogg of {n} bytes: no page"
    if data.startswith(b"ID3") or (n > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return None
    return f"unknown audio format (starts {data[:8].hex()}): not WAV, FLAC, Ogg or MP3"


class AudioProblem(ValueError):
    """An audio member that is not decodable audio (``reason``: ``bad_audio``)."""

    reason = "bad_audio"


@dataclasses.dataclass(frozen=True)
class AudioInfo:
    """What :func:`probe_audio` reads: the codec (FFmpeg's name), sample rate, channels and the
    samples per channel that decode."""

    codec: str
    sample_rate: int
    channels: int
    samples: int

    @property
    def duration(self) -> float:
        """Seconds of audio."""
        return self.samples / self.sample_rate


def probe_audio(data: bytes) -> AudioInfo:
    """Decode ``data`` whole (PyAV) and say what it holds; an :class:`AudioProblem` for bytes that
    fail :func:`audio_problem`, hold no audio stream, fail to decode, decode no sample, or decode
    fewer samples than the stream announces (cut short)."""
    problem = audio_problem(data)
    if problem is not None:
        raise AudioProblem(f"is not decodable audio: {problem}")
    av = pyav()
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioProblem("has no audio stream")
            stream = container.streams.audio[0]
            rate, channels, codec = int(stream.sample_rate or 0), int(stream.channels or 0), stream.codec_context.name
            announced = int(stream.duration * stream.time_base * rate) if stream.duration and stream.time_base else 0
            samples = sum(frame.samples for frame in container.decode(stream))
    except AudioProblem:
        raise
    except Exception as e:  # noqa: BLE001 - FFmpeg's errors, named by the caller with the file
        raise AudioProblem(f"does not decode: {type(e).__name__}: {e}") from None
    if samples == 0 or rate <= 0:
        raise AudioProblem(f"decodes no samples ({codec}, {rate} Hz)")
    if samples < announced:
        raise AudioProblem(f"decodes {samples} samples of the {announced} its stream announces: cut short?")
    return AudioInfo(codec, rate, channels, samples)


@dataclasses.dataclass(frozen=True)
class Crops:
    """Where each audio member's fixed-length crop starts (the field's ``decoder``; module doc):
    drawn from ``(seed, epoch, key)`` when ``train``, centred otherwise."""

    train: bool = True
    seed: int = 0

    def start(self, key: str, epoch: int) -> float:
        """The crop's start as a share of the room the crop leaves, in [0, 1)."""
        return draw(self.seed, epoch, key) if self.train else 0.5

    def __call__(self, data: bytes, key: str = "", epoch: int = 0) -> np.ndarray:
        """One member's value: its crop's start (``float32``, 4 bytes), then its bytes."""
        problem = audio_problem(data)
        if problem is not None:
            raise ValueError(f"is not decodable audio: {problem}")
        start = np.float32(self.start(key, epoch))
        return np.concatenate([np.frombuffer(start.tobytes(), np.uint8), np.frombuffer(data, np.uint8)])
