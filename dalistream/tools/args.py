"""Command-line pieces shared by ``dalistream``'s commands: the data-reading options, storage
options from arguments, JSON or text output, progress bars."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Dict, Optional

from ..config import WORKERS


#: The titles of the option groups of ``--help``, in the order shown.
GROUPS = {"data": "data: what is read", "store": "store: where it is read from",
          "layout": "layout: ranks, workers, batches", "order": "order and epoch length",
          "buckets": "buckets: batches of one shape", "mix": "mix: several weighted sources"}


def add_stream_args(p: argparse.ArgumentParser, *, batch: bool = True, loader: bool = True,
                    sources_required: bool = True, planning: bool = False) -> Dict[str, Any]:
    """The options every data-reading command shares, in argument groups of ``--help``
    (:data:`GROUPS`); returns the groups by key, for a command to add its own options to.
    ``loader=False`` leaves out those only a loader uses (workers, rank, world size, epoch, seed,
    manifest, start method), ``batch=False`` those of batching (batch size, shuffle, policy,
    buckets). ``planning``: the command shows a plan for every rank (``plan``), so ``--rank``
    picks one to show and ``--world-size`` is 1 unless given, not read from the launcher."""
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()
              if (batch or key not in ("order", "buckets")) and (loader or key not in ("layout", "mix"))}
    data, store = groups["data"], groups["store"]
    data.add_argument("sources", nargs="+" if sources_required else "*", metavar="SOURCE", help="shard paths, dirs, globs, {a..b} patterns, or any store's URLs: s3://, gs://, az://, hf://, http(s)://, pipe:")
    if loader:
        data.add_argument("--manifest", default=None, help="manifest file with per-shard counts (from `dalistream index`)")
    data.add_argument("--on-error", choices=["raise", "skip"], default="raise", help="bad samples/shards: stop, or count and skip")
    store.add_argument("--endpoint-url", default=None, help="the store's endpoint: an S3-compatible server (MinIO, Ceph, R2, moto), a GCS emulator, an Azure blob endpoint, a Hub mirror; default from the store's own configuration")
    store.add_argument("--profile", default=None, help="AWS profile for s3:// sources")
    if loader:
        layout = groups["layout"]
        layout.add_argument("--workers", "-W", type=int, default=WORKERS,
                            help="DALI worker processes per rank (each reads its own share of the shards)")
        if planning:
            layout.add_argument("--rank", type=int, default=None, help="show this rank only (default: every rank)")
            layout.add_argument("--world-size", type=int, default=1, help="number of ranks")
        else:
            layout.add_argument("--rank", type=int, default=None, help="this rank (default: torch.distributed, RANK, or 0)")
            layout.add_argument("--world-size", type=int, default=None, help="number of ranks (default: WORLD_SIZE or 1)")
        layout.add_argument("--start-method", choices=["auto", "fork", "spawn"], default="auto",
                            help="how DALI starts its workers (auto: fork for CPU pipelines while CUDA is untouched)")
    if loader:
        order = groups.get("order", groups["layout"])
        order.add_argument("--epoch", type=int, default=0,
                           help="epoch to show (it decides the shard order)" if planning else
                                "epoch to read (it decides the shard order)")
        order.add_argument("--seed", type=int, default=0, help="seed of the shard order and the shuffle")
    if batch:
        order = groups["order"]
        groups.get("layout", order).add_argument("--batch-size", "-B", type=int, default=32,
                                                 help="samples per batch (per rank)")
        order.add_argument("--shuffle", type=int, default=None,
                           help="per-worker sample shuffle buffer (0: off; default: none when reading interleaved, "
                                "1000 for a training stream that cannot)")
        order.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=None,
                           help="every worker reads as many shards at once as it fills places in a batch, so each "
                                "batch mixes many shards (default: on for the training policies when sample counts "
                                "are known)")
        order.add_argument("--policy", choices=["even", "exact", "fixed"], default="even",
                           help="batches per epoch: even (the same on every rank), exact (every sample once), "
                                "fixed (--batches-per-epoch)")
        order.add_argument("--batches-per-epoch", type=int, default=None, help="with --policy fixed")
        buckets = groups["buckets"]
        buckets.add_argument("--buckets", default=None, metavar="SPEC",
                             help="batches by shape, each batch one bucket: aspect:WxH,WxH,… | auto:N | "
                                  "length:FIELD:EDGE,EDGE,… | key:COLUMN:EDGE,EDGE,… (e.g. key:duration_ms:2000,4000,8000; "
                                  "each sample's bucket keys, its image size, length or duration, "
                                  "come from the manifest: `dalistream index --keys`)")
        buckets.add_argument("--bucket-per", choices=["rank", "global"], default="rank",
                             help="with --buckets: each rank's batch one bucket, or the whole global batch")
        buckets.add_argument("--lookahead", type=int, default=None, metavar="K",
                             help="with --buckets: refuse a plan in which a worker holds more than K samples")
        if loader:
            layout = groups["layout"]
            layout.add_argument("--affinity", choices=["node"], default=None,
                                help="node: each node reads the same share of the shards every epoch, so a node-local "
                                     "cache holds about 1/N of the data (nodes from LOCAL_WORLD_SIZE or "
                                     "SLURM_NTASKS_PER_NODE)")
            layout.add_argument("--ranks-per-node", type=int, default=None,
                                help="with --affinity node: ranks on each node (default: from the launcher, else one node)")
            mix = groups["mix"]
            mix.add_argument("--mix", action="append", default=None, metavar="NAME=WEIGHT:SOURCE",
                             help="one weighted source of a mix, instead of SOURCEs (repeat it for each source)")
            mix.add_argument("--per-batch", choices=["sample", "source"], default="sample",
                             help="with --mix: every batch holds each source's share, or comes whole from one source")
            mix.add_argument("--samples-per-epoch", type=int, default=None,
                             help="with --mix: the epoch's samples (default: as many as no source repeats)")
    return groups


def stream_sources(args: argparse.Namespace) -> Any:
    """What ``Stream.open`` reads: the SOURCEs, or the mapping of ``--mix NAME=WEIGHT:SOURCE``."""
    from ..errors import ConfigError
    from ..mixing import parse_mix_arg

    if getattr(args, "mix", None):
        if args.sources:
            raise ConfigError("give shard SOURCEs or --mix NAME=WEIGHT:SOURCE, not both")
        mix: Dict[str, Any] = {}
        for text in args.mix:
            name, weight, source = parse_mix_arg(text)
            if name in mix:
                raise ConfigError(f"mix: source {name!r} is given twice")
            mix[name] = (source, weight)
        return mix
    if not args.sources:
        raise ConfigError("give shard SOURCEs, or --mix NAME=WEIGHT:SOURCE for each source of a mix")
    return args.sources


def stream_buckets(args: argparse.Namespace) -> Any:
    """The ``buckets`` option of ``Stream.open`` from ``--buckets``, ``--bucket-per`` and
    ``--lookahead`` (``None`` without ``--buckets``)."""
    from ..buckets import parse_buckets

    if not getattr(args, "buckets", None):
        return None
    return parse_buckets(args.buckets, args.bucket_per, args.lookahead)


def mix_options(args: argparse.Namespace) -> Dict[str, Any]:
    """``Stream.open``'s mix choices from ``--per-batch`` and ``--samples-per-epoch`` (a mix only)."""
    if not getattr(args, "mix", None):
        return {}
    return {"per_batch": args.per_batch, "samples_per_epoch": args.samples_per_epoch}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def add_log_level(p: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    """``--log-level``, on the main parser (with its default) and on every subcommand (where it
    is left unset unless given, so ``dalistream keys … --log-level debug`` works too)."""
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default, metavar="LEVEL",
                   help=f"logging level: {', '.join(LOG_LEVELS)} (any case; DALISTREAM_LOG sets the default)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, where it has one worth showing (not None, not
    False) and its text does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or "(default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action) or ""


def affinity_options(args: argparse.Namespace) -> Dict[str, Any]:
    """``Stream.open``'s ``affinity`` and ``ranks_per_node`` from ``--affinity`` and ``--ranks-per-node``."""
    return {"affinity": getattr(args, "affinity", None), "ranks_per_node": getattr(args, "ranks_per_node", None)}


def storage_options(args: argparse.Namespace) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if getattr(args, "endpoint_url", None):
        out["endpoint_url"] = args.endpoint_url
    if getattr(args, "profile", None):
        out["profile"] = args.profile
    return out


def emit(args: argparse.Namespace, payload: Any, text: Optional[str] = None) -> None:
    """Print ``payload`` as one JSON line with --json, else ``text`` (or pretty JSON)."""
    if getattr(args, "json", False) or text is None:
        print(json.dumps(payload, sort_keys=False), flush=True)
    else:
        print(text, flush=True)


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars go to stderr when it is a terminal and ``--json`` is off, or with ``--progress``."""
    return bool(getattr(args, "progress", False)) or (sys.stderr.isatty() and not getattr(args, "json", False))


def progress_bar(args: argparse.Namespace, *, total: int, unit: str):
    """A tqdm bar on stderr when :func:`show_progress` says so; a silent one otherwise."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, disable=not show_progress(args), dynamic_ncols=True,
                leave=False)


#: Options a hint may name the Python way that the command line has as flags.
FLAGS = ("on_error", "policy", "batch_size", "workers", "world_size", "rank", "shuffle", "interleave", "manifest",
         "batches_per_epoch", "per_batch", "samples_per_epoch", "seed", "affinity", "ranks_per_node", "lookahead")
_ASSIGNED = re.compile(r"(?<![\w./?&=-])(" + "|".join(FLAGS) + r")=('[^']*'|\"[^\"]*\"|[\w.+-]+)")
_NAMED = re.compile(r"(?<![\w./?&=-])(" + "|".join(name for name in FLAGS if "_" in name) + r")(?![\w=])")


def flag_spelling(text: str) -> str:
    """``text`` (an error and its hint) with the options it names the Python way spelled as the
    command line's flags: ``on_error='skip'`` → ``--on-error skip``, ``interleave=False`` →
    ``--no-interleave``, ``batch_size`` → ``--batch-size``."""
    def assigned(m: "re.Match[str]") -> str:
        name, value = m.group(1), m.group(2).strip("'\"")
        flag = "--" + name.replace("_", "-")
        if value in ("True", "False") and name == "interleave":
            return flag if value == "True" else "--no-" + flag[2:]
        return f"{flag} {value}"

    text = _ASSIGNED.sub(assigned, text)
    return _NAMED.sub(lambda m: "--" + m.group(1).replace("_", "-"), text)
