"""``dalistream stats RUN_DIR``: every rank's figures side by side, from the files the ranks'
loaders write there (``Loader(stats_dir=RUN_DIR)``, :mod:`dalistream.loader.progress`), so that
a rank slower than the others is seen.

The ranks write their files atomically (a reader never sees half a file), so a file that cannot
be read — cut short, empty, not JSON, not a rank's figures, unreadable — is damage (a full disk,
a copy cut off), and a rank of the world without a file wrote none: each is named on stderr, the
other ranks are shown, and the command exits with status 1 (:data:`INCOMPLETE`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Tuple

from ..errors import ConfigError
from ..loader.progress import rank_file

#: A rank whose samples/s is below this share of the median of all ranks is marked slow.
SLOW = 0.8
#: The exit status when a rank's file cannot be read or a rank of the world wrote none.
INCOMPLETE = 1


def read_rank_file(path: str) -> Dict[str, Any]:
    """One rank's figures; a ``ValueError`` saying what is wrong with the file (its ``OSError``
    as raised)."""
    with open(path, "rb") as f:
        raw = f.read()
    if not raw:
        raise ValueError("empty (0 bytes)")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"cut short or not JSON ({len(raw)} bytes: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rank"), int):
        raise ValueError(f"not a rank's figures (JSON without a rank: {raw[:40]!r})")
    return doc


def read_ranks(run_dir: str) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The figures each rank wrote into ``run_dir`` (``rank-*.json``), sorted by rank, and what
    is wrong: one line per file that cannot be read, naming it and why, and per rank of the
    world (the largest ``world_size`` the files give) that wrote no file."""
    if not os.path.isdir(run_dir):
        raise ConfigError(f"{run_dir!r} is not a folder", hint="give the folder passed as Loader(stats_dir=...)")
    ranks, problems = [], []
    for path in sorted(glob.glob(os.path.join(run_dir, "rank-*.json"))):
        try:
            ranks.append(read_rank_file(path))
        except ValueError as e:
            problems.append(f"{path}: cannot be read: {e}")
        except OSError as e:
            problems.append(f"{path}: cannot be read: {e.strerror or e}")
    ranks.sort(key=lambda r: r["rank"])
    world = max((r.get("world_size") or 0 for r in ranks), default=0)
    present = {os.path.basename(path) for path in glob.glob(os.path.join(run_dir, "rank-*.json"))}
    for rank in range(world):
        path = rank_file(run_dir, rank)
        if os.path.basename(path) not in present:
            problems.append(f"{path}: missing: rank {rank} of {world} wrote no figures")
    return ranks, problems


def rows(ranks: List[Dict[str, Any]], now: float) -> List[Dict[str, Any]]:
    """One row of figures per rank, with ``slow`` marked where its samples/s is below
    :data:`SLOW` × the median of the ranks."""
    out = []
    for r in ranks:
        loader, workers = r.get("loader", {}), r.get("workers", {})
        wall = workers.get("wall_s", 0) or 0
        out.append({
            "rank": r.get("rank"), "host": r.get("host"), "epoch": r.get("epoch"),
            "step": f"{r.get('step')}/{r.get('steps')}", "samples": loader.get("samples", 0),
            "samples_per_s": loader.get("samples_per_s", 0.0), "wait_share": loader.get("wait_share", 0.0),
            "worker_busy": (workers.get("read_s", 0) + workers.get("batch_s", 0)) / wall if wall else 0.0,
            "io_wait_share": workers.get("io_wait_s", 0) / wall if wall else 0.0,
            "skipped": r.get("skipped_samples", 0) + r.get("skipped_shards", 0),
            "remote_mb": workers.get("remote_bytes", 0) / 1e6, "age_s": max(0.0, now - r.get("time", now)),
        })
    rates = [row["samples_per_s"] for row in out if row["samples_per_s"] > 0]
    median = statistics.median(rates) if rates else 0.0
    for row in out:
        row["slow"] = bool(median) and len(out) > 1 and row["samples_per_s"] < SLOW * median
    return out


COLUMNS = (("rank", "rank", "{}"), ("host", "host", "{}"), ("epoch", "epoch", "{}"), ("step", "step", "{}"),
           ("samples", "samples", "{}"), ("samples/s", "samples_per_s", "{:.1f}"), ("data wait", "wait_share", "{:.0%}"),
           ("workers busy", "worker_busy", "{:.0%}"), ("io wait", "io_wait_share", "{:.0%}"),
           ("skipped", "skipped", "{}"), ("remote MB", "remote_mb", "{:.1f}"), ("written", "age_s", "{:.0f} s ago"))


def table(table_rows: List[Dict[str, Any]]) -> str:
    """The rows as a text table, slow ranks marked."""
    cells = [[title for title, _, _ in COLUMNS]]
    cells += [[fmt.format(row[key]) for _, key, fmt in COLUMNS] for row in table_rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    for i, row in enumerate(table_rows, start=1):
        if row["slow"]:
            lines[i] += f"  <- slow: below {SLOW:.0%} of the median samples/s"
    return "\n".join(lines)


def cmd_stats(args: argparse.Namespace) -> int:
    ranks, problems = read_ranks(args.run_dir)
    found = rows(ranks, time.time())
    if args.json:
        print(json.dumps({"run_dir": args.run_dir, "ranks": found, "problems": problems}))
    elif not found:
        print(f"no rank has written readable figures into {args.run_dir} (Loader(stats_dir=...) writes them)")
    else:
        print(table(found))
    for problem in problems:
        print(f"dalistream stats: {problem}", file=sys.stderr)
    return INCOMPLETE if problems else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("stats", help="every rank's figures side by side (samples/s, data wait, workers, skips), "
                                     "from a run folder the loaders write with Loader(stats_dir=RUN_DIR)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the folder given to Loader(stats_dir=...) on every rank")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table (with "
                                                       "`problems`: the files that cannot be read, the ranks missing)")
    p.set_defaults(func=cmd_stats)
