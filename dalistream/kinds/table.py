"""The table of field kinds: one object per kind says everything the data path does with it.

A :class:`Kind` holds, for a field of that kind (a :class:`~dalistream.config.Field`):

- **which fields are of it**: the extensions that make a field of this kind when the user gives
  only extensions (``claims``, with ``dtype``/``ndim``), the keys a dict spec must give
  (``requires``), and :meth:`~Kind.check` of a field;
- **how it is parsed per sample** (:meth:`~Kind.parse`: a member's bytes, or for a kind that
  reads no member the sample's metadata, to an array; a :class:`Problem` names the reason a bad
  one is skipped under) **and per run** (:meth:`~Kind.parse_run`: a run's members of the field
  at once, rows that do not pass marked for the per-sample path);
- **how it travels** from worker to graph (:meth:`~Kind.travels`: one ``"blob"`` of bytes
  rows, a ``"dense"`` array of scalars, or ``"rows"``, one array per position);
- **how it merges** in the graph (:meth:`~Kind.merge`: ``"sum"`` of scalars, ``"concat"`` of
  one-dimensional rows, or ``"owner"``: DALI's conditionals pick the owning worker's value);
- **how it becomes torch** when returned as read (:meth:`~Kind.to_torch`, for kinds with a
  ``raw`` form; others become tensors).

Adding a kind is one entry in :data:`KINDS` here (or :func:`register` for a kind of one's own,
defined where it is used: it must exist in the DALI workers too, so under ``spawn`` it must be
registered at import of a module they import). Nothing else in the library names a kind.
"""

from __future__ import annotations

import io
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..errors import ConfigError
from .audio import AUDIO_EXTS, Crops, audio_problem
from .images import image_problem, images_bad, is_image_ext
from .video import VIDEO_EXTS, Clips
from .values import INT64_MAX, INT64_MIN, fitted, parse_ints

BULK_ROWS = 32  # fewer rows are checked one by one: array operations cost more than they save there


class Problem(ValueError):
    """Member bytes a kind refuses: ``text`` (after ``field 'name'``), the skip's ``reason``, a hint."""

    def __init__(self, text: str, reason: str = "bad_value", hint: Optional[str] = None) -> None:
        super().__init__(text)
        self.reason, self.hint = reason, hint


class Cells:
    """A run's members of one field, for :meth:`Kind.parse_run`: the run's bytes (``data`` as
    ``uint8``, ``view``), each row's member at ``data[starts[i]:starts[i] + lengths[i]]``, its
    extension (:meth:`ext`), the kind's :meth:`~Kind.member_flag` for it (``flags``), the sample's
    metadata (:meth:`meta`), ``bad`` (rows the per-sample path settles: a kind marks more), and
    ``bulk`` (enough rows for array operations to pay), and the ``epoch`` they are read in."""

    __slots__ = ("data", "view", "starts", "lengths", "flags", "bad", "bulk", "ext", "meta", "epoch")

    def __init__(self, data: np.ndarray, view: memoryview, starts: np.ndarray, lengths: np.ndarray,
                 flags: np.ndarray, bad: np.ndarray, ext: Callable[[int], str], meta: Callable[[int, str], str],
                 epoch: int = 0) -> None:
        self.data, self.view, self.starts, self.lengths = data, view, starts, lengths
        self.flags, self.bad, self.bulk = flags, bad, len(starts) >= BULK_ROWS
        self.ext, self.meta, self.epoch = ext, meta, epoch

    def __len__(self) -> int:
        return len(self.starts)

    def row(self, i: int) -> bytes:
        a = int(self.starts[i])
        return bytes(self.view[a:a + int(self.lengths[i])])


class Kind:
    """A field kind (see the module doc); the defaults serve a kind whose members become arrays."""

    name = ""
    claims: frozenset = frozenset()  # extensions that make a field of this kind by default
    dtype, ndim = "uint8", 1  # what such a field gets
    requires: tuple = ()  # the keys a dict spec of this kind must give
    reads_members = True  # False: its value comes from the sample's metadata (``exts[0]`` names it)
    raw = False  # True: returned as read, it reaches torch by :meth:`to_torch`, not as a tensor

    def check(self, field: Any) -> None:
        """Raise :class:`~dalistream.errors.ConfigError` for a field this kind cannot serve."""

    def parse(self, field: Any, data: bytes, ext: str) -> np.ndarray:
        """One sample's value from its member's bytes (extension ``ext``); a :class:`Problem` or
        any exception refuses it."""
        raise NotImplementedError

    def parse_at(self, field: Any, data: bytes, ext: str, key: str, epoch: int) -> np.ndarray:
        """:meth:`parse` of the member of sample ``key`` read in ``epoch``: for a kind whose value
        depends on them (a video clip's frames); the default ignores them."""
        return self.parse(field, data, ext)

    def member_flag(self, field: Any, ext: str) -> bool:
        """A per-member flag :meth:`parse_run` gets in ``cells.flags`` (the bytes kind: an image)."""
        return False

    def parse_run(self, field: Any, cells: Cells) -> list:
        """The field's values for a run's rows; rows refused are marked in ``cells.bad`` (their
        entries are placeholders), and the per-sample path settles them alone."""
        column: List[Any] = [None] * len(cells)
        for i in np.flatnonzero(~cells.bad).tolist():
            try:
                column[i] = self.parse(field, cells.row(i), cells.ext(i))
            except Exception:  # noqa: BLE001 - settled alone, where the error is named
                cells.bad[i] = True
        return column

    def travels(self, field: Any) -> str:
        """``"blob"``, ``"dense"`` or ``"rows"`` (module doc)."""
        return "dense" if field.ndim == 0 else "rows"

    def merge(self, field: Any) -> str:
        """``"sum"``, ``"concat"`` or ``"owner"`` (module doc)."""
        if field.ndim == 0 and np.issubdtype(np.dtype(field.dtype), np.integer):
            return "sum"  # every worker but the owner gives 0
        return "concat" if field.ndim == 1 else "owner"  # every worker but the owner gives nothing

    def to_torch(self, rows: Sequence[np.ndarray]) -> list:
        """A raw field's rows as the training loop gets them."""
        return [np.asarray(r).tobytes() for r in rows]


def _fits(field: Any, value: np.ndarray) -> np.ndarray:
    if value.ndim != field.ndim:
        raise ValueError(f"expected {field.ndim} dimensions, got shape {value.shape}")
    return fitted(value, np.dtype(field.dtype))


class BytesKind(Kind):
    """Raw bytes, ``uint8`` 1-D (images for DALI's decoders, ``txt``/``json`` captions); a member
    whose extension names an image (``jpg``, ``png``, …) is checked cheaply first
    (:func:`~.images.image_problem`), so that a cut or random file is skipped or named here, not
    inside DALI's decoder, which kills the pipeline without saying which sample it was."""

    name, raw = "bytes", True

    def parse(self, field: Any, data: bytes, ext: str) -> np.ndarray:
        if is_image_ext(ext):
            problem = image_problem(data)
            if problem is not None:
                raise Problem(f"is not a decodable image: {problem}", "bad_image",
                              hint="re-encode or remove the image, or use on_error='skip'")
        return np.frombuffer(data, np.uint8)

    def member_flag(self, field: Any, ext: str) -> bool:
        return is_image_ext(ext)

    def parse_run(self, field: Any, cells: Cells) -> list:
        data = cells.data  # (rows as array views, as decoded alone: unlike memoryviews, arrays are
        # not tracked by the garbage collector, whose scans many live rows would slow down)
        rows = [data[a:a + m] for a, m in zip(cells.starts.tolist(), cells.lengths.tolist())]
        check = cells.flags & ~cells.bad
        if check.any():
            cells.bad[images_bad(data, cells.starts, cells.lengths, check, bulk=cells.bulk)] = True
        return rows

    def travels(self, field: Any) -> str:
        return "blob" if field.ndim == 1 and np.dtype(field.dtype) == np.uint8 else super().travels(field)


class IntKind(Kind):
    """An ASCII integer (``cls``) as a 0-d ``int64``; a run's plain decimals parsed as one array."""

    name, claims, dtype, ndim = "int", frozenset({"cls", "cls2", "index", "inx", "id"}), "int64", 0

    def parse(self, field: Any, data: bytes, ext: str) -> np.ndarray:
        text = data.strip()
        try:
            return np.array(int(text), np.int64)
        except ValueError:
            raise ValueError(f"label {text[:40]!r} is not an integer") from None

    def parse_run(self, field: Any, cells: Cells) -> list:
        n, bad = len(cells), cells.bad
        values, wrong = (parse_ints(cells.data, cells.starts, cells.lengths) if cells.bulk
                         else (np.zeros(n, np.int64), np.ones(n, bool)))
        column = values.tolist()
        for i in np.flatnonzero(wrong & ~bad).tolist():  # not plain decimal: int() as read alone, if it can
            try:
                value = int(cells.row(i))
            except ValueError:
                value = None
            if value is None or not INT64_MIN <= value <= INT64_MAX:
                bad[i] = True  # (read alone, it is named)
            else:
                column[i] = value
        return column


class NpyKind(Kind):
    """``numpy.load`` of the member (no pickles), of the field's ``dtype`` and ``ndim``."""

    name, claims, requires = "npy", frozenset({"npy"}), ("dtype", "ndim")

    def parse(self, field: Any, data: bytes, ext: str) -> np.ndarray:
        return _fits(field, np.load(io.BytesIO(data), allow_pickle=False))


class CustomKind(Kind):
    """``decoder(bytes) -> array`` of the field's ``dtype`` and ``ndim`` (it must pickle with dill)."""

    name = "custom"

    def check(self, field: Any) -> None:
        if field.decoder is None:
            raise ConfigError(f"field {field.name!r}: kind 'custom' needs a decoder")

    def parse(self, field: Any, data: bytes, ext: str) -> np.ndarray:
        return _fits(field, np.asarray(field.decoder(data)))


class MetaKind(Kind):
    """A sample's ``__key__``, ``__url__`` or ``__source__`` (a mix's source name; empty otherwise)
    as ``uint8`` bytes, ``str`` in torch."""

    name, claims, reads_members, raw = "meta", frozenset({"__key__", "__url__", "__source__"}), False, True

    def parse(self, field: Any, data: bytes, ext: str) -> np.ndarray:
        return np.frombuffer(data, np.uint8)

    def parse_run(self, field: Any, cells: Cells) -> list:
        name = field.exts[0]
        return [np.frombuffer(cells.meta(i, name).encode("utf-8", "surrogateescape"), np.uint8)
                for i in range(len(cells))]

    def travels(self, field: Any) -> str:
        return "blob"

    def to_torch(self, rows: Sequence[np.ndarray]) -> list:
        return [np.asarray(r).tobytes().decode("utf-8", "surrogateescape") for r in rows]


class _MediaKind(Kind):
    """A kind whose members are encoded media: checked in the worker (:meth:`problem`), then
    their bytes, or what the field's ``decoder`` (called with the bytes, the sample's key and the
    epoch) makes of them."""

    raw, reason, hint = True, "bad_value", None

    decoders: tuple = ()  # the classes a field's ``decoder`` may be, for this kind

    def check(self, field: Any) -> None:
        if field.decoder is not None and not isinstance(field.decoder, self.decoders):
            raise ConfigError(f"field {field.name!r}: a {self.name} field's decoder is one of "
                              f"{[c.__name__ for c in self.decoders]}, got {field.decoder!r}")
        ndim = 1 if field.decoder is None else getattr(field.decoder, "ndim", 1)
        if field.ndim != ndim or np.dtype(field.dtype) != np.uint8:
            raise ConfigError(f"field {field.name!r}: a {self.name} field with decoder {field.decoder!r} is uint8 "
                              f"of ndim {ndim}, got {field.dtype} of ndim {field.ndim}")

    def problem(self, field: Any, data: bytes) -> Optional[str]:
        """What is wrong with a member, or ``None``."""
        return None

    def parse(self, field: Any, data: bytes, ext: str) -> np.ndarray:
        if field.decoder is not None:  # (its value depends on the sample's key and epoch: never drawn without them)
            raise TypeError(f"field {field.name!r}: a {self.name} field with a decoder is parsed by parse_at")
        return self.parse_at(field, data, ext, "", 0)

    def parse_at(self, field: Any, data: bytes, ext: str, key: str, epoch: int) -> np.ndarray:
        problem = self.problem(field, data)
        if problem is not None:
            raise Problem(problem, self.reason, hint=self.hint)
        if field.decoder is None:
            return np.frombuffer(data, np.uint8)
        try:
            return _fits(field, np.asarray(field.decoder(data, key, epoch)))
        except ValueError as e:
            raise Problem(str(e), getattr(e, "reason", self.reason), hint=getattr(e, "hint", None) or self.hint) from None

    def parse_run(self, field: Any, cells: Cells) -> list:
        column: List[Any] = [None] * len(cells)
        for i in np.flatnonzero(~cells.bad).tolist():
            try:
                column[i] = self.parse_at(field, cells.row(i), cells.ext(i), cells.meta(i, "__key__"), cells.epoch)
            except Exception:  # noqa: BLE001 - settled alone, where the error is named
                cells.bad[i] = True
        return column

    def travels(self, field: Any) -> str:
        return "blob" if field.ndim == 1 and np.dtype(field.dtype) == np.uint8 else super().travels(field)

    def to_torch(self, rows: Sequence[np.ndarray]) -> list:
        return [np.asarray(r).tobytes() if np.ndim(r) == 1 else np.asarray(r) for r in rows]


class VideoKind(_MediaKind):
    """An encoded video (``mp4``, ``webm``, ``mkv``, ``mov``), as bytes; with a
    :class:`~dalistream.kinds.video.Clips` as the field's ``decoder``, a clip of it (probed in
    the worker: a damaged one is ``bad_video``, a codec DALI's CPU decoder refuses
    ``unsupported_codec``; see :mod:`dalistream.kinds.video`)."""

    name, claims, reason, decoders = "video", VIDEO_EXTS, "bad_video", (Clips,)
    hint = "re-encode or remove the video, or use on_error='skip'"

    def problem(self, field: Any, data: bytes) -> Optional[str]:
        return "is empty (0 bytes)" if not data else None


class AudioKind(_MediaKind):
    """Encoded audio (``wav``, ``flac``, ``ogg``, ``mp3``) for DALI's audio decoder, checked cheaply
    (:func:`~dalistream.kinds.audio.audio_problem`: a damaged one is ``bad_audio``); with a
    :class:`~dalistream.kinds.audio.Crops` as the field's ``decoder``, its crop's start first."""

    name, claims, reason, decoders = "audio", AUDIO_EXTS, "bad_audio", (Crops,)
    hint = "re-encode or remove the audio file, or use on_error='skip'"

    def problem(self, field: Any, data: bytes) -> Optional[str]:
        problem = audio_problem(data)
        return None if problem is None else f"is not decodable audio: {problem}"


#: Every kind by name, in the order :func:`kind_for` asks them to claim a field's extensions.
KINDS: Dict[str, Kind] = {k.name: k for k in (MetaKind(), IntKind(), NpyKind(), CustomKind(), VideoKind(),
                                              AudioKind(), BytesKind())}
DEFAULT = "bytes"  # the kind of a field whose extensions no kind claims


def register(kind: Kind) -> Kind:
    """Add ``kind`` to :data:`KINDS` (a kind of one's own); it replaces one of the same name."""
    if not isinstance(kind, Kind) or not kind.name:
        raise ConfigError(f"a field kind is a named dalistream.kinds.Kind, got {kind!r}")
    KINDS[kind.name] = kind
    return kind


def kind_for(exts: Sequence[str]) -> Kind:
    """The kind a field of only extensions gets: the first whose ``claims`` hold them all
    (case-insensitive), else :data:`DEFAULT`."""
    lowered = {e.lower() for e in exts}
    for kind in KINDS.values():
        if kind.claims and lowered <= kind.claims:
            return kind
    return KINDS[DEFAULT]
