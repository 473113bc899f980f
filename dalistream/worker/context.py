"""What a reader's helpers read with: :class:`ReadContext`, made by the
:class:`~.reader.PlanReader` for each read it hands out (a share of an epoch, :mod:`.epochfeed`
and :mod:`.mapped`). The helpers take
this, never the reader: what they find out they return, and the reader (or the epoch's feed)
acts on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ..config import StreamConfig
from ..dataset import DataSet
from ..io.parts import PartFetcher
from ..tar.runs import Arena
from .layouts import ShardLayouts
from .rows import RowDecoder


@dataclass(frozen=True)
class ReadContext:
    """A reader's config, data set and shard layouts; ``wants``: whether a member's extension is
    one the fields read; ``rows``: its decoder of runs, for source ``source_name``; ``arena``:
    where runs are read, ``worker`` and ``fetcher`` (its read-ahead of remote parts): the worker's;
    ``share_options``: the storage options of the one stream that reads a share by ranges (the
    reader's share of the worker's read-ahead; ``None``: ``config``'s)."""

    config: StreamConfig
    data: DataSet
    layouts: ShardLayouts
    wants: Callable[[str], bool]
    rows: RowDecoder
    source_name: str = ""
    arena: Optional[Arena] = None
    worker: int = 0
    fetcher: Optional[PartFetcher] = None
    share_options: Optional[Mapping[str, Any]] = None
