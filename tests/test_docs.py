"""The docs site: its reference cannot drift from the code (every ``StreamConfig`` option, every
``Stream.open`` and ``Loader`` argument, every CLI flag, every counter of ``stats()``), every page
is in the navigation, it builds strictly, and no page a user reads talks of internal history."""

import argparse
import dataclasses
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
DOCS = os.path.join(ROOT, "docs")


def load_hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", os.path.join(DOCS, "config", "reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = load_hook()


def page(name: str) -> str:
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        return f.read()


def rendered(name: str) -> str:
    return reference.render(page(name))


# -- the reference is generated from the code, and complete -----------------------------------------

def test_every_stream_option_is_in_the_reference_with_its_default():
    import inspect

    from dalistream.config import StreamConfig
    from dalistream.stream import Stream

    text = rendered("reference/options.md")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    names = {f.name for f in dataclasses.fields(StreamConfig)}
    names |= set(inspect.signature(Stream.open).parameters) - {"cls", "options"}
    names |= {"per_batch", "samples_per_epoch"}
    for name in names:
        assert f"`{name}`" in rows, f"{name} is missing from the options reference"
    assert "| `max_member_bytes` | `int` | `256 << 20` (256 MiB) |" in rows["`max_member_bytes`"]
    assert "| `policy` | `str` | `'even'` |" in rows["`policy`"]
    assert "| `workers` | `int` | `2` |" in rows["`workers`"]
    for name in ("progress", "stats_dir", "wait_warning", "transform"):
        assert f"| `{name}` |" in text, f"Loader's {name} is missing"


def test_an_option_without_a_description_stops_the_build(monkeypatch):
    docs = reference.field_docs

    def without(name):
        return lambda cls: {k: v for k, v in docs(cls).items() if k != name}

    for name in ("seed", "storage_options"):
        monkeypatch.setattr(reference, "field_docs", without(name))
        with pytest.raises(reference.Undocumented, match=name):
            rendered("reference/options.md")
    monkeypatch.setattr(reference, "field_docs", docs)
    monkeypatch.setattr(reference, "args_section", lambda doc: {})  # Stream.open's and Loader's Args gone
    with pytest.raises(reference.Undocumented, match="Args"):
        rendered("reference/options.md")


def test_every_cli_flag_of_every_command_is_in_the_reference():
    text = rendered("reference/cli.md")
    commands = reference.commands()
    assert {"synth", "write", "plan", "index", "keys", "stats", "bench", "demo"} <= set(commands)
    for name, parser in commands.items():
        if name:
            assert f"## `dalistream {name}`" in text, f"dalistream {name} is missing"
        section = text.split(f"## `dalistream {name}`" if name else "## `dalistream`", 1)[1]
        section = section.split("\n## ", 1)[0]
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            shown = action.option_strings or [action.metavar or action.dest]
            for flag in shown:
                assert f"`{flag}`" in section, f"dalistream {name}: {flag} is missing from its reference"


def test_a_flag_without_help_stops_the_build(monkeypatch):
    import dalistream.cli as cli

    build = cli.build_parser

    def with_a_silent_flag():
        parser = build()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["keys"].add_argument("--quietly-added")
        return parser

    monkeypatch.setattr(cli, "build_parser", with_a_silent_flag)
    with pytest.raises(reference.Undocumented, match="--quietly-added"):
        rendered("reference/cli.md")


def test_every_error_class_is_in_the_catalogue():
    from dalistream import errors

    text = rendered("reference/errors.md")
    for cls in errors._CLASSES.values():
        assert f"| `{cls.__name__}` |" in text and f"`{cls.reason}`" in text


def test_every_loader_method_is_in_the_reference():
    from dalistream.loader import Loader

    text = rendered("reference/loader.md")
    public = sorted(n for n, v in vars(Loader).items() if callable(v) and not n.startswith("_"))
    for name in public:
        assert f"loader.{name}(" in text, f"Loader.{name} is missing"


def test_reference_pages_are_generated():
    for name, markers in {"reference/options.md": ("stream-options", "loader-arguments"),
                          "reference/cli.md": ("cli",), "reference/loader.md": ("loader-methods",),
                          "reference/errors.md": ("errors",)}.items():
        for marker in markers:
            assert f"<!-- generated: {marker} -->" in page(name)
    with pytest.raises(reference.Undocumented, match="unknown"):
        reference.render("<!-- generated: no-such-table -->")


def test_markdown_of_docstrings():
    assert reference.markdown(":class:`~dalistream.errors.SampleError` and ``x | y``\n  and more") == \
        "`SampleError` and `x \\| y` and more"
    assert reference.markdown(":mod:`dalistream.plan.resume`") == "`dalistream.plan.resume`"
    assert reference.args_section("Doc.\n\nArgs:\n    a: one\n        two\n    b: three\n\nAfter.") == \
        {"a": "one two", "b": "three"}


# -- the docs build needs only the docs extra: no DALI, no torch, no install of the library ---------

# A child that renders every reference page with an import blocker first on sys.meta_path: it refuses
# DALI and torch, and every module that is neither the standard library, this checkout's dalistream,
# nor a distribution of pyproject.toml's docs extra (what .ci/run's docs step installs, and only that).
HOOK_IN_A_BARE_ENVIRONMENT = r"""
import importlib.machinery, importlib.metadata, importlib.util, json, os, re, sys
root, allowed_dists, pages = sys.argv[1], set(json.loads(sys.argv[2])), json.loads(sys.argv[3])
normal = lambda name: re.sub(r"[-_.]+", "-", name).lower()
owners = {top: {normal(d) for d in dists} for top, dists in importlib.metadata.packages_distributions().items()}
refused = []

class Blocker:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if name == "dalistream":  # this checkout's, never an installed one: the docs build installs none
            spec = importlib.machinery.PathFinder.find_spec(name)
            if spec is None or not spec.origin.startswith(os.path.join(root, name, "")):
                refused.append(name)
                raise ImportError(f"the docs build imported dalistream from outside {root}")
            return None
        if importlib.machinery.PathFinder.find_spec(top) is None:
            return None  # not installed here either (copy's `import org`): as in a bare environment
        if top in ("torch", "nvidia") or (top not in sys.stdlib_module_names and top != "dalistream"
                                           and not owners.get(top, set()) & allowed_dists):
            refused.append(name)
            raise ImportError(f"the docs build imported {name}, which the docs extra does not install")
        return None

sys.meta_path.insert(0, Blocker())
spec = importlib.util.spec_from_file_location("hook", os.path.join(root, "docs", "config", "reference.py"))
hook = importlib.util.module_from_spec(spec)
saved = sys.path.copy()
spec.loader.exec_module(hook)
sys.path[:] = saved  # as MkDocs loads a hook: what the hook put on sys.path while loaded is gone
out = {}
for name in pages:
    with open(os.path.join(root, "docs", name), encoding="utf-8") as f:
        out[name] = hook.on_page_markdown(f.read())
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "nvidia", "lightning", "accelerate"})
print(json.dumps({"pages": out, "refused": refused, "loaded": loaded}))
"""

REFERENCE_PAGES = ["reference/options.md", "reference/cli.md", "reference/loader.md", "reference/errors.md"]


def test_the_docs_requirements_without_tomllib_are_pyproject_s():
    """On Python 3.10 (no tomllib) requirements.py reads the docs extra's line itself: the same list."""
    sys.path.insert(0, os.path.join(DOCS, "config"))
    try:
        import requirements
    finally:
        sys.path.pop(0)
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    assert requirements.docs_extra_of(text) == requirements.docs_requirements()
    assert requirements.docs_extra_of('x = 1\ndocs = ["a>=1,<2", # why\n  "b[c]"]\ngcs = ["d"]\n') == ["a>=1,<2", "b[c]"]


def docs_extra() -> set:
    sys.path.insert(0, os.path.join(DOCS, "config"))
    try:
        import requirements
    finally:
        sys.path.pop(0)
    from packaging.requirements import Requirement

    return {re.sub(r"[-_.]+", "-", Requirement(r).name).lower() for r in requirements.docs_requirements()}


def hook_in_a_bare_environment(allowed: set) -> dict:
    done = subprocess.run([sys.executable, "-I", "-c", HOOK_IN_A_BARE_ENVIRONMENT, ROOT, json.dumps(sorted(allowed)),
                           json.dumps(REFERENCE_PAGES)], capture_output=True, text=True, timeout=120, cwd=str(DOCS))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_docs_build_imports_nothing_beyond_the_docs_extra():
    """The reference hook runs with every import outside the docs extra refused (DALI and torch
    above all), and generates exactly the pages it generates here, where everything is installed."""
    allowed = docs_extra()
    assert {"mkdocs", "mkdocs-material", "pymdown-extensions"} <= allowed
    assert not {"torch", "nvidia-dali-cuda120", "dalistream"} & allowed
    child = hook_in_a_bare_environment(allowed)
    assert child["refused"] == [] and child["loaded"] == []
    for name in REFERENCE_PAGES:
        assert child["pages"][name] == rendered(name), f"{name} differs when built without DALI and torch"
        assert "<!-- generated:" not in child["pages"][name]


def test_the_import_blocker_refuses_what_the_docs_extra_lacks():
    """The check above can fail: without numpy in the docs extra the hook cannot import the code."""
    done = subprocess.run([sys.executable, "-I", "-c", HOOK_IN_A_BARE_ENVIRONMENT, ROOT,
                           json.dumps(sorted(docs_extra() - {"numpy"})), json.dumps(REFERENCE_PAGES)],
                          capture_output=True, text=True, timeout=120, cwd=str(DOCS))
    assert done.returncode != 0 and "imported numpy, which the docs extra does not install" in done.stderr


def test_ci_installs_the_docs_extra_without_the_library():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    step = ci[ci.index("fresh_venv \"$work/venv-docs\""):ci.index("NO_MKDOCS_2_WARNING=1 mkdocs build --strict")]
    run = [line for line in step.splitlines() if line.strip() and not line.lstrip().startswith(("#", "echo"))]
    assert any("< <(python docs/config/requirements.py)" in line for line in run), run
    installs = [line for line in run if "pip install" in line]
    assert installs and all("-e ." not in line and "[docs]" not in line and "torch" not in line for line in installs)


# -- the headline says what the plan does -------------------------------------------------------------

HEADLINE_PLAN = re.compile(r"`dalistream plan data --world-size (\d+) -B (\d+)` on (\d+)\s+shards of (\d+) samples: "
                           r"(\d+)\s+shards\s+cut, each read by rank 0 and rank 1")
FALSE_HEADLINE = re.compile(r"(?i)\b(?:every|each)\s+shard\s+is\s+read\b[^.]*\bone\s+(?:DALI\s+)?worker"
                            r"|\bone\s+(?:DALI\s+)?worker\b[^.]*\b(?:every|each)\s+shard\b")


def plan_json(tmp_path, capsys, shards: int, per_shard: int, *flags: str) -> dict:
    """``dalistream plan`` (the command a user runs) on a synthetic data set of ``shards`` shards."""
    from dalistream.cli import main

    data = tmp_path / f"data-{shards}x{per_shard}"
    if not data.exists():
        assert main(["synth", str(data), "--prefix", "train", "--shards", str(shards),
                     "--samples-per-shard", str(per_shard)]) == 0
    capsys.readouterr()
    assert main(["plan", str(data), *flags, "--json", "--detail"]) == 0
    return json.loads(capsys.readouterr().out)


def readers(plan: dict) -> dict:
    """``{shard: [(rank, global worker, first, stop), …]}``: who reads which part of every shard."""
    out: dict = {}
    for worker in plan["plan"]:
        for part in worker["parts"]:
            out.setdefault(os.path.basename(part["url"]), []).append(
                (worker["rank"], worker["global_worker"], part["first"], part["stop"]))
    return out


def check_headline_claims(plan: dict, per_shard: int) -> None:
    """What the headline claims of any plan: every sample read at most once per epoch, by exactly
    one worker; fewer than one batch per rank left out under ``even``; each worker's parts of a
    shard in the shard's order (front to back)."""
    (epoch,) = plan["epochs"]
    for shard, parts in readers(plan).items():
        read = [i for _, _, first, stop in parts for i in range(first, stop)]
        assert len(read) == len(set(read)) and set(read) <= set(range(per_shard)), f"{shard}: a sample read twice"
        for g in {g for _, g, _, _ in parts}:
            firsts = [first for _, w, first, _ in parts if w == g]
            assert firsts == sorted(firsts), f"{shard}: worker {g} does not read its parts front to back"
    assert sum(worker["samples"] for worker in plan["plan"]) == epoch["samples_read"] == \
        epoch["samples"] - epoch["left_out"]
    assert epoch["left_out"] < epoch["world_size"] * epoch["batch_size"]


@pytest.mark.parametrize("page_name", ["README.md", "docs/index.md"])
def test_the_headline_states_what_the_default_plan_does(page_name, tmp_path, capsys):
    """The pages once opened with "every shard is read once per epoch by exactly one DALI worker",
    while the default (interleaved) plan cuts shards between ranks. The headline's example is run
    here with `dalistream plan`, and its figures must be the plan's."""
    with open(os.path.join(ROOT, page_name), encoding="utf-8") as f:
        text = f.read()
    opening = " ".join(text.split("\n## ", 1)[0].split())
    assert not FALSE_HEADLINE.search(opening), f"{page_name} says a shard has one reader"
    found = HEADLINE_PLAN.search(opening)
    assert found, f"{page_name}'s opening does not give the plan example"
    world, batch, shards, per_shard, cut = map(int, found.groups())
    plan = plan_json(tmp_path, capsys, shards, per_shard, "--world-size", str(world), "-B", str(batch))
    (epoch,) = plan["epochs"]
    assert epoch["interleave"] is True and epoch["policy"] == "even"  # the defaults
    assert epoch["shards_cut"] == cut
    parts = readers(plan)
    cut_shards = [s for s, p in parts.items() if len({(first, stop) for _, _, first, stop in p}) > 1]
    assert len(cut_shards) == cut
    for shard in cut_shards:
        assert {rank for rank, _, _, _ in parts[shard]} == set(range(world)) == {0, 1}, shard
    check_headline_claims(plan, per_shard)


@pytest.mark.parametrize("flags", [("--world-size", "3", "-B", "8"), ("--world-size", "2", "-W", "1", "-B", "5"),
                                   ("--world-size", "2", "-B", "7", "--no-interleave"),
                                   ("--world-size", "4", "-B", "6", "--policy", "exact")],
                         ids=lambda f: " ".join(f))
def test_the_headline_claims_hold_for_other_layouts(flags, tmp_path, capsys):
    check_headline_claims(plan_json(tmp_path, capsys, 5, 19, *flags), 19)


def test_the_false_headline_is_recognised():
    assert FALSE_HEADLINE.search("Every shard is read once per epoch, sequentially, by exactly one DALI worker")
    assert FALSE_HEADLINE.search("each shard is read by exactly one DALI worker in the whole cluster")
    assert FALSE_HEADLINE.search("one DALI worker reads every shard, sequentially")
    assert not FALSE_HEADLINE.search("Every sample is read at most once per epoch, by exactly one DALI worker in "
                                     "the whole cluster. A worker reads each of its parts of a shard")


# -- the stats() schema covers every key the code writes ---------------------------------------------

def test_stats_schema_names_every_counter(tmp_path):
    from dalistream.io.counters import IOCounters
    from dalistream.loader.progress import Watch, worker_sums
    from dalistream.worker.stats import WORKER_FIELDS, WorkerStats, summarize

    text = page("reference/stats.md")
    documented = set(re.findall(r"`([a-z_]+)`", text))
    worker = WorkerStats(None, 0, 0).as_dict()
    assert set(worker) == set(WORKER_FIELDS)
    keys = set(worker) | set(IOCounters.FIELDS) | set(summarize([worker], through=0)) | {"loader"}
    watch = Watch(run_dir=str(tmp_path), counters=lambda: {"workers": [worker]})
    keys |= set(watch.figures())
    watch.publish()
    import json

    (written,) = glob.glob(str(tmp_path / "rank-*.json"))
    with open(written) as f:
        doc = json.load(f)
    keys |= set(doc) | set(worker_sums([{**worker, "io": {"cache_hits": 1, "cache_bytes": 1}}]))
    from dalistream.config import StreamConfig
    from dalistream.dataset import DataSet
    from dalistream.loader.state import node_report
    from dalistream.stream import Stream

    config = StreamConfig(sources=("a.tar", "b.tar"), fields={"key": "__key__"}, batch_size=2, world_size=2,
                          affinity="node", ranks_per_node=1)
    keys |= {"affinity"} | set(node_report(Stream(config, DataSet(("a.tar", "b.tar"), (3, 4))), 1))
    missing = sorted(keys - documented)
    assert not missing, f"reference/stats.md does not describe {missing}"


# -- the site: every page in the navigation, a strict build --------------------------------------

def nav_pages():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !relative and other MkDocs tags
    with open(os.path.join(DOCS, "config", "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.load(f, Loader=Loader)

    def walk(items):
        for item in items:
            for value in item.values() if isinstance(item, dict) else [item]:
                yield from walk(value) if isinstance(value, list) else [value]

    return config, list(walk(config["nav"]))


RESERVED = ["guide/evaluation.md", "guide/state.md", "guide/writing.md", "guide/preemption.md", "guide/stores.md",
            "internals.md", "guide/gpu.md", "guide/cache.md", "guide/buckets.md"]


def test_every_page_is_in_the_navigation_and_every_entry_exists():
    config, nav = nav_pages()
    pages = {os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)}
    assert sorted(pages - set(nav)) == [], "pages missing from the nav"
    assert sorted(set(nav) - pages) == [], "nav entries without a page"
    assert set(RESERVED) <= set(nav)
    assert config["docs_dir"] == ".." and config["strict"] is True


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (pip install $(python docs/config/requirements.py)); .ci/run builds the site")
    pytest.importorskip("material", reason="the docs extra")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", os.path.join(DOCS, "config", "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    with open(tmp_path / "site" / "reference" / "options" / "index.html", encoding="utf-8") as f:
        assert "max_skip_fraction" in f.read()
    assert (tmp_path / "site" / "recipes" / "lightning_train.py").is_file()
    assert not (tmp_path / "site" / "config").exists()


# -- no internal history where a user reads -------------------------------------------------------

INTERNAL = [
    (re.compile(r"(?i)\bissues?\s*#?\d+"), "an issue number"),
    (re.compile(r"(?<![\w/&])#\d{1,4}\b"), "an issue number"),
    (re.compile(r"(?i)\bcommit\s+`?[0-9a-f]{7,40}\b"), "a commit hash"),
    (re.compile(r"(?<![\w/.-])`?[0-9a-f]{7,12}`?(?![\w.-])(?=.*\b(?:before|after|commit|at)\b)", re.I), "a commit hash"),
    (re.compile(r"(?i)\bthis (?:2-core )?box\b|\bthis workplace\b"), "the machine of the day"),
    (re.compile(r"(?i)\b(?:sessions?|engineers?|integrator)\b"), "who worked on it"),
    (re.compile(r"(?i)\bwas lent\b|\bno GPU was lent\b|\bthe stop\b"), "work-day talk"),
    (re.compile(r"/tmp script"), "a private script"),
]


def internal_talk(text: str) -> list:
    """``(line number, what, line)`` for every line that talks of internal history."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, what in INTERNAL:
            if pattern.search(line):
                found.append((number, what, line.strip()))
                break
    return found


@pytest.mark.parametrize("line,what", [
    ("Measured in issue #26 on the box.", "an issue number"), ("see #25", "an issue number"),
    ("Before is the code at commit `fe79bbf`.", "a commit hash"), ("(commit ab18dc0)", "a commit hash"),
    ("on this 2-core box a parse costs", "the machine of the day"), ("two other engineers' work", "who worked on it"),
    ("Checking the GPU path in one session", "who worked on it"), ("no GPU was lent to this task", "work-day talk"),
    ("the `/tmp` script", None), ("(`/tmp script in the note`)", "a private script"),
])
def test_internal_talk_is_found(line, what):
    found = internal_talk(line)
    assert (found[0][1] if found else None) == what


@pytest.mark.parametrize("line", [
    "[Shuffle quality](#shuffle-quality) and `dalistream plan --counts 8:32`", "rank 0: 16 steps",
    "a sha256 digest such as 3f2a... of the shard list", "color #fff", "shards `train-00000.tar`",
    "`b'<html>…'` at offset 1024", "the 16 shards × 200 samples, W=2 #workers",
])
def test_ordinary_text_is_not_internal_talk(line):
    assert internal_talk(line) == []


def user_pages():
    pages = [os.path.join(ROOT, "README.md")]
    pages += [p for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
              if os.path.basename(p) != "changelog.md"]
    return pages + sorted(glob.glob(os.path.join(DOCS, "recipes", "*.py")))


@pytest.mark.parametrize("path", user_pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_internal_history_outside_the_changelog(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".md") and "<!-- generated:" in text:
        text = reference.render(text)  # the generated tables are what the user reads too
    found = internal_talk(text)
    assert not found, f"{os.path.relpath(path, ROOT)}: " + "; ".join(f"line {n}: {what}: {line[:100]}"
                                                                  for n, what, line in found)


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= 250


def test_readme_links_point_to_files_that_exist():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", f.read())
    assert len(links) >= 10
    missing = [link for link in links if not os.path.exists(os.path.join(ROOT, link))]
    assert not missing, missing
