"""``dalistream bench`` over every store's emulator, against local disk, in one command::

    python tests/emulators/bench_stores.py FOLDER [--stores s3,gs,az,hf,http] [--repeats 3]
        [--workers 2] [--pipeline read-only] [--epochs 3] [--shape 40ms,3MB/s --shape-stores s3,gs]
        [--startup 50000] [--bench-args '--no-interleave'] [--json OUT.json]

starts ``serve.py FOLDER`` (every emulator holding FOLDER's files, a manifest among them if FOLDER
has one) and runs, for each store, ``dalistream bench SOURCE --local-copy FOLDER``: dalistream
reading the store alternates with dalistream reading FOLDER directly (and, for ``read-only``, one
GET stream per shard read front to back: ``sequential-read``), medians of ``--repeats``. It prints
samples/s and CPU per MB of shards (main process and DALI workers; the emulator's own CPU is in
another process) per store and their ratios to local disk.

``--shape``: for each of ``--shape-stores`` one more bench, one worker reading through the
shaping proxy (:mod:`dalistream.tools.proxy`: every connection gets that latency to first byte
and bandwidth), against ``sequential-read`` through the same proxy: one worker's rate against
one connection's. ``--startup N``: instead, ``serve.py --manifest-only N`` and the requests and
seconds of ``Stream.open`` per rank on each store (the first rank of a node, then the next with
the parsed manifest in the node's cache), medians of ``--repeats``.

The machine's load average is printed with the figures: on a shared machine they are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def serve(folder: str, manifest_only: int = 0) -> "tuple[subprocess.Popen, dict]":
    """serve.py in a child process, and its stores by name once it says it is ready."""
    command = [sys.executable, os.path.join(HERE, "serve.py"), folder]
    if manifest_only:
        command += ["--manifest-only", str(manifest_only)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    stores = {}
    for line in proc.stdout:
        item = json.loads(line)
        if item.get("ready"):
            return proc, stores
        stores[item["store"]] = item
    raise SystemExit("serve.py ended before it was ready")


def bench(store: dict, args: argparse.Namespace, extra: list) -> dict:
    """One ``dalistream bench`` of ``store`` (its environment set): its JSON report."""
    sources = store.get("sources") or [store["source"]]
    command = [sys.executable, "-m", "dalistream", "bench", *sources, "--pipeline", args.pipeline, "--json",
               "--repeats", str(args.repeats), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), *extra,
               *shlex.split(args.bench_args)]
    env = dict(os.environ, **store["env"])
    print(f"+ {' '.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def figures(report: dict, peer: str = "") -> dict:
    got = report["peers"][peer] if peer else report
    return {k: got.get(k) for k in ("samples_per_s", "mb_per_s", "steady_cpu_ms_per_sample", "cpu_ms_per_mb")}


def startup(stores: dict, args: argparse.Namespace) -> list:
    """Requests and seconds of ``Stream.open`` per rank on each store (fresh processes)."""
    child = r"""
import json, sys, time
import dalistream
from dalistream.io.remote import TOTALS
source, cache = sys.argv[1], sys.argv[2]
began, before = time.perf_counter(), TOTALS.requests
stream = dalistream.Stream.open(source, fields={"key": "__key__"}, batch_size=8, workers=2, rank=3, world_size=8,
                                device="cpu", cache_dir=cache)
print(json.dumps({"s": time.perf_counter() - began, "requests": TOTALS.requests - before, "shards": len(stream.urls)}))
"""
    rows = []
    for name in [s for s in args.stores.split(",") if s in stores]:
        store = stores[name]
        source = store.get("source") or store["sources"][0]
        runs = {"first": [], "next": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:
                for rank in ("first", "next"):  # the next rank of the node finds the parsed manifest
                    done = subprocess.run([sys.executable, "-c", child, source, cache], check=True, text=True,
                                          env=dict(os.environ, **store["env"]), stdout=subprocess.PIPE)
                    runs[rank].append(json.loads(done.stdout.strip().splitlines()[-1]))
        row = {"store": name, "shards": runs["first"][0]["shards"]}
        for rank, got in runs.items():
            row[f"{rank}_requests"] = statistics.median(r["requests"] for r in got)
            row[f"{rank}_s"] = statistics.median(r["s"] for r in got)
        print(f"{name}: {row}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default="")
    parser.add_argument("--stores", default="s3,gs,az,hf,http")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--pipeline", default="read-only")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shape", default="")
    parser.add_argument("--shape-stores", default="s3,gs")
    parser.add_argument("--startup", type=int, default=0)
    parser.add_argument("--bench-args", default="", help="more arguments for every bench, e.g. '--no-interleave'")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    proc, stores = serve(os.path.abspath(args.folder) if args.folder else "", args.startup)
    out = {"load_before": load, "cpus": os.cpu_count(), "stores": {}}
    try:
        if args.startup:
            out["startup"] = startup(stores, args)
        else:
            for name in [s for s in args.stores.split(",") if s in stores]:
                report = bench(stores[name], args, ["--workers", str(args.workers), "--local-copy", args.folder])
                out["stores"][name] = {"store": figures(report), "local": figures(report, "dalistream-local"),
                                       "ratio": report["peers"]["dalistream-local"]["ratio"],
                                       "loadavg": report["config"]["loadavg_1m"]}
            for name in [s for s in args.shape_stores.split(",") if args.shape and s in stores]:
                extra = ["--workers", "1", "--shape", args.shape]
                if name != "http":
                    extra += ["--endpoint-url", stores[name]["endpoint"]]
                report = bench(stores[name], args, extra)
                out.setdefault("shaped", {})[name] = {
                    "worker": figures(report), "one_connection": figures(report, "sequential-read"),
                    "ratio": report["peers"]["sequential-read"]["ratio"]["samples_per_s"],
                    "loadavg": report["config"]["loadavg_1m"]}
    finally:
        proc.terminate()
        proc.wait()
    out["load_after"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"load average {out['load_before']:.1f} before, {out['load_after']:.1f} after, {out['cpus']} CPUs")
    if out["stores"]:
        print("| store | samples/s | local samples/s | × local | CPU ms/MB | local CPU ms/MB | × local |")
        print("|---|---|---|---|---|---|---|")
        for name, row in out["stores"].items():
            s, loc, r = row["store"], row["local"], row["ratio"]
            print(f"| {name} | {s['samples_per_s']:,.0f} | {loc['samples_per_s']:,.0f} | {r['samples_per_s']:.2f} | "
                  f"{_num(s['cpu_ms_per_mb'])} | {_num(loc['cpu_ms_per_mb'])} | {_num(r.get('cpu_ms_per_mb'), 2)} |")
    for name, row in out.get("shaped", {}).items():
        print(f"shaped {args.shape}, {name}: one worker {row['worker']['samples_per_s']:,.0f} samples/s, one "
              f"connection {row['one_connection']['samples_per_s']:,.0f}: {row['ratio']:.1f}×")
    for row in out.get("startup", []):
        print(f"start-up {row['store']}: {row['shards']} shards, first rank {row['first_requests']:.0f} requests "
              f"{row['first_s']:.2f} s, next rank {row['next_requests']:.0f} requests {row['next_s']:.2f} s")


def _num(value, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


if __name__ == "__main__":
    main()
