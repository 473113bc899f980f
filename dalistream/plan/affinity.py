"""Node-affine plans (``affinity="node"``): each node of the job owns a fixed set of shards, the
same every epoch, so that its node-local cache (:mod:`dalistream.io.cache`) holds about 1/N of the
data and reads it from the local disk from the second epoch on. Pure functions of (counts,
layout, :class:`Nodes`, schedule, epoch[, segments]).

**Nodes**: ``N`` nodes of ``L`` ranks each; rank ``r`` is on node ``r // L`` (the block placement
of torchrun and of ``srun``). :func:`resolve_nodes` works the value out at an entry point.

**Ownership** (:func:`node_owner`): the shards, largest count first (equal counts in an order
drawn from the seed), each to the node holding the fewest samples so far. The nodes' samples
then differ by at most the largest shard's count; the owner depends on (counts, N, seed) alone,
never on the epoch.

**An epoch**: node ``n``'s sequence is the epoch's shard permutation (the one every plan uses,
:func:`~.ownership.epoch_order`) with the shards of other nodes left out, laid end to end; it is
cut among the node's ranks as a whole epoch is without affinity: one balanced span per worker,
or per batch position when reading interleaved (a rank's batch then draws from ``B`` places
spread over its node's sequence). Every node runs the same steps, from counts alone (``T_n``:
node ``n``'s samples, ``L·B`` the samples its ranks take per step):

- ``even``: ``steps = min_n ⌊T_n / (L·B)⌋``; node ``n`` leaves out ``T_n − steps·L·B`` samples
  (fewer than ``L·B`` plus the largest shard), one drawn in each of as many equal stretches of its
  sequence, anew each epoch (:func:`~.ownership.drawn_left_out`; on one node exactly the samples the plan
  without affinity leaves out), passed over by the workers reading around them (drops);
- ``exact``: ``steps = max_n ⌈T_n / (L·B)⌉``; node ``n``'s samples are split among its ranks as
  a whole epoch is among all ranks: its own ``⌈T_n / (L·B)⌉`` steps full but the last, whose
  samples are dealt position by position (no rank of the node gets only padding unless fewer
  samples than its ranks are left), then empty batches up to ``steps``; every sample once;
- ``fixed``: its batches, over spans proportional to the slots.

Without nodes, or on one node, the plans are those of :mod:`.ownership` and :mod:`.resume` (the
same parts, drops and steps).

**Resume onto other layouts**: a segment of an epoch run with affinity is ``(world_size, workers,
batch_size, steps, nodes, columns)`` (the real layout; ``columns`` 1 when it read interleaved),
one without it the 4 integers of :mod:`.resume` (its planned layout). What remains after the
segments is the sequence of :class:`~.resume.Remaining`; an affine segment sees it regrouped node
by node (:class:`Regrouped`: each node's remaining samples, in their order) and cuts each node's
part as above, its nodes' unowned tails (``even``) being spans that deliver nothing (the first
segment's even left-out samples are drawn as above: :func:`level_zero`). So a
resume onto another node count continues the epoch with every sample once (``exact``) and each
node's remaining samples are those of the shards it owns under the new count
(:func:`cache_kept` says how much of each node's cache that keeps).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from ..manifest.offsets import running_starts
from . import seeds
from .bucketworker import stable_argsort
from .layout import Layout, Schedule
from .ownership import (EpochLayout, WorkerPlan, drawn_left_out, epoch_layout, epoch_steps, left_out_positions, slot_starts,
                        span_bounds)
from .resume import (Remaining, Segment, Stretch, check_ran, kept_first_runs, kth_positions, merged_runs,
                     runs_to_parts, segment_head, segment_layout)


@dataclass(frozen=True)
class Nodes:
    """``count`` nodes of ``ranks_per_node`` ranks each; rank ``r`` is on node ``r // ranks_per_node``."""

    count: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        for name in ("count", "ranks_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"nodes: {name} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.count * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node of ``rank``."""
        return rank // self.ranks_per_node


def ranks_per_node(env: Mapping[str, str]) -> Optional[int]:
    """Training processes per node as the launcher says: ``LOCAL_WORLD_SIZE`` (torchrun), else
    ``SLURM_NTASKS_PER_NODE`` (srun; its first number), else None."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        text = env.get(name, "").split("(", 1)[0].split(",", 1)[0]
        if text.strip().isdigit() and int(text) > 0:
            return int(text)
    return None


def resolve_nodes(rank: int, world_size: int, env: Mapping[str, str], nodes: Optional[int] = None) -> Nodes:
    """The :class:`Nodes` of a job, at an entry point: ``nodes`` given (the world split in that
    many), else from the launcher's environment (``LOCAL_WORLD_SIZE``, ``SLURM_NTASKS_PER_NODE``;
    none: one node). The node the launcher names for this rank (``GROUP_RANK``, ``SLURM_NODEID``)
    must be the one the block placement gives it, else a :class:`ConfigError`."""
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or world_size % nodes:
            raise ConfigError(f"nodes must be a positive integer dividing the world size {world_size}, got {nodes!r}")
        layout = Nodes(nodes, world_size // nodes)
    else:
        per = ranks_per_node(env)
        if per is None:
            return Nodes(1, world_size)
        if world_size % per:
            raise ConfigError(f"{world_size} ranks are not whole nodes of {per} ranks (LOCAL_WORLD_SIZE / "
                              "SLURM_NTASKS_PER_NODE)", hint="node-affine plans need the same number of ranks on "
                                                            "every node")
        layout = Nodes(world_size // per, per)
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        if name in env:
            try:
                named = int(env[name])
            except ValueError:
                raise ConfigError(f"{name} is not an integer: {env[name]!r}") from None
            if named != layout.node_of(rank):
                raise ConfigError(f"rank {rank} runs on node {named} ({name}), but node-affine plans place it on node "
                                  f"{layout.node_of(rank)} (ranks {layout.ranks_per_node} to a node, in blocks)",
                                  hint="start ranks in blocks per node (torchrun does; srun --distribution=block)")
            break
    return layout


def node_owner(counts: Sequence[int], nodes: int, seed: int) -> np.ndarray:
    """``owner[s]``: the node that owns shard ``s`` in every epoch (module doc)."""
    counts = np.asarray(counts, dtype=np.int64)
    return _owner(counts.tobytes(), int(nodes), int(seed)).copy()


@lru_cache(maxsize=16)
def _owner(key: bytes, nodes: int, seed: int) -> np.ndarray:
    counts = np.frombuffer(key, dtype=np.int64)
    if len(counts) < nodes:
        raise ConfigError(f"{len(counts)} shards cannot give each of {nodes} nodes a shard of its own "
                          "(affinity='node')", hint="split the data set into more shards, or read without affinity")
    perm = np.random.default_rng(seeds.node_shards(seed)).permutation(len(counts))
    return greedy_owner(counts, perm[stable_argsort(-counts[perm])], nodes)


def greedy_owner(counts: np.ndarray, order: np.ndarray, nodes: int) -> np.ndarray:
    """``owner[s]``: shards taken in ``order``, each to the node first by (samples so far, shards
    so far, node number). Computed a batch of shards at a time: the next ``m`` shards go to the
    ``m`` nodes first in line, in line order, for as long as each of those nodes is still before
    every node already given a shard in the batch (its key after that shard) — the rule's own
    choices, without a step per shard."""
    owner = np.empty(len(counts), dtype=np.int64)
    load = np.zeros(nodes, dtype=np.int64)
    held = np.zeros(nodes, dtype=np.int64)
    node = np.arange(nodes, dtype=np.int64)
    size = np.asarray(counts, dtype=np.int64)[order]
    pos = 0
    while pos < len(order):
        m = min(nodes, len(order) - pos)
        line = np.lexsort((node, held, load))[:m]
        c = size[pos:pos + m]
        # every node's key before (first m) and after (last m) its shard, ranked together
        rank = np.empty(2 * m, dtype=np.int64)
        rank[np.lexsort((np.concatenate([line, line]), np.concatenate([held[line], held[line] + 1]),
                         np.concatenate([load[line], load[line] + c])))] = np.arange(2 * m)
        ahead = rank[1:m] < np.minimum.accumulate(rank[m:2 * m - 1])
        j = m if ahead.all() else int(np.argmin(ahead)) + 1
        owner[order[pos:pos + j]] = line[:j]
        load[line[:j]] += c[:j]
        held[line[:j]] += 1
        pos += j
    return owner


class Regrouped:
    """The sequence ``prev`` (a :class:`~.resume.Remaining`: runs of epoch positions) regrouped
    node by node: node 0's samples first, each node's in ``prev``'s order. ``bounds[n]`` is where
    node ``n``'s part starts; :meth:`runs` maps positions back to epoch positions. With
    ``leave_out`` (level 0 under ``even``: :func:`level_zero`), ``left = leave_out(node_totals)``
    are the sorted positions the nodes leave out, each node's part reordered by
    :func:`~.resume.kept_first_runs`: the samples it keeps, then those it leaves out."""

    def __init__(self, prev: Remaining, ep: EpochLayout, owner: np.ndarray, nodes: int,
                 leave_out: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> None:
        self.prev, self.schedule, self.epoch = prev, prev.schedule, prev.epoch
        self.shuffle, self.level, self.total = prev.shuffle, prev.level, prev.total
        starts, stops, nodes_of, dropped, drops = [], [], [], [], {}
        at = 0  # pieces so far
        for run in prev.runs(0, prev.total):
            i = np.arange(int(np.searchsorted(ep.starts, run.start, "right")) - 1,
                          int(np.searchsorted(ep.starts, run.stop - 1, "right")))
            a, b = np.maximum(ep.starts[i], run.start), np.minimum(ep.starts[i + 1], run.stop)
            full = b > a
            i, a, b = i[full], a[full], b[full]
            starts.append(a)
            stops.append(b)
            nodes_of.append(owner[ep.order[i]])
            if run.drop:  # (only a resumed sequence's runs pass over samples)
                d = np.asarray(run.drop, dtype=np.int64)
                piece = np.searchsorted(a, d, "right") - 1
                dropped.append(np.bincount(piece, minlength=len(a)))
                drops.update((at + k, tuple(d[piece == k].tolist())) for k in np.unique(piece).tolist())
            else:
                dropped.append(np.zeros(len(a), dtype=np.int64))
            at += len(a)
        empty = [np.zeros(0, np.int64)]
        start, stop, node, gone = (np.concatenate(x or empty) for x in (starts, stops, nodes_of, dropped))
        sizes = stop - start - gone
        order = stable_argsort(node)
        self.start, self.stop = start[order], stop[order]
        where = np.empty(len(order), dtype=np.int64)
        where[order] = np.arange(len(order))
        self.drops = {int(where[k]): d for k, d in drops.items()}  # piece -> the positions it passes over
        self.cum = running_starts(sizes[order])
        self.node_totals = np.bincount(node, weights=sizes, minlength=nodes).astype(np.int64)
        self.bounds = running_starts(self.node_totals)
        self.left = np.zeros(0, dtype=np.int64) if leave_out is None else leave_out(self.node_totals)
        self.cuts = np.searchsorted(self.left, self.bounds)

    def runs(self, lo: int, hi: int) -> List[Stretch]:
        """Positions ``[lo, hi)`` of this sequence as runs of epoch positions, in order."""
        if not len(self.left):
            return self._runs(lo, hi)
        out: List[Stretch] = []
        bounds = self.bounds
        for n in range(max(0, int(np.searchsorted(bounds, lo, "right")) - 1), int(np.searchsorted(bounds, hi, "left"))):
            b0, b1 = int(bounds[n]), int(bounds[n + 1])
            a, b = max(lo, b0) - b0, min(hi, b1) - b0
            if b > a:
                left = self.left[self.cuts[n]:self.cuts[n + 1]] - b0
                out += kept_first_runs(lambda x, y, b0=b0: self._runs(b0 + x, b0 + y), b1 - b0, left, a, b)
        return merged_runs(out)

    def _runs(self, lo: int, hi: int) -> List[Stretch]:
        if hi <= lo:
            return []
        out = []
        for k in range(int(np.searchsorted(self.cum, lo, "right")) - 1, int(np.searchsorted(self.cum, hi, "left"))):
            base = int(self.cum[k])
            a, b = max(lo, base) - base, min(hi, int(self.cum[k + 1])) - base
            if b <= a:
                continue
            start, drop = int(self.start[k]), self.drops.get(k, ())
            if not drop:
                out.append(Stretch(start + a, start + b))
                continue
            x, y = kth_positions([Stretch(start, int(self.stop[k]), drop)], [a, b - 1])
            out.append(Stretch(x, y + 1, tuple(d for d in drop if x < d < y)))
        return merged_runs(out)


def _segment_steps(totals: np.ndarray, per_step: int, schedule: Schedule) -> int:
    if schedule.policy == "even":
        return int((totals // per_step).min())
    return int((-(-totals // per_step)).max())


def node_spans(grouped: Any, layout: Layout, nodes: Nodes, columns: bool, schedule: Schedule,
               steps: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spans of an affine segment over ``grouped`` (node by node): ``(bounds, owners, slots)``;
    span ``i`` is ``[bounds[i], bounds[i+1])``, read by global worker ``owners[i]`` (a column when
    ``columns``) with slot ``slots[i]``; ``-1``/0 for a node's samples that no one reads
    (``even``). A node's samples are cut among its ranks as the module doc says (``even``: every
    worker ``steps × slot``; else :func:`~.ownership.span_bounds` over the node's layout)."""
    planned = layout.planned(columns)
    node_layout = Layout(nodes.ranks_per_node, layout.workers, layout.batch_size).planned(columns)
    g = np.arange(planned.global_workers, dtype=np.int64)
    rank = g // planned.workers
    node_of_g = (rank % layout.world_size if columns else rank) // nodes.ranks_per_node
    slot_of_g = np.tile(np.asarray(planned.slots, dtype=np.int64), planned.world_size)
    bounds, owners, slots = [], [], []
    for n in range(nodes.count):
        members = g[node_of_g == n]  # in the order of the node's own layout (ranks, or columns p·L + r)
        total = int(grouped.node_totals[n])
        local = steps * slot_starts(node_layout) if schedule.policy == "even" else span_bounds(total, node_layout,
                                                                                                schedule)
        bounds.append(int(grouped.bounds[n]) + local)
        owners += [members, np.array([-1])]
        slots += [slot_of_g[members], np.array([0])]
    return np.concatenate(bounds + [np.array([grouped.total])]), np.concatenate(owners), np.concatenate(slots)


def level_zero(counts: Sequence[int], ep: EpochLayout, schedule: Schedule, epoch: int, first: Segment,
               shuffle: int) -> Any:
    """The epoch's sequence as the layout that planned it first (``first``, a segment; its steps
    are not read) cuts it: without affinity the samples kept then those ``even`` leaves out
    (:class:`~.resume.Remaining`); with it the nodes' parts one after the other (:class:`Regrouped`),
    each node's kept samples then its left-out ones (``even``)."""
    if len(first) == 4:
        left = left_out_positions(ep.total, segment_layout(first), schedule, epoch)
        return Remaining(ep.total, schedule, epoch, shuffle, left)
    layout, count = segment_layout(first), int(first[4])
    nodes = Nodes(count, layout.world_size // count)
    per_step = nodes.ranks_per_node * layout.batch_size

    def leave_out(totals: np.ndarray) -> np.ndarray:
        left = totals - _segment_steps(totals, per_step, schedule) * per_step
        return drawn_left_out(totals.tolist(), left.tolist(), schedule.seed, epoch)

    return Regrouped(Remaining(ep.total, schedule, epoch, shuffle), ep, node_owner(counts, nodes.count, schedule.seed),
                     nodes.count, leave_out if schedule.policy == "even" else None)


def remaining_after(counts: Sequence[int], ep: EpochLayout, schedule: Schedule, epoch: int,
                    segments: Sequence[Segment], shuffle: int, first: Segment) -> Any:
    """The sequence left of ``epoch`` after ``segments`` (with or without affinity; module doc);
    ``first``: the segment that planned the epoch when there are none yet (the plan being made)."""
    level = level_zero(counts, ep, schedule, epoch, segments[0] if segments else first, shuffle)
    for k, seg in enumerate(segments):
        layout = segment_layout(seg)
        nodes = Nodes(int(seg[4]), layout.world_size // int(seg[4])) if len(seg) == 6 else None
        source, planned, bounds, owners, slots = cut_sequence(level, ep, counts, layout, nodes,
                                                              len(seg) == 6 and bool(seg[5]), schedule, k > 0)
        check_ran(k, seg, planned)
        seed_of = partial(lambda owners, base, i: base(int(owners[i])), owners,
                          partial(seeds.segment_shuffle, schedule.seed, epoch, k))
        level = Remaining.after(source, bounds, np.minimum(np.diff(bounds), int(seg[3]) * slots), seed_of)
    return level


def cut_sequence(level: Any, ep: EpochLayout, counts: Sequence[int], layout: Layout, nodes: Optional[Nodes], columns: bool,
                 schedule: Schedule, regroup: bool) -> Tuple[Any, int, np.ndarray, np.ndarray, np.ndarray]:
    """The sequence ``level`` cut over ``layout``: ``(sequence, steps, bounds, owners, slots)``, as
    :func:`node_spans` says them; without nodes the balanced spans of the layout as planned
    (:func:`~.ownership.span_bounds`), span ``g`` global worker ``g``'s; with them each node's part
    cut among its ranks (``regroup``: ``level`` regrouped node by node first)."""
    if nodes is None:
        planned = layout.planned(columns)
        return (level, epoch_steps(level.total, planned, schedule), span_bounds(level.total, planned, schedule),
                np.arange(planned.global_workers, dtype=np.int64),
                np.tile(np.asarray(planned.slots, dtype=np.int64), planned.world_size))
    if regroup:
        level = Regrouped(level, ep, node_owner(counts, nodes.count, schedule.seed), nodes.count)
    steps = _segment_steps(level.node_totals, nodes.ranks_per_node * layout.batch_size, schedule)
    return (level, steps) + node_spans(level, layout, nodes, columns, schedule, steps)


class AffinePlan:
    """The rest of ``epoch`` after ``segments`` (none: the whole epoch) for ``layout``, with node
    affinity over ``nodes`` (``None``: without it, the balanced spans of what remains, the one
    plan of an elastic resume: :mod:`.resume`), read interleaved (``columns``) or one span per
    worker through a buffer of ``shuffle``. Computed once per epoch; :meth:`plans` gives what a
    worker reads."""

    def __init__(self, counts: Sequence[int], layout: Layout, nodes: Optional[Nodes], schedule: Schedule, epoch: int,
                 *, columns: bool, shuffle: int = 0, segments: Sequence[Segment] = ()) -> None:
        if nodes is not None and nodes.world_size != layout.world_size:
            raise ConfigError(f"{nodes.count} nodes of {nodes.ranks_per_node} ranks are not the world size "
                              f"{layout.world_size}")
        self.counts, self.layout, self.nodes, self.schedule, self.epoch = counts, layout, nodes, schedule, epoch
        self.columns, self.shuffle, self.segments = bool(columns), shuffle, tuple(segments)
        self.ep = epoch_layout(counts, Layout(1, 1, 1), schedule, epoch)
        fixed = schedule.policy == "fixed"
        segments = () if fixed else self.segments
        head = segment_head(layout, layout.planned(self.columns), None if nodes is None else nodes.count, self.columns)
        rest = remaining_after(counts, self.ep, schedule, epoch, segments, shuffle, head[:3] + (0,) + head[3:])
        planned = layout.planned(self.columns)
        self.sequence, self.steps, self.bounds, self.owners, _ = cut_sequence(rest, self.ep, counts, layout, nodes,
                                                                              self.columns, schedule, bool(segments))
        if fixed:
            self.steps = max(0, int(schedule.batches_per_epoch) - sum(int(s[3]) for s in self.segments))
        self.span = np.full(planned.global_workers, -1, dtype=np.int64)
        real = self.owners >= 0
        self.span[self.owners[real]] = np.flatnonzero(real)
        self.left_out = 0 if fixed else int(rest.total - np.diff(self.bounds)[real].sum())
        self.last = planned.global_workers - 1

    def _plan(self, g: int, rank: int, worker: int, slot: int, offset: int, seed: Optional[int]) -> WorkerPlan:
        i = int(self.span[g])
        lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
        parts, drop = runs_to_parts(self.ep, self.sequence.runs(lo, hi))
        if self.schedule.policy == "fixed" and hi == lo:
            raise ConfigError(f"global worker {g} owns no sample: its node's samples cannot fill a slot of every "
                              "one of its workers", hint="use fewer workers or a smaller batch")
        return WorkerPlan(rank, worker, self.epoch, tuple(parts), self.steps, slot, offset, hi - lo, g,
                          self.left_out if g == self.last else 0, tuple(drop), seed)

    def plans(self, rank: int, worker: int) -> Tuple[WorkerPlan, ...]:
        """What (``rank``, ``worker``) reads: one span through its buffer, or reading interleaved
        its columns in slot order, as :func:`~.ownership.worker_plan` and
        :func:`~.ownership.worker_columns` give them for a whole epoch without affinity; a span's
        shuffle seed (and, without nodes, a column's) is its segment's."""
        layout, seed, segment = self.layout, self.schedule.seed, len(self.segments)
        if not self.columns:
            g = layout.global_worker(rank, worker)
            return (self._plan(g, rank, worker, layout.slots[worker], layout.slot_offsets[worker],
                               seeds.segment_shuffle(seed, self.epoch, segment, g)),)
        return tuple(self._plan(q, q, 0, 1, 0, None if self.nodes is not None else
                                seeds.segment_shuffle(seed, self.epoch, segment, q))
                     for q in layout.columns(rank, worker))


def cache_kept(counts: Sequence[int], before: int, after: int, seed: int) -> List[float]:
    """Per node of a job resumed on ``after`` nodes (it was on ``before``): the share of the
    samples it now owns that the same node (same node id, so the same machine and disk) owned
    before — what its cache still holds after one epoch under the old count. Nodes beyond the
    old count start cold (0)."""
    counts = np.asarray(counts, dtype=np.int64)
    old, new = node_owner(counts, before, seed), node_owner(counts, after, seed)
    mine = np.bincount(new, weights=counts, minlength=after)
    kept = np.bincount(new, weights=np.where(old == new, counts, 0), minlength=after)
    return [float(k / m) if m else 0.0 for k, m in zip(kept, mine)]


__all__ = ["AffinePlan", "Nodes", "Regrouped", "cache_kept", "cut_sequence", "level_zero", "node_owner",
           "node_spans", "ranks_per_node", "remaining_after", "resolve_nodes"]
