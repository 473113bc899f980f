"""The installed package wins over a folder named ``dalistream`` beside the user's script: the clone
itself (its parent is the working directory) or an empty folder, for ``python -c`` and a script."""

import subprocess
import sys

import pytest

from helpers import REPO

CHECK = "import dalistream, dalistream.pipelines; dalistream.Stream; print(dalistream.__file__)"


@pytest.mark.parametrize("beside", ["empty folder", "the clone"])
def test_import_from_a_folder_holding_dalistream(tmp_path, beside):
    if beside == "empty folder":
        (tmp_path / "dalistream").mkdir()
    else:
        (tmp_path / "dalistream").symlink_to(REPO, target_is_directory=True)
    (tmp_path / "train.py").write_text(CHECK + "\n")
    for argv in ([sys.executable, "-c", CHECK], [sys.executable, "train.py"]):
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith("__init__.py")
