"""``dalistream write``: a user's own images (an ImageFolder tree, or a CSV/JSONL listing) into
shuffled WebDataset shards with a manifest -- read back as written, and trained on, locally and
from S3 (moto)."""

import json
import os
import subprocess
import sys
import tarfile
from collections import Counter

import pytest

import dalistream
from dalistream.errors import ConfigError, SourceError
from dalistream.writer import write

from helpers import REPO

CLASSES = ("cat", "dog", "eel")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """An ImageFolder of real Pillow-written JPEGs and PNGs: 3 classes x 20, class-sorted on disk."""
    from PIL import Image

    root = tmp_path_factory.mktemp("photos")
    for c, name in enumerate(CLASSES):
        (root / name).mkdir()
        for i in range(20):
            image = Image.new("RGB", (40 + i, 30 + 2 * i), (80 * c, 8 * i, 120))
            image.save(root / name / f"{i:03d}.{'png' if i % 4 == 0 else 'jpg'}")
    return str(root)


def shard_contents(path):
    """``{key: (image ext, label, caption)}`` of one shard, read with Python's tarfile."""
    out = {}
    with tarfile.open(path) as tar:
        for m in tar:
            key, ext = m.name.split(".", 1)
            data = tar.extractfile(m).read()
            entry = out.setdefault(key, {})
            entry[ext] = data
    return out


def test_an_image_folder_becomes_shuffled_shards_with_a_manifest(photos, tmp_path):
    out = str(tmp_path / "shards")
    done = write(photos, out, samples_per_shard=16, seed=3)
    assert done["shards"] == 4 and done["samples"] == 60 and done["classes"] == list(CLASSES)
    shards = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tar"))
    contents = [shard_contents(p) for p in shards]
    assert [len(c) for c in contents] == [16, 16, 16, 12]
    labels = Counter(int(s["cls"]) for c in contents for s in c.values())
    assert labels == {0: 20, 1: 20, 2: 20}  # every image once
    exts = Counter(next(e for e in s if e in ("jpg", "png")) for c in contents for s in c.values())
    assert exts == {"jpg": 45, "png": 15}
    per_shard = [len({int(s["cls"]) for s in c.values()}) for c in contents]
    assert all(n == 3 for n in per_shard)  # shuffled across shards: every shard mixes the classes
    with open(os.path.join(out, "dalistream-manifest.json")) as f:
        manifest = json.load(f)
    assert [r["samples"] for r in manifest["shards"]] == [16, 16, 16, 12]
    assert all("offsets" in r and "members" in r for r in manifest["shards"])  # counts, offsets, layouts
    stream = dalistream.Stream.open(out, fields={"image": "jpg;png", "label": "cls"}, batch_size=4, workers=2,
                                    cache_dir=str(tmp_path / "c"))
    assert "manifest" in stream.data.count_source and sum(stream.counts) == 60


def test_no_shuffle_keeps_the_input_order_and_the_same_seed_the_same_shards(photos, tmp_path):
    a, b, c = (str(tmp_path / n) for n in "abc")
    write(photos, a, samples_per_shard=20, shuffle=False)
    first = shard_contents(os.path.join(a, "train-00000.tar"))
    assert {int(s["cls"]) for s in first.values()} == {0}  # class-sorted, as on disk
    write(photos, b, samples_per_shard=16, seed=7, processes=1)
    write(photos, c, samples_per_shard=16, seed=7, processes=3)
    assert sorted(os.listdir(b)) == sorted(os.listdir(c))
    for name in os.listdir(b):
        if name == "dalistream-write.json":
            continue  # the writer's marker says when and by whom: not the data
        with open(os.path.join(b, name), "rb") as x, open(os.path.join(c, name), "rb") as y:
            assert x.read() == y.read(), name  # parallel or not, the same bytes


@pytest.mark.parametrize("form", ["csv", "csv with header", "jsonl"])
def test_a_listing_with_captions(photos, tmp_path, form):
    rows = [(f"{name}/{i:03d}.jpg", c, f"a photo of a {name} number {i}") for c, name in enumerate(CLASSES)
            for i in (1, 2, 3)]
    listing = tmp_path / ("list.jsonl" if form == "jsonl" else "list.csv")
    with open(listing, "w") as f:
        if form == "jsonl":
            for path, label, caption in rows:
                f.write(json.dumps({"path": os.path.join(photos, path), "label": label, "caption": caption}) + "\n")
        else:
            if form == "csv with header":
                f.write("path,label,caption\n")
            for path, label, caption in rows:
                f.write(f"{os.path.join(photos, path)},{label},{caption}\n")
    out = str(tmp_path / "out")
    done = write(str(listing), out, samples_per_shard=4)
    assert done["samples"] == 9 and done["classes"] is None
    got = {(int(s["cls"]), s["txt"].decode()) for p in sorted(os.listdir(out)) if p.endswith(".tar")
           for s in shard_contents(os.path.join(out, p)).values()}
    assert got == {(label, caption) for _, label, caption in rows}


def test_bad_input_is_named(tmp_path, photos):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match="no class folders"):
        write(str(empty), str(tmp_path / "o1"))
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{photos}/cat/001.jpg,cat\n")
    with pytest.raises(ConfigError, match="row 1: .*001.jpg: label 'cat' is not an integer"):
        write(str(bad), str(tmp_path / "o2"))
    write(photos, str(tmp_path / "o3"), samples_per_shard=30)
    with pytest.raises(ConfigError, match="already holds"):
        write(photos, str(tmp_path / "o3"))


def test_the_cli_writes_with_a_summary(photos, tmp_path):
    out = str(tmp_path / "cli")
    done = subprocess.run([sys.executable, "-m", "dalistream", "write", photos, out, "--samples-per-shard", "25",
                           "--json"], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["shards"] == 3 and summary["samples"] == 60


@pytest.mark.parametrize("fails", [False, True], ids=["written", "refused"])
def test_the_cli_write_run_in_a_process_gives_back_its_sigterm_handler(photos, tmp_path, fails):
    """``dalistream write`` turns SIGTERM into a clean stop while it writes; called inside a caller's
    process (a notebook, a test) it leaves that process's handler as it found it: DALI workers
    forked later inherit it (with the writer's, a worker stopped by SIGTERM exits 143 instead of
    ending quietly)."""
    import signal

    from dalistream.cli import main

    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        out = tmp_path / "out"
        if fails:
            out.mkdir()
            (out / "other.tar").write_bytes(b"")  # a folder holding something else: refused
        code = main(["write", photos, str(out), "--samples-per-shard", "25", "--processes", "1"])
        assert (code != 0) == fails
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
@pytest.mark.dali
@pytest.mark.parametrize("where", ["local", "s3"])
def test_train_the_ready_pipeline_two_epochs_from_written_shards(photos, tmp_path, where, request):
    from dalistream.pipelines import classification_train

    options = {}
    if where == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="mine")
        out, options = "s3://mine/photos/", {"endpoint_url": endpoint}
    else:
        out = str(tmp_path / "shards")
    write(photos, out, samples_per_shard=16, storage_options=options)
    seen = Counter()
    with classification_train.loader(out, batch_size=8, size=32, workers=2, device="cpu", seed=1,
                                     storage_options=options, cache_dir=str(tmp_path / "c")) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                assert tuple(batch["image"].shape) == (8, 3, 32, 32)
                seen.update(batch["label"].tolist())
    assert set(seen) == {0, 1, 2} and sum(seen.values()) == 2 * 56  # even: 7 batches of 8 per epoch
