"""Span ownership end to end: ``dalistream keys`` per rank (real DALI pipelines) on uneven shards
for a grid of small R × W, two epochs, a resume in the middle of a cut shard; local and S3."""

import io
import json
import os
from contextlib import redirect_stdout

import pytest

from dalistream.cli import main
from dalistream.plan import Layout, Schedule, worker_plan

from helpers import key_shards, shard_keys

pytestmark = [pytest.mark.dali, pytest.mark.slow]

SIZES = [23, 5, 0, 31, 2, 17, 29]  # uneven, one empty, some smaller than a slot
B = 5


def keys(source, rank, R, W, epoch, *extra):
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["keys", *source, "--rank", str(rank), "--world-size", str(R), "-W", str(W), "-B", str(B),
                     "--epoch", str(epoch), "--seed", "3", "--json", *map(str, extra)]) == 0
    return [line["keys"] for line in map(json.loads, out.getvalue().splitlines()) if "keys" in line]


def all_keys():
    return set(shard_keys(SIZES))


def cut_resume_step(R, W, rank, epoch, steps):
    """A step k at which some worker of ``rank`` resumes strictly inside a shard it shares."""
    layout, schedule = Layout(R, W, B), Schedule(3)
    for k in range(1, steps):
        for w in range(W):
            plan = worker_plan(SIZES, len(SIZES), layout, schedule, epoch, rank, w)
            raw = [(s, a, b, i) for s, a, b in plan.parts for i in range(a, b)]
            kept = [x for n, x in enumerate(raw) if n not in set(plan.drop)]  # even's left-out passed over
            if k * layout.slots[w] < len(kept):
                s, a, b, i = kept[k * layout.slots[w]]
                if (a > 0 or b < SIZES[s]) and i > a:
                    return k
    return None


def check_layout(source, R, W, resume_tmp=None):
    for epoch in range(2):
        per_rank = [keys(source, r, R, W, epoch, "--policy", "even") for r in range(R)]
        assert len({len(b) for b in per_rank}) == 1
        flat = [k for batches in per_rank for batch in batches for k in batch]
        assert len(flat) == len(set(flat)) and set(flat) <= all_keys()
        assert len(all_keys()) - len(flat) < R * B  # at most one batch per rank left out
        exact = [k for r in range(R) for batch in keys(source, r, R, W, epoch, "--policy", "exact") for k in batch]
        assert sorted(exact) == sorted(all_keys())
    if resume_tmp is not None:
        epoch = 1
        steps = len(keys(source, 0, R, W, epoch))
        rank, k = next(((r, cut_resume_step(R, W, r, epoch, steps)) for r in reversed(range(R))
                        if cut_resume_step(R, W, r, epoch, steps) is not None), (None, None))
        assert k is not None, "the layout must cut a shard inside some worker's resume"
        full = keys(source, rank, R, W, epoch)
        state = os.path.join(resume_tmp, f"state-{R}-{W}.json")
        head = keys(source, rank, R, W, epoch, "--stop-after", k, "--state-out", state)
        tail = keys(source, rank, R, W, epoch, "--state-in", state)
        assert head + tail == full and len(head) == k


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    d = tmp_path_factory.mktemp("spans")
    key_shards(str(d / "data"), SIZES)
    return d


@pytest.mark.parametrize("R,W", [(1, 3), (2, 2), (3, 2), (4, 1)])
def test_spans_locally(local, R, W):
    check_layout([str(local / "data")], R, W, resume_tmp=str(local))


@pytest.mark.s3
def test_spans_on_s3(local, moto_endpoint):
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="spans")
    for name in sorted(os.listdir(local / "data")):
        s3.upload_file(str(local / "data" / name), "spans", f"ds/{name}")
    assert main(["index", "s3://spans/ds/", "--endpoint-url", moto_endpoint, "--json"]) == 0  # offsets: ranged GETs
    check_layout(["s3://spans/ds/", "--endpoint-url", moto_endpoint], 2, 2, resume_tmp=str(local))


@pytest.mark.parametrize("change", [+4, -6])
def test_a_shard_rewritten_after_indexing_is_named_through_the_pipeline(tmp_path, change):
    from dalistream import Loader, Stream
    from dalistream.errors import DalistreamError

    paths = key_shards(str(tmp_path / "d"), [12, 12, 12])
    assert main(["index", str(tmp_path / "d"), "--json"]) == 0  # dalistream-manifest.json beside them
    key_shards(str(tmp_path / "d"), [12, 12 + change, 12])     # shard 1 rewritten
    stream = Stream.open(str(tmp_path / "d"), fields={"key": "__key__"}, batch_size=4, workers=2, device="cpu",
                         policy="exact", cache_dir=str(tmp_path / "c"))
    with pytest.raises(DalistreamError) as e:
        with Loader(stream) as loader:
            for _ in loader:
                pass
    text = str(e.value)
    assert paths[1] in text and "were counted (manifest" in text and "dalistream-manifest.json" in text
    assert ("at least 13" if change > 0 else "holds 6 samples") in text
