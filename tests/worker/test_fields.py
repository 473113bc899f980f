import gzip
import io

import numpy as np
import pytest

from dalistream.config import parse_fields
from dalistream.errors import ConfigError, SampleError
from dalistream.worker import ErrorPolicy, FieldDecoder, emitted_indices, shuffled


def sample(**members):
    return {"__key__": "k1", "__url__": "/data/x.tar", **members}


def test_field_kinds_from_extensions():
    image, label, key, text = parse_fields({"image": "jpg;png", "label": "cls", "key": "__key__", "text": "txt"})
    assert (image.kind, image.exts) == ("bytes", ("jpg", "png"))
    assert (label.kind, label.dtype, label.ndim) == ("int", "int64", 0)
    assert key.kind == "meta" and text.kind == "bytes"
    with pytest.raises(ConfigError, match="npy"):
        parse_fields({"x": "npy"})
    with pytest.raises(ConfigError, match="unique"):
        parse_fields({"valid": "jpg"})


def test_decode_bytes_int_npy_custom_and_meta():
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.float32).reshape(2, 3))
    fields = parse_fields({
        "image": "jpg;png", "label": "cls", "arr": {"exts": "npy", "kind": "npy", "dtype": "float32", "ndim": 2},
        "n": {"exts": "txt", "decoder": lambda b: np.array([len(b)], np.int32), "dtype": "int32", "ndim": 1},
        "key": "__key__",
    })
    png = b"\x89PNG\r\n\x1a\n" + b"IEND\xaeB`\x82"  # passes the cheap image check (signature, IEND)
    out = FieldDecoder(fields).decode(sample(png=png, cls=b" 42\n", npy=buf.getvalue(), txt=b"hello"))
    assert bytes(out[0]) == png and out[0].dtype == np.uint8
    assert out[1] == 42 and out[1].dtype == np.int64 and out[1].ndim == 0
    assert out[2].shape == (2, 3) and out[2].dtype == np.float32
    assert out[3].tolist() == [5]
    assert bytes(out[4]) == b"k1"


def test_gzipped_members_are_decompressed():
    (f,) = parse_fields({"text": "txt"})
    (out,) = FieldDecoder([f]).decode(sample(**{"txt.gz": gzip.compress(b"zipped")}))
    assert bytes(out) == b"zipped"


def test_missing_policies():
    fields = parse_fields({"image": "jpg", "label": "cls"})
    jpg = b"\xff\xd8\xff\xda\xff\xd9"  # passes the cheap image check (SOI, SOS, EOI)
    with pytest.raises(SampleError) as e:
        FieldDecoder(fields, "error").decode(sample(jpg=jpg))
    assert "/data/x.tar" in str(e.value) and "k1" in str(e.value) and "label" in str(e.value)
    assert FieldDecoder(fields, "skip").decode(sample(jpg=jpg)) is None
    image, label = FieldDecoder(fields, "empty").decode(sample(jpg=jpg))
    assert label.shape == () and label.dtype == np.int64


def test_bad_label_names_member():
    (f,) = parse_fields({"label": "cls"})
    with pytest.raises(SampleError, match="not an integer") as e:
        FieldDecoder([f]).decode(sample(cls=b"cat"))
    assert "k1.cls" in str(e.value)


def test_error_policy_counts_skips():
    policy = ErrorPolicy("skip")
    policy.handle(SampleError("bad", url="u"), "samples")
    policy.handle(SampleError("bad", url="u"), "samples")
    assert policy.skipped["samples"] == 2
    with pytest.raises(SampleError):
        ErrorPolicy("raise").handle(SampleError("bad"), "samples")
    seen = []
    ErrorPolicy(seen.append).handle(SampleError("bad"), "samples")
    assert len(seen) == 1


def test_shuffle_is_a_seeded_permutation():
    a = list(shuffled(range(100), 10, seed=1))
    assert sorted(a) == list(range(100)) and a != list(range(100))
    assert a == list(shuffled(range(100), 10, seed=1))
    assert a != list(shuffled(range(100), 10, seed=2))
    assert list(shuffled(range(5), 0, seed=1)) == list(range(5))


@pytest.mark.parametrize("count,total", [(0, 50), (7, 50), (45, 50), (50, 50), (30, None)])
def test_emitted_indices_predicts_the_shuffle(count, total):
    full = list(shuffled(range(total or 1000), 8, seed=3))
    assert emitted_indices(count, total, 8, 3) == set(full[:count])


@pytest.mark.parametrize("kind", ["custom", "npy"])
@pytest.mark.parametrize("value, dtype", [
    ([1.0, 0.5], "int64"), ([300], "uint8"), ([-1], "uint16"), ([float("nan")], "int32"), ([1e300], "float32"),
    ([2 ** 40 + 1], "float32"), ([1 + 2j], "float64"), ([2.5], "bool")])
def test_a_value_that_does_not_fit_its_declared_dtype_is_refused(kind, value, dtype):
    """A decoder (or .npy) value that changes when cast to the field's dtype is a SampleError naming
    field, member and value -- never a silent tensor([1, 0]) for [1, 0.5]."""
    array = np.asarray(value)
    buf = io.BytesIO()
    np.save(buf, array)
    spec = ({"exts": "seg", "decoder": lambda b: np.asarray(value), "dtype": dtype, "ndim": 1} if kind == "custom"
            else {"exts": "seg", "kind": "npy", "dtype": dtype, "ndim": 1})
    (f,) = parse_fields({"mask": spec})
    with pytest.raises(SampleError, match="without loss") as e:
        FieldDecoder([f]).decode(sample(seg=buf.getvalue()))
    assert "mask" in str(e.value) and "k1.seg" in str(e.value) and e.value.reason == "bad_value"


@pytest.mark.parametrize("value, dtype, expected", [
    ([1.0, 2.0], "int64", [1, 2]), ([0.1, 2.0], "float32", [np.float32(0.1), 2.0]), ([255], "uint8", [255]),
    ([True, False], "int64", [1, 0]), ([float("nan")], "float16", [float("nan")]), ([3], "float64", [3.0])])
def test_a_value_that_fits_its_declared_dtype_is_cast(value, dtype, expected):
    (f,) = parse_fields({"mask": {"exts": "seg", "decoder": lambda b: np.asarray(value), "dtype": dtype, "ndim": 1}})
    (out,) = FieldDecoder([f]).decode(sample(seg=b"x"))
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.asarray(expected, dtype=dtype))


@pytest.mark.parametrize("wanted, present", [("jpeg", "jpg"), ("class", "cls"), ("pngg", "png"), ("txts", "txt")])
def test_a_missing_member_close_to_a_present_one_is_called_a_likely_typo(wanted, present):
    (f,) = parse_fields({"x": {"exts": wanted, "kind": "bytes"}})
    with pytest.raises(SampleError) as e:
        FieldDecoder([f]).decode(sample(**{present: b"1"}))
    assert f".{present}" in e.value.hint and "typo" in e.value.hint and "missing='skip'" in e.value.hint


def test_a_missing_member_with_nothing_close_gets_the_missing_policy_hint():
    (f,) = parse_fields({"label": "cls"})
    with pytest.raises(SampleError) as e:
        FieldDecoder([f]).decode(sample(png=b"x"))
    assert "typo" not in e.value.hint and "missing='skip'" in e.value.hint
