"""A field kind is one entry in one table: this file adds one of its own (``words``: UTF-8 text
lowercased in the worker, travelling as a blob, concatenated in the graph, ``str`` in torch) and
nothing else of the library changes. It is parsed per sample and per run with the same values and
skips, inferred from its extension, merged by DALI across workers and delivered to torch."""

import numpy as np
import pytest

import dalistream
from dalistream import kinds
from dalistream.config import StreamConfig, parse_fields
from dalistream.manifest import build_manifest, default_location, write_manifest
from dalistream.tar import runs
from dalistream.worker import WorkerSource

from helpers import data_set, short_runs, write_tar


class Words(kinds.Kind):
    """UTF-8 text, lowercased; a member that is not UTF-8 is refused (``bad_value``)."""

    name, claims, raw = "words", frozenset({"words"}), True

    def parse(self, field, data, ext):
        return np.frombuffer(data.decode("utf-8").lower().encode(), np.uint8)

    def travels(self, field):
        return "blob"

    def to_torch(self, rows):
        return [bytes(np.asarray(r)).decode() for r in rows]


kinds.register(Words())


def shards(tmp_path, n_shards=3, per_shard=25):
    paths, truth = [], {}
    for s in range(n_shards):
        members = []
        for i in range(per_shard):
            key = f"s{s}/{i:03d}"
            text = b"\xff\xfe not utf-8" if i % 11 == 5 else f"Hello WORLD {s} {i}".encode()
            members += [(f"{key}.words", text), (f"{key}.cls", str(i).encode())]
            if i % 11 != 5:
                truth[key] = text.decode().lower()
        paths.append(write_tar(str(tmp_path / f"w-{s}.tar"), members))
    write_manifest(build_manifest(paths, offsets=True), default_location(paths))
    return paths, truth


def test_the_kind_is_inferred_from_its_extension_and_checked_like_any():
    (field,) = parse_fields({"w": "words"})
    assert field.kind == "words" and field.spec.merge(field) == "concat"
    with pytest.raises(dalistream.ConfigError, match="kind"):
        parse_fields({"w": {"exts": "words", "kind": "wordz"}})


@pytest.mark.parametrize("blocks", [False, True])
def test_parsed_per_sample_and_per_run_alike(tmp_path, monkeypatch, blocks):
    short_runs(monkeypatch, 2000)  # runs of a few samples
    paths, truth = shards(tmp_path)
    infos = build_manifest(paths, offsets=True)
    from dalistream.manifest.offsets import SampleOffsets
    from dalistream.manifest.rows import ShardRows

    rows = ShardRows.from_infos(infos)
    offsets = SampleOffsets.from_flat(rows.starts, rows.offsets, rows.members)
    config = StreamConfig(sources=tuple(paths), fields={"key": "__key__", "w": "words"}, batch_size=4, workers=1,
                          policy="exact", on_error="skip", interleave=False, shuffle=0)
    if not blocks:
        monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 1 << 40)  # every part read sample by sample
    source = WorkerSource(config, data_set(paths, [25] * 3, offsets), 0)
    got = {}
    for keys, words, valid in source.epoch_batches(0):
        got.update({bytes(k).decode(): bytes(w).decode() for k, w, v in zip(keys, words, valid) if int(v)})
    assert got == truth
    assert dict(source._stats.skipped) == {"samples:bad_value": 2 * 3}  # samples 5 and 16 of each shard


@pytest.mark.dali
def test_merged_by_dali_and_delivered_to_torch(tmp_path):
    paths, truth = shards(tmp_path)
    stream = dalistream.Stream.open(paths, fields={"key": "__key__", "w": "words", "label": "cls"}, batch_size=5,
                                    workers=2, device="cpu", policy="exact", on_error="skip")
    got = {}
    with dalistream.Loader(stream) as loader:
        for batch in loader:
            assert all(isinstance(w, str) for w in batch["w"])
            got.update(zip(batch["key"], batch["w"]))
    assert got == truth


def test_the_bulk_jpeg_walk_passes_only_what_the_one_at_a_time_check_passes():
    """:func:`~dalistream.kinds.images.jpeg_whole` walks many rows' segments at once: a row it
    passes passes :func:`~dalistream.kinds.images.image_problem` too, and every whole JPEG passes
    (its verdict on the others is left to the check alone). Variants: JPEGs with extra segments
    (APPn, comments, fill bytes, markers without a length), cut anywhere, bytes flipped in the
    headers, and rows side by side in one buffer, so a walk that strays reads its neighbour."""
    import io

    from PIL import Image

    from dalistream.kinds.images import image_problem, jpeg_whole

    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (16, 24, 3), dtype=np.uint8)).save(buf, format="JPEG")
    base = buf.getvalue()
    segments = [b"\xff\xe1" + (12).to_bytes(2, "big") + b"Exif\0\0abcd", b"\xff\xfe\x00\x05hi!",
                b"\xff", b"\xff\x01", b"\xff\xd0", b"\xff\xee\x00\x02"]
    rows, intact = [], []
    for _ in range(400):
        extra = b"".join(segments[int(i)] for i in rng.integers(0, len(segments), rng.integers(0, 5)))
        row = bytearray(base[:2] + extra + base[2:])
        kind = rng.integers(0, 4)
        intact.append(kind == 0)
        if kind == 1:  # cut short
            row = row[:int(rng.integers(4, len(row)))]
        elif kind == 2:  # a header byte flipped
            at = int(rng.integers(2, min(len(row), 200)))
            row[at] = int(rng.integers(0, 256))
        elif kind == 3:  # a segment's length too long
            row[5] = 0xFF
        rows.append(bytes(row))
    data = np.frombuffer(b"".join(rows), np.uint8)
    lengths = np.array([len(r) for r in rows])
    starts = np.cumsum(lengths) - lengths
    ok = jpeg_whole(data, starts, lengths, np.ones(len(rows), bool))
    problems = [image_problem(r) for r in rows]
    assert not [i for i in np.flatnonzero(ok) if problems[i] is not None]  # never passes what the check refuses
    assert ok[intact].all() and 50 < sum(intact) < len(rows)  # every whole one walked to its scan
