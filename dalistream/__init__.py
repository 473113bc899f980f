"""dalistream: stream WebDataset tar shards through parallel DALI sources into PyTorch.

Light to import: DALI and torch are loaded only when a pipeline is built or run.
"""

from __future__ import annotations

from .config import Field, StreamConfig
from .errors import (ConfigError, DalistreamError, ManifestError, SampleError, ShardFormatError, SourceError,
                     StateError, WorkerError)
from .dali.pipeline import pipeline_def, raw_pipeline, read
from .loader import Loader
from .stream import Stream
from .writer import write as write_shards

__version__ = "0.1.0"

__all__ = [
    "Field", "StreamConfig", "Stream", "Loader", "pipeline_def", "read", "raw_pipeline",
    "DalistreamError", "ConfigError", "SourceError", "ShardFormatError", "SampleError", "ManifestError",
    "StateError", "WorkerError", "write_shards",
]
