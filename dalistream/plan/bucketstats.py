"""Figures of bucketing, from pure functions: how well a bucket plan mixes each bucket's batches
(:func:`bucket_quality`), and what bucketing saves against one shape for all — pixels lost to
cropping, padding or squashing images to one size (:func:`pixel_cost`), and padding tokens of
captions padded to their batch's longest (:func:`token_padding`)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from . import seeds
from .buckets import BucketEpoch
from .quality import batch_label_stats, sorted_labels


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
                          "rank_bound": plan.bound() if plan.per == "rank" else None},
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
    ids = plan.written(table)
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
