"""The docs site's requirements, one per line: pyproject.toml's ``docs`` extra, without the library.

The site needs mkdocs, its plugins, and what the reference hook (``reference.py``) imports from this
checkout's pure modules (numpy, braceexpand; never DALI or torch): no DALI, no torch, no install of
dalistream itself. ``pip install $(python docs/config/requirements.py)`` installs them in seconds.
"""

import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def docs_extra_of(pyproject: str) -> list:
    """The ``docs = [...]`` array of ``pyproject``'s text, read without a TOML parser (Python 3.10
    has none): its double-quoted strings, comments left out."""
    found = re.search(r"^docs\s*=\s*\[(.*?)\]\s*$", pyproject, re.M | re.S)
    if not found:
        raise SystemExit("pyproject.toml has no docs extra")
    body = "\n".join(line.split("#", 1)[0] for line in found.group(1).splitlines())
    return re.findall(r'"([^"]+)"', body)


def docs_requirements() -> list:
    """The ``docs`` extra of ``pyproject.toml``."""
    if sys.version_info < (3, 11):
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
            return docs_extra_of(f.read())
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"]["docs"])


if __name__ == "__main__":
    print("\n".join(docs_requirements()))
