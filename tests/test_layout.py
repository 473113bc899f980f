"""The rules the package keeps (issue: a layout a newcomer reads in an hour).

Checked from the source text, so every new module is held to them: no import circle (function-level
imports count, and those in ``if TYPE_CHECKING:`` blocks too: an annotation's import is an arrow
of the layout as any other), no module over 600 lines (sized by cohesion, not by a cap), at
most a dozen modules at the package top, no private name imported from another dalistream module,
nothing in the library importing ``dalistream.tools``, no import against the data flow (the
worker's and the plan's modules, and the base modules every stage receives, import no entry module
of the package top), and DALI's or torch's internals touched only in ``dalistream/dali/compat.py``. Each checker is also run on a small bad example, so a checker
that finds nothing cannot pass by accident.
"""

from __future__ import annotations

import ast
import os
import re
import tokenize
from typing import Dict, List, Set, Tuple

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "dalistream")
MAX_LINES = 600
MAX_TOP_MODULES = 12
# the command line and the tooling it fronts: everything else is "the library"
NOT_LIBRARY = ("dalistream.cli", "dalistream.__main__", "dalistream.tools")
INTERNALS = re.compile(r"\._py_pool|\._shutdown\(|\._processes|\._observer|\._use_count|torch\._C\b|\._conditionals|"
                       r"autograph_info__|pytorch\.torch_utils|import torch_utils|IsDriverInitialized|"
                       r"GetCUDADeviceCount|\.__spec__")
COMPAT = "dalistream.dali.compat"
# what every stage receives; with the stages below the entry modules, they import none of those
BASE = ("dalistream.config", "dalistream.errors", "dalistream.dataset", "dalistream.lifetime")
BELOW = ("dalistream.worker", "dalistream.plan")


def modules(root: str = PACKAGE, name: str = "dalistream") -> Dict[str, str]:
    """``{module name: path}`` of every ``.py`` file of the package (symlinked ``pipelines`` included)."""
    found = {}
    for dirpath, _dirs, files in os.walk(root, followlinks=True):
        rel = os.path.relpath(dirpath, root)
        parts = [name] + ([] if rel == "." else rel.split(os.sep))
        for f in files:
            if f.endswith(".py"):
                mod = ".".join(parts if f == "__init__.py" else parts + [f[:-3]])
                found[mod] = os.path.join(dirpath, f)
    return found


def imports(module: str, path: str, known: Set[str]) -> List[Tuple[str, List[str], int]]:
    """``(imported module, names, line)`` for every import in the file, relative ones resolved;
    only targets inside the package are kept (those of ``if TYPE_CHECKING:`` blocks too)."""
    tree = ast.parse(open(path).read())
    is_pkg = path.endswith("__init__.py")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dalistream":
                    out.append((alias.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "dalistream":
                continue
            names = [a.name for a in node.names]
            out.append((target, names, node.lineno))
            for n in names:  # `from . import errors`: the submodule itself
                if f"{target}.{n}" in known:
                    out.append((f"{target}.{n}", [], node.lineno))
    return out


def graph(mods: Dict[str, str]) -> Dict[str, Set[str]]:
    """Import edges between the package's modules; importing ``a.b.c`` also runs the ``__init__``
    of ``a.b`` (the root package's, which every module shares, is left out)."""
    known = set(mods)
    edges: Dict[str, Set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for target, _names, _line in imports(mod, path, known):
            while target and target not in known:
                target = target.rpartition(".")[0]
            parts = target.split(".")
            for i in range(2, len(parts) + 1):  # the target and its parent packages below the root
                t = ".".join(parts[:i])
                if t in known and t != mod and not mod.startswith(t + "."):
                    edges[mod].add(t)
    return edges


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def private_imports(mods: Dict[str, str]) -> List[str]:
    bad = []
    for mod, path in mods.items():
        for target, names, line in imports(mod, path, set(mods)):
            for n in names:
                if n.startswith("_") and not (n.startswith("__") and n.endswith("__")):
                    bad.append(f"{mod}:{line} imports {target}.{n}")
    return bad


def tools_imports(mods: Dict[str, str]) -> List[str]:
    bad = []
    for mod, path in mods.items():
        if mod.startswith(NOT_LIBRARY):
            continue
        for target, _names, line in imports(mod, path, set(mods)):
            if target == "dalistream.tools" or target.startswith("dalistream.tools."):
                bad.append(f"{mod}:{line} imports {target}")
    return bad


def code_lines(path: str) -> Dict[int, str]:
    """Each line's code tokens, strings and comments left out."""
    lines: Dict[int, List[str]] = {}
    with open(path, "rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
                lines.setdefault(tok.start[0], []).append(tok.string)
    return {n: "".join(t if t in ".()[]" else f" {t} " for t in toks).replace(" . ", ".").replace(" .", ".")
            for n, toks in lines.items()}


def against_the_flow(mods: Dict[str, str]) -> List[str]:
    """``"a imports b"`` for each import of an entry module (a module of the package top other
    than the base ones) by a base module or a module of the worker or the plan."""
    entry = {m for m, p in mods.items() if m.count(".") == 1 and os.path.basename(p) != "__init__.py"} - set(BASE)
    found = []
    for mod, targets in sorted(graph(mods).items()):
        if mod in BASE or mod.startswith(tuple(b + "." for b in BELOW)) or mod in BELOW:
            found += [f"{mod} imports {t}" for t in sorted(targets & entry)]
    return found


def internals_outside_compat(mods: Dict[str, str]) -> List[str]:
    bad = []
    for mod, path in mods.items():
        if mod == COMPAT:
            continue
        for number, code in sorted(code_lines(path).items()):
            if INTERNALS.search(code):
                bad.append(f"{mod}:{number}: {code.strip()}")
    return bad


# -- the rules, on the real package ---------------------------------------------------------------

@pytest.fixture(scope="module")
def package():
    return modules()


def test_no_import_circles(package):
    assert cycles(graph(package)) == []


def test_no_module_over_the_line_limit(package):
    too_long = {m: sum(1 for _ in open(p)) for m, p in package.items()}
    assert {m: n for m, n in too_long.items() if n > MAX_LINES} == {}


def test_at_most_a_dozen_modules_at_the_top(package):
    top = [m for m, p in package.items() if os.path.dirname(p) == PACKAGE]
    assert len(top) <= MAX_TOP_MODULES, sorted(top)


def test_no_private_name_imported_from_another_module(package):
    assert private_imports(package) == []


def test_the_library_never_imports_tools(package):
    assert tools_imports(package) == []


def test_no_import_against_the_data_flow(package):
    assert against_the_flow(package) == []


def test_dali_and_torch_internals_only_in_compat(package):
    assert internals_outside_compat(package) == []


def test_the_file_list_tells_the_data_flow(package):
    stages = ["sources", "io", "tar", "manifest", "plan", "worker", "dali", "loader", "tools"]
    for stage in stages:
        assert f"dalistream.{stage}" in package, stage
    assert "dalistream.pipelines.classification_train" in package  # installed from the top-level pipelines/


TOP_LEVEL = {"pyproject.toml", "dalistream", "pipelines", "tests", "docker", "notebooks", "docs", "README.md", ".ci",
             ".gitignore"}


def test_only_the_agreed_entries_at_the_repository_top():
    """What the repository holds at its top (tracked files: a stray wheel or notes file is caught)."""
    import subprocess

    listed = subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    top = {path.split("/", 1)[0] for path in listed.stdout.splitlines()}
    assert top - TOP_LEVEL == set()


# -- the checkers catch what they are meant to catch ----------------------------------------------

def _write(root, files: Dict[str, str]) -> Dict[str, str]:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return modules(os.path.join(root, "dalistream"))


def test_checkers_find_what_they_look_for(tmp_path):
    mods = _write(str(tmp_path), {
        "dalistream/__init__.py": "",
        "dalistream/a.py": "from .b import thing\n",
        "dalistream/b.py": "def f():\n    from .c import _hidden\n",             # function level counts
        "dalistream/c.py": "from . import a\nfrom .tools.x import y\nimport torch\nn = torch._C\n",
        "dalistream/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .e import E\n",
        "dalistream/e.py": "from .d import D\n",                                  # a type-only import counts
        "dalistream/sub/__init__.py": "from .inner import z\n",
        "dalistream/sub/inner.py": "from ..f import w\n",
        "dalistream/f.py": "from .sub.other import v\n",                          # runs sub/__init__: a cycle
        "dalistream/sub/other.py": "",
        "dalistream/tools/__init__.py": "",
        "dalistream/tools/x.py": "from ..a import thing\n",
        "dalistream/config.py": "from .e import E\n",                           # the base, above an entry module
        "dalistream/worker/__init__.py": "",
        "dalistream/worker/w.py": "from ..a import thing\nfrom ..config import C\n",  # the base: with the flow
    })
    assert sorted(cycles(graph(mods))) == [["dalistream.a", "dalistream.b", "dalistream.c", "dalistream.tools.x"],
                                          ["dalistream.d", "dalistream.e"],
                                          ["dalistream.f", "dalistream.sub", "dalistream.sub.inner"]]
    assert private_imports(mods) == ["dalistream.b:2 imports dalistream.c._hidden"]
    assert tools_imports(mods) == ["dalistream.c:2 imports dalistream.tools.x"]
    assert [line.split(":")[:2] for line in internals_outside_compat(mods)] == [["dalistream.c", "4"]]
    assert against_the_flow(mods) == ["dalistream.config imports dalistream.e", "dalistream.worker.w imports dalistream.a"]
