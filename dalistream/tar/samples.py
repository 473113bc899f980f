"""A shard's samples, one by one: tar members grouped into samples by the WebDataset key rules
(:func:`iter_samples`, the header walk), or cut out of a regular shard's bytes by the manifest's
member layout (:func:`sliced_samples`, no header walk), the same samples either way.

A sample is a run of consecutive members sharing a key. As in WebDataset, the key is the
member path up to the first dot of its basename and the extension is the rest:
``a.b/c.seg.png`` has key ``a.b/c`` and extension ``seg.png``. Samples not wanted (skipped on
resume) are still numbered, but their members are passed over by header.

Where the manifest knows a shard's member layout (:mod:`dalistream.manifest.members`: each
sample's pattern of members, each behind a known number of header blocks, and every member's
size), every member lies at a known offset with a known size: :func:`sliced_samples` reads the
part's bytes in large chunks and slices them. Of each header it reads only the ``ustar`` magic
and the size (compared with the layout's: a shard rewritten since it was indexed shows as a
misplaced header or another size) and, for a sample's first member, the name (the sample's key);
no checksum, no long-name or pax records. It also checks that the bytes are there (a cut shard is
truncated) and, after a shard's last sample, the end-of-archive marker (a shard that gained
samples; one that lost samples ends early).
"""

from __future__ import annotations

import re
from typing import BinaryIO, Callable, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from ..errors import SampleError, ShardFormatError, SourceError, printable
from ..io.counters import ReadClock
from .headers import BLOCK, CHUNK, StreamBuffer, header_name, header_size, no_end_marker
from .members import walk


_META = re.compile(r"__[^/]*__($|/)")


def is_meta(name: str) -> bool:
    """WebDataset's metadata members, which belong to no sample: a path starting with a
    ``__name__`` component (``__info__/x.json``, ``__index__``)."""
    return name.startswith("__") and _META.match(name) is not None


def split_name(name: str, lowercase: bool = False) -> Tuple[str, Optional[str]]:
    """``("a.b/c", "seg.png")`` for ``"a.b/c.seg.png"``: key up to the basename's first dot and
    the rest as the extension (WebDataset's rule). A basename without a dot, or starting with one
    (``.DS_Store``), belongs to no sample: extension ``None``. A trailing dot (``a.``) gives the
    extension ``""``: the member joins sample ``a`` with no field, as in WebDataset."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        return name, None
    ext = name[dot + 1:]
    return name[:dot], (ext.lower() if lowercase else ext)


Sample = Dict[str, object]


def _whole_before(damage: BaseException, sample: Sample, lowercase: bool) -> bool:
    """Whether ``sample`` is known whole when ``damage`` ended the stream: the damage names the
    member it took (``damaged_member``: its header or data could not be read, see
    :func:`~dalistream.tar.headers.losing`), and that member is of another sample. Damage that
    cannot say what it took (zeroed blocks, a stream ending between two headers), or took a member
    of this sample, proves nothing: the sample may have had more members."""
    member = getattr(damage, "damaged_member", None)
    if member is None or is_meta(member):
        return False
    key, ext = split_name(member, lowercase)
    return ext is not None and key != sample["__key__"]  # (a member in no sample proves nothing)


def iter_samples(
    stream: BinaryIO, url: str, *, keep: Callable[[int], bool] = lambda index: True,
    want_ext: Callable[[str], bool] = lambda ext: True, lowercase: bool = False,
    max_member_bytes: int = 256 << 20, mark_errors: bool = False, first_index: int = 0,
    clock: Optional[ReadClock] = None, chunk: int = CHUNK,
) -> Iterator[Sample]:
    """Group members into samples: dicts of ``ext -> bytes`` plus ``__key__``, ``__url__``,
    ``__index__`` (sample number in the shard) and ``__offset__`` (tar offset of its first member).

    ``first_index`` numbers the first sample of a stream opened mid-shard (at a manifest offset).
    ``keep(index)`` false: the sample is still yielded (with no data) so counts and positions
    stay right, but its members are skipped by header. As in WebDataset (Python's ``tarfile``),
    only regular files make samples: links, devices and fifos are ignored, and so are members
    whose basename has no dot or starts with one, and metadata paths (:func:`is_meta`).
    Keys keep the bytes of their names (``surrogateescape``), so distinct names stay distinct.

    Problems of one sample — its key seen before in the shard (members of a sample must be
    adjacent), an extension twice in it, a member over ``max_member_bytes`` or of an unsupported
    type (GNU sparse) — raise
    :class:`SampleError`; with ``mark_errors`` the sample is yielded instead, numbered like any
    other, with the error under ``"__error__"`` (its data may be incomplete), and the shard goes
    on. Problems of the stream itself (:class:`ShardFormatError`, :class:`SourceError`) always
    raise: nothing after them can be trusted; with ``mark_errors`` the sample grouped when the
    damage came is yielded first when it is known whole (the damage names a member of another
    sample, as a damaged or cut header does when its name can be read), never one that may have
    lost members. Keys are only ever used as strings, never as paths.
    ``clock``, if given, accumulates the time spent waiting for the stream's bytes.
    """
    current: Optional[Sample] = None
    current_key: Optional[str] = None
    index = first_index - 1  # a stream opened at the offset of sample ``first_index``
    seen_keys: set = set()
    read = True
    last_name: Optional[str] = None
    last_key = last_ext = ""

    def want(name: str) -> bool:  # called by the tar walk for each member, before it is yielded
        nonlocal read, last_name, last_key, last_ext
        last_name = name
        slash = name.rfind("/")  # split_name(), inline: once per member
        dot = name.find(".", slash + 1)
        if dot <= slash + 1 or (name.startswith("__") and is_meta(name)):
            last_key, last_ext = name, None
            return False
        key, ext = last_key, last_ext = name[:dot], (name[dot + 1:].lower() if lowercase else name[dot + 1:])
        if key != current_key:
            read = keep(index + 1)
        return read and want_ext(ext)

    def problem(error: SampleError) -> None:
        if not mark_errors:
            raise error
        current.setdefault("__error__", error)  # the first problem of a sample is the one reported

    entries = walk(stream, url, want=want, max_member_bytes=max_member_bytes, mark_errors=mark_errors, clock=clock,
                   chunk=chunk)
    while True:
        try:
            name, _, offset, data, error, kind = next(entries)
        except StopIteration:
            break
        except (ShardFormatError, SourceError) as damage:
            # damage after the sample being grouped (the next member's header or data lost):
            # with mark_errors (skip) the sample is delivered before the error when it is known
            # whole -- every complete sample before the damage arrives, none with lost members
            if mark_errors and current is not None and _whole_before(damage, current, lowercase):
                yield current
            raise
        if kind:
            continue  # a link, device or fifo: in no sample (walk() never asks want() about them)
        if name is last_name:  # split once, in want()
            key, ext = last_key, last_ext
        else:
            key, ext = split_name(name, lowercase)
            if ext is not None and name.startswith("__") and is_meta(name):
                ext = None
        if ext is None:
            if isinstance(error, ShardFormatError):
                raise error
            continue
        if key != current_key:
            if current is not None:
                yield current
            index += 1
            current_key = key
            current = {"__key__": key, "__url__": url, "__index__": index, "__offset__": offset}
            if key in seen_keys:
                problem(SampleError("duplicate sample key in shard (members of one sample must be adjacent)",
                                    url=url, member=name, reason="duplicate_key",
                                    hint="write each sample's members next to each other, under a key unique in the shard"))
            seen_keys.add(key)
        if error is not None:
            if isinstance(error, ShardFormatError):
                raise error  # data cut: the sample before it was complete and has been yielded
            problem(error)
            current[ext] = None
            continue
        if ext in current:
            problem(SampleError(f"extension {printable(ext)} appears twice in sample {printable(key)}", url=url,
                                member=name, reason="duplicate_member"))
            continue
        current[ext] = data
    if current is not None:
        yield current


arr_startswith = bytearray.startswith


def _cut(what: str, offset: int, url: str) -> ShardFormatError:
    return ShardFormatError(f"truncated tar: {what} at offset {offset} (the manifest's member layout says it is there)",
                            url=url, reason="truncated", hint="re-write or re-upload the shard, or rebuild the manifest")


def sliced_samples(
    stream: BinaryIO, url: str, patterns: Sequence[Tuple[Sequence[str], Sequence[int]]], kinds: np.ndarray,
    sizes: np.ndarray, *, first: int, offset: int, want_ext: Callable[[str], bool] = lambda ext: True,
    lowercase: bool = False, last: bool = False, clock: Optional[ReadClock] = None, chunk: int = CHUNK,
) -> Iterator[Sample]:
    """Samples ``first, first + 1, …`` of a regular shard, one per entry of ``kinds`` (each sample's
    pattern: its members' extensions and header blocks, its own header the last, in ``patterns``),
    their members' sizes one after the other in ``sizes``, from ``stream`` positioned at ``offset``,
    the tar offset of sample ``first``. ``want_ext``, ``lowercase``: as for ``iter_samples``
    (members not wanted are passed over). ``last``: the part ends the shard, so the end-of-archive marker must follow; where
    another header follows instead, one more (empty) sample is yielded, numbered after the last,
    for the caller to report."""
    r = StreamBuffer(stream, url, clock, chunk)
    shapes = []
    for exts, headers in patterns:
        names = [e.lower() if lowercase else e for e in exts]
        shapes.append((names, [want_ext(e) for e in names], [BLOCK * (h - 1) for h in headers]))
    all_sizes = sizes.tolist()
    m = 0
    position = offset
    for row, kind in enumerate(kinds.tolist()):
        names, wanted, skips = shapes[kind]
        member_sizes = all_sizes[m:m + len(names)]
        m += len(names)
        sample: Sample = {"__url__": url, "__index__": first + row, "__offset__": position}
        for j, size in enumerate(member_sizes):
            skip = skips[j]  # extended headers (pax mtime) before the member's own
            if skip and r.skip(skip) < skip:
                raise _cut("member header missing", position, url)
            if r.end - r.pos < BLOCK and r.fill(BLOCK) < BLOCK:
                raise _cut("member header missing", position, url)
            at = r.pos
            if not arr_startswith(r.arr, b"ustar", at + 257):
                if j == 0 and not skip and not r.arr[at:at + BLOCK].strip(b"\0"):
                    return  # the end-of-archive marker: a shorter shard, which the caller reports
                raise ShardFormatError(
                    f"corrupt tar: no tar header at offset {position + skip}, where the manifest's member layout puts one",
                    url=url, reason="bad_tar",
                    hint="if the shard was rewritten after it was indexed, rebuild the manifest with `dalistream index`")
            if not arr_startswith(r.arr, b"%011o" % size, at + 124) and (
                    written := header_size(r.arr[at:at + BLOCK], url, position + skip)) != size:
                raise ShardFormatError(
                    f"corrupt tar: the member at offset {position + skip} has {written} bytes, the "
                    f"manifest's member layout says {size}", url=url, member=header_name(r.arr, at), reason="bad_tar",
                    hint="if the shard was rewritten after it was indexed, rebuild the manifest with `dalistream index`")
            if j == 0:
                sample["__key__"] = split_name(header_name(r.arr, at), lowercase)[0]
            r.pos = at + BLOCK
            padded = (size + BLOCK - 1) & -BLOCK
            if wanted[j]:
                start = r.pos
                if r.end - start >= padded:
                    r.pos = start + padded
                    sample[names[j]] = bytes(r.view[start:start + size])
                else:
                    data = r.take(size)
                    if len(data) < size or r.skip(padded - size) < padded - size:
                        raise _cut(f"member data cut after {len(data)} of {size} bytes", position, url)
                    sample[names[j]] = data
            else:
                if r.skip(padded) < padded:
                    raise _cut(f"member data cut ({size} bytes)", position, url)
                sample[names[j]] = None  # passed over, as the header walk leaves it
            position += skip + BLOCK + padded
        yield sample
    if last:
        yield from after_last(r, url, first + len(kinds), position)


def after_last(r: StreamBuffer, url: str, index: int, offset: int) -> Iterator[Sample]:
    """What follows a shard's last counted sample (at ``offset``, read by ``r``): the
    end-of-archive marker (nothing), or another header: one more (empty) sample numbered
    ``index``, for the caller to report; bytes ending there instead are a truncated shard."""
    n = min(r.fill(BLOCK), BLOCK)
    if r.arr[r.pos:r.pos + n].strip(b"\0"):
        yield {"__url__": url, "__index__": index, "__offset__": offset}
    elif n < BLOCK:
        raise no_end_marker(url)
