"""CPU cost of a worker's feed on one core: the tar parse alone, and the parse with field decoding
and the error policy (:meth:`dalistream.worker.reader.PlanReader.blocks`), over local shards; each by header and, for
shards whose member layout the scan records (:mod:`dalistream.manifest.members`), sliced by it.

``python -m dalistream.tools.parse_bench SHARD… [--repeats N] [--fields image=jpg;png,label=cls]``
prints µs per sample and samples/s (CPU time of this process, median of the repeats). Numbers
from a loaded machine are noisy: quote them with the load (``uptime``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Sequence

from ..config import StreamConfig
from ..dataset import DataSet
from ..io import open_shard
from ..manifest import scan_shard
from ..manifest.offsets import SampleOffsets
from ..manifest.rows import ShardInfo, ShardRows
from ..tar import iter_samples
from ..tar.samples import sliced_samples
from ..worker import WorkerSource
from ..worker.policy import ErrorPolicy
from ..worker.stats import WorkerStats


def parse_only(paths: Sequence[str], exts: frozenset) -> int:
    """Every sample of ``paths`` as the worker parses them (wanted members read); how many."""
    n = 0
    for path in paths:
        with open_shard(path) as f:
            for _ in iter_samples(f, path, want_ext=exts.__contains__, mark_errors=True):
                n += 1
    return n


def sliced_only(paths: Sequence[str], exts: frozenset, infos: Sequence[ShardInfo]) -> int:
    """:func:`parse_only` cut by each shard's member layout (shards without one by header)."""
    rows = ShardRows.from_infos(infos)
    n = 0
    for s, path in enumerate(paths):
        found = rows.members.at(s) if rows.members is not None else None
        with open_shard(path) as f:
            samples = (iter_samples(f, path, want_ext=exts.__contains__, mark_errors=True) if found is None else
                       sliced_samples(f, path, found[0], found[1], found[2], first=0, offset=0,
                                      want_ext=exts.__contains__, last=True))
            for _ in samples:
                n += 1
    return n


def decoded(paths: Sequence[str], fields: Dict[str, str], counts: Sequence[int], infos: Sequence[ShardInfo] = ()) -> int:
    """Every sample of ``paths`` decoded by one worker's :class:`~dalistream.worker.reader.PlanReader` (``infos``: with
    their offsets and member layouts); how many."""
    config = StreamConfig(sources=tuple(paths), fields=fields, batch_size=1, workers=1, policy="exact", shuffle=0,
                          shuffle_shards=False)
    offsets = None
    if infos:
        rows = ShardRows.from_infos(infos)
        offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
    source = WorkerSource(config, DataSet(tuple(paths), tuple(counts), offsets), 0)
    return sum(block.n for block in source.readers[0].blocks(source.plans(0)[0], ErrorPolicy("raise"),
                                                         WorkerStats(None, 0, 0)))


def measure(fn: Callable[[], int], repeats: int) -> Dict[str, float]:
    """Median CPU seconds of ``fn`` over ``repeats`` runs, as µs per sample and samples/s."""
    times: List[float] = []
    n = 0
    for _ in range(repeats):
        t0 = time.process_time()
        n = fn()
        times.append(time.process_time() - t0)
    median = statistics.median(times)
    return {"samples": n, "us_per_sample": median * 1e6 / max(n, 1), "samples_per_s": n / median if median else 0.0}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dalistream.tools.parse_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", nargs="+", help="local tar shards")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (median)")
    parser.add_argument("--fields", default="image=jpg;png,label=cls", help="name=exts pairs, comma-separated")
    args = parser.parse_args(argv)
    fields = dict(pair.split("=", 1) for pair in args.fields.split(","))
    exts = frozenset(e for spec in fields.values() for e in spec.split(";"))
    infos = [scan_shard(path, offsets=True) for path in args.shards]
    counts = [i.samples for i in infos]
    regular = sum(i.members is not None for i in infos)
    print(f"{len(infos)} shards, {regular} with a member layout (sliced below; the others by header)")
    for name, fn in (("parse", lambda: parse_only(args.shards, exts)),
                     ("sliced", lambda: sliced_only(args.shards, exts, infos)),
                     ("decoded", lambda: decoded(args.shards, fields, counts)),
                     ("decoded, sliced", lambda: decoded(args.shards, fields, counts, infos))):
        m = measure(fn, args.repeats)
        print(f"{name}: {m['samples']} samples, {m['us_per_sample']:.2f} us/sample, {m['samples_per_s']:,.0f} samples/s (CPU, median of {args.repeats})")


if __name__ == "__main__":
    main()
