"""MkDocs hook: the reference's tables, generated from the code at every build so they cannot drift.

A page asks for a table with a marker line, ``<!-- generated: NAME -->``, NAME one of
:data:`GENERATORS`: the options of ``Stream.open`` and ``StreamConfig`` (from the dataclass's
fields, their attribute docstrings and ``Stream.open``'s signature and ``Args``), the ``Loader``'s
arguments and methods, every CLI command and flag (from the argparse parser), the error classes
(from ``dalistream/errors.py``). An option or flag without a description, or an unknown marker,
stops the build (and ``tests/test_docs.py``). The build needs only pyproject.toml's ``docs`` extra
(``requirements.py`` prints it): no install of the library, no DALI, no torch.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import re
import sys
import textwrap
from typing import Callable, Dict, List, Tuple

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))  # docs/config/ -> the repository

MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.M)
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):`(~?)([\w.]+)`")


class Undocumented(Exception):
    """An option, flag or error class has no description: the reference would be incomplete."""


def markdown(text: str) -> str:
    """A docstring's reST inline markup as Markdown, on one line, safe in a table cell."""
    text = ROLE.sub(lambda m: "`" + (m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)) + "`", text)
    text = text.replace("``", "`")
    return " ".join(text.split()).replace("|", "\\|")


def args_section(doc: str) -> Dict[str, str]:
    """The ``Args:`` block of a Google-style docstring: ``{name: description}``."""
    lines = inspect.cleandoc(doc or "").splitlines()
    out: Dict[str, str] = {}
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return out
    name = None
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        m = re.match(r"^ {4}(\*{0,2}\w+): (.*)$", line)
        if m:
            name = m.group(1).lstrip("*")
            out[name] = m.group(2)
        elif name and line.strip():
            out[name] += " " + line.strip()
    return out


def field_docs(cls: type) -> Dict[str, str]:
    """A dataclass's attribute docstrings (the string right after each field), from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    out = {}
    for node, after in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                out[node.target.id] = after.value.value
    return out


def shown_default(value) -> str:
    if value is inspect.Parameter.empty or value is dataclasses.MISSING:
        return "required"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value >> 20} << 20` ({value >> 20} MiB)" if value < 1 << 30 else f"`{value >> 30} << 30` ({value >> 30} GiB)"
    return f"`{value!r}`"


def table(header: Tuple[str, ...], rows: List[Tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- Stream.open and StreamConfig ------------------------------------------------------------------

def stream_option_rows() -> List[Tuple[str, str, str, str]]:
    """``(name, type, default, meaning)`` for every argument of ``Stream.open``: its own, then every
    ``StreamConfig`` field it passes on, then a mix's options."""
    from dalistream.config import StreamConfig
    from dalistream.stream import Stream

    fields = {f.name: f for f in dataclasses.fields(StreamConfig)}
    docs = field_docs(StreamConfig)
    own = args_section(Stream.open.__doc__)
    signature = inspect.signature(Stream.open)
    missing = sorted(set(fields) - set(docs))
    if missing:
        raise Undocumented(f"StreamConfig fields without an attribute docstring: {missing}")
    rows, seen = [], set()

    def field_default(f: dataclasses.Field):
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            return f.default_factory()  # type: ignore[misc]
        return f.default

    for name, param in signature.parameters.items():
        if name in ("cls", "options"):
            continue
        if name in fields:
            meaning, kind = docs[name], str(fields[name].type)
            default = param.default if param.default is not inspect.Parameter.empty else field_default(fields[name])
            if name in own:
                meaning = own[name]
        elif name in own:
            meaning, kind, default = own[name], str(param.annotation), param.default
        else:
            raise Undocumented(f"Stream.open's argument {name!r} is not in its docstring's Args")
        rows.append((f"`{name}`", f"`{kind}`", shown_default(default), markdown(meaning)))
        seen.add(name)
    for name, f in fields.items():
        if name not in seen:
            rows.append((f"`{name}`", f"`{f.type}`", shown_default(field_default(f)), markdown(docs[name])))
            seen.add(name)
    for name in ("per_batch", "samples_per_epoch"):
        if name not in own:
            raise Undocumented(f"Stream.open's mix option {name!r} is not in its docstring's Args")
        from dalistream.mixing import open_mix

        default = inspect.signature(open_mix).parameters[name].default
        rows.append((f"`{name}`", "`str`" if name == "per_batch" else "`Optional[int]`", shown_default(default),
                     markdown(own[name]) + " (a mix only)"))
    return rows


def stream_options() -> str:
    return table(("option", "type", "default", "meaning"), stream_option_rows())


# -- Loader ----------------------------------------------------------------------------------------

def loader_arguments() -> str:
    from dalistream.loader import Loader

    own = args_section(Loader.__doc__)
    rows = []
    for name, param in inspect.signature(Loader.__init__).parameters.items():
        if name == "self":
            continue
        if name not in own:
            raise Undocumented(f"Loader's argument {name!r} is not in its docstring's Args")
        shown = f"`**{name}`" if param.kind is param.VAR_KEYWORD else f"`{name}`"
        default = "—" if param.kind is param.VAR_KEYWORD else shown_default(param.default)
        rows.append((shown, default, markdown(own[name])))
    return table(("argument", "default", "meaning"), rows)


LOADER_METHODS = ("__len__", "set_epoch", "state_dict", "load_state_dict", "stats", "summary", "delivered_epoch",
                  "close")


def loader_methods() -> str:
    from dalistream.loader import Loader

    public = {name for name, value in vars(Loader).items() if callable(value) and not name.startswith("_")}
    extra = sorted(public - set(LOADER_METHODS))
    if extra:
        raise Undocumented(f"Loader methods not in the reference (add them to LOADER_METHODS): {extra}")
    out = []
    for name in LOADER_METHODS:
        method = getattr(Loader, name)
        if not method.__doc__:
            raise Undocumented(f"Loader.{name} has no docstring")
        signature = str(inspect.signature(method)).replace("'", "").replace("(self, ", "(").replace("(self)", "()")
        shown = "len(loader)" if name == "__len__" else f"loader.{name}{signature}"
        paragraphs = inspect.cleandoc(method.__doc__).split("\n\n")
        out.append(f"### `{shown}`\n\n" + "\n\n".join(markdown(p) for p in paragraphs) + "\n")
    return "\n".join(out)


# -- the command line ------------------------------------------------------------------------------

def flag_rows(parser: argparse.ArgumentParser) -> List[Tuple[str, str, str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if not action.help:
            raise Undocumented(f"{parser.prog}: {action.option_strings or action.dest} has no help text")
        name = ", ".join(f"`{o}`" for o in action.option_strings) if action.option_strings else f"`{action.metavar or action.dest}`"
        if action.option_strings and action.nargs != 0:
            name += f" `{action.metavar or action.dest.upper()}`" if not action.choices else \
                " `{" + ",".join(map(str, action.choices)) + "}`"
        default = action.default
        hidden = default is None or default is False or default is argparse.SUPPRESS or not action.option_strings
        shown = "" if hidden else f"`{default}`"
        rows.append((name, shown, markdown(action.help % {"default": default, "prog": parser.prog}
                                            if "%(" in action.help else action.help)))
    return rows


def commands() -> Dict[str, argparse.ArgumentParser]:
    """The ``dalistream`` parser's subcommands by name, and the parser itself under ``""``."""
    from dalistream.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, command in sub.choices.items():
        command.description = command.description or helps.get(name)
    return {"": parser, **sub.choices}


def cli() -> str:
    out = []
    for name, parser in commands().items():
        title = f"dalistream {name}".strip()
        if not name:
            out.append(f"## `dalistream`\n\nOptions of every command (given before the command's name; `--log-level` "
                       "after it too).\n")
        else:
            if not parser.description:
                raise Undocumented(f"{title} has no help text")
            out.append(f"## `{title}`\n\n{markdown(parser.description)}.\n")
        usage = " ".join(parser.format_usage().split())
        out.append(f"```text\n{usage}\n```\n")
        out.append(table(("argument", "default", "meaning"), flag_rows(parser)))
    return "\n".join(out)


# -- errors ----------------------------------------------------------------------------------------

def errors() -> str:
    from dalistream import errors as module

    rows = []
    for cls in module._CLASSES.values():
        if not cls.__doc__:
            raise Undocumented(f"{cls.__name__} has no docstring")
        parents = ", ".join(b.__name__ for b in cls.__bases__ if b is not Exception)
        rows.append((f"`{cls.__name__}`", parents and f"`{parents}`", f"`{cls.reason}`", markdown(cls.__doc__)))
    return table(("class", "base", "reason", "raised when"), rows)


GENERATORS: Dict[str, Callable[[], str]] = {
    "stream-options": stream_options, "loader-arguments": loader_arguments, "loader-methods": loader_methods,
    "cli": cli, "errors": errors,
}


def render(text: str) -> str:
    """``text`` with every marker replaced by its generated Markdown (an unknown marker is an error).

    The code is this checkout's, imported from its folder: the docs build installs no dalistream
    (nor DALI, nor torch: the modules the reference reads import neither). Put on ``sys.path`` here,
    not when the hook is loaded: MkDocs restores ``sys.path`` after loading a hook."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    def one(m: re.Match) -> str:
        if m.group(1) not in GENERATORS:
            raise Undocumented(f"unknown generated table {m.group(1)!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[m.group(1)]()

    return MARKER.sub(one, text)


def on_page_markdown(markdown_text: str, page=None, config=None, files=None, **kwargs) -> str:  # MkDocs hook
    return render(markdown_text)
