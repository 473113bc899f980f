"""A whole shard's tar headers at once: what the scan that counts a shard needs, found with little
Python per member.

:func:`read_headers` walks from header to header (a local file through its mapping, reading no
member data; any other stream in large pieces), keeping each header block and little else, and
checks the headers' checksums and reads their names with array operations over a batch of them at
once;
:func:`group_samples` groups the members into samples by WebDataset's key rules
(:mod:`.samples`). They find what the sequential reader (:func:`~.members.walk`,
:func:`~.samples.iter_samples`) finds, on every archive: the same members, names, sizes, offsets and
samples. Anything the reader would refuse (a damaged or cut header, a cut member, a lone zero block,
a duplicate key, …) is a :class:`Problem`, which the caller answers by reading the shard with the
reader, whose error names the shard and the member where the damage lies (:func:`reader_error`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import BinaryIO, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DalistreamError, ShardFormatError
from .headers import BLOCK, EXTENDED, REGULAR, SPARSE, ZERO, Extended, checksum_ok, header_name, header_size
from .samples import is_meta

_FILES = np.array(sorted(REGULAR), np.uint8)
_PIECE = 1 << 20  # bytes read at a time from a stream
_POWERS = 8 ** np.arange(5, -1, -1, dtype=np.int64)  # a "%06o" checksum's digits
_BATCH = 1 << 16  # header blocks checked and read at once (then let go: a shard's memory is not 512 bytes a member)


class Problem(Exception):
    """Something the sequential reader refuses, found at ``offset`` (the reader names it)."""

    def __init__(self, what: str, offset: int, member: Optional[str] = None) -> None:
        super().__init__(what)
        self.what, self.offset, self.member = what, offset, member


@dataclass
class Headers:
    """A shard's members, one entry per member header (extended headers belong to the entry they
    precede): ``starts`` where its first header block lies, ``data`` where its data begin,
    ``sizes``, ``kinds`` (the type flag), ``names`` (long-name and pax ``path`` records applied),
    ``renamed`` (its name came from such a record), ``sliceable`` (a regular file behind a
    header with the ``ustar`` magic), ``sparse`` (a GNU sparse member); ``end``: the offset of the
    end-of-archive marker."""

    starts: np.ndarray
    data: np.ndarray
    sizes: np.ndarray
    kinds: np.ndarray
    names: List[str]
    renamed: np.ndarray
    sliceable: np.ndarray
    sparse: np.ndarray
    end: int

    def files(self) -> np.ndarray:
        """Which entries are files that may be in a sample (links, devices, fifos and folders are not)."""
        return np.isin(self.kinds, _FILES) | self.sparse


class _Bytes:
    """The shard's bytes: a local file's mapping, whole, or a stream read in pieces (what lies
    before the position asked for is let go)."""

    def __init__(self, view: Optional[memoryview], stream: Optional[BinaryIO]) -> None:
        self.stream = stream
        self.buf = view if view is not None else memoryview(b"")
        self.lo = 0  # the offset of buf[0]
        self.eof = view is not None
        self.seekable = False
        if stream is not None:
            try:
                self.seekable = stream.seekable()
            except (AttributeError, OSError, ValueError):
                pass

    def window(self, pos: int, n: int) -> int:
        """Make ``buf`` hold bytes ``pos`` to ``pos + n`` (fewer only where the shard ends); the
        index of ``pos`` in it."""
        have = self.lo + len(self.buf)
        if self.eof or pos + n <= have:
            return pos - self.lo
        kept = bytes(self.buf[pos - self.lo:]) if pos < have else b""
        if pos > have:  # member data never needed: passed over
            self._skip(pos - have)
        parts = [kept]
        got = len(kept)
        while got < n:
            piece = self._read(max(n - got, _PIECE))
            if not piece:
                self.eof = True
                break
            parts.append(piece)
            got += len(piece)
        self.buf, self.lo = memoryview(b"".join(parts)), pos
        return 0

    def _read(self, n: int) -> bytes:
        try:
            return self.stream.read(n)
        except (OSError, EOFError, zlib.error, DalistreamError) as e:
            raise Problem(f"read error ({type(e).__name__})", self.lo + len(self.buf)) from None

    def _skip(self, n: int) -> None:
        if self.seekable:
            try:
                self.stream.seek(n, 1)
                return
            except (OSError, ValueError):
                pass  # (then read over them)
        while n > 0:
            piece = self._read(min(n, _PIECE))
            if not piece:
                self.eof = True
                return
            n -= len(piece)


def read_headers(view: Optional[memoryview], stream: Optional[BinaryIO] = None) -> Headers:
    """Every member header of a tar: from ``view`` (a whole local file's bytes, mapped), else from
    ``stream`` (read once, sequentially). Raises :class:`Problem` where the sequential reader
    raises an error."""
    src = _Bytes(view, stream)
    buf, lo = src.buf, src.lo
    hi = lo + len(buf)
    blocks: List[bytes] = []  # each member's own header block, until a batch of them is read
    batches = _Read()
    at: List[int] = []  # where it lies
    sizes: List[int] = []
    extended: List[bytes] = []  # the extended headers' blocks (their checksums are checked too)
    starts: Dict[int, int] = {}  # a member behind extended headers: where they start
    data: Dict[int, int] = {}  # a member whose data do not follow its header (old GNU sparse maps)
    renames: Dict[int, str] = {}
    sparse: List[int] = []
    pos = 0
    pending = Extended()  # the extended headers before a member
    while True:
        if pos + BLOCK > hi:  # (a local file: only at its end)
            src.window(pos, BLOCK)
            buf, lo = src.buf, src.lo
            hi = lo + len(buf)
            if pos + BLOCK > hi:
                raise Problem("the shard ends before its end-of-archive marker", pos)
        header = bytes(buf[pos - lo:pos - lo + BLOCK])
        if header[0] == 0 and header == ZERO:
            _check_end(src, pos)
            break
        text = header[124:135]
        size = -1
        if header[135] in (0, 32) and text.isdigit():  # header_size()'s usual case inline (a call: +3% a member)
            try:
                size = int(text, 8)
            except ValueError:
                pass
        if size < 0:
            try:
                size = header_size(header, "", pos)
            except DalistreamError:
                raise Problem("bad size field", pos) from None
        padded = (size + BLOCK - 1) & -BLOCK
        kind = header[156]
        if pending.start is None and kind not in EXTENDED and kind != SPARSE:  # the usual member
            blocks.append(header)
            if len(blocks) == _BATCH:
                blocks = batches.add(blocks)
            at.append(pos)
            sizes.append(size)
            pos += BLOCK + padded
            continue
        if kind in EXTENDED:
            extended.append(header)
            if len(extended) == _BATCH:
                extended = _checksums(extended)
            try:
                pending.check(size, "", pos)
            except DalistreamError:
                raise Problem("implausible extended header", pos) from None
            i = src.window(pos + BLOCK, padded)
            if len(src.buf) - i < padded:
                raise Problem("extended header cut", pos)
            try:
                pending.add(kind, bytes(src.buf[i:i + size]), "", pos)
            except DalistreamError:
                raise Problem("malformed pax header", pos) from None
            buf, lo = src.buf, src.lo
            hi = lo + len(buf)
            pos += BLOCK + padded
            continue
        entry = len(at)
        blocks.append(header)
        if len(blocks) == _BATCH:
            blocks = batches.add(blocks)
        at.append(pos)
        name: Optional[str] = None
        is_sparse = kind == SPARSE
        if pending.start is not None:
            try:
                starts[entry], name, size, pax_sparse = pending.apply(None, size, "")
            except DalistreamError:
                raise Problem("bad size in pax header", pos) from None
            padded = (size + BLOCK - 1) & -BLOCK
            is_sparse = is_sparse or pax_sparse
        if name is not None:
            renames[entry] = name
        if is_sparse:
            sparse.append(entry)
        sizes.append(size)
        pos += BLOCK
        if kind == SPARSE:  # old GNU sparse: the map goes on in extension blocks before the data
            more = header[482]
            while more:
                i = src.window(pos, BLOCK)
                if len(src.buf) - i < BLOCK:
                    raise Problem("sparse map cut", pos)
                more = src.buf[i + 504]
                pos += BLOCK
            buf, lo = src.buf, src.lo
            hi = lo + len(buf)
            data[entry] = pos
        pos += padded
    _checksums(extended)
    batches.add(blocks)
    return batches.headers(at, sizes, starts, data, renames, sparse, pos)


def _check_end(src: _Bytes, pos: int) -> None:
    """Only zeros from the zero block at ``pos`` to the shard's end (else a lone zero block, or
    bytes after the end-of-archive marker)."""
    at = pos
    while True:
        i = src.window(at, _PIECE)
        rest = np.frombuffer(src.buf[i:], np.uint8)
        if rest.any():
            raise Problem("a zero block followed by more than zeros", pos)
        if src.eof:
            return
        at += len(rest)


class _Read:
    """The members' header blocks read a batch at a time: each checked, then what the entries
    keep of it (type flag, ``ustar`` magic, name) kept, and the blocks let go."""

    def __init__(self) -> None:
        self.kinds: List[np.ndarray] = []
        self.ustar: List[np.ndarray] = []
        self.names: List[str] = []

    def add(self, blocks: List[bytes]) -> List[bytes]:
        """Read ``blocks``; a new empty list for the next ones."""
        if blocks:
            m = np.frombuffer(b"".join(blocks), np.uint8).reshape(-1, BLOCK)
            _checksums(blocks, m)
            ustar = (m[:, 257:262] == np.frombuffer(b"ustar", np.uint8)).all(axis=1)
            self.kinds.append(m[:, 156].copy())
            self.ustar.append(ustar)
            self.names += _names(m, ustar)
        return []

    def headers(self, at: List[int], sizes: List[int], starts: Dict[int, int], data: Dict[int, int],
                renames: Dict[int, str], sparse: List[int], end: int) -> Headers:
        """The entries (extended headers' starts, data that do not follow their header, names from
        records, sparse members given by entry)."""
        header_at = np.asarray(at, np.int64)
        begins, data_at = header_at.copy(), header_at + BLOCK
        begins[list(starts)] = list(starts.values())
        data_at[list(data)] = list(data.values())
        kinds = np.concatenate(self.kinds) if self.kinds else np.zeros(0, np.uint8)
        ustar = np.concatenate(self.ustar) if self.ustar else np.zeros(0, bool)
        is_sparse = np.zeros(len(at), bool)
        is_sparse[sparse] = True
        renamed = np.zeros(len(at), bool)
        renamed[list(renames)] = True
        for entry, name in renames.items():
            self.names[entry] = name
        sliceable = np.isin(kinds, _FILES) & ~is_sparse & ustar
        return Headers(begins, data_at, np.asarray(sizes, np.int64), kinds, self.names, renamed, sliceable, is_sparse,
                       end)


def _checksums(blocks: List[bytes], h: Optional[np.ndarray] = None) -> List[bytes]:
    """Raise :class:`Problem` unless every header block (``h``: them as rows) carries its own
    checksum (:func:`~.headers.checksum_ok`: the usual field at once, any other one by one); a new
    empty list for the next ones."""
    if not blocks:
        return []
    if h is None:
        h = np.frombuffer(b"".join(blocks), np.uint8).reshape(-1, BLOCK)
    field = h[:, 148:154]
    digits = field - np.uint8(48)  # (wraps below "0": no digit)
    usual = (h[:, 154] == 0) & (digits <= 9).all(axis=1)  # "%06o\0": as checksum_ok() reads it
    stored = digits.astype(np.int32) @ _POWERS.astype(np.int32)
    total = h.sum(axis=1, dtype=np.uint32).astype(np.int32) - h[:, 148:156].sum(axis=1, dtype=np.int32) + 8 * 32
    ok = (stored == total) & (digits < 8).all(axis=1)  # (an 8 or a 9: no octal number)
    if (usual & ~ok).any() or not all(checksum_ok(blocks[r]) for r in np.flatnonzero(~usual).tolist()):
        raise Problem("header checksum mismatch", 0)
    return []


def _names(m: np.ndarray, ustar: np.ndarray) -> List[str]:
    """Each header's name (:func:`~.headers.header_name`)."""
    field = m[:, :100]
    nul = field == 0
    first = np.where(nul.any(axis=1), nul.argmax(axis=1), 100)
    # a name field with bytes after its first NUL, or a ustar prefix: read one by one
    odd = (np.count_nonzero(field, axis=1) != first) | ((m[:, 345] != 0) & ustar & (m[:, 262] == 0))
    names = np.ascontiguousarray(field).view("S100")[:, 0].tolist()  # (NULs at the end dropped)
    out = [n.decode("utf-8", "surrogateescape") for n in names]
    for r in np.flatnonzero(odd).tolist():
        out[r] = header_name(m[r].tobytes())
    return out


def group_samples(headers: Headers, lowercase: bool = False) -> Tuple[np.ndarray, np.ndarray, List[Optional[str]]]:
    """The samples of a shard by WebDataset's key rules (:func:`~.samples.iter_samples`): each
    sample's offset, each entry's sample (``-1``: in none) and extension (as written; ``None``:
    in no sample). Raises :class:`Problem` where the reader raises (a key seen before in the
    shard, an extension twice in a sample)."""
    files = headers.files().tolist()
    starts = headers.starts.tolist()
    sample_of: List[int] = []
    exts: List[Optional[str]] = []
    offsets: List[int] = []
    seen: set = set()
    key = None
    held: List[str] = []  # the extensions of the sample being grouped (lowercased with ``lowercase``)
    for j, name in enumerate(headers.names):
        slash = name.rfind("/")  # split_name(), inline (a call: +3% a member)
        dot = name.find(".", slash + 1)
        if not files[j] or dot <= slash + 1 or (name[:2] == "__" and is_meta(name)):
            sample_of.append(-1)
            exts.append(None)
            continue
        k, ext = name[:dot], name[dot + 1:]
        if k != key:
            if k in seen:
                raise Problem("duplicate sample key", starts[j], name)
            seen.add(k)
            key = k
            offsets.append(starts[j])
            held = []
        folded = ext.lower() if lowercase else ext
        if folded in held:
            raise Problem("an extension twice in a sample", starts[j], name)
        held.append(folded)
        sample_of.append(len(offsets) - 1)
        exts.append(ext)
    return np.asarray(offsets, np.int64), np.asarray(sample_of, np.int64), exts


def reader_error(stream: BinaryIO, url: str, problem: Problem, lowercase: bool = False) -> DalistreamError:
    """The error of the sequential reader (:func:`~.samples.iter_samples`) on ``stream``, a shard
    in which :func:`read_headers` or :func:`group_samples` found ``problem``: the same error a
    worker meets, naming the shard and the member."""
    from .samples import iter_samples

    try:
        for _ in iter_samples(stream, url, keep=lambda index: False, lowercase=lowercase):
            pass
    except DalistreamError as e:
        return e
    # (the reader found nothing amiss: say what the index found)
    return ShardFormatError(f"corrupt tar: {problem.what} at offset {problem.offset}", url=url, member=problem.member,
                            reason="bad_tar", hint="the shard is damaged: re-write or re-upload it")
