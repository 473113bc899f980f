"""A manifest is written with its shards' permissions (it was 0600, a temporary file's, beside
0644 shards: other users of a shared file system could read the shards but not their manifest),
by ``dalistream index`` and by ``dalistream write`` alike."""

import os

import pytest
from PIL import Image

from dalistream import cli
from dalistream.writer import MANIFEST, write

from helpers import key_shards


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664, 0o600])
def test_index_gives_the_manifest_the_shards_permissions(tmp_path, umask_022, mode, capsys):
    folder = tmp_path / "data"
    for path in key_shards(str(folder), [3, 4]):
        os.chmod(path, mode)
    assert cli.main(["index", str(folder)]) == 0
    assert (folder / MANIFEST).stat().st_mode & 0o777 == mode


def test_an_explicit_output_too(tmp_path, umask_022, capsys):
    paths = key_shards(str(tmp_path / "data"), [3])
    os.chmod(paths[0], 0o644)
    out = tmp_path / "elsewhere" / "m.json"
    assert cli.main(["index", str(tmp_path / "data"), "-o", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o644


def test_write_gives_the_manifest_the_shards_permissions(tmp_path, umask_022):
    for label in ("cat", "dog"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (4, 4), (i * 40, 0, 0)).save(tmp_path / "images" / label / f"{i}.png")
    done = write(str(tmp_path / "images"), str(tmp_path / "out"), samples_per_shard=4, processes=1)
    shard_modes = {os.stat(u).st_mode & 0o777 for u in done["urls"]}
    assert shard_modes == {0o644}
    assert os.stat(done["manifest"]).st_mode & 0o777 == 0o644
