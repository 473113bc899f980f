"""What a mix of weighted sources looks like as input, checked before anything is planned:
``{name: (source, weight)}`` or ``{name: {"source": …, "weight": …, "manifest": …,
"storage_options": …}}`` (:func:`parse_mix`), and ``NAME=WEIGHT:SOURCE`` on a command line
(:func:`parse_mix_arg`). Every bad input is a :class:`~dalistream.errors.ConfigError` that names
the source."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError

MIX_KEYS = ("source", "weight", "manifest", "storage_options")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class MixSource:
    """One named source of a mix: where its shards are, its weight (normalised: all weights of
    the mix sum to 1), and optionally its manifest and storage options."""

    name: str
    source: Any
    weight: float
    manifest: Optional[Any] = None
    storage_options: Optional[Mapping[str, Any]] = None


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"mix: a source name must be a non-empty string, got {name!r}")
    return name


def check_weight(name: str, weight: Any) -> float:
    """``weight`` as a float, or a ConfigError naming source ``name``: the weight must be a real
    number (not a bool), finite and greater than zero."""
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise ConfigError(f"mix: source {name!r}: weight must be a number, got {weight!r}")
    value = float(weight)
    if not math.isfinite(value):
        raise ConfigError(f"mix: source {name!r}: weight must be finite, got {weight!r}")
    if value <= 0:
        raise ConfigError(f"mix: source {name!r}: weight must be greater than 0, got {weight!r}",
                          hint="leave the source out of the mix instead of giving it weight 0")
    return value


def check_weights(weights: Mapping[str, Any]) -> Dict[str, float]:
    """The weights of ``{name: weight}`` checked (:func:`check_weight`) and normalised to sum 1,
    in the mapping's order."""
    if not isinstance(weights, Mapping) or not weights:
        raise ConfigError(f"mix: needs at least one source, got {weights!r}")
    raw = {_name(name): check_weight(name, w) for name, w in weights.items()}
    total = math.fsum(raw.values())
    if not math.isfinite(total):
        raise ConfigError("mix: the weights' sum is not finite", hint="give weights of a smaller scale")
    return {name: w / total for name, w in raw.items()}


def _entry(name: str, value: Any) -> Dict[str, Any]:
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in MIX_KEYS]
        if unknown:
            raise ConfigError(f"mix: source {name!r}: unknown key {unknown[0]!r}", hint=f"the keys are {MIX_KEYS}")
        entry = dict(value)
        entry.setdefault("weight", 1.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        entry = {"source": value[0], "weight": value[1]}
    else:
        raise ConfigError(f"mix: source {name!r}: expected (source, weight) or a dict with keys {MIX_KEYS}, "
                          f"got {value!r}")
    source = entry.get("source")
    if source is None or (isinstance(source, (str, list, tuple)) and len(source) == 0):
        raise ConfigError(f"mix: source {name!r}: missing source (shard paths or URLs)")
    options = entry.get("storage_options")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"mix: source {name!r}: storage_options must be a dict, got {options!r}")
    return entry


def parse_mix(mapping: Mapping[str, Any]) -> List[MixSource]:
    """The sources of a mix, in the mapping's order, weights normalised. Each entry is
    ``name: (source, weight)`` or ``name: {"source": …, "weight": …, "manifest": …,
    "storage_options": …}`` (``weight`` defaults to 1 in the dict form)."""
    if not isinstance(mapping, Mapping) or not mapping:
        raise ConfigError(f"mix: expected a non-empty mapping of named sources, got {mapping!r}")
    entries = {_name(name): _entry(name, value) for name, value in mapping.items()}
    weights = check_weights({name: e["weight"] for name, e in entries.items()})
    return [MixSource(name, e["source"], weights[name], e.get("manifest"), e.get("storage_options"))
            for name, e in entries.items()]


def parse_mix_arg(text: str) -> Tuple[str, float, str]:
    """``"web=0.7:s3://a/web-{0000..0009}.tar"`` → ``("web", 0.7, "s3://a/web-{0000..0009}.tar")``:
    a command line's ``NAME=WEIGHT:SOURCE`` (the weight not yet normalised)."""
    usage = "expected NAME=WEIGHT:SOURCE, e.g. web=0.7:s3://bucket/web-{0000..0009}.tar"
    name, eq, rest = str(text).partition("=")
    weight_text, colon, source = rest.partition(":")
    if not eq or not colon:
        raise ConfigError(f"mix: cannot read {text!r}: {usage}")
    name = name.strip()
    if not _NAME.match(name):
        raise ConfigError(f"mix: cannot read {text!r}: the name {name!r} must be letters, digits, '_', '.' or '-'",
                          hint=usage)
    try:
        weight = float(weight_text)
    except ValueError:
        raise ConfigError(f"mix: source {name!r}: weight must be a number, got {weight_text!r}", hint=usage) from None
    if not source.strip():
        raise ConfigError(f"mix: source {name!r}: missing source after {name}={weight_text}:", hint=usage)
    return name, check_weight(name, weight), source.strip()


def check_fields(fields: Mapping[str, Sequence[str]]) -> None:
    """Raise unless every source of a mix has the same fields (``{name: field names}``), naming
    the first source that differs from the first one."""
    items = list(fields.items())
    if not items:
        return
    first, want = items[0][0], sorted(items[0][1])
    for name, have in items[1:]:
        if sorted(have) != want:
            missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
            raise ConfigError(f"mix: source {name!r} has fields {sorted(have)}, source {first!r} has {want}"
                              + (f" (missing {missing})" if missing else "") + (f" (extra {extra})" if extra else ""),
                              hint="every source of a mix must give the same fields")
