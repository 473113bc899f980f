"""The torch side: :class:`Loader` runs a dalistream pipeline and yields dicts of torch tensors
(:mod:`.loader`), converting DALI's outputs and trimming padding (:mod:`.convert`)."""

from .convert import BufferPool, to_torch
from .loader import Loader
from .state import read_state_file, write_state_file

__all__ = ["BufferPool", "Loader", "read_state_file", "to_torch", "write_state_file"]
