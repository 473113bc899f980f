"""``dalistream demo``: train a tiny CNN through the ``classification_train`` pipeline.

With no ``--data`` it first writes a small synthetic WebDataset (:mod:`dalistream.tools.synth`), so it
runs anywhere: no GPU, no cloud account, no download. It shows a progress bar on a terminal
(stderr), prints the loss every ``--log-every`` steps, and ends with a summary: samples/s, time
waiting on data against time computing, the loss, the accuracy. ``--json`` prints only a JSON
summary (the last stdout line).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections import deque
from typing import Any, Dict, List, Mapping, Optional

from ..config import WORKERS
from ..dali.device import torch_device
from ..errors import ConfigError
from .args import show_progress, storage_options

log = logging.getLogger(__name__)

HELP = "train a tiny CNN for a few hundred steps on synthetic (or your) shards; no GPU or download needed"
DESCRIPTION = (
    "Train a tiny CNN through the classification_train pipeline. With no --data it first writes a small "
    "synthetic WebDataset, so it runs anywhere: no GPU, no cloud account, no download. Shows a progress bar "
    "on a terminal, prints the loss every --log-every steps and ends with a summary (samples/s, time waiting "
    "on data against computing, loss, accuracy); --json prints only a JSON summary."
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``dalistream demo`` on the CLI's subparsers."""
    p = subparsers.add_parser("demo", help=HELP, description=DESCRIPTION)
    p.add_argument("--data", nargs="+", metavar="SOURCE", default=None,
                   help="train on these shards (paths, dirs, globs, {a..b}, any store's URLs) with jpg/png + cls "
                        "members; default: a synthetic data set")
    p.add_argument("--data-dir", default=None, metavar="PATH",
                   help="where to write (or find) the synthetic data set (default: a temporary directory, "
                        "removed after)")
    p.add_argument("--steps", type=int, default=300, help="training steps (epochs follow each other until done)")
    p.add_argument("--batch-size", "-B", type=int, default=32, help="samples per batch")
    p.add_argument("--size", type=int, default=64, help="image side in pixels after the random-resized crop")
    p.add_argument("--workers", "-W", type=int, default=WORKERS, help="DALI worker processes (each reads its own share of the shards)")
    p.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto",
                   help="where images are decoded and the model trains (auto: the GPU when DALI sees one)")
    p.add_argument("--classes", type=int, default=10, help="number of classes (labels must be below it)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--shuffle", type=int, default=None,
                   help="per-worker sample shuffle buffer (default: none, the stream reads interleaved)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data order, the shuffle and the model")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: OMP_NUM_THREADS, else the cores left after the DALI workers)")
    p.add_argument("--eval", action="store_true",
                   help="then measure accuracy with the classification_eval pipeline (on a held-out synthetic split, "
                        "or on --eval-data / the training data)")
    p.add_argument("--eval-data", nargs="+", metavar="SOURCE", default=None, help="shards for --eval")
    p.add_argument("--on-error", choices=["raise", "skip"], default="raise",
                   help="bad samples/shards in --data: stop, or count and skip")
    p.add_argument("--log-every", type=int, default=50, metavar="N", help="print the loss every N steps (0: never)")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--json", action="store_true", help="print only a JSON summary on stdout")
    p.add_argument("--endpoint-url", default=None, help="the store's endpoint for --data (an S3-compatible server, a GCS emulator, an Azure blob endpoint, a Hub mirror)")
    p.add_argument("--profile", default=None, help="AWS profile for s3:// sources")
    p.set_defaults(func=run)
    return p


def tiny_cnn(classes: int):
    """Three strided conv blocks, global average pooling, a linear head (~25k parameters)."""
    from torch import nn

    def block(cin: int, cout: int) -> List[Any]:
        return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, classes))


def check_labels(labels: Any, classes: int) -> None:
    """Raise :class:`ConfigError` unless every label is in ``0..classes-1``, with one wait for the
    device (on a GPU an out-of-range label would stop CUDA with a device-side assert in the loss)."""
    import torch

    low, high = torch.stack(torch.aminmax(labels)).tolist()
    if high >= classes or low < 0:
        raise ConfigError(f"label {high if high >= classes else low} is outside 0..{classes - 1}",
                          hint="set --classes")


def torch_threads(threads: Optional[int], workers: int, env: Mapping[str, str]) -> int:
    """Threads for torch on the CPU. DALI's workers decode on their own cores; a torch thread pool
    spanning all cores fights them and runs several times slower than one that leaves them room."""
    if threads is not None:
        return max(1, threads)
    if env.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(env["OMP_NUM_THREADS"]))
    return max(1, (os.cpu_count() or 1) - workers)


def _synthetic(data_dir: Optional[str], seed: int, chatty: bool = False) -> tuple:
    """(train shards, held-out shards, directory to remove afterwards or None)."""
    from .synth import SynthSpec, write_dataset

    cleanup = None
    if data_dir is None:
        from ..lifetime import temp_folder

        data_dir = cleanup = temp_folder("demo")  # named by its owner: the next run removes it if this one is killed
    splits = {"train": SynthSpec(shards=8, samples_per_shard=128, seed=seed, prefix="train"),
              "val": SynthSpec(shards=2, samples_per_shard=64, seed=seed + 1, prefix="val")}
    for name, spec in splits.items():
        path = os.path.join(data_dir, name)
        if os.path.isdir(path) and any(n.endswith(".tar") for n in os.listdir(path)):
            log.info("using the synthetic %s shards in %s", name, path)
            continue
        log.info("writing synthetic %s shards to %s", name, path)
        if chatty:
            print(f"writing synthetic {name} shards to {path} …", file=sys.stderr, flush=True)
        write_dataset(path, spec)
    return [os.path.join(data_dir, "train")], [os.path.join(data_dir, "val")], cleanup


def run(args: argparse.Namespace) -> int:
    """The ``demo`` command; returns the exit code."""
    for name in ("steps", "batch_size", "size", "workers", "classes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    show_bar = show_progress(args)
    args.threads = torch_threads(args.threads, args.workers, os.environ)
    storage = storage_options(args)
    cleanup = None
    try:
        if args.data:
            sources, eval_sources = list(args.data), list(args.eval_data or args.data)
        else:
            sources, eval_sources, cleanup = _synthetic(args.data_dir, args.seed, show_bar)
            eval_sources = list(args.eval_data or eval_sources)
        summary = train(args, sources, storage, show_bar)
        if args.eval:
            summary["eval_accuracy"] = evaluate(args, eval_sources, storage, summary.pop("_model"))
        summary.pop("_model", None)
    finally:
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
    summary["data"] = "synthetic" if not args.data else list(args.data)
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(_report(summary), flush=True)
    return 0


def _say(text: str, bar: Any) -> None:
    if bar is not None and not bar.disable:
        bar.write(text, file=sys.stdout)
    else:
        print(text, flush=True)


def train(args: argparse.Namespace, sources: List[str], storage: Dict[str, Any], show_bar: bool) -> Dict[str, Any]:
    """Run ``args.steps`` training steps; return the summary (with the model under ``_model``)."""
    import torch
    from tqdm import tqdm

    from dalistream.pipelines import classification_train

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    loader = classification_train.loader(
        sources, batch_size=args.batch_size, size=args.size, workers=args.workers, device=args.device,
        shuffle=args.shuffle, seed=args.seed, random_area=(0.25, 1.0), storage_options=storage,
        on_error=getattr(args, "on_error", "raise"))
    with loader:
        device = torch_device(loader.stream)  # the batches' GPU (this rank's), made torch's current device
        model = tiny_cnn(args.classes).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        if not args.json:
            c = loader.stream.config
            print(f"demo: {len(loader.stream.data.urls)} shards, {sum(loader.stream.data.counts or ())} samples, "
                  f"device {loader.stream.device}, {c.workers} workers, batch {c.batch_size}, {args.size} px, "
                  f"{args.steps} steps", flush=True)
        bar = tqdm(total=args.steps, unit="step", file=sys.stderr, disable=not show_bar, dynamic_ncols=True,
                   desc="start-up (building the pipeline, filling buffers)")
        recent_loss: deque = deque(maxlen=20)
        recent_hits: deque = deque(maxlen=50)
        losses: List[float] = []
        wait_s = compute_s = 0.0
        samples = samples_after_first = 0
        first_batch_at = None
        step = epoch = 0
        try:
            while step < args.steps:
                loader.set_epoch(epoch)
                if len(loader) == 0:
                    raise ConfigError(f"epoch {epoch} has no full batch: too few samples for batch size "
                                      f"{args.batch_size} and {args.workers} workers", hint="lower --batch-size")
                batches = iter(loader)
                while step < args.steps:
                    t0 = time.perf_counter()
                    batch = next(batches, None)
                    if batch is None:
                        break
                    images, labels = batch["image"], batch["label"]
                    # waits for the batch's GPU work (decode, augment): counted as data wait, not compute
                    check_labels(labels, args.classes)
                    t1 = time.perf_counter()
                    model.train()
                    logits = model(images.float())
                    loss = loss_fn(logits, labels)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    hits = (logits.argmax(1) == labels).float().mean()
                    value, hits = torch.stack([loss.detach(), hits]).tolist()  # one wait: compute time is real
                    t2 = time.perf_counter()
                    n = int(labels.shape[0])
                    if first_batch_at is None:
                        first_batch_at = t1
                        bar.set_description("train", refresh=False)
                    else:
                        wait_s += t1 - t0
                        samples_after_first += n
                    compute_s += t2 - t1
                    samples += n
                    step += 1
                    losses.append(value)
                    recent_loss.append(value)
                    recent_hits.append(hits)
                    rate = samples_after_first / max(1e-9, t2 - first_batch_at) if samples_after_first else 0.0
                    bar.set_postfix({"samples/s": f"{rate:.0f}", "loss": f"{value:.3f}"}, refresh=False)
                    bar.update(1)
                    if args.log_every and not args.json and (step % args.log_every == 0 or step == args.steps):
                        _say(f"step {step:5d}  epoch {epoch}  loss {sum(recent_loss) / len(recent_loss):.4f}  "
                             f"acc {sum(recent_hits) / len(recent_hits):.3f}  {rate:.0f} samples/s", bar)
                epoch += 1
        finally:
            bar.close()
        finished = time.perf_counter()
        steady = finished - first_batch_at if first_batch_at is not None else 0.0
        stats = loader.stats()
    return {
        "steps": step, "epochs": epoch, "samples": samples, "batch_size": args.batch_size, "size": args.size,
        "workers": args.workers, "torch_threads": args.threads, "device": loader.stream.device,
        "wall_s": round(finished - started, 3),
        "startup_s": round((first_batch_at or finished) - started, 3),
        "samples_per_s": round(samples_after_first / steady, 1) if steady > 0 else None,
        "data_wait_s": round(wait_s, 3), "compute_s": round(compute_s, 3),
        "first_loss": round(losses[0], 4) if losses else None,
        "final_loss": round(sum(recent_loss) / len(recent_loss), 4) if recent_loss else None,
        "train_accuracy": round(sum(recent_hits) / len(recent_hits), 4) if recent_hits else None,
        "skipped": stats.get("skipped", {}),
        "_model": model,
    }


def evaluate(args: argparse.Namespace, sources: List[str], storage: Dict[str, Any], model: Any) -> float:
    """Top-1 accuracy of ``model`` over ``sources`` (every sample once, ``classification_eval``)."""
    import torch

    from dalistream.pipelines import classification_eval

    correct = total = 0
    model.eval()
    with classification_eval.loader(sources, batch_size=args.batch_size, size=args.size, resize=args.size,
                                    workers=args.workers, device=args.device, storage_options=storage,
                                    on_error=getattr(args, "on_error", "raise")) as loader:
        with torch.no_grad():
            for batch in loader:
                correct += int((model(batch["image"].float()).argmax(1) == batch["label"]).sum())
                total += int(batch["label"].shape[0])
    return round(correct / total, 4) if total else float("nan")


def _report(s: Dict[str, Any]) -> str:
    busy = s["data_wait_s"] + s["compute_s"]
    share = (lambda t: f"{100 * t / busy:.0f}%") if busy > 0 else (lambda t: "-")
    lines = [
        f"done: {s['steps']} steps, {s['epochs']} epoch(s), {s['samples']} samples in {s['wall_s']:.1f} s "
        f"(device {s['device']}, {s['workers']} workers)",
        f"  throughput  {s['samples_per_s']} samples/s (after {s['startup_s']:.1f} s start-up)",
        f"  data wait   {s['data_wait_s']:.2f} s ({share(s['data_wait_s'])})   "
        f"compute {s['compute_s']:.2f} s ({share(s['compute_s'])})",
        f"  loss        {s['first_loss']} -> {s['final_loss']} (mean of the last 20 steps)",
        f"  accuracy    {s['train_accuracy']} (training batches, last 50 steps)",
    ]
    if "eval_accuracy" in s:
        lines.append(f"  eval        {s['eval_accuracy']} (classification_eval, every sample once)")
    return "\n".join(lines)
