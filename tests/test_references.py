"""What the library's docstrings and comments point to exists: every Sphinx-style reference
(``:func:`…```, ``:mod:`…```, ``:class:`…```, …) names a module, function, class or attribute that
is there, and every file named (``DESIGN.md``, ``tests/…``, ``dalistream/…``) is in the repository.
A function moved or renamed leaves no stale pointer behind."""

import builtins
import glob
import importlib
import os
import re

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
ROLE = re.compile(r":(func|mod|class|meth|data|attr|exc):`~?([\w.]+)`")
FILE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)+[\w-]+\.(?:py|md|ipynb|toml|yaml)|[A-Z][\w-]*\.md)\b")
SOURCES = sorted(p for p in glob.glob(os.path.join(ROOT, "dalistream", "**", "*.py"), recursive=True)
                 + glob.glob(os.path.join(ROOT, "pipelines", "*.py")) if not p.endswith("__main__.py"))


def module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    if rel.startswith("pipelines."):
        rel = "dalistream." + rel
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def resolve(target: str, module) -> bool:
    """Whether ``target`` (as written in ``module``) names something that exists."""
    if target.startswith("."):  # relative to the module's package
        package = module.__name__ if module.__file__.endswith("__init__.py") else module.__name__.rpartition(".")[0]
        target = package + target
    parts = target.split(".")
    if parts[0] != "dalistream":
        if hasattr(builtins, parts[0]):
            return True
        import dalistream

        found = [v for v in (getattr(module, parts[0], None), getattr(dalistream, parts[0], None)) if v is not None]
        if not found:  # a method or attribute of a class of this module, by its bare name
            found = [getattr(c, parts[0]) for c in vars(module).values()
                     if isinstance(c, type) and c.__module__ == module.__name__ and hasattr(c, parts[0])]
        if not found and len(parts) == 1:  # a dataclass field or an attribute set in __init__
            with open(module.__file__, encoding="utf-8") as f:
                source = f.read()
            return parts[0] in dataclass_fields(module) or f"self.{parts[0]} =" in source or \
                f"self.{parts[0]}:" in source
        if not found:
            try:
                found = [importlib.import_module(parts[0])]
            except ImportError:
                return False
        return any(walk(value, parts[1:]) for value in found)
    for i in range(len(parts), 0, -1):
        try:
            base = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return walk(base, parts[i:])
    return False


def walk(value, names) -> bool:
    for name in names:
        if not hasattr(value, name):
            fields = getattr(value, "__dataclass_fields__", {})
            if name in fields:
                return True
            return False
        value = getattr(value, name)
    return True


def dataclass_fields(module) -> set:
    return {f for c in vars(module).values() if isinstance(c, type) for f in getattr(c, "__dataclass_fields__", {})}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: os.path.relpath(p, ROOT))
def test_references_in_docstrings_resolve(path):
    module = importlib.import_module(module_name(path))
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stale = sorted({target for _, target in ROLE.findall(text) if not resolve(target, module)})
    assert not stale, f"{os.path.relpath(path, ROOT)} refers to what does not exist: {stale}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: os.path.relpath(p, ROOT))
def test_files_named_in_the_code_exist(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    named = {m for m in FILE.findall(text) if not m.startswith(("docs/assets/",))}
    missing = sorted(n for n in named if not os.path.exists(os.path.join(ROOT, n)) and not n.startswith("/"))
    assert not missing, f"{os.path.relpath(path, ROOT)} names files the repository does not have: {missing}"


def test_the_resolver_finds_stale_references():
    import dalistream.errors as errors
    import dalistream.plan.ownership as ownership

    assert resolve("dalistream.dali.diagnose.translate", errors)
    assert not resolve("dalistream.diagnose.translate", errors)  # the module moved under dali/
    assert resolve("redact", errors) and not resolve("redacted", errors)
    assert resolve("Stream.open", errors) and not resolve("Stream.opened", errors)  # the package's namespace
    assert resolve(".layout.Layout", ownership) and not resolve(".layout.Layouts", ownership)
    assert FILE.findall("see DESIGN.md and tests/worker/test_rows.py, not x.md") == ["DESIGN.md",
                                                                                     "tests/worker/test_rows.py"]
