"""``@pipeline_def`` helpers: write a DALI pipeline around dalistream's sharded sources.

::

    @dalistream.pipeline_def
    def train(stream, size=224):
        data = dalistream.read(stream)                     # {"image": ..., "label": ..., "valid": ...}
        images = ops.decode_images(data["image"], data["valid"], stream.device, random_crop=True)
        images = ops.random_resized_crop(images, stream.device, (size, size))
        return {"image": ops.normalize(images, stream.device), "label": data["label"]}

    pipe = train(stream)        # a built-ready nvidia.dali.Pipeline (batch size, workers, start method…)

The pipeline function returns a dict of named outputs. Raw byte fields returned unchanged from
:func:`read` (captions, keys) reach torch as ``bytes``/``str``; everything else as tensors. The
``valid`` mask is added automatically, so the loader can trim padding; ``"valid"`` is therefore not
a name an output may have. Between :func:`read` and the ``return`` any DALI op may be used (on
``stream.device``); ``if`` statements on data nodes work: DALI's conditionals are enabled when
the graph needs them, and left off otherwise, which spares AutoGraph's rewrite of every function
the graph calls (most of the time to first batch). The graph is defined without them first
(unless the merge needs them, :func:`needs_conditionals`); an ``if`` (``while``, ``and``, ``or``,
``not``) on a data node, in the function or in any helper it calls, makes DALI refuse the
node's truth value, and the graph is then defined again with conditionals. An ``if`` on a
Python value (an option of the pipeline) costs nothing.

DALI's workers are forked for CPU pipelines while CUDA is untouched, and spawned otherwise
(``Stream.open(..., start_method=...)``, see :func:`dalistream.dali.device.start_method`): a script
that builds a pipeline at top level needs the usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .device import dali_threads, process_cores, start_method
from ..errors import ConfigError, DalistreamError
from ..plan import seeds
from .compat import check_versions, current_pipeline, do_not_convert, quiet_pruned_sources, upstream
from ..worker.source import SOURCE_NAME
from .graph import bucket_nodes, concat_mergeable, merged, sharded_sources

if TYPE_CHECKING:  # annotations only: the stream module imports nothing from here
    from ..stream import Stream

# Set from the stream, never by the user: they must agree with the sharded sources.
RESERVED = ("batch_size", "device_id", "py_num_workers", "py_start_method", "py_callback_pickler",
            "enable_conditionals")


def needs_conditionals(stream: "Stream", forced: Optional[bool] = None) -> bool:
    """Whether a graph over ``stream`` is defined with DALI's conditionals from the start (and so
    pays AutoGraph's rewrite of every function it calls, most of the time to first batch): when
    the merge needs the owner's conditionals (fields other than integer scalars and 1-D arrays),
    or when the user asked (``pipeline_def(conditionals=True)``). Otherwise they are enabled only
    once the pipeline function turns out to branch on data (see the module's notes); padding
    needs none (:func:`dalistream.ops.with_placeholder`)."""
    if forced is not None:
        return forced
    return stream.config.workers > 1 and not concat_mergeable(stream.config.fields)


class _BranchesOnData(Exception):
    """The pipeline function took a data node's truth value in a graph defined without conditionals."""


def _bool_of_data_node(error: BaseException) -> bool:
    """Whether ``error`` (or its cause) is DALI's complaint about an ``if`` on data in a pipeline
    without conditionals."""
    while error is not None:
        if isinstance(error, TypeError) and "used in conditional context" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


@dataclass(frozen=True)
class Built:
    """What dalistream knows of a pipeline it built: its outputs as ``(name, kind)`` pairs (kind
    ``"tensor"``, or the name of a field kind whose :meth:`~dalistream.kinds.Kind.to_torch` makes
    the rows of a field returned as read), how DALI starts its workers, and whether it was
    defined with DALI's conditionals. It travels on the pipeline itself (:func:`built`)."""

    outputs: Tuple[Tuple[str, str], ...]
    start_method: str
    conditionals: bool = False


_BUILT = "dalistream_built"  # the attribute of a pipeline that holds its Built record
_READ = "dalistream_read"  # the attribute of the pipeline being defined that holds what read() made


def built(pipe: Any) -> Built:
    """The :class:`Built` record of a pipeline made by a :func:`pipeline_def` function."""
    record = getattr(pipe, _BUILT, None)
    if not isinstance(record, Built):
        raise ConfigError("this pipeline was not made by a @dalistream.pipeline_def function",
                          hint="decorate the pipeline function with dalistream.pipeline_def")
    return record


class Read(dict):
    """What :func:`read` returns: ``{field: node, "valid": node}`` (and a bucketed stream's
    ``bucket``, ``bucket_height``/``bucket_width`` or ``bucket_length``: the batch's bucket at
    every position: the buckets' ``outputs``), and what the pipeline needs
    of them once the pipeline function has returned: the W sources (:attr:`sources`), the field
    nodes (:attr:`fields`) and, for the fields whose kind has a raw form, the kind that makes a
    node returned as read reach torch (:attr:`torch_kinds`; others are tensors). The pipeline being
    defined holds it (an attribute of DALI's pipeline object), where :func:`pipeline_def` finds it
    when the function returns: no state outside the values."""

    def __init__(self, nodes: Dict[str, Any], sources: Sequence[Any], torch_kinds: Dict[str, str],
                 fields: Sequence[str]) -> None:
        super().__init__(nodes)
        self.sources = tuple(sources)
        self.fields = {name: nodes[name] for name in fields}
        self.torch_kinds = {id(nodes[name]): kind for name, kind in torch_kinds.items()}

    @property
    def valid(self) -> Any:
        return self["valid"]

    def leave_out(self, names: Sequence[str]) -> None:
        """Have every source skip the fields ``names`` (no output depends on them): their members
        are not read nor checked, and what the source ships for them is a placeholder that DALI
        prunes unfed."""
        for source in self.sources:
            source.leave_out(names)


@do_not_convert
def read(stream: "Stream") -> Read:
    """Create the sharded parallel sources and their merge; return ``{field: node, "valid": node}``
    (a :class:`Read`; with buckets also the nodes that carry each batch's bucket).

    Call it once inside a function decorated with :func:`pipeline_def`. Fields that the pipeline's
    outputs do not depend on are not read at all (the workers leave them out).
    """
    pipe = current_pipeline()
    if pipe is None:
        raise RuntimeError("dalistream.read() must be called inside a @dalistream.pipeline_def function")
    if getattr(pipe, _READ, None) is not None:
        raise ConfigError("dalistream.read() was called twice in one pipeline",
                          hint="call it once and use its nodes as often as needed")
    config = stream.config
    owner, branches, sources = sharded_sources(config, stream.data, start_epoch=stream.start_epoch,
                                               start_step=stream.start_step, stats_dir=stream.stats_dir,
                                               resume=stream.resume, mix=stream.mix)
    fields, bucket, valid = merged(config, owner, branches)  # conditionals only with an owner index
    names = [f.name for f in config.fields]
    nodes = dict(zip(names + list(config.bucket_outputs) + ["valid"], fields + bucket_nodes(config, bucket) + [valid]))
    data = Read(nodes, sources, {f.name: f.kind for f in config.fields if f.spec.raw}, names)
    setattr(pipe, _READ, data)
    return data


def pipeline_def(fn: Optional[Callable] = None, *, conditionals: Optional[bool] = None, **dali_kwargs: Any) -> Callable:
    """Decorate ``fn(stream, ...) -> {name: node}``; calling the result with a :class:`Stream`
    returns a DALI ``Pipeline`` set up the way sharded sources need it: ``batch_size`` and
    ``py_num_workers`` from the stream, ``py_start_method`` from the stream (``fork`` or ``spawn``
    with the ``dill`` pickler), ``device_id`` from the stream (``None`` on CPU), and
    ``enable_conditionals`` when the graph needs them (:func:`needs_conditionals`, or an ``if`` on
    data; ``conditionals=True`` or ``False`` decides instead). Other keyword
    arguments go to DALI's ``pipeline_def`` (``num_threads``: by default this process's share of the
    node's cores less one per worker, 2 to 16, :func:`dalistream.dali.device.process_cores` and
    :func:`dalistream.dali.device.dali_threads`;
    ``prefetch_queue_depth``, ``seed``, …),
    given here or when calling the decorated function; the remaining call arguments are the
    pipeline's own (``train(stream, size=160)``).

    ``fn`` is called once per pipeline. Fields of the stream that no output depends on are not read
    (nor checked) by the workers. The one exception is DALI's: a function that branches on a data
    node without ``conditionals=True`` is refused by DALI at its first such ``if`` (AutoGraph must
    convert a function before it runs), and is then defined once more, converted; the decorated
    function remembers it, so later pipelines of it are converted at once.
    """
    if fn is None:
        return functools.partial(pipeline_def, conditionals=conditionals, **dali_kwargs)
    reserved = sorted(set(dali_kwargs) & set(RESERVED))
    if reserved:
        raise ConfigError(f"@pipeline_def: {reserved} are set from the stream and cannot be given",
                          hint="set batch size, workers and device when opening the Stream")

    @functools.wraps(fn)
    def build(stream: "Stream", *args: Any, **kwargs: Any):
        import dill
        from nvidia.dali import pipeline_def as dali_pipeline_def

        check_versions()

        c = stream.config
        seed = seeds.pipeline(c.seed, c.rank, stream.start_epoch, stream.start_step)
        threads = dali_threads(process_cores(stream.local_processes), c.workers)
        options = dict(num_threads=threads, prefetch_queue_depth=2, exec_dynamic=True, seed=seed)
        options.update(dali_kwargs)
        for key in list(options):
            if key in kwargs:
                options[key] = kwargs.pop(key)
        reserved = sorted(set(kwargs) & set(RESERVED))
        if reserved:
            raise ConfigError(f"{fn.__name__}: {reserved} are set from the stream and cannot be given")
        method = start_method(stream.start_method, stream.device)

        def define(with_conditionals: bool):
            outputs: List[Tuple[str, str]] = []  # (name, kind) of the graph's outputs, set by graph()

            def graph():  # the pipeline definition: DALI's AutoGraph converts it, so it stays tiny
                return _check_outputs(fn, fn(stream, *args, **kwargs), outputs)

            graph.__name__ = fn.__name__
            decorated = dali_pipeline_def(graph, enable_conditionals=with_conditionals)
            try:
                pipe = decorated(batch_size=c.batch_size, device_id=stream.device_id, py_num_workers=c.workers,
                                 py_start_method=method, py_callback_pickler=dill if method == "spawn" else None,
                                 **options)
            except Exception as e:  # autograph wraps errors raised in the graph function: unwrap ours
                if not with_conditionals and _bool_of_data_node(e):
                    if conditionals is False:
                        raise ConfigError(f"{fn.__name__}: it (or a function it calls) has an `if` (or and/or/not) "
                                          "on a data node", hint="leave out conditionals=False") from None
                    raise _BranchesOnData from None
                original = _dalistream_cause(e)
                if original is None:
                    raise
                raise original from None
            quiet_pruned_sources(pipe, SOURCE_NAME)  # the fields left out: pruned on purpose, not worth DALI's warning
            setattr(pipe, _BUILT, Built(outputs=tuple(outputs), start_method=method, conditionals=with_conditionals))
            return pipe

        with_conditionals = needs_conditionals(stream, conditionals) or getattr(build, "branches_on_data", False)
        try:
            return define(with_conditionals)
        except _BranchesOnData:  # an `if` on data: define it again, converted (never built: no workers)
            build.branches_on_data = True  # type: ignore[attr-defined]
            return define(True)

    build.dalistream_pipeline = True  # type: ignore[attr-defined]
    return build


@do_not_convert
def _check_outputs(fn: Callable, outputs: Any, names_kinds: List[Tuple[str, str]]) -> tuple:
    """Validate the pipeline function's named outputs, add ``valid``, leave the fields no output
    depends on out of the sources; the graph's output tuple (its names and kinds appended to
    ``names_kinds``)."""
    if not isinstance(outputs, dict):
        raise TypeError(f"{fn.__name__} must return a dict of named outputs, got {type(outputs).__name__}")
    outputs = dict(outputs)
    for name in outputs:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{fn.__name__}: output names must be non-empty strings, got {name!r}")
    data = getattr(current_pipeline(), _READ, None)
    if data is None:
        raise ConfigError(f"{fn.__name__}: call dalistream.read(stream) in the pipeline function")
    used = upstream(outputs.values())
    if "valid" in outputs and outputs["valid"] is not data.valid:
        raise ConfigError(f"{fn.__name__}: 'valid' is reserved for the padding mask; rename that output")
    # always returned (not only when the stream can pad): the loader trims padding with it
    outputs["valid"] = data.valid
    unused = [name for name, node in data.fields.items() if id(node) not in used]
    if len(unused) < len(data.fields):  # leave them out of the sources (at least one field stays)
        data.leave_out(unused)
    names_kinds.extend((name, data.torch_kinds.get(id(node), "tensor")) for name, node in outputs.items())
    return tuple(outputs.values())


def _dalistream_cause(error: BaseException) -> Optional[BaseException]:
    """The dalistream error behind ``error`` (itself, or up its cause/context chain), if any."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, DalistreamError):
            return error
        error = error.__cause__ or error.__context__
        seen += 1
    return None


@pipeline_def
def raw_pipeline(stream: "Stream") -> Dict[str, Any]:
    """The fields as read, undecoded (``dalistream keys`` and read-only benchmarks)."""
    return read(stream)
