"""What ``dalistream write`` accepts: every image checked as the loader checks it (refused naming
the source file, or left out and counted), every file listed once (links, loops, rows naming it
again), every bad CSV/JSONL row named before anything is written, and a manifest that records
each key's source file and the class names."""

import io
import json
import os
import tarfile

import pytest

import dalistream
from dalistream.cli import main
from dalistream.errors import ConfigError, SampleError, SourceError
from dalistream.worker import image_problem
from dalistream.writer import write

CLASSES = ("cat", "dog")


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16 + seed, 12), (seed * 20 % 255, 90, 30)).save(out, "JPEG")
    return out.getvalue()


def _png(seed: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (10, 10 + seed), (30, seed * 20 % 255, 90)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def photos(tmp_path):
    root = tmp_path / "photos"
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(6):
            data = _png(i + 10 * c) if i % 3 == 0 else _jpeg(i + 10 * c)
            (root / name / f"{i:02d}.{'png' if i % 3 == 0 else 'jpg'}").write_bytes(data)
    return root


BAD = {
    "0-byte": lambda: b"",
    "truncated JPEG": lambda: _jpeg(1)[: len(_jpeg(1)) // 2],
    "truncated PNG": lambda: _png(1)[:-20],
    "text named .jpg": lambda: b"this is not an image, it only has the name of one\n",
}


def _members(folder):
    """``{key: {ext: bytes}}`` of every shard in ``folder``, read with Python's tarfile."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(folder, name)) as tar:
                for m in tar:
                    key, ext = m.name.split(".", 1)
                    out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


def _manifest(folder):
    with open(os.path.join(folder, "dalistream-manifest.json")) as f:
        return json.load(f)


BAD_SETS = [("0-byte",), ("truncated JPEG",), ("PDF named .png",), ("text named .jpg",),
            ("0-byte", "truncated JPEG", "text named .jpg"), ("truncated PNG", "PDF named .png", "0-byte")]
BAD_PLACES = ["dog/02.jpg", "cat/04.jpg", "dog/03.png"]  # shuffled into different shards of 3


def _spoil(photos, kinds):
    """Spoil one image per kind (the file's own name kept); their paths."""
    paths = []
    for kind, where in zip(kinds, BAD_PLACES):
        path = photos / where
        path.write_bytes(BAD[kind]())
        paths.append(str(path))
    return paths


def _source(tmp_path, photos, form):
    if form == "folder":
        return str(photos)
    rows = [(str(p), CLASSES.index(p.parent.name)) for p in sorted(photos.glob("*/*"))]
    return str(_listing(tmp_path, photos, rows, form))


@pytest.mark.parametrize("kinds", BAD_SETS, ids=["+".join(k) for k in BAD_SETS])
@pytest.mark.parametrize("form", ["folder", "csv"])
@pytest.mark.parametrize("processes", [1, 2])
def test_bad_images_stop_the_write_naming_every_one(photos, tmp_path, kinds, form, processes):
    """Every bad image is named in the one error (not only the first), and no shard is left."""
    bad = _spoil(photos, kinds)
    out = tmp_path / "out"
    with pytest.raises(SampleError) as caught:
        write(_source(tmp_path, photos, form), str(out), samples_per_shard=3, processes=processes)
    text = str(caught.value)
    assert f"{len(bad)} bad image{'s' if len(bad) > 1 else ''}, nothing written" in text
    assert all(path in text for path in bad), text
    assert caught.value.reason == "bad_image" and "--on-bad skip" in text
    assert not [n for n in os.listdir(out) if n.endswith((".tar", ".part"))]  # nothing of it is left to be read
    with pytest.raises(SourceError, match="did not finish"):
        dalistream.Stream.open(str(out), fields={"image": "jpg;png"}, batch_size=2, workers=1, device="cpu")


PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n"
BAD["PDF named .png"] = lambda: PDF  # a file of another kind under an image's extension


def test_the_cli_names_every_bad_image_and_skip_names_them_too(photos, tmp_path, capsys):
    bad = _spoil(photos, ("0-byte", "truncated JPEG", "PDF named .png"))
    assert main(["write", str(photos), str(tmp_path / "refused"), "--samples-per-shard", "3"]) == 2
    err = capsys.readouterr().err
    assert "dalistream write: error: 3 bad images, nothing written" in err and all(p in err for p in bad), err
    assert main(["write", str(photos), str(tmp_path / "out"), "--samples-per-shard", "3", "--on-bad", "skip"]) == 0
    said = capsys.readouterr().out
    assert "wrote 9 samples" in said and "3 bad images left out" in said and all(p in said for p in bad), said


@pytest.mark.parametrize("processes", [1, 2])
def test_bad_images_skipped_are_counted_and_named(photos, tmp_path, processes):
    bad = {}
    for (kind, make), where in zip(sorted(BAD.items()), ["cat/01.jpg", "cat/03.png", "dog/02.jpg", "dog/05.jpg"]):
        (photos / where).write_bytes(make())
        bad[str(photos / where)] = kind
    os.symlink(photos / "nowhere.jpg", photos / "dog" / "99.jpg")  # a dangling link: cannot be read
    bad[str(photos / "dog" / "99.jpg")] = "dangling link"
    out = tmp_path / "out"
    done = write(str(photos), str(out), samples_per_shard=4, processes=processes, on_bad="skip")
    assert done["skipped"] == len(bad) == 5 and {p for p, _ in done["bad"]} == set(bad)
    assert done["samples"] == 12 - 4
    members = _members(out)
    assert len(members) == 8
    assert all(image_problem(m.get("jpg", m.get("png"))) is None for m in members.values())
    manifest = _manifest(out)
    assert set(manifest["source"]["skipped"]) == {os.path.relpath(p, photos) for p in bad}
    assert "0 bytes" in manifest["source"]["skipped"][os.path.relpath(bad_path(bad, "0-byte"), photos)]
    assert sum(r["samples"] for r in manifest["shards"]) == 8


def bad_path(bad, kind):
    return next(p for p, k in bad.items() if k == kind)


def test_all_images_bad_writes_no_set(photos, tmp_path):
    for path in photos.glob("*/*"):
        path.write_bytes(b"")
    with pytest.raises(ConfigError, match="all 12 images are bad"):
        write(str(photos), str(tmp_path / "out"), on_bad="skip")


def test_links_loops_and_hard_links_are_listed_once(photos, tmp_path):
    os.symlink(photos, photos / "loop")                 # a class folder that is the tree itself
    os.symlink(photos.parent, photos / "up")            # ... or a folder above it
    os.symlink(photos / "cat" / "01.jpg", photos / "cat" / "01-again.jpg")   # a link to a file listed anyway
    os.link(photos / "dog" / "02.jpg", photos / "dog" / "02-hard.jpg")        # a hard link
    os.symlink(photos / "cat", photos / "dog" / "sub")  # a linked folder inside a class: not entered
    out = tmp_path / "out"
    done = write(str(photos), str(out), samples_per_shard=5)
    assert done["classes"] == list(CLASSES) and done["samples"] == 12 and done["duplicates"] == 2
    members = _members(out)
    assert len(members) == 12
    images = [m.get("jpg", m.get("png")) for m in members.values()]
    assert len(set(images)) == 12  # every image once
    assert sorted(int(m["cls"]) for m in members.values()) == [0] * 6 + [1] * 6


def test_an_alias_class_keeps_its_number_and_writes_nothing_twice(photos, tmp_path):
    os.symlink(photos / "cat", photos / "kitty")  # classes cat, dog, kitty: kitty's files are cat's
    done = write(str(photos), str(tmp_path / "out"), samples_per_shard=5)
    assert done["classes"] == ["cat", "dog", "kitty"] and done["samples"] == 12 and done["duplicates"] == 6


def test_the_manifest_records_each_keys_source_file_and_the_classes(photos, tmp_path):
    out = tmp_path / "out"
    write(str(photos), str(out), samples_per_shard=5, seed=4)
    manifest = _manifest(out)
    assert manifest["classes"] == list(CLASSES)
    assert manifest["source"]["root"] == str(photos)
    keys = manifest["source"]["keys"]
    members = _members(out)
    assert set(keys) == set(members)
    for key, sample in members.items():
        source = photos / keys[key]
        assert sample[source.suffix[1:]] == source.read_bytes()  # the key's bytes are that file's
        assert int(sample["cls"]) == CLASSES.index(source.parent.name)
    assert dalistream.Stream.open(str(out), fields={"image": "jpg;png"}, batch_size=2, workers=1,
                                  device="cpu").data.counts is not None  # still a manifest the loader reads


def _listing(tmp_path, photos, rows, form):
    path = tmp_path / f"list.{form}"
    with open(path, "w") as f:
        for row in rows:
            if isinstance(row, str):
                f.write(row + "\n")
            elif form == "jsonl":
                f.write(json.dumps({"path": row[0], "label": row[1]}) + "\n")
            else:
                f.write(f"{row[0]},{row[1]}\n")
    return path


@pytest.mark.parametrize("form", ["csv", "jsonl"])
def test_every_bad_row_is_named_before_anything_is_written(photos, tmp_path, form):
    (photos / "folder.jpg").mkdir()
    rows = [(str(photos / "cat" / "01.jpg"), 0),        # 1: fine
            (str(photos / "cat" / "02.jpg"), "cat"),    # 2: the label is not a number
            (str(photos / "cat" / "missing.jpg"), 0),   # 3: no such file
            (str(photos / "cat" / "04.jpg"), 0),        # 4: fine
            ("cat/notes.txt", 1),                       # 5: not an image name
            (str(photos / "folder.jpg"), 1)]            # 6: a folder
    if form == "jsonl":
        rows.append("{not json")                        # 7: not JSON
    listing = _listing(tmp_path, photos, rows, form)
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as caught:
        write(str(listing), str(out))
    text = str(caught.value)
    assert f"{4 if form == 'csv' else 5} bad rows, nothing written" in text
    assert "row 2: " in text and "label 'cat' is not an integer" in text
    assert f"row 3: {photos / 'cat' / 'missing.jpg'}: No such file" in text
    assert "row 5: cat/notes.txt: not an image, video or audio file name" in text
    assert f"row 6: {photos / 'folder.jpg'}: not a file" in text
    assert ("row 7: not JSON" in text) == (form == "jsonl")
    assert "row 1:" not in text and "row 4:" not in text
    assert str(listing) in text
    assert not out.exists()  # not even the folder: nothing was written


def test_a_row_naming_a_file_again_is_written_once(photos, tmp_path):
    rows = [(str(photos / "cat" / "01.jpg"), 0), ("photos/cat/01.jpg", 0), (str(photos / "dog" / "01.jpg"), 1)]
    listing = _listing(tmp_path, photos, rows, "csv")
    out = tmp_path / "out"
    done = write(str(listing), str(out))
    assert done["samples"] == 2 and done["duplicates"] == 1
    manifest = _manifest(out)
    assert manifest["classes"] is None
    assert sorted(manifest["source"]["keys"].values()) == ["photos/cat/01.jpg", "photos/dog/01.jpg"]


@pytest.mark.parametrize("given", ["relative", "dot", "absolute", "csv relative"])
def test_the_manifests_key_map_joins_to_the_files_from_any_current_folder(photos, tmp_path, monkeypatch, given):
    """``source.root`` joined with each key's path is that key's file, whatever the current folder
    and however the input was named (``images``, ``.``, ``/abs/images``, a relative listing)."""
    monkeypatch.chdir(photos.parent if given in ("relative", "csv relative") else photos if given == "dot" else tmp_path)
    if given == "csv relative":
        rows = [(f"{p.parent.name}/{p.name}", CLASSES.index(p.parent.name)) for p in sorted(photos.glob("*/*"))]
        source = os.path.relpath(_listing(photos, photos, rows, "csv"), photos.parent)
    else:
        source = {"relative": photos.name, "dot": ".", "absolute": str(photos)}[given]
    out = tmp_path / "out"
    write(source, str(out), samples_per_shard=5)
    monkeypatch.chdir(tmp_path / "out")  # the map means the same from anywhere
    source_record = _manifest(out)["source"]
    assert os.path.isabs(source_record["root"])
    members = _members(out)
    assert set(source_record["keys"]) == set(members)
    for key, path in source_record["keys"].items():
        full = os.path.join(source_record["root"], path)
        assert os.path.isfile(full), (source_record["root"], path)
        sample = members[key]
        assert sample[path.rsplit(".", 1)[1]] == open(full, "rb").read()


def test_the_cli_shows_the_class_labels(photos, tmp_path, capsys):
    (photos / "ant").mkdir()
    (photos / "ant" / "a.png").write_bytes(_png(3))
    assert main(["write", str(photos), str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert "labels (cls): 0 ant, 1 cat, 2 dog" in said, said


@pytest.mark.parametrize("processes", [1, 2])
def test_bad_images_written_to_s3_leave_no_shard_uploaded(photos, moto_endpoint, processes):
    """Shards are uploaded under their final names as they are finished: those finished before
    a bad image was met are deleted again, and the prefix holds only the marker a read refuses."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket=f"bad{processes}")
    bad = _spoil(photos, ("0-byte", "truncated JPEG"))
    options = {"endpoint_url": moto_endpoint}
    with pytest.raises(SampleError) as caught:  # unshuffled: dog's images, the bad ones, come last
        write(str(photos), f"s3://bad{processes}/set/", samples_per_shard=2, shuffle=False, processes=processes,
              storage_options=options)
    assert all(path in str(caught.value) for path in bad)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=f"bad{processes}").get("Contents", [])]
    assert keys == ["set/dalistream-write.json"], keys
    with pytest.raises(SourceError, match="did not finish"):
        dalistream.Stream.open(f"s3://bad{processes}/set/", fields={"image": "jpg;png"}, batch_size=2, workers=1,
                               device="cpu", storage_options=options)


@pytest.mark.parametrize("per_shard", [1, 2])
def test_skipped_files_of_a_shard_left_out_whole_are_recorded_too(photos, tmp_path, per_shard):
    """A shard none of whose images was written leaves no shard, but its bad files are still in
    the manifest's ``source.skipped`` (every file left out is named there)."""
    names = ["cat/01.jpg", "cat/02.jpg", "dog/04.jpg"]
    for name in names:
        (photos / name).write_bytes(b"")
    done = write(str(photos), str(tmp_path / "out"), samples_per_shard=per_shard, processes=1, shuffle=False,
                 on_bad="skip")
    assert done["skipped"] == 3
    assert set(_manifest(tmp_path / "out")["source"]["skipped"]) == set(names)
