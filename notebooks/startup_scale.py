"""Start-up at scale on local disk: ``Stream.open`` on N shards with a counts-only manifest.

Makes N small shard files in FOLDER (each a real one-sample tar, each its own file) and their
counts-only manifest written by dalistream's own writer (``write_manifest``), and a wids shard
index of them beside the folder (``FOLDER.wids.json``), then times ``Stream.open`` in fresh
processes: the folder, a brace pattern and a glob naming the shards, each with a fresh cache
directory (the first rank of a node, rank 0: the manifest parsed) and with the cache another rank
filled (``--rank``: the rows mapped back), as medians of ``--repeats`` alternating runs.
``--manifest wids`` names the wids index (``manifest=``), and no manifest lies beside the shards
(it is kept as ``FOLDER.manifest.json`` meanwhile). The time of ``loader.state_dict()``'s first content versions (a ``stat`` per shard)
is timed too (``--versions``)::

    python notebooks/startup_scale.py /tmp/startup-500k --shards 500000 --repeats 5 [--profile FORM]
    python notebooks/startup_scale.py /tmp/startup-500k --manifest wids --rank 5 --world-size 1024 --workers 8 \
        --batch-size 8

``--profile FORM`` (folder, braces or glob) prints cProfile's top entries for one open instead;
``--code DIR`` times another checkout's dalistream too (e.g. a worktree of an older commit),
alternating with this one.
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


def make(folder: str, shards: int, beside: bool) -> None:
    """The N shards, their manifest (in FOLDER when ``beside``, else kept as FOLDER.manifest.json)
    and their wids index, unless FOLDER already holds exactly them."""
    from dalistream.manifest import DEFAULT_NAME, ShardInfo, write_manifest

    manifest, away = os.path.join(folder, DEFAULT_NAME), folder + ".manifest.json"
    names = [f"part-{i:06d}.tar" for i in range(shards)]
    if os.path.exists(away) and not os.path.exists(manifest):
        os.rename(away, manifest)
    if os.path.exists(manifest) and len(os.listdir(folder)) == shards + 1 and os.path.exists(folder + ".wids.json"):
        if not beside:
            os.rename(manifest, away)
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
    base = os.path.basename(folder)  # (a wids index names its shards relative to itself)
    with open(folder + ".wids.json", "w") as f:
        json.dump({"__kind__": "wids-shard-index-v1", "wids_version": 1,
                   "shardlist": [{"url": f"{base}/{n}", "nsamples": 1, "filesize": len(data)} for n in names]}, f)
    if not beside:
        os.rename(manifest, away)
    print(f"wrote {shards} shards and {manifest} in {time.perf_counter() - began:.1f} s", file=sys.stderr)


FORMS = {"folder": lambda folder, n: folder + "/",
         "braces": lambda folder, n: f"{folder}/part-{{000000..{n - 1:06d}}}.tar",
         "glob": lambda folder, n: f"{folder}/part-*.tar"}

CHILD = r"""
import json, sys, time
import dalistream
source, cache, state, opened = sys.argv[1], sys.argv[2], sys.argv[3] == "1", json.loads(sys.argv[4])
began, cpu = time.perf_counter(), time.process_time()
stream = dalistream.Stream.open(source, fields={"cls": "cls"}, device="cpu", cache_dir=cache, **opened)
out = {"open_s": time.perf_counter() - began, "open_cpu_s": time.process_time() - cpu, "shards": len(stream.urls),
       "source": stream.data.count_source}
if state:
    from dalistream.loader.state import content_identity
    began, cpu = time.perf_counter(), time.process_time()
    content_identity(stream.urls, stream.config.storage_options)
    out["versions_s"], out["versions_cpu_s"] = time.perf_counter() - began, time.process_time() - cpu
print(json.dumps(out))
"""


def once(source: str, cache: str, opened: dict, state: bool = False, code: str = "") -> dict:
    env = dict(os.environ, PYTHONPATH=code, PYTHONDONTWRITEBYTECODE="1") if code else None
    done = subprocess.run([sys.executable, "-c", CHILD, source, cache, "1" if state else "0", json.dumps(opened)],
                          check=True,
                          capture_output=True, text=True, env=env, cwd="/")  # (not a checkout's root: it would be imported)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--shards", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forms", default="folder,braces,glob")
    parser.add_argument("--profile", choices=sorted(FORMS))
    parser.add_argument("--versions", action="store_true", help="also time the state's content versions")
    parser.add_argument("--code", default="", help="another checkout's root: its dalistream is timed too, alternating")
    parser.add_argument("--manifest", choices=["beside", "wids"], default="beside",
                        help="the manifest beside the shards, found unnamed; or the wids index, named (manifest=)")
    parser.add_argument("--rank", type=int, default=0, help="the rank of the run with the cache filled (the first: 0)")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    folder = os.path.abspath(args.folder)
    make(folder, args.shards, beside=args.manifest == "beside")
    first = {"rank": 0, "world_size": args.world_size, "workers": args.workers, "batch_size": args.batch_size}
    if args.manifest == "wids":
        first["manifest"] = folder + ".wids.json"
    later = dict(first, rank=args.rank)
    if args.profile:
        import cProfile
        import pstats

        import dalistream

        with tempfile.TemporaryDirectory() as cache:
            source = FORMS[args.profile](folder, args.shards)
            for warm in (False, True):
                profile = cProfile.Profile()
                profile.enable()
                dalistream.Stream.open(source, fields={"cls": "cls"}, device="cpu", cache_dir=cache,
                                       **(later if warm else first))
                profile.disable()
                print(f"--- {args.profile}, {'cache filled' if warm else 'fresh cache'}")
                pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
        return
    forms = [f for f in args.forms.split(",") if f]
    systems = {"this checkout": ""} if not args.code else {"this checkout": "", args.code: args.code}
    times: dict = {}
    versions: dict = {}
    load = os.getloadavg()[0]
    for repeat in range(args.repeats):  # the checkouts alternate, form by form
        for form in forms:
            for name, code in systems.items():
                with tempfile.TemporaryDirectory() as cache:
                    fresh = once(FORMS[form](folder, args.shards), cache, first, code=code)
                    filled = once(FORMS[form](folder, args.shards), cache, later, args.versions and form == forms[0], code)
                assert fresh["shards"] == filled["shards"] == args.shards, (fresh, filled)
                for warm, got in (("fresh", fresh), ("filled", filled)):
                    for kind in ("open_s", "open_cpu_s"):
                        times.setdefault((name, form, warm, kind), []).append(got[kind])
                if "versions_s" in filled:
                    versions.setdefault(name, []).append((filled["versions_s"], filled["versions_cpu_s"]))
                print(f"[{repeat + 1}/{args.repeats}] {name}, {form}: {fresh['open_s']:.2f} s ({fresh['open_cpu_s']:.2f} s "
                      f"CPU) fresh cache, {filled['open_s']:.2f} s ({filled['open_cpu_s']:.2f} s CPU) filled, load "
                      f"{os.getloadavg()[0]:.1f} ({fresh['source']})", file=sys.stderr, flush=True)
    manifest = "a wids index named" if args.manifest == "wids" else "the counts-only manifest beside the shards"
    print(f"Stream.open at {args.shards:,} local shards, {manifest}, rank 0 then {args.rank} of {args.world_size}, "
          f"{args.workers} workers, medians of {args.repeats} "
          f"(load average {load:.1f} → {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs):")
    print("| code | source | rank 0, fresh cache: s (CPU s) | rank "
          f"{args.rank}, cache filled by another rank: s (CPU s) |")
    print("|---|---|---|---|")

    def median(*key: str) -> str:
        return f"{statistics.median(times[key + ('open_s',)]):.2f} ({statistics.median(times[key + ('open_cpu_s',)]):.2f})"

    for form in forms:
        for name in systems:
            print(f"| {name} | {form} `{FORMS[form]('FOLDER', args.shards)}` | {median(name, form, 'fresh')} | "
                  f"{median(name, form, 'filled')} |")
    for name, got in versions.items():
        print(f"{name}: content versions for a state (a stat per shard, {args.shards:,} shards): median "
              f"{statistics.median(g[0] for g in got):.2f} s ({statistics.median(g[1] for g in got):.2f} s CPU)")


if __name__ == "__main__":
    main()
