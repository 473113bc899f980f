"""What ``dalistream COMMAND --help`` says: every command's help prints; options in groups, not
one flat list; one default per flag; no flag named that the same command lacks; plain words,
not the code's; sample keys and bucket keys named apart."""

import argparse
import re

import pytest

from dalistream.cli import build_parser, main
from dalistream.tools.args import GROUPS


def _commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


COMMANDS = sorted(_commands())
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ANOTHER_COMMAND = re.compile(r"`dalistream [^`]*`")  # `dalistream index --keys`: another command's flag
INTERNAL = ("shard owner", "slot's at once", "a worker its", "shards cut", "who reads what", "(left out, padding")


def _texts(parser):
    """``(flag, its help as --help prints it)`` of every action, and the command's description."""
    formatter = parser._get_formatter()
    out = [("description", parser.description or "")]
    for action in parser._actions:
        if action.help and action.help is not argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction):
            out.append(("/".join(action.option_strings) or action.dest, formatter._expand_help(action)))
    return out


@pytest.mark.parametrize("name", COMMANDS)
def test_every_commands_help_prints(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"] if name else ["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: dalistream {name}".rstrip())
    for word in INTERNAL:
        assert word not in " ".join(text.split()), f"dalistream {name} --help says {word!r}"


@pytest.mark.parametrize("name", COMMANDS)
def test_one_default_per_flag(name):
    for flag, text in _texts(_commands()[name]):
        assert text.count("(default") <= 1, f"dalistream {name} {flag}: {text}"


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_only_the_commands_own_flags(name):
    """A help text that names ``--cache`` in a command without ``--cache`` sends the user nowhere."""
    parser = _commands()[name]
    own = {o for action in parser._actions for o in action.option_strings}
    parent = _commands()[""]
    own |= {o for action in parent._actions for o in action.option_strings}  # given before the command
    for flag, text in _texts(parser):
        for named in FLAG.findall(ANOTHER_COMMAND.sub("", text)):
            assert named in own, f"dalistream {name} {flag} names {named}, which this command lacks: {text}"


@pytest.mark.parametrize("name", ["plan", "keys", "bench"])
def test_the_many_options_come_in_groups(name):
    parser = _commands()[name]
    titles = [g.title for g in parser._action_groups if g._group_actions]
    assert {GROUPS[key] for key in ("data", "store", "layout", "order", "buckets", "mix")} <= set(titles)
    grouped = {a.dest for g in parser._action_groups if g.title in GROUPS.values() for a in g._group_actions}
    assert {"sources", "workers", "policy", "buckets", "mix", "endpoint_url"} <= grouped
    if name != "bench":  # bench's own options are its group; plan's and keys' all have one
        assert [a.dest for a in parser._optionals._group_actions] == ["help", "log_level"]


def test_plan_and_keys_state_their_world_size_default_once():
    commands = _commands()
    plan = dict(_texts(commands["plan"]))["--world-size"]
    keys = dict(_texts(commands["keys"]))["--world-size"]
    assert plan == "number of ranks (default: 1)" and "WORLD_SIZE" not in plan  # plan reads no launcher
    assert keys == "number of ranks (default: WORLD_SIZE or 1)"


def test_sample_keys_and_bucket_keys_are_named_apart():
    commands = _commands()
    sub = next(a for a in commands[""]._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert "sample keys" in helps["keys"] and "__key__" in helps["keys"]
    assert dict(_texts(commands["index"]))["--keys"].startswith("record each sample's bucket keys")
    for name in ("plan", "keys", "bench"):
        assert "bucket keys" in dict(_texts(commands[name]))["--buckets"]
    for name, parser in commands.items():  # "keys" alone, outside a flag or a command's name, is one or the other
        for flag, text in _texts(parser):
            bare = re.sub(r"--keys|dalistream keys|(?:sample|bucket|skip) keys|KEY", "", text)
            assert not re.search(r"\bkeys\b", bare), f"dalistream {name} {flag}: {text}"
