"""Samples of the header walk gathered into runs: a shard read without a member layout (no
manifest layout for it, a gzipped shard, an index of offsets only) has its samples found one by
one by :func:`~dalistream.tar.samples.iter_samples`; :func:`walked_runs` lays the members of
consecutive whole samples side by side in a worker's arena, as a :class:`WalkedRun`, so that they
are decoded in bulk with the runs of regular shards (:func:`dalistream.worker.rows.decode_runs`)
rather than one by one. A sample with a problem the walk marked, one passed over, one without a
wanted member, or one larger than a run of :data:`~dalistream.tar.runs.MIN_RUN_SAMPLES` samples
stays a sample of its own."""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import runs
from .runs import Arena, Run
from .samples import Sample

_TABLES: Dict[tuple, tuple] = {}  # one object per pattern table (the decoder keeps what it works out for it)


class WalkedRun(Run):
    """Consecutive samples of the header walk, their wanted members side by side in one buffer:
    a :class:`~dalistream.tar.runs.Run` whose keys and samples are those the walk gave."""

    __slots__ = ("keys", "samples")

    def key(self, i: int, lowercase: bool = False) -> str:
        return self.keys[i]

    def sample(self, i: int, lowercase: bool = False, wanted: Callable[[str], bool] = lambda ext: True) -> Sample:
        return self.samples[i]


def walked_runs(samples: Iterator[Sample], url: str, arena: Optional[Arena], run_bytes: int,
                first_runs: Sequence[int] = ()) -> Iterator[Union[Run, Sample]]:
    """``samples`` (of :func:`~dalistream.tar.samples.iter_samples`) with the consecutive whole
    ones that hold wanted members (those passed over hold none) gathered into :class:`WalkedRun` s
    of about ``run_bytes`` of members (``first_runs``: the first runs' bytes, as for
    :func:`~dalistream.tar.runs.sliced_runs`); others as they come. A problem of the stream is
    raised after the run gathered before it."""
    group: List[Tuple[Sample, List[str], List[bytes]]] = []
    size = made = 0
    large = run_bytes // max(1, runs.MIN_RUN_SAMPLES)  # a sample of more bytes stays alone
    try:
        for sample in samples:
            exts = [k for k, v in sample.items() if v is not None and k[:2] != "__"]
            data = [sample[k] for k in exts]
            n = sum(map(len, data))  # type: ignore[arg-type]
            alone = not exts or n > large or "__error__" in sample
            if group and (alone or sample["__index__"] != group[-1][0]["__index__"] + 1):  # type: ignore[operator]
                yield _gathered(group, url, arena)
                group, size, made = [], 0, made + 1
            if alone:
                yield sample
                continue
            group.append((sample, exts, data))  # type: ignore[arg-type]
            size += n
            if size >= (first_runs[made] if made < len(first_runs) else run_bytes):
                yield _gathered(group, url, arena)
                group, size, made = [], 0, made + 1
    except Exception:
        if group:
            yield _gathered(group, url, arena)
        raise
    if group:
        yield _gathered(group, url, arena)


def _gathered(group: List[Tuple[Sample, List[str], List[bytes]]], url: str, arena: Optional[Arena]) -> WalkedRun:
    """One run of ``group``'s wanted members (each sample's, with their extensions), side by side."""
    tables: Dict[Tuple[str, ...], int] = {}
    kinds = [tables.setdefault(tuple(exts), len(tables)) for _, exts, _ in group]
    members = [m for _, _, data in group for m in data]
    sizes = np.fromiter(map(len, members), np.int64, len(members))
    member_at = np.zeros(len(members), np.int64)
    np.cumsum(sizes[:-1], out=member_at[1:])
    total = int(sizes.sum())
    data = arena.take(total) if arena is not None else memoryview(bytearray(total))
    where = arena.last if arena is not None else (data.obj, 0)
    for member, at, size in zip(members, member_at.tolist(), sizes.tolist()):
        data[at:at + size] = member
    table = tuple(tables)
    names = _TABLES.setdefault(table, table)
    if len(_TABLES) > 256:
        _TABLES.clear()
    member_base = np.zeros(len(group) + 1, np.int64)
    np.cumsum([len(exts) for _, exts, _ in group], out=member_base[1:])
    samples = [s for s, _, _ in group]
    run = WalkedRun(url, samples[0]["__index__"], data, np.array([s["__offset__"] for s in samples], np.int64),  # type: ignore[arg-type]
                    np.array(kinds, np.int64), names, member_base, member_at, sizes, total, where)
    run.keys = [s["__key__"] for s in samples]
    run.samples = samples
    return run
