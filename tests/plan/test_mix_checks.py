"""Loud where a mix was silent: a shard listed by two sources is refused by name, and the hint of a
weight too small to reach a batch works when followed (weights 1e9 : 1 said "weight 0 … at least
0.0625", and following that said the same again)."""

import os
import re

import numpy as np
import pytest

from dalistream import Stream
from dalistream.errors import ConfigError
from dalistream.plan import Layout, MixEpoch, Schedule, check_share, integer_weights

from helpers import key_shards


def hinted(error: ConfigError):
    """(the factor the hint raises the source's weight by, or None; the batch size it names)."""
    factor = re.search(r"raise its weight at least ([0-9.e+-]+)-fold", error.hint)
    batch = int(re.search(r"use batch_size=(\d+) or more", error.hint).group(1))
    return (float(factor.group(1)) if factor else None), batch


@pytest.mark.parametrize("weights", [[1e9, 1], [1, 1e9], [1000, 1, 1], [5, 5, 1e-6], [0.999, 0.001], [3.3, 7.1e-4, 2.2],
                                     [1, 1, 1, 1, 1]])
@pytest.mark.parametrize("batch", [1, 2, 16, 256, 1000])
def test_a_weight_hint_followed_passes(weights, batch):
    totals = [10**9] * len(weights)
    names = [f"s{i}" for i in range(len(weights))]
    try:
        check_share(weights, totals, batch, names=names)
    except ConfigError as e:
        small = int(re.search(r"source 's(\d+)'", str(e)).group(1))  # the first source short of half a sample
        assert "weight 0 " not in str(e)
        factor, bigger = hinted(e)
        assert bigger > batch
        check_share(weights, totals, bigger, names=names)  # a batch as large as the hint says: accepted
        if factor is None:  # raising this weight alone cannot do: the others would fall short
            assert len(weights) > 2
            return
        raised = list(weights)
        raised[small] *= factor
        check_share(raised, totals, batch, names=names)  # the hint, followed: accepted
        lower = list(weights)
        lower[small] *= factor / 1.1  # (a share of ~32 units of 1/65,536 rounds by a few per cent)
        with pytest.raises(ConfigError, match=f"'s{small}'"):  # and not far above what is needed
            check_share(lower, totals, batch, names=names)
    else:
        assert 2 * min(weights) / sum(weights) * batch >= 0.99  # only a share near half a sample passes


def test_integer_weights_never_round_a_source_to_zero():
    for weights in ([1e9, 1], [1, 1e9], [1e12, 1, 1], [0.999999999, 1e-9]):
        w = integer_weights(weights)
        assert min(w) >= 1, (weights, w)


def test_the_issue_case_end_to_end():
    counts = [[1000] * 4, [1000] * 4]
    layout, schedule = Layout(1, 1, 16), Schedule(0)
    with pytest.raises(ConfigError) as info:
        MixEpoch(counts, [1e9, 1], layout, schedule, 0, ["big", "small"])
    assert "'small'" in str(info.value)
    MixEpoch(counts, [1e9, hinted(info.value)[0]], layout, schedule, 0, ["big", "small"])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    key_shards(str(root / "a"), [5, 6, 7])
    key_shards(str(root / "b"), [4, 4], prefix="b")
    return root


def open_mix(mapping):
    return Stream.open(mapping, fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu", env={})


@pytest.mark.parametrize("second", [
    lambda r: str(r / "a"),                                        # the same folder twice
    lambda r: str(r / "a" / "s-0001.tar"),                         # one shard of it
    lambda r: [str(r / "b"), str(r / "a" / "s-0002.tar")],         # a list that also holds one of it
    lambda r: str(r / "a" / "*.tar"),                              # a glob over it
    lambda r: os.path.join(str(r), "b", "..", "a", "s-0000.tar"),  # another spelling of one of its paths
])
def test_a_shard_in_two_sources_is_refused_naming_both(data, second):
    with pytest.raises(ConfigError, match="sources 'first' and 'second' both list this shard") as info:
        open_mix({"first": (str(data / "a"), 0.5), "second": (second(data), 0.5)})
    assert "s-000" in str(info.value) and "one source only" in info.value.hint


def test_disjoint_sources_open(data):
    stream = open_mix({"first": (str(data / "a"), 0.5), "second": (str(data / "b"), 0.5)})
    assert stream.mix.names == ("first", "second") and np.sum(stream.data.counts) == 26
