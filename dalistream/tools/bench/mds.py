"""MosaicML streaming's ``streaming.base`` (``MDSWriter``, ``StreamingDataset``) for the bench's
``mosaicml`` peer, imported without running the ``streaming`` package's ``__init__``.

``import streaming`` imports ``streaming.vision`` (torchvision datasets), ``streaming.text`` and
``streaming.multimodal`` before ``streaming.base``. Every mosaicml-streaming release line (0.1–0.13)
requires torchvision, and the torchvision wheels on PyPI for Linux are CUDA builds whose
extension links torch's CUDA libraries: beside the CPU build of torch 2.13.0 (the README's pin)
``import torchvision`` fails ("operator torchvision::nms does not exist"), and with it
``import streaming``. The bench needs only ``streaming.base``, which imports none of those three
(it imports transformers, a dependency of mosaicml-streaming). :func:`base` registers the
``streaming`` package as found on the path (its ``__path__``, its ``__init__`` not run) and imports
``streaming.base`` from it; a ``streaming`` already imported (a process whose torchvision works) is
used as it is. Only the bench's own processes (the measured one, the converter) call it: a process
that then runs ``import streaming`` gets the package without its top-level names.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

PACKAGE = "streaming"
MODULES = ("streaming.base", "streaming.base.util")  # what the bench uses, in import order


def base() -> ModuleType:
    """``streaming.base`` (and ``streaming.base.util``), the ``streaming`` package's ``__init__`` left
    unrun unless already imported.

    Raises ``ImportError`` where mosaicml-streaming is not installed, and whatever ``streaming.base``
    raises where it is installed but cannot import (nothing is left registered then).
    """
    registered = False
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(f"No module named {PACKAGE!r} (mosaicml-streaming)", name=PACKAGE)
        sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
        registered = True
    try:
        return [importlib.import_module(name) for name in MODULES][0]
    except BaseException:
        if registered:
            for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
                del sys.modules[name]
        raise
