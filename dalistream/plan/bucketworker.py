"""What one worker executes of a bucket plan (:mod:`.buckets`): its *readers* — stretches of the
epoch sequence it reads at once, each front to back — and, at each step, which of their samples
go where in the batch. This is the interface the worker's reading loop follows:

- ``readers[j] = (parts, drop)``: shard parts in reading order and the raw ordinals (over those
  parts' samples) to skip without decoding or holding (another rank's, or already delivered);
  the samples kept are reader j's, numbered 0, 1, … in reading order;
- at step t the worker emits ``take[t]`` samples — reader ``emit_reader[i]``'s sample
  ``emit_index[i]`` for i in ``c[t] … c[t+1]−1`` (``c`` the running sum of ``take``) — into batch
  positions ``offset[t] … offset[t] + take[t] − 1``; every other position of its batch is padding;
- the step's bucket is ``bucket[t]`` (``-1``: a step of padding only), the same in all the
  rank's workers (and all ranks with ``per="global"``);
- ``lookahead``: the most samples it holds at once — read (up to the last one it has had to
  emit, reader by reader) and not yet emitted, the step's own included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np

from .ownership import Part

Reader = Tuple[Tuple[Part, ...], Tuple[int, ...]]  # (parts, drop)


@dataclass(frozen=True, eq=False)
class BucketWorkerPlan:
    """One worker's part of one epoch's bucket plan (see the module doc)."""

    rank: int
    worker: int
    epoch: int
    steps: int
    global_worker: int
    readers: Tuple[Reader, ...]
    emit_reader: np.ndarray
    emit_index: np.ndarray
    take: np.ndarray
    offset: np.ndarray
    bucket: np.ndarray
    lookahead: int

    @property
    def samples(self) -> int:
        """Samples it emits in the epoch."""
        return int(self.take.sum())


def holdings(reader: np.ndarray, index: np.ndarray, step: np.ndarray, steps: int) -> np.ndarray:
    """Samples a worker holds at each step: every reader read up to the last sample emitted from
    it so far, less the samples emitted at earlier steps. ``reader[i]``, ``index[i]``, ``step[i]``:
    reader, ordinal in it and step of each sample it emits."""
    if not len(step):
        return np.zeros(steps, dtype=np.int64)
    n = int(reader.max()) + 1
    last = np.full((n, steps), -1, dtype=np.int64)
    np.maximum.at(last, (reader, step), index)
    read = (np.maximum.accumulate(last, axis=1) + 1).sum(axis=0)
    emitted = np.bincount(step, minlength=steps)[:steps]
    return read - (np.cumsum(emitted) - emitted)
