"""dalistream: stream WebDataset tar shards through parallel DALI sources into PyTorch.

Light to import: DALI and torch are loaded only when a pipeline is built or run.
"""

from __future__ import annotations

from .buckets import AspectBuckets, LengthBuckets
from .config import Field, StreamConfig
from .errors import (ConfigError, DalistreamError, ManifestError, SampleError, ShardFormatError, SourceError,
                     StateError, WorkerError)
from .dali.pipeline import pipeline_def, raw_pipeline, read
from .dali.device import torch_device
from .loader import Loader, read_state_file, write_state_file
from .stream import Stream
from .writer import write as write_shards

__version__ = "0.1.0"

__all__ = [
    "Field", "StreamConfig", "Stream", "Loader", "pipeline_def", "read", "raw_pipeline",
    "DalistreamError", "ConfigError", "SourceError", "ShardFormatError", "SampleError", "ManifestError",
    "StateError", "WorkerError", "torch_device", "write_shards", "read_state_file", "write_state_file",
    "AspectBuckets", "LengthBuckets",
]
