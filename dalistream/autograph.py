"""Keep DALI's AutoGraph away from library code that has no ``if`` on data.

With ``enable_conditionals=True`` DALI rewrites (parses, transforms, recompiles) the pipeline
function and every function it calls, 20–200 ms each on a 2-core machine: before this, most of
the time to first batch. Library functions are marked :func:`do_not_convert`, so AutoGraph calls
them as they are; DALI operators called inside them still take part in the user's conditionals
(the operators themselves split their inputs by the enclosing condition). The two small
functions with an ``if`` on data (the merge, the decode guard) are :func:`converted` explicitly.
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def do_not_convert(fn: F) -> F:
    """Mark ``fn`` as DALI's ``nvidia.dali.pipeline.do_not_convert`` does (an AutoGraph artifact:
    the ``autograph_info__`` attribute), without importing DALI when dalistream is imported."""
    fn.autograph_info__ = None  # type: ignore[attr-defined]
    return fn


def converted(fn: F) -> F:
    """``fn`` as DALI's AutoGraph converts it, also when called from code it leaves alone (an
    ``if`` on data inside ``fn`` becomes a DALI conditional). Uses the converter DALI applies to
    pipeline definitions (``nvidia.dali._conditionals._autograph``: DALI is pinned to 2.4.x)."""
    import functools

    state: dict = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "fn" not in state:
            from nvidia.dali._conditionals import _autograph

            state["fn"] = _autograph.convert(recursive=True, user_requested=True)(fn)
        return state["fn"](*args, **kwargs)

    return do_not_convert(call)  # type: ignore[return-value]
