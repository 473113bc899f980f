"""Shared test helpers: real tar writers and small data sets."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import subprocess
import sys
import tarfile
from typing import Dict, List, Optional, Sequence

import numpy as np
from hypothesis import strategies as st

from dalistream.dataset import DataSet
from dalistream.manifest.offsets import SampleOffsets
from dalistream.plan import Layout, epoch_layout
from dalistream.plan.affinity import AffinePlan
from dalistream.plan.shuffle import shuffled
from dalistream.tar import iter_samples, runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
# real shards written by the webdataset project (copied into the repository: tests read nothing outside it)
PEER_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "peer", "webdataset")


def short_runs(monkeypatch, run_bytes: int) -> None:
    """Runs of about ``run_bytes`` (a few samples: many runs, and runs across steps), whether read
    into buffers or cut out of a local file's mapping, and no part too large for runs."""
    monkeypatch.setattr(runs, "MIN_RUN_BYTES", run_bytes)
    monkeypatch.setattr(runs, "MAPPED_RUN_BYTES", 0)  # (a local file's mapped runs as long)
    monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 0)


def maps_file(buffer, path: str) -> bool:
    """Whether ``buffer`` (any object with the buffer protocol) lies in this process's mapping of
    ``path`` (``/proc/self/maps``): a view of the file's mapped bytes, not a copy."""
    at = np.frombuffer(buffer, np.uint8).__array_interface__["data"][0]
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith(real):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= at < hi:
                    return True
    return False


def write_tar(path: str, members: Sequence[tuple], fmt=tarfile.USTAR_FORMAT) -> str:
    """Write ``(name, bytes)`` members to a tar with Python's tarfile."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def data_set(urls: Sequence[str], counts: Optional[Sequence[int]] = None, offsets=None,
             count_source: Optional[str] = None) -> DataSet:
    """A :class:`DataSet` of ``urls`` and ``counts``; ``offsets`` a :class:`SampleOffsets` or
    per-shard offset rows as a manifest lists them (``None`` where a shard has none)."""
    counts = None if counts is None else tuple(int(c) for c in counts)
    if offsets is not None and not isinstance(offsets, SampleOffsets):
        offsets = SampleOffsets(counts or [len(r or ()) for r in offsets], offsets)
    return DataSet(tuple(urls), counts, offsets, count_source=count_source)


def write_wds(path: str, samples: Sequence[Dict[str, object]]) -> str:
    """Write samples with webdataset's own TarWriter."""
    import webdataset as wds

    with wds.TarWriter(path) as sink:
        for sample in samples:
            sink.write(dict(sample))
    return path


def passed_over_shard(path, n=9, seed=4, prefix="p", passed=(3000, 9000)):
    """A shard whose samples end with a member the reader does not want (``txt`` of ``passed``
    bytes, 3–9 kB: past a small read buffer, so the reader passes over it by a seek), and each
    sample's offset."""
    from dalistream.manifest import build_manifest

    rng = np.random.default_rng(seed)
    members = []
    for i in range(n):
        members.append((f"{prefix}/{i:03d}.cls", str(i).encode()))
        members.append((f"{prefix}/{i:03d}.txt", rng.bytes(int(rng.integers(*passed)))))
    write_tar(path, members)
    return build_manifest([path], offsets=True)[0].offsets


def key_shards(directory: str, sizes: Sequence[int], prefix: str = "s") -> List[str]:
    """Shards of tiny samples (``.cls`` + ``.bin``) with globally unique keys ``s<shard>/<i>``."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for s, n in enumerate(sizes):
        members = []
        for i in range(n):
            members.append((f"{prefix}{s:03d}/{i:05d}.cls", str((s * 1000 + i) % 7).encode()))
            members.append((f"{prefix}{s:03d}/{i:05d}.bin", bytes([s % 256, i % 256]) * 3))
        paths.append(write_tar(os.path.join(directory, f"{prefix}-{s:04d}.tar"), members))
    return paths


def length_shards(directory: str, sizes: Sequence[int], seed: int = 0, longest: int = 60,
                  bad_labels: Sequence[str] = ()) -> Dict[str, int]:
    """:func:`key_shards`-like shards whose samples also hold a ``txt`` caption of 1 to ``longest``
    bytes, indexed by ``dalistream index --keys txt`` (the manifest beside them, with each sample's
    ``length:txt``); the samples ``bad_labels`` have a ``cls`` that is no number. Returns ``{key:
    caption length}``."""
    from dalistream.cli import main

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    lengths = {}
    for s, n in enumerate(sizes):
        members = []
        for i in range(n):
            key = f"s{s:03d}/{i:05d}"
            lengths[key] = int(rng.integers(1, longest + 1))
            members += [(f"{key}.cls", b"x7" if key in bad_labels else str((s * 1000 + i) % 7).encode()),
                        (f"{key}.txt", bytes(97 + (s + i + k) % 26 for k in range(lengths[key])))]
        write_tar(os.path.join(directory, f"s-{s:04d}.tar"), members)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["index", directory, "--keys", "txt"]) == 0
    return lengths


#: Aspect ratios of :func:`photo_shards` (4:3, 3:2, 16:9, 1:1, 2:3, 3:4) and small target sizes near them.
PHOTO_RATIOS = ((4, 3), (3, 2), (16, 9), (1, 1), (2, 3), (3, 4))
PHOTO_SIZES = ((64, 48), (72, 48), (80, 45), (56, 56), (48, 72), (48, 64))


def photo_shards(directory: str, n: int = 60, seed: int = 0, per_shard: int = 13) -> Dict[str, dict]:
    """``n`` images of the :data:`PHOTO_RATIOS` (in turn; 30 to 110 pixels on the short side,
    JPEG and PNG), each with a caption of 1 to 50 bytes, listed in a JSONL file and written into
    ``directory/shards`` by ``dalistream write`` (its manifest records ``image,txt`` keys).
    Returns ``{key: {"width", "height", "label", "caption"}}``."""
    import json

    from PIL import Image

    rng = np.random.default_rng(seed)
    images = os.path.join(directory, "images")
    os.makedirs(images, exist_ok=True)
    rows, truth = [], {}
    for i in range(n):
        rw, rh = PHOTO_RATIOS[i % len(PHOTO_RATIOS)]
        short = int(rng.integers(30, 110))
        w, h = (short * rw // rh, short) if rw >= rh else (short, short * rh // rw)
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        name = f"img{i:04d}.{'png' if i % 4 == 0 else 'jpg'}"
        Image.fromarray(pixels).save(os.path.join(images, name))
        caption = "".join(chr(97 + int(c)) for c in rng.integers(0, 26, int(rng.integers(1, 51))))
        rows.append({"path": f"images/{name}", "label": i % 5, "caption": caption})
        truth[name] = {"width": w, "height": h, "label": i % 5, "caption": caption}
    listing = os.path.join(directory, "listing.jsonl")
    with open(listing, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = os.path.join(directory, "shards")
    # a process of its own, as users run it (the command sets its own SIGTERM handler, which DALI
    # workers forked later from this process would inherit)
    done = subprocess.run([sys.executable, "-m", "dalistream", "write", listing, out, "--samples-per-shard",
                           str(per_shard), "--processes", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with open(os.path.join(out, "dalistream-manifest.json")) as f:
        files = json.load(f)["source"]["keys"]  # key -> its image file, relative to the listing's folder
    return {key: truth[os.path.basename(path)] for key, path in files.items()}


def shard_keys(sizes: Sequence[int], prefix: str = "s") -> List[str]:
    """Every key :func:`key_shards` writes for ``sizes``, sorted."""
    return sorted(f"{prefix}{s:03d}/{i:05d}" for s, n in enumerate(sizes) for i in range(n))


def key_shard_folder(tmp_path_factory, name: str, sizes: Sequence[int]) -> str:
    """A new temporary folder holding :func:`key_shards` of ``sizes`` (for module fixtures)."""
    directory = str(tmp_path_factory.mktemp(name))
    key_shards(directory, sizes)
    return directory


def uneven_sizes(n: int, seed: int = 0, low: int = 3, high: int = 30) -> List[int]:
    return [int(v) for v in np.random.default_rng(seed).integers(low, high, n)]


def check_resume(run_from, ks) -> None:
    """The reusable save→load→compare check for stateful stages.

    ``run_from(k)`` restores the stage at step ``k`` (from saved state) and returns everything it
    yields from there to the end of the epoch; the result must equal the uninterrupted run from
    step ``k`` on, for every ``k`` in ``ks``.
    """
    full = run_from(0)
    for k in ks:
        assert run_from(k) == full[k:], f"resume at step {k} differs from the uninterrupted run"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sequence_keys(urls, options, counters=None, ranges=None) -> list:
    """Keys of ``urls`` read in order through a ShardSequence (the workers' path, with read-ahead)."""
    from dalistream.io import ShardSequence
    from dalistream.tar import iter_samples

    seq = ShardSequence(urls, options, counters, ranges)
    keys = []
    try:
        for i, url in enumerate(urls):
            with seq.open(i) as f:
                keys += [s["__key__"] for s in iter_samples(f, url)]
    finally:
        seq.close()
    return keys


@contextlib.contextmanager
def served_folder(directory: str, handler_class=None):
    """A real HTTP server (``http.server`` in a thread) on 127.0.0.1 serving ``directory``: its base URL."""
    import functools
    import http.server
    import threading

    class Quiet(handler_class or http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=directory))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- the plan, simulated (tests/plan) ------------------------------------------------------------

@st.composite
def plan_case(draw):
    """A small layout, a schedule (``even`` or ``exact``) and uneven shard counts (some empty)."""
    from dalistream.plan import Schedule

    R, W = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    B = draw(st.integers(W, 3 * W + 5))
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    counts = np.where(rng.random(n) < 0.2, 0, rng.integers(1, 60, n)).astype(np.int64)
    return Layout(R, W, B), Schedule(draw(st.integers(0, 9)), draw(st.sampled_from(["even", "exact"]))), counts


def positions(plan, counts, layout, schedule, epoch):
    """Epoch positions a worker plan reads, in order, its drops removed."""
    ep = epoch_layout(counts, layout, schedule, epoch)
    start_of = np.empty(len(counts), dtype=np.int64)
    start_of[ep.order] = ep.starts[:-1]
    raw = [int(start_of[s]) + k for s, a, b in plan.parts for k in range(a, b)]
    drop = set(plan.drop)
    return [p for i, p in enumerate(raw) if i not in drop]


def run_epoch(counts, schedule, epoch, layouts, steps_run, shuffle):
    """Delivered epoch positions of every segment: ``layouts[k]`` runs ``steps_run[k]`` steps
    (the last one to its end)."""
    segments, delivered = [], []
    for k, layout in enumerate(layouts):
        plan = AffinePlan(counts, layout, None, schedule, epoch, columns=False, shuffle=shuffle, segments=segments)
        steps = plan.steps if k == len(layouts) - 1 else min(steps_run[k], plan.steps)
        for r, w in itertools.product(range(layout.world_size), range(layout.workers)):
            (wp,) = plan.plans(r, w)
            seq = positions(wp, counts, layout, schedule, epoch)
            assert len(seq) == wp.samples
            out = list(shuffled(seq, shuffle, wp.shuffle_seed))
            delivered += out[:steps * wp.slot]
        segments.append((layout.world_size, layout.workers, layout.batch_size, steps))
    return delivered, segments


def small_layout():
    return st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(1, 24)).map(
        lambda t: Layout(t[0], t[1], max(t[1], t[2])))


# -- shards of every tar writer, with mixed sample patterns (tests/tar) ------------------------------

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def write_tarfile(path, samples, fmt):
    """``samples`` (dicts with ``__key__``) as a tar of the given format (:func:`helpers.write_tar`)."""
    return write_tar(path, [(f"{s['__key__']}.{ext}", data) for s in samples for ext, data in s.items()
                            if ext != "__key__"], FORMATS[fmt])


def random_samples(seed, n):
    """Samples of mixed patterns (``jpg`` or ``PNG``, a ``txt`` now and then), sizes 0 to 3 blocks,
    now and then one larger than half a read chunk (read past the buffer)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sample = {"__key__": f"d{seed}/k{i:04d}"}
        size = int(rng.choice([0, 1, 511, 512, 513, 1500]))
        if rng.random() < 0.03:
            size = (1 << 20) // 2 + int(rng.integers(1, 5000))
        sample["jpg" if rng.random() < 0.7 else "PNG"] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        sample["cls"] = str(i % 10).encode()
        if rng.random() < 0.4:
            sample["txt"] = b"t" * int(rng.integers(0, 700))
        out.append(sample)
    return out


def shard(tmp_path, writer, seed, n=40):
    samples = random_samples(seed, n)
    path = str(tmp_path / f"{writer}-{seed}.tar")
    if writer == "webdataset":
        return write_wds(path, samples)
    return write_tarfile(path, samples, writer)


def by_headers(path, first, stop, **kw):
    with open(path, "rb") as f:
        return [s for s in iter_samples(f, path, **kw) if first <= s["__index__"] < stop]


@contextlib.contextmanager
def small_disk(folder, size: str):
    """A real file system of ``size`` (a tmpfs, e.g. ``"64k"``) mounted at ``folder`` for the block;
    the test is skipped where this machine does not let it mount one."""
    import pytest

    os.makedirs(folder, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)],
                      capture_output=True, timeout=30).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


# -- processes and shared memory, for the tests that kill processes -----------------------------

def process_group(pgid: int) -> set:
    """Live (not zombie) processes of process group ``pgid``, from /proc."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.add(int(name))
    return out


def shm_mapped(pids) -> set:
    """Named /dev/shm entries these processes map (DALI's own chunks are unlinked at once;
    multiprocessing's named semaphores, with spawn, are not)."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.split(None, 5)[-1].strip()
                    if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                        out.add(path)
        except OSError:
            pass
    return out


def wait_until(condition, seconds: float) -> bool:
    """Poll ``condition()`` until it is true or ``seconds`` have passed; its last value."""
    import time

    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(condition())


def end_group(proc) -> None:
    """A test's clean-up after a process started with ``start_new_session``: it and whatever of its
    process group is left are killed."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in process_group(proc.pid):
        os.kill(pid, signal.SIGKILL)


def index_on_s3(endpoint: str, prefix: str) -> None:
    """``dalistream index PREFIX`` on an S3 server at ``endpoint``, its manifest written beside the
    shards (``AWS_ENDPOINT_URL`` set for the command only)."""
    from dalistream import cli

    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        if cli.main(["index", prefix, "-o", prefix + "dalistream-manifest.json"]) != 0:
            raise RuntimeError(f"dalistream index {prefix} failed")
    finally:
        os.environ.pop("AWS_ENDPOINT_URL") if saved is None else os.environ.update(AWS_ENDPOINT_URL=saved)


#: What a launcher (torchrun, Slurm's srun wrappers) sets, and a test's own processes must not inherit.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launcher_free_env(**extra: str) -> Dict[str, str]:
    """This process's environment less :data:`LAUNCHER_VARS`, with ``extra`` set: for processes a
    test starts as the ranks of a job of its own."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(extra)
    return env


def mix_bucket_batches(mix) -> np.ndarray:
    """A bucketed mix's batches (:class:`dalistream.plan.buckets.BucketMix`): ``(ranks, steps,
    batch_size)`` of ``(source << 48) | epoch position`` (``-1`` padding), step t being batch
    ``mix.source_step[t]`` of source ``mix.source[t]``'s own plan."""
    out = np.full((mix.layout.world_size, mix.steps, mix.layout.batch_size), -1, dtype=np.int64)
    for s, plan in enumerate(mix.plans):
        at = np.flatnonzero(mix.source == s)
        table = plan.rank_batches()[:, mix.source_step[at]]
        out[:, at] = np.where(table >= 0, (s << 48) | table, -1)
    return out
