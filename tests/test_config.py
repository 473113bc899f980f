"""Dirty configuration fails early and clearly: every bad value is a ConfigError naming its option,
raised when the StreamConfig is built or at Stream.open — never a raw TypeError/ValueError/OSError,
never later inside a DALI worker, never a worker that grows until it is killed."""

import os

import numpy as np
import pytest

import dalistream
from dalistream.config import MAX_BATCH_SIZE, Field, StreamConfig
from dalistream.errors import ConfigError

from helpers import key_shards

FIELDS = {"key": "__key__", "label": "cls"}

BAD = [  # (option, bad value, words the message holds)
    ("seed", "abc", "seed"), ("seed", 1.5, "seed"), ("seed", -1, "seed"), ("seed", None, "seed"),
    ("shuffle", "1000", "shuffle"), ("shuffle", 1.5, "shuffle"), ("shuffle", -5, "shuffle"), ("shuffle", True, "shuffle"),
    ("max_member_bytes", "1MB", "max_member_bytes"), ("max_member_bytes", 0, "max_member_bytes"),
    ("max_member_bytes", 2.5e6, "max_member_bytes"),
    ("batch_size", "32", "batch_size"), ("batch_size", 0, "batch_size"), ("batch_size", 10**9, "batch_size"),
    ("batch_size", MAX_BATCH_SIZE + 1, "batch_size"), ("batch_size", 32.0, "batch_size"),
    ("workers", "2", "workers"), ("workers", 0, "workers"), ("world_size", 0, "world_size"),
    ("rank", "0", "rank"), ("rank", -1, "rank"), ("rank", 3, "rank"),
    ("prefetch", 0, "prefetch"), ("batches_per_epoch", "10", "batches_per_epoch"),
    ("batches_per_epoch", 0, "batches_per_epoch"), ("policy", "uneven", "policy"), ("policy", ["even"], "policy"),
    ("missing", "ignore", "missing"), ("on_error", "warn", "on_error"), ("on_error", ["skip"], "on_error"),
    ("shuffle_shards", "no", "shuffle_shards"), ("lowercase_ext", 1, "lowercase_ext"),
    ("max_skip_fraction", 0, "max_skip_fraction"), ("max_skip_fraction", 1.5, "max_skip_fraction"),
    ("max_skip_fraction", "0.5", "max_skip_fraction"), ("cache_dir", 3, "cache_dir"), ("manifest", 1, "manifest"),
    ("storage_options", "endpoint", "storage_options"), ("cache", 3, "cache"), ("cache", ["/c"], "cache"),
    ("cache_limit", "lots", "cache_limit"), ("cache_limit", -1, "cache_limit"), ("cache_limit", 2.5, "cache_limit"),
    ("cache_limit", "800 GiBs", "cache_limit"),
    ("fields", ["png"], "fields"), ("fields", "png", "fields"), ("fields", {}, "fields"),
    ("fields", {"image": 3}, "image"), ("fields", {"image": "png", "valid": "cls"}, "valid"),
    ("fields", {"x": {"exts": "npy", "kind": "npy", "dtype": "float33", "ndim": 2}}, "dtype"),
    ("fields", {"x": {"exts": "npy", "kind": "npy", "dtype": "bogus", "ndim": 1}}, "dtype"),
    ("fields", {"x": {"exts": "npy", "kind": "npy", "dtype": "float32", "ndim": "2"}}, "ndim"),
    ("fields", {"x": {"kind": "npy", "dtype": "float32", "ndim": 1}}, "exts"),
    ("fields", {"x": {"exts": "bin", "dtyp": "float32"}}, "dtyp"),
    ("fields", {"x": {"exts": "bin", "kind": "image"}}, "kind"),
    ("fields", {"x": ["jpg", 3]}, "'x'"),
    ("fields", {"x": {"exts": "bin", "decoder": "numpy.frombuffer"}}, "decoder"),
    ("fields", [Field("x", ("bin",)), "cls"], "fields"),
]


@pytest.mark.parametrize("option,value,words", BAD, ids=[f"{o}={v!r}"[:40] for o, v, _ in BAD])
def test_bad_values_are_config_errors_naming_the_option(option, value, words):
    kwargs = dict(sources=("a.tar",), fields=FIELDS, batch_size=4, workers=2, world_size=2)
    kwargs[option] = value
    with pytest.raises(ConfigError) as info:
        StreamConfig(**kwargs)
    assert words in str(info.value)


def test_good_values_of_other_kinds_pass():
    config = StreamConfig(sources=("a.tar",), fields=[Field("x", ("bin",), dtype=np.dtype("float32"))],
                          batch_size=np.int64(8), seed=np.uint32(7), shuffle=0, max_skip_fraction=1,
                          cache_dir=os.curdir)
    assert config.batch_size == 8 and config.seed == 7
    sized = StreamConfig(sources=("a.tar",), fields=FIELDS, batch_size=4, cache=os.curdir, cache_limit="1.5TB")
    assert sized.cache_limit == 1_500_000_000_000 and StreamConfig(("a.tar",), FIELDS, 4).cache is None


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("cfg"))
    return key_shards(d, [5, 6, 7, 4])


@pytest.mark.parametrize("option,value", [("seed", "abc"), ("shuffle", "1000"), ("max_member_bytes", "1MB"),
                                          ("fields", ["png"]), ("rank", "1"), ("world_size", 2.0)])
def test_stream_open_raises_before_any_worker(shards, tmp_path, option, value):
    kwargs = dict(fields=FIELDS, batch_size=4, workers=1, device="cpu", cache_dir=str(tmp_path), world_size=1, rank=0)
    kwargs[option] = value
    with pytest.raises(ConfigError, match=option):
        dalistream.Stream.open(shards, **kwargs)


def test_an_unusable_cache_directory_is_named(shards, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for cache in (str(not_a_dir / "cache"), str(not_a_dir)):
        with pytest.raises(ConfigError, match="cache_dir") as info:
            dalistream.Stream.open(shards, fields=FIELDS, batch_size=2, workers=1, device="cpu", cache_dir=cache)
        assert cache in str(info.value)
    with pytest.raises(ConfigError, match="cache_dir"):  # from the environment: the same
        dalistream.Stream.open(shards, fields=FIELDS, batch_size=2, workers=1, device="cpu",
                               env={"DALISTREAM_CACHE": str(not_a_dir / "c")})
    # the default location, unusable: scanned without a cache, with a warning
    stream = dalistream.Stream.open(shards, fields=FIELDS, batch_size=2, workers=1, device="cpu",
                                    env={"XDG_CACHE_HOME": str(not_a_dir)})
    assert stream.config.cache_dir is None and stream.counts == (5, 6, 7, 4)
    # a manifest needs no cache
    stream = dalistream.Stream.open(shards, fields=FIELDS, batch_size=2, workers=1, device="cpu",
                                    cache_dir=str(not_a_dir), policy="fixed", batches_per_epoch=3)
    assert stream.steps(0) == 3


@pytest.mark.parametrize("policy,batch_size,workers,world_size", [
    ("even", 23, 1, 1),     # one sample more than the data
    ("even", 12, 2, 2),     # fits the data (22), not a share of it (slot 6, 4 global workers)
    ("even", 10**6, 1, 1),  # would have grown a worker until killed
    ("exact", 23, 1, 1),
    ("exact", 500, 2, 2),
])
def test_a_batch_larger_than_the_data_is_named(shards, tmp_path, policy, batch_size, workers, world_size):
    with pytest.raises(ConfigError, match="batch_size"):
        dalistream.Stream.open(shards, fields=FIELDS, batch_size=batch_size, workers=workers, world_size=world_size,
                               rank=0, device="cpu", policy=policy, cache_dir=str(tmp_path))


def test_the_largest_batches_the_data_allows_pass(shards, tmp_path):
    exact = dalistream.Stream.open(shards, fields=FIELDS, batch_size=22, workers=1, device="cpu", policy="exact",
                                   cache_dir=str(tmp_path))
    assert exact.steps(0) == 1
    even = dalistream.Stream.open(shards, fields=FIELDS, batch_size=4, workers=2, world_size=2, rank=1, device="cpu",
                                  cache_dir=str(tmp_path))
    assert even.steps(0) >= 1


def test_one_default_per_option_across_entry_points():
    """StreamConfig, Stream.open, the CLI's data commands, the demo and the ready pipelines agree
    on the defaults of the options they share (workers: a new user got 1 from one and 2 from another)."""
    import argparse
    import dataclasses
    import inspect

    import dalistream
    from dalistream.config import StreamConfig
    from dalistream.pipelines import classification_eval, classification_train, image_text
    from dalistream.tools import args as cli_args
    from dalistream.tools import demo

    defaults = {f.name: f.default for f in dataclasses.fields(StreamConfig) if f.default is not dataclasses.MISSING}
    seen = 0
    for fn in (dalistream.Stream.open, classification_train.loader, classification_eval.loader, image_text.loader):
        for name, p in inspect.signature(fn).parameters.items():
            if (name in defaults and p.default not in (inspect.Parameter.empty, None)  # None: resolved at entry
                    and name != "policy"):
                assert p.default == defaults[name], (fn.__qualname__, name)  # policy: train vs eval, on purpose
                seen += 1
    parser = argparse.ArgumentParser()
    cli_args.add_stream_args(parser)
    demo_parser = demo.add_parser(argparse.ArgumentParser().add_subparsers())
    for parser in (parser, demo_parser):
        for action in parser._actions:
            name = action.dest
            if name in defaults and action.default is not None and name != "policy":
                assert action.default == defaults[name], ("cli", name)
                seen += 1
    assert seen >= 6
