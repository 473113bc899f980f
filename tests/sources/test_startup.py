"""Start-up at scale, simulated: 50,000 empty shards (never read: a manifest counts them) named by
a brace pattern, a folder and a glob, with the wids index the user names (``manifest=``) or the
manifest beside them. The three forms give the same shards and counts as the entry-by-entry
listing, with no ``stat`` per shard; a listed shard that is not there is an error naming it at
open, wherever it lies in the plan; a named entry that is no plain file is listed as without a
manifest."""

import json
import logging
import os
import shutil

import pytest

import dalistream
from dalistream.errors import SourceError
from dalistream.manifest.files import manifest_reader, manifest_urls
from dalistream.plan import worker_plan
from dalistream.sources import expand_sources
from dalistream.sources.named import FOLDER_SCAN_MIN

SHARDS = 50_000
RANK, WORLD, WORKERS = 5, 1024, 8
FORMS = {"braces": lambda d, n: f"{d}/shard-{{000000..{n - 1:06d}}}.tar", "folder": lambda d, n: d,
         "glob": lambda d, n: f"{d}/shard-*.tar"}


def _samples(i):
    return 3 + i % 5  # (not all alike: counts in the wrong order would show)


def make_set(root, shards, kind):
    """``root/shards/shard-NNNNNN.tar`` (empty), a wids index of them beside the folder
    (``root/wids.json``) and, for ``kind`` "beside", dalistream's manifest inside it; the folder's path."""
    folder = os.path.join(root, "shards")
    os.makedirs(folder)
    names = [f"shard-{i:06d}.tar" for i in range(shards)]
    for name in names:
        open(os.path.join(folder, name), "wb").close()
    with open(os.path.join(root, "wids.json"), "w") as f:
        json.dump({"__kind__": "wids-shard-index-v1", "wids_version": 1,
                   "shardlist": [{"url": f"shards/{n}", "nsamples": _samples(i)} for i, n in enumerate(names)]}, f)
    with open(os.path.join(root, "beside.json"), "w") as f:
        json.dump({"format": "dalistream-manifest", "version": 1,
                   "shards": [{"url": n, "samples": _samples(i)} for i, n in enumerate(names)]}, f)
    if kind == "beside":
        os.rename(os.path.join(root, "beside.json"), os.path.join(folder, "dalistream-manifest.json"))
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_set(str(tmp_path_factory.mktemp("startup")), SHARDS, "wids")


@pytest.fixture(params=["wids", "beside"])
def big(request, shards):
    """The 50,000 shards, with the manifest beside them (``beside``) or without (``wids``: named)."""
    kept, beside = os.path.join(os.path.dirname(shards), "beside.json"), os.path.join(shards, "dalistream-manifest.json")
    if request.param == "beside":
        os.rename(kept, beside)
    yield shards, request.param
    if request.param == "beside":
        os.rename(beside, kept)


def manifest_of(folder, kind):
    """The ``manifest=`` to open with: the wids index named, or none (the one beside the shards is found)."""
    return os.path.join(os.path.dirname(folder), "wids.json") if kind == "wids" else None


def open_stream(source, manifest, cache, rank=RANK):
    return dalistream.Stream.open(source, fields={"k": "__key__"}, batch_size=8, workers=WORKERS, rank=rank,
                                  world_size=WORLD, device="cpu", manifest=manifest, cache_dir=cache)


def listed(source, folder, kind):
    """The listing as a stream's resolution makes it (the manifest named, or the one beside)."""
    read = manifest_reader(None)
    if kind == "beside":
        return expand_sources(source, named=lambda f: manifest_urls(f, read))
    return expand_sources(source, named=lambda f: manifest_urls(f, read, manifest_of(folder, kind)))


def test_the_three_forms_open_the_same_shards_and_counts_without_a_stat_per_shard(big, tmp_path, monkeypatch):
    big, kind = big
    names = sorted(n for n in os.listdir(big) if n.endswith(".tar"))
    expected = [os.path.join(big, n) for n in names]
    counts = tuple(_samples(i) for i in range(SHARDS))
    stats = []
    for call in ("stat", "lstat"):
        real = getattr(os, call)
        monkeypatch.setattr(os, call, lambda path, *a, _real=real, **k: stats.append(path) or _real(path, *a, **k))
    for form, source in FORMS.items():
        for rank in (0, RANK):  # the first rank of a node parses the manifest, the next maps its rows back
            stats.clear()
            stream = open_stream(source(big, SHARDS), manifest_of(big, kind), str(tmp_path / form), rank)
            assert list(stream.urls) == expected and stream.counts == counts, (form, rank)
            assert len(stats) < 50, (form, rank, len(stats), stats[:10])
    monkeypatch.undo()
    assert expand_sources(big) == expected  # the entry-by-entry walk, no manifest consulted


@pytest.mark.parametrize("where", ["first", "this rank's", "another rank's", "last"])
def test_a_listed_shard_that_is_not_there_is_named_at_open_wherever_it_lies(big, where, tmp_path):
    big, kind = big
    stream = open_stream(FORMS["braces"](big, SHARDS), manifest_of(big, kind), str(tmp_path / "cache"))
    c = stream.config  # (the plan's workers: the rank's columns, read interleaved)
    mine = {s for w in range(c.plan_layout.workers)
            for s in worker_plan(stream.counts, SHARDS, c.plan_layout, c.schedule, 0, RANK, w).shards}
    theirs = set(worker_plan(stream.counts, SHARDS, c.plan_layout, c.schedule, 0, WORLD - 1, 0).shards)
    shard = {"first": 0, "last": SHARDS - 1, "this rank's": min(mine), "another rank's": max(theirs)}[where]
    assert (shard in mine) == (where == "this rank's")
    path = stream.urls[shard]
    os.rename(path, path + ".away")
    try:
        with pytest.raises(SourceError, match="no such shard file") as info:
            open_stream(FORMS["braces"](big, SHARDS), manifest_of(big, kind), str(tmp_path / "cache"))
        assert info.value.url == path
        for form in ("folder", "glob"):  # a folder or a glob lists what is there: the others, counted
            other = open_stream(FORMS[form](big, SHARDS), manifest_of(big, kind), str(tmp_path / "cache"))
            assert len(other.urls) == SHARDS - 1 and path not in other.urls
            assert sum(other.counts) == sum(stream.counts) - stream.counts[shard]
    finally:
        os.rename(path + ".away", path)


def _odd(folder, how):
    """One named shard made into something that is no plain file; what to undo."""
    path = os.path.join(folder, "shard-000007.tar")
    os.rename(path, path + ".kept")
    if how == "link to another listed shard":
        os.symlink(os.path.join(folder, "shard-000003.tar"), path)
    elif how == "dangling link":
        os.symlink(os.path.join(folder, "gone.tar"), path)
    else:  # a folder named like a shard, holding one
        os.mkdir(path)
        shutil.copy(path + ".kept", os.path.join(path, "inner.tar"))

    def undo():
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        os.rename(path + ".kept", path)
    return undo


def _outcome(list_them, caplog):
    """What a listing gives: (its shards, or its error's message and URL; whether it warned of a
    shard listed twice)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        try:
            got = list_them()
        except SourceError as e:
            got = (e.message, e.url)
    return got, "listed more than once" in caplog.text


@pytest.mark.parametrize("how", ["link to another listed shard", "dangling link", "folder"])
@pytest.mark.parametrize("kind", ["wids", "beside"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_named_entry_that_is_no_plain_file_is_listed_as_without_a_manifest(tmp_path, form, kind, how, caplog):
    shards = FOLDER_SCAN_MIN * 4
    folder = make_set(str(tmp_path), shards, kind)
    source = FORMS[form](folder, shards)
    undo = _odd(folder, how)
    got = _outcome(lambda: listed(source, folder, kind), caplog)
    assert got == _outcome(lambda: expand_sources(source), caplog)  # no manifest consulted: path by path
    if how == "link to another listed shard":  # read once, with a warning
        assert len(got[0]) == shards - 1 and got[1]
    if how == "dangling link" and form == "braces":  # named when listed, not read as a shard
        assert got[0] == ("no such shard file", os.path.join(folder, "shard-000007.tar"))
    undo()
    assert listed(source, folder, kind) == expand_sources(source)
