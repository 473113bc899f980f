"""Field kinds: the table (:mod:`.table`) of what the data path does with each kind of field, and
the checks and parsers its kinds use (:mod:`.images`, :mod:`.values`)."""

from .images import IMAGE_EXTS, image_problem, is_image_ext
from .table import BULK_ROWS, DEFAULT, KINDS, Cells, Kind, Problem, kind_for, register

__all__ = ["BULK_ROWS", "Cells", "DEFAULT", "IMAGE_EXTS", "KINDS", "Kind", "Problem", "image_problem", "is_image_ext",
           "kind_for", "register"]
