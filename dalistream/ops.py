"""Device ops for pipeline functions (``from dalistream import ops``): decode and augment on the
GPU when there is one, the same graph on the CPU otherwise. Defined in :mod:`dalistream.dali.ops`
(and device selection in :mod:`dalistream.dali.device`); this module is their public name."""

from .dali.ops import (DECODER_OPTIONS, GPU_DECODER_OPTIONS, IMAGENET_MEAN, IMAGENET_STD, PLACEHOLDER_JPEG,
                       bucket_size, coin_flip, color_jitter, decode_images, normalize, pad_tokens,
                       random_resized_crop, resize_cover, resize_shorter, to_device, with_placeholder)
from .dali.media import (PLACEHOLDER_VIDEO, PLACEHOLDER_VIDEO_GPU, PLACEHOLDER_WAV, decode_audio, decode_clips, log_mel,
                         normalize_clips, resize_clips, split_clips)
from .dali.device import gpu_count, resolve_device

__all__ = ["DECODER_OPTIONS", "GPU_DECODER_OPTIONS", "IMAGENET_MEAN", "IMAGENET_STD", "PLACEHOLDER_JPEG", "bucket_size",
           "coin_flip", "color_jitter", "decode_images", "gpu_count", "normalize", "pad_tokens", "random_resized_crop",
           "resize_cover", "resize_shorter", "resolve_device", "to_device", "with_placeholder", "PLACEHOLDER_VIDEO",
           "PLACEHOLDER_VIDEO_GPU", "PLACEHOLDER_WAV", "decode_audio", "decode_clips", "log_mel", "normalize_clips", "resize_clips",
           "split_clips"]
