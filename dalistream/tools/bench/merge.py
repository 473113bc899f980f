"""``dalistream bench --merge-only``: the cost of merging W parallel sources, without any data.

Each of W parallel external sources yields what :class:`dalistream.worker.WorkerSource` yields
(a full batch whose own slot is marked valid, every other position empty), with payloads of
``--merge-bytes`` packed as dalistream packs byte fields (one blob with the rows' lengths, cut
into rows in the main process); :func:`dalistream.dali.graph.merged` merges them by
concatenation and sum (or, ``--merge-method conditional``, by the owner index's conditionals of
:func:`dalistream.dali.graph.merge`). Nothing
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


def payload_range(text: str) -> Tuple[int, int]:
    """``--merge-bytes``: ``N`` (every row N bytes) or ``LO-HI`` (the slot's rows spread evenly
    from LO to HI bytes, as encoded images vary)."""
    try:
        lo, _, hi = str(text).partition("-")
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise ConfigError(f"--merge-bytes {text!r}: expected N or LO-HI bytes per sample") from None
    if lo < 1 or hi < lo:
        raise ConfigError(f"--merge-bytes {text!r}: expected 1 <= LO <= HI")
    return lo, hi


class TinySource:
    """One worker's padded batches of payload rows, laid out and packed as dalistream's sources
    do (:func:`dalistream.worker.batch.pack`)."""

    def __init__(self, form: Any, batch_size: int, workers: int, worker: int, payload: Tuple[int, int] = (1, 1)) -> None:
        self.form = form  # how the payload field travels (dalistream.worker.batch.transfer)
        layout = Layout(1, workers, batch_size)
        self.lo = layout.slot_offsets[worker]
        self.hi = self.lo + layout.slots[worker]
        rows = [np.zeros(0, np.uint8)] * batch_size
        sizes = np.linspace(payload[0], payload[1], self.hi - self.lo).astype(int)
        rows[self.lo:self.hi] = [np.full(n, 7, np.uint8) for n in sizes]
        valid = np.zeros(batch_size, np.uint8)
        valid[self.lo:self.hi] = 1
        self.plain = (rows, valid)

    def __iter__(self) -> "TinySource":
        return self

    def __next__(self) -> Tuple[Any, ...]:
        from ...worker.batch import pack

        return pack(self.plain, self.form, (0,), self.lo, self.hi)


def run_merge(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Child side: ms per batch of W tiny sources, merged (``spec["merge"]``) or returned as is."""
    import dill
    from nvidia.dali import fn, pipeline_def

    from ...config import StreamConfig
    from ...dali.compat import light_queues, shutdown
    from ...dali.graph import merged as merged_nodes, owner_of, receive_blobs, transfer_of, valid_of
    from .monitor import tree_cpu_s

    workers, batch = spec["workers"], spec["batch_size"]
    payload = payload_range(spec.get("payload_bytes", 1))
    hint = payload[1] + 4 + 256  # bytes per sample, all outputs and metadata: shared memory sized once
    config = StreamConfig(sources=("-",), fields={"payload": "bin"}, batch_size=batch, workers=workers)
    t0 = time.perf_counter()

    @pipeline_def(batch_size=batch, num_threads=spec["threads"], device_id=None, py_num_workers=workers,
                  py_start_method="spawn", py_callback_pickler=dill, enable_conditionals=True, exec_dynamic=True,
                  prefetch_queue_depth=2)
    def merged():
        form = transfer_of(config)
        sources = [TinySource(form, batch, workers, w, payload) for w in range(workers)]
        for source in sources:
            receive_blobs(source, form.blobs, batch)
        branches = [fn.external_source(source=source, num_outputs=form.n_outputs, batch=True, parallel=True,
                                       cycle="quiet", prefetch_queue_depth=2, bytes_per_sample_hint=hint)
                    for source in sources]
        if not spec["merge"]:
            return tuple(node for nodes in branches for node in nodes)
        by_owner = spec.get("method", "concat") != "concat" and workers > 1  # concat: what dalistream does here
        fields, _, valid = merged_nodes(config, owner_of([valid_of(config, b) for b in branches]) if by_owner else None,
                                        branches)
        return (*fields, valid)

    light_queues()  # as dalistream's loader starts its pools
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
        shutdown(pipe)
    return {"ms_per_batch": elapsed / spec["batches"] * 1000, "cpu_ms_per_batch": cpu / spec["batches"] * 1000,
            "build_s": build_s, "batches": spec["batches"],
            "samples": spec["batches"] * batch, "samples_per_s": spec["batches"] * batch / elapsed}


def run_merge_only(args: Any, log: Callable[[str], None]) -> int:
    """Parent side: alternate W values (merged, and sources unmerged) ``--repeats`` times; print
    medians."""
    import json

    try:
        ws = [int(w) for w in args.merge_workers.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"--merge-workers {args.merge_workers!r}: expected integers like 1,2,4,8") from None
    if not ws or min(ws) < 1 or max(ws) > args.batch_size:
        raise ConfigError("--merge-workers: values must be between 1 and the batch size")
    lo, hi = payload_range(args.merge_bytes)
    payload_label = lo if lo == hi else f"{lo}-{hi}"
    runs: Dict[Tuple[int, bool], List[Dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for w in ws:
            for merged in (True, False) if w > 1 else (True,):  # W=1: nothing to merge
                spec = {"system": "merge", "workers": w, "batch_size": args.batch_size, "threads": args.threads,
                        "batches": args.merge_batches, "warmup": 20, "merge": merged,
                        "payload_bytes": args.merge_bytes, "method": args.merge_method}
                result = run_child(spec, args.timeout, lean_main=True)  # steady state only: no torch
                runs.setdefault((w, merged), []).append(result)
                log(f"  [{repeat + 1}/{args.repeats}] W={w:<3d} {'merged' if merged else 'sources only':12s} "
                    f"{result['ms_per_batch']:7.2f} ms/batch ({result['cpu_ms_per_batch']:6.2f} CPU ms)  "
                    f"build {result['build_s']:5.2f} s  peak RSS {result['peak_rss_mb']:6.0f} MB")

    def med(key: Tuple[int, bool], field: str) -> float:
        return statistics.median(r[field] for r in runs[key])

    rows = []
    for w in ws:
        sources = (w, w == 1)  # W=1: the merged run is the sources alone
        merged_ms = med((w, True), "ms_per_batch")
        rows.append({"workers": w, "payload_bytes": payload_label, "ms_per_batch": merged_ms,
                     "sources_only_ms_per_batch": med(sources, "ms_per_batch"),
                     "cpu_ms_per_batch": med((w, True), "cpu_ms_per_batch"),
                     "sources_only_cpu_ms_per_batch": med(sources, "cpu_ms_per_batch"),
                     "merge_ms_per_batch": merged_ms - med(sources, "ms_per_batch") if w > 1 else 0.0,
                     "build_s": med((w, True), "build_s"), "peak_rss_mb": med((w, True), "peak_rss_mb"),
                     "runs_ms_per_batch": [r["ms_per_batch"] for r in runs[(w, True)]]})
    log(f"merge-only ({args.merge_method}), batch {args.batch_size}, {payload_label} B per sample, "
        f"{args.merge_batches} batches, median of {args.repeats}:")
    log(f"{'W':>4s}{'merged ms/batch':>18s}{'sources only':>14s}{'merge ms':>10s}{'CPU ms merged':>15s}"
        f"{'CPU ms sources':>16s}{'build s':>9s}{'RSS MB':>8s}")
    for r in rows:
        log(f"{r['workers']:>4d}{r['ms_per_batch']:>18.2f}{r['sources_only_ms_per_batch']:>14.2f}"
            f"{r['merge_ms_per_batch']:>10.2f}{r['cpu_ms_per_batch']:>15.2f}{r['sources_only_cpu_ms_per_batch']:>16.2f}"
            f"{r['build_s']:>9.2f}{r['peak_rss_mb']:>8.0f}")
    if args.json:
        print(json.dumps({"merge_only": {"batch_size": args.batch_size, "payload_bytes": payload_label,
                                         "method": args.merge_method, "rows": rows}}), flush=True)
    return 0
