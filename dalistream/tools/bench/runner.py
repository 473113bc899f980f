"""``dalistream bench``: dalistream's throughput next to DALI's own reader and webdataset.

::

    dalistream bench /data/train-{0000..0015}.tar --workers 2 --batch-size 64 \\
        --compare dali-native,webdataset --repeats 3
    dalistream bench /data/*.tar --pipeline read-only --compare dali-native,webdataset
    dalistream bench /data/*.tar --sweep workers=1,2,4 --plot docs/assets/bench_workers.png
    dalistream bench --merge-only --merge-workers 1,2,4,8 --batch-size 64
    dalistream bench /data/*.tar --pipeline feed --buckets auto:8    # alternating with dalistream-nobuckets

Every measurement runs in a fresh process (:mod:`.child`, :mod:`.peers`) whose whole process
tree is sampled from ``/proc`` (:mod:`.monitor`). Runs alternate between the
systems (dalistream, peer 1, peer 2, dalistream, …) so that drift on a shared machine hits all
alike; figures are medians over ``--repeats``, ratios are dalistream / peer. Every system is
timed by the same function under the same rule (:mod:`.timing`): libraries imported before the
clock, time to first batch from the start of the loader's construction, samples/s the steady
rate after the first batch, CPU per sample split into the main process and its workers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ...errors import ConfigError
from ...stream import default_cache_dir
from ..args import add_stream_args, storage_options, stream_sources
from .child import run_child
from .converted import MODULES as CONVERTED, converted, missing
from .report import fmt, format_report, format_sweep, plot_sweep

PEERS = ("dali-native", "webdataset", "litdata", "mosaicml")
PIPELINES = ("classification_train", "classification_full", "feed", "read-only")
METRICS = ("samples_per_s", "mb_per_s", "first_batch_s", "peak_rss_mb", "peak_pss_mb", "peak_shm_mb",
           "cpu_ms_per_sample", "steady_cpu_ms_per_sample", "main_cpu_ms_per_sample", "workers_cpu_ms_per_sample",
           "cpu_ms_per_mb", "convert_s")
SWEEPABLE = {"workers": "workers", "batch-size": "batch_size", "batch_size": "batch_size", "threads": "threads",
             "shards": "shards",  # shards=N: the first N shards of the sources (memory as the data set grows)
             "parts_in_flight": "parts_in_flight", "part_bytes": "part_bytes",  # storage options of remote reads
             "interleave": "interleave"}  # 0/1: one span per worker through the buffer, or the slot's columns


def add_parser(subparsers: Any) -> None:
    """Register ``dalistream bench`` on the CLI's subparsers."""
    p = subparsers.add_parser("bench", help="throughput, first-batch time and memory, next to DALI's reader and webdataset")
    add_stream_args(p)
    for action in p._actions:  # sources are optional with --merge-only
        if action.dest == "sources":
            action.nargs, action.required = "*", False
        if action.dest == "buckets":
            action.help += "; dalistream reads with them, alternating with dalistream-nobuckets (the same without)"
    p.set_defaults(batch_size=64, func=run)
    measure = p.add_argument_group("what to measure")
    measure.add_argument("--epochs", type=int, default=1, help="epochs per run (each system's own epochs)")
    measure.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto", help="where images are decoded")
    measure.add_argument("--pipeline", default="classification_train",
                         metavar="|".join(PIPELINES) + "|video_clips_train|audio_train",
                         help="classification_train: decode + augment (random-resized-crop, flip, normalize; DALI "
                              "decodes only the crop window); classification_full: the same with the whole image "
                              "decoded first, as the PIL peers (webdataset, litdata, mosaicml) do in both; feed: bytes "
                              "into the graph, ending in fn.shapes (the cost of feeding alone); read-only: bytes to "
                              "Python; video_clips_train, audio_train: the media loaders beside a torch DataLoader "
                              "decoding the same clips with PyAV and DALI's own file reader "
                              "(dalistream/tools/bench/media.py). Several, comma-separated, run one after the other "
                              "(e.g. feed,classification_train)")
    measure.add_argument("--size", type=int, default=224,
                         help="output image side (classification_train, classification_full)")
    measure.add_argument("--threads", type=int, default=2, help="DALI num_threads for both DALI pipelines")
    peers = p.add_argument_group("peers and rounds")
    peers.add_argument("--compare", default="",
                       help=f"comma-separated peers: {','.join(PEERS)} (litdata and mosaicml convert the samples to "
                            "their formats first, timed apart as convert_s; they need the peers extra: "
                            'pip install "torch==VERSION" -e ".[peers]", torch pinned to the installed one)')
    peers.add_argument("--repeats", type=int, default=3, help="alternating runs per system")
    peers.add_argument("--sweep", default=None, metavar="PARAM=V1,V2,…",
                       help="repeat the comparison over values of workers, batch-size, threads or shards "
                            "(shards=16,160: the first N shards of the sources)")
    peers.add_argument("--plot", default=None, metavar="FILE.png",
                       help="with --sweep: plot samples/s against the swept value")
    peers.add_argument("--lean-main", action="store_true",
                       help="run each measurement as `python -c` (no main script for DALI's spawned workers to import "
                            "again) instead of a script that imports torch at the top, as training scripts do")
    peers.add_argument("--timeout", type=float, default=600, help="seconds before a run is killed")
    peers.add_argument("--json", action="store_true",
                       help="progress on stderr; the last stdout line is one JSON object")
    remote = p.add_argument_group("remote reads")
    remote.add_argument("--shape", default=None, metavar="LATENCY,RATE",
                        help="read object store sources (a plain http --endpoint-url) and http:// sources through a "
                             "loopback proxy giving every connection this latency to first byte and bandwidth, e.g. "
                             "40ms,3MB/s")
    remote.add_argument("--storage-option", action="append", default=[], metavar="KEY=INT",
                        help="an integer storage option for the runs, e.g. parts_in_flight=4 or part_bytes=1048576")
    remote.add_argument("--cache", default=None, metavar="DIR",
                        help="dalistream reads remote shards through a node-local byte cache, in a new folder under DIR "
                             "for each run (its first epoch fills it, the next ones read it); the same sources without "
                             "the cache alternate with it as dalistream-nocache. Use --epochs 2 or more")
    remote.add_argument("--cache-limit", default=None, metavar="SIZE",
                        help="with --cache: its limit (e.g. 800GB, 512MiB)")
    remote.add_argument("--local-copy", action="append", default=[], metavar="SOURCE",
                        help="the same shards on a local disk (same names, same order), read directly without a cache "
                             "as dalistream-local, alternating with the other systems")
    merge = p.add_argument_group("the merge alone (--merge-only: no data)")
    merge.add_argument("--merge-only", action="store_true",
                       help="measure the merge of W tiny sources (no data): ms per batch for --merge-workers")
    merge.add_argument("--merge-workers", default="1,2,4,8", help="W values for --merge-only")
    merge.add_argument("--merge-batches", type=int, default=200, help="timed batches per --merge-only run")
    merge.add_argument("--merge-bytes", default="1",
                       help="--merge-only: payload bytes per sample, N or LO-HI (the slot's rows spread from LO to HI)")
    merge.add_argument("--merge-method", choices=["concat", "conditional"], default="concat",
                       help="--merge-only: sum/concatenation (dalistream's merge of scalar and 1-D fields) or the "
                            "owner index's conditionals (other fields)")

def _local_size(url: str) -> Optional[int]:
    from ...io.local import local_path
    from ...io.stores import is_local

    if not is_local(url):
        return None
    try:
        return os.path.getsize(local_path(url))
    except OSError:
        return None


def _warm(urls: Sequence[str]) -> None:
    """Read local shards once so that every run, the first included, finds them in the page cache."""
    for url in urls:
        if _local_size(url) is None:
            continue
        from ...io.local import local_path

        with open(local_path(url), "rb") as f:
            while f.read(1 << 20):
                pass


def _median(runs: List[Dict[str, Any]], key: str) -> Optional[float]:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians of every metric over the runs of one system, plus the individual samples/s."""
    out: Dict[str, Any] = {key: _median(runs, key) for key in METRICS}
    out["runs"] = len(runs)
    out["samples_per_s_runs"] = [r.get("samples_per_s") for r in runs]
    out["samples_runs"] = [r.get("samples") for r in runs]  # every system's work, checked equal
    epochs = max((len(r.get("epoch_samples_per_s") or ()) for r in runs), default=0)
    out["epoch_samples_per_s"] = [_median([{"x": (r.get("epoch_samples_per_s") or [None] * epochs)[e]} for r in runs],
                                          "x") for e in range(epochs)]  # (dalistream's systems)
    return out


def ratios(ours: Dict[str, Any], peer: Dict[str, Any]) -> Dict[str, Any]:
    """dalistream / peer for each metric (above 1: more throughput, or more time/memory), and
    per epoch (``epoch_samples_per_s``) where both have epoch rates."""
    out: Dict[str, Any] = {k: (ours[k] / peer[k] if ours.get(k) and peer.get(k) else None) for k in METRICS}
    out["epoch_samples_per_s"] = [a / b if a and b else None for a, b in
                                  zip(ours.get("epoch_samples_per_s") or (), peer.get("epoch_samples_per_s") or ())]
    return out


def round_ratios(ours: List[Dict[str, Any]], peer: List[Dict[str, Any]]) -> Dict[str, Any]:
    """dalistream / peer for each metric: the median of each round's own ratio (:func:`ratios` of
    the runs that alternated), so that drift between rounds cancels."""
    rounds = [ratios(a, b) for a, b in zip(ours, peer)]
    out: Dict[str, Any] = {k: _median([r for r in rounds], k) for k in METRICS}
    epochs = max((len(r["epoch_samples_per_s"]) for r in rounds), default=0)
    out["epoch_samples_per_s"] = [_median([{"x": (r["epoch_samples_per_s"] + [None] * epochs)[e]} for r in rounds], "x")
                                  for e in range(epochs)]
    return out


def rotated(systems: Sequence[str], round_index: int) -> List[str]:
    """The order of one round: round r starts at the r-th system (dalistream, A, B; A, B, dalistream; …),
    so that no system always runs first (on a cold machine) or right after the same one."""
    k = round_index % len(systems)
    return list(systems[k:]) + list(systems[:k])


@contextlib.contextmanager
def _system_spec(args: argparse.Namespace, base: Dict[str, Any], system: str) -> Iterator[Dict[str, Any]]:
    """The spec of one run of ``system``: dalistream's (each of its systems) with a new, empty scan
    cache (``cache_dir``: the shards scanned, or their manifest parsed, as on a user's first run,
    which is what DALI's reader does on every run), and (dalistream and dalistream-nobuckets, so
    that the two differ only in buckets) through a new, empty byte cache under ``--cache``; both
    removed after the run; dalistream-local's on the ``--local-copy``; dalistream-nobuckets'
    without ``--buckets``; litdata's and mosaicml's over the samples converted to their formats
    (:func:`.converted.converted`)."""
    spec = dict(base, system=system)
    if system == "dalistream-nobuckets":
        spec.update(buckets=None)
    if system == "dalistream-local":
        spec.update(urls=base["local_urls"], storage_options={}, manifest=None)
    if system in CONVERTED:  # litdata, mosaicml: the samples in their format first (timed, in a process apart)
        with converted(dict(spec, convert_dir=args.cache)) as ready:
            yield ready
        return
    with contextlib.ExitStack() as folders:
        def new_folder(prefix: str, under: Optional[str] = None) -> str:
            folder = tempfile.mkdtemp(prefix=prefix, dir=under)
            folders.callback(shutil.rmtree, folder, True)
            return folder

        if system.startswith("dalistream"):
            spec.update(cache_dir=new_folder("dalistream-bench-scan-"))
        if system in ("dalistream", "dalistream-nobuckets") and args.cache:
            spec.update(cache=new_folder("dalistream-bench-cache-", args.cache), cache_limit=args.cache_limit)
        yield spec


def compare(args: argparse.Namespace, base: Dict[str, Any], shard_bytes: Sequence[int],
            systems: Sequence[str], log) -> Dict[str, Any]:
    """Alternate runs of ``systems`` ``--repeats`` times over ``base["urls"]`` (whose sizes are
    ``shard_bytes``); the report for one configuration."""
    urls, counts = base["urls"], base["counts"]
    bytes_per_sample = sum(shard_bytes) / sum(counts) if sum(counts) else None
    runs: Dict[str, List[Dict[str, Any]]] = {s: [] for s in systems}
    load_before = os.getloadavg()[0]
    for repeat in range(args.repeats):
        for system in rotated(systems, repeat):
            with _system_spec(args, base, system) as spec:
                result = run_child(spec, args.timeout, args.lean_main)
            if bytes_per_sample and result.get("samples_per_s"):
                result["mb_per_s"] = result["samples_per_s"] * bytes_per_sample / 1e6
            if bytes_per_sample and result.get("steady_cpu_ms_per_sample"):  # CPU per MB of shards read
                result["cpu_ms_per_mb"] = result["steady_cpu_ms_per_sample"] / bytes_per_sample * 1e6
            if base["pipeline"] == "read-only" and result.get("payload_mb_per_s"):
                result["mb_per_s"] = result["payload_mb_per_s"]
            runs[system].append(result)
            log(f"  [{repeat + 1}/{args.repeats}] {system:16s} {fmt(result.get('samples_per_s'), 8)} samples/s  "
                f"first batch {fmt(result.get('first_batch_s'), 6, 2)} s  peak RSS {fmt(result.get('peak_rss_mb'), 6)} MB  "
                f"PSS {fmt(result.get('peak_pss_mb'), 6)} MB  CPU {fmt(result.get('steady_cpu_ms_per_sample'), 5, 2)} ms/sample  "
                f"{result.get('samples')} samples" + (f"  converted in {fmt(result['convert_s'], 4, 2)} s"
                                                      if result.get("convert_s") is not None else ""))
    ours = summarize(runs["dalistream"])
    report: Dict[str, Any] = {key: ours[key] for key in METRICS}
    report.update(runs=ours["runs"], samples_per_s_runs=ours["samples_per_s_runs"], samples_runs=ours["samples_runs"],
                  epoch_samples_per_s=ours["epoch_samples_per_s"], config={
        k: base[k] for k in ("pipeline", "batch_size", "workers", "threads", "epochs", "size", "device", "rank",
                             "world_size")})
    report["config"]["device"] = runs["dalistream"][-1].get("device", base["device"])  # resolved
    report["config"]["start_method"] = runs["dalistream"][-1].get("start_method", base["start_method"])
    report["config"]["counts_from"] = runs["dalistream"][-1].get("counts_from")  # (each run with an empty scan cache)
    report["config"].update(shards=len(urls), samples=sum(counts), shard_bytes_per_sample=bytes_per_sample,
                            child="lean" if args.lean_main else "script", cpus=os.cpu_count(),
                            loadavg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)])
    stats = runs["dalistream"][-1].get("stats")
    if stats:
        report["worker_stats"] = stats
    peers = {}
    for system in systems[1:]:
        figures = summarize(runs[system])
        figures["ratio"] = round_ratios(runs["dalistream"], runs[system])
        peers[system] = figures
    if peers:
        report["peers"] = peers
    return report


# -- entry point ---------------------------------------------------------------------------------

def _parse_sweep(text: Optional[str]) -> Optional[tuple]:
    if not text:
        return None
    name, _, values = text.partition("=")
    key = SWEEPABLE.get(name.strip())
    if key is None or not values:
        raise ConfigError(f"--sweep {text!r}: expected workers=1,2,4, batch-size=32,64, threads=1,2, shards=16,160, "
                          "parts_in_flight=1,8, part_bytes=1048576 or interleave=0,1")
    try:
        return key, [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--sweep {text!r}: values must be integers") from None


def run(args: argparse.Namespace) -> int:
    """``dalistream bench``: run the measurements, print the table (and JSON, and the plot)."""
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else (lambda msg: print(msg, flush=True))
    if args.merge_only:
        from .merge import run_merge_only

        return run_merge_only(args, log)
    if args.pipeline in ("video_clips_train", "audio_train"):  # clips beside torch + PyAV and DALI's reader
        from .media import run_media

        return run_media(args, log)
    mix = stream_sources(args) if args.mix else None
    if mix is not None and args.shape:
        raise ConfigError("--mix with --shape is not measured yet: bench a mix on unshaped sources")
    if not args.sources and mix is None:
        raise ConfigError("dalistream bench needs shard sources, --mix NAME=WEIGHT:SOURCE, or --merge-only")
    from ...manifest import count_shards
    from ...sources import expand_sources

    pipelines = [p.strip() for p in args.pipeline.split(",") if p.strip()]
    if not pipelines or set(pipelines) - set(PIPELINES):
        raise ConfigError(f"--pipeline {args.pipeline!r}: choose from {', '.join(PIPELINES)} (comma-separated)")
    peers = [p.strip() for p in args.compare.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise ConfigError(f"--compare: unknown peers {unknown}; choose from {list(PEERS)}")
    absent = [reason for reason in (missing(p) for p in peers if p in CONVERTED) if reason]
    if absent:
        raise ConfigError("; ".join(absent), hint="install the peers' libraries, or leave them out of --compare")
    if args.repeats < 1 or args.epochs < 1:
        raise ConfigError("--repeats and --epochs must be at least 1")
    from ...stream import resolve_layout

    # one rank of a job measured alone: every system reads that rank's share (see peers.rank_share)
    args.rank, args.world_size = resolve_layout(args.rank, args.world_size, os.environ)
    if args.world_size < 1 or not 0 <= args.rank < args.world_size:
        raise ConfigError(f"--rank {args.rank} of --world-size {args.world_size}: a rank is 0 … world size − 1")
    options = storage_options(args)
    for item in args.storage_option:
        key, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise ConfigError(f"--storage-option {item!r}: write KEY=INTEGER")
        options[key.strip()] = int(value)
    if mix is not None:  # dalistream reads the mix; the peers read all its shards as one data set
        mix = {name: (tuple(expand_sources([source], options)), weight) for name, (source, weight) in mix.items()}
        urls = [u for source_urls, _ in mix.values() for u in source_urls]
    else:
        urls = expand_sources(args.sources, options)
    # skip: a damaged shard is counted up to its problem and warned about, as the loader does
    infos, _ = count_shards(urls, manifest=args.manifest, cache_dir=default_cache_dir(os.environ), options=options,
                            tolerant=args.on_error == "skip")
    counts, shard_bytes = [i.samples for i in infos], [i.bytes for i in infos]
    local_urls = _local_copy(args, urls)
    _warm(list(urls) + local_urls)
    reports = {}
    with contextlib.ExitStack() as stack:
        if args.shape:  # counts above came unshaped; the measured runs go through the proxies
            from ..proxy import shaped

            urls, options = stack.enter_context(shaped(urls, options, args.shape))
            log(f"bench: S3/HTTP through a shaping proxy ({args.shape} per connection)")
        for pipeline in pipelines:
            if len(pipelines) > 1:
                log(f"bench: pipeline {pipeline}")
            reports[pipeline] = _run_pipeline(args, pipeline, len(pipelines) > 1, urls, counts, shard_bytes, peers,
                                              options, log, mix, local_urls)
    report = reports[pipelines[0]] if len(pipelines) == 1 else {"pipelines": reports}
    if args.json:
        print(json.dumps(report), flush=True)
    return 0


def _local_copy(args: argparse.Namespace, urls: Sequence[str]) -> List[str]:
    """The ``--local-copy`` shards (the same names as ``urls``, in their order), and ``--cache``
    checked: a folder."""
    from ...sources import expand_sources

    if args.cache and not os.path.isdir(args.cache):
        raise ConfigError(f"--cache {args.cache!r} is not a folder", hint="create it on the disk to cache on")
    if not args.local_copy:
        return []
    local = expand_sources(args.local_copy, {})
    if [u.rsplit("/", 1)[-1] for u in local] != [u.rsplit("/", 1)[-1] for u in urls]:
        raise ConfigError(f"--local-copy lists {len(local)} shards that are not the sources' {len(urls)}, by name "
                          "and order", hint="copy the same shards (e.g. aws s3 sync) and name that folder")
    return list(local)


def _run_pipeline(args: argparse.Namespace, pipeline: str, several: bool, urls: Sequence[str], counts: Sequence[int],
                  shard_bytes: Sequence[int], peers: Sequence[str], options: Dict[str, Any], log,
                  mix: Optional[Dict[str, Any]] = None, local_urls: Sequence[str] = ()) -> Dict[str, Any]:
    """One pipeline's comparison (or sweep): its report (``several``: one of several pipelines)."""
    systems = (["dalistream"] + (["dalistream-nobuckets"] if args.buckets else [])
               + (["dalistream-nocache"] if args.cache else [])
               + (["dalistream-local"] if args.local_copy else []) + list(peers)
               + (["sequential-read"] if pipeline == "read-only" else []))
    base = {"urls": urls, "counts": counts, "batch_size": args.batch_size, "workers": args.workers,
            "threads": args.threads, "device": args.device, "seed": args.seed, "size": args.size,
            "start_method": args.start_method,
            "epochs": args.epochs, "pipeline": pipeline, "storage_options": options, "manifest": args.manifest,
            # dalistream only (the peers read every shard in order, unshuffled)
            "epoch": args.epoch, "shuffle": args.shuffle, "interleave": args.interleave, "policy": args.policy,
            "batches_per_epoch": args.batches_per_epoch, "on_error": args.on_error,
            "mix": mix, "per_batch": args.per_batch, "samples_per_epoch": args.samples_per_epoch,
            "affinity": args.affinity, "ranks_per_node": args.ranks_per_node,
            "rank": args.rank, "world_size": args.world_size,
            "buckets": args.buckets, "bucket_per": args.bucket_per, "lookahead": args.lookahead,
            "local_urls": list(local_urls)}
    sweep = _parse_sweep(args.sweep)
    if sweep is None:
        log(f"bench: {len(urls)} shards, {sum(counts)} samples, batch {args.batch_size}, workers {args.workers}, "
            f"{pipeline}, {args.repeats} alternating repeats of {', '.join(systems)}")
        report = compare(args, base, shard_bytes, systems, log)
        log(format_report(report))
        return report
    key, values = sweep
    if key == "shards" and (min(values) < 1 or max(values) > len(urls)):
        raise ConfigError(f"--sweep shards={args.sweep.partition('=')[2]}: the sources hold {len(urls)} shards",
                          hint="sweep over 1 to that many shards, or list more sources")
    points = []
    for value in values:
        log(f"bench: {key} = {value}")
        if key == "shards":
            point = compare(args, dict(base, urls=urls[:value], counts=counts[:value]), shard_bytes[:value],
                            systems, log)
        elif key in ("parts_in_flight", "part_bytes"):
            point = compare(args, dict(base, storage_options={**options, key: value}), shard_bytes, systems, log)
        elif key == "interleave":
            point = compare(args, dict(base, interleave=bool(value)), shard_bytes, systems, log)
        else:
            point = compare(args, dict(base, **{key: value}), shard_bytes, systems, log)
        point["value"] = value
        log(format_report(point))
        points.append(point)
    log(format_sweep(key, points))
    if args.plot:
        root, ext = os.path.splitext(args.plot)
        plot = f"{root}_{pipeline}{ext}" if several else args.plot
        plot_sweep(key, points, plot)
        log(f"plot written to {plot}")
    return {"sweep": {"param": key, "points": points}}
