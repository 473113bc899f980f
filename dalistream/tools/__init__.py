"""Tooling around the library, used by the command line: ``bench`` (runner, peers, monitor,
merge-only), ``demo`` and ``synth``. Nothing in the library imports this package."""
