"""Member layouts in manifests: written by ``dalistream index``, read back the same by the column
reading and the row-by-row one, kept in the parsed cache, carried to the workers as mapped files,
gathered with their rows; every malformed layout a ManifestError naming the manifest and the row."""

import copy
import json
import pickle

import numpy as np
import pytest

from dalistream.errors import ManifestError
from dalistream.manifest import build_manifest, read_manifest, write_manifest
from dalistream.manifest.files import read_manifest_cached
from dalistream.manifest.members import MemberLayout
from dalistream.manifest.offsets import SampleOffsets
from dalistream.manifest.rows import ShardInfo, ShardRows

from helpers import key_shards, write_wds


@pytest.fixture
def indexed(tmp_path):
    """Shards of two writers and patterns (one with a sample lacking a member), an empty one, and
    one with a folder entry (no layout); their scanned rows."""
    d = tmp_path / "data"
    paths = key_shards(str(d), [5, 0, 3])
    mixed = [{"__key__": f"w/{i}", "jpg" if i % 3 else "png": b"x" * (i * 300), "cls": b"%d" % i,
              **({"txt": b"t"} if i != 4 else {})} for i in range(7)]
    paths.append(write_wds(str(d / "wds.tar"), mixed))
    import tarfile
    with tarfile.open(str(d / "folder.tar"), "w") as tar:
        tar.addfile(tarfile.TarInfo("sub"))
        tar.getmembers()[-1].type = tarfile.DIRTYPE
        info = tarfile.TarInfo("sub/a.cls")
        info.size = 1
        import io
        tar.addfile(info, io.BytesIO(b"1"))
    paths.append(str(d / "folder.tar"))
    infos = build_manifest(paths, offsets=True)
    return paths, infos


def test_rows_as_columns_and_back(indexed):
    paths, infos = indexed
    assert [i.members is not None for i in infos] == [True, False, True, True, False]
    rows = ShardRows.from_infos(infos)
    assert rows.infos() == infos
    assert rows.members.first_mismatch(rows.offsets, rows.starts) == -1
    index = np.array([3, 0, 3, 1, 4, 2])
    taken = rows.take(index)
    assert taken.infos() == [infos[i] for i in index]
    assert taken.members.first_mismatch(taken.offsets, taken.starts) == -1
    z = rows.members.pattern_arrays()
    again = MemberLayout.from_arrays(z, rows.samples, rows.members.kind, rows.members.sizes)
    assert [again.row(i) for i in range(len(infos))] == [i.members for i in infos]


def test_a_size_that_does_not_add_up_is_found(indexed):
    paths, infos = indexed
    rows = ShardRows.from_infos(infos)
    sizes = np.array(rows.members.sizes)
    sizes[rows.members.member_starts[rows.starts[3]]] += 512  # shard 3's first member (webdataset's), a block longer
    bad = MemberLayout(rows.members.patterns, rows.members.kind, sizes, rows.samples)
    assert bad.first_mismatch(rows.offsets, rows.starts) == 3
    assert bad.first_mismatch(None, rows.starts) == 0


def test_index_writes_layouts_and_both_readings_agree(tmp_path, indexed):
    paths, infos = indexed
    manifest = str(tmp_path / "data" / "m.json")
    write_manifest(infos, manifest)
    payload = json.loads(open(manifest).read())
    assert payload["shards"][3]["members"]["kinds"] and "kinds" not in payload["shards"][0]["members"]
    columns = read_manifest(manifest)
    assert columns.infos() == infos
    # the row-by-row reading (the one that names a bad row) reads the same layouts
    from dalistream.manifest.formats import _check_members, _checked_row

    by_row = [_checked_row(raw, manifest, i, "url", "samples", "bytes") for i, raw in enumerate(payload["shards"])]
    _check_members(by_row, manifest)
    assert by_row == infos


def test_the_parsed_cache_and_the_workers_keep_the_layout(tmp_path, indexed):
    paths, infos = indexed
    manifest = str(tmp_path / "data" / "m.json")
    write_manifest(infos, manifest)
    cache = str(tmp_path / "cache")
    first = read_manifest_cached(manifest, cache)
    again = read_manifest_cached(manifest, cache)  # mapped back from the cache
    assert isinstance(again.members.sizes, np.memmap) and again.infos() == first.infos() == infos
    offsets = SampleOffsets.from_flat(again.starts, again.offsets, again.members).saved(cache)
    state = pickle.loads(pickle.dumps(offsets))  # what a worker gets: paths, no per-sample arrays
    assert state.members._sizes is None and state.members._kind is None and state.members._member_starts is None
    assert [state.members.row(i) for i in range(len(infos))] == [i.members for i in infos]
    unsaved = SampleOffsets.from_flat(first.starts, first.offsets, ShardRows.from_infos(infos).members)
    assert pickle.loads(pickle.dumps(unsaved)).members.row(3) == infos[3].members  # in memory: the arrays travel


def _payload(infos, manifest):
    write_manifest(infos, manifest)
    return json.loads(open(manifest).read())


@pytest.mark.parametrize("change,problem", [
    (lambda m: m.pop("patterns"), "must be an object with 'patterns'"),
    (lambda m: m.update(patterns=[{"exts": "cls"}]), "must be an object with 'patterns'"),
    (lambda m: m["patterns"][0].update(exts=["cls", "cls"]), "distinct non-empty strings"),
    (lambda m: m["patterns"][0].update(headers=[1, 0]), "header blocks >= 1"),
    (lambda m: m.update(kinds=[0, 0, 7]), "one of its 1 patterns for each of its 3 samples"),
    (lambda m: m.update(kinds=[0, 0]), "for each of its 3 samples"),
    (lambda m: m["sizes"].pop(), "member sizes where its samples' patterns have 6 members"),
    (lambda m: m["sizes"].__setitem__(1, -6), "integers >= 0"),
    (lambda m: m["sizes"].__setitem__(1, 600), "do not add up"),
    (None, "need the samples' offsets"),
])
def test_a_malformed_layout_names_the_manifest_and_the_row(tmp_path, change, problem):
    paths = key_shards(str(tmp_path / "d"), [4, 3, 2])
    manifest = str(tmp_path / "d" / "m.json")
    payload = _payload(build_manifest(paths, offsets=True), manifest)
    row = payload["shards"][1]
    if change is None:
        del row["offsets"]
    else:
        change(row["members"])
    with open(manifest, "w") as f:
        json.dump(payload, f)
    with pytest.raises(ManifestError) as e:
        read_manifest(manifest)
    assert "manifest row 1: 'members'" in str(e.value) and problem in str(e.value), str(e.value)
    assert e.value.url == paths[1] and "m.json" in str(e.value)


def test_a_manifest_without_layouts_and_one_with_headers_left_out_read_as_before(tmp_path):
    paths = key_shards(str(tmp_path / "d"), [4, 3])
    infos = build_manifest(paths, offsets=True)
    manifest = str(tmp_path / "d" / "m.json")
    payload = _payload(infos, manifest)
    plain = copy.deepcopy(payload)
    for row in plain["shards"]:
        del row["members"]
    with open(manifest, "w") as f:
        json.dump(plain, f)
    assert read_manifest(manifest).members is None
    for row in payload["shards"]:
        del row["members"]["patterns"][0]["headers"]  # one header block each, the default
    with open(manifest, "w") as f:
        json.dump(payload, f)
    assert read_manifest(manifest).infos() == infos
    assert ShardInfo(**json.loads(json.dumps(infos[0].__dict__))) == infos[0]  # the scan cache's JSON round trip
