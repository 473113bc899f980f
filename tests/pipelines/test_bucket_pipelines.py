"""The bucketed ready pipelines through DALI on the CPU, over shards ``dalistream write`` made from
images of six aspect ratios with captions: every batch's images one shape, its bucket's; every
sample once; caption tokens padded to the batch's length bucket."""

from __future__ import annotations

import os

import numpy as np
import pytest

import dalistream
from dalistream.errors import ConfigError
from dalistream.pipelines import aspect_bucket_train, caption_buckets

from helpers import PHOTO_SIZES, photo_shards

pytestmark = [pytest.mark.dali]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("photos"))
    return os.path.join(d, "shards"), photo_shards(d, n=60), os.path.join(d, "cache")


def nearest(width, height):
    """The :data:`PHOTO_SIZES` index of nearest aspect ratio (log scale), by brute force."""
    gaps = [abs(np.log(width / height) - np.log(w / h)) for w, h in PHOTO_SIZES]
    return int(np.argmin(gaps))


@pytest.mark.parametrize("policy,workers", [("exact", 2), ("even", 1)])
def test_every_batch_is_one_bucket_resized_to_its_size(photos, policy, workers):
    shards, truth, cache = photos
    keys = []
    with aspect_bucket_train.loader(shards, batch_size=4, workers=workers, device="cpu", policy=policy, seed=3,
                                    buckets=dalistream.AspectBuckets(PHOTO_SIZES), cache_dir=cache,
                                    fields={"key": "__key__"}) as loader:
        for batch in loader:
            bucket = int(batch["bucket"][0])
            width, height = PHOTO_SIZES[bucket]
            assert batch["image"].shape == (len(batch["key"]), 3, height, width)
            assert batch["bucket"].tolist() == [bucket] * len(batch["key"])
            assert batch["bucket_height"].tolist() == [height] * len(batch["key"])
            assert batch["bucket_width"].tolist() == [width] * len(batch["key"])
            for key, label in zip(batch["key"], batch["label"].tolist()):
                assert nearest(truth[key]["width"], truth[key]["height"]) == bucket
                assert label == truth[key]["label"]
            keys += batch["key"]
    assert len(keys) == len(set(keys))
    if policy == "exact":
        assert sorted(keys) == sorted(truth)
    else:  # less than one batch of each bucket left out
        assert len(truth) - len(keys) < len(PHOTO_SIZES) * 4


def test_captions_as_tokens_padded_to_their_length_bucket(photos):
    shards, truth, cache = photos
    edges = [8, 16, 32]
    seen = []
    with caption_buckets.loader(shards, batch_size=4, workers=2, device="cpu", policy="exact", seed=1,
                                buckets=dalistream.LengthBuckets("txt", edges), cache_dir=cache,
                                fields={"key": "__key__"}) as loader:
        for batch in loader:
            bucket = int(batch["bucket"][0])
            captions = [truth[k]["caption"].encode() for k in batch["key"]]
            longest = max(len(c) for c in captions)
            width = edges[bucket] if bucket < len(edges) else longest
            assert batch["tokens"].shape == (len(captions), width)
            assert batch["bucket_length"].tolist() == [edges[bucket] if bucket < len(edges) else -1] * len(captions)
            for row, length, caption in zip(batch["tokens"].tolist(), batch["length"].tolist(), captions):
                assert length == len(caption) and int(np.searchsorted(edges, len(caption))) == bucket
                assert row == list(caption) + [0] * (width - len(caption))
            seen += batch["key"]
    assert sorted(seen) == sorted(truth)


def test_the_pipelines_refuse_the_other_kind_of_buckets(photos):
    shards, _, cache = photos
    with pytest.raises(ConfigError, match="AspectBuckets"):
        aspect_bucket_train.loader(shards, buckets=dalistream.LengthBuckets("txt", [8]), cache_dir=cache)
    with pytest.raises(ConfigError, match="LengthBuckets"):
        caption_buckets.loader(shards, buckets=dalistream.AspectBuckets(PHOTO_SIZES), cache_dir=cache)
