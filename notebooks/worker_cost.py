"""What one loader worker spends per sample, reading interleaved and reading one span: its
source run in a process of its own, without DALI (the batches it would hand to DALI are made
and dropped; the fields are the bench's), timed by the thread's CPU clock. The CPU per sample
of a worker is what the feed benchmark's workers' share measures, without the main process,
the shipping and the other worker on the same cores: steadier figures (a few % from run to
run, where a whole pipeline's vary by tens of %), to tell a change to the worker's path apart from noise::

    python notebooks/worker_cost.py DATA [-B 256] [-W 2] [-R 1] [--epochs 4] [--rounds 5] [--code DIR]

Worker 0 of ``W`` (of rank 0 of ``R``: a job of ``R`` ranks gives each a ``1 / R`` share of the
epoch, and its columns lie ``R`` spans apart) reads ``epochs`` epochs; the first (arena growth, imports, the members'
geometry) is left out of the figure. Every round runs each configuration once, alternating
(interleaved, one span; with ``--code DIR`` the same in another checkout, e.g. a worktree of an
older commit; every other round in the reverse order); the table gives medians over the rounds and the median of each round's own
ratio. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import gc, json, sys, time
import dalistream
from dalistream.tools.bench.peers import IMAGE_EXTS, LABEL_EXTS
from dalistream.worker.source import WorkerSource
data, mode, batch, workers, epochs, ranks = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
options = dict(interleave=False, shuffle=0) if mode == "span" else {}
stream = dalistream.Stream.open(data, fields={"image": IMAGE_EXTS, "label": LABEL_EXTS}, batch_size=batch,
                                workers=workers, rank=0, world_size=ranks, device="cpu", seed=0, **options)
at = stream.at(0, 0)
source = WorkerSource(at.config, at.data, 0)
gc.freeze()  # as a DALI worker does (WorkerSource.__iter__): the imports' heap kept out of collections
times, samples = [], 0
for epoch in range(epochs):
    t = time.thread_time()
    for outputs in source:
        if epoch:
            samples += int(outputs[-1].sum())  # valid: the real samples of the worker's slot
    times.append(time.thread_time() - t)
print(json.dumps({"us_per_sample": sum(times[1:]) / max(samples, 1) * 1e6, "samples": samples}))
"""


def measure(code: str, data: str, mode: str, args: argparse.Namespace) -> float:
    env = dict(os.environ, PYTHONPATH=code)
    out = subprocess.run([sys.executable, "-c", CHILD, data, mode, str(args.batch_size), str(args.workers),
                          str(args.epochs), str(args.world_size)], env=env, check=True, capture_output=True, text=True, cwd=code)
    return json.loads(out.stdout.strip().splitlines()[-1])["us_per_sample"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a folder of shards (or any source dalistream.Stream.open takes)")
    parser.add_argument("-B", "--batch-size", type=int, default=256)
    parser.add_argument("-W", "--workers", type=int, default=2)
    parser.add_argument("-R", "--world-size", type=int, default=1, help="ranks of the job (rank 0 measured)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs read per run, the first left out (>= 2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--code", help="another checkout's root, measured too")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first is left out")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    codes = [("this", here)] + ([("other", os.path.abspath(args.code))] if args.code else [])
    configs = [(name, code, mode) for name, code in codes for mode in ("interleaved", "span")]
    load = os.getloadavg()[0]
    got = {(name, mode): [] for name, _, mode in configs}
    for r in range(args.rounds):
        for name, code, mode in configs if r % 2 == 0 else configs[::-1]:  # (no configuration always first)
            got[name, mode].append(measure(code, args.data, mode, args))
    print(f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; B={args.batch_size}, W={args.workers}, R={args.world_size}, "
          f"{args.epochs - 1} epochs measured per run, {args.rounds} rounds")
    print("| code | interleaved: µs per sample | one span | interleaved / one span (range) |")
    print("|---|---:|---:|---:|")
    for name, _ in codes:
        ratios = [a / b for a, b in zip(got[name, "interleaved"], got[name, "span"])]
        print(f"| {name} | {statistics.median(got[name, 'interleaved']):.2f} | {statistics.median(got[name, 'span']):.2f} "
              f"| {statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) |")
    if args.code:
        for mode in ("interleaved", "span"):
            ratios = [a / b for a, b in zip(got["this", mode], got["other", mode])]
            print(f"this / other, {mode}: {statistics.median(ratios):.3f}× ({min(ratios):.3f}–{max(ratios):.3f})")


if __name__ == "__main__":
    main()
