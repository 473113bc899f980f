"""The docs site's requirements, one per line: pyproject.toml's ``docs`` extra, without the library.

The site needs mkdocs, its plugins, and what the reference hook (``reference.py``) imports from this
checkout's pure modules (numpy, braceexpand; never DALI or torch): no DALI, no torch, no install of
dalistream itself. ``pip install $(python docs/config/requirements.py)`` installs them in seconds.
"""

import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def docs_requirements() -> list:
    """The ``docs`` extra of ``pyproject.toml``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: no tomllib; tomli is the same parser
        import subprocess

        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "tomli"], check=True)
        import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"]["docs"])


if __name__ == "__main__":
    print("\n".join(docs_requirements()))
