"""``dalistream plan --buckets …``: the bucket plan's figures (steps, per bucket its batches,
padding and left out, the look-ahead used), ``--shuffle-quality`` per bucket, and
``--bucket-cost``: what bucketing saves against one shape for all, on stated distributions."""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..buckets import AspectBuckets, LengthBuckets
from ..errors import ConfigError
from ..plan import Layout, Schedule
from ..plan.bucketstats import (PHOTO_MIX, bucket_quality, bucket_summary, caption_tokens, photo_sizes, pixel_cost,
                                token_padding)
from ..plan.buckets import BucketEpoch
from .args import emit, storage_options, stream_buckets


def _name(buckets: Any, k: int) -> str:
    d = buckets.describe(k)
    if "width" in d:
        return f"{d['width']}x{d['height']}"
    return f"<= {d['length']}" if d["length"] >= 0 else f"> {buckets.edges[-1]}"


def _keys(args: argparse.Namespace, cache_dir: str, buckets: Any,
          counts: Optional[np.ndarray]) -> Tuple[np.ndarray, np.ndarray, Any]:
    """Counts, every sample's bucket and the resolved buckets: from the shards' manifest, or
    synthetic (``counts`` of ``--counts``, buckets drawn by ``--bucket-shares``)."""
    if counts is not None:
        if isinstance(buckets, AspectBuckets) and buckets.sizes is None:
            raise ConfigError("--buckets auto:N needs the data set's keys", hint="give SOURCEs, or sizes: aspect:WxH,…")
        shares = np.array([float(s) for s in args.bucket_shares.split(",")]) if args.bucket_shares else \
            np.ones(len(buckets))
        if len(shares) != len(buckets) or (shares < 0).any() or shares.sum() <= 0:
            raise ConfigError(f"--bucket-shares: give {len(buckets)} shares >= 0, one per bucket")
        ids = np.random.default_rng(args.seed).choice(len(buckets), int(counts.sum()), p=shares / shares.sum())
        return counts, ids.astype(np.int16), buckets
    from ..manifest import count_samples
    from ..sources import expand_sources

    if not args.sources:
        raise ConfigError("give shard SOURCEs (with a manifest of keys), or --counts N:LO-HI with --bucket-shares")
    urls = expand_sources(args.sources, storage_options(args))
    rows = count_samples(urls, manifest=args.manifest, options=storage_options(args), cache_dir=cache_dir,
                         scan_limit_bytes=None).rows
    buckets = buckets.resolve(rows.keys)
    return rows.samples.copy(), buckets.assign(rows.keys, rows.urls, rows.starts), buckets


def run(args: argparse.Namespace, cache_dir: str, synthetic: Optional[np.ndarray] = None) -> int:
    """``plan --buckets`` and ``plan --bucket-cost``; ``synthetic``: the counts of ``--counts``."""
    if args.bucket_cost:
        return cost_view(args)
    layout = Layout(args.world_size, args.workers, args.batch_size)
    schedule = Schedule(args.seed, args.policy, args.batches_per_epoch)
    buckets = stream_buckets(args)
    counts, ids, buckets = _keys(args, cache_dir, buckets, synthetic)
    views: List[Dict[str, Any]] = []
    lines = []
    for epoch in range(args.epoch, args.epoch + args.epochs):
        plan = BucketEpoch(counts, ids, len(buckets), layout, schedule, epoch, buckets.per, lookahead=args.lookahead)
        view = bucket_summary(plan)
        for b in view["buckets"]:
            b["size"] = _name(buckets, b["bucket"])
        if args.shuffle_quality:
            view["shuffle_quality"] = bucket_quality(plan, args.classes)
        views.append(view)
        look = view["lookahead"]
        lines.append(f"epoch {epoch}: {view['samples']} samples, {len(buckets)} buckets ({buckets.per}), "
                     f"{layout.world_size} ranks x {layout.workers} workers x batch {layout.batch_size} "
                     f"({schedule.policy}): {view['steps']} steps, {view['padding']} padding "
                     f"({view['padding_steps']} steps of padding only), {view['left_out']} left out; look-ahead: "
                     f"a worker holds at most {look['max']} samples (mean of the workers' most {look['mean']:.1f}"
                     + (f"; bound {look['rank_bound']} per rank)" if look["rank_bound"] is not None else ")")
                     + f"; a worker reads {view['reading']['readers']['mean']:.1f} stretches in "
                       f"{view['reading']['parts']['mean']:.1f} shard parts (at most {view['reading']['parts']['max']})")
        for b in view["buckets"]:
            lines.append(f"    bucket {b['bucket']} {b['size']}: {b['samples']} samples, {b['batches']} batches, "
                         f"{b['padding']} padding, {b['left_out']} left out")
        q = view.get("shuffle_quality")
        if q:
            lines.append(f"    shuffle quality ({q['classes']} classes written in order): distinct labels per batch, "
                         f"this order / a random order of the bucket's samples")
            lines += [f"        bucket {b['bucket']}: {b['distinct']:.1f} / {b['random']:.1f} = "
                      f"{100 * b['vs_random']:.1f}% of random ({b['batches']} batches)" for b in q["buckets"]]
            lines.append(f"        a step holds its previous step's bucket {100 * q['repeat_rate']:.1f}% of the time "
                         f"(a random order of these batches: {100 * q['repeat_rate_random']:.1f}%)")
    emit(args, {"buckets": views}, "\n".join(lines))
    return 0


ASPECT_SIZES = ((1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768), (768, 1344))
LENGTH_EDGES = (8, 12, 16, 24, 32, 48, 64, 128)


def cost_figures(samples: int, layout: Layout, seed: int) -> Dict[str, Any]:
    """The measurement: :func:`~dalistream.plan.bucketstats.photo_sizes` images fitted to one
    square, to :data:`ASPECT_SIZES` and to ``AspectBuckets.auto(8)``; and
    :func:`~dalistream.plan.bucketstats.caption_tokens` captions in batches of ``layout`` padded to
    their longest, unbucketed (the epoch's order) and with ``LengthBuckets`` of
    :data:`LENGTH_EDGES` (the bucket plan's batches), and padded to a fixed 77."""
    width, height = photo_sizes(samples, seed)
    keys = {"width": width, "height": height}
    images: Dict[str, Any] = {"mix": [{"ratio": f"{w}:{h}", "share": s} for (w, h), s in PHOTO_MIX]}
    one = np.array([1024]), np.array([1024])
    images["one square 1024x1024"] = pixel_cost(width, height, np.zeros(samples, dtype=np.int64), *one)
    for name, buckets in (("7 aspect buckets", AspectBuckets(ASPECT_SIZES)), ("AspectBuckets.auto(8)", AspectBuckets.auto(8))):
        resolved = buckets.resolve(keys)
        tw = np.array([w for w, _ in resolved.sizes])
        th = np.array([h for _, h in resolved.sizes])
        images[name] = {**pixel_cost(width, height, resolved.assign(keys).astype(np.int64), tw, th),
                        "sizes": [f"{w}x{h}" for w, h in resolved.sizes]}
    tokens = caption_tokens(samples, seed)
    counts = np.full(samples // 1000, 1000)
    tokens = tokens[:int(counts.sum())]
    schedule = Schedule(seed, "even")
    per = layout.world_size * layout.batch_size
    plain = np.arange((len(tokens) // per) * per).reshape(-1, layout.batch_size)
    lb = LengthBuckets("txt", LENGTH_EDGES)
    plan = BucketEpoch(counts, lb.assign({"length:txt": tokens}), len(lb), layout, schedule, 0)
    table = plan.rank_batches().reshape(-1, layout.batch_size)
    bucketed = plan.written(table)
    fixed = np.minimum(tokens, 77)
    captions = {"median": float(np.median(tokens)), "p90": float(np.percentile(tokens, 90)), "max": int(tokens.max()),
                "unbucketed": token_padding(tokens, plain), "length buckets": token_padding(tokens, bucketed),
                "edges": list(LENGTH_EDGES),
                "fixed 77": {"tokens": int(fixed.sum()), "padding": int((77 - fixed).sum()),
                             "padding_share": float((77 - fixed).sum() / (77 * len(fixed)))}}
    return {"samples": samples, "world_size": layout.world_size, "workers": layout.workers,
            "batch_size": layout.batch_size, "images": images, "captions": captions}


def cost_view(args: argparse.Namespace) -> int:
    """``plan --bucket-cost``: :func:`cost_figures` for the layout given."""
    figures = cost_figures(args.bucket_cost, Layout(args.world_size, args.workers, args.batch_size), args.seed)
    lines = [f"{figures['samples']} images of an assumed photo mix ("
             + ", ".join(f"{m['ratio']} {100 * m['share']:.0f}%" for m in figures["images"]["mix"])
             + "): pixels cropped away (or padding) when each image is fitted to its target, and stretch if squashed"]
    for name, c in figures["images"].items():
        if name != "mix":
            lines.append(f"    {name}: {100 * c['lost']:.1f}% cropped or padded; squashed: x{c['stretch']:.3f} mean "
                         f"stretch, {100 * c['stretched_10']:.1f}% of images stretched > 10%")
    c = figures["captions"]
    lines.append(f"{figures['samples']} captions (median {c['median']:.0f} tokens, 90th percentile {c['p90']:.0f}, "
                 f"max {c['max']}), batches of {figures['batch_size']} padded to their longest:")
    for name in ("unbucketed", "length buckets", "fixed 77"):
        lines.append(f"    {name}: {c[name]['padding']} padding tokens for {c[name]['tokens']} tokens "
                     f"({100 * c[name]['padding_share']:.1f}% of the batch)")
    emit(args, {"bucket_cost": figures}, "\n".join(lines))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``plan`` command's own bucket options (``--buckets``, ``--bucket-per`` and
    ``--lookahead`` are every batching command's: :func:`~dalistream.tools.args.add_stream_args`)."""
    p.add_argument("--bucket-shares", default=None, metavar="S,S,…",
                   help="with --counts and --buckets: each bucket's share of the synthetic samples (default equal)")
    p.add_argument("--bucket-cost", type=int, default=None, metavar="N",
                   help="measure what bucketing saves on N images and N captions of stated distributions")
