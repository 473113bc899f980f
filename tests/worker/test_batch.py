"""Batch assembly and the transfer form: the dense and blob paths deliver exactly the list path's samples."""

import io

import numpy as np
import pytest

from dalistream.config import StreamConfig
from dalistream.worker import WorkerSource
from dalistream.worker import batch

from helpers import write_wds

ALWAYS, NEVER = dict(row_bytes=1 << 40, max_block=1 << 40), dict(row_bytes=0, max_block=0)


def npy(value):
    buf = io.BytesIO()
    np.save(buf, value)
    return buf.getvalue()


@pytest.fixture
def shards(tmp_path):
    """Three shards with every field kind; member sizes vary (0 to 300 bytes), one ``txt`` missing."""
    rng = np.random.default_rng(0)
    paths, counts = [], []
    for s, n in enumerate([7, 4, 11]):  # 22 samples: every batch size below leaves padding
        samples = []
        for i in range(n):
            sample = {"__key__": f"s{s}/{i:03d}", "bin": rng.integers(0, 256, rng.integers(0, 300), dtype=np.uint8).tobytes(),
                      "cls": str(s * 100 + i).encode(), "npy": npy(np.full((2, 3), s * 100 + i, np.float32))}
            if (s, i) != (1, 2):
                sample["txt"] = f"text {s} {i}".encode() * (i + 1)
            samples.append(sample)
        paths.append(write_wds(str(tmp_path / f"s{s}.tar"), samples))
        counts.append(n)
    return paths, counts


FIELDS = {"data": "bin", "label": "cls", "arr": {"exts": "npy", "kind": "npy", "dtype": "float32", "ndim": 2},
          "text": "txt", "key": "__key__", "url": "__url__"}


def config(paths, **kw):
    options = dict(sources=tuple(paths), fields=FIELDS, batch_size=5, workers=2, policy="exact", shuffle=3,
                   missing="empty")
    options.update(kw)
    return StreamConfig(**options)


def same(a, b):
    """Two plain batches hold the same values at every position."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            u, v = np.asarray(u), np.asarray(v)
            assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v)


def test_byte_fields_are_bytes_and_meta():
    c = config(["x.tar"])
    assert [c.fields[i].name for i in batch.byte_fields(c.fields)] == ["data", "text", "key", "url"]


@pytest.mark.parametrize("workers, batch_size", [(1, 3), (2, 5), (3, 7)])
@pytest.mark.parametrize("start_step", [0, 1])
def test_dense_blob_and_list_forms_deliver_the_same_samples(shards, workers, batch_size, start_step):
    """Every field kind, padding (``exact``), an empty member (``missing="empty"``), resume."""
    paths, counts = shards
    c = config(paths, workers=workers, batch_size=batch_size)
    packed = batch.byte_fields(c.fields)
    n = len(c.fields) + 1
    seen_dense = seen_padding = seen_blob = 0
    for w in range(workers):
        lo = c.layout.slot_offsets[w]
        hi = lo + c.layout.slots[w]
        for plain in WorkerSource(c, paths, counts, w).epoch_batches(0, start_step):
            dense, listed = batch.pack(plain, packed, lo, hi, **ALWAYS), batch.pack(plain, packed, lo, hi, **NEVER)
            blob = batch.pack(plain, packed, lo, hi, blob=True, **NEVER)
            headed = batch.pack(plain, packed, lo, hi, blob=True, never_dense=packed[:2], **ALWAYS)  # two carry lengths
            assert len(headed) == n + len(packed) - 2 and all(batch.is_blob(headed[i]) for i in packed[:2])
            same(batch.unpacked(headed, packed, n, packed[:2]), plain)
            assert all(isinstance(listed[i], list) for i in packed)
            assert all(batch.is_blob(blob[i]) and blob[i].dtype == np.uint8 for i in packed)
            seen_dense += sum(isinstance(dense[i], np.ndarray) and dense[i].ndim == 2 for i in packed)
            seen_blob += sum(len(blob[i]) > 0 for i in packed)
            seen_padding += int(plain[-1][lo:hi].sum()) < hi - lo
            for form in (dense, listed, blob):
                assert len(form) == n + len(packed)
                assert all(form[n + k].shape == (batch_size, 1) and form[n + k].dtype == np.int32
                           for k in range(len(packed)))
                same(batch.unpacked(form, packed, n), plain)
    assert seen_dense and seen_padding and seen_blob


def test_image_fields_never_travel_dense_and_only_as_blobs():
    c = StreamConfig(sources=("x",), fields={"image": "jpg;PNG", "mixed": "jpg;bin", "label": "cls", "key": "__key__"},
                     batch_size=4)
    assert batch.image_fields(c.fields) == (0,)
    plain = ([np.ones(9, np.uint8)] * 4, np.ones(4, np.uint8))
    with pytest.raises(ValueError, match="never_dense needs blob"):
        batch.pack(plain, (0,), 0, 4, never_dense=(0,))
    out = batch.pack(plain, (0,), 0, 4, blob=True, never_dense=(0,))
    assert len(out) == 2 and [r.tolist() for r in batch.headed_rows(out[0], 4)] == [[1] * 9] * 4
    with pytest.raises(ValueError, match="cannot hold 4 lengths"):
        batch.headed_rows(np.zeros(3, np.uint8), 4)


def test_blob_rows_are_views_and_must_add_up():
    blob = np.arange(10, dtype=np.uint8)
    lengths = np.array([[3], [0], [7], [0]], np.int32)
    cut = batch.rows(blob, lengths)
    assert [r.tolist() for r in cut] == [[0, 1, 2], [], [3, 4, 5, 6, 7, 8, 9], []]
    assert cut[0].base is blob and cut[1] is cut[3]  # views; one shared empty row
    with pytest.raises(ValueError, match="blob of 10 bytes for rows of 9"):
        batch.rows(blob, np.array([[3], [6]], np.int32))
    assert batch.rows(np.zeros(0, np.uint8), np.zeros((3, 1), np.int32))[2].size == 0


def test_the_rule():
    assert batch.dense_is_cheaper(256, 1000, 128 * 900)
    assert not batch.dense_is_cheaper(256, 0, 0)                   # nothing to ship: the list of empties
    assert not batch.dense_is_cheaper(256, 10 << 20, 1 << 20)      # one huge member: a huge block
    assert not batch.dense_is_cheaper(4, 100 << 10, 4 * (20 << 10))  # padding 80 kB per position
    assert batch.dense_is_cheaper(4, 100 << 10, 4 * (95 << 10))    # little padding
    # against a blob (cheap per position) the bound is 2 kB of padding per position, not 16 kB
    plain = ([np.full(n, 1, np.uint8) for n in (100, 9000, 9000, 9000)], np.ones(4, np.uint8))  # 2.2 kB a position
    assert batch.pack(plain, (0,), 0, 4)[0].ndim == 2                    # against a list: dense
    assert batch.is_blob(batch.pack(plain, (0,), 0, 4, blob=True)[0])    # against a blob: the blob
    assert batch.shm_hint(256, 128, 10_000, 3) >= 10_000 * 4 * 128 / 256


def test_pack_leaves_the_plain_batch_alone_and_uses_the_rule(shards):
    paths, counts = shards
    c = config(paths)
    plain = next(WorkerSource(c, paths, counts, 1).epoch_batches(0))
    before = [list(x) if isinstance(x, list) else x.copy() for x in plain]
    lo = c.layout.slot_offsets[1]
    out = batch.pack(plain, batch.byte_fields(c.fields), lo, lo + c.layout.slots[1])
    same(plain, before)
    assert isinstance(out[0], np.ndarray) and out[0].shape[0] == 5  # 300-byte rows: dense by the default rule


def test_transfer_form_from_iter_matches_epoch_batches(shards):
    """What DALI receives (``next``) is the plain batch in transfer form."""
    paths, counts = shards
    c = config(paths)
    packed, n = batch.byte_fields(c.fields), len(c.fields) + 1
    plain = list(WorkerSource(c, paths, counts, 0).epoch_batches(0))
    sent = list(iter(WorkerSource(c, paths, counts, 0)))
    assert len(sent) == len(plain)
    for p, s in zip(plain, sent):
        same(batch.unpacked(s, packed, n), p)
