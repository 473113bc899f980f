"""Command line: ``dalistream synth|plan|index|keys|bench|demo``.

Environment variables are read here (and in :meth:`Stream.open`), never inside library stages.
With ``--json`` a command prints only JSON on stdout; progress bars go to stderr on a terminal.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import List, Optional

from .errors import DalistreamError, redact
from .stream import default_cache_dir
from .tools import demo
from .tools.args import add_stream_args, emit, progress_bar, storage_options
from .tools.bench import runner as bench

log = logging.getLogger("dalistream")


# -- synth ---------------------------------------------------------------------------------------

def cmd_synth(args: argparse.Namespace) -> int:
    from .tools.synth import SynthSpec, write_dataset

    spec = SynthSpec(shards=args.shards, samples_per_shard=args.samples_per_shard, uneven=args.uneven,
                     seed=args.seed, classes=args.classes)
    paths = write_dataset(args.out_dir, spec)
    emit(args, {"shards": paths}, f"wrote {len(paths)} shards to {args.out_dir}")
    return 0


# -- plan ----------------------------------------------------------------------------------------

def cmd_plan(args: argparse.Namespace) -> int:
    from .manifest import count_shards
    from .plan import Layout, Schedule, owned_shards, steps_per_epoch
    from .sources import expand_sources

    urls = expand_sources(args.sources, storage_options(args))
    counts = None
    problems: list = []
    if not args.no_counts:
        infos, problems = count_shards(urls, manifest=args.manifest, options=storage_options(args),
                                       cache_dir=default_cache_dir(os.environ), tolerant=args.on_error == "skip")
        counts = [i.samples for i in infos]
    layout = Layout(args.world_size, args.workers, args.batch_size)
    schedule = Schedule(args.seed, args.policy, args.batches_per_epoch)
    slots = layout.slots
    rows = []
    for r in range(args.world_size):
        steps = (steps_per_epoch(counts, layout, schedule, args.epoch, r)
                 if counts is not None or args.policy == "fixed" else None)
        for w in range(args.workers):
            owned = owned_shards(len(urls), layout, schedule, args.epoch, r, w)
            rows.append({
                "rank": r, "worker": w, "global_worker": r * args.workers + w, "slot": slots[w],
                "shards": [redact(urls[i]) for i in owned],  # a pipe: command may hold a credential
                "samples": sum(counts[i] for i in owned) if counts is not None else None, "steps": steps,
            })
    payload = {"epoch": args.epoch, "seed": args.seed, "world_size": args.world_size, "workers": args.workers,
               "batch_size": args.batch_size, "policy": args.policy, "plan": rows}
    if args.on_error == "skip":  # shards counted only up to their damage
        payload.update(skipped_shards=len(problems), errors=[p.fields() for p in problems])
    if args.json:
        emit(args, payload)
    else:
        for row in rows:
            print(f"rank {row['rank']} worker {row['worker']} (g={row['global_worker']}, slot {row['slot']}): "
                  f"{len(row['shards'])} shards, {row['samples']} samples, {row['steps']} steps")
            for url in row["shards"]:
                print(f"    {url}")
    return 0


# -- index ---------------------------------------------------------------------------------------

def cmd_index(args: argparse.Namespace) -> int:
    from .manifest import count_shards, write_manifest
    from .sources import expand_sources

    urls = expand_sources(args.sources, storage_options(args))
    with progress_bar(args, total=len(urls), unit="shard") as bar:
        # skip: a bad shard is counted up to its problem, reported, not fatal
        infos, problems = count_shards(urls, options=storage_options(args), offsets=args.offsets,
                                       tolerant=args.on_error == "skip", progress=lambda info: bar.update(1))
    if args.output:
        write_manifest(infos, args.output, storage_options(args))
    payload = {"shards": [i.__dict__ for i in infos], "samples": sum(i.samples for i in infos), "output": args.output,
               "skipped_shards": len(problems), "errors": [p.fields() for p in problems]}
    text = "\n".join(f"{i.samples:8d} samples {i.bytes:12d} bytes  {i.url}" for i in infos)
    text += f"\n{payload['samples']} samples in {len(infos)} shards"
    if problems:
        text += f"\n{len(problems)} shards could not be read to their end (counted up to the problem):"
        text += "".join(f"\n    {p}" for p in problems)
    emit(args, payload, text)
    return 0


# -- keys ----------------------------------------------------------------------------------------

def cmd_keys(args: argparse.Namespace) -> int:
    from .loader import Loader
    from .stream import Stream
    from .worker import skip_totals

    stream = Stream.open(
        args.sources, fields={"key": "__key__"}, batch_size=args.batch_size, workers=args.workers,
        rank=args.rank, world_size=args.world_size, device="cpu", seed=args.seed, shuffle=args.shuffle,
        policy=args.policy, batches_per_epoch=args.batches_per_epoch, manifest=args.manifest,
        on_error=args.on_error, storage_options=storage_options(args), start_method=args.start_method,
    )
    with Loader(stream) as loader:
        if args.state_in:
            with open(args.state_in) as f:
                loader.load_state_dict(json.load(f))
        else:
            loader.set_epoch(args.epoch)
        done = 0
        bar = progress_bar(args, total=max(0, len(loader) - loader.step), unit="batch")
        for batch in (loader if args.stop_after != 0 else ()):
            bar.update(1)
            print(json.dumps({"rank": stream.config.rank, "epoch": loader.epoch, "step": loader.step - 1,
                              "keys": batch["key"]}), flush=True)
            done += 1
            if args.stop_after is not None and done >= args.stop_after:
                break
        bar.close()
        if args.state_out:
            with open(args.state_out, "w") as f:
                json.dump(loader.state_dict(), f)
        # counters: exact at the end of an epoch (the workers' last write is awaited briefly); the
        # skip counters at the top are those of the epoch printed (workers read ahead into the next)
        stats = loader.stats(wait_s=2.0 if loader.step == 0 else 0.0)
        ran = loader.epoch - 1 if loader.step == 0 else loader.epoch
        stats.update(stats["by_epoch"].get(ran, skip_totals({})))
        if not args.json:
            print(json.dumps({"stats": stats}), file=sys.stderr)
        elif args.on_error != "raise":  # the skip counters close the JSON lines
            print(json.dumps({"stats": stats}), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dalistream", description="Stream WebDataset shards through DALI into PyTorch.")
    parser.add_argument("--log-level", default=os.environ.get("DALISTREAM_LOG", "WARNING"), help="logging level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("synth", help="write a small synthetic WebDataset (JPEG/PNG images, cls labels, txt captions)")
    p.add_argument("out_dir")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples-per-shard", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--uneven", action="store_true", help="vary the number of samples per shard")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("plan", help="show which shards each (rank, worker) owns and the batches that gives")
    add_stream_args(p)
    p.set_defaults(world_size=1)
    p.add_argument("--no-counts", action="store_true", help="do not scan shards for sample counts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("index", help="count samples and bytes per shard; write a manifest")
    add_stream_args(p, batch=False)
    p.add_argument("-o", "--output", default=None, help="manifest file to write (local path or s3://)")
    p.add_argument("--offsets", action="store_true",
                   help="also record each sample's tar offset: a mid-shard resume then seeks (ranged GET) to it")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("keys", help="run the real pipeline for one rank and print the sample keys of each batch")
    add_stream_args(p)
    p.add_argument("--stop-after", type=int, default=None, metavar="K", help="stop after K batches")
    p.add_argument("--state-out", default=None, metavar="FILE", help="write the loader state (to resume from) here")
    p.add_argument("--state-in", default=None, metavar="FILE", help="resume from a state written by --state-out")
    p.add_argument("--json", action="store_true",
                   help="only JSON lines on stdout, one per batch; with --on-error skip a last line {\"stats\": …} "
                        "holds the skip counters (without --json the stats go to stderr)")
    p.set_defaults(func=cmd_keys)

    bench.add_parser(sub)
    demo.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except DalistreamError as e:
        print(f"dalistream {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `dalistream keys ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
