"""Command line: ``dalistream synth|write|plan|index|keys|stats|bench|demo``.

Environment variables are read here (and in :meth:`Stream.open`), never inside library stages.
With ``--json`` a command prints only JSON on stdout; progress bars go to stderr on a terminal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import traceback
from typing import List, Optional

from .errors import DalistreamError, redact
from .stream import default_cache_dir
from .tools import demo, planview, runstats
from .tools.args import (LOG_LEVELS, HelpFormatter, add_log_level, add_stream_args, affinity_options, emit,
                         flag_spelling, mix_options, progress_bar, storage_options, stream_buckets, stream_sources)
from .tools.bench import runner as bench

log = logging.getLogger("dalistream")


# -- synth ---------------------------------------------------------------------------------------

def cmd_synth(args: argparse.Namespace) -> int:
    from .tools.synth import SynthSpec, write_shards

    spec = SynthSpec(shards=args.shards, samples_per_shard=args.samples_per_shard, uneven=args.uneven,
                     seed=args.seed, classes=args.classes, prefix=args.prefix)
    written = write_shards(args.out_dir, spec)
    samples = sum(n for _, n in written)
    emit(args, {"shards": [path for path, _ in written], "samples": samples, "samples_per_shard": [n for _, n in written],
                "out_dir": args.out_dir},
         f"wrote {samples} samples in {len(written)} shards to {args.out_dir}")
    return 0


# -- write ---------------------------------------------------------------------------------------

def cmd_write(args: argparse.Namespace) -> int:
    import signal

    from .writer import bad_files, write

    def terminated(signum: int, frame: object) -> None:  # stop the writer's processes and leave a set a read refuses
        raise SystemExit(128 + signum)

    # (restored after: cmd_write may run inside a caller's process, whose later children inherit it)
    before = signal.signal(signal.SIGTERM, terminated)
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    try:
        with progress_bar(args, total=0, unit="sample") as bar:
            def listed(total: int) -> None:
                bar.total = total
                bar.refresh()

            done = write(args.source, args.output, samples_per_shard=args.samples_per_shard,
                         shuffle=not args.no_shuffle, seed=args.seed, prefix=args.prefix, processes=args.processes,
                         on_bad=args.on_bad, overwrite=args.overwrite, storage_options=options, progress=bar.update,
                         on_listed=listed)
    except SystemExit as e:
        if e.code == 128 + signal.SIGTERM:
            print("dalistream write: stopped by SIGTERM; the write did not finish (a read of the output refuses it)",
                  file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, before)
    classes = f", {len(done['classes'])} classes" if done["classes"] else ""
    skipped = ""
    if done["skipped"]:
        shown = "; ".join(f"{path}: {problem}" for path, problem in done["bad"][:10])
        skipped = (f"; {done['skipped']} bad {bad_files(done['bad'])[0]} left out "
                   f"({shown}{' …' if done['skipped'] > 10 else ''})")
    text = (f"wrote {done['samples']} samples{classes} in {done['shards']} shards to {redact(args.output)} "
            f"(manifest {redact(done['manifest'])}){skipped}")
    if done["classes"]:
        text += "\n" + class_map(done["classes"])
    emit(args, {k: v for k, v in done.items() if k != "urls"}, text)
    return 0


CLASSES_SHOWN = 50  # class labels listed by `dalistream write` (the manifest holds them all)


def class_map(classes: List[str]) -> str:
    """The labels an image folder's classes got (the ``cls`` member of each sample): ``0 cat, 1 dog``."""
    shown = ", ".join(f"{label} {name}" for label, name in enumerate(classes[:CLASSES_SHOWN]))
    more = f", … (all {len(classes)} under \"classes\" in the manifest)" if len(classes) > CLASSES_SHOWN else ""
    return f"labels (cls): {shown}{more}"


# -- plan ----------------------------------------------------------------------------------------

def cmd_plan(args: argparse.Namespace) -> int:
    return planview.run(args, default_cache_dir(os.environ))


# -- index ---------------------------------------------------------------------------------------

def cmd_index(args: argparse.Namespace) -> int:
    from .manifest import count_shards, default_location, write_manifest
    from .sources import expand_sources

    urls = expand_sources(args.sources, storage_options(args))
    with progress_bar(args, total=len(urls), unit="shard") as bar:
        # skip: a bad shard is counted up to its problem, reported, not fatal
        infos, problems = count_shards(urls, options=storage_options(args), offsets=not args.no_offsets,
                                       tolerant=args.on_error == "skip", progress=lambda info: bar.update(1),
                                       discover=False)
    if args.no_members:
        infos = [dataclasses.replace(i, members=None) for i in infos]
    if args.keys:  # per-sample keys for buckets: reads the chosen members' data
        from .manifest.keys import KeySpec, with_keys

        spec = KeySpec.parse(args.keys)
        with progress_bar(args, total=len(urls), unit="shard") as bar:
            infos, key_problems = with_keys(infos, spec, storage_options(args), tolerant=args.on_error == "skip",
                                            progress=lambda info: bar.update(1))
    if args.output is None:  # next to the shards, where Stream.open looks without being told
        args.output = default_location(urls)
    if args.output == "-":
        args.output = None
    if args.output:
        write_manifest(infos, args.output, storage_options(args))
    payload = {"shards": [i.__dict__ for i in infos], "samples": sum(i.samples for i in infos), "output": args.output,
               "skipped_shards": len(problems), "errors": [p.fields() for p in problems]}
    text = "\n".join(f"{i.samples:8d} samples {i.bytes:12d} bytes  {i.url}" for i in infos)
    text += f"\n{payload['samples']} samples in {len(infos)} shards"
    if problems:
        text += f"\n{len(problems)} shards could not be read to their end (counted up to the problem):"
        text += "".join(f"\n    {p}" for p in problems)
    if args.keys:
        found = {name: sum(sum(v >= 0 for v in i.keys.get(name, ())) for i in infos if i.keys) for name in spec.columns}
        text += "\nbucket keys: " + ", ".join(f"{name} of {n} samples" for name, n in found.items())
        payload["key_errors"] = [p.fields() for p in key_problems]
        if key_problems:  # on_error="skip": those samples' keys are -1 (unknown)
            text += f"\n{len(key_problems)} samples' bucket keys could not be read (left unknown):"
            text += "".join(f"\n    {p}" for p in key_problems)
    if args.output:
        text += f"\nwrote manifest {redact(args.output)} ({len(infos)} shards, {payload['samples']} samples)"
    emit(args, payload, text)
    return 0


# -- keys ----------------------------------------------------------------------------------------

def cmd_keys(args: argparse.Namespace) -> int:
    from .loader import Loader, read_state_file, write_state_file
    from .loader.state import naming
    from .stream import Stream

    mixed = bool(args.mix)
    stream = Stream.open(
        stream_sources(args), fields={"key": "__key__", **({"source": "__source__"} if mixed else {})},
        batch_size=args.batch_size, workers=args.workers,
        rank=args.rank, world_size=args.world_size, device="cpu", seed=args.seed, shuffle=args.shuffle,
        interleave=args.interleave,
        policy=args.policy, batches_per_epoch=args.batches_per_epoch, manifest=args.manifest,
        on_error=args.on_error, storage_options=storage_options(args), start_method=args.start_method,
        buckets=stream_buckets(args), **mix_options(args), **affinity_options(args),
    )
    with Loader(stream) as loader:
        if args.state_in:
            with naming(args.state_in):
                loader.load_state_dict(read_state_file(args.state_in))
        else:
            loader.set_epoch(args.epoch)
        done = delivered = 0
        bar = progress_bar(args, total=len(loader), unit="batch")  # what this iteration yields
        for batch in (loader if args.stop_after != 0 else ()):
            bar.update(1)
            keys = [f"{s}:{k}" for s, k in zip(batch["source"], batch["key"])] if mixed else batch["key"]
            bucket = {"bucket": int(batch["bucket"][0]) if len(batch["bucket"]) else -1} if "bucket" in batch else {}
            if args.json:
                print(json.dumps({"rank": stream.config.rank, "epoch": loader.epoch, "step": loader.step - 1,
                                  **bucket, "keys": keys}), flush=True)
            else:
                print(f"rank {stream.config.rank} epoch {loader.epoch} step {loader.step - 1}"
                      + (f" bucket {bucket['bucket']}" if bucket else "") + ": " + " ".join(keys), flush=True)
            done += 1
            delivered += len(batch["key"])
            if args.stop_after is not None and done >= args.stop_after:
                break
        bar.close()
        if args.state_out:
            write_state_file(args.state_out, loader.state_dict())
        # counters of the epochs printed (the workers' read-ahead into the next is counted there),
        # once every worker has written them up to the batches taken (awaited briefly)
        stats = loader.stats(wait_s=10.0)  # returns as soon as they have: seconds only on a stalled machine
        stats.update(delivered=delivered, batches=done, rank=stream.config.rank,  # what was printed above, exactly
                     world_size=stream.config.world_size, read_ahead=max(0, stats.get("samples", 0) - delivered))
        if not args.json:
            print(stats_text(stats), file=sys.stderr)
        else:  # the counters close the JSON lines, in every mode
            print(json.dumps({"stats": stats}), flush=True)
    return 0


def stats_text(stats: dict) -> str:
    """The counters of ``dalistream keys`` for people, of this rank: samples delivered (the keys
    printed), samples the workers read (delivered, and read ahead of the batches taken when
    stopped early), padding, samples the plan left out, skips by reason."""
    text = (f"stats (rank {stats.get('rank', 0)} of {stats.get('world_size', 1)}): {stats.get('delivered', 0)} "
            f"samples delivered in {stats.get('batches', 0)} batches; {stats.get('samples', 0)} samples read, "
            f"{stats.get('read_ahead', 0)} of them ahead of the batches taken; {stats.get('padded', 0)} padding "
            f"positions, {stats.get('dropped', 0)} samples left out by the plan")
    skipped = stats.get("skipped") or {}
    for kind in ("shards", "samples"):
        reasons = skipped.get(kind) or {}
        if reasons:
            text += f"; skipped {kind}: " + ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
    return text


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="dalistream", description="Stream WebDataset shards through DALI into PyTorch.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_log_level(parser, default=os.environ.get("DALISTREAM_LOG", "WARNING"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("synth", help="write a small synthetic WebDataset (JPEG/PNG images, cls labels, txt captions)")
    p.add_argument("out_dir", help="directory to write the shards to (created if missing)")
    p.add_argument("--shards", type=int, default=8, help="number of shards")
    p.add_argument("--samples-per-shard", type=int, default=64, help="samples per shard (varied around it with --uneven)")
    p.add_argument("--classes", type=int, default=10, help="number of classes (labels 0 .. N-1)")
    p.add_argument("--uneven", action="store_true", help="vary the number of samples per shard")
    p.add_argument("--seed", type=int, default=0, help="random seed of images, labels and sizes")
    p.add_argument("--prefix", default="synth", help="shard names: PREFIX-00000.tar, PREFIX-00001.tar, …")
    p.add_argument("--json", action="store_true", help="print one JSON object (shards, samples) instead of a sentence")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("write", help="your images, videos or audio files (a folder per class, or a CSV/JSONL of "
                                     "path,label[,caption]) into shuffled WebDataset shards with a manifest (each "
                                     "file's keys: an image's size, a video's or audio file's duration, …)")
    p.add_argument("source", help="a folder with one sub-folder per class, or a .csv/.jsonl listing")
    p.add_argument("output", help="folder (created) or a store's prefix (s3://, gs://, az://, hf://) to write the shards and manifest to")
    p.add_argument("--samples-per-shard", type=int, default=1000, help="samples per shard (the last one may hold fewer)")
    p.add_argument("--no-shuffle", action="store_true", help="keep the input order (default: shuffled across shards)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle")
    p.add_argument("--prefix", default="train", help="shard names: PREFIX-00000.tar, PREFIX-00001.tar, …")
    p.add_argument("--processes", type=int, default=None, help="shards written at once (default: the machine's cores)")
    p.add_argument("--on-bad", choices=("error", "skip"), default="error",
                   help="files the loader would refuse (0 bytes, cut short, not an image; a video or audio file "
                        "PyAV cannot read to its end): stop, naming every one "
                        "once all are checked, and keep no shard (error), or leave them out, counted and named (skip)")
    p.add_argument("--overwrite", action="store_true", help="replace the set the output already holds")
    p.add_argument("--endpoint-url", default=None, help="the output store's endpoint (an S3-compatible server, a GCS emulator, an Azure blob endpoint, a Hub mirror)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a sentence")
    p.set_defaults(func=cmd_write)

    p = sub.add_parser("plan", help="what an epoch's plan costs (samples left out, padding samples, shards split "
                                    "between workers) and which worker of which rank reads which shards")
    groups = add_stream_args(p, sources_required=False, planning=True)
    groups["data"].add_argument("--no-counts", action="store_true", help="do not scan shards for sample counts")
    planview.add_arguments(p, groups)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("index", help="count samples and bytes per shard; write a manifest")
    add_stream_args(p, batch=False, loader=False)
    p = p.add_argument_group("manifest: what it records and where")
    p.add_argument("-o", "--output", default=None,
                   help="manifest file to write (a local path or a store's URL); default: dalistream-manifest.json in the "
                        "shards' folder, where loaders find it unnamed; '-' writes none")
    p.add_argument("--offsets", action="store_true",
                   help="record each sample's tar offset (the default; kept for old scripts)")
    p.add_argument("--no-offsets", action="store_true",
                   help="omit sample offsets: a worker whose span starts inside a shard then skips headers to it")
    p.add_argument("--no-members", action="store_true",
                   help="omit the member layouts of regular shards (a smaller manifest; workers then parse every "
                        "tar header instead of cutting samples out by the layout)")
    p.add_argument("--keys", default=None, metavar="SPEC",
                   help="record each sample's bucket keys, which buckets sort samples by (`dalistream keys "
                        "--buckets`), reading those members' data: 'image' = width and height from each sample's "
                        "JPEG/PNG/WebP header ('image:EXT' for member EXT), 'video' = width, height, frames, "
                        "duration_ms, fps_milli, codec of its video, 'audio' = duration_ms, sample_rate, channels of "
                        "its audio (PyAV probes them: the video extra), any other EXT = the byte length of member "
                        "EXT; e.g. --keys image,txt or --keys video")
    p.add_argument("--json", action="store_true", help="print one JSON object (shards, samples, errors) instead of a table")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("keys", help="run the real pipeline for one rank and print each batch's sample keys (the "
                                    "samples' names in their shards, __key__; SOURCE:KEY for a --mix)")
    add_stream_args(p, sources_required=False)
    p.set_defaults(func=cmd_keys)
    p = p.add_argument_group("output and state")
    p.add_argument("--stop-after", type=int, default=None, metavar="K", help="stop after K batches")
    p.add_argument("--state-out", default=None, metavar="FILE", help="write the loader state (to resume from) here")
    p.add_argument("--state-in", default=None, metavar="FILE", help="resume from a state written by --state-out")
    p.add_argument("--json", action="store_true",
                   help="only JSON lines on stdout, one per batch; with --on-error skip a last line {\"stats\": …} "
                        "holds the skip counters (without --json: one line 'rank R epoch E step S: KEY …' per batch, "
                        "and the counters on stderr)")

    runstats.add_parser(sub)
    bench.add_parser(sub)
    demo.add_parser(sub)
    for command in sub.choices.values():  # every subcommand: defaults in --help, --log-level after it too
        command.formatter_class = HelpFormatter
        add_log_level(command)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if str(args.log_level).upper() not in LOG_LEVELS:  # the default, from DALISTREAM_LOG
        parser.error(f"DALISTREAM_LOG={os.environ.get('DALISTREAM_LOG')!r} is not a logging level ({', '.join(LOG_LEVELS)})")
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper()),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except DalistreamError as e:
        if logging.getLogger().isEnabledFor(logging.DEBUG):  # the whole story only when asked for
            traceback.print_exc()
        print(f"dalistream {args.command}: error: {flag_spelling(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dalistream {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dalistream keys ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
