"""A batch larger than the data is refused with a hint naming what would work, and following the
hint works: never the value refused (``batch_size 3 … use batch_size <= 3`` with 1 sample and 3
workers), never a batch size smaller than the workers."""

import itertools
import re

import pytest

from dalistream.config import StreamConfig
from dalistream.errors import ConfigError
from dalistream.stream import check_data_size


def config(policy, R, W, B):
    return StreamConfig(sources=("data",), fields={"key": "__key__"}, batch_size=B, workers=W, world_size=R,
                        policy=policy)


def followed(hint, policy, R, W, B):
    """The layout the hint asks for (its workers=, batch size and policy)."""
    most = re.search(r"batch_size of at most (\d+)", hint)
    workers = re.search(r"workers=(\d+)", hint)
    return (("exact" if "policy='exact'" in hint else policy), R, int(workers.group(1)) if workers else W,
            int(most.group(1)) if most else B)


def test_the_issue_case():
    with pytest.raises(ConfigError) as info:
        check_data_size(config("exact", 1, 3, 3), [1])
    assert "batch_size of at most 1" in info.value.hint and "workers=1" in info.value.hint
    assert "3" not in info.value.hint
    assert "(1 sample)" in str(info.value)  # (not "1 samples")


@pytest.mark.parametrize("policy", ["even", "exact"])
def test_every_refusal_names_a_layout_that_works(policy):
    refused = 0
    for R, W, B, T in itertools.product(range(1, 5), range(1, 4), range(1, 17), range(1, 40)):
        if B < W:
            continue
        try:
            check_data_size(config(policy, R, W, B), [T])
            continue
        except ConfigError as e:
            hint = e.hint
        refused += 1
        policy2, R2, W2, B2 = followed(hint, policy, R, W, B)
        assert (policy2, W2, B2) != (policy, W, B), f"R={R} W={W} B={B} T={T}: the hint names what it refuses: {hint}"
        assert W2 <= B2 <= B
        check_data_size(config(policy2, R2, W2, B2), [T])  # the hint, followed: accepted
    assert refused > 100


def test_an_empty_data_set_says_so():
    with pytest.raises(ConfigError, match="no samples"):
        check_data_size(config("exact", 1, 1, 4), [0])
