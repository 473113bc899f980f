"""Rank and world size checked again when a loader starts: a stream opened before
``torch.distributed`` was initialised (PyTorch Lightning builds the data first, then ``Trainer.fit``
starts the processes' group) took world size 1 from its defaults, and its ranks would then
disagree on the number of batches, or each read the whole data set.

Values taken from defaults (``RANK``/``WORLD_SIZE``, or none) give way to ``torch.distributed``'s;
values given to :meth:`~dalistream.Stream.open` are kept, and refused by name where they cannot be
meant: another world size than the group's (other than 1: every process reading the whole data
set, as asked), or another rank in a world of the group's size.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Tuple

from ..errors import ConfigError
from ..plan import check_layout
from ..plan.epochplan import check_buckets
from ..stream import Stream, check_data_size

log = logging.getLogger(__name__)


def distributed_layout() -> Optional[Tuple[int, int]]:
    """``(rank, world size)`` of ``torch.distributed`` once initialised, else ``None``."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def relaid(stream: Stream, group: Optional[Tuple[int, int]]) -> Stream:
    """``stream`` with the rank and world size of ``group`` (``torch.distributed``'s, or ``None``
    before it is initialised) where they came from defaults; a :class:`ConfigError` naming the
    value given to ``Stream.open`` that the group contradicts (see the module doc)."""
    c = stream.config
    if group is None or (c.rank, c.world_size) == group:
        return stream
    rank, world = stream.given if stream.given is not None else (c.rank, c.world_size)
    now_rank, now_world = group
    wrong = None
    if world is not None and world not in (1, now_world):
        wrong = f"world_size={world}"
    elif rank is not None and rank != now_rank and (world or now_world) > 1:
        wrong = f"rank={rank}"
    if wrong:
        raise ConfigError(f"{wrong} was given to Stream.open, but torch.distributed (initialised since) runs this "
                          f"process as rank {now_rank} of {now_world}",
                          hint="leave rank and world_size unset (they then come from torch.distributed when the loader "
                               "starts), or give those of the process group (world_size=1: this process reads every "
                               "sample)")
    new_rank = rank if rank is not None else now_rank
    new_world = world if world is not None else now_world
    if (new_rank, new_world) == (c.rank, c.world_size):
        return stream
    config = c.replace(rank=new_rank, world_size=new_world)
    if config.buckets is not None:
        check_buckets(config, stream.data, stream.mix)  # the bucket plan, on the group's layout
    elif stream.mix is not None:
        stream.mix.epoch(config.layout, config.schedule, 0)  # every share, on the group's layout
    elif stream.data.counts is not None:
        check_data_size(config, stream.data.counts)
    else:
        check_layout(len(stream.data.urls), config.layout)
    log.info("rank %d of %d (torch.distributed, initialised after the stream was opened as rank %d of %d)",
             new_rank, new_world, c.rank, c.world_size)
    return dataclasses.replace(stream, config=config)
