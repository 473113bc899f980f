"""Device ops: decode and augment on the GPU when there is one, the same graph on the CPU otherwise.

One switch, ``device`` (``"gpu"`` or ``"cpu"``, from :func:`dalistream.dali.device.resolve_device`), picks the backend of
every op: the decoders run ``"mixed"`` (nvImageCodec, host bytes in, GPU images out) and the
augmentations ``"gpu"``, or all of them ``"cpu"``. The graph is never written twice.

Padding positions (``valid == 0``, empty bytes) never reach a decoder as they are: each gets a
small black JPEG instead (appended by a length mask, no conditional: AutoGraph's rewrite of the
pipeline is spared), which decodes to a 16×16 black image that later ops resize like any other and
the torch side removes.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..errors import ConfigError
from .compat import do_not_convert

#: Settings of DALI's image decoders that only its GPU (``mixed``) decoder has: given to
#: :func:`decode_images`, they apply on a GPU and are left out on the CPU, so one pipeline runs on
#: both. ``hw_decoder_load``: the share of JPEGs sent to the A100/H100 hardware decoder (DALI
#: 2.4's default 0.65); ``device_memory_padding``/``host_memory_padding`` (and ``_jpeg2k``): extra
#: bytes per buffer, so buffers grow rarely; ``preallocate_width_hint``/``preallocate_height_hint``:
#: the largest image expected, allocated up front; ``affine``: pin the decoder's host threads.
GPU_DECODER_OPTIONS = frozenset({"hw_decoder_load", "device_memory_padding", "host_memory_padding",
                                 "device_memory_padding_jpeg2k", "host_memory_padding_jpeg2k",
                                 "preallocate_width_hint", "preallocate_height_hint", "affine"})
#: Settings both decoders have. ``jpeg_fancy_upsampling``: DALI's GPU decoder leaves it off by
#: default (the CPU one, like libjpeg and PIL, upsamples chroma smoothly): set it True for the
#: same pixels on both.
DECODER_OPTIONS = GPU_DECODER_OPTIONS | {"jpeg_fancy_upsampling", "use_fast_idct", "adjust_orientation"}

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

#: What a padding position decodes: a 16×16 black JPEG, three channels, 4:2:0, baseline with the
#: standard Huffman tables (PIL, quality 50): what every decoder engine takes, the A100/H100
#: hardware decoder included (one MCU of the most common layout; a 1×1 grayscale one is not
#: known to be accepted by it).
PLACEHOLDER_JPEG = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123251d283a"
    "333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffdb0043011112121815182f1a1a2f"
    "63423842636363636363636363636363636363636363636363636363636363636363636363636363636363636363636363636363"
    "6363ffc00011080010001003012200021101031101ffc4001f000001050101010101010000000000000000010203040506070809"
    "0a0bffc400b5100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c115"
    "52d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a"
    "737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9ca"
    "d2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffc4001f01000301010101010101010100000000000001"
    "02030405060708090a0bffc400b51100020102040403040705040400010277000102031104052131061241510761711322328108"
    "144291a1b1c109233352f0156272d10a162434e125f11718191a262728292a35363738393a434445464748494a53545556575859"
    "5a636465666768696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9"
    "bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00f3"
    "fa28a2803fffd9")


@do_not_convert
def with_placeholder(data, valid, placeholder_bytes: bytes = PLACEHOLDER_JPEG):
    """``data`` (encoded images; empty where ``valid`` is 0) with ``placeholder_bytes`` (default
    :data:`PLACEHOLDER_JPEG`) at every padding position: the placeholder is appended to every
    row, cut to no bytes where the position is valid. Arithmetic on ``valid``, no conditional."""
    import numpy as np
    from nvidia.dali import fn, types

    placeholder = types.Constant(np.frombuffer(placeholder_bytes, np.uint8), device="cpu")
    keep = (1 - fn.cast(valid, dtype=types.INT32)) * len(placeholder_bytes)
    tail = fn.slice(placeholder, start=[0], shape=fn.reshape(keep, shape=[1]), axes=[0])
    return fn.cat(data, tail, axis=0)


@do_not_convert
def decode_images(data, valid, device: str, *, random_crop: bool = False,
                  random_area: Sequence[float] = (0.08, 1.0),
                  random_aspect_ratio: Sequence[float] = (3 / 4, 4 / 3), padded: bool = True,
                  decoder_options: Optional[Mapping[str, Any]] = None):
    """Decode encoded image bytes to RGB ``HWC`` ``uint8`` (grayscale, CMYK, PNG all to 3 channels).

    ``random_crop`` fuses a random-resized-crop window into the decode (only the window is
    decoded). Padding positions decode :data:`PLACEHOLDER_JPEG` (:func:`with_placeholder`);
    ``padded=False`` leaves that out when the batch can hold no padding. ``decoder_options``: settings of DALI's decoder (:data:`DECODER_OPTIONS`;
    those of :data:`GPU_DECODER_OPTIONS` apply on a GPU only).
    """
    crop = (tuple(random_area), tuple(random_aspect_ratio)) if random_crop else None
    options = decoder_settings(decoder_options, device)
    return _decode(with_placeholder(data, valid) if padded else data, device, crop, options)


def decoder_settings(options: Optional[Mapping[str, Any]], device: str) -> dict:
    """``options`` checked against :data:`DECODER_OPTIONS`, less the GPU-only ones on the CPU."""
    options = dict(options or {})
    unknown = sorted(set(options) - DECODER_OPTIONS)
    if unknown:
        raise ConfigError(f"decoder_options: unknown {unknown}", hint=f"one of {sorted(DECODER_OPTIONS)}")
    return {k: v for k, v in options.items() if device == "gpu" or k not in GPU_DECODER_OPTIONS}


@do_not_convert
def _decode(data, device: str, crop: Optional[tuple], options: Mapping[str, Any]):
    from nvidia.dali import fn, types

    backend = "mixed" if device == "gpu" else "cpu"
    if crop is not None:
        area, ratio = crop
        return fn.decoders.image_random_crop(data, device=backend, output_type=types.RGB, random_area=list(area),
                                             random_aspect_ratio=list(ratio), num_attempts=10, **options)
    return fn.decoders.image(data, device=backend, output_type=types.RGB, **options)


@do_not_convert
def random_resized_crop(images, device: str, size: Sequence[int]):
    """Resize a random crop window (chosen at decode) to ``size`` = (height, width)."""
    from nvidia.dali import fn, types

    return fn.resize(images, device=device, resize_y=size[0], resize_x=size[1], interp_type=types.INTERP_LINEAR,
                     antialias=False)


@do_not_convert
def resize_shorter(images, device: str, shorter: int):
    """Resize so the shorter side is ``shorter`` pixels, keeping the aspect ratio."""
    from nvidia.dali import fn, types

    return fn.resize(images, device=device, resize_shorter=shorter, interp_type=types.INTERP_LINEAR)


@do_not_convert
def bucket_size(data) -> tuple:
    """``(height, width)``: each batch's aspect bucket, one float per sample, from the
    ``bucket_height``/``bucket_width`` nodes of :func:`dalistream.read` over a stream opened with
    :class:`~dalistream.AspectBuckets` (what :func:`resize_cover` and :func:`normalize` take)."""
    from nvidia.dali import fn, types

    if "bucket_height" not in data:
        raise ConfigError("bucket_size: the stream has no aspect buckets",
                          hint="open it with buckets=dalistream.AspectBuckets(...)")
    return tuple(fn.cast(data[name], dtype=types.FLOAT) for name in ("bucket_height", "bucket_width"))


@do_not_convert
def resize_cover(images, device: str, height, width, scale=None):
    """Resize, keeping the aspect ratio, so that each image covers ``height`` × ``width``
    (numbers, or one per sample: :func:`bucket_size`), times ``scale`` (a factor per sample, e.g.
    ``fn.random.uniform(range=[1, 1.1])``, for a random crop within it; ``None``: 1)."""
    from nvidia.dali import fn, types

    if scale is not None:
        height, width = height * scale, width * scale
    return fn.resize(images, device=device, resize_x=width, resize_y=height, mode="not_smaller",
                     interp_type=types.INTERP_LINEAR)


@do_not_convert
def pad_tokens(data, length, *, token_bytes: int = 1):
    """A member's bytes as tokens, each row padded with zeros to ``length`` bytes (one per sample:
    a length bucket's ``bucket_length``; ``-1`` pads to the batch's longest), then read as tokens
    of ``token_bytes`` bytes (1: each byte a token; 2 or 4: little-endian ``int16``/``int32``
    token ids, as a tokenizer wrote them): ``int32`` rows of ``length / token_bytes`` tokens."""
    from nvidia.dali import fn, types

    if token_bytes not in (1, 2, 4):
        raise ConfigError(f"pad_tokens: token_bytes must be 1, 2 or 4, got {token_bytes!r}")
    padded = fn.pad(data, fill_value=0, axes=[0], shape=fn.reshape(length, shape=[1]), align=[token_bytes])
    if token_bytes == 1:
        return fn.cast(padded, dtype=types.INT32)
    return fn.cast(fn.reinterpret(padded, dtype=types.INT16 if token_bytes == 2 else types.INT32), dtype=types.INT32)


@do_not_convert
def normalize(images, device: str, *, crop: Optional[Sequence] = None, random_crop: bool = False, mirror=None,
              mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD, fp16: bool = False,
              layout: str = "CHW"):
    """Crop to ``crop`` = (height, width) (numbers, or nodes of one per sample: :func:`bucket_size`;
    centred, or at a random place with ``random_crop``), flip where ``mirror`` is 1, normalize,
    and lay out as ``layout`` float (``CHW`` for images; a clip's frames share the crop: ``FCHW``)."""
    from nvidia.dali import fn, types

    kwargs: dict = {}
    if crop and all(isinstance(c, int) for c in crop):
        kwargs["crop"] = list(crop)
    elif crop:
        kwargs["crop_h"], kwargs["crop_w"] = crop
    if crop and random_crop:
        kwargs["crop_pos_x"], kwargs["crop_pos_y"] = (fn.random.uniform(range=[0.0, 1.0]) for _ in range(2))
    if mirror is not None:
        kwargs["mirror"] = mirror
    return fn.crop_mirror_normalize(images, device=device, dtype=types.FLOAT16 if fp16 else types.FLOAT,
                                    output_layout=layout, mean=list(mean), std=list(std), **kwargs)


@do_not_convert
def coin_flip(probability: float = 0.5):
    """A per-sample 0/1 flag (for ``mirror``)."""
    from nvidia.dali import fn

    return fn.random.coin_flip(probability=probability)


@do_not_convert
def color_jitter(images, device: str, brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.4):
    """Random brightness, contrast and saturation, as torchvision's ColorJitter."""
    from nvidia.dali import fn

    def factor(amount):
        return fn.random.uniform(range=[max(0.0, 1 - amount), 1 + amount])

    images = fn.brightness_contrast(images, device=device, brightness=factor(brightness), contrast=factor(contrast))
    return fn.saturation(images, device=device, saturation=factor(saturation))


@do_not_convert
def to_device(node, device: str):
    """Move a CPU node to the GPU when the pipeline runs there (labels, masks)."""
    return node.gpu() if device == "gpu" else node
