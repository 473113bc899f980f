"""A mix's columns: what each worker reads of each source. Read in spans, a worker's share of a
source is one span of the source's sequence; read interleaved (the default, as for one data set),
it is cut into one *column* per position of the share, each taking one sample a step while the
share reaches it (:func:`column_takes`), and the columns of all workers are laid over the
source's sequence so that a rank's columns lie apart, spread over it (:func:`column_sizes`,
:func:`column_index`). Pure functions of the plan's takes (:func:`~.mix.worker_take`)."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from .layout import Layout
from .ownership import WorkerPlan


def column_takes(take: np.ndarray, interleave: bool) -> np.ndarray:
    """``(steps, K)``: what each of a worker's columns of one source takes at each step, from its
    share ``take`` (``(steps,)``): one column of the whole share (a span), or, interleaved, one
    column per position of the share, taking one sample a step while the share reaches it."""
    take = np.asarray(take, dtype=np.int64)
    if not interleave:
        return take[:, None]
    return (take[:, None] > np.arange(int(take.max(initial=0)))[None, :]).astype(np.int64)


def column_sizes(take: np.ndarray, layout: Layout, interleave: bool,
                 ks: Optional[Sequence[int]] = None) -> Tuple[List[np.ndarray], List[int]]:
    """Per source, the samples of each of its columns over ``take`` (``(steps, W, S)``), columns
    ``c = (k·W + w)·R + r`` (:func:`column_index`: ``k``, the column of worker ``w``'s share; as for
    one data set, a position's columns of the ``R`` ranks lie side by side, so a rank's columns lie
    ``R`` spans apart, spread over the source's sequence); a worker without a ``k``-th column has
    one of size 0. Without ``interleave`` the columns are the workers' spans (``c = g``). And the
    number of ``k`` per source (``ks``: given, for the steps of a plan that has them)."""
    out, counts = [], []
    for s in range(take.shape[2]):
        per_worker = [column_takes(take[:, w, s], interleave).sum(axis=0) for w in range(layout.workers)]
        k = (max((len(p) for p in per_worker), default=0) if interleave else 1) if ks is None else int(ks[s])
        counts.append(k)
        sizes = np.zeros((k, layout.workers, layout.world_size), dtype=np.int64)
        for w in range(layout.workers):
            p = per_worker[w][:k]
            sizes[:len(p), w, :] = p[:, None]
        out.append(sizes.ravel() if interleave else sizes.transpose(2, 1, 0).ravel())  # (spans: g = r·W + w)
    return out, counts


def column_index(layout: Layout, rank: int, worker: int, k: int, interleave: bool) -> int:
    """The index of worker ``worker`` of ``rank``'s ``k``-th column of a source (:func:`column_sizes`)."""
    if not interleave:
        return layout.global_worker(rank, worker)
    return (k * layout.workers + worker) * layout.world_size + rank


def worker_columns(take: np.ndarray, layout: Layout, rank: int, worker: int, interleave: bool,
                   plan: Callable[[int, int], WorkerPlan]) -> List[Tuple[WorkerPlan, np.ndarray, int]]:
    """(``rank``, ``worker``)'s columns over ``take`` (``(steps, W, S)``): per source, each of its
    columns as ``(plan(source, column index), take per step, source)``, sources in order."""
    out = []
    for s in range(take.shape[2]):
        takes = column_takes(take[:, worker, s], interleave)
        for k in range(takes.shape[1]):
            out.append((plan(s, column_index(layout, rank, worker, k, interleave)), takes[:, k], s))
    return out
