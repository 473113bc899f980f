"""One worker's read rate from S3 against the number of ranged parts in flight, on a shaped link.

A moto S3 server and a shaping proxy (``dalistream.tools.proxy``: every connection gets a latency
to first byte and a bandwidth cap) run in a child process; this process reads the shards the way
one DALI worker does (a ``ShardSequence`` parsed by the tar reader, no DALI) for each
``parts_in_flight`` K and ``part_bytes`` P, and writes a table (markdown) and a plot::

    python notebooks/remote_parts.py --shape 40ms,3MB/s --out notebooks/figures/remote_parts.png

Numbers from a busy machine are noisy: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

MiB = 1 << 20


def test_credentials() -> None:
    """moto's test credentials (for both processes); the machine's AWS settings are not used."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)


def serve(directory: str, shape: str) -> None:
    """Child: moto with the shards of ``directory`` in bucket ``bench``, behind a shaping proxy."""
    import boto3
    from moto.server import ThreadedMotoServer

    from dalistream.tools.proxy import ShapingProxy, parse_shape

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="bench")
    for name in sorted(os.listdir(directory)):
        client.upload_file(os.path.join(directory, name), "bench", name)
    latency, rate = parse_shape(shape)
    with ShapingProxy(endpoint, latency_s=latency, rate=rate) as proxy:
        print(json.dumps({"direct": endpoint, "shaped": proxy.endpoint}), flush=True)
        sys.stdin.read()  # until the parent closes our stdin
    server.stop()


def write_shards(directory: str, shards: int, shard_mb: float) -> None:
    import webdataset as wds

    rng = np.random.default_rng(0)
    per = int(shard_mb * MiB / (100 << 10))
    for s in range(shards):
        with wds.TarWriter(os.path.join(directory, f"remote-{s:03d}.tar")) as sink:
            for i in range(per):
                sink.write({"__key__": f"{s}/{i:05d}", "bin": rng.bytes(100 << 10), "cls": b"1"})


def read_all(urls, options) -> dict:
    """Read every shard in order as one worker does; MB/s, keys and I/O counters."""
    from dalistream.io import IOCounters, ShardSequence
    from dalistream.io.clients import s3_client
    from dalistream.io.options import remote_options
    from dalistream.tar import iter_samples

    s3_client(remote_options(options))  # made once per process (a worker's first shard pays it once)
    counters = IOCounters()
    seq = ShardSequence(urls, options, counters)
    keys, nbytes = [], 0
    t0 = time.perf_counter()
    try:
        for i, url in enumerate(urls):
            with seq.open(i) as f:
                for sample in iter_samples(f, url):
                    keys.append(sample["__key__"])
                    nbytes += len(sample["bin"])
    finally:
        seq.close()
    seconds = time.perf_counter() - t0
    return {"mb_per_s": counters.bytes / seconds / 1e6, "seconds": seconds, "keys": keys, "io": counters.as_dict()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="40ms,3MB/s")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--shard-mb", type=float, default=12)
    p.add_argument("--parts", default="1,2,4,8,16", help="values of parts_in_flight")
    p.add_argument("--part-mb", default="1,8", help="values of part_bytes, in MiB")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "figures", "remote_parts.png"))
    args = p.parse_args()
    test_credentials()
    with tempfile.TemporaryDirectory() as directory:
        write_shards(directory, args.shards, args.shard_mb)
        child = subprocess.Popen([sys.executable, __file__, "--serve-child", directory, args.shape],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            endpoints = json.loads(child.stdout.readline())
            urls = [f"s3://bench/{n}" for n in sorted(os.listdir(directory))]
            want = read_all(urls, {"endpoint_url": endpoints["direct"]})["keys"]
            rows = []
            load = [os.getloadavg()[0]]
            one = read_all(urls, {"endpoint_url": endpoints["shaped"], "parts_in_flight": 1, "part_bytes": 1 << 30})
            rows.append(("1 GET per shard", "whole", one["mb_per_s"], one["io"]))
            print(f"one connection: {one['mb_per_s']:.2f} MB/s", flush=True)
            series = {}
            for part_mb in [float(v) for v in args.part_mb.split(",")]:
                for k in [int(v) for v in args.parts.split(",")]:
                    options = {"endpoint_url": endpoints["shaped"], "parts_in_flight": k, "part_bytes": int(part_mb * MiB)}
                    runs = [read_all(urls, options) for _ in range(args.repeats)]
                    assert all(r["keys"] == want for r in runs), "keys differ from a direct read"
                    rate = statistics.median(r["mb_per_s"] for r in runs)
                    series.setdefault(part_mb, []).append((k, rate))
                    rows.append((k, f"{part_mb:g} MiB", rate, runs[-1]["io"]))
                    print(f"K={k:3d} P={part_mb:g} MiB: {rate:6.2f} MB/s ({rate / one['mb_per_s']:.1f}x one connection), "
                          f"peak in flight {runs[-1]['io']['peak_in_flight']}, "
                          f"peak buffered {runs[-1]['io']['peak_buffered_bytes'] / MiB:.1f} MiB", flush=True)
            tracemalloc.start()
            default = read_all(urls, {"endpoint_url": endpoints["shaped"]})
            traced = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            load.append(os.getloadavg()[0])
        finally:
            child.stdin.close()
            child.wait(30)
    print(f"\ndefaults: {default['mb_per_s']:.2f} MB/s = {default['mb_per_s'] / one['mb_per_s']:.1f}x one connection; "
          f"peak Python allocations while reading {traced / MiB:.1f} MiB (read_ahead_bytes 64 MiB), "
          f"counters {default['io']}")
    print(f"\nshape {args.shape}, {args.shards} shards x {args.shard_mb:g} MB, load average {load[0]:.1f} → {load[1]:.1f}\n")
    print("| parts in flight K | part size P | MB/s | × one connection | peak in flight | peak buffered MiB |")
    print("|---|---|---|---|---|---|")
    for k, part, rate, io in rows:
        print(f"| {k} | {part} | {rate:.1f} | {rate / one['mb_per_s']:.1f} | {io['peak_in_flight']} | "
              f"{io['peak_buffered_bytes'] / MiB:.1f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for part_mb, points in series.items():
        ax.plot([k for k, _ in points], [r for _, r in points], marker="o", label=f"P = {part_mb:g} MiB")
    ax.axhline(one["mb_per_s"], color="grey", linestyle="--", label="one GET per shard")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("parts in flight K (parts_in_flight)")
    ax.set_ylabel("one worker, MB/s")
    ax.set_title(f"S3 (moto) through {args.shape} per connection")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"\nplot written to {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-child":
        serve(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
