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


@pytest.mark.slow
def test_a_plain_install_holds_every_module(tmp_path):
    """``pip install .`` (not editable: what docker/Dockerfile runs) copies the packages
    pyproject.toml lists: every module of the source tree must import from the installed copy alone
    (a package left off the list imports in an editable install and fails in the container)."""
    import os

    import shutil

    # from a copy of the files a clone holds: a build folder left in the clone would lend its modules
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "dalistream", "pipelines"):
        copy = shutil.copytree if os.path.isdir(os.path.join(REPO, name)) else shutil.copy2
        copy(os.path.join(REPO, name), source / name, **({"symlinks": True, "ignore": shutil.ignore_patterns(
            "__pycache__")} if copy is shutil.copytree else {}))
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    modules = sorted(
        os.path.relpath(os.path.join(folder, name), REPO)[:-3].replace(os.sep, ".").replace(".__init__", "")
        for folder, _, names in os.walk(os.path.join(REPO, "dalistream"), followlinks=True)
        for name in names if name.endswith(".py") and name != "__main__.py")
    check = ("import importlib, sys\n"
             f"for name in {modules!r}:\n"
             "    module = importlib.import_module(name)\n"
             f"    assert module.__file__.startswith({str(target)!r}), (name, module.__file__)\n"
             "print(len(sys.modules))\n")
    # a working directory without the clone: only the installed copy can be imported
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stderr[-3000:]
