"""The code of the README and of the docs (``docs/**/*.md``, ``docs/recipes/*.py``) runs as
written, and their instructions name things that exist.

Every Python block of README.md and of the docs' pages is marked on the line before its fence:
``<!-- runnable -->`` blocks are run here, each as a script of its own, in a folder holding the
data set the docs name (``dalistream synth data --prefix train --samples-per-shard 32``), on the
CPU; ``<!-- not runnable: reason -->`` blocks say why not (S3, GPUs, a trained model). Every
recipe under ``docs/recipes/`` runs too, as its ``# run: COMMAND`` line says (``{recipe}`` is
its path; ``python``, ``torchrun`` and ``accelerate`` are this interpreter's), in the same
folder; a recipe that prints ``rank R: N steps`` lines must print one per rank, all with the
same N (equal steps on every rank).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from typing import List, NamedTuple, Optional

import pytest

from helpers import free_port, launcher_free_env

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
PAGES = [README] + sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
RECIPES = sorted(glob.glob(os.path.join(DOCS, "recipes", "*.py")))
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(runnable|not runnable:\s*(?P<why>.*?))\s*-->$")
SNIPPET_TIMEOUT_S = 420


class Block(NamedTuple):
    line: int             # 1-based line of the opening fence
    page: str             # the file, relative to the repository
    lang: str
    code: str
    mark: Optional[str]   # "runnable", "not runnable: …", or None
    why: Optional[str]


def blocks(text: str, page: str = "") -> List[Block]:
    """The fenced code blocks of a Markdown text, with the marker comment on the line before each."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = lines[i - 1].strip() if i else ""
        mark = MARK.match(before)
        out.append(Block(i + 1, page, m.group(1), "\n".join(lines[i + 1:end]) + "\n", mark.group(1) if mark else None,
                         mark.group("why") if mark else None))
        i = end + 1
    return out


def page_blocks(path: str) -> List[Block]:
    with open(path, encoding="utf-8") as f:
        return blocks(f.read(), os.path.relpath(path, ROOT))


def all_blocks() -> List[Block]:
    return [b for page in PAGES for b in page_blocks(page)]


RUNNABLE = [b for b in all_blocks() if b.mark == "runnable"]


def test_block_parser_finds_marks_and_code():
    text = ("x\n<!-- runnable -->\n```python\nprint(1)\n```\n\n```bash\nls\n```\n"
            "<!-- not runnable: needs S3 -->\n```python\nimport boto3\n```\n")
    found = blocks(text, "x.md")
    assert [(b.line, b.lang, b.code, b.mark, b.why) for b in found] == [
        (3, "python", "print(1)\n", "runnable", None), (7, "bash", "ls\n", None, None),
        (11, "python", "import boto3\n", "not runnable: needs S3", "needs S3")]


SNIPPET = re.compile(r"^--8<-- ")  # a recipe included whole (pymdownx.snippets): runs as a recipe


def test_every_python_block_is_marked_runnable_or_says_why_not():
    python = [b for b in all_blocks() if b.lang == "python" and not SNIPPET.match(b.code)]
    assert [b for b in python if b.page == "README.md" and b.mark == "runnable"], "README.md has no runnable block"
    unmarked = [f"{b.page}:{b.line}" for b in python if b.mark is None]
    assert not unmarked, f"{unmarked}: mark the block <!-- runnable --> or <!-- not runnable: why -->"
    assert all(b.why for b in python if b.mark != "runnable"), "a not-runnable block must say why"
    assert len({b.page for b in RUNNABLE}) >= 4, "the docs' runnable blocks are found"


def test_included_recipes_exist():
    """A page includes a recipe whole (``--8<-- "recipes/x.py"``) or a section of it
    (``"recipes/x.py:loop"``, between ``# --8<-- [start:loop]`` and ``# --8<-- [end:loop]``): the
    code shown is the code the recipe's run executes."""
    included = [(b.page, b.code.split('"')[1]) for b in all_blocks() if SNIPPET.match(b.code)]
    assert included, "the docs include their recipes"
    assert any(":" in name for _, name in included), "a page shows a section of a recipe"
    for page, name in included:
        name, _, section = name.partition(":")
        assert os.path.isfile(os.path.join(DOCS, name)), f"{page} includes {name}, which does not exist"
        assert name.startswith("recipes/") and os.path.join(DOCS, name) in RECIPES, f"{page}: {name} is not a recipe"
        if section:
            with open(os.path.join(DOCS, name), encoding="utf-8") as f:
                lines = [line.strip() for line in f]
            start, end = f"# --8<-- [start:{section}]", f"# --8<-- [end:{section}]"
            assert lines.count(start) == 1 and lines.count(end) == 1 and lines.index(start) < lines.index(end), \
                f"{page} shows section {section!r} of {name}, which does not mark it"


def test_runnable_blocks_define_what_they_use():
    """Names a snippet uses must come from the snippet: the README once trained an undefined
    ``model`` with an undefined ``criterion``."""
    import builtins
    import symtable

    for block in RUNNABLE:
        table = symtable.symtable(block.code, f"{block.page}:{block.line}", "exec")
        defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
        free = {s.get_name() for s in table.get_symbols() if s.is_referenced() and not (s.is_assigned() or s.is_imported())}
        missing = free - defined - set(dir(builtins)) - {"__name__"}
        assert not missing, f"{block.page}:{block.line} uses undefined {sorted(missing)}"


@pytest.fixture(scope="module")
def data_folder(tmp_path_factory):
    """A folder as the README describes it: ``data/train-00000.tar`` … ``data/train-00007.tar``."""
    folder = tmp_path_factory.mktemp("readme")
    done = subprocess.run([sys.executable, "-m", "dalistream", "synth", str(folder / "data"), "--prefix", "train",
                           "--shards", "8", "--samples-per-shard", "32"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(folder / "data")) == [f"train-{i:05d}.tar" for i in range(8)]
    return folder


@pytest.mark.dali
@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.page}:{b.line}" for b in RUNNABLE])
def test_runnable_block_runs_as_written(block, data_folder, tmp_path):
    script = tmp_path / f"snippet_line{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=str(data_folder), env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
    assert done.returncode == 0, f"{block.page}:{block.line} failed:\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-4000:]


def clean_env(tmp_path) -> dict:
    return launcher_free_env(DALISTREAM_CACHE=str(tmp_path / "cache"), PYTHONPATH=ROOT)


RUN_LINE = re.compile(r"^# run: (.+)$", re.M)
LAUNCHERS = {"python": [sys.executable], "torchrun": [sys.executable, "-m", "torch.distributed.run"],
             "accelerate": [sys.executable, "-m", "accelerate.commands.launch"]}
# two ranks' lines can interleave in one pipe ("rank 1: 16 stepsrank 0: 16 steps\n\n"): no anchors
STEPS = re.compile(r"rank (\d+): (\d+) steps")


def recipe_command(path: str) -> List[str]:
    """The command a recipe's ``# run:`` line gives (``python {recipe}`` without one)."""
    with open(path, encoding="utf-8") as f:
        found = RUN_LINE.search(f.read())
    words = shlex.split(found.group(1) if found else "python {recipe}")
    if words[0] == "torchrun":
        words[1:1] = ["--master-port", str(free_port())]
    assert words[0] in LAUNCHERS, f"{path}: run it with one of {sorted(LAUNCHERS)}"
    return LAUNCHERS[words[0]] + [w.replace("{recipe}", path) for w in words[1:]]


def test_recipe_commands_and_the_steps_check():
    assert recipe_command(os.path.join(DOCS, "recipes", "accelerate_train.py"))[:3] == LAUNCHERS["torchrun"]
    assert STEPS.findall("x\nrank 1: 16 steps\nrank 0: 16 steps\n") == [("1", "16"), ("0", "16")]


@pytest.mark.dali
@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[os.path.basename(r) for r in RECIPES])
def test_recipe_runs_as_written(recipe, data_folder, tmp_path):
    command = recipe_command(recipe)
    done = subprocess.run(command, cwd=str(data_folder), env=clean_env(tmp_path), capture_output=True, text=True,
                          timeout=SNIPPET_TIMEOUT_S)
    where = os.path.relpath(recipe, ROOT)
    assert done.returncode == 0, f"{where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    steps = dict(STEPS.findall(done.stdout))
    processes = int(command[command.index("--nproc-per-node") + 1]) if "--nproc-per-node" in command else \
        int(command[command.index("--devices") + 1]) if "--devices" in command else None
    if steps or processes:
        assert processes is None or sorted(map(int, steps)) == list(range(processes)), (where, done.stdout[-2000:])
        assert len(set(steps.values())) == 1 and int(next(iter(steps.values()))) > 0, (where, steps)


# -- instructions that name other things ------------------------------------------------------------

STAGES = ("sources", "manifest", "plan", "tar", "worker", "dali", "loader", "pipelines")


def collected(*args: str) -> List[str]:
    """The test ids ``pytest --collect-only`` lists with ``args``, run from the repository's root."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.mark.slow  # collects the suite twice
def test_the_quick_first_run_the_readme_gives_covers_every_stage():
    """The README gives the suite's time and a quick first run: ``-m "not slow"`` must still test
    every stage of the data flow, a DALI pipeline among them."""
    with open(README, encoding="utf-8") as f:
        text = " ".join(f.read().split())
    section = text[text.index("Run the tests:"):]
    assert re.search(r"17.21 minutes", section), "the README gives the whole suite's time"
    quick = re.search(r'`(python -m pytest -q -m "not slow")` .*?in (about )?\d+ minutes', section)
    assert quick, "the README gives the quick first run and its time"
    for stage in STAGES:
        assert stage.rstrip("s") in section.split("`python -m pytest -q -m \"not slow\"`", 1)[1][:600].lower(), stage
    quick_ids = collected("-m", "not slow", *[f"tests/{stage}" for stage in STAGES])
    for stage in STAGES:
        assert any(i.startswith(f"tests/{stage}/") for i in quick_ids), f"the quick run tests nothing in tests/{stage}"
    dali = collected("-m", "not slow and dali", "tests/dali", "tests/pipelines", "tests/loader")
    for stage in ("dali", "pipelines", "loader"):
        assert any(i.startswith(f"tests/{stage}/") for i in dali), f"the quick run runs no DALI pipeline in {stage}"

FRONT_ENDS = {"jupyter notebook": "notebook", "jupyter lab": "jupyterlab"}


def test_notebooks_extra_installs_the_jupyter_front_end_the_readme_opens():
    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["notebooks"]
    names = {Requirement(r).name.lower() for r in extra}
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Notebooks"):]
    assert 'pip install -e ".[notebooks]"' in section
    commands = [c for c in FRONT_ENDS if f"`{c}" in section]
    assert commands, "the Notebooks section does not say how to open them"
    for command in commands:
        assert FRONT_ENDS[command] in names, f"`{command}` needs {FRONT_ENDS[command]!r} in the notebooks extra"
    assert {"ipykernel", "nbclient"} <= names  # a kernel, and the headless runner the tests use


def test_quickstart_notebook_says_how_workers_start():
    """CPU pipelines fork their DALI workers (CUDA untouched), GPU ones spawn: the notebook once
    said they always spawn."""
    import nbformat

    from dalistream.dali.device import start_method

    nb = nbformat.read(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), as_version=4)
    text = " ".join(" ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    assert start_method("auto", "cpu") == "fork" and start_method("auto", "gpu") == "spawn"  # no CUDA here
    assert "forked for a CPU pipeline" in text and "spawned for a GPU pipeline" in text
    assert "started with `spawn`" not in text
