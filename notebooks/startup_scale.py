"""Start-up at scale on local disk: ``Stream.open`` on N shards with a counts-only manifest.

Makes N small shard files in FOLDER (each a real one-sample tar, each its own file) and their
counts-only manifest written by dalistream's own writer (``write_manifest``), then times
``Stream.open`` in fresh processes: the folder, a brace pattern and a glob naming the shards,
each with a fresh cache directory (the first rank of a node: the manifest parsed) and with the
cache another rank filled (the rows mapped back), as medians of ``--repeats`` alternating runs.
The time of ``loader.state_dict()``'s first content versions (a ``stat`` per shard) is timed too::

    python notebooks/startup_scale.py /tmp/startup-500k --shards 500000 --repeats 5 [--profile FORM]

``--profile FORM`` (folder, braces or glob) prints cProfile's top entries for one open instead.
The shards are kept for later runs (the manifest says they are whole); the load average is printed
with the figures, as they are noisy on a shared machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time


def tiny_shard() -> bytes:
    """One sample (``000000.cls``) as a tar: 2 kB."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("000000.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    data = out.getvalue()
    return data.rstrip(b"\0") + b"\0" * (2048 - len(data.rstrip(b"\0")))  # header, data, end blocks


def make(folder: str, shards: int) -> None:
    """The N shards and their manifest, unless FOLDER already holds exactly them."""
    from dalistream.manifest import DEFAULT_NAME, ShardInfo, write_manifest

    manifest = os.path.join(folder, DEFAULT_NAME)
    names = [f"part-{i:06d}.tar" for i in range(shards)]
    if os.path.exists(manifest) and len(os.listdir(folder)) == shards + 1:
        return
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    data = tiny_shard()
    began = time.perf_counter()
    for name in names:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    write_manifest([ShardInfo(os.path.join(folder, n), 1, len(data)) for n in names], manifest)
    print(f"wrote {shards} shards and {manifest} in {time.perf_counter() - began:.1f} s", file=sys.stderr)


FORMS = {"folder": lambda folder, n: folder + "/",
         "braces": lambda folder, n: f"{folder}/part-{{000000..{n - 1:06d}}}.tar",
         "glob": lambda folder, n: f"{folder}/part-*.tar"}

CHILD = r"""
import json, sys, time
import dalistream
source, cache, state = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
began = time.perf_counter()
stream = dalistream.Stream.open(source, fields={"cls": "cls"}, batch_size=64, workers=2, rank=0, world_size=8,
                                device="cpu", cache_dir=cache)
opened = time.perf_counter() - began
out = {"open_s": opened, "shards": len(stream.urls), "source": stream.data.count_source}
if state:
    from dalistream.loader.state import content_identity
    began = time.perf_counter()
    content_identity(stream.urls, stream.config.storage_options)
    out["versions_s"] = time.perf_counter() - began
print(json.dumps(out))
"""


def once(source: str, cache: str, state: bool = False) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, source, cache, "1" if state else "0"], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--shards", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forms", default="folder,braces,glob")
    parser.add_argument("--profile", choices=sorted(FORMS))
    parser.add_argument("--versions", action="store_true", help="also time the state's content versions")
    args = parser.parse_args()
    folder = os.path.abspath(args.folder)
    make(folder, args.shards)
    if args.profile:
        import cProfile
        import pstats

        import dalistream

        with tempfile.TemporaryDirectory() as cache:
            source = FORMS[args.profile](folder, args.shards)
            for warm in (False, True):
                profile = cProfile.Profile()
                profile.enable()
                dalistream.Stream.open(source, fields={"cls": "cls"}, batch_size=64, workers=2, rank=0, world_size=8,
                                       device="cpu", cache_dir=cache)
                profile.disable()
                print(f"--- {args.profile}, {'cache filled' if warm else 'fresh cache'}")
                pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
        return
    forms = [f for f in args.forms.split(",") if f]
    times = {(form, warm): [] for form in forms for warm in ("fresh", "filled")}
    versions = []
    load = os.getloadavg()[0]
    for repeat in range(args.repeats):
        for form in forms:
            with tempfile.TemporaryDirectory() as cache:
                fresh = once(FORMS[form](folder, args.shards), cache)
                filled = once(FORMS[form](folder, args.shards), cache, state=args.versions and form == forms[0])
            assert fresh["shards"] == filled["shards"] == args.shards, (fresh, filled)
            times[(form, "fresh")].append(fresh["open_s"])
            times[(form, "filled")].append(filled["open_s"])
            if "versions_s" in filled:
                versions.append(filled["versions_s"])
            print(f"[{repeat + 1}/{args.repeats}] {form}: {fresh['open_s']:.2f} s fresh cache, "
                  f"{filled['open_s']:.2f} s filled ({fresh['source']})", file=sys.stderr, flush=True)
    print(f"Stream.open at {args.shards:,} local shards, counts-only manifest, medians of {args.repeats} "
          f"(load average {load:.1f} → {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs):")
    print("| source | fresh cache (s) | cache filled by another rank (s) |")
    print("|---|---|---|")
    for form in forms:
        print(f"| {form} `{FORMS[form]('FOLDER', args.shards)}` | {statistics.median(times[(form, 'fresh')]):.2f} | "
              f"{statistics.median(times[(form, 'filled')]):.2f} |")
    if versions:
        print(f"content versions for a state (a stat per shard): median {statistics.median(versions):.2f} s")


if __name__ == "__main__":
    main()
