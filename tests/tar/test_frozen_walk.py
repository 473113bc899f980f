"""The tar stage's readers against what they gave before they were rebuilt: the header walk's samples
(:func:`~dalistream.tar.samples.iter_samples`), the samples cut out by a member layout
(:func:`~dalistream.tar.samples.sliced_samples`) and the walk's samples gathered into runs
(:func:`~dalistream.tar.walked.walked_runs`) over real tars of every writer's shape (ustar, ustar
prefixes, GNU long names, pax records, folders, links, metadata members, a GNU sparse member, base-256
sizes, a gzip'd shard), cut at many points and damaged in their headers, under every option: each
sample's key, number, offset and members, the problem it carries, and the error that ends the walk
(its message, reason, shard URL and member), exactly.

The frozen expectation, ``tests/tar/data/walks.json``, was written by the code of 980b398 (before
the tar stage was merged into fewer modules) with this module's :func:`walks`::

    python tests/tar/test_frozen_walk.py > tests/tar/data/walks.json

Written again only for a change of the readers' behaviour that is meant, and said: once since, for
two messages that named the wrong thing (the member after an end-of-archive marker without its
ustar prefix; a bad size field read by the layout at its place in the read buffer, not in the
shard); every sample, member and other error as 980b398 gave them."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
from typing import Any, Callable, Dict, Iterator, List

import numpy as np

from dalistream.errors import DalistreamError
from dalistream.io import open_shard
from dalistream.manifest import scan_shard
from dalistream.manifest.rows import ShardRows
from dalistream.tar import iter_samples
from dalistream.tar.runs import Arena
from dalistream.tar.samples import sliced_samples
from dalistream.tar.walked import walked_runs

URL = "frozen-0000.tar"  # every reader is told this URL: the messages do not depend on the test's folder
FIXTURE = os.path.join(os.path.dirname(__file__), "data", "walks.json")


# -- the shards -------------------------------------------------------------------------------

def _bytes(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _tar(entries, fmt=tarfile.USTAR_FORMAT) -> bytes:
    """``entries``: ``(name, data)`` files, ``(name, "dir")`` folders, ``(name, "sym"|"hard")`` links,
    ``(name, data, pax)`` files with pax records of their own. Every header field fixed."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data, *pax in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1700000000
            if pax:
                info.pax_headers = dict(pax[0])
            if data == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif data in ("sym", "hard"):
                info.type = tarfile.SYMTYPE if data == "sym" else tarfile.LNKTYPE
                info.linkname = "elsewhere.jpg"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _samples(n: int, start: int = 0, prefix: str = "k") -> List[tuple]:
    """Samples of an image (0 to 3 blocks, one now and then past half a small read chunk), a
    label, a text now and then."""
    sizes = [0, 1, 511, 512, 513, 1500, 5000]
    out = []
    for i in range(start, start + n):
        size = sizes[i % len(sizes)] if i % 11 != 5 else 9000
        out.append((f"{prefix}{i:03d}.jpg", _bytes(i, size)))
        out.append((f"{prefix}{i:03d}.cls", str(i % 7).encode()))
        if i % 3 == 0:
            out.append((f"{prefix}{i:03d}.TXT", b"t" * (i * 37 % 700)))
    return out


def _offsets(raw: bytes) -> Dict[str, tuple]:
    """Each member's header offset, data offset and size, as Python's tarfile reads them."""
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return {m.name: (m.offset, m.offset_data, m.size) for m in tar.getmembers()}


def _patch(raw: bytes, at: int, data: bytes, checksum: bool = False) -> bytes:
    """``raw`` with ``data`` written at ``at``; ``checksum``: the header block there keeps a right checksum."""
    out = bytearray(raw)
    out[at:at + len(data)] = data
    if checksum:
        block = at - at % 512
        out[block + 148:block + 156] = b" " * 8
        out[block + 148:block + 156] = b"%06o\0 " % sum(out[block:block + 512])
    return bytes(out)


def shards() -> Dict[str, bytes]:
    """Every shard the readers are run over: whole ones of every shape, then damaged ones."""
    plain = _tar(_samples(9))
    out: Dict[str, bytes] = {"ustar": plain}
    out["ustar prefix"] = _tar([("d" * 120 + f"/p{i}.jpg", _bytes(i, 700)) for i in range(3)]
                               + [("d" * 120 + "/p2.cls", b"2"), ("e" * 90 + "/" + "f" * 60 + ".Seg.PNG", b"x")])
    long_names = [("l" * 150 + f"{i}.jpg", _bytes(i, 300)) for i in range(3)] + [("caf\udce9.jpg", b"c"),
                                                                                  ("caf\udce9.cls", b"1")]
    out["gnu long names"] = _tar(long_names + _samples(2), tarfile.GNU_FORMAT)
    out["pax"] = _tar(long_names + [("na\u00efve.jpg", b"n"), ("big.jpg", _bytes(7, 900), {"comment": "x" * 200})]
                      + _samples(2), tarfile.PAX_FORMAT)
    out["pax mtime"] = _tar([(n, d, {"mtime": "1700000000.25"}) for n, d in _samples(6)], tarfile.PAX_FORMAT)
    out["folders links meta"] = _tar(
        [("a", "dir"), ("a/x.jpg", b"1"), ("a/x.cls", "sym"), ("a/x.txt", b"t"), ("a/README", b"abc"),
         ("__info__/x.json", b"{}"), ("a/.DS_Store", b"ds"), ("a/y.", b"dot"), ("a/y.jpg", b"y"),
         ("a/z.jpg", "hard"), ("a/z.cls", b"3"), ("__index__", b"i"), ("b.c/d.seg.png", b"s")])
    out["duplicates"] = _tar([("k0.jpg", b"a"), ("k0.cls", b"0"), ("k1.jpg", b"b"), ("k1.jpg", b"B"), ("k1.cls", b"1"),
                              ("k0.txt", b"again"), ("k2.jpg", b"c"), ("K2.JPG", b"C"), ("k2.cls", b"2")])
    table = _offsets(plain)
    h = {name: at for name, (at, _, _) in table.items()}
    d = {name: at for name, (_, at, _) in table.items()}
    end = len(plain.rstrip(b"\0"))
    end += -end % 512
    sparse = _patch(plain, h["k004.jpg"] + 156, b"S", checksum=True)
    out["gnu sparse"] = sparse
    out["base-256 size"] = _patch(plain, h["k002.jpg"] + 124, b"\x80" + (511).to_bytes(11, "big"), checksum=True)
    for name, at in (("in the first header", 100), ("after the first header", 512), ("mid image", d["k001.jpg"] + 200),
                     ("in an image's padding", d["k002.jpg"] + 511 + 10), ("at a header", h["k003.jpg"]),
                     ("mid header", h["k004.cls"] + 300), ("in the name of a header", h["k006.jpg"] + 40),
                     ("mid large member", d["k005.jpg"] + 7000), ("after the last member", end),
                     ("in the end marker", end + 512), ("mid label of the last sample", d["k008.cls"])):
        out[f"cut {name}"] = plain[:at]
    out["cut mid large member (sparse before)"] = sparse[:d["k005.jpg"] + 7000]
    out["checksum"] = _patch(plain, h["k003.cls"] + 10, b"X")
    out["checksum of the first header"] = _patch(plain, 5, b"X")
    out["size not a number"] = _patch(plain, h["k004.jpg"] + 124, b"0000xyz0000", checksum=True)
    out["size with a nine"] = _patch(plain, h["k004.jpg"] + 124, b"00000000009", checksum=True)
    out["size base-256 negative"] = _patch(plain, h["k004.jpg"] + 124, b"\xff" * 12, checksum=True)
    out["size larger than the shard"] = _patch(plain, h["k004.jpg"] + 124, b"77777777777", checksum=True)
    out["size of a label one more"] = _patch(plain, h["k002.cls"] + 124, b"%011o" % 2, checksum=True)
    out["zero header mid shard"] = _patch(plain, h["k004.jpg"], bytes(512))
    out["two zero blocks then a header"] = _patch(plain, h["k002.cls"], bytes(1024))
    out["appended archive"] = plain + _tar(_samples(2, start=20))
    out["appended archive, a prefixed name"] = plain + out["ustar prefix"]
    out["one sample more"] = _tar(_samples(10))
    out["bytes after the end"] = plain + b"trailing garbage".ljust(512, b"\0")
    out["no tar"] = b"<html>not found</html>\n" * 40
    out["short no tar"] = b"oops"
    out["empty"] = b""
    out["misplaced header"] = _patch(plain, h["k004.jpg"] + 257, b"xstar")
    pax = out["pax mtime"]
    ptable = _offsets(pax)
    ph = {name: at for name, (at, _, _) in ptable.items()}
    out["pax mtime cut in an extended header"] = pax[:ph["k003.jpg"] - 1024 + 100]
    pax_long = out["pax"]
    first = _offsets(pax_long)
    x = min(at for at, _, _ in first.values())  # (the first member's pax header precedes it)
    out["pax malformed record"] = _patch(pax_long, x + 512, b"zz", checksum=False)
    out["pax bad size"] = _tar([("k0.jpg", b"a"), ("k1.jpg", b"b", {"size": "1"})], tarfile.PAX_FORMAT).replace(
        b"size=1\n", b"size=z\n", 1)
    out["gnu long name cut"] = out["gnu long names"][:700]
    return out


# -- the readers --------------------------------------------------------------------------------

class Trickle:
    """A stream that cannot seek and gives at most 700 bytes a read (``read`` only)."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def read(self, n: int = -1) -> bytes:
        n = 700 if n < 0 else min(n, 700)
        out = self._data[self._at:self._at + n]
        self._at += len(out)
        return out


class RawTrickle(io.RawIOBase):
    """The same as a raw stream (``readinto``), for a buffered reader over it."""

    def __init__(self, data: bytes) -> None:
        self._trickle = Trickle(data)

    def readable(self) -> bool:
        return True

    def readinto(self, view) -> int:
        out = self._trickle.read(len(view))
        view[:len(out)] = out
        return len(out)


def error_of(e: BaseException) -> Dict[str, Any]:
    return {"type": type(e).__name__, "message": str(e), "reason": getattr(e, "reason", None),
            "url": getattr(e, "url", None), "member": getattr(e, "member", None),
            "damaged": getattr(e, "damaged_member", None)}


def digest(value: Any) -> Any:
    return None if value is None else hashlib.sha1(value).hexdigest()[:12]


def sample_of(s: Dict[str, Any]) -> list:
    members = {k: digest(v) for k, v in s.items() if k[:2] != "__"}
    error = error_of(s["__error__"]) if "__error__" in s else None
    return [s["__index__"], s["__offset__"], s.get("__key__"), s["__url__"] == URL, members, error]


def record(items: Iterator[Any]) -> Dict[str, Any]:
    """What a reader gives: its samples (``index offset key``; ``run`` before those gathered in a
    run), the problems they carry, a digest of everything (members' bytes, runs' member
    positions), and the error that ended it."""
    got: List[Any] = []
    error = None
    try:
        for item in items:
            if isinstance(item, dict):
                got.append(sample_of(item))
            else:  # a run of walked samples: its samples, and where their members lie in its bytes
                got.append({"run": [sample_of(s) for s in item.samples], "first": item.first,
                            "keys": [item.key(i) for i in range(len(item))], "names": [list(n) for n in item.names],
                            "kinds": item.kinds.tolist(), "nbytes": item.nbytes, "data": digest(bytes(item.data)),
                            "members": digest(np.concatenate([item.member_at, item.member_size]).tobytes())})
    except DalistreamError as e:
        error = error_of(e)
    flat = [s for item in got for s in (item["run"] if isinstance(item, dict) else [item])]
    return {"samples": [("run " if isinstance(item, dict) else "") + " ".join(
                map(str, item["run"][0][:3] if isinstance(item, dict) else item[:3])) for item in got],
            "problems": [s[5] for s in flat if s[5] is not None], "digest": digest(json.dumps(got).encode()),
            "error": error}


WALKS: Dict[str, Callable[..., Any]] = {
    "raise": lambda f: iter_samples(f, URL),
    "skip": lambda f: iter_samples(f, URL, mark_errors=True),
    "odd, cls, lowercase": lambda f: iter_samples(f, URL, keep=lambda i: i % 2 == 1, want_ext={"cls", "txt"}.__contains__,
                                                  lowercase=True, mark_errors=True),
    "none kept": lambda f: iter_samples(f, URL, keep=lambda i: False),
    "small limit": lambda f: iter_samples(f, URL, max_member_bytes=600, mark_errors=True),
    "small limit, raise": lambda f: iter_samples(f, URL, max_member_bytes=600),
    "small chunks": lambda f: iter_samples(f, URL, mark_errors=True, chunk=8192),
    "runs": lambda f: walked_runs(iter_samples(f, URL, mark_errors=True, chunk=8192), URL, Arena(1 << 14), 4000,
                                  (1500,)),
    "runs, no arena": lambda f: walked_runs(iter_samples(f, URL, want_ext={"jpg"}.__contains__), URL, None, 1 << 20),
}


def _walks(raw: bytes, path: str) -> Dict[str, Any]:
    out = {}
    for name, walk in WALKS.items():
        with open(path, "rb") as f:
            out[name] = record(walk(f))
    out["trickle"] = record(iter_samples(io.BufferedReader(RawTrickle(raw), 1024), URL, mark_errors=True))
    out["trickle, raw"] = record(iter_samples(Trickle(raw), URL, mark_errors=True, chunk=8192))
    return out


def _sliced(raw: bytes, path: str, members, samples: int) -> Dict[str, Any]:
    """The shard's samples cut out by ``members`` (the whole shard's layout, from before any damage)."""
    rows = ShardRows.from_infos([members])
    patterns, kinds, sizes, starts = rows.members.at(0)
    out = {}
    for first, stop, kw in ((0, samples, {}), (0, samples, {"want_ext": {"jpg"}.__contains__, "lowercase": True}),
                            (2, 6, {}), (3, samples, {"chunk": 8192})):
        offset = members.offsets[first]
        with open(path, "rb") as f:
            f.seek(offset)
            out[f"sliced {first}-{stop} {sorted(kw)}"] = record(sliced_samples(
                f, URL, patterns, kinds[first:stop], sizes[starts[first]:starts[stop]], first=first, offset=offset,
                last=stop == samples, **kw))
    return out


def walks(folder: str) -> Dict[str, Any]:
    """Every shard's readings (the fixture), its shards written in ``folder``."""
    out: Dict[str, Any] = {}
    every = shards()
    layouts = {}
    for base in ("ustar", "pax mtime"):
        path = os.path.join(folder, "layout.tar")
        with open(path, "wb") as f:
            f.write(every[base])
        layouts[base] = scan_shard(path, offsets=True)
    for name, raw in every.items():
        path = os.path.join(folder, f"s{len(out)}.tar")
        with open(path, "wb") as f:
            f.write(raw)
        out[name] = _walks(raw, path)
        base = "pax mtime" if name.startswith("pax mtime") else "ustar" if name in (
            "ustar", "gnu sparse", "base-256 size", "misplaced header", "appended archive", "bytes after the end", "one sample more",
            "checksum", "size of a label one more", "zero header mid shard", "size not a number", "size with a nine",
            "size base-256 negative", "size larger than the shard") or name.startswith("cut ") else None
        if base is not None and layouts[base].members is not None:
            out[name].update(_sliced(raw, path, layouts[base], layouts[base].samples))
    plain = every["ustar"]
    for name, raw in (("gzip", gzip.compress(plain, 6, mtime=0)),
                      ("gzip without its trailer", gzip.compress(plain, 6, mtime=0)[:-4]),
                      ("gzip with bytes after it", gzip.compress(plain, 6, mtime=0) + b"junk"),
                      ("gzip cut mid stream", gzip.compress(plain, 6, mtime=0)[:2000])):
        path = os.path.join(folder, f"g{len(out)}.tar.gz")
        with open(path, "wb") as f:
            f.write(raw)
        with open_shard(path) as f:
            got = record(iter_samples(f, URL, mark_errors=True))
        if name == "gzip cut mid stream":  # (how much of a cut stream inflates is zlib's: the error only)
            got = {"error": got["error"]}
        out[name] = {"skip": got}
    for readings in out.values():  # each shard's errors written once, its readers naming theirs by number
        errors: List[Any] = []
        for got in readings.values():
            for i, problem in enumerate(got.get("problems", [])):
                got["problems"][i] = _number(errors, problem)
            got["error"] = _number(errors, got["error"])
        readings["errors"] = errors
    return out


def _number(errors: List[Any], error: Any) -> Any:
    if error is None:
        return None
    if error not in errors:
        errors.append(error)
    return errors.index(error)


def test_the_readers_give_what_they_gave_before(tmp_path):
    """Every shard, reader and option: the samples, runs and errors of the frozen expectation."""
    with open(FIXTURE) as f:
        expected = json.load(f)
    got = json.loads(json.dumps(walks(str(tmp_path))))
    assert sorted(got) == sorted(expected)
    for shard_name in expected:
        assert sorted(got[shard_name]) == sorted(expected[shard_name]), shard_name
        for reader in expected[shard_name]:
            assert got[shard_name][reader] == expected[shard_name][reader], (shard_name, reader)


if __name__ == "__main__":  # one line a shard and reader
    with tempfile.TemporaryDirectory() as folder:
        readings = walks(folder)
    sys.stdout.write("{\n" + ",\n".join(f"{json.dumps(shard)}: {{" + ", ".join(
        f"{json.dumps(reader)}: {json.dumps(got, sort_keys=True)}" for reader, got in sorted(readings[shard].items()))
        + "}" for shard in sorted(readings)) + "\n}\n")
