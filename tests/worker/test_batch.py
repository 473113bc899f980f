"""Batch assembly and the transfer form: a byte field's blob delivers exactly the plain batch's rows."""

import io

import numpy as np
import pytest

from dalistream.config import StreamConfig
from dalistream.worker import WorkerSource
from dalistream.worker import batch

from helpers import data_set, write_wds


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


def unpacked(form, fields, out):
    """What the graph makes of a transfer-form batch: each blob cut into its rows, the others as
    they are, then the bucket index and ``valid``."""
    batch_size = len(out[-1])
    plain = [batch.rows(out[j], batch_size) if j in form.blobs else out[j] for j in range(form.fields)]
    assert out[-1].dtype == np.uint8 and (not form.bucket or out[-2].dtype == np.int32)
    return tuple(plain) + tuple(out[form.fields:])


def same(a, b):
    """Two plain batches hold the same values at every position."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            u, v = np.asarray(u), np.asarray(v)
            assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v)


def test_transfer_ships_every_field_then_the_bucket_index_and_valid():
    c = config(["x.tar"])
    form = batch.transfer(c.fields)
    names = [f.name for f in c.fields]
    assert form.fields == len(names)  # integer scalars (labels) too, unpacked
    assert [names[i] for i in form.blobs] == ["data", "text", "key", "url"]
    assert form.n_outputs == len(names) + 1 and not form.bucket
    bucketed = batch.transfer(c.fields, bucketed=True)
    assert bucketed.n_outputs == len(names) + 2 and bucketed.fields == form.fields
    only_bytes = batch.transfer(StreamConfig(sources=("x",), fields={"data": "bin"}, batch_size=4).fields)
    assert only_bytes.n_outputs == 2 and only_bytes.blobs == (0,)


@pytest.mark.parametrize("workers, batch_size", [(1, 3), (2, 5), (3, 7)])
@pytest.mark.parametrize("start_step", [0, 1])
def test_the_transfer_form_delivers_the_same_samples(shards, workers, batch_size, start_step):
    """Every field kind, padding (``exact``), an empty member (``missing="empty"``), resume."""
    paths, counts = shards
    c = config(paths, workers=workers, batch_size=batch_size)
    form = batch.transfer(c.fields)
    kept = range(len(c.fields))
    seen_padding = seen_empty = 0
    for w in range(workers):
        lo = c.layout.slot_offsets[w]
        hi = lo + c.layout.slots[w]
        for plain in WorkerSource(c, data_set(paths, counts), w).epoch_batches(0, start_step):
            out = batch.pack(plain, form, kept, lo, hi)
            assert len(out) == form.n_outputs and out[-1].shape == (batch_size,) and out[-1].dtype == np.uint8
            for i in form.blobs:
                assert out[i].dtype == np.uint8 and out[i].ndim == 1
                assert len(out[i]) == 4 * batch_size + sum(r.size for r in plain[i][lo:hi])
                seen_empty += sum(r.size == 0 for r in plain[i][lo:hi])
            same(unpacked(form, c.fields, out), plain)
            seen_padding += int(plain[-1][lo:hi].sum()) < hi - lo
    assert seen_padding and seen_empty


def test_left_out_fields_ship_a_placeholder(shards):
    paths, counts = shards
    c = config(paths)
    form = batch.transfer(c.fields)
    for names in (["label"], ["text", "arr"], ["label", "data", "url"]):
        source = WorkerSource(c, data_set(paths, counts), 0)
        source.leave_out(names)
        full = next(iter(WorkerSource(c, data_set(paths, counts), 0)))
        out = next(iter(source))
        assert len(out) == form.n_outputs
        for i, field in enumerate(c.fields):
            if field.name in names:
                assert isinstance(out[i], np.ndarray) and out[i].dtype == np.uint8 and not out[i].any()
            else:
                same([out[i]], [full[i]])
        assert np.array_equal(out[-1], full[-1])  # valid
        assert source.blob_outputs == [i for i in form.blobs if c.fields[i].name not in names]


def test_rows_are_views_and_must_add_up():
    one = batch.transfer(StreamConfig(sources=("x",), fields={"data": "bin"}, batch_size=4).fields)
    rows = [np.arange(3, dtype=np.uint8), np.zeros(0, np.uint8), np.arange(3, 10, dtype=np.uint8)]
    blob = batch.pack((rows + [rows[1]], np.ones(4, np.uint8)), one, (0,), 0, 4)[0]
    assert blob[:16].view(np.int32).tolist() == [3, 0, 7, 0]
    cut = batch.rows(blob, 4)
    assert [r.tolist() for r in cut] == [[0, 1, 2], [], [3, 4, 5, 6, 7, 8, 9], []]
    assert cut[0].base is blob and cut[1] is cut[3]  # views; one shared empty row
    body, positions, starts, ends = batch.row_bounds(blob, 4)
    assert positions == [0, 2] and starts == [0, 3] and ends == [3, 10] and body.base is blob
    with pytest.raises(ValueError, match="blob of 9 bytes for rows of 10"):
        batch.rows(blob[:-1], 4)
    with pytest.raises(ValueError, match="cannot hold 4 lengths"):
        batch.rows(np.zeros(3, np.uint8), 4)
    nothing = batch.pack(([rows[1]] * 3, np.zeros(3, np.uint8)), one, (0,), 1, 1)[0]  # a slot with no sample
    assert len(nothing) == 12 and [r.size for r in batch.rows(nothing, 3)] == [0, 0, 0]
    assert batch.row_bounds(nothing, 3)[1:] == ([], [], [])
    assert batch.shm_hint(256, 128, 10_000, 3) >= 10_000 * 4 * 128 / 256


def test_pack_leaves_the_plain_batch_alone(shards):
    paths, counts = shards
    c = config(paths)
    plain = next(WorkerSource(c, data_set(paths, counts), 1).epoch_batches(0))
    before = [list(x) if isinstance(x, list) else x.copy() for x in plain]
    lo = c.layout.slot_offsets[1]
    out = batch.pack(plain, batch.transfer(c.fields), range(len(c.fields)), lo, lo + c.layout.slots[1])
    same(plain, before)
    assert out[0].ndim == 1 and len(out[0]) == 4 * 5 + sum(r.size for r in plain[0][lo:lo + c.layout.slots[1]])


def test_transfer_form_from_iter_matches_epoch_batches(shards):
    """What DALI receives (``next``) is the plain batch in transfer form."""
    paths, counts = shards
    c = config(paths)
    form = batch.transfer(c.fields)
    plain = list(WorkerSource(c, data_set(paths, counts), 0).epoch_batches(0))
    sent = list(iter(WorkerSource(c, data_set(paths, counts), 0)))
    assert len(sent) == len(plain)
    for p, s in zip(plain, sent):
        same(unpacked(form, c.fields, s), p)
