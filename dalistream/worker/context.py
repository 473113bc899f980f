"""What a reader's helpers read with: :class:`ReadContext`, made by the
:class:`~.reader.PlanReader` for each read it hands out (a share of an epoch, :mod:`.epochfeed`
and :mod:`.mapped`). The helpers take
this, never the reader: what they find out they return, and the reader (or the epoch's feed)
acts on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..config import StreamConfig
from ..dataset import DataSet
from ..tar.runs import Arena
from .layouts import ShardLayouts
from .rows import RowDecoder


@dataclass(frozen=True)
class ReadContext:
    """A reader's config, data set and shard layouts; ``wants``: whether a member's extension is
    one the fields read; ``rows``: its decoder of runs, for source ``source_name``; ``arena``:
    where runs are read (the worker's)."""

    config: StreamConfig
    data: DataSet
    layouts: ShardLayouts
    wants: Callable[[str], bool]
    rows: RowDecoder
    source_name: str = ""
    arena: Optional[Arena] = None
