"""Device ops for video clips and audio: DALI's video decoder (``cpu``, or ``mixed`` on NVDEC), the
clip augmentations on frame sequences, and audio to a log-mel spectrogram.

Clips arrive as the ``video`` field of a :class:`~dalistream.kinds.video.Clips` field: with
``decode="dali"``, each row is the clip's frame indices (``int32``) then the encoded video, cut
apart here and decoded by ``fn.decoders.video`` with ``frames=``; with ``decode="worker"``, the
frames PyAV decoded in the worker. Padding positions never reach a decoder as they are: they get
:data:`PLACEHOLDER_VIDEO` (one black MJPEG frame, which DALI's CPU decoder takes) or on a GPU
:data:`PLACEHOLDER_VIDEO_GPU` (one black H.264 frame, for NVDEC) with indices 0, or, decoded in
the worker, black frames.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .compat import do_not_convert
from .ops import IMAGENET_MEAN, IMAGENET_STD, normalize, with_placeholder

#: What a padding position of a ``"dali"`` clip field decodes on the CPU (after its indices, all 0):
#: one black 16×16 frame, MJPEG in Matroska (749 bytes, made by PyAV).
PLACEHOLDER_VIDEO = bytes.fromhex(
    "1a45dfa3a34286810142f7810142f2810442f381084282886d6174726f736b6142878104428581021853806701000000000002b9"
    "114d9b74c0bf849100afe84dbb8b53ab841549a96653ac81a14dbb8b53ab841654ae6b53ac81f14dbb8c53ab841254c36753ac82"
    "01564dbb8c53ab841c53bb6b53ac82029dec01000000000000530000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000001549a966cbbf846a7a21342ad7b1830f42404d808d4c61766636322e31322e31303257418d4c61766636322e31322e"
    "31303273a490846d5d1ba5ec7305cbb3b4a3c86cd086448988408f4000000000001654ae6be0bf842a11c383ae01000000000000"
    "51d7810173c588913ce7e654cfc6619c810022b59c83756e648881008687565f4d4a50454783810123e383843b9aca00e091b081"
    "10ba811054b2810455b08455b9810255ee8100ec010000000000000200001254c367debf8422140ab27373a063c08067c89a45a3"
    "87454e434f44455244878d4c61766636322e31322e3130327373b263c08b63c588913ce7e654cfc66167c8a145a3884455524154"
    "494f4e44879330303a30303a30312e303030303030303030001f43b67540debf8443e7833ae78100a340d281000080ffd8fffe00"
    "104c61766336322e32382e31303200ffdb0043000804040404040505050505050606060606060606060606060607070708080807"
    "070706060707080808080909090808080809090a0a0a0c0c0b0b0e0e0e111114ffc4004c00010100000000000000000000000000"
    "00000801010000000000000000000000000000000110010000000000000000000000000000000011010100000000000000000000"
    "000000000021ffc00011080010001003012200021100031100ffda000c03010002110311003f009fc01457ffd91c53bb6b97bf84"
    "e3aaea58bb8fb38100b78af78101f18201b9f08109")
#: What a padding position of a ``"dali"`` clip field decodes on a GPU (``mixed``): one black 64×64
#: H.264 frame (Constrained Baseline, 1424 bytes, made by PyAV): NVDEC's most widely supported codec,
#: above its smallest frame size.
PLACEHOLDER_VIDEO_GPU = bytes.fromhex(
    "000000206674797069736f6d0000020069736f6d69736f32617663316d70343100000008667265650000026b6d64617400000245"
    "0605ffff41dc45e9bde6d948b7962cd820d923eeef78323634202d20636f726520313635202d20482e3236342f4d5045472d3420"
    "41564320636f646563202d20436f70796c65667420323030332d32303235202d20687474703a2f2f7777772e766964656f6c616e"
    "2e6f72672f783236342e68746d6c202d206f7074696f6e733a2063616261633d30207265663d31206465626c6f636b3d303a303a"
    "3020616e616c7973653d303a30206d653d646961207375626d653d30207073793d31207073795f72643d312e30303a302e303020"
    "6d697865645f7265663d30206d655f72616e67653d3136206368726f6d615f6d653d31207472656c6c69733d3020387838646374"
    "3d302063716d3d3020646561647a6f6e653d32312c313120666173745f70736b69703d31206368726f6d615f71705f6f66667365"
    "743d3020746872656164733d31206c6f6f6b61686561645f746872656164733d3120736c696365645f746872656164733d30206e"
    "723d3020646563696d6174653d3120696e7465726c616365643d3020626c757261795f636f6d7061743d3020636f6e7374726169"
    "6e65645f696e7472613d3020626672616d65733d3020776569676874703d30206b6579696e743d323530206b6579696e745f6d69"
    "6e3d31207363656e656375743d3020696e7472615f726566726573683d302072633d637266206d62747265653d30206372663d32"
    "332e302071636f6d703d302e36302071706d696e3d302071706d61783d3639207170737465703d342069705f726174696f3d312e"
    "34302061713d300080000000166588843a2628000902c9c9c9d75d75d75d75d75d75e0000002fd6d6f6f760000006c6d76686400"
    "0000000000000000000000000003e8000003e8000100000100000000000000000000000001000000000000000000000000000000"
    "01000000000000000000000000000040000000000000000000000000000000000000000000000000000000000000020000022774"
    "72616b0000005c746b68640000000300000000000000000000000100000000000003e80000000000000000000000000000000000"
    "01000000000000000000000000000000010000000000000000000000000000400000000040000000400000000000246564747300"
    "00001c656c73740000000000000001000003e800000000000100000000019f6d646961000000206d646864000000000000000000"
    "000000000040000000400055c400000000002d68646c72000000000000000076696465000000000000000000000000566964656f"
    "48616e646c6572000000014a6d696e6600000014766d68640000000100000000000000000000002464696e660000001c64726566"
    "00000000000000010000000c75726c20000000010000010a7374626c000000a67374736400000000000000010000009661766331"
    "00000000000000010000000000000000000000000000000000400040004800000048000000000000000100000000000000000000"
    "000000000000000000000000000000000000000000000018ffff0000002c617663430142c00affe100156742c00ada109a100000"
    "0300100000030020f1226a01000468ce0fc800000014627472740000000000001318000000000000001873747473000000000000"
    "000100000001000040000000001c737473630000000000000001000000010000000100000001000000147374737a000000000000"
    "026300000001000000147374636f00000000000000010000003000000062756474610000005a6d65746100000000000000216864"
    "6c7200000000000000006d6469726170706c0000000000000000000000002d696c737400000025a9746f6f0000001d6461746100"
    "000001000000004c61766636322e31322e313032")

#: What a padding position of an ``audio`` field decodes: a 16 kHz mono WAV of 16 silent samples.
PLACEHOLDER_WAV = bytes.fromhex(
    "524946464400000057415645666d74201000000001000100803e0000007d00000200100064617461200000000000000000000000"
    "000000000000000000000000000000000000000000000000")


@do_not_convert
def decode_clips(data, valid, device: str, frames: int, *, decode: str = "dali", padded: bool = True):
    """The clips of a :class:`~dalistream.kinds.video.Clips` field as ``uint8`` ``FHWC`` RGB
    sequences of ``frames`` frames (on the GPU where ``device`` is ``"gpu"``).

    ``decode="dali"``: DALI's ``fn.decoders.video`` decodes each row's frames (``mixed`` on a GPU,
    ``cpu`` otherwise: VP8, VP9, MJPEG); indices past a video's end (``short="black"``) are
    black. ``decode="worker"``: the rows are frames already, laid out as ``FHWC`` (padding
    positions black). ``padded=False``: the batch holds no padding."""
    import numpy as np
    from nvidia.dali import fn, types

    if decode == "worker":
        clips = fn.reshape(data, layout="FHWC")
        if padded:  # (a padding position's empty row becomes black frames; real rows are left as they are)
            clips = fn.pad(clips, axes=[0, 1, 2, 3], shape=[frames, 16, 16, 3])
        return clips.gpu() if device == "gpu" else clips
    if decode != "dali":
        from ..errors import ConfigError

        raise ConfigError(f"decode_clips: decode must be 'dali' or 'worker', got {decode!r}")
    if padded:
        video = PLACEHOLDER_VIDEO_GPU if device == "gpu" else PLACEHOLDER_VIDEO
        placeholder = np.concatenate([np.zeros(4 * frames, np.uint8), np.frombuffer(video, np.uint8)])
        data = with_placeholder(data, valid, placeholder.tobytes())
    indices = fn.reinterpret(data[:4 * frames], dtype=types.INT32)
    encoded = data[4 * frames:]
    return fn.decoders.video(encoded, device="mixed" if device == "gpu" else "cpu", frames=indices,
                             pad_mode="constant", fill_value=[0])


@do_not_convert
def resize_clips(clips, device: str, shorter: int):
    """Resize every frame so its shorter side is ``shorter`` pixels (one size per clip)."""
    from nvidia.dali import fn, types

    return fn.resize(clips, device=device, resize_shorter=shorter, interp_type=types.INTERP_LINEAR, antialias=False)


@do_not_convert
def normalize_clips(clips, device: str, size: Sequence[int], *, random_crop: bool = False, mirror=None,
                    mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD, fp16: bool = False):
    """Crop every frame of a clip at one place (centred, or drawn per clip with ``random_crop``) to
    ``size`` = (height, width), flip the clip where ``mirror`` is 1, normalize, and lay it out as
    ``FCHW`` float (``(B, F, C, H, W)`` in torch)."""
    return normalize(clips, device, crop=tuple(size), random_crop=random_crop, mirror=mirror, mean=mean, std=std,
                     fp16=fp16, layout="FCHW")


@do_not_convert
def split_clips(clips, per_video: int, frames: int, size: int):
    """A row of ``per_video`` clips laid end to end (``FCHW``, ``per_video × frames`` frames of
    ``size`` × ``size``) as ``(per_video, frames, C, size, size)``, layout ``NFCHW``."""
    from nvidia.dali import fn

    return fn.reshape(clips, shape=[per_video, frames, -1, size, size], layout="NFCHW")


@do_not_convert
def decode_audio(data, valid, sample_rate: float, length: int, *, crops: bool = True, padded: bool = True):
    """Audio bytes to mono ``float32`` at ``sample_rate`` (DALI's ``fn.decoders.audio``, CPU), cut
    or zero-padded to ``length`` samples. ``crops``: the rows are a
    :class:`~dalistream.kinds.audio.Crops` field's (each begins with where its crop starts, drawn
    in the worker); otherwise plain audio bytes, cut from their start. Padding positions decode
    :data:`PLACEHOLDER_WAV` (silence); ``padded=False``: the batch holds no padding."""
    import numpy as np
    from nvidia.dali import fn, math, types

    head = 4 if crops else 0
    if padded:
        placeholder = np.concatenate([np.zeros(head, np.uint8), np.frombuffer(PLACEHOLDER_WAV, np.uint8)])
        data = with_placeholder(data, valid, placeholder.tobytes())
    audio, _ = fn.decoders.audio(data[head:] if crops else data, dtype=types.FLOAT, downmix=True,
                                 sample_rate=float(sample_rate))
    if crops:
        share = fn.reinterpret(data[:head], dtype=types.FLOAT, shape=[])
        room = fn.cast(audio.shape()[0], dtype=types.FLOAT) - float(length)
        start = fn.reshape(fn.cast(math.floor(math.max(room, 0.0) * share), dtype=types.INT32), shape=[1])
    else:
        start = types.Constant(np.zeros(1, np.int32), device="cpu")
    return fn.slice(audio, start, types.Constant(np.array([length], np.int32), device="cpu"), axes=[0],
                    out_of_bounds_policy="pad",
                    fill_values=0.0)


@do_not_convert
def log_mel(audio, device: str, sample_rate: float, *, n_fft: int = 400, hop: int = 160, mels: int = 80,
            cutoff_db: float = -80.0):
    """A mono signal's log-mel spectrogram, ``float32`` ``(mels, frames)``: power spectrogram
    (``n_fft`` window, ``hop`` step), ``mels`` mel bands, decibels floored ``cutoff_db`` below
    the peak; on the GPU where ``device`` is ``"gpu"``."""
    from nvidia.dali import fn

    audio = audio.gpu() if device == "gpu" else audio
    spectrum = fn.spectrogram(audio, device=device, nfft=n_fft, window_length=n_fft, window_step=hop, power=2)
    mel = fn.mel_filter_bank(spectrum, device=device, sample_rate=float(sample_rate), nfilter=mels)
    return fn.to_decibels(mel, device=device, multiplier=10.0, cutoff_db=cutoff_db)
