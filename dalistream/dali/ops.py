"""Device ops: decode and augment on the GPU when there is one, the same graph on the CPU otherwise.

One switch, ``device`` (``"gpu"`` or ``"cpu"``, from :func:`dalistream.device.resolve_device`), picks the backend of
every op: the decoders run ``"mixed"`` (nvImageCodec, host bytes in, GPU images out) and the
augmentations ``"gpu"``, or all of them ``"cpu"``. The graph is never written twice.

Padding positions (``valid == 0``, empty bytes) never reach a decoder as they are: each gets a
tiny black JPEG instead (appended by a length mask, no conditional: AutoGraph's rewrite of the
pipeline is spared), which decodes to a 1×1 black image that later ops resize like any other and
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

#: What a padding position decodes: a 1×1 black grayscale JPEG (PIL, quality 50; decoded to RGB).
PLACEHOLDER_JPEG = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123251d28"
    "3a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffc0000b08000100010101110"
    "0ffc40014000100000000000000000000000000000007ffc40014100100000000000000000000000000000000ffda00080101"
    "00003f003f7fffd9")


@do_not_convert
def with_placeholder(data, valid):
    """``data`` (encoded images; empty where ``valid`` is 0) with :data:`PLACEHOLDER_JPEG` at every
    padding position: the placeholder is appended to every row, cut to no bytes where the
    position is valid. Arithmetic on ``valid``, no conditional."""
    import numpy as np
    from nvidia.dali import fn, types

    placeholder = types.Constant(np.frombuffer(PLACEHOLDER_JPEG, np.uint8), device="cpu")
    keep = (1 - fn.cast(valid, dtype=types.INT32)) * len(PLACEHOLDER_JPEG)
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
def normalize(images, device: str, *, crop: Optional[Sequence[int]] = None, mirror=None,
              mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD, fp16: bool = False):
    """Centre-crop (optional), flip where ``mirror`` is 1, normalize, and lay out as ``CHW`` float."""
    from nvidia.dali import fn, types

    kwargs = {"crop": list(crop)} if crop else {}
    if mirror is not None:
        kwargs["mirror"] = mirror
    return fn.crop_mirror_normalize(images, device=device, dtype=types.FLOAT16 if fp16 else types.FLOAT,
                                    output_layout="CHW", mean=list(mean), std=list(std), **kwargs)


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
