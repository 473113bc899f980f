"""The resolved data set: one frozen value that pickles whole (DALI workers receive it), and whose
parts must agree with its shard URLs."""

import dataclasses
import pickle

import numpy as np
import pytest

from dalistream.dataset import DataSet
from dalistream.errors import ConfigError
from dalistream.manifest.offsets import SampleOffsets


def offsets_of(counts):
    return SampleOffsets(counts, [[512 * (1 + 3 * i) for i in range(n)] for n in counts])


def test_a_data_set_is_frozen():
    data = DataSet(("a.tar", "b.tar"), (3, 4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.urls = ("c.tar",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.counts = None


def test_a_data_set_without_offsets_pickles_round_trip():
    data = DataSet(("a.tar", "b.tar"), (3, 4), None, count_source="header scan", bytes_per_sample=1536.5,
                   sizes=(4608, 6144))
    again = pickle.loads(pickle.dumps(data))
    assert again == data and again.offsets is None
    assert (again.count_source, again.bytes_per_sample, again.sizes) == ("header scan", 1536.5, (4608, 6144))


@pytest.mark.parametrize("saved", [False, True])
def test_a_data_set_with_offsets_pickles_round_trip(tmp_path, saved):
    offsets = offsets_of([3, 4])
    if saved:  # saved to the cache directory: the offsets travel as a path and are mapped again
        offsets = offsets.saved(str(tmp_path))
    data = DataSet(("a.tar", "b.tar"), (3, 4), offsets, count_source="manifest m.json")
    again = pickle.loads(pickle.dumps(data))
    assert (again.urls, again.counts, again.count_source) == (data.urls, data.counts, data.count_source)
    assert [again.offsets.at(s, i) for s in range(2) for i in range(data.counts[s])] == \
        [offsets.at(s, i) for s in range(2) for i in range(data.counts[s])]
    assert (again.offsets.path is not None) == saved
    np.testing.assert_array_equal(again.offsets.starts, offsets.starts)


def test_a_data_set_may_be_uncounted():
    data = DataSet(("a.tar", "b.tar"), None)
    assert data.counts is None and data.offsets is None


@pytest.mark.parametrize("kwargs,named", [
    ({"counts": (3,)}, "1 counts for 2 shard URLs"),
    ({"counts": (3, 4, 5)}, "3 counts for 2 shard URLs"),
    ({"counts": (3, 4), "sizes": (10,)}, "1 sizes for 2 shard URLs"),
    ({"counts": (3, 4), "offsets": offsets_of([3, 4, 1])}, "offsets for 3 shards, 2 shard URLs"),
    ({"counts": (3, 4), "offsets": offsets_of([3, 5])}, "offsets' per-shard sample counts disagree with counts"),
    ({"counts": None, "offsets": offsets_of([3])}, "offsets for 1 shards, 2 shard URLs"),
])
def test_parts_that_disagree_with_the_urls_are_a_config_error_naming_them(kwargs, named):
    with pytest.raises(ConfigError, match="data set") as e:
        DataSet(("a.tar", "b.tar"), **kwargs)
    assert named in str(e.value)


def test_its_repr_redacts_credentials():
    data = DataSet(("s3://key:secret@bucket/a.tar",), (3,))
    assert "secret" not in repr(data) and "1 shards" in repr(data)
