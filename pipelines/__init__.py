"""Ready pipelines built only from dalistream's public helpers (installed as ``dalistream.pipelines``).

Each module has a ``pipeline`` (a :func:`dalistream.pipeline_def` function, for use with your own
:class:`dalistream.Stream`) and a one-line ``loader(sources, batch_size=…, size=…, workers=…,
**stream_options)`` returning a :class:`dalistream.Loader`; its docstring tables the outputs.

- :mod:`~dalistream.pipelines.classification_train`: random-resized-crop fused into the decode,
  flip, optional colour jitter, normalized ``CHW`` float, ``int64`` labels.
- :mod:`~dalistream.pipelines.classification_eval`: decode, resize shorter side, centre crop,
  normalize; every sample once (``exact`` policy).
- :mod:`~dalistream.pipelines.image_text`: image + caption pairs for CLIP-style training,
  captions as Python ``str``.
- :mod:`~dalistream.pipelines.aspect_bucket_train`: every batch one aspect-ratio bucket, its
  images resized to cover the bucket's size and cropped to it at random, flipped, normalized.
- :mod:`~dalistream.pipelines.caption_buckets`: every batch one length bucket, a member's tokens
  padded to the bucket's length.
- :mod:`~dalistream.pipelines.video_clips_train`: a clip per video drawn from (seed, epoch, key),
  resized, randomly cropped, flipped, normalized ``(B, F, C, H, W)``; captions as ``str``.
- :mod:`~dalistream.pipelines.video_clips_eval`: the centred clip of every video once.
- :mod:`~dalistream.pipelines.audio_train`: mono at a target rate, a fixed-length crop, a log-mel
  spectrogram; transcripts as ``str``.

Importing this package does not import DALI or torch.
"""

from . import (aspect_bucket_train, audio_train, caption_buckets, classification_eval, classification_train,
               image_text, video_clips_eval, video_clips_train)
from .fields import merged_fields

__all__ = ["classification_train", "classification_eval", "image_text", "aspect_bucket_train", "caption_buckets",
           "video_clips_train", "video_clips_eval", "audio_train", "merged_fields"]
