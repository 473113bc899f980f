"""A worker's open files stay within a budget (dalistream/io/openfiles.py), whatever the number of
interleaved columns it reads: under ``ulimit -n 1024`` a worker of 512 and of 4,096 columns delivers
the batches it delivers without the limit, its open descriptors within its table's budget, local
shards with member layouts (a fresh epoch read at once, mapped; a resumed one read by the
columns) and without (header walk), gzip shards, S3 (the sockets: the client's pool), and S3
through the node-local byte cache (its block files: one descriptor each, within the budget).

Each worker runs in a process of its own (``open_files_child.py``): the source is pickled here as
it is handed to DALI, and the child lives as DALI's worker does (its entry point raises the soft
limit to the hard one, and sets the budget from it)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pickle
import resource
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest

from dalistream.config import StreamConfig
from dalistream.dataset import DataSet
from dalistream.io.openfiles import files_budget
from dalistream.io.options import MAX_IN_FLIGHT, with_cache
from dalistream.manifest import build_manifest
from dalistream.manifest.offsets import SampleOffsets
from dalistream.manifest.rows import ShardRows
from dalistream.worker import WorkerSource

from helpers import write_tar

CHILD = os.path.join(os.path.dirname(__file__), "open_files_child.py")
SHARDS = 2048  # 4,096 columns: two per shard, 2,048 files read at once
LIMIT = 1024  # many systems' soft limit of open files (ulimit -n)
SLACK = MAX_IN_FLIGHT + 8  # descriptors a worker may hold besides its shard files: its client's sockets, a module imported

pytestmark = pytest.mark.timeout(600)


def write_shards(folder, per_shard: int) -> dict:
    """2,048 shards of ``per_shard`` tiny samples, plain and gzip, and their manifest rows."""
    rng = np.random.default_rng(61)
    plain, zipped = [], []
    for s in range(SHARDS):
        members = []
        for i in range(per_shard):
            members += [(f"s{s}/{i}.bin", rng.bytes(int(rng.integers(20, 90)))), (f"s{s}/{i}.cls", str(i).encode())]
        plain.append(write_tar(str(folder / f"f-{s:04d}.tar"), members))
        zipped.append(str(folder / f"f-{s:04d}.tar.gz"))
        with open(plain[-1], "rb") as f, gzip.open(zipped[-1], "wb", compresslevel=1) as g:
            g.write(f.read())
    return {"plain": plain, "gzip": zipped, "per_shard": per_shard,
            "rows": ShardRows.from_infos(build_manifest(plain, offsets=True))}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """``shards(per_shard)``: :func:`write_shards`, written once per size. 512 columns read 4 tiny
    samples of each shard (an epoch of one share, all 2,048 shards mapped at once); 4,096 columns
    8 (so that a resumed column still reads runs of several samples: its part stays open)."""
    made = {}

    def of(per_shard: int) -> dict:
        if per_shard not in made:
            made[per_shard] = write_shards(tmp_path_factory.mktemp(f"open-files-{per_shard}"), per_shard)
        return made[per_shard]

    return of


def data_of(shards, kind: str, urls=None) -> DataSet:
    """The data set of the shards: ``manifest`` (member layouts), ``header walk`` (offsets only),
    ``gzip`` (the same tars compressed); ``urls``: where they are read (S3)."""
    rows, per_shard = shards["rows"], shards["per_shard"]
    if kind == "header walk":
        offsets = SampleOffsets.from_flat(rows.starts, np.asarray(rows.offsets))
    else:
        offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
    paths = shards["gzip" if kind == "gzip" else "plain"]
    size = sum(os.path.getsize(p) for p in shards["plain"]) / (SHARDS * per_shard)
    return DataSet(tuple(urls or paths), (per_shard,) * SHARDS, offsets, bytes_per_sample=size)


def run_worker(tmp_path, data: DataSet, columns: int, start_step: int = 0, limit=None, more: str = f"budget+{SLACK}",
               epochs: int = 2, run_bytes: Optional[int] = None, **options) -> dict:
    """One worker of ``columns`` interleaved columns, run in a process of its own as DALI runs it
    (``epochs``, the first from ``start_step``), its soft and hard limits of open files ``limit``
    (none: this process's), then, once its entry point has run, ``more`` descriptors than it held
    (``budget+N``: its budget and N more), its runs of about ``run_bytes`` (none: as they are): what
    the child reports."""
    config = StreamConfig(sources=data.urls, fields={"key": "__key__", "raw": "bin", "label": "cls"},
                          batch_size=columns, workers=1, interleave=True, seed=7, **options)
    source = WorkerSource(config, data, 0, start_step=start_step).for_dali()  # (pickled as DALI ships it)
    path = str(tmp_path / f"source-{columns}-{limit}.pickle")
    with open(path, "wb") as f:
        pickle.dump(source, f)

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, limit)

    short = [str(run_bytes)] if run_bytes is not None else []
    done = subprocess.run([sys.executable, CHILD, path, str(epochs), more, *short], capture_output=True, text=True,
                          timeout=500, preexec_fn=limited if limit is not None else None)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_bounded(tmp_path, data: DataSet, columns: int, start_step: int = 0, **kw) -> dict:
    """The worker under ``ulimit -n 1024`` delivers what it delivers without the limit, its open
    descriptors within its budget (the child's limit, once its budget is set, is the budget and
    ``SLACK`` over what it held before: the kernel refuses any more); the limited run's report."""
    free = run_worker(tmp_path, data, columns, start_step, **kw)
    limited = run_worker(tmp_path, data, columns, start_step, limit=(LIMIT, LIMIT), **kw)
    assert limited["batches"] == free["batches"] > 0
    assert limited["digest"] == free["digest"]  # the same batches, byte for byte
    assert limited["soft"] == LIMIT and limited["budget"] == files_budget(LIMIT) < LIMIT
    assert limited["peak"] - limited["base"] <= limited["budget"]
    return limited


@pytest.mark.parametrize("kind, start_step, columns", [
    ("manifest", 0, 512), ("manifest", 0, 4096), ("manifest", 1, 512), ("manifest", 1, 4096),
    ("header walk", 1, 4096), ("gzip", 0, 4096)],
    ids=["manifest-fresh-512", "manifest-fresh-4096", "manifest-resumed-512", "manifest-resumed-4096",
         "header-walk-resumed-4096", "gzip-4096"])
def test_a_worker_s_open_files_stay_within_its_budget_under_ulimit_1024(tmp_path, shards, kind, start_step, columns):
    """A fresh epoch with member layouts is read at once, its shards mapped (a share's files used
    to be opened all at once: 2,048 here); a resumed one, one without member layouts and gzip
    shards are read by the columns, each column's part of some shard open at once (a descriptor
    per file used to be held for each part read now, and one more for each mapping of it: 512
    columns of mapped parts held over 1,024). Runs of a kilobyte (and read buffers of 2 kB: the
    worker's read-ahead of 1 MB shared), so that tiny parts are cut out of their files' mappings
    as parts of large shards are."""
    check_bounded(tmp_path, data_of(shards(4 if columns == 512 else 8), kind), columns, start_step, run_bytes=1024,
                  storage_options={"read_ahead_bytes": 1 << 20})


@pytest.fixture(scope="module")
def s3_shards(shards, moto_endpoint):
    """The plain shards of 8 samples under ``s3://open-files/``."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket="open-files")
    urls = []
    for path in shards(8)["plain"]:
        client.upload_file(path, "open-files", os.path.basename(path))
        urls.append(f"s3://open-files/{os.path.basename(path)}")
    return urls


@pytest.mark.s3
@pytest.mark.parametrize("columns", [512, 4096])
def test_a_worker_reading_s3_holds_no_more_sockets_than_its_client_s_pool(tmp_path, shards, s3_shards, moto_endpoint,
                                                                        columns):
    """Remote parts hold sockets, not files: a worker's requests in flight, and its client's pool of
    connections, are :data:`~dalistream.io.options.MAX_IN_FLIGHT` whatever its columns. Under
    ``ulimit -n 1024``, then with no more descriptors than that pool and a few over what it held
    before reading, it delivers what it delivers from the same shards on local disk."""
    local = run_worker(tmp_path, data_of(shards(8), "manifest"), columns, epochs=1)
    remote = run_worker(tmp_path, data_of(shards(8), "manifest", s3_shards), columns, limit=(LIMIT, LIMIT),
                        more=str(MAX_IN_FLIGHT + 8), epochs=1, storage_options={"endpoint_url": moto_endpoint})
    assert remote["batches"] == local["batches"] > 0 and remote["digest"] == local["digest"]
    assert remote["sockets"] <= MAX_IN_FLIGHT and remote["peak"] - remote["base"] <= MAX_IN_FLIGHT + 8


@pytest.mark.s3
@pytest.mark.parametrize("columns, limit", [(512, 512), (4096, LIMIT)], ids=["512-ulimit-512", "4096-ulimit-1024"])
def test_a_worker_reading_s3_through_the_byte_cache_keeps_its_block_files_within_its_budget(tmp_path, shards,
                                                                                          s3_shards, moto_endpoint,
                                                                                          columns, limit):
    """Reads through the node-local byte cache (``cache=``) hold a cache block's file for each
    column on it (one per column used to be open: 4,096 columns, 4,096 descriptors): now one per
    block file, in the worker's table of open files, within its budget. Two epochs, the second
    from the cache, under ``ulimit -n`` below the columns' descriptors (512 columns under 512, 4,096
    under 1,024; then no more descriptors than the budget, the client's pool and a few), deliver what the same shards on local disk deliver (the cache set
    as ``Stream.open`` sets it: :func:`~dalistream.io.options.with_cache`)."""
    local = run_worker(tmp_path, data_of(shards(8), "manifest"), columns)
    remote = run_worker(tmp_path, data_of(shards(8), "manifest", s3_shards), columns, limit=(limit, limit),
                        storage_options=with_cache({"endpoint_url": moto_endpoint}, str(tmp_path / f"cache-{columns}"),
                                                   None))
    assert remote["batches"] == local["batches"] > 0 and remote["digest"] == local["digest"]
    assert remote["soft"] == limit and remote["budget"] == files_budget(limit) < columns
    assert remote["peak"] - remote["base"] <= remote["budget"] + SLACK
    first, second = remote["io_by_epoch"]["0"], remote["io_by_epoch"]["1"]
    assert first["cache_misses"] > 0 and second["cache_hits"] > 0
    assert second["cache_misses"] == 0 and second["bytes"] == 0  # (the second epoch read from the cache alone)


def test_a_worker_raises_its_soft_limit_to_the_hard_one_and_keeps_a_share_of_it(tmp_path, shards):
    """The worker's entry point raises the soft limit of open files where the hard one allows, and
    its table's budget is a share of the limit it has then."""
    report = run_worker(tmp_path, data_of(shards(4), "manifest"), 512, 1, limit=(256, LIMIT))
    assert report["soft"] == LIMIT and report["budget"] == files_budget(LIMIT)
    assert report["peak"] - report["base"] <= report["budget"]
