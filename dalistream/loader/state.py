"""A loader state: plain data that says where an epoch stands, and proves what it is.

:meth:`dalistream.Loader.state_dict` returns (version 7)::

    {"version": 7,
     "loader": {"epoch": e, "step": s},
     "plan": {"seed", "rank", "world_size", "workers", "batch_size", "policy", "shuffle", "interleave",
              "batches_per_epoch", "shuffle_shards", "nodes", "buckets": BUCKETS, "sources": IDENTITY},
     "segments": [[world_size, workers, batch_size, steps], ...],
     "digest": "…"}

``nodes`` is the node count of a stream read with ``affinity="node"`` (``None`` without it); a
segment of an epoch that ran with node affinity is ``[world_size, workers, batch_size, steps,
nodes, interleaved]`` (:mod:`dalistream.plan.affinity`), so the rest of the epoch can be planned
on another node count (:func:`resumed_at`).

``digest`` is the SHA-256 of the rest (its canonical JSON): a state edited by hand (a step
changed) or damaged on the way is refused (:class:`~dalistream.errors.StateError`). It is a
checksum, not a signature: whoever edits a state on purpose can compute it again.

``BUCKETS`` is ``None``, or the stream's buckets as plain data (their kind, sizes or field and
edges, and ``per``: ``AspectBuckets.plain()``, ``auto``'s sizes as
computed): the batches of a bucket plan are its own, so a state resumes only the same buckets;
its segments are the layouts themselves (a bucket plan reads its own columns).

``IDENTITY`` says what the shards are (:func:`dalistream.stream.sources_identity`): their number,
names relative to their folder or bucket prefix, per-shard sample counts and sizes (digests), and
(:func:`content_identity`) ``root``, a digest of that folder or prefix, and ``versions``, a digest
of every shard's content version: a local file's size, mtime (ns) and inode, a remote object's
size and ETag. A shard rewritten with other samples under the same name, count and size changes
its version: resuming then would deliver some samples twice and others never, so it is refused.
The versions are read when a state is first taken or loaded (one ``stat`` per local shard, one
HEAD per remote one), never when a stream opens. Shards listed under another folder or bucket
than when saved (a copy, a move) cannot be compared by version: they resume on names, counts and
sizes, with a warning; so do ``pipe:`` shards and objects without an ETag, and states of versions
2 to 4, which carry neither digest nor versions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import StateError
from ..io.local import new_file_mode, write_atomic
from ..io.options import remote_options
from ..manifest.scan import content_version
from ..plan import Layout, check_segments, continued
from ..plan.affinity import cache_kept, node_owner
from ..sources import is_remote
from ..stream import Stream, relative_names

log = logging.getLogger(__name__)

# 7: bucket plans read 2B columns per rank (a state of an earlier version inside a bucketed epoch
# cannot say what it delivered under the plan of today); 6: the node count (affinity="node") in the
# plan and in segments;
# 5: a digest of itself, the sources' content versions, exact's last step dealt position by
# position; 4: interleave; 3: segments of an epoch under other layouts, sources by identity;
# 2: spans; 1: whole shards
STATE_VERSION = 7
VERSIONS = (2, 3, 4, 5, 6, STATE_VERSION)  # those that load
# what a resume cannot change
INVARIANT = ("seed", "policy", "shuffle", "interleave", "batches_per_epoch", "shuffle_shards", "buckets")
CONTENT = ("root", "versions")  # the identity's content part (version 5)
THREADS = 32  # shards' versions asked for at once (stat on a network file system, HEAD)
LOCAL_CHUNK = 4096  # local shards per task (a stat on a local disk takes microseconds)


class SavedState(NamedTuple):
    """A state read and checked by :func:`read_state`."""

    epoch: int
    step: int
    plan: Dict[str, Any]
    segments: Tuple[Tuple[int, ...], ...]
    version: int


def _canonical(body: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise StateError(f"loader state is not plain data (numbers, strings, lists, dicts): {e}") from None


def digest_of(state: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of ``state`` without its ``digest``, as canonical JSON."""
    return hashlib.sha256(_canonical({k: v for k, v in state.items() if k != "digest"})).hexdigest()


def sealed(state: Mapping[str, Any]) -> Dict[str, Any]:
    """``state`` with its ``digest`` (computed again)."""
    body = {k: v for k, v in state.items() if k != "digest"}
    return {**body, "digest": digest_of(body)}


def read_state(state: Any, current: Mapping[str, Any]) -> SavedState:
    """A state from :meth:`Loader.state_dict` checked: its shape (a :class:`StateError` naming what
    is missing or wrong, never a KeyError or TypeError), then (version 5) its digest. ``current``
    is this loader's ``plan`` part: the names a saved plan must hold (``{}``: any)."""
    def integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(state, dict):
        raise StateError(f"a loader state is a dict from Loader.state_dict(), got {type(state).__name__}")
    version = state.get("version")
    if not integer(version) or version not in VERSIONS:
        raise StateError(f"unknown loader state version {version!r} (expected {STATE_VERSION})")
    for part in ("loader", "plan"):
        if not isinstance(state.get(part), dict):
            raise StateError(f"loader state has no {part!r} dict: got {state.get(part)!r}")
    position, saved = state["loader"], dict(state["plan"])
    for name in ("epoch", "step"):
        if not integer(position.get(name)) or position[name] < 0:
            raise StateError(f"loader state: {name} must be an integer >= 0, got {position.get(name)!r}")
    if version == 2:  # before elastic resume: no segments, sources a digest of the URLs
        saved.setdefault("shuffle_shards", current.get("shuffle_shards"))
    if version < 4:  # before interleaved reading
        saved.setdefault("interleave", False)
    if version < 6:  # before node affinity
        saved.setdefault("nodes", None)
    saved.setdefault("buckets", None)  # a state taken without buckets (or before them): none
    if version < 7 and saved["buckets"] is not None and position["step"] > 0:
        raise StateError(f"loader state of version {version} inside epoch {position['epoch']} of a bucketed stream: "
                         "its bucket plan read one column per batch position, today's reads two, so the rest of "
                         "that epoch would deliver some samples twice and others never",
                         hint=f"resume from the start of epoch {position['epoch']} (step 0), or finish the epoch "
                              "with the dalistream that saved the state")
    missing = sorted(set(current) - set(saved))
    if missing:
        raise StateError(f"loader state: plan lacks {missing}")
    for name in ("world_size", "workers", "batch_size"):
        if not integer(saved.get(name)) or saved[name] < 1:
            raise StateError(f"loader state: {name} must be an integer >= 1, got {saved.get(name)!r}")
    nodes = saved.get("nodes")
    if nodes is not None and not (integer(nodes) and nodes >= 1 and saved["world_size"] % nodes == 0):
        raise StateError(f"loader state: nodes must be None or an integer >= 1 dividing world_size "
                         f"{saved['world_size']}, got {nodes!r}")
    segments = state.get("segments", [])
    if not isinstance(segments, list):
        raise StateError(f"loader state: segments must be a list, got {segments!r}")
    segments = check_segments(segments)
    if version >= 5:
        if not isinstance(state.get("digest"), str):
            raise StateError("loader state has no digest: it was not written whole by Loader.state_dict()",
                             hint="resume from a state as state_dict() returned it")
        if state["digest"] != digest_of(state):
            raise StateError("loader state does not match its digest: it was edited or damaged after "
                             "Loader.state_dict() returned it",
                             hint="resume from an unedited state (a resume at another step would deliver samples "
                                  "twice or never)")
    return SavedState(position["epoch"], position["step"], saved, segments, version)


def _compare(was: Mapping[str, Any], now: Mapping[str, Any], label: str,
             allow_content_change: bool = False) -> Tuple[List[str], List[str]]:
    """(problems, doubts) of one data set's identity saved (``was``) against ``now``."""
    out: List[str] = []
    if was.get("shards") != now["shards"]:
        out.append(f"{label}: {was.get('shards')} shards saved, {now['shards']} now")
    elif was.get("names") != now["names"]:
        out.append(f"{label}: the shard names (relative to their folder or bucket prefix) differ")
    if was.get("samples") != now["samples"]:
        out.append(f"{label}: {was.get('samples')} samples saved, {now['samples']} now")
    elif was.get("counts") != now["counts"]:
        out.append(f"{label}: the per-shard sample counts differ")
    if None not in (was.get("sizes"), now["sizes"]) and was.get("sizes") != now["sizes"]:
        out.append(f"{label}: the shard sizes in bytes differ")
    if out or "versions" not in was:  # versions 2-4 prove no content: the loader says so once
        return out, []
    if was.get("versions") is None or now.get("versions") is None:
        return out, [f"{label}: the content of some shards cannot be told (pipe: shards, objects without an ETag, "
                     "files that could not be read): they resume on names, counts and sizes"]
    if was.get("root") != now.get("root"):
        return out, [f"{label}: the shards are listed under another folder or bucket than when the state was "
                     "saved (a copy or a move): their content versions cannot be compared; they resume on names, "
                     "counts and sizes"]
    if was["versions"] != now["versions"]:
        said = (f"{label}: the shards were rewritten since the state was saved (the same names, sample counts and "
                "sizes, but other content versions: a local file's modification time or inode, a remote object's "
                "ETag)")
        if allow_content_change:
            return out, [said + "; resumed as asked (allow_content_change=True)"]
        out.append(said + "; the epoch's rest would deliver some samples twice and others never")
    return out, []


def _without_content(identity: Any) -> Any:
    if not isinstance(identity, dict):
        return identity
    return {k: (_without_content(v) if k == "mix" or isinstance(v, dict) else v)
            for k, v in identity.items() if k not in CONTENT}


def differences(saved: Mapping[str, Any], current: Mapping[str, Any], url_digest: str,
                allow_content_change: bool = False) -> Tuple[List[str], List[str]]:
    """What keeps a saved plan from resuming this loader (``problems``, in words; empty: it fits),
    and what it cannot prove (``doubts``: warnings). ``url_digest``: the shard URLs' digest, what
    a version 2 state names its shards by; ``allow_content_change``: shards rewritten since are a
    doubt, not a problem (the same content copied back in place, which changes its versions)."""
    problems = [f"{name}: saved {saved[name]!r}, this loader {current[name]!r}"
                for name in INVARIANT if saved.get(name) != current.get(name)]
    was, now = saved.get("sources"), current["sources"]
    if isinstance(now, dict) and "mix" in now or isinstance(was, dict) and "mix" in was:
        if _without_content(was) != _without_content(now):
            return problems + [f"sources: another mix (saved {sorted((was or {}).get('mix', {}))}, this loader "
                               f"{sorted(now.get('mix', {}))}; a mix resumes only with the same sources, counts, weights "
                               "and choices)"], []
        doubts: List[str] = []
        for name, one in was["mix"].items():
            more, unsure = _compare(one, now["mix"][name], f"sources: mix source {name!r}", allow_content_change)
            problems += more
            doubts += unsure
        return problems, doubts
    if isinstance(was, str):  # version 2: a digest of the URLs themselves
        return problems + ([] if was == url_digest else ["sources: the shard URLs differ (a state of version 2 names "
                                                         "its shards by URL; save again with this version to move them)"]), []
    if not isinstance(was, dict):
        return problems + [f"sources: not a description of shards: {was!r}"], []
    more, doubts = _compare(was, now, "sources", allow_content_change)
    return problems + more, doubts


def listing_root(urls: Sequence[str]) -> str:
    """The folder or bucket prefix the shard names are relative to (:func:`relative_names`),
    absolute for local shards."""
    if not urls:
        return ""
    first = urls[0].split("?", 1)[0] if "://" in urls[0] else urls[0]
    root = first[:len(first) - len(relative_names(urls)[0])]
    return root if is_remote(first) else os.path.abspath(root or ".")


def _versions(urls: Sequence[str], options: Optional[Mapping[str, Any]]) -> List[Optional[str]]:
    return [content_version(u, options) for u in urls]


def content_identity(urls: Sequence[str], options: Optional[Mapping[str, Any]] = None) -> Dict[str, Optional[str]]:
    """``root`` (a digest of :func:`listing_root`) and ``versions`` (a digest of every shard's
    :func:`~dalistream.manifest.scan.content_version` in order; ``None`` when one cannot be told).
    Asked in chunks from :data:`THREADS` threads: a ``stat`` on a network file system, or a HEAD,
    waits for a round trip, and the waits overlap."""
    options = remote_options(options)  # (checked once, not once per shard)
    chunk = 1 if urls and is_remote(urls[0]) else LOCAL_CHUNK
    pieces = [urls[i:i + chunk] for i in range(0, len(urls), chunk)]
    with ThreadPoolExecutor(max(1, min(THREADS, len(pieces)))) as pool:
        versions = [v for piece in pool.map(lambda p: _versions(p, options), pieces) for v in piece]
    digest = None
    if None not in versions:
        digest = hashlib.sha256("\n".join(versions).encode()).hexdigest()[:32]  # type: ignore[arg-type]
    return {"root": hashlib.sha256(listing_root(urls).encode()).hexdigest()[:16], "versions": digest}


def identity_of(stream: Stream) -> Dict[str, Any]:
    """:attr:`Stream.identity` with each data set's :func:`content_identity` (a mix: per source)."""
    identity = stream.identity
    if stream.mix is None:
        return {**identity, **content_identity(stream.data.urls, stream.config.storage_options)}
    mix = {name: {**one, **content_identity(s.data.urls, s.storage_options)}
           for (name, one), s in zip(identity["mix"].items(), stream.mix.sources)}
    return {**identity, "mix": mix}


def read_state_file(path: str) -> Dict[str, Any]:
    """The state saved in the JSON file ``path`` (:func:`write_state_file`), or a
    :class:`StateError` naming the file: missing, unreadable, truncated, not JSON, not a state."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        raise StateError(f"loader state file {path} does not exist",
                         hint="give the file a run wrote (`--state-out`, write_state_file)") from None
    except OSError as e:
        raise StateError(f"cannot read loader state file {path}: {e.strerror or e}") from None
    try:
        state = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        what = "empty" if not text.strip() else f"not valid JSON ({e})"
        raise StateError(f"loader state file {path} is {what}: it is truncated or damaged, or not a loader state",
                         hint="resume from a state file written whole; to start over, give none") from None
    if not isinstance(state, dict):
        raise StateError(f"loader state file {path} holds a {type(state).__name__}, not a state from "
                         "Loader.state_dict()")
    return state


def write_state_file(path: str, state: Mapping[str, Any]) -> None:
    """Write ``state`` as JSON to ``path`` atomically (a reader finds the old file or the whole
    new one), readable as any new file of this user (the umask's mode, not a temporary file's 0600)."""
    payload = json.dumps(state).encode()
    write_atomic(path, lambda f: f.write(payload), mode=new_file_mode())


def resumed_at(stream: Stream, saved: Mapping[str, Any], segments: Sequence[Tuple[int, ...]],
               step: int) -> Tuple[Tuple[Tuple[int, ...], ...], int]:
    """Where a state saved at ``step`` of the plan ``saved`` (after ``segments``) goes on for
    ``stream``: the same layout and node count at its step; another one closes the saved
    layout's segment (:meth:`~dalistream.stream.Stream.segment_head`: with node affinity its node
    count) and plans the rest of the epoch over this one from step 0 (:func:`~dalistream.plan.continued`)."""
    c = stream.config
    before = stream.segment_head(Layout(saved["world_size"], saved["workers"], saved["batch_size"]), saved.get("nodes"))
    now = stream.segment_head(c.layout, c.nodes.count if c.nodes is not None else None)
    return continued(segments, before, step, now)


def node_report(stream: Stream, saved_nodes: Optional[int]) -> Optional[Dict[str, Any]]:
    """With ``affinity="node"``: this rank's node, the job's nodes, the shards and samples its node
    owns, and after a resume from a state of ``saved_nodes`` nodes (another count),
    ``cache_kept``: the share of what the node now reads that it owned under the old count (what
    its cache still holds, :func:`~dalistream.plan.affinity.cache_kept`); ``None`` without affinity."""
    c, counts = stream.config, stream.data.counts
    if c.nodes is None or counts is None:
        return None
    nodes, node = c.nodes, c.nodes.node_of(c.rank)
    owner = node_owner(counts, nodes.count, c.seed)
    mine = owner == node
    report = {"nodes": nodes.count, "node": node, "ranks_per_node": nodes.ranks_per_node, "shards": int(mine.sum()),
              "samples": int(np.asarray(counts)[mine].sum()), "from_nodes": None, "cache_kept": None}
    if saved_nodes is not None and saved_nodes != nodes.count:
        kept = cache_kept(counts, saved_nodes, nodes.count, c.seed)[node]
        report.update(from_nodes=int(saved_nodes), cache_kept=kept)
    return report


def said_node_change(report: Optional[Dict[str, Any]]) -> None:
    """Log how much of this node's cache a resume onto another node count keeps (:func:`node_report`)."""
    if report is not None and report["cache_kept"] is not None:
        log.info("resumed on %d nodes from a state of %d (affinity='node'): node %d reads its shards of the new count; "
                 "its cache holds %.0f%% of them", report["nodes"], report["from_nodes"], report["node"],
                 100 * report["cache_kept"])


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """A :class:`StateError` raised inside names the state file ``path`` it came from."""
    try:
        yield
    except StateError as e:
        if path in e.message:
            raise
        raise StateError(f"loader state file {path}: {e.message}", hint=e.hint) from None
