"""A DALI worker is forked from the main process: what the library imports lazily on a worker's
first batch, every worker imports again on the way to the job's first batch (numpy's ``random``
alone took 10-25 ms a worker). Every module a worker's first batches need is loaded with the
package, in the main process, before the workers start."""

import json
import os
import subprocess
import sys

import pytest

from dalistream.tools.synth import SynthSpec, write_dataset

SCRIPT = r"""
import json, sys
import dalistream
from dalistream.worker.source import WorkerSource

sources, options = json.loads(sys.argv[1])
stream = dalistream.Stream.open(sources, **options)
before = set(sys.modules)
for worker in range(stream.config.workers):
    source = iter(WorkerSource(stream.config, stream.data, worker))
    for _ in range(3):
        next(source)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("imports")
    indexed, scanned = str(folder / "indexed"), str(folder / "scanned")
    write_dataset(indexed, SynthSpec(shards=3, samples_per_shard=40, min_size=16, max_size=32))
    write_dataset(scanned, SynthSpec(shards=3, samples_per_shard=40, min_size=16, max_size=32, seed=1))
    from dalistream.cli import main

    assert main(["index", indexed]) == 0
    return {"indexed": indexed, "scanned": scanned}


@pytest.mark.parametrize("kind,options", [
    ("indexed", {}),
    ("scanned", {}),
    ("indexed", {"interleave": False}),
    ("scanned", {"shuffle": 16}),
    ("mix", {}),
])
def test_a_worker_s_first_batches_import_nothing(data, tmp_path, kind, options):
    sources = ({"a": [data["indexed"], 1.0], "b": [data["scanned"], 1.0]} if kind == "mix" else data[kind])
    options = dict(options, fields={"image": "jpg;png", "label": "cls"}, batch_size=8, workers=2,
                   cache_dir=str(tmp_path / "cache"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([sources, options])], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
