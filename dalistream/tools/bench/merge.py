"""``dalistream bench --merge-only``: the cost of merging W parallel sources, without any data.

Each of W parallel external sources yields what :class:`dalistream.worker.WorkerSource` yields
(a full batch whose own slot is marked valid, every other position a shared empty array), with
1-byte payloads; :func:`dalistream.dali.graph.merge` picks each position from its owner. Nothing
else runs, so ms per batch is the floor the sharded design puts under every pipeline. Each W
is measured twice: merged, and with all W sources returned unmerged (the sources' own cost);
the difference is the merge. Module-level imports stay light: DALI's spawned workers import
this module to unpickle :class:`TinySource`.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ...errors import ConfigError
from ...plan import Layout
from .child import run_child


class TinySource:
    """One worker's padded batches of 1-byte payloads, laid out as dalistream's sources do."""

    def __init__(self, batch_size: int, workers: int, worker: int) -> None:
        layout = Layout(1, workers, batch_size)
        lo = layout.slot_offsets[worker]
        hi = lo + layout.slots[worker]
        empty, zero, one = np.zeros((0,), np.uint8), np.zeros((), np.uint8), np.ones((), np.uint8)
        self.payload = [empty] * batch_size
        self.payload[lo:hi] = [np.zeros((1,), np.uint8)] * (hi - lo)
        self.valid = [zero] * batch_size
        self.valid[lo:hi] = [one] * (hi - lo)

    def __iter__(self) -> "TinySource":
        return self

    def __next__(self) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        return list(self.payload), list(self.valid)  # fresh lists, as WorkerSource copies its templates


def run_merge(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Child side: ms per batch of W tiny sources, merged (``spec["merge"]``) or returned as is."""
    import dill
    from nvidia.dali import fn, pipeline_def, types

    from ...dali.graph import OwnerIndex, merge
    from .monitor import tree_cpu_s

    workers, batch = spec["workers"], spec["batch_size"]
    t0 = time.perf_counter()

    @pipeline_def(batch_size=batch, num_threads=spec["threads"], device_id=None, py_num_workers=workers,
                  py_start_method="spawn", py_callback_pickler=dill, enable_conditionals=True, exec_dynamic=True,
                  prefetch_queue_depth=2)
    def merged():
        branches = [fn.external_source(source=TinySource(batch, workers, w), num_outputs=2, batch=True,
                                       parallel=True, cycle="quiet", prefetch_queue_depth=2) for w in range(workers)]
        if not spec["merge"] or workers == 1:
            return tuple(node for nodes in branches for node in nodes)
        owner = fn.external_source(source=OwnerIndex(batch, workers), batch=True, dtype=types.INT32)
        return tuple(merge(owner, branches))

    pipe = merged()
    pipe.build()
    build_s = time.perf_counter() - t0
    try:
        for _ in range(spec.get("warmup", 20)):
            pipe.run()
        cpu = tree_cpu_s(os.getpid())
        start = time.perf_counter()
        for _ in range(spec["batches"]):
            pipe.run()
        elapsed = time.perf_counter() - start
        cpu = tree_cpu_s(os.getpid()) - cpu
    finally:
        pipe._shutdown()
    return {"ms_per_batch": elapsed / spec["batches"] * 1000, "cpu_ms_per_batch": cpu / spec["batches"] * 1000,
            "build_s": build_s, "batches": spec["batches"],
            "samples": spec["batches"] * batch, "samples_per_s": spec["batches"] * batch / elapsed}


def run_merge_only(args: Any, log: Callable[[str], None]) -> int:
    """Parent side: alternate W values (merged, unmerged) ``--repeats`` times; print medians."""
    import json

    try:
        ws = [int(w) for w in args.merge_workers.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"--merge-workers {args.merge_workers!r}: expected integers like 1,2,4,8") from None
    if not ws or min(ws) < 1 or max(ws) > args.batch_size:
        raise ConfigError("--merge-workers: values must be between 1 and the batch size")
    runs: Dict[Tuple[int, bool], List[Dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for w in ws:
            for merged in ((True, False) if w > 1 else (True,)):  # W=1 has nothing to merge
                spec = {"system": "merge", "workers": w, "batch_size": args.batch_size, "threads": args.threads,
                        "batches": args.merge_batches, "warmup": 20, "merge": merged}
                result = run_child(spec, args.timeout, lean_main=True)  # steady state only: no torch
                runs.setdefault((w, merged), []).append(result)
                log(f"  [{repeat + 1}/{args.repeats}] W={w:<3d} {'merged' if merged else 'sources only':12s} "
                    f"{result['ms_per_batch']:7.2f} ms/batch ({result['cpu_ms_per_batch']:6.2f} CPU ms)  build {result['build_s']:5.2f} s  "
                    f"peak RSS {result['peak_rss_mb']:6.0f} MB")

    def med(w: int, merged: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs[(w, merged or w == 1)])

    rows = []
    for w in ws:
        merged_ms, sources_ms = med(w, True, "ms_per_batch"), med(w, False, "ms_per_batch")
        rows.append({"workers": w, "ms_per_batch": merged_ms, "sources_only_ms_per_batch": sources_ms,
                     "cpu_ms_per_batch": med(w, True, "cpu_ms_per_batch"),
                     "sources_only_cpu_ms_per_batch": med(w, False, "cpu_ms_per_batch"),
                     "merge_ms_per_batch": merged_ms - sources_ms if w > 1 else 0.0,
                     "build_s": med(w, True, "build_s"), "peak_rss_mb": med(w, True, "peak_rss_mb"),
                     "runs_ms_per_batch": [r["ms_per_batch"] for r in runs[(w, True)]]})
    log(f"merge-only, batch {args.batch_size}, {args.merge_batches} batches, median of {args.repeats}:")
    log(f"{'W':>4s}{'merged ms/batch':>18s}{'sources only':>14s}{'merge ms':>10s}{'CPU ms merged':>15s}"
        f"{'CPU ms sources':>16s}{'build s':>9s}{'RSS MB':>8s}")
    for r in rows:
        log(f"{r['workers']:>4d}{r['ms_per_batch']:>18.2f}{r['sources_only_ms_per_batch']:>14.2f}"
            f"{r['merge_ms_per_batch']:>10.2f}{r['cpu_ms_per_batch']:>15.2f}{r['sources_only_cpu_ms_per_batch']:>16.2f}"
            f"{r['build_s']:>9.2f}{r['peak_rss_mb']:>8.0f}")
    if args.json:
        print(json.dumps({"merge_only": {"batch_size": args.batch_size, "rows": rows}}), flush=True)
    return 0
