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

from helpers import data_set, write_tar


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
    monkeypatch.setattr(runs, "MIN_RUN_BYTES", 2000)  # runs of a few samples
    monkeypatch.setattr(runs, "MIN_RUN_SAMPLES", 0)
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
