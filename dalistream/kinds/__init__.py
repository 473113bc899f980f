"""Field kinds: the table (:mod:`.table`) of what the data path does with each kind of field, and
the checks and parsers its kinds use (:mod:`.images`, :mod:`.values`, :mod:`.video`, :mod:`.audio`)."""

from .audio import AUDIO_EXTS, Crops, audio_problem
from .images import IMAGE_EXTS, image_problem, is_image_ext
from .video import VIDEO_EXTS, Clips, VideoInfo, probe
from .table import BULK_ROWS, DEFAULT, KINDS, Cells, Kind, Problem, kind_for, register

__all__ = ["AUDIO_EXTS", "BULK_ROWS", "Cells", "Clips", "Crops", "DEFAULT", "IMAGE_EXTS", "KINDS", "Kind", "Problem",
           "VIDEO_EXTS", "VideoInfo", "audio_problem", "image_problem", "is_image_ext", "kind_for", "probe", "register"]
