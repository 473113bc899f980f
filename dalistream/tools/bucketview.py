"""``dalistream plan --buckets …``: the bucket plan's figures (steps, per bucket its batches,
padding and left out, the look-ahead used), ``--shuffle-quality`` per bucket, and
``--bucket-cost``: what bucketing saves against one shape for all, on stated distributions:
pixels lost to cropping, padding or squashing images to one size (:func:`pixel_cost`), padding
tokens of captions padded to their batch's longest (:func:`token_padding`)."""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..buckets import AspectBuckets, LengthBuckets
from ..errors import ConfigError
from ..plan import Layout, Schedule, seeds
from ..plan.buckets import BucketEpoch
from .args import emit, storage_options, stream_buckets
from .quality import batch_label_stats, sorted_labels


# -- figures of a bucket plan, from pure functions ----------------------------------------------

def written(plan: BucketEpoch, positions: np.ndarray) -> np.ndarray:
    """Written-order sample ids of ``plan``'s planned epoch ``positions`` (``-1`` stays ``-1``)."""
    ids = np.full(int(plan.counts.sum()) + 1, -1, dtype=np.int64)  # the last: for -1
    ids[plan.positions] = plan.sample_ids
    return ids[np.asarray(positions, dtype=np.int64)]


def rank_bound(plan: BucketEpoch) -> int:
    """The look-ahead bound of ``per="rank"``: ``B + (k − 1)(B − 1)``, ``k`` the buckets with samples."""
    b, k = plan.layout.batch_size, int((plan.totals > 0).sum())
    return b + max(k - 1, 0) * (b - 1)


def bucket_summary(plan: BucketEpoch) -> Dict[str, Any]:
    """Figures of the plan: steps, per bucket its samples, batches per rank, padding and left
    out, and the look-ahead used (most held by one worker) against the bound."""
    batches = plan.rank_batches()
    bucket = plan.step_bucket
    padding = np.zeros(plan.buckets, dtype=np.int64)
    steps_of = np.zeros(plan.buckets, dtype=np.int64)
    real = batches >= 0
    for k in range(plan.buckets):
        at = bucket == k
        steps_of[k] = int(at.sum())
        padding[k] = int((~real[at]).sum())
    left = np.bincount(plan.seq[plan.left_out], minlength=plan.buckets)[:plan.buckets]
    empty = int((bucket < 0).sum())
    return {"per": plan.per, "policy": plan.schedule.policy, "epoch": plan.epoch, "steps": plan.steps,
            "world_size": plan.layout.world_size, "workers": plan.layout.workers,
            "batch_size": plan.layout.batch_size, "samples": int(len(plan.seq)),
            "buckets": [{"bucket": k, "samples": int(plan.totals[k]), "batches": int(steps_of[k]),
                         "padding": int(padding[k]), "left_out": int(left[k])} for k in range(plan.buckets)],
            "padding_steps": empty, "padding": int(padding.sum()) + empty * plan.layout.batch_size,
            "left_out": int(len(plan.left_out)),
            "lookahead": {"max": int(plan.lookahead.max(initial=0)),
                          "mean": float(plan.lookahead.mean()) if plan.lookahead.size else 0.0,
                          "rank_bound": rank_bound(plan) if plan.per == "rank" else None},
            "reading": bucket_reading(plan)}


def bucket_reading(plan: BucketEpoch) -> Dict[str, Any]:
    """What the workers read in the epoch (the ranks laid out): ``readers`` (stretches of the
    epoch, each read front to back) and ``parts`` (shard parts: a stretch over several shards
    is a part of each), per worker, mean and most; ``samples``: samples a part holds, mean. More
    columns per rank mix a bucket's batches better and cut more, shorter parts."""
    layout = plan.layout
    held = np.flatnonzero((plan.owner >= 0) & (plan.reader_of >= 0))
    worker = plan.owner[held] * layout.workers + plan.worker_of[held]
    key = worker * (int(plan.reader_of.max(initial=0)) + 1) + plan.reader_of[held]
    by = np.argsort(key, kind="stable")  # (a reader's positions increase in reading order)
    first = np.flatnonzero(np.r_[True, key[by][1:] != key[by][:-1]]) if len(by) else np.zeros(0, dtype=np.int64)
    at = plan.positions[held][by]
    lo, hi = at[first], np.r_[at[first[1:] - 1], at[-1:]] + 1 if len(by) else at[:0]
    starts = plan.shards.starts
    parts = np.searchsorted(starts, hi - 1, side="right") - np.searchsorted(starts, lo, side="right") + 1
    owners = worker[by][first]
    workers = len(plan.ranks) * layout.workers
    readers_of = np.bincount(owners, minlength=layout.global_workers)
    parts_of = np.bincount(owners, weights=parts, minlength=layout.global_workers).astype(np.int64)
    return {"readers": {"mean": float(readers_of.sum() / max(workers, 1)), "max": int(readers_of.max(initial=0))},
            "parts": {"mean": float(parts_of.sum() / max(workers, 1)), "max": int(parts_of.max(initial=0))},
            "samples_per_part": float(int((hi - lo).sum()) / max(int(parts.sum()), 1))}


def bucket_quality(plan: BucketEpoch, classes: int = 100, labels: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """Per bucket: mean distinct labels per rank batch of that bucket, for the plan and for a
    random order of the same bucket's samples in batches of the same shapes (labels class-sorted
    by default: ``label = id × classes / samples``, ids in written order), and how often a rank's
    step holds the bucket of its previous step against a random order of the same batches."""
    total = int(plan.counts.sum())
    labels = sorted_labels(total, classes) if labels is None else np.asarray(labels, dtype=np.int64)
    table = plan.rank_batches()
    ids = written(plan, table)
    rng = np.random.default_rng(seeds.random_reference(plan.schedule.seed, plan.epoch, 0xB0C4E7))
    out = []
    for k in range(plan.buckets):
        at = plan.step_bucket == k
        rows = ids[at]
        if not len(rows):
            continue
        shuffled_rows = rows.copy()
        real = shuffled_rows >= 0
        shuffled_rows[real] = rng.permutation(shuffled_rows[real])
        got = {}
        for name, r in (("order", rows), ("random", shuffled_rows)):
            lab = np.where(r >= 0, labels[np.maximum(r, 0)], -1)
            got[name] = float(batch_label_stats(lab)["distinct"].mean())
        out.append({"bucket": k, "batches": int(at.sum()), "distinct": got["order"], "random": got["random"],
                    "vs_random": got["order"] / got["random"] if got["random"] else 1.0})
    steps = plan.step_bucket
    same = float((steps[:, 1:] == steps[:, :-1])[steps[:, 1:] >= 0].mean()) if steps.shape[1] > 1 else 0.0
    share = np.bincount(steps[steps >= 0], minlength=plan.buckets) / max(int((steps >= 0).sum()), 1)
    return {"epoch": plan.epoch, "classes": classes, "buckets": out, "repeat_rate": same,
            "repeat_rate_random": float((share ** 2).sum())}


# -- what bucketing saves (the measurement of docs/guide/buckets.md) -------------------------------

#: An assumed aspect-ratio mix of a photo collection: (width : height, share). Landscape camera
#: formats dominate (4:3, 3:2), then 16:9 frames, squares, and portrait 2:3 and 3:4.
PHOTO_MIX: Tuple[Tuple[Tuple[int, int], float], ...] = (((4, 3), 0.40), ((3, 2), 0.20), ((16, 9), 0.10),
                                                        ((1, 1), 0.10), ((2, 3), 0.10), ((3, 4), 0.10))


def photo_sizes(n: int, seed: int = 0, mix: Sequence = PHOTO_MIX, jitter: float = 0.03) -> Tuple[np.ndarray, np.ndarray]:
    """``n`` image sizes drawn from ``mix``: each ratio with a log-normal jitter of ``jitter`` (crops
    and odd formats), an area of 0.3 to 3 megapixels (log-uniform)."""
    rng = np.random.default_rng(seed)
    ratios = np.array([w / h for (w, h), _ in mix])
    shares = np.array([s for _, s in mix])
    r = ratios[rng.choice(len(mix), n, p=shares / shares.sum())] * np.exp(rng.normal(0, jitter, n))
    area = np.exp(rng.uniform(np.log(0.3e6), np.log(3e6), n))
    return np.round(np.sqrt(area * r)).astype(np.int64), np.round(np.sqrt(area / r)).astype(np.int64)


def pixel_cost(width: np.ndarray, height: np.ndarray, targets: np.ndarray, tw: np.ndarray, th: np.ndarray) -> Dict[str, float]:
    """What fitting each image ``(width, height)`` to its target size ``(tw, th)`` costs, three
    ways (``targets`` indexes ``tw``/``th`` per image): resized to cover and centre-cropped, the
    share of the image's pixels cut away — resized to fit and padded, the same share of the
    target's pixels is padding (``lost``, the mean over images); resized to the target ignoring
    the ratio, how far each is stretched (``stretch``: the mean factor, and ``stretched_10``: the
    share of images stretched by more than 10%)."""
    gap = np.abs(np.log(width / height) - np.log(tw[targets] / th[targets]))
    return {"lost": float(1 - np.exp(-gap).mean()), "stretch": float(np.exp(gap).mean()),
            "stretched_10": float((gap > np.log(1.1)).mean())}


def caption_tokens(n: int, seed: int = 0) -> np.ndarray:
    """``n`` caption lengths in tokens: 70% short descriptive captions (log-normal, median 11,
    σ 0.3: COCO-like), 30% web alt-texts (median 18, σ 0.8: a long tail), clipped to 1 … 256."""
    rng = np.random.default_rng(seed)
    short = rng.random(n) < 0.7
    length = np.where(short, rng.lognormal(np.log(11), 0.3, n), rng.lognormal(np.log(18), 0.8, n))
    return np.clip(np.round(length), 1, 256).astype(np.int64)


def token_padding(lengths: np.ndarray, batches: np.ndarray) -> Dict[str, float]:
    """Tokens of ``lengths`` in ``batches`` (rows of sample indices, ``-1`` padding positions,
    left out) and the padding each batch needs when padded to its longest sample."""
    real = batches >= 0
    lens = np.where(real, lengths[np.maximum(batches, 0)], 0)
    longest = lens.max(axis=1, keepdims=True)
    tokens = int(lens.sum())
    pad = int((np.where(real, longest - lens, 0)).sum())
    return {"tokens": tokens, "padding": pad, "padding_share": pad / max(tokens + pad, 1)}


# -- the command ------------------------------------------------------------------------------


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
    """The measurement: :func:`~dalistream.tools.bucketview.photo_sizes` images fitted to one
    square, to :data:`ASPECT_SIZES` and to ``AspectBuckets.auto(8)``; and
    :func:`~dalistream.tools.bucketview.caption_tokens` captions in batches of ``layout`` padded to
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
    bucketed = written(plan, table)
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
