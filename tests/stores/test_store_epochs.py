"""Training on every store through DALI: an epoch read by interleaved ranged reads (a manifest with
offsets written to the store by ``dalistream index``; on a web server, put there) delivers the
local copy's keys batch by batch; a state saved reading from S3 resumes reading the same set from GCS; a mix of sources on
different stores delivers what the same mix of local copies does."""

from __future__ import annotations

import shutil

import pytest

import dalistream
from dalistream import cli

pytestmark = [pytest.mark.stores, pytest.mark.slow, pytest.mark.dali, pytest.mark.timeout(600)]
KEYS = {"key": "__key__"}
COMMON = dict(fields=KEYS, batch_size=4, workers=2, rank=0, world_size=1, device="cpu", seed=3, cache_dir=None)


def _source(backend, local_set):
    """The data set on ``backend``: its folder, or on a web server (which cannot be listed) its shards."""
    if backend.listable:
        return backend.url("ds/")
    return [backend.url(f"ds/{n}") for n in local_set["names"] if n.endswith((".tar", ".tgz"))]


def _index(backend, monkeypatch, local_set, tmp_path) -> None:
    """``dalistream index`` onto the store, configured from the environment as a user's shell is (a
    web server cannot be written: the manifest is put there by the server's own means)."""
    for name, value in backend.env.items():
        monkeypatch.setenv(name, value)
    target = backend.url("ds/dalistream-manifest.json")
    if backend.writable:
        assert cli.main(["index", backend.url("ds/"), "-o", target]) == 0
        return
    written = str(tmp_path / "dalistream-manifest.json")
    assert cli.main(["index", *_source(backend, local_set), "-o", written]) == 0
    with open(written, "rb") as f:
        backend.put("ds/dalistream-manifest.json", f.read())


def _batches(stream, state=None, stop=None):
    with dalistream.Loader(stream) as loader:
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for batch in loader:
            out.append(list(batch["key"]))
            if stop is not None and len(out) == stop:
                return out, loader.state_dict()
        return out, None


def test_an_epoch_by_interleaved_ranged_reads_equals_the_local_copy(backend, local_set, monkeypatch, tmp_path):
    _index(backend, monkeypatch, local_set, tmp_path)
    remote = dalistream.Stream.open(_source(backend, local_set), storage_options=backend.options, **COMMON)
    assert remote.config.interleave and remote.data.offsets is not None  # columns read by ranged reads
    local = dalistream.Stream.open(local_set["folder"], **COMMON)
    got, _ = _batches(remote)
    assert got == _batches(local)[0] and len(got) >= 3


def test_a_state_saved_on_s3_resumes_on_gcs(s3_backend, gcs_backend, local_set, monkeypatch, tmp_path):
    _index(s3_backend, monkeypatch, local_set, tmp_path)
    _index(gcs_backend, monkeypatch, local_set, tmp_path)
    on_s3 = dalistream.Stream.open(s3_backend.url("ds/"), storage_options=s3_backend.options, **COMMON)
    first, state = _batches(on_s3, stop=2)
    moved = dict(COMMON, workers=1)  # and elastic: another layout
    on_gcs = dalistream.Stream.open(gcs_backend.url("ds/"), storage_options=gcs_backend.options, **moved)
    rest, _ = _batches(on_gcs, state)
    local_rest, _ = _batches(dalistream.Stream.open(local_set["folder"], **moved), state)
    assert rest == local_rest and len(rest) >= 1
    everything = sorted(k for b in _batches(dalistream.Stream.open(local_set["folder"], **COMMON))[0] for k in b)
    assert sorted(k for b in first + rest for k in b) == everything  # each sample once


def test_a_mix_of_sources_on_different_stores(s3_backend, hub_backend, azure_backend, local_set, tmp_path,
                                              monkeypatch):
    for backend in (s3_backend, hub_backend, azure_backend):
        _index(backend, monkeypatch, local_set, tmp_path)
    copies = [str(tmp_path / name) for name in ("a", "b", "c")]
    for copy in copies:
        shutil.copytree(local_set["folder"], copy)
    mix = {name: {"source": b.url("ds/"), "weight": w, "storage_options": b.options}
           for name, b, w in (("s3", s3_backend, 0.5), ("hub", hub_backend, 0.25), ("azure", azure_backend, 0.25))}
    local_mix = {name: {"source": copy, "weight": w}
                 for (name, w), copy in zip((("s3", 0.5), ("hub", 0.25), ("azure", 0.25)), copies)}
    options = {k: v for k, v in COMMON.items() if k != "fields"}
    got, _ = _batches(dalistream.Stream.open(mix, fields=KEYS, **{k: v for k, v in options.items()}))
    expected, _ = _batches(dalistream.Stream.open(local_mix, fields=KEYS, **options))
    assert got == expected and len(got) >= 2
