"""The shuffle-quality measure against real DALI pipelines (CPU): on class-sorted shards, every
rank batch the loader delivers holds exactly the samples (and so the labels) the measure
predicts from counts alone, in every epoch, for both policies it covers."""

import os

import numpy as np
import pytest

from dalistream import Loader, Stream
from dalistream.plan import Layout, Schedule
from dalistream.tools.quality import batch_label_stats, rank_batches, sorted_labels

from helpers import uneven_sizes, write_tar

pytestmark = [pytest.mark.dali]

SIZES = uneven_sizes(11, seed=7, low=3, high=26)
CLASSES = 9
R, W, B = 2, 2, 6


@pytest.fixture(scope="module")
def sorted_shards(tmp_path_factory):
    """Samples written in class order, as a naive folder conversion writes them."""
    d = str(tmp_path_factory.mktemp("sorted"))
    labels = sorted_labels(sum(SIZES), CLASSES)
    position = 0
    for s, n in enumerate(SIZES):
        members = []
        for i in range(n):
            members.append((f"s{s:03d}/{i:05d}.cls", str(int(labels[position])).encode()))
            members.append((f"s{s:03d}/{i:05d}.bin", b"x"))
            position += 1
        write_tar(os.path.join(d, f"s-{s:04d}.tar"), members)
    return d


def sample_id(key):
    shard, i = key.split("/")
    return int(np.sum(SIZES[:int(shard[1:])])) + int(i)


@pytest.mark.parametrize("policy,shuffle,interleave,seed", [
    ("even", 5, None, 3), ("exact", 40, None, 8),     # one span per worker through a buffer
    ("even", None, None, 3), ("exact", None, True, 8),  # interleaved: the training default, asked for with exact
])
def test_loader_batches_are_the_measures(sorted_shards, policy, shuffle, interleave, seed):
    labels = sorted_labels(sum(SIZES), CLASSES)
    layout, schedule = Layout(R, W, B), Schedule(seed, policy)
    for rank in range(R):
        stream = Stream.open(sorted_shards, fields={"key": "__key__", "label": "cls"}, batch_size=B, workers=W,
                             rank=rank, world_size=R, device="cpu", seed=seed, shuffle=shuffle, policy=policy,
                             interleave=interleave)
        c = stream.config
        assert c.interleave == (shuffle is None)
        with Loader(stream) as loader:
            for epoch in range(2):
                predicted = rank_batches(SIZES, layout, schedule, epoch, c.shuffle, columns=c.interleave)[rank]
                predicted = predicted[(predicted >= 0).any(axis=1)]  # a batch of padding only is not yielded
                delivered = [batch for batch in loader]
                assert len(delivered) == len(predicted)
                for batch, ids in zip(delivered, predicted):
                    want = sorted(ids[ids >= 0].tolist())
                    got = [sample_id(k) for k in batch["key"]]
                    assert sorted(got) == want
                    assert sorted(batch["label"].tolist()) == sorted(labels[want].tolist())
                    if policy == "even":  # full batches: the same positions too
                        assert got == ids.tolist()
                # and so the measure's statistics are the delivered batches'
                rows = np.full((len(delivered), B), -1)
                for j, batch in enumerate(delivered):
                    rows[j, :len(batch["label"])] = batch["label"].numpy()
                want_rows = np.where(predicted >= 0, labels[np.maximum(predicted, 0)], -1)
                assert (batch_label_stats(rows)["distinct"] == batch_label_stats(want_rows)["distinct"]).all()
