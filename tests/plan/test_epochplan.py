"""The one plan protocol (:mod:`dalistream.plan.epochplan`): every worker's reading, and every
rank's steps, identical to those of the code before it, on a grid of small synthetic data sets
(W 1-3, R 1-2, B 1-16, exact/even/fixed, interleaved and one span, a two-source mix, buckets, a bucketed mix, node affinity; fresh and resumed from a random step of
another layout; epochs 0 and 1; each (rank, worker)'s reading digested); its state and the
rest of an epoch on another layout, one operation over any plan.

The frozen expectation, ``tests/plan/data/readings.json``, was written by the code before the plan
protocol (commit af68563, where ``mixing.py``'s if-chains chose the plan; written again from 916b5bd, the same dispatch, after bucket plans came to read 2B columns), with this module's
``readings`` and the reading function of then::

    def before(stream, epoch, worker, resume, first):
        from dalistream import mixing
        c, data, mix = stream.config, stream.data, stream.mix
        if c.buckets is not None:
            last = (c.rank, worker) == (c.world_size - 1, c.workers - 1) and c.policy == "even" and mix is None
            left_out = mixing.bucket_epoch(c, data, epoch, resume, c.rank).left_out_count if last else 0
            return {"reading": mixing.worker_run(c, data, mix, epoch, worker, resume, first), "left_out": left_out}
        columns = mixing.worker_columns(c, data, mix, epoch, worker, resume)
        return {"reading": columns, "left_out": sum(p.left_out for p, _, _ in columns) if mix is None else 0}

    json.dump(readings(before), sys.stdout, indent=0, sort_keys=True)

``python tests/plan/test_epochplan.py > tests/plan/data/readings.json`` writes it again from the
code of now (:func:`reading_of`): only for a change of the plans that is meant, and said."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import sys
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

from dalistream import LengthBuckets
from dalistream.config import StreamConfig
from dalistream.dataset import DataSet
from dalistream.errors import DalistreamError, StateError
from dalistream.mixing import Mix, MixedSource
from dalistream.plan.epochplan import EpochPlan, Reading, epoch_plan
from dalistream.stream import Stream, bucketed

COUNTS = (37, 52, 9, 61, 44, 30, 23, 58)
OTHER = (25, 40, 33, 19, 48)
EDGES = [12, 24, 40]
FIELDS = {"key": "__key__"}


def plain(value: Any) -> Any:
    """``value`` as JSON-able plain data (dataclasses, arrays, sets, tuples)."""
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [str(value.dtype), plain(value.tolist())]
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    return value


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(plain(value), sort_keys=True).encode()).hexdigest()[:20]


def data_set(counts: Tuple[int, ...], name: str, keyed: bool) -> DataSet:
    urls = tuple(f"/synthetic/{name}-{i:04d}.tar" for i in range(len(counts)))
    keys = None
    if keyed:
        rng = np.random.default_rng(len(counts))
        keys = {c: rng.integers(1, 60, sum(counts)) for c in LengthBuckets("txt", EDGES).columns}
    return DataSet(urls, counts, keys=keys)


def cases() -> List[Dict[str, Any]]:
    """The grid: W 1-3, R 1-2, B 1-16, exact/even/fixed, interleaved and one span, a two-source
    mix (per sample and per source), buckets (per rank, per global), node affinity."""
    out = []
    for policy in ("exact", "even", "fixed"):
        for interleave in (True, False):
            for world, workers, batch in ((1, 1, 1), (1, 3, 7), (2, 2, 4), (2, 3, 16), (2, 1, 5)):
                out.append(dict(kind="one", policy=policy, interleave=interleave, world=world, workers=workers,
                                batch=batch))
    for per_batch in ("sample", "source"):
        for interleave in (True, False):
            for world, workers, batch in ((1, 2, 6), (2, 3, 12), (2, 1, 4)):
                out.append(dict(kind="mix", policy="even", interleave=interleave, world=world, workers=workers,
                                batch=batch, per_batch=per_batch))
    for policy in ("exact", "even"):
        for per in ("rank", "global"):
            for world, workers, batch in ((1, 2, 6), (2, 3, 4), (2, 1, 8)):
                out.append(dict(kind="buckets", policy=policy, per=per, world=world, workers=workers, batch=batch))
    for world, workers, batch in ((2, 1, 4), (2, 2, 6)):
        out.append(dict(kind="mixbuckets", policy="even", per="rank", world=world, workers=workers, batch=batch))
    for policy in ("exact", "even"):
        for interleave in (True, False):
            for world, workers, batch, per_node in ((2, 2, 4, 1), (2, 1, 6, 2), (2, 3, 3, 1)):
                out.append(dict(kind="affinity", policy=policy, interleave=interleave, world=world,
                                workers=workers, batch=batch, ranks_per_node=per_node))
    return out


def case_name(case: Dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(case.items()))


def stream_of(case: Dict[str, Any], rank: int, world: int, workers: int, batch: int) -> Stream:
    """The stream of ``case`` on another layout (rank ``rank`` of ``world``), resolved as
    :func:`dalistream.stream.resolve` does, without files."""
    kind = case["kind"]
    options: Dict[str, Any] = dict(policy=case["policy"], seed=3)
    if case["policy"] == "fixed":
        options.update(batches_per_epoch=3, manifest="/synthetic/manifest.json")  # (counted: a manifest's)
    if kind in ("one", "affinity", "mix"):
        options["interleave"] = case["interleave"]
        if not case["interleave"]:
            options["shuffle"] = 8
    if kind == "affinity":
        options.update(affinity="node", ranks_per_node=case["ranks_per_node"])
    if kind in ("buckets", "mixbuckets"):
        options["buckets"] = LengthBuckets("txt", EDGES, per=case["per"])
    config = StreamConfig(sources=("/synthetic",), fields=FIELDS, batch_size=batch, workers=workers, rank=rank,
                          world_size=world, **options)
    keyed = kind in ("buckets", "mixbuckets")
    if kind in ("mix", "mixbuckets"):
        sources = (MixedSource("a", 0.7, data_set(COUNTS, "a", keyed), {}),
                   MixedSource("b", 0.3, data_set(OTHER, "b", keyed), {}))
        mix = Mix(sources, case.get("per_batch", "source" if keyed else "sample"))
        data = DataSet(sources[0].data.urls + sources[1].data.urls, COUNTS + OTHER, count_source="mix")
    else:
        mix, data = None, data_set(COUNTS, "one", keyed)
    if keyed:
        config, data, mix = bucketed(config, data, mix)
    return Stream(config, data, mix=mix)


def resumed(case: Dict[str, Any], epoch: int, rng: random.Random) -> Tuple[Tuple[int, ...], ...]:
    """A state saved at a random step of ``epoch`` on another layout (one more rank and worker),
    going on under the case's layout: the resume segments (:func:`dalistream.plan.continued`)."""
    from dalistream.plan import continued

    world, workers, batch = case["world"], case["workers"], case["batch"]
    if case["kind"] == "affinity":
        world = world * 2 if case["ranks_per_node"] == 1 else world
        other = stream_of(case, 0, world, min(workers + 1, batch), batch)
    else:
        other = stream_of(case, 0, world + 1, min(workers + 1, batch), batch)
    steps = other.steps(epoch)
    if steps < 2:
        return ()
    step = rng.randrange(1, steps)
    now = stream_of(case, 0, case["world"], workers, batch)
    nodes = (lambda c: c.nodes.count if c.nodes is not None else None)
    segments, _ = continued((), other.segment_head(other.config.layout, nodes(other.config)), step,
                            now.segment_head(now.config.layout, nodes(now.config)))
    return segments


def readings(reading: Callable[[Stream, int, int, Tuple, int], Any]) -> Dict[str, Any]:
    """Every case's steps per rank and each (rank, worker)'s reading digest, fresh and resumed,
    epochs 0 and 1; ``reading(stream, epoch, worker, resume, first)``: what the worker receives."""
    rng = random.Random(60)
    out: Dict[str, Any] = {}
    for case in cases():
        for epoch in (0, 1):
            for resume in ((), resumed(case, epoch, rng)):
                if case["kind"] == "mixbuckets" and resume:
                    continue  # (refused: a bucketed mix resumes on its own layout only)
                if resume == () and out.get(case_name(case) + f",epoch={epoch},resumed=True") is not None:
                    continue
                key = case_name(case) + f",epoch={epoch},resumed={bool(resume)}"
                steps, worker_digests = [], []
                try:
                    for rank in range(case["world"]):
                        stream = stream_of(case, rank, case["world"], case["workers"], case["batch"])
                        n = stream.steps(epoch, resume)
                        steps.append(n)
                        first = rng.randrange(0, n) if n else 0
                        for worker in range(case["workers"]):
                            worker_digests.append(digest(reading(stream, epoch, worker, resume, first)))
                except DalistreamError as e:  # (a refusal is an expectation too)
                    out[key] = {"resume": [list(s) for s in resume], "refused": f"{type(e).__name__}: {e}"}
                    continue
                out[key] = {"resume": [list(s) for s in resume], "steps": steps, "readings": worker_digests}
    return out


def reading_of(stream: Stream, epoch: int, worker: int, resume: Tuple, first: int) -> Any:
    """What the worker receives of the one plan (:func:`dalistream.plan.epochplan.epoch_plan`):
    its bucket run, or its columns, and the samples left out it counts."""
    from dalistream.plan.epochplan import epoch_plan

    reading = epoch_plan(stream.config, stream.data, stream.mix, epoch, resume).for_worker(stream.config.rank, worker,
                                                                                             first)
    return {"reading": reading.run if reading.run is not None else list(reading.columns), "left_out": reading.left_out}


FROZEN = os.path.join(os.path.dirname(__file__), "data", "readings.json")


@pytest.fixture(scope="module")
def now():
    return readings(reading_of)


@pytest.fixture(scope="module")
def frozen():
    with open(FROZEN) as f:
        return json.load(f)


KINDS = ("one", "mix", "buckets", "mixbuckets", "affinity")


@pytest.mark.parametrize("kind", KINDS)
def test_every_worker_reads_what_it_read_before_the_protocol(now, frozen, kind):
    keys = sorted(k for k in frozen if f"kind={kind}," in k)
    assert keys and sorted(k for k in now if f"kind={kind}," in k) == keys
    assert any(frozen[k]["resume"] for k in keys) or kind == "mixbuckets"  # (resumed cases are in the grid)
    wrong = [k for k in keys if now[k] != frozen[k]]
    assert not wrong, f"{len(wrong)} of {len(keys)} cases differ, e.g. {wrong[0]}: {now[wrong[0]]} != {frozen[wrong[0]]}"


@pytest.mark.parametrize("case", [c for c in cases() if c["kind"] != "mixbuckets"][::5], ids=case_name)
def test_rest_on_another_layout_is_the_plan_of_the_segments_that_ran(case):
    """``rest`` after ``state``: the same steps and readings as the factory given the segments
    a loader state saves (one operation over any plan), and the same layout goes on at its step."""
    rng = random.Random(7)
    other = stream_of(case, 0, case["world"], case["workers"], case["batch"])
    plan = epoch_plan(other.config, other.data, other.mix, 1)
    assert isinstance(plan, EpochPlan)
    step = rng.randrange(1, plan.steps) if plan.steps > 1 else plan.steps
    same, first = plan.rest(other.config, step)
    assert (same.steps, first, same.resume) == (plan.steps, step, ())
    world = case["world"] * 2 if case["kind"] == "affinity" else case["world"] + 1  # (whole nodes more)
    bigger = stream_of(case, 0, world, case["workers"], case["batch"])
    rest, first = plan.rest(bigger.config, step)
    assert first == 0 and rest.resume == plan.state(step)
    (segment,) = plan.state(step)  # this layout's head, as a loader state says it, and the steps that ran
    nodes = other.config.nodes.count if other.config.nodes is not None else None
    assert segment[3] == step and segment[:3] + segment[4:] == other.segment_head(other.config.layout, nodes)
    assert rest.steps == bigger.steps(1, rest.resume)
    for worker in range(bigger.config.workers):
        reading = rest.for_worker(0, worker)
        assert isinstance(reading, Reading) and reading.steps == rest.steps
        expected = epoch_plan(bigger.config, bigger.data, bigger.mix, 1, plan.state(step)).for_worker(0, worker)
        assert [p for p, _, _ in reading.columns] == [p for p, _, _ in expected.columns]


def test_a_bucketed_mix_resumes_on_its_own_layout_only():
    case = next(c for c in cases() if c["kind"] == "mixbuckets")
    stream = stream_of(case, 0, case["world"], case["workers"], case["batch"])
    with pytest.raises(StateError, match="resumes on the layout it was saved under"):
        epoch_plan(stream.config, stream.data, stream.mix, 0, resumed(dict(case, kind="buckets"), 0, random.Random(1))
                   or ((3, 1, case["batch"], 1),))


if __name__ == "__main__":
    json.dump(readings(reading_of), sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")
