"""``dalistream bench --merge-only``: the cost of merging W parallel sources, without any data.

Each of W parallel external sources yields what :class:`dalistream.worker.WorkerSource` yields
(a full batch whose own slot is marked valid, every other position empty), with payloads of
``--merge-bytes`` as a list, a dense block or a blob (``--merge-forms``) plus lengths;
:func:`dalistream.dali.graph.merge_by_concat` (or, ``--merge-method conditional``, the owner
index's conditionals of :func:`dalistream.dali.graph.merge`) merges them, trimmed to the lengths. Nothing
else runs, so ms per batch is the floor the sharded design puts under every pipeline. Each W
is measured twice: merged, and with all W sources returned unmerged (the sources' own cost);
the difference is the merge. Module-level imports stay light: DALI's spawned workers import
this module to unpickle :class:`TinySource`.
"""

from __future__ import annotations

import functools
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

    def __init__(self, batch_size: int, workers: int, worker: int, payload_bytes: int = 1, form: str = "list") -> None:
        layout = Layout(1, workers, batch_size)
        lo = layout.slot_offsets[worker]
        hi = lo + layout.slots[worker]
        self.form = form
        empty = np.zeros((0,), np.uint8)
        if form == "dense":  # a padded block: every position a row of payload_bytes
            self.payload = np.zeros((batch_size, payload_bytes), np.uint8)
        elif form == "blob":  # the slot's rows end to end
            self.payload = np.zeros(((hi - lo) * payload_bytes,), np.uint8)
        else:
            self.payload = [empty] * batch_size
            self.payload[lo:hi] = [np.zeros((payload_bytes,), np.uint8)] * (hi - lo)
        self.lengths = np.zeros((batch_size, 1), np.int32)
        self.lengths[lo:hi] = payload_bytes
        self.valid = np.zeros(batch_size, np.uint8)
        self.valid[lo:hi] = 1

    def __iter__(self) -> "TinySource":
        return self

    def __next__(self) -> Tuple[Any, np.ndarray, np.ndarray]:
        # fresh objects, as WorkerSource builds each batch anew
        payload = list(self.payload) if self.form == "list" else self.payload.copy()
        return payload, self.valid.copy(), self.lengths.copy()


def run_merge(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Child side: ms per batch of W tiny sources, merged (``spec["merge"]``) or returned as is."""
    import dill
    from nvidia.dali import fn, pipeline_def, types

    from ...dali.compat import shutdown
    from ...config import StreamConfig
    from ...dali.compat import on_receive
    from ...dali.graph import OwnerIndex, merge, merge_by_concat, received_rows, trim
    from .monitor import tree_cpu_s

    workers, batch = spec["workers"], spec["batch_size"]
    payload, form = spec.get("payload_bytes", 1), spec.get("form", "list")
    hint = payload + 256  # bytes per sample, all outputs and metadata: shared memory sized once
    config = StreamConfig(sources=("-",), fields={"payload": "bin"}, batch_size=batch, workers=workers)
    t0 = time.perf_counter()

    @pipeline_def(batch_size=batch, num_threads=spec["threads"], device_id=None, py_num_workers=workers,
                  py_start_method="spawn", py_callback_pickler=dill, enable_conditionals=True, exec_dynamic=True,
                  prefetch_queue_depth=2)
    def merged():
        sources = [TinySource(batch, workers, w, payload, form) for w in range(workers)]
        if form == "blob" and not all(on_receive(s, functools.partial(received_rows, (0,), 2, ())) for s in sources):
            raise ConfigError("--merge-forms blob: this DALI lacks what the blob form needs (see dalistream.dali.compat)")
        branches = [fn.external_source(source=source, num_outputs=3, batch=True, parallel=True, cycle="quiet",
                                       prefetch_queue_depth=2, bytes_per_sample_hint=hint)
                    for source in sources]
        if not spec["merge"]:
            return tuple(node for nodes in branches for node in nodes)
        if spec.get("method", "concat") == "concat":  # what dalistream does for such fields
            return tuple(merge_by_concat(config, branches))
        if workers == 1:
            merged = list(branches[0])
        else:
            owner = fn.external_source(source=OwnerIndex(batch, workers), batch=True, dtype=types.INT32)
            merged = merge(owner, branches)
        return trim(merged[0], merged[2]), merged[1]

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
    """Parent side: alternate W values and transfer forms (merged, and list sources unmerged)
    ``--repeats`` times; print medians."""
    import json

    try:
        ws = [int(w) for w in args.merge_workers.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"--merge-workers {args.merge_workers!r}: expected integers like 1,2,4,8") from None
    if not ws or min(ws) < 1 or max(ws) > args.batch_size:
        raise ConfigError("--merge-workers: values must be between 1 and the batch size")
    forms = [f.strip() for f in args.merge_forms.split(",") if f.strip()]
    if not forms or set(forms) - {"list", "dense", "blob"}:
        raise ConfigError(f"--merge-forms {args.merge_forms!r}: expected some of list, dense, blob (comma-separated)")
    runs: Dict[Tuple[int, str, bool], List[Dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for w in ws:
            cases = [(form, True) for form in forms] + ([(forms[0], False)] if w > 1 else [])  # W=1: nothing to merge
            for form, merged in cases:
                spec = {"system": "merge", "workers": w, "batch_size": args.batch_size, "threads": args.threads,
                        "batches": args.merge_batches, "warmup": 20, "merge": merged, "form": form,
                        "payload_bytes": args.merge_bytes, "method": args.merge_method}
                result = run_child(spec, args.timeout, lean_main=True)  # steady state only: no torch
                runs.setdefault((w, form, merged), []).append(result)
                log(f"  [{repeat + 1}/{args.repeats}] W={w:<3d} {form:5s} {'merged' if merged else 'sources only':12s} "
                    f"{result['ms_per_batch']:7.2f} ms/batch ({result['cpu_ms_per_batch']:6.2f} CPU ms)  "
                    f"build {result['build_s']:5.2f} s  peak RSS {result['peak_rss_mb']:6.0f} MB")

    def med(key: Tuple[int, str, bool], field: str) -> float:
        return statistics.median(r[field] for r in runs[key])

    rows = []
    for w in ws:
        sources = (w, forms[0], w == 1)  # W=1: the merged run is the sources alone
        for form in forms:
            merged_ms = med((w, form, True), "ms_per_batch")
            rows.append({"workers": w, "form": form, "payload_bytes": args.merge_bytes, "ms_per_batch": merged_ms,
                         "sources_only_ms_per_batch": med(sources, "ms_per_batch"),
                         "cpu_ms_per_batch": med((w, form, True), "cpu_ms_per_batch"),
                         "sources_only_cpu_ms_per_batch": med(sources, "cpu_ms_per_batch"),
                         "merge_ms_per_batch": merged_ms - med(sources, "ms_per_batch") if w > 1 else 0.0,
                         "build_s": med((w, form, True), "build_s"), "peak_rss_mb": med((w, form, True), "peak_rss_mb"),
                         "runs_ms_per_batch": [r["ms_per_batch"] for r in runs[(w, form, True)]]})
    log(f"merge-only ({args.merge_method}), batch {args.batch_size}, {args.merge_bytes} B per sample, {args.merge_batches} batches, "
        f"median of {args.repeats} (sources only: {forms[0]} form, unmerged):")
    log(f"{'W':>4s}{'form':>6s}{'merged ms/batch':>18s}{'sources only':>14s}{'merge ms':>10s}{'CPU ms merged':>15s}"
        f"{'CPU ms sources':>16s}{'build s':>9s}{'RSS MB':>8s}")
    for r in rows:
        log(f"{r['workers']:>4d}{r['form']:>6s}{r['ms_per_batch']:>18.2f}{r['sources_only_ms_per_batch']:>14.2f}"
            f"{r['merge_ms_per_batch']:>10.2f}{r['cpu_ms_per_batch']:>15.2f}{r['sources_only_cpu_ms_per_batch']:>16.2f}"
            f"{r['build_s']:>9.2f}{r['peak_rss_mb']:>8.0f}")
    if args.json:
        print(json.dumps({"merge_only": {"batch_size": args.batch_size, "payload_bytes": args.merge_bytes,
                                         "method": args.merge_method,
                                         "rows": rows}}), flush=True)
    return 0
