"""`dalistream bench --compare litdata,mosaicml`: the converted peers do the same work as dalistream.

The peers' libraries are optional (the `peers` extra); a test of one skips, naming why, where its
library does not import. No timing assertions: only that every figure is there and that every
system read every sample of every epoch (equal work, counted in each run, not assumed).
"""

import json
import os
import subprocess
import sys

import pytest

from dalistream.tools.bench import runner as bench
from dalistream.tools.bench.converted import MODULES, install_command, missing
from dalistream.tools.synth import SynthSpec, write_dataset

pytestmark = [pytest.mark.dali]

SHARDS, PER_SHARD = 4, 40


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("bench-peers"))
    write_dataset(d, SynthSpec(shards=SHARDS, samples_per_shard=PER_SHARD, min_size=32, max_size=64))
    return d


def run_bench(tmp_path, *args, env=None):
    env = dict(env or os.environ, DALISTREAM_CACHE=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "dalistream", "bench", *map(str, args), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)


def report_of(proc, args):
    if proc.returncode != 0:
        raise AssertionError(f"dalistream bench {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def positive(figures, keys):
    for key in keys:
        value = figures[key]
        if not (isinstance(value, (int, float)) and value > 0):
            raise AssertionError(f"{key} = {value!r} is not a positive number in {figures}")


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["litdata", "mosaicml"])
@pytest.mark.parametrize("pipeline,epochs", [("classification_full", 2), ("read-only", 3)])
def test_a_converted_peer_reads_every_sample_of_every_epoch(shards, tmp_path, peer, pipeline, epochs):
    reason = missing(peer)
    if reason:
        pytest.skip(reason)
    args = (shards, "--workers", 2, "--batch-size", 16, "--size", 32, "--pipeline", pipeline,
            "--compare", f"webdataset,{peer}", "--repeats", 2, "--epochs", epochs)
    report = report_of(run_bench(tmp_path, *args), args)
    samples = SHARDS * PER_SHARD
    assert report["config"]["samples"] == samples and report["config"]["pipeline"] == pipeline
    assert set(report["peers"]) == {"webdataset", peer} | ({"sequential-read"} if pipeline == "read-only" else set())
    figures = report["peers"][peer]
    positive(figures, ("samples_per_s", "first_batch_s", "peak_rss_mb", "convert_s"))
    positive(figures["ratio"], ("samples_per_s", "first_batch_s"))
    assert figures["runs"] == 2
    # equal work: every run of every system delivered each sample once per epoch
    for name, runs in [("dalistream", report["samples_runs"])] + [(n, f["samples_runs"]) for n, f in report["peers"].items()]:
        assert runs == [samples * epochs] * 2, (name, runs)
    assert report["convert_s"] is None  # dalistream reads the shards as they are


@pytest.mark.slow
def test_the_full_decode_graph_runs_on_both_dali_systems(shards, tmp_path):
    args = (shards, "--workers", 2, "--batch-size", 16, "--size", 32, "--pipeline", "classification_full",
            "--compare", "dali-native", "--repeats", 1, "--epochs", 2)
    report = report_of(run_bench(tmp_path, *args), args)
    assert report["config"]["pipeline"] == "classification_full"
    positive(report, ("samples_per_s", "first_batch_s"))
    positive(report["peers"]["dali-native"], ("samples_per_s", "first_batch_s"))
    assert report["samples_runs"] == [2 * SHARDS * PER_SHARD]
    # DALI's iterator drops a last partial batch; 160 samples are 10 whole batches of 16
    assert report["peers"]["dali-native"]["samples_runs"] == [2 * SHARDS * PER_SHARD]


def shadowing(tmp_path, files):
    """An environment whose first path entry holds ``files`` ({relative path: text}): packages that
    stand in front of the installed ones."""
    fake = tmp_path / "shadow"
    for name, text in files.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text + "\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))


# the module the peer's opener imports, broken in front of the installed one (MosaicML's: streaming.base,
# the package's __init__ is not run: bench/mds.py)
@pytest.mark.parametrize("peer,module", [("litdata", "litdata"), ("mosaicml", "streaming/base")])
@pytest.mark.parametrize("failure", ["raise ImportError('no module of that name')", "raise RuntimeError('broken build')"])
def test_a_peer_whose_library_fails_to_import_is_refused_by_name(shards, tmp_path, peer, module, failure):
    files = {f"{module}/__init__.py": failure}
    if "/" in module:
        files[f"{module.split('/')[0]}/__init__.py"] = ""
    env = shadowing(tmp_path, files)
    proc = run_bench(tmp_path, shards, "--compare", f"webdataset,{peer}", "--repeats", 1, env=env)
    assert proc.returncode != 0
    # the command that adds the extra keeps this environment's torch (pinned on the same line)
    from importlib import metadata

    command = f'pip install "torch=={metadata.version("torch").split("+")[0]}" -e ".[peers]"'
    assert f"{peer} needs" in proc.stderr and command in proc.stderr, proc.stderr[-2000:]
    assert "samples/s" not in proc.stderr  # refused before any run


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_rotated_rounds_start_at_each_system_in_turn(n):
    systems = [f"s{i}" for i in range(n)]
    rounds = [bench.rotated(systems, r) for r in range(2 * n)]
    assert all(sorted(r) == systems for r in rounds)  # every system once a round
    assert [r[0] for r in rounds[:n]] == systems  # each first in one of n rounds
    assert rounds[n:] == rounds[:n]
    assert [r[-1] for r in rounds[:n]] == systems[-1:] + systems[:-1]  # and last in one


def write_tar(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("lacking,members", [
    ("label", [("a.jpg", b"\xff\xd8a"), ("a.cls", b"3"), ("b.png", b"\x89PNGb")]),
    ("image", [("a.jpg", b"\xff\xd8a"), ("a.cls", b"3"), ("b.cls", b"7"), ("c.jpg", b"\xff\xd8c"), ("c.cls", b"1")]),
])
def test_a_sample_the_converters_cannot_carry_is_an_error_naming_shard_and_member(tmp_path, lacking, members):
    from dalistream.errors import SampleError
    from dalistream.tools.bench.converted import shard_samples

    path = str(tmp_path / "shard.tar")
    write_tar(path, members)
    with pytest.raises(SampleError) as e:
        list(shard_samples(path, {}))
    assert e.value.url == path and e.value.member == "b" and f"no {lacking}" in str(e.value)
    write_tar(path, [m for m in members if not m[0].startswith("b.")])  # without it, every sample in order
    assert [label for _, label in shard_samples(path, {})] == [int(d) for n, d in members if n.endswith(".cls") and not n.startswith("b.")]


# -- the peers' libraries as installed by the `peers` extra ----------------------------------------

def installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def peers_extra():
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from helpers import REPO

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return [Requirement(r) for r in project["optional-dependencies"]["peers"]]


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def test_the_peers_extra_names_the_library_of_every_converted_peer():
    assert sorted(canonical(r.name) for r in peers_extra()) == sorted(canonical(package) for _, package in MODULES.values())


def python_json(code: str, env=None):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# torchvision as it fails beside the CPU build of torch (PyPI's Linux wheels are CUDA builds), or absent
BROKEN_TORCHVISION = {
    "a CUDA build beside CPU torch": "raise RuntimeError('operator torchvision::nms does not exist')",
    "its extension's libraries absent": "raise OSError('libc10_cuda.so: cannot open shared object file')",
    "not installed": "raise ModuleNotFoundError(\"No module named 'torchvision'\", name='torchvision')",
}


@pytest.mark.parametrize("peer", sorted(MODULES))
@pytest.mark.parametrize("torchvision", sorted(BROKEN_TORCHVISION))
def test_an_installed_peer_imports_without_a_working_torchvision(tmp_path, peer, torchvision):
    """Where the extra is installed, every converted peer's library imports, whatever torchvision
    does: mosaicml-streaming requires it and ``import streaming`` imports it, but the bench reads
    MDS through ``streaming.base`` alone (bench/mds.py)."""
    package = MODULES[peer][1]
    if not installed(package):
        pytest.skip(f"{package} is not installed ({install_command()})")
    env = shadowing(tmp_path, {"torchvision/__init__.py": BROKEN_TORCHVISION[torchvision]})
    reason = python_json(f"import json; from dalistream.tools.bench.converted import missing; "
                         f"print(json.dumps(missing({peer!r})))", env=env)
    assert reason is None


LOADED = """
import json, sys
from importlib import metadata
from dalistream.tools.bench.converted import import_library
before = set(sys.modules)
import_library({peer!r})
tops = sorted({{n.split(".")[0] for n in set(sys.modules) - before}} - set(sys.stdlib_module_names) - {{"dalistream"}})
owners = metadata.packages_distributions()
print(json.dumps({{top: owners.get(top, []) for top in tops}}))
"""


@pytest.mark.parametrize("peer", sorted(MODULES))
def test_a_peer_s_library_comes_from_the_extra_s_entry(peer):
    """The module a peer's opener imports is the one the extra's distribution installs (not a
    namesake from another distribution)."""
    package = MODULES[peer][1]
    if not installed(package):
        pytest.skip(f"{package} is not installed ({install_command()})")
    loaded = python_json(LOADED.format(peer=peer))
    providers = {canonical(d) for dists in loaded.values() for d in dists}
    assert canonical(package) in providers, (package, loaded)


# a stand-in for mosaicml-streaming's layout: the package's __init__ imports what may fail (torchvision);
# streaming.base holds what the bench uses
FAKE_STREAMING = {
    "streaming/__init__.py": "import torchvision  # noqa\nRAN = True",
    "streaming/base/__init__.py": "class MDSWriter: pass\nclass StreamingDataset: pass",
    "streaming/base/util.py": "def clean_stale_shared_memory(): pass",
    "torchvision/__init__.py": BROKEN_TORCHVISION["a CUDA build beside CPU torch"],
}
IMPORT_MDS = """
import json, sys
{first}
from dalistream.tools.bench import mds
try:
    base = mds.base()
except Exception as e:
    print(json.dumps({{"error": type(e).__name__, "left": sorted(n for n in sys.modules if n.split(".")[0] == "streaming")}}))
else:
    assert base.StreamingDataset and base.util.clean_stale_shared_memory and mds.base() is base
    print(json.dumps({{"writer": base.MDSWriter.__module__, "init_ran": getattr(sys.modules["streaming"], "RAN", False),
                      "torchvision": "torchvision" in sys.modules}}))
"""


@pytest.mark.parametrize("case,files,first,expected", [
    ("the package's __init__ fails", {}, "", {"writer": "streaming.base", "init_ran": False, "torchvision": False}),
    ("already imported whole", {"torchvision/__init__.py": ""}, "import streaming",
     {"writer": "streaming.base", "init_ran": True, "torchvision": True}),
    ("streaming.base fails", {"streaming/base/__init__.py": "raise RuntimeError('broken build')"}, "",
     {"error": "RuntimeError", "left": []}),
    ("streaming.base.util is absent", {"streaming/base/util.py": None}, "", {"error": "ModuleNotFoundError", "left": []}),
    ("streaming is a module, not a package", {"streaming/__init__.py": None, "streaming/base/__init__.py": None,
                                              "streaming/base/util.py": None, "streaming.py": "RAN = True"}, "",
     {"error": "ImportError", "left": []}),
])
def test_mds_imports_streaming_base_without_the_package_init(tmp_path, case, files, first, expected):
    layout = {name: text for name, text in {**FAKE_STREAMING, **files}.items() if text is not None}
    env = shadowing(tmp_path, layout)
    assert python_json(IMPORT_MDS.format(first=first), env=env) == expected, case
