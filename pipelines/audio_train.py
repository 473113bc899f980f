"""Speech and audio, training: mono at a target rate, a fixed-length crop, a log-mel spectrogram.

::

    from dalistream.pipelines import audio_train

    with audio_train.loader("/data/speech-{0000..0099}.tar", batch_size=32, sample_rate=16000,
                            seconds=10.0) as loader:
        for batch in loader:
            mel, transcripts = batch["mel"], batch["text"]   # (B, 80, T) float, list of str

Graph: DALI's ``fn.decoders.audio`` (CPU: the only place DALI 2.4 has it) downmixes to mono and
resamples to ``sample_rate`` → a crop of ``seconds`` × ``sample_rate`` samples, zero-padded when
shorter, from a start drawn in the worker from ``(seed, epoch, key)`` when training
(:class:`dalistream.kinds.audio.Crops`: the same crops after a resume), the centred one
otherwise → on the GPU where the stream runs there: power spectrogram, ``mels`` mel bands,
decibels (:func:`dalistream.ops.log_mel`).

Outputs (``B`` = samples in the batch, ``N`` = ``seconds`` × ``sample_rate``, ``T`` = ``N // hop + 1``):

=========  ===================================  ==================  =============================
name       dtype                                shape               device
=========  ===================================  ==================  =============================
``mel``    ``torch.float32``                    ``(B, mels, T)``    CUDA on a GPU stream, else CPU
``audio``  ``torch.float32`` (``waveform=True``) ``(B, N)``          CPU
``text``   ``str`` (the transcript)             list of ``B``       Python (host)
=========  ===================================  ==================  =============================
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Optional, Sequence

import dalistream
from dalistream import ops
from dalistream.config import WORKERS, StreamConfig
from dalistream.kinds.audio import Crops

from .fields import evaluation_order, loader_options, merged_fields, with_read_fields
from .image_text import captions_to_str

#: The fields read from each sample (override with ``audio_exts``/``text_exts``).
FIELDS = {"audio": "flac;wav;ogg;mp3", "text": "txt;json"}


@dalistream.pipeline_def
def pipeline(stream: "dalistream.Stream", sample_rate: int = 16000, length: int = 160000, n_fft: int = 400,
             hop: int = 160, mels: int = 80, waveform: bool = False) -> Dict[str, Any]:
    """The audio graph; ``stream`` must have an ``audio`` field of :class:`Crops`; its other
    fields are returned as read. ``waveform=True`` adds the cropped signal as ``audio``."""
    data = dalistream.read(stream)
    audio = ops.decode_audio(data["audio"], data["valid"], sample_rate, length, padded=stream.may_pad)
    outputs = {"mel": ops.log_mel(audio, stream.device, sample_rate, n_fft=n_fft, hop=hop, mels=mels)}
    if waveform:
        outputs["audio"] = audio
    return with_read_fields(outputs, data)


def loader(sources: Any, *, batch_size: int = 32, sample_rate: int = 16000, seconds: float = 10.0,
           train: bool = True, workers: int = WORKERS, device: str = "auto", n_fft: int = 400, hop: int = 160,
           mels: int = 80, waveform: bool = False, audio_exts: str = FIELDS["audio"],
           text_exts: Optional[str] = FIELDS["text"], caption_keys: Sequence[str] = ("text", "transcript", "caption"),
           shuffle: Optional[int] = None, dali_options: Optional[Mapping[str, Any]] = None,
           **stream_options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` over ``sources`` yielding ``{"mel"[, "audio"][, "text"]}`` (module doc).

    ``text_exts=None`` reads no transcript; a JSON transcript gives the first of ``caption_keys``.
    ``train=False``: centred crops, no shuffle, policy ``exact`` unless given. ``stream_options``
    (but the Loader's own ``progress``, ``stats_dir``, ``wait_warning``) go to
    :meth:`dalistream.Stream.open`, ``dali_options`` to the DALI pipeline; ``fields`` (optional)
    is merged over the defaults.
    """
    length = int(round(seconds * sample_rate))
    if length < 1:
        raise dalistream.ConfigError(f"seconds × sample_rate must be at least one sample, got {seconds} × {sample_rate}")
    shown = loader_options(stream_options)  # progress, stats_dir, wait_warning: the Loader's own
    crops = Crops(train=train, seed=stream_options.get("seed", StreamConfig.seed))
    defaults: Dict[str, Any] = {"audio": {"exts": audio_exts, "kind": "audio", "decoder": crops}}
    if text_exts:
        defaults["text"] = text_exts
    fields = merged_fields(defaults, stream_options.pop("fields", None))
    if not train:
        shuffle = evaluation_order(stream_options, shuffle)
    stream = dalistream.Stream.open(sources, fields=fields, batch_size=batch_size, workers=workers, device=device,
                                    shuffle=shuffle, **stream_options)
    transform = functools.partial(captions_to_str, keys=tuple(caption_keys)) if "text" in fields else None
    return dalistream.Loader(stream, pipeline, **shown, transform=transform, sample_rate=sample_rate, length=length,
                             n_fft=n_fft, hop=hop, mels=mels, waveform=waveform, **dict(dali_options or {}))
