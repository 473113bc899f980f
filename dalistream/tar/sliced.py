"""Samples of a regular shard cut out of its bytes by the manifest's member layout, no header walk.

Where the manifest knows a shard's member layout (:mod:`dalistream.manifest.members`: each
sample's pattern of members, each behind a known number of header blocks, and every member's
size), every member lies at a known offset with a known size: :func:`sliced_samples` reads the
part's bytes in large chunks and slices them. It yields exactly what
:func:`~dalistream.tar.samples.iter_samples` yields for those samples. Of each header it reads
only the ``ustar`` magic and the size (compared with the layout's: a shard rewritten since it was
indexed shows as a misplaced header or another size) and, for a sample's first member, the name
(the sample's key); no checksum, no long-name or pax records. It also checks that the bytes are
there (a cut shard is truncated) and, after a shard's last sample, the end-of-archive marker (a
shard that gained samples; one that lost samples ends early).
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Iterator, Optional, Sequence, Tuple

import numpy as np

from ..errors import ShardFormatError
from ..io.counters import ReadClock
from .buffer import CHUNK, StreamBuffer
from .headers import BLOCK, header_name, no_end_marker, number
from .samples import Sample, split_name


def _size(arr: bytearray, at: int, url: str) -> int:
    """The size field of the header at ``arr[at:]`` (any encoding the header walk reads)."""
    return number(bytes(arr[at + 124:at + 136]), url, "size", at)


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
            if not arr_startswith(r.arr, b"%011o" % size, at + 124) and _size(r.arr, at, url) != size:
                raise ShardFormatError(
                    f"corrupt tar: the member at offset {position + skip} has {_size(r.arr, at, url)} bytes, the "
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
    header = bytes(r.view[r.pos:r.pos + n])
    if n < BLOCK and not header.strip(b"\0"):
        raise no_end_marker(url)
    if header.strip(b"\0"):
        yield {"__url__": url, "__index__": index, "__offset__": offset}
