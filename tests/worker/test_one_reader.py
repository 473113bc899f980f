"""One reader (#60): a worker's batches, byte for byte, on a grid of its reading, against those
the code before the reader's paths were merged delivered.

The grid (:func:`cases`): W 1-3, R 1-2, B 1-16, ``exact``/``even``/``fixed``, interleaved and one
span, one source or a two-source mix, buckets (per rank, per global), fresh, resumed at a random
step and resumed on another layout (an elastic resume's rest), no damage or damage under ``skip``
and ``raise``, local and S3 (moto), shards with member layouts or an index of offsets only, the
reads' default sizes or small ones (short runs, runs cut out of a local file's mapping, an epoch
read in several shares). The whole product is far too large to read here: :func:`cases` is a
covering selection, the local reads of one stream, interleaved, every way (each index, one source or a mix, each start,
damage and read size), and every pair of two axes' values in at least one case (where the pair is
allowed: a mix is ``even`` only, buckets read no ``fixed`` epoch, a bucketed mix resumes on its
own layout only), so every axis value is read with every value of each other axis.

Each case reads every (rank, worker)'s source of the case, from ``WorkerSource.epoch_batches``
(no DALI, no Loader): its start epoch (from its resume step) and the epoch after it. What each
gives is digested (:func:`outcome`): every batch's outputs' bytes, the error that stopped it
(under ``raise``: its type and message), the skips and the samples, padding and drops it counted;
where an error stopped it, the batches before it are those of the code before as far as both
go (:func:`same`).

The frozen expectation, ``tests/worker/data/one_reader.json``, was written by the code at
980b398 (the worker's nine read paths: the column path, the epoch read at once from one mapping
or by ranges, neighbouring parts read together, views of a local file's mapping …) with::

    python tests/worker/test_one_reader.py > tests/worker/data/one_reader.json

Write it again only for a change of the batches that is meant, and said. Changed since: a part
read from the offset of a sample whose header is damaged names it as damage (``shards:bad_tar``,
the header's offset), where the code before called the shard no tar (``not_tar``, "offset 0"):
13 cases' skip reasons and errors, their batches the same. And a ``fixed`` epoch is read at once
(its columns' passes unrolled), reading only the samples its batches deliver, where its columns
read ahead past them: 4 (rank, worker) outcomes of 3 cases (``fixed``, damage under ``raise``,
member layouts) that met damage past the epoch's last batch deliver the epoch whole instead
(their other outcomes, and every ``fixed`` case under ``skip``, the same).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import itertools
import json
import os
import random
import shutil
import sys
import tarfile
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

pytestmark = pytest.mark.s3  # (every case's data is on a moto S3 server too)

COUNTS_A = (23, 31, 17, 40, 9, 28)
COUNTS_B = (19, 26, 33, 14)
EDGES = [12, 24, 40]
FIELDS = {"key": "__key__", "raw": "bin", "label": "cls"}
BUCKET = "onereader"
BAD_LABEL = "a001/00011"  # a sample whose label is no number (the decoder refuses it)

AXES: Dict[str, Tuple] = {
    "layout": ((1, 1, 1), (1, 2, 5), (1, 3, 7), (1, 1, 16), (2, 1, 3), (2, 2, 16), (2, 3, 9)),  # (R, W, B)
    "policy": ("exact", "even", "fixed"),
    "order": ("interleaved", "span"),
    "sources": ("one", "mix"),
    "buckets": ("none", "rank", "global"),
    "start": ("fresh", "step", "elastic"),
    "damage": ("none", "skip", "raise"),
    "store": ("local", "s3"),
    "index": ("members", "offsets"),
    "reads": ("default", "small"),
}


def allowed(case: Dict[str, Any]) -> bool:
    """Whether the stream of ``case`` opens (the grid's combinations a user can ask for)."""
    if case["sources"] == "mix" and case["policy"] != "even":
        return False  # (a mix's epoch is set by its weights)
    if case["sources"] == "mix" and case["layout"][2] < 3:
        return False  # (each source's share of a batch: at least a sample)
    if case["buckets"] != "none" and case["policy"] == "fixed":
        return False
    if case["buckets"] != "none" and case["order"] == "span":
        return False  # (a bucket plan places its samples itself: no order to choose)
    if case["sources"] == "mix" and case["buckets"] != "none" and (case["start"] == "elastic" or case["buckets"] == "global"):
        return False  # (a bucketed mix: per rank, resumed on its own layout only)
    if case["policy"] == "fixed" and case["start"] == "elastic":
        return False
    return True


def cases() -> List[Dict[str, Any]]:
    """A covering selection of the grid (see the module doc): greedy, each case the allowed one
    of a few hundred drawn that covers the most pairs of axis values not yet covered."""
    rng = random.Random(60)
    names = list(AXES)

    def pairs(case):
        return {(a, case[a], b, case[b]) for a, b in itertools.combinations(names, 2)}

    wanted = set()
    for a, b in itertools.combinations(names, 2):
        for x in AXES[a]:
            for y in AXES[b]:
                probe = [c for c in (dict({n: rng.choice(AXES[n]) for n in names}, **{a: x, b: y}) for _ in range(200))
                         if allowed(c)]
                if probe:
                    wanted.add((a, x, b, y))
    out: List[Dict[str, Any]] = []
    # the local reads of one stream every way a worker's reader may take them (the epoch read at
    # once, from one mapping or by ranges; the columns, their neighbours' parts read together),
    # each with the others axes' values drawn
    for index, sources, start, damage, reads, many in itertools.product(
            AXES["index"], AXES["sources"], AXES["start"], AXES["damage"], AXES["reads"], (True, False)):
        while True:  # (``many``: 16 columns of a few samples each, whose parts lie end to end)
            case = dict({n: rng.choice(AXES[n]) for n in names}, index=index, sources=sources, start=start,
                        damage=damage, reads=reads, store="local", order="interleaved", buckets="none")
            if many:
                case["layout"] = (1, 1, 16)
            if allowed(case) and case not in out:
                break
        out.append(case)
        wanted -= pairs(case)
    while wanted:
        best, gain = None, 0
        for _ in range(300):
            case = {n: rng.choice(AXES[n]) for n in names}
            a, x, b, y = sorted(wanted, key=repr)[rng.randrange(len(wanted))]
            case[a], case[b] = x, y
            if allowed(case) and len(pairs(case) & wanted) > gain:
                best, gain = case, len(pairs(case) & wanted)
        if best is None:
            break
        out.append(best)
        wanted -= pairs(best)
    return out


def case_name(case: Dict[str, Any]) -> str:
    return ",".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in case.items())


# -- the data: real tar shards, indexed as `dalistream index` indexes them -------------------------

def write_source(directory: str, name: str, counts: Tuple[int, ...], seed: int) -> None:
    """Shards of samples ``bin`` (random bytes, 200 B to 6 kB), ``cls`` (a label), ``txt`` (a
    caption, the buckets' key), written by Python's tarfile (mtime 0): the same bytes each time."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    for s, n in enumerate(counts):
        with tarfile.open(os.path.join(directory, f"{name}-{s:04d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(n):
                key = f"{name}{s:03d}/{i:05d}"
                label = b"x7" if key == BAD_LABEL else str(i % 7).encode()
                members = (("bin", rng.bytes(int(rng.integers(200, 6000)))), ("cls", label),
                           ("txt", bytes(97 + k % 26 for k in range(int(rng.integers(1, 60))))))
                for ext, value in members:
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(value)
                    tar.addfile(info, io.BytesIO(value))


def index(directory: str, members: bool, env: Dict[str, str] = {}) -> None:
    from dalistream.cli import main

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["index", directory, "--keys", "txt"] + ([] if members else ["--no-members"])) == 0
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.update({k: v})


def damage(path: str) -> None:
    """Damage a shard of ``a`` after it was indexed, its size kept: shard 1, a member header's
    magic overwritten (a header check that fails, mid-shard); shard 3, zero blocks from its 30th
    sample on (its end-of-archive marker where samples should be: a shard cut short)."""
    with tarfile.open(os.path.join(path, "a-0001.tar")) as tar:
        header = next(m.offset for m in tar.getmembers() if m.name == "a001/00020.bin")
    with tarfile.open(os.path.join(path, "a-0003.tar")) as tar:
        cut = next(m.offset for m in tar.getmembers() if m.name == "a003/00030.bin")
    for name, at, data in (("a-0001.tar", header + 257, b"xxxxx"), ("a-0003.tar", cut, None)):
        with open(os.path.join(path, name), "r+b") as f:
            size = f.seek(0, 2)
            f.seek(at)
            f.write(data if data is not None else bytes(size - at))


def make_sets(root: str) -> None:
    """``root/<index>[-damaged]/<a|b>``: each source's shards and their manifest."""
    for members in (True, False):
        for damaged in (False, True):
            base = os.path.join(root, ("members" if members else "offsets") + ("-damaged" if damaged else ""))
            for name, counts, seed in (("a", COUNTS_A, 1), ("b", COUNTS_B, 2)):
                write_source(os.path.join(base, name), name, counts, seed)
                index(os.path.join(base, name), members)
            if damaged:
                damage(os.path.join(base, "a"))


def upload(root: str, endpoint: str) -> None:
    """The undamaged sets on S3, indexed there (their manifests name s3:// shards); the damaged
    shards put over them after (as a shard damaged in place)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    for members in ("members", "offsets"):
        for name in ("a", "b"):
            here = os.path.join(root, members, name)
            for f in sorted(os.listdir(here)):
                if f.endswith(".tar"):
                    client.upload_file(os.path.join(here, f), BUCKET, f"{members}/{name}/{f}")
                    client.upload_file(os.path.join(here, f), BUCKET, f"{members}-damaged/{name}/{f}")
            for damaged in ("", "-damaged"):
                index(f"s3://{BUCKET}/{members}{damaged}/{name}/", members == "members", {"AWS_ENDPOINT_URL": endpoint})
        for f in ("a-0001.tar", "a-0003.tar"):
            client.upload_file(os.path.join(root, members + "-damaged", "a", f), BUCKET, f"{members}-damaged/a/{f}")


# -- a case's batches ------------------------------------------------------------------------------

def open_stream(case: Dict[str, Any], place: str, rank: int, world: int, workers: int, batch: int,
                options: Dict[str, Any]):
    from dalistream import LengthBuckets, Stream

    kw: Dict[str, Any] = dict(fields=FIELDS, batch_size=batch, workers=workers, rank=rank, world_size=world,
                              device="cpu", seed=7, policy=case["policy"], env={}, **options)
    kw["on_error"] = "skip" if case["damage"] == "skip" else "raise"
    if case["policy"] == "fixed":  # (its counts from the manifest named: else it owns whole shards)
        kw.update(batches_per_epoch=4, manifest=place + "a" + place[-1] + "dalistream-manifest.json")
    if case["order"] == "span":
        kw.update(interleave=False, shuffle=8)
    elif case["sources"] == "one" and case["buckets"] == "none":
        kw["interleave"] = True
    if case["buckets"] != "none":
        kw["buckets"] = LengthBuckets("txt", EDGES, per=case["buckets"])
    if case["sources"] == "mix":
        kw["per_batch"] = "source" if case["buckets"] != "none" else "sample"
        return Stream.open({"a": (place + "a" + place[-1], 0.6), "b": (place + "b" + place[-1], 0.4)}, **kw)
    return Stream.open(place + "a" + place[-1], **kw)


def digest_batches(batches: List[tuple]) -> str:
    h = hashlib.sha256()
    for outputs in batches:
        for value in outputs:
            for array in (value if isinstance(value, list) else [value]):
                array = np.asarray(array)
                h.update(f"{array.dtype}{array.shape}".encode())
                h.update(array.tobytes())
    return h.hexdigest()[:24]


def outcome(source, epoch: int, start: int, root: str) -> Dict[str, Any]:
    """What ``source`` gives of ``epoch`` from ``start`` on: its batches' digest and number, the
    error that stopped it (its type and message, the data's folder named ``ROOT``), its skips and
    counts of samples, padding and drops."""
    from dalistream.errors import DalistreamError

    batches, error = [], None
    try:
        for outputs in source.epoch_batches(epoch, start):
            batches.append(outputs)
    except DalistreamError as e:
        error = f"{type(e).__name__}: {e}".replace(root, "ROOT")
    stats = source._stats
    totals = {k: v for k, v in stats.totals_by_epoch.get(epoch, {}).items() 
              if k in ("samples", "padded", "dropped") or k.startswith("source:")}
    out = {"batches": len(batches), "digest": digest_batches(batches), "error": error,
           "skipped": {k: v for k, v in sorted(stats.skipped_by_epoch.get(epoch, {}).items())}, "totals": totals}
    if error is not None:  # (each batch's: the error may stop the epoch a round earlier or later, see same())
        out["each"] = [digest_batches([b]) for b in batches]
    return out


def same(got: Dict[str, Any], expected: Dict[str, Any]) -> bool:
    """Whether an outcome is the one expected: the same, or where an error stopped the epoch, the
    same error, and batches of which one's are the first of the other's. (A column meets a bad
    sample, and raises, when it reads the round of steps that holds it: some steps before it, as
    many as the round's start is before it; the code before read some epochs' rounds from other
    steps: the epoch read at once in shares, the columns from the share that failed.)"""
    if expected.get("error") is None or got.get("error") != expected["error"]:
        return got == expected
    a, b = got["each"], expected["each"]
    return a[:len(b)] == b[:len(a)] and got["skipped"] == expected["skipped"]


def run_case(case: Dict[str, Any], root: str, endpoint: str) -> Dict[str, Any]:
    """Every (rank, worker)'s outcome of the case's start epoch and the one after."""
    from dalistream.plan import continued
    from dalistream.worker import WorkerSource

    rng = random.Random(case_name(case))
    world, workers, batch = case["layout"]
    folder = case["index"] + ("-damaged" if case["damage"] != "none" else "")
    options: Dict[str, Any] = {"cache_dir": os.path.join(root, "cache")}
    if case["store"] == "s3":
        place = f"s3://{BUCKET}/{folder}/"
        options["storage_options"] = {"endpoint_url": endpoint}
    else:
        place = os.path.join(root, folder) + os.sep
    if case["reads"] == "small":
        options.setdefault("storage_options", {})["chunk_bytes"] = 8 << 10
    epoch = rng.choice((0, 1, 2))
    out: Dict[str, Any] = {"epoch": epoch}
    for rank in range(world):
        stream = open_stream(case, place, rank, world, workers, batch, options)
        resume, start = (), 0
        if case["start"] == "elastic":
            other = open_stream(case, place, 0, world + 1, min(workers + 1, batch), batch, options)
            ran = rng.randrange(1, other.steps(epoch)) if other.steps(epoch) > 1 else other.steps(epoch)
            nodes = None
            resume, _ = continued((), other.segment_head(other.config.layout, nodes), ran,
                                  stream.segment_head(stream.config.layout, nodes))
            out["resume"] = [list(s) for s in resume]
        elif case["start"] == "step":
            steps = stream.steps(epoch)
            start = rng.randrange(1, steps) if steps > 1 else 0
            out["start"] = start
        for worker in range(workers):
            source = WorkerSource(stream.config, stream.data, worker, start_epoch=epoch, start_step=start,
                                  resume=resume, mix=stream.mix)
            out[f"{rank}/{worker}/{epoch}"] = outcome(source, epoch, start, root)
            out[f"{rank}/{worker}/{epoch + 1}"] = outcome(source, epoch + 1, 0, root)
    return out


@contextlib.contextmanager
def small_reads(on: bool):
    """The reads' sizes of a ``reads=small`` case: runs of about 8 kB, cut out of a local file's
    mapping where a part is longer than a run and a half, and an epoch read at once in shares of
    about 64 kB (a first of 32 kB)."""
    from dalistream.tar import runs
    from dalistream.worker import epochfeed

    saved = {}
    sizes = {(runs, "MIN_RUN_BYTES"): 8 << 10, (runs, "MAPPED_RUN_BYTES"): 16 << 10, (runs, "MIN_RUN_SAMPLES"): 0,
             (epochfeed, "WHOLE_BYTES"): 32 << 10, (epochfeed, "FIRST_SHARE_BYTES"): 32 << 10,
             (epochfeed, "SHARE_BYTES"): 64 << 10, (epochfeed, "WALKED_SHARE_BYTES"): 64 << 10} if on else {}
    for (module, name), value in sizes.items():
        saved[(module, name)] = getattr(module, name)
        setattr(module, name, value)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def outcomes(root: str, endpoint: str, selected=None) -> Dict[str, Any]:
    out = {}
    for case in selected or cases():
        with small_reads(case["reads"] == "small"):
            out[case_name(case)] = run_case(case, root, endpoint)
    return out


FROZEN = os.path.join(os.path.dirname(__file__), "data", "one_reader.json")


@pytest.fixture(scope="module")
def data(tmp_path_factory, moto_endpoint):
    root = str(tmp_path_factory.mktemp("one-reader"))
    make_sets(root)
    upload(root, moto_endpoint)
    return root, moto_endpoint


@pytest.fixture(scope="module")
def frozen():
    with open(FROZEN) as f:
        return json.load(f)


def test_the_grid_covers_every_pair_of_axis_values():
    grid = cases()
    for a, b in itertools.combinations(AXES, 2):
        for x in AXES[a]:
            for y in AXES[b]:
                if any(allowed(dict(c, **{a: x, b: y})) for c in grid):
                    assert any(c[a] == x and c[b] == y for c in grid), (a, x, b, y)


@pytest.mark.parametrize("case", cases(), ids=case_name)
def test_every_worker_delivers_the_batches_of_the_code_before(data, frozen, case):
    root, endpoint = data
    expected = frozen[case_name(case)]
    got = outcomes(root, endpoint, [case])[case_name(case)]
    wrong = [k for k in expected if not (isinstance(expected[k], dict) and same(got.get(k, {}), expected[k]))
             and got.get(k) != expected[k]]
    assert not wrong, f"{wrong[0]}: {got.get(wrong[0])} != {expected[wrong[0]]}"
    assert sorted(got) == sorted(expected)


@pytest.mark.parametrize("error", ["a damaged shard", "a bad sample"])
@pytest.mark.parametrize("order", ["interleaved", "span", "buckets"])
def test_an_epoch_stopped_by_an_error_gives_its_columns_remote_parts_back_at_once(data, order, error):
    """An epoch that an error stops (under ``raise``) gives its columns' remote parts back to the
    worker's read-ahead then, in the thread that read them: none is left to the collector, which
    would close it in whichever thread collects (a read-ahead thread, holding the counters' lock,
    waiting for the read-ahead's, which another held waiting for the counters': the grid above
    hung so)."""
    from dalistream.errors import DalistreamError
    from dalistream.worker import WorkerSource

    root, endpoint = data
    case = dict(policy="exact", order="span" if order == "span" else "interleaved", sources="one",
                buckets="rank" if order == "buckets" else "none", damage="raise")
    folder = "members-damaged" if error == "a damaged shard" else "members"  # (a bad label in both)
    stream = open_stream(case, f"s3://{BUCKET}/{folder}/", 0, 1, 2, 8,
                         {"cache_dir": os.path.join(root, "cache"), "storage_options": {"endpoint_url": endpoint}})
    raised = 0
    gc.disable()  # (what the collector would close is left open: the test sees it)
    try:
        for worker in (0, 1):
            source = WorkerSource(stream.config, stream.data, worker)
            try:
                for _ in source.epoch_batches(0):
                    pass
            except DalistreamError:
                raised += 1
            assert source._fetcher.streams == [] and not source._fetcher.shards
    finally:
        gc.enable()
    assert raised


if __name__ == "__main__":  # the frozen expectation, from the code of now (see the module doc)
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from moto.server import ThreadedMotoServer

    from helpers import free_port

    import logging

    logging.disable(logging.WARNING)
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    root = tempfile.mkdtemp(prefix="one-reader-")
    try:
        make_sets(root)
        upload(root, f"http://127.0.0.1:{port}")
        json.dump(outcomes(root, f"http://127.0.0.1:{port}"), sys.stdout, indent=0, sort_keys=True)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
