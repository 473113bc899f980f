"""Skips that are really a configuration mistake: when nearly every sample read so far was skipped
for one reason (a typo in a field's extension with missing="skip"), the worker raises a
SampleError naming the reason instead of training on batches of nothing; real damage (a share of
bad samples) is still skipped and counted; a batch with no real sample is never yielded."""


import numpy as np
import pytest

from dalistream.config import StreamConfig
from dalistream.errors import SampleError
from dalistream.worker import ErrorPolicy, WorkerSource
from dalistream.worker.policy import MIN_JUDGED
from dalistream.worker.rows import Rows

from helpers import data_set, write_tar


def image(ext: str) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 90, 200)).save(buf, "PNG" if ext.lower() == "png" else "JPEG")
    return buf.getvalue()


def shards(d, n_shards, per_shard, image_ext="jpg", bad_labels=()):
    """Shards of ``image_ext`` + ``cls`` samples; sample numbers in ``bad_labels`` get a label 'cat'."""
    paths = []
    data = image(image_ext)
    for s in range(n_shards):
        members = []
        for i in range(per_shard):
            n = s * per_shard + i
            members += [(f"k{n:05d}.{image_ext}", data),
                        (f"k{n:05d}.cls", b"cat" if n in bad_labels else str(n % 10).encode())]
        paths.append(write_tar(str(d / f"p-{s:03d}.tar"), members))
    return paths


def run(paths, per_shard, **kw):
    options = dict(sources=tuple(paths), fields={"image": {"exts": "jpg", "kind": "custom",
                                                           "decoder": lambda b: np.frombuffer(b, np.uint8)},
                                                 "label": "cls"},
                   batch_size=4, workers=1, policy="exact", missing="skip", shuffle_shards=False)
    options.update(kw)
    source = WorkerSource(StreamConfig(**options), data_set(paths, [per_shard] * len(paths)), 0)
    batches = list(source.epoch_batches(0))
    return sum(int(b[-1].sum()) for b in batches), dict(source._stats.skipped), batches


@pytest.mark.parametrize("fields,reason", [
    ({"image": "jpeg", "label": "cls"}, "missing_field"),         # the typo
    ({"image": "jpg", "label": "label"}, "missing_field"),        # a variant: the label's extension
    ({"image": "jpg;png", "label": "cls", "caption": "txt"}, "missing_field"),  # a field the data lacks
])
def test_a_typo_in_an_extension_is_an_error_naming_the_reason(tmp_path, fields, reason):
    paths = shards(tmp_path, 3, 7)  # fewer samples than MIN_JUDGED: judged at the end of the epoch
    with pytest.raises(SampleError) as info:
        run(paths, 7, fields=fields, rank=0, world_size=1)
    e = info.value
    assert e.reason == "too_many_skips" and e.worker == 0 and e.rank == 0
    assert f"21 of the 21 samples read were skipped as {reason!r}" in str(e)
    assert "max_skip_fraction" in str(e) and "has no member for field" in str(e) and "typo" in str(e)


def test_judged_long_before_the_end_of_a_large_epoch(tmp_path):
    paths = shards(tmp_path, 6, 60)  # 360 samples
    policy_seen = []
    with pytest.raises(SampleError, match=f"{MIN_JUDGED} of the {MIN_JUDGED} samples") as info:
        run(paths, 60, fields={"image": "jpeg", "label": "cls"}, on_error=policy_seen.append)
    assert info.value.reason == "too_many_skips"


def test_upper_case_members_get_the_lowercase_ext_hint(tmp_path):
    paths = shards(tmp_path, 2, 5, image_ext="PNG")
    with pytest.raises(SampleError, match="lowercase_ext=True") as info:
        run(paths, 5, fields={"image": "png", "label": "cls"})
    assert ".PNG differs only in case" in str(info.value)
    delivered, skipped, _ = run(paths, 5, fields={"image": "png", "label": "cls"}, lowercase_ext=True)
    assert delivered == 10 and not skipped


def test_real_damage_is_skipped_and_counted(tmp_path):
    bad = set(range(0, 200, 3))  # a third of the labels are damaged
    paths = shards(tmp_path, 4, 50, bad_labels=bad)
    delivered, skipped, _ = run(paths, 50, on_error="skip")
    assert delivered == 200 - len(bad) and skipped == {"samples:bad_value": len(bad)}


def test_the_threshold_is_an_option(tmp_path):
    bad = set(range(0, 40)) - {7, 19}  # 38 of 40 damaged: 95%
    paths = shards(tmp_path, 2, 20, bad_labels=bad)
    with pytest.raises(SampleError, match="'bad_value'"):
        run(paths, 20, on_error="skip", max_skip_fraction=0.9)
    delivered, skipped, _ = run(paths, 20, on_error="skip", max_skip_fraction=0.96)
    assert delivered == 2 and skipped == {"samples:bad_value": 38}
    delivered, _, batches = run(paths, 20, on_error="skip", max_skip_fraction=1)  # off
    assert delivered == 2 and len(batches) == 10  # padded batches: the loader never yields the empty ones


def test_the_error_policy_judges_one_reason_at_a_time():
    policy = ErrorPolicy("skip", 0.5)
    for _ in range(MIN_JUDGED // 2):
        policy.count("samples", "missing_field")
        policy.count("samples", "bad_image")  # each reason alone stays at half
    assert list(policy.watched([])) == []  # skipped on resume: never in the stream, not counted as read
    with pytest.raises(SampleError, match="'missing_field'"):
        policy.count("samples", "missing_field")
    shards_only = ErrorPolicy("skip", 0.5)
    for _ in range(MIN_JUDGED * 2):
        shards_only.count("shards", "empty")  # whole shards are not samples read
    one = Rows([[1]], 1)
    assert list(shards_only.watched(iter([one]))) == [one]


def test_missing_field_errors_hint_at_lowercase_ext_only_when_case_differs():
    from dalistream.config import parse_fields
    from dalistream.worker.fields import FieldDecoder

    decoder = FieldDecoder(parse_fields({"image": "jpg;png", "label": "cls"}), "error")
    base = {"__key__": "a/1", "__url__": "/d/s.tar"}
    with pytest.raises(SampleError) as info:
        decoder.decode(dict(base, Png=b"x", cls=b"1"))
    assert info.value.reason == "missing_field" and "lowercase_ext=True" in str(info.value) and ".Png" in str(info.value)
    with pytest.raises(SampleError) as info:
        decoder.decode(dict(base, webp=b"x", cls=b"1"))
    assert "lowercase_ext" not in str(info.value) and "missing='skip'" in str(info.value)
