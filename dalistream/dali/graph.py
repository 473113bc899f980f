"""Inside a DALI pipeline: one parallel external source per worker, merged into one batch.

Every worker's source yields a full-size batch whose own slot holds real samples. A constant
per-position *owner* index (which worker fills position ``i``) drives a chain of conditionals
(``if owner == w``): DALI splits each source's batch by the predicate and merges the selected
samples back in batch order. Padding positions never reach anything but the merge.
"""

from __future__ import annotations

import itertools
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..config import StreamConfig
from ..manifest.offsets import SampleOffsets
from ..plan import Layout
from ..worker import WorkerSource, stats_path
from .compat import do_not_convert

_names = itertools.count()


class OwnerIndex:
    """Main-process source of the constant owner index (the same arrays every iteration)."""

    def __init__(self, batch_size: int, workers: int) -> None:
        owners = [w for w, n in enumerate(Layout(1, workers, batch_size).slots) for _ in range(n)]
        self.batch = [np.array(w, np.int32) for w in owners]

    def __call__(self) -> List[np.ndarray]:
        return self.batch


def merge(owner, branches: Sequence[Sequence]) -> list:
    """Select, for each batch position, the outputs of the branch that owns it.

    ``branches[w]`` is the tuple of data nodes of worker ``w``. Needs a pipeline built with
    ``enable_conditionals=True``, and a caller that AutoGraph converts (the ``if`` below is on
    data: AutoGraph turns it into DALI's split and merge).
    """
    result = list(branches[-1])
    for w in range(len(branches) - 2, -1, -1):
        if owner == w:
            result = list(branches[w])
    return result


@do_not_convert
def sharded_sources(
    config: StreamConfig, urls: Sequence[str], counts: Optional[Sequence[int]], *, start_epoch: int = 0,
    start_step: int = 0, stats_dir: Optional[str] = None, offsets: Optional[SampleOffsets] = None,
    count_source: Optional[str] = None,
) -> Tuple[Optional[object], List[Sequence]]:
    """Create the W parallel sources; return ``(owner, branches)``: the owner index node (``None``
    with one worker) and, per worker, its output nodes (the fields, then ``valid``).

    Call inside a function decorated with DALI's ``pipeline_def`` (see :mod:`dalistream.dali.pipeline`),
    whose ``py_num_workers`` equals ``config.workers``; merge with :func:`merge`.
    """
    from nvidia.dali import fn, types

    prefix = f"dalistream{next(_names)}"
    n_out = len(config.fields) + 1
    branches = []
    for w in range(config.workers):
        source = WorkerSource(
            config, urls, counts, w, start_epoch=start_epoch, start_step=start_step, offsets=offsets,
            count_source=count_source, stats_path=stats_path(stats_dir, w) if stats_dir else None,
        ).for_dali()
        nodes = fn.external_source(
            source=source, num_outputs=n_out, batch=True, parallel=True, cycle="quiet",
            prefetch_queue_depth=config.prefetch,
        )
        branches.append(nodes)
    if config.workers == 1:
        return None, branches
    owner = fn.external_source(source=OwnerIndex(config.batch_size, config.workers), batch=True,
                               dtype=types.INT32, name=f"{prefix}_owner")
    return owner, branches
