"""``dalistream plan``: what an epoch's plan costs for a layout (samples left out, padding, shards
cut), and which parts each (rank, worker) reads. Counts come from the shards (a manifest or a
scan) or, to try a layout at any scale without data, from ``--counts N:LO-HI`` (N shards of
LO to HI samples, drawn with ``--seed``)."""

from __future__ import annotations

import argparse
import collections.abc
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..config import reading_order
from ..errors import ConfigError, StateError, redact
from ..plan import Layout, Schedule, epoch_layout, owned_parts, steps_per_epoch
from ..plan.mix import MixEpoch, integer_weights
from ..plan.affinity import AffinePlan, Nodes, resolve_nodes
from ..plan.resume import Segment, segment_head
from .quality import shuffle_quality
from .args import emit, storage_options


# -- an epoch's numbers: samples read, left out, padded; shards cut; a mix's sources; a resume's rest

def epoch_summary(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int) -> Dict[str, Any]:
    """Numbers of one epoch's plan (``counts`` known): steps, samples owned per global worker
    (min/max), left out, padding, shards cut and parts per shard."""
    plan = epoch_layout(counts, layout, schedule, epoch)
    total, steps = plan.total, plan.steps
    sizes = np.diff(plan.bounds)
    owned = int(plan.bounds[-1] - plan.bounds[0])
    slots = np.tile(np.asarray(layout.slots, dtype=np.int64), layout.world_size)
    delivered = np.minimum(sizes, steps * slots) if schedule.policy == "fixed" else sizes
    capacity = steps * layout.world_size * layout.batch_size
    a, b = plan.starts[:-1], plan.starts[1:]
    nonempty = b > a
    # owners of a shard: the spans that hold its first and its last sample, and all between
    edges = plan.edges  # the spans' stretches of the sequence (left-out samples inside them passed over)
    first = np.searchsorted(edges, a, side="right") - 1
    last = np.searchsorted(edges, b - 1, side="right") - 1
    owned_shard = nonempty & (a < edges[-1]) & (b > edges[0])
    parts = np.where(owned_shard, np.minimum(last, layout.global_workers - 1) - first + 1, 0)
    return {
        "epoch": epoch, "policy": schedule.policy, "shards": len(counts), "empty_shards": int((~nonempty).sum()),
        "samples": total, "world_size": layout.world_size, "workers": layout.workers,
        "batch_size": layout.batch_size, "global_workers": layout.global_workers, "steps": steps,
        "samples_read": int(delivered.sum()),
        "left_out": total - owned,
        "left_out_fraction": (total - owned) / total if total else 0.0,
        "padding": max(0, capacity - int(delivered.sum())) if schedule.policy != "even" else 0,
        "owned_per_worker": {"min": int(sizes.min()), "max": int(sizes.max())},
        "shards_cut": int((parts > 1).sum()),
        "parts_per_shard": {"max": int(parts.max()) if len(parts) else 0,
                            "mean": float(parts[owned_shard].mean()) if owned_shard.any() else 0.0},
    }


def mix_summary(counts: Sequence[Sequence[int]], weights: Sequence[float], layout: Layout, schedule: Schedule,
                epoch: int, names: Optional[Sequence[str]] = None, per_batch: str = "sample",
                samples_per_epoch: Optional[int] = None) -> Dict[str, Any]:
    """Numbers of one epoch of a mix, for the CLI's ``plan``: steps, and per source its weight,
    samples, samples used this epoch (all ranks), per batch (min/max), repeats (samples read
    again after a whole pass), left out (default epochs: what no one reads), passes read."""
    plan = MixEpoch(counts, weights, layout, schedule, epoch, names, per_batch, samples_per_epoch)
    w = integer_weights(weights)
    out = []
    for s, name in enumerate(plan.names):
        total, lo, hi = plan.totals[s], int(plan.bounds[s, 0]), int(plan.bounds[s, -1])
        column = plan.batch_counts[:, s]
        out.append({
            "name": name, "weight": w[s] / sum(w), "samples": total, "used": hi - lo,
            "per_batch": {"min": int(column.min(initial=layout.batch_size)) if len(column) else 0,
                          "max": int(column.max(initial=0))},
            "repeats": max(0, hi - max(lo, total)) if plan.endless else 0,
            "left_out": 0 if plan.endless else total - hi,
            "passes": [plan.first_pass(s) + lo // total, plan.first_pass(s) + max(lo, hi - 1) // total],
        })
    return {"epoch": epoch, "steps": plan.steps, "world_size": layout.world_size, "workers": layout.workers,
            "batch_size": layout.batch_size, "per_batch": per_batch, "samples_per_epoch": samples_per_epoch,
            "sources": out}


def remaining_summary(counts: Sequence[int], layout: Layout, schedule: Schedule, epoch: int,
                      segments: Sequence[Segment], shuffle: int) -> dict:
    """What a resume leaves for ``layout``: samples delivered and left, steps per rank."""
    total = int(np.sum(np.asarray(counts, dtype=np.int64)))
    plan = AffinePlan(counts, layout, None, schedule, epoch, columns=False, shuffle=shuffle, segments=segments)
    steps = plan.steps
    if schedule.policy == "fixed":
        return {"epoch": epoch, "samples": total, "delivered": None, "remaining": None, "steps": steps,
                "segments": [list(s) for s in segments]}
    rest = plan.sequence
    return {"epoch": epoch, "samples": total, "delivered": total - rest.total, "remaining": rest.total,
            "steps": steps, "left_out": rest.total - min(rest.total, steps * layout.world_size * layout.batch_size)
            if schedule.policy == "even" else 0, "segments": [list(s) for s in segments]}


# -- the command ------------------------------------------------------------------------------

def synthetic_counts(spec: str, seed: int) -> np.ndarray:
    """``N:LO-HI`` (or ``N:K``): N shards of LO to HI samples (or K each)."""
    try:
        n, _, sizes = spec.partition(":")
        lo, _, hi = sizes.partition("-")
        shards, low, high = int(n), int(lo), int(hi or lo)
    except ValueError:
        raise ConfigError(f"--counts must look like N:LO-HI or N:K, got {spec!r}") from None
    if shards < 1 or low < 0 or high < low:
        raise ConfigError(f"--counts {spec!r}: need N >= 1 and 0 <= LO <= HI")
    return np.random.default_rng(seed).integers(low, high + 1, shards)


class SyntheticNames(collections.abc.Sequence):
    """The names of ``--counts``' shards, ``shard-000000``, …, made when read (a million shards'
    plan reads a few of them)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return f"shard-{i % self.n:06d}"


def _counts(args: argparse.Namespace, cache_dir: str):
    from ..manifest import count_samples
    from ..sources import expand_sources

    if args.counts:
        counts = synthetic_counts(args.counts, args.seed)
        return SyntheticNames(len(counts)), counts, []
    if not args.sources:
        raise ConfigError("give shard SOURCEs, or --counts N:LO-HI to plan without data")
    urls = expand_sources(args.sources, storage_options(args))
    if args.no_counts:
        return urls, None, []
    counted = count_samples(urls, manifest=args.manifest, options=storage_options(args), cache_dir=cache_dir,
                            tolerant=args.on_error == "skip", scan_limit_bytes=None)  # columns, no object per row
    return urls, counted.rows.samples.copy(), counted.problems


def _rows(urls: Sequence[str], counts, layout: Layout, schedule: Schedule, epoch: int,
          rank: Optional[int] = None, interleave: bool = False) -> List[Dict[str, Any]]:
    rows = []
    planned = layout.planned(interleave)
    plan = epoch_layout(counts, planned, schedule, epoch) if counts is not None else None  # once, not per worker
    steps = steps_per_epoch(counts, planned, schedule, epoch, 0)  # the same on every rank
    for r in range(layout.world_size) if rank is None else [rank]:
        for w in range(layout.workers):
            owners = layout.columns(r, w) if interleave else (layout.global_worker(r, w),)
            parts = ([p for cut in plan.parts_of(owners) for p in cut] if plan is not None
                     else owned_parts(None, len(urls), layout, schedule, epoch, r, w))
            left = sum(len(d) for d in plan.drops_of(owners)) if plan is not None else 0  # even's, passed over
            rows.append({
                "rank": r, "worker": w, "global_worker": layout.global_worker(r, w), "slot": layout.slots[w],
                "parts": [{"url": redact(urls[s]), "first": a, "stop": b} for s, a, b in parts],  # pipe: secrets
                "samples": sum(b - a for _, a, b in parts) - left if counts is not None else None, "steps": steps,
            })
    return rows


def resume_view(args: argparse.Namespace, urls: Sequence[str], counts) -> Dict[str, Any]:
    """``--resume-from STATE.json``: what the saved epoch leaves for this layout (seed, policy and
    shuffle come from the state): samples delivered and left, steps and samples per rank."""
    from ..loader.state import differences, naming, read_state, read_state_file
    from ..plan import continued
    from ..stream import sources_identity

    with naming(args.resume_from):
        epoch, step, saved, segments, _ = read_state(read_state_file(args.resume_from), {})
    schedule = Schedule(saved["seed"], saved["policy"], saved["batches_per_epoch"], saved.get("shuffle_shards", True))
    layout = Layout(args.world_size, args.workers, args.batch_size)
    if counts is None:
        raise ConfigError("--resume-from needs sample counts (sources with a manifest or a scan, or --counts)")
    if not args.counts:
        current = {**saved, "sources": sources_identity(urls, [int(c) for c in counts], None)}
        problems = [p for p in differences(saved, current, "")[0] if p.startswith("sources")]
        if problems:
            raise StateError("the state is not of these shards: " + "; ".join(problems))
    interleave, counts = bool(saved.get("interleave", False)), [int(c) for c in counts]
    nodes = _nodes(args, layout) if args.affinity == "node" else None

    def head(of: Layout, count: Optional[int]) -> tuple:  # a segment of this layout, without its steps
        return segment_head(of, of.planned(interleave), count, interleave)

    was = Layout(saved["world_size"], saved["workers"], saved["batch_size"])
    segments, step = continued(segments, head(was, saved.get("nodes")), step, head(layout, nodes and nodes.count))
    if schedule.policy == "fixed":
        summary = remaining_summary(counts, layout.planned(interleave), schedule, epoch, segments,
                                    int(saved["shuffle"]))
    plan = AffinePlan(counts, layout, nodes, schedule, epoch, columns=interleave,
                      shuffle=0 if interleave else int(saved["shuffle"]), segments=segments)
    if schedule.policy != "fixed":
        left = plan.sequence.total
        summary = {"epoch": epoch, "samples": sum(counts), "delivered": sum(counts) - left, "remaining": left,
                   "steps": plan.steps, "left_out": plan.left_out, "segments": [list(s) for s in segments]}
    ranks = []
    for r in range(layout.world_size) if args.rank is None else [args.rank]:
        plans = [wp for w in range(layout.workers) for wp in plan.plans(r, w)]
        samples = [wp.samples for wp in plans]
        ranks.append({"rank": r, "steps": plan.steps - step, "samples": None if None in samples else sum(samples)})
    return {**summary, "step": step, "steps_left": plan.steps - step, "world_size": layout.world_size,
            "workers": layout.workers, "batch_size": layout.batch_size, "nodes": nodes and nodes.count, "ranks": ranks}


def _nodes(args: argparse.Namespace, layout: Layout) -> Nodes:
    """The nodes of ``--nodes`` or ``--ranks-per-node`` (one node when neither is given)."""
    per = getattr(args, "ranks_per_node", None)
    if per is not None and (per < 1 or layout.world_size % per):
        raise ConfigError(f"{layout.world_size} ranks are not whole nodes of --ranks-per-node {per}")
    return resolve_nodes(0, layout.world_size, {}, args.nodes or (layout.world_size // per if per else 1))


def _summary(counts, layout: Layout, schedule: Schedule, epoch: int, interleave: bool) -> Dict[str, Any]:
    """:func:`epoch_summary` of the plan's layout (its columns when interleaved), named by ``layout``."""
    summary = epoch_summary(counts, layout.planned(interleave), schedule, epoch)
    return {**summary, "world_size": layout.world_size, "workers": layout.workers, "batch_size": layout.batch_size,
            "interleave": interleave}


def mix_view(args: argparse.Namespace, cache_dir: str) -> int:
    """``plan --mix …``: per source its weight, samples, samples used this epoch, per batch,
    repeats, left out and passes (:func:`mix_summary`)."""
    from ..stream import Stream
    from .args import mix_options, stream_sources

    from .quality import mix_shuffle_quality

    order = {"interleave": args.interleave, "shuffle": args.shuffle} if args.interleave is False else \
        {"shuffle": args.shuffle}
    stream = Stream.open(stream_sources(args), fields={"key": "__key__"}, batch_size=args.batch_size,
                         workers=args.workers, rank=0, world_size=args.world_size or 1, device="cpu", seed=args.seed,
                         on_error=args.on_error, storage_options=storage_options(args), cache_dir=cache_dir,
                         **mix_options(args), **order)
    c, mix = stream.config, stream.mix
    counts, weights = [s.data.counts for s in mix.sources], [s.weight for s in mix.sources]
    epochs = range(args.epoch, args.epoch + args.epochs)
    views = [mix_summary(counts, weights, c.layout, c.schedule, e, mix.names, mix.per_batch, mix.samples_per_epoch)
             for e in epochs]
    payload: Dict[str, Any] = {"mix": views}
    if args.shuffle_quality:
        payload["shuffle_quality"] = [mix_shuffle_quality(mix.epoch(c.layout, c.schedule, e, c.interleave), c.shuffle,
                                                          args.classes) for e in epochs]
    lines = []
    for v in views:
        lines.append(f"epoch {v.get('epoch', '')}: {v['steps']} steps of {c.world_size} ranks x batch {c.batch_size} "
                     f"({mix.per_batch} per batch)")
        for s in v["sources"]:
            lines.append(f"    {s['name']}: weight {s['weight']:.4g}, {s['samples']} samples, {s['used']} used, "
                         f"{s['per_batch']['min']}-{s['per_batch']['max']} per batch, {s['repeats']} repeats, "
                         f"{s['left_out']} left out, passes {s['passes'][0]}-{s['passes'][1]}")
    lines += _quality_lines(payload.get("shuffle_quality", []))
    emit(args, payload, "\n".join(lines))
    return 0


def _quality_lines(qualities) -> list:
    lines = []
    for q in qualities:
        lines.append(f"shuffle quality, epoch {q['epoch']} ("
                     + ("interleaved" if q["columns"] else f"shuffle buffer {q['shuffle']}") + f", {q['classes']} classes written "
                     "in order): distinct labels (entropy, bits) this order / a random order")
        for scope, n in (("rank_batch", q["batch_size"]), ("global_batch", q["batch_size"] * q["world_size"])):
            o, r = q["order"][scope], q["random"][scope]
            lines.append(f"    per {scope.replace('_', ' ')} of {n}: {o['distinct']:.1f} ({o['entropy']:.2f}) / "
                         f"{r['distinct']:.1f} ({r['entropy']:.2f}) = {100 * q[scope + '_vs_random']:.1f}% of random")
    return lines


def run(args: argparse.Namespace, cache_dir: str) -> int:
    """The ``plan`` command."""
    if getattr(args, "mix", None):
        return mix_view(args, cache_dir)
    if args.buckets or args.bucket_cost:
        from . import bucketview

        return bucketview.run(args, cache_dir, synthetic_counts(args.counts, args.seed) if args.counts else None)
    urls, counts, problems = _counts(args, cache_dir)
    if args.resume_from:
        view = resume_view(args, urls, counts)
        lines = [f"epoch {view['epoch']} resumed on {view['world_size']} ranks x {view['workers']} workers x batch "
                 f"{view['batch_size']} after {len(view['segments'])} earlier layout(s) "
                 f"{' -> '.join('x'.join(map(str, s[:3])) + f' ({s[3]} steps)' for s in view['segments']) or ''}: "
                 f"{view['delivered']} of {view['samples']} samples delivered, {view['remaining']} left, "
                 f"{view['steps_left']} steps per rank"]
        lines += [f"rank {r['rank']}: {r['steps']} steps, {r['samples']} samples" for r in view["ranks"]]
        emit(args, {"resume": view}, "\n".join(lines))
        return 0
    layout = Layout(args.world_size, args.workers, args.batch_size)
    schedule = Schedule(args.seed, args.policy, args.batches_per_epoch)
    interleave, shuffle = reading_order(args.policy, args.interleave, args.shuffle, counts_known=counts is not None)
    epochs = range(args.epoch, args.epoch + args.epochs)
    if args.affinity == "node":
        return affinity_view(args, counts, layout, schedule, interleave, shuffle, epochs)
    summaries = [_summary(counts, layout, schedule, e, interleave) for e in epochs] if counts is not None else []
    detail = args.detail if args.detail is not None else (layout.global_workers <= 16 or args.rank is not None)
    payload: Dict[str, Any] = {"epochs": summaries}
    if args.shuffle_quality:
        if counts is None:
            raise ConfigError("--shuffle-quality needs sample counts", hint="drop --no-counts, or use --counts N:LO-HI")
        payload["shuffle_quality"] = [shuffle_quality(counts, layout, schedule, e, shuffle, args.classes,
                                                      columns=interleave) for e in epochs]
    if detail:
        payload["plan"] = _rows(urls, counts, layout, schedule, args.epoch, args.rank, interleave)
    if args.on_error == "skip":  # shards counted only up to their damage
        payload.update(skipped_shards=len(problems), errors=[p.fields() for p in problems])
    if args.json:
        emit(args, payload)
        return 0
    lines = []
    for s in summaries:
        lines.append(
            f"epoch {s['epoch']}: {s['samples']} samples in {s['shards']} shards, {s['world_size']} ranks x "
            f"{s['workers']} workers x batch {s['batch_size']} ({s['policy']}): {s['steps']} steps, "
            f"{s['left_out']} samples left out ({100 * s['left_out_fraction']:.3f}%), {s['padding']} padding, "
            f"{s['shards_cut']} shards cut (at most {s['parts_per_shard']['max']} parts), "
            f"{s['owned_per_worker']['min']}-{s['owned_per_worker']['max']} samples per "
            + ("column (read interleaved)" if s["interleave"] else f"worker (shuffle buffer {shuffle})"))
    lines += _quality_lines(payload.get("shuffle_quality", []))
    for row in payload.get("plan", []):
        lines.append(f"rank {row['rank']} worker {row['worker']} (g={row['global_worker']}, slot {row['slot']}): "
                     f"{len(row['parts'])} parts, {row['samples']} samples, {row['steps']} steps")
        lines += [f"    {p['url']}" + ("" if p["stop"] is None else f" [{p['first']}:{p['stop']}]") for p in row["parts"]]
    emit(args, payload, "\n".join(lines))
    return 0


def affinity_view(args: argparse.Namespace, counts, layout: Layout, schedule: Schedule, interleave: bool, shuffle: int,
                  epochs: range) -> int:
    """``plan --affinity node --nodes N``: per epoch the node-affine plan's numbers (shards and
    samples per node, steps, left out, padding), with ``--shuffle-quality`` its batch mixing
    beside the plain order's, with ``--from-nodes M`` what each node's cache keeps after the
    job moves from M nodes to N."""
    from ..plan.affinity import cache_kept
    from .quality import affine_shuffle_quality, affine_summary

    if counts is None:
        raise ConfigError("--affinity node needs sample counts", hint="drop --no-counts, or use --counts N:LO-HI")
    if schedule.policy == "fixed":
        raise ConfigError("--affinity node is measured for policies 'even' and 'exact'")
    nodes = _nodes(args, layout)
    payload: Dict[str, Any] = {"affinity": [affine_summary(counts, layout, nodes, schedule, e, interleave) for e in epochs]}
    lines = [f"epoch {s['epoch']}: {s['samples']} samples in {s['shards']} shards on {s['nodes']} nodes x "
             f"{s['ranks_per_node']} ranks ({s['policy']}, node affinity): {s['steps']} steps; per node "
             f"{s['shards_per_node']['min']}-{s['shards_per_node']['max']} shards, {s['samples_per_node']['min']}-"
             f"{s['samples_per_node']['max']} samples (the largest holds {100 * s['largest_node_share']:.2f}% of the "
             f"data); {s['left_out']} left out, {s['padding']} padding" for s in payload["affinity"]]
    if args.shuffle_quality:
        payload["shuffle_quality"] = []
        for e in epochs:
            plain = shuffle_quality(counts, layout, schedule, e, shuffle, args.classes, columns=interleave)
            ours = affine_shuffle_quality(counts, layout, nodes, schedule, e, shuffle, args.classes, columns=interleave)
            payload["shuffle_quality"].append({"epoch": e, "affinity": ours, "plain": plain})
            lines.append(f"shuffle quality, epoch {e} ({'interleaved' if interleave else f'shuffle buffer {shuffle}'}, "
                         f"{ours['classes']} classes written in order): distinct labels, node affinity / without "
                         "/ a random order")
            for scope, n in (("rank_batch", layout.batch_size), ("global_batch", layout.batch_size * layout.world_size)):
                a, b, r = ours["order"][scope], plain["order"][scope], plain["random"][scope]
                lines.append(f"    per {scope.replace('_', ' ')} of {n}: {a['distinct']:.1f} / {b['distinct']:.1f} / "
                             f"{r['distinct']:.1f} ({100 * ours[scope + '_vs_random']:.1f}% of random with affinity, "
                             f"{100 * plain[scope + '_vs_random']:.1f}% without)")
    if args.from_nodes:
        kept = cache_kept(counts, args.from_nodes, nodes.count, schedule.seed)
        payload["cache_kept"] = {"from_nodes": args.from_nodes, "nodes": nodes.count, "per_node": kept}
        lines.append(f"from {args.from_nodes} to {nodes.count} nodes: each node's cache keeps {min(kept):.0%} to "
                     f"{max(kept):.0%} of what it now reads (mean {sum(kept) / len(kept):.0%})")
    emit(args, payload, "\n".join(lines))
    return 0


def add_arguments(p: argparse.ArgumentParser, groups: Dict[str, Any]) -> None:
    """The ``plan`` command's own options, beside the shared stream options of ``groups``
    (:func:`~dalistream.tools.args.add_stream_args`): counts in the data group, bucket options
    in the buckets group, and a group of what to show."""
    groups["data"].add_argument("--counts", default=None, metavar="N:LO-HI",
                                help="plan N synthetic shards of LO..HI samples instead of reading SOURCEs")
    show = p.add_argument_group("what to show")
    show.add_argument("--epochs", type=int, default=1, help="how many epochs to summarize, from --epoch on")
    show.add_argument("--resume-from", default=None, metavar="STATE.json",
                      help="a saved Loader.state_dict(): the steps per rank and samples its epoch leaves for this layout")
    show.add_argument("--shuffle-quality", action="store_true",
                      help="distinct labels and entropy per rank batch and per global batch, this order against a "
                           "random one, computed from the plan and --shuffle without reading data (class-sorted labels)")
    show.add_argument("--classes", type=int, default=100,
                      help="with --shuffle-quality: labels, written in order (label = position x classes / samples)")
    show.add_argument("--nodes", type=int, default=None,
                      help="with --affinity node: nodes the world size is split in (shows shards and samples per node, "
                           "and with --shuffle-quality what affinity costs in mixing)")
    show.add_argument("--from-nodes", type=int, default=None, metavar="M",
                      help="with --affinity node: how much of each node's cache stays useful after moving from M nodes")
    show.add_argument("--detail", action=argparse.BooleanOptionalAction, default=None,
                      help="list the samples of which shards every worker of every rank reads (default: for 16 "
                           "workers in all or fewer, or with --rank: that rank's workers)")
    show.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    from .bucketview import add_arguments as bucket_arguments

    bucket_arguments(groups["buckets"])


