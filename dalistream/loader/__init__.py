"""The torch side: :class:`Loader` runs a dalistream pipeline and yields dicts of torch tensors
(:mod:`.loader`), converting DALI's outputs and trimming padding (:mod:`.convert`)."""

from .convert import BufferPool, to_torch
from .loader import Loader

__all__ = ["BufferPool", "Loader", "to_torch"]
