"""Samples to arrays one at a time: each field's member found (its extensions in order, a
gzipped member unzipped), parsed by the field's kind (:mod:`dalistream.kinds`), and the
missing-field policy.

Nothing here touches DALI: a sample (``ext -> bytes`` dict from :mod:`dalistream.tar`) becomes a
tuple of numpy arrays, one per :class:`~dalistream.config.Field`, ready to be placed in a slot.
"""

from __future__ import annotations

import difflib
import gzip
import zlib
from typing import Optional, Sequence, Tuple

import numpy as np

from ..config import Field
from ..errors import DalistreamError, SampleError
from ..kinds import Problem


class FieldDecoder:
    """Decodes samples into one array per field, applying the missing-field policy.

    ``missing``: ``"error"`` raises :class:`SampleError` naming URL and key, ``"skip"`` returns
    ``None`` (the caller counts it), ``"empty"`` puts the field's empty value in its place.

    What the field's kind refuses is a :class:`SampleError` naming shard and key, with the kind's
    reason (``"bad_image"`` for the bytes kind's image check: to pass image bytes on unchecked,
    declare the field with ``kind="custom", decoder=lambda b: np.frombuffer(b, np.uint8)``), or
    ``"bad_value"``.
    """

    def __init__(self, fields: Sequence[Field], missing: str = "error") -> None:
        self.fields = tuple(fields)
        self.missing = missing
        self.epoch = 0  # the epoch read now (set by the worker at each epoch's start): what a kind's values may depend on
        exts = {e for f in self.fields for e in f.exts}
        self.exts = frozenset(exts | {e + ".gz" for e in exts})
        # wants(ext): True if members with this extension are needed (others are skipped unread);
        # the set's own method, called once per tar member: no Python frame
        self.wants = self.exts.__contains__

    def decode(self, sample: dict, source: str = "") -> Optional[Tuple[np.ndarray, ...]]:
        """One array per field, or ``None`` when the sample is to be skipped; ``source``: the name
        of the mix's source it comes from (a ``__source__`` field's value)."""
        out = []
        for field in self.fields:
            value = self._one(field, sample, source)
            if value is None:
                if self.missing == "error":
                    raise SampleError(self._missing(field, sample), url=sample.get("__url__"),
                                      member=sample.get("__key__"), reason="missing_field",
                                      hint=self._case_hint(field, sample) or self._typo_hint(field, sample)
                                      or "if some samples lack this member on purpose, use missing='skip' or "
                                         "missing='empty' to accept them")
                if self.missing == "skip":
                    return None
                value = field.empty
            out.append(value)
        return tuple(out)

    def describe_missing(self, sample: dict) -> str:
        """What a sample lacks (the first field without a member), with the ``lowercase_ext`` hint
        when a member differs from a wanted extension only in case."""
        for field in self.fields:
            if field.spec.reads_members and not any(sample.get(e) is not None or sample.get(e + ".gz") is not None
                                                for e in field.exts):
                hint = self._case_hint(field, sample)
                return f"{self._missing(field, sample)} in shard {sample.get('__url__')}" + (f": {hint}" if hint else "")
        return "a field is missing"

    @staticmethod
    def _missing(field: Field, sample: dict) -> str:
        wanted = "/".join("." + e for e in field.exts)
        present = sorted(k for k in sample if not k.startswith("__"))
        return f"sample {sample.get('__key__')!r} has no member for field {field.name!r} (looked for {wanted}; it has {present})"

    @staticmethod
    def _case_hint(field: Field, sample: dict) -> Optional[str]:
        wanted = {e.lower() for e in field.exts}
        other_case = sorted(k for k in sample if not k.startswith("__") and k.lower() in wanted and k not in field.exts)
        if not other_case:
            return None
        return (f"its member extension {', '.join('.' + k for k in other_case)} differs only in case: pass "
                "lowercase_ext=True to match extensions case-insensitively")

    @staticmethod
    def _typo_hint(field: Field, sample: dict) -> Optional[str]:
        """A member extension close to a wanted one (``jpg`` for ``jpeg``, ``cls`` for ``class``):
        most likely a typo in ``fields``, which no missing-policy would mend."""
        present = [k for k in sample if not k.startswith("__") and k]
        close = sorted({m for e in field.exts for m in difflib.get_close_matches(e, present, n=2, cutoff=0.6)})
        if not close:
            return None
        return (f"the sample has {', '.join('.' + k for k in close)}: if that is the member you mean, name it in "
                f"fields (e.g. {{{field.name!r}: {';'.join(close + list(field.exts))!r}}}) -- a typo in an extension "
                "misses every sample, and missing='skip' would skip them all")

    def _one(self, field: Field, sample: dict, source: str = "") -> Optional[np.ndarray]:
        kind = field.spec
        if not kind.reads_members:  # the sample's metadata (a key's own bytes)
            name = field.exts[0]
            value = source if name == "__source__" else str(sample.get(name, ""))
            return kind.parse(field, value.encode("utf-8", "surrogateescape"), name)
        for ext in field.exts:
            data = sample.get(ext)
            if data is None and sample.get(ext + ".gz") is not None:
                try:
                    data = gzip.decompress(sample[ext + ".gz"])
                except (OSError, EOFError, zlib.error) as e:
                    raise SampleError(f"cannot gunzip .{ext}.gz: {e}", url=sample.get("__url__"),
                                      member=f"{sample.get('__key__')}.{ext}.gz", reason="bad_value") from None
            if data is not None:
                try:
                    return kind.parse_at(field, data, ext, str(sample.get("__key__", "")), self.epoch)
                except DalistreamError:
                    raise
                except Problem as e:
                    raise SampleError(f"field {field.name!r} {e}", reason=e.reason, url=sample.get("__url__"),
                                      member=f"{sample.get('__key__')}.{ext}", hint=e.hint) from None
                except Exception as e:
                    raise SampleError(f"cannot decode field {field.name!r}: {type(e).__name__}: {e}",
                                      url=sample.get("__url__"), member=f"{sample.get('__key__')}.{ext}",
                                      reason="bad_value") from None
        return None
