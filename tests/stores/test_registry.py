"""The scheme registry without servers: which store serves a URL, unknown schemes, missing extras,
store options, brace patterns written out, globs, and local brace patterns a manifest names."""

from __future__ import annotations

import builtins
import json
import os

import braceexpand
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dalistream
from dalistream.errors import ConfigError, SourceError
from dalistream.io.options import remote_options
from dalistream.io.stores import SCHEMES, is_local, is_ranged, scheme_of, schemes_in, store_class, store_for
from dalistream.io.stores.base import glob_regex, match_glob
from dalistream.sources.listing import expand_braces, expand_sources


@pytest.mark.parametrize("url, scheme, local, ranged", [
    ("/data/a.tar", "file", True, False), ("data/a.tar", "file", True, False), ("file:///d/a.tar", "file", True, False),
    ("s3://b/a.tar", "s3", False, True), ("gs://b/a.tar", "gs", False, True), ("az://c/a.tar", "az", False, True),
    ("abfs://c@acct.dfs.core.windows.net/a.tar", "abfs", False, True), ("hf://datasets/o/n/a.tar", "hf", False, True),
    ("https://h/a.tar", "https", False, True), ("http://h/a.tar", "http", False, True),
    ("pipe:curl -s http://h/a.tar", "pipe", False, False), ("GS://b/a.tar", "gs", False, True),
])
def test_each_url_has_its_store(url, scheme, local, ranged):
    assert scheme_of(url) == scheme and is_local(url) is local and is_ranged(url) is ranged


@pytest.mark.parametrize("urls, expected", [
    (["/a", "/b"], {"file"}),
    (["s3://b/x", "/a", "pipe:cat x", "file:///y"], {"s3", "file", "pipe"}),
    (["pipe:curl http://host/x.tar"], {"pipe"}),  # a URL inside a command is the command's
    (["hf://datasets/o/n/x", "gs://b/x"], {"hf", "gs"}),
    (["/data/odd://name.tar"], {"file"}),  # "://" inside a path
])
def test_schemes_in_a_list(urls, expected):
    found = schemes_in(urls)
    assert set(found) == expected and all(scheme_of(found[s]) == s for s in found)


@pytest.mark.parametrize("urls", [["ftp://h/a.tar"], ["/a", "s3://b/x", "webdav://h/x"], ["/a", "gcs://b/x"]])
def test_an_unknown_scheme_is_named_with_the_supported_ones(urls):
    with pytest.raises(ConfigError) as info:
        schemes_in(urls)
    text = str(info.value)
    assert "unknown URL scheme" in text and all(f"{s}://" in text for s in SCHEMES if s != "pipe")
    with pytest.raises(ConfigError):
        dalistream.Stream.open(urls, fields={"k": "__key__"}, batch_size=1, device="cpu", rank=0, world_size=1)


@pytest.mark.parametrize("url, module, extra", [
    ("gs://b/a.tar", "google.auth", "gcs"), ("az://c/a.tar", "azure.storage.blob", "azure"),
    ("hf://datasets/o/n/a.tar", "huggingface_hub", "hf"),
])
def test_a_missing_extra_names_the_install(url, module, extra, monkeypatch):
    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    store = store_class(url)(remote_options({"account_name": "acct"} if extra == "azure" else {}))
    call = {"gcs": lambda: store.http, "azure": lambda: store.stat(url),
            "hf": lambda: store.write(url, b"x")}[extra]
    with pytest.raises(ConfigError) as info:
        call()
    assert f'pip install "dalistream[{extra}]"' in str(info.value)


def test_store_options_reach_only_stores_and_secrets_stay_hidden():
    opts = remote_options({"profile": "lab", "account_key": "sekrit-key", "token": "hf_sekrit", "part_bytes": 4096})
    assert opts.get("profile") == "lab" and opts.part_bytes == 4096
    assert "sekrit" not in repr(opts)
    with pytest.raises(ConfigError, match="unknown storage_options"):
        remote_options({"acount_key": "x"})
    assert store_for("s3://b/x", {"profile": "lab"}) is store_for("s3://b/y", {"profile": "lab"})  # one per options


@pytest.mark.parametrize("url, variable", [("s3://b/x", "AWS_ENDPOINT_URL"), ("gs://b/x", "STORAGE_EMULATOR_HOST"),
                                           ("az://c/x", "AZURE_STORAGE_CONNECTION_STRING"), ("hf://datasets/o/n/x", "HF_ENDPOINT")])
def test_a_store_follows_the_variables_its_client_reads(url, variable, monkeypatch):
    monkeypatch.setenv(variable, "http://127.0.0.1:1")
    first = store_for(url)
    assert store_for(url) is first
    monkeypatch.setenv(variable, "http://127.0.0.1:2")  # (a test's next emulator, a notebook's new setting)
    assert store_for(url) is not first


@settings(max_examples=200, deadline=None)
@given(low=st.integers(0, 1200), span=st.integers(-30, 30), pad=st.integers(0, 5), head=st.sampled_from(["a-", "", "x/%d"]))
def test_a_numeric_brace_range_is_written_out_as_braceexpand_does(low, span, pad, head):
    high = max(0, low + span)
    pattern = f"{head}{{{str(low).zfill(pad)}..{str(high).zfill(pad)}}}.tar"
    assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern))


@pytest.mark.parametrize("pattern, names, matched", [
    ("s3://b/d/*.tar", ["s3://b/d/a.tar", "s3://b/d/e/f.tar", "s3://b/d/a.tgz"], ["s3://b/d/a.tar"]),
    ("s3://b/d/**/*.tar", ["s3://b/d/a.tar", "s3://b/d/e/f.tar"], ["s3://b/d/a.tar", "s3://b/d/e/f.tar"]),
    ("s3://b/d/p-0[0-1]?.tar", ["s3://b/d/p-000.tar", "s3://b/d/p-020.tar", "s3://b/d/p-01x.tar"],
     ["s3://b/d/p-000.tar", "s3://b/d/p-01x.tar"]),
    ("s3://b/d/[!a]*.tar", ["s3://b/d/a.tar", "s3://b/d/b.tar"], ["s3://b/d/b.tar"]),
    ("s3://b/d.(x)/+.tar", ["s3://b/d.(x)/+.tar", "s3://b/dx(x)/+.tar"], ["s3://b/d.(x)/+.tar"]),
])
def test_globs_match_as_a_shell_does(pattern, names, matched):
    assert match_glob(pattern, names) == matched and glob_regex(pattern)


def _counts_only_manifest(folder: str, names) -> None:
    rows = [{"url": n, "samples": 3, "bytes": 10240} for n in names]
    with open(os.path.join(folder, "dalistream-manifest.json"), "w") as f:
        json.dump({"format": "dalistream-manifest", "version": 1, "shards": rows}, f)


def test_a_local_brace_pattern_the_manifest_names_is_not_stated_file_by_file(tmp_path, monkeypatch):
    """Shards a manifest names are listed without a stat each (one read of their folder's entries
    tells they are there), and the counts come from the manifest; one that is not there is named."""
    names = [f"s-{i:04d}.tar" for i in range(300)]
    for name in names:
        open(tmp_path / name, "wb").close()  # (never read: the manifest counts them)
    _counts_only_manifest(str(tmp_path), names)
    pattern = str(tmp_path / "s-{0000..0299}.tar")
    files = dalistream.manifest.files
    named = lambda folder, read: files.manifest_urls(folder, files.manifest_reader(None))  # noqa: E731
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: stats.append(path) or real_stat(path, *a, **k))
    assert expand_sources(pattern, named=lambda folder: named(folder, None)) == [str(tmp_path / n) for n in names]
    assert len(stats) < 10, stats[:20]
    monkeypatch.setattr(os, "stat", real_stat)
    stream = dalistream.Stream.open(pattern, fields={"k": "__key__"}, batch_size=4, device="cpu", rank=0,
                                    world_size=1, policy="exact", cache_dir=str(tmp_path / "cache"))
    assert len(stream.urls) == 300 and sum(stream.counts) == 900
    with pytest.raises(SourceError, match="no such shard file"):  # without a manifest, paths are checked
        expand_sources(str(tmp_path / "t-{0000..0099}.tar"), named=lambda folder: named(folder, None))
    with pytest.raises(SourceError, match="no such shard file"):  # a name the manifest lacks is checked too
        expand_sources(str(tmp_path / "s-{0000..0300}.tar"), named=lambda folder: named(folder, None))
    os.remove(tmp_path / names[123])
    with pytest.raises(SourceError, match="no such shard file") as info:  # and one it names that is gone
        expand_sources(pattern, named=lambda folder: named(folder, None))
    assert info.value.url == str(tmp_path / names[123])


@pytest.mark.parametrize("output", ["https://host/out/", "http://user:pw@host/out/", "pipe:cat > out.tar"])
def test_a_store_that_cannot_be_written_says_so_before_anything_is_asked(output):
    """(No server is running: a listing or a write attempt would fail otherwise, naming a connection.)"""
    from dalistream.writer.commit import Target

    with pytest.raises(SourceError, match="cannot be written") as info:
        Target(output)
    assert "pw" not in str(info.value) and "object store" in info.value.hint
