"""Rank and world size checked again when a loader starts (:mod:`dalistream.loader.ranks`): a
stream opened before ``torch.distributed`` was initialised takes the group's rank and world
size; values given explicitly that the group contradicts are refused by name. (The real two-process
case is tests/loader/test_ddp_eval.py.)"""

import pytest

from dalistream import Stream
from dalistream.errors import ConfigError
from dalistream.loader.ranks import relaid

from helpers import key_shards


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ranks"))
    key_shards(d, [10, 7, 12])
    return d


def opened(folder, env=None, **kw):
    return Stream.open(folder, fields={"key": "__key__"}, batch_size=4, workers=1, device="cpu", cache_dir=folder,
                       env=env or {}, **kw)


@pytest.mark.parametrize("env", [{}, {"RANK": "0", "WORLD_SIZE": "1"}, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}])
def test_defaults_give_way_to_the_group(folder, env):
    stream = opened(folder, env)
    assert (stream.config.rank, stream.config.world_size) == (0, 1)
    for group in [(1, 2), (0, 2), (2, 3)]:
        now = relaid(stream, group)
        assert (now.config.rank, now.config.world_size) == group
        assert now.steps(0) == sum([10, 7, 12]) // (group[1] * 4)  # the group's batches, the same on every rank
    assert relaid(stream, None) is stream  # no group: nothing to change
    assert relaid(stream, (0, 1)) is stream


def test_values_given_are_kept_where_they_can_be_meant(folder):
    everything = opened(folder, rank=0, world_size=1)  # every process reads the whole data set, as asked
    assert relaid(everything, (1, 2)) is everything
    half = opened(folder, rank=1, world_size=2)
    assert relaid(half, (1, 2)) is half
    ranked = opened(folder, {"WORLD_SIZE": "2"}, rank=1)  # world size from the environment: the group's wins
    now = relaid(ranked, (1, 3))
    assert (now.config.rank, now.config.world_size) == (1, 3)


@pytest.mark.parametrize("given,group,words", [
    ({"rank": 0, "world_size": 2}, (1, 2), "rank=0"),
    ({"world_size": 2}, (1, 4), "world_size=2"),
    ({"rank": 0, "world_size": 3}, (0, 2), "world_size=3"),
    ({"rank": 0}, (1, 2), "rank=0"),
])
def test_values_given_that_the_group_contradicts_are_refused_by_name(folder, given, group, words):
    stream = opened(folder, **given)
    with pytest.raises(ConfigError, match=words) as info:
        relaid(stream, group)
    assert f"rank {group[0]} of {group[1]}" in str(info.value)


def test_a_stream_built_from_a_config_keeps_its_layout(folder):
    stream = opened(folder, rank=0, world_size=2)
    direct = Stream(stream.config, stream.data)  # not through open: its config's values count as given
    with pytest.raises(ConfigError, match="rank=0"):
        relaid(direct, (1, 2))


def test_the_group_is_checked_against_the_data(folder):
    stream = Stream.open(folder, fields={"key": "__key__"}, batch_size=8, workers=1, device="cpu", cache_dir=folder,
                         env={})
    with pytest.raises(ConfigError, match="batch_size 8 gives no full batch"):
        relaid(stream, (0, 4))  # 29 samples cannot fill a batch of 8 on 4 ranks


def test_a_bucketed_stream_takes_the_group_s_layout_and_is_checked_on_it(tmp_path):
    from dalistream import LengthBuckets
    from helpers import length_shards

    length_shards(str(tmp_path), [10, 7, 12], seed=1)
    stream = Stream.open(str(tmp_path), fields={"key": "__key__"}, batch_size=3, workers=1, device="cpu", env={},
                         cache_dir=str(tmp_path / "cache"), buckets=LengthBuckets("txt", [30]))
    now = relaid(stream, (1, 2))
    assert (now.config.rank, now.config.world_size) == (1, 2) and 0 < now.steps(0) < stream.steps(0)
    with pytest.raises(ConfigError, match="gives no batch of one bucket"):
        relaid(stream, (0, 16))  # 29 samples in two buckets: fewer than 16 batches of 3 of one bucket
