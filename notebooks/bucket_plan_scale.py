"""What a worker spends planning its bucketed epoch, as the job grows: a simulation of the plan
functions alone (no data read), for layouts up to hundreds of ranks.

At each epoch's start a worker of a bucketed stream plans its rank's part of the epoch
(``BucketEpoch(..., ranks=(rank,))``, its worker plan, :func:`bucket_run`): this times that, per
epoch and per sample of the worker's share, with the data set's :class:`BucketIndex` built once
beforehand (a process does so once per data set; its time is printed apart). Eight buckets of
skewed sizes (40% down to 1%), ``per="rank"``, policy ``even``::

    python notebooks/bucket_plan_scale.py [--repeats 3] [--code DIR]

``--code DIR`` times another checkout's dalistream too (e.g. a worktree of an older commit), in
its own process, one layout after the other. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LAYOUTS = [  # (ranks, workers, batch size, shards, samples per shard)
    (1, 2, 64, 48, 400),
    (8, 8, 64, 384, 400),
    (64, 8, 64, 3072, 400),
    (64, 8, 256, 3200, 400),
    (256, 8, 64, 8192, 1000),
]

CHILD = r"""
import json, sys, time
import numpy as np
from dalistream.plan.buckets import BucketEpoch
from dalistream.plan.bucketworker import bucket_run
from dalistream.plan.layout import Layout, Schedule
try:
    from dalistream.plan.bucketseq import BucketIndex
except ImportError:  # (code from before the index)
    BucketIndex = None
ranks, workers, batch, shards, per_shard, repeats = (int(x) for x in sys.argv[1:7])
rng = np.random.default_rng(0)
counts = np.full(shards, per_shard)
p = np.array([40, 20, 15, 10, 8, 4, 2, 1], dtype=float)
ids = rng.choice(8, int(counts.sum()), p=p / p.sum()).astype(np.int16)
layout, rank = Layout(ranks, workers, batch), ranks // 2
t = time.perf_counter()
extra = {"index": BucketIndex(counts, ids, 8)} if BucketIndex is not None else {}
index_s = time.perf_counter() - t
times = []
for epoch in range(repeats):
    t = time.perf_counter()
    plan = BucketEpoch(counts, ids, 8, layout, Schedule(0, "even"), epoch, ranks=(rank,), **extra)
    run = bucket_run([plan.worker(rank, 0)])
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"index_s": index_s if extra else None, "epoch_ms": times[len(times) // 2] * 1e3,
                  "share": int(run.emit.size)}))
"""


def measure(code: str, layout: tuple, repeats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=code)
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, layout), str(repeats)], env=env, check=True,
                         capture_output=True, text=True, cwd=code)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="epochs planned per layout (the median is shown)")
    parser.add_argument("--code", help="another checkout's root, timed too")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    codes = [("this", here)] + ([("other", os.path.abspath(args.code))] if args.code else [])
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| R × W × B | samples | " + " | ".join(f"{n}: epoch plan (µs per sample of the share)" for n, _ in codes)
          + " | index, once |")
    print("|---|---:|" + "---:|" * len(codes) + "---:|")
    for layout in LAYOUTS:
        r, w, b, shards, per = layout
        got = [measure(code, layout, args.repeats) for _, code in codes]
        cells = [f"{g['epoch_ms']:.1f} ms ({g['epoch_ms'] * 1e3 / max(g['share'], 1):.2f})" for g in got]
        index = got[0]["index_s"]
        print(f"| {r} × {w} × {b} | {shards * per:,} | " + " | ".join(cells)
              + f" | {'-' if index is None else f'{index:.2f} s'} |")


if __name__ == "__main__":
    main()
