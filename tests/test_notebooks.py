"""The notebooks in notebooks/ run headless from top to bottom without an error.

Each notebook is executed with nbclient in a fresh ``python3`` kernel of the running interpreter
(a kernelspec written to a temporary directory, so no Jupyter setup is needed), with notebooks/
as the working directory. The committed copies must carry their outputs (they are read on the
web) and stay small.

To refresh the committed outputs after editing a notebook::

    python tests/test_notebooks.py            # every notebook
    python tests/test_notebooks.py quickstart # one
"""

from __future__ import annotations

import base64
import contextlib
import glob
import os
import sys
import tempfile
from typing import Iterator

import nbformat
import pytest

pytestmark = [pytest.mark.dali, pytest.mark.slow]


ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
NOTEBOOK_DIR = os.path.join(ROOT, "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NOTEBOOK_DIR, "*.ipynb")))
CELL_TIMEOUT_S = 300
MAX_BYTES = 1 << 20


@contextlib.contextmanager
def python3_kernel() -> Iterator[str]:
    """A ``python3`` kernelspec for this interpreter, first on JUPYTER_PATH while in use."""
    from ipykernel.kernelspec import install

    saved = os.environ.get("JUPYTER_PATH")
    with tempfile.TemporaryDirectory(prefix="dalistream-kernel-") as prefix:
        install(kernel_name="python3", prefix=prefix)
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            [os.path.join(prefix, "share", "jupyter")] + ([saved] if saved else []))
        try:
            yield "python3"
        finally:
            if saved is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = saved


def execute(path: str):
    """Run the notebook at ``path`` (a copy in memory); return the executed notebook."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with python3_kernel() as kernel:
        client = NotebookClient(nb, kernel_name=kernel, timeout=CELL_TIMEOUT_S, record_timing=False,
                                resources={"metadata": {"path": NOTEBOOK_DIR}})
        client.execute()
    return nb


def errors(nb) -> list:
    return [f"cell {i}: {out.get('ename')}: {out.get('evalue')}"
            for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def images(nb) -> list:
    return [base64.b64decode(out["data"]["image/png"])
            for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]


def test_there_are_notebooks():
    assert {os.path.basename(p) for p in NOTEBOOKS} >= {"quickstart.ipynb", "s3_streaming.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_without_errors(path):
    nb = execute(path)  # raises CellExecutionError, naming the cell, if one fails
    assert errors(nb) == []
    assert images(nb), "the notebook draws its plots inline"
    assert all(cell.get("execution_count") for cell in nb.cells if cell.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_notebook_has_outputs_and_is_small(path):
    assert os.path.getsize(path) < MAX_BYTES
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(cell.get("execution_count") for cell in code), "commit the notebook executed"
    assert errors(nb) == []
    pngs = images(nb)
    assert pngs and all(png.startswith(b"\x89PNG") for png in pngs)
    texts = "".join(out.get("text", "") for cell in code for out in cell.get("outputs", []))
    assert "Traceback" not in texts


def refresh(names) -> None:
    """Execute the notebooks and write them back with their outputs."""
    for path in NOTEBOOKS:
        name = os.path.splitext(os.path.basename(path))[0]
        if names and name not in names:
            continue
        nb = execute(path)
        problems = errors(nb)
        if problems:
            raise SystemExit(f"{path}: {problems}")
        for cell in nb.cells:
            cell.metadata.pop("execution", None)
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"{path}: {os.path.getsize(path)} bytes, {len(images(nb))} images")


if __name__ == "__main__":
    refresh(sys.argv[1:])
