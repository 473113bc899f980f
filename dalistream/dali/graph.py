"""Inside a DALI pipeline: one parallel external source per worker, merged into one batch.

Every worker's source yields a full-size batch whose own slot holds real samples; every other
position holds an empty array (a zero for scalar fields). What it ships
(:func:`dalistream.worker.batch.transfer`): each field as an output of its own (a byte field as
a blob, cut into rows on receipt: :func:`received_rows`), then a bucketed stream's bucket index,
then ``valid``. Integer scalars (labels), the bucket index and ``valid`` merge by a sum over the
workers (every worker but a position's owner gives zeros there); a bucketed stream's bucket
sizes are read off its index by lookup tables (:func:`bucket_nodes`). When every other field is
one-dimensional (encoded bytes, keys:
the usual case), the merge needs no conditionals: each position's array is the concatenation
over workers (all but the owner give nothing) (:func:`merge_by_concat`). This costs no AutoGraph
conversion when the pipeline is defined and no split/merge per worker when it runs. Otherwise a
per-position *owner* index (which worker fills position ``i``, read off the workers' ``valid``
columns, so it follows whatever positions a plan gives each worker at each step:
:func:`owner_of`) drives a chain of conditionals (``if owner == w``) for those fields only:
DALI splits each source's batch by the predicate and merges the selected samples back in batch
order (:func:`merge`). Padding positions never reach anything but the merge. :func:`merged` is
the whole merge.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, List, Optional, Sequence, Tuple

from ..config import StreamConfig
from ..dataset import DataSet
from ..worker import WorkerSource, stats_path
from ..worker.batch import Transfer, row_bounds, shm_hint, transfer
from .compat import converted, do_not_convert, empty_rows, on_receive, tensor_list


def transfer_of(config: StreamConfig) -> Transfer:
    """How the sources of ``config`` ship a batch (:func:`dalistream.worker.batch.transfer`)."""
    return transfer(config.fields, config.buckets is not None)


@do_not_convert
def valid_of(config: StreamConfig, nodes: Sequence) -> Any:
    """A source's ``valid`` node: the last of its ``nodes``."""
    return nodes[-1]


@do_not_convert
def owner_of(valids: Sequence) -> Any:
    """The owner index of every position from the workers' ``valid`` outputs: ``Σ_w w·valid_w``
    (a padding position, valid nowhere, gets worker 0, whose value there is the empty one as
    everybody's)."""
    from nvidia.dali import fn, types

    return functools.reduce(operator.add, [fn.cast(v, dtype=types.INT32) * w for w, v in enumerate(valids) if w])


def merge(owner, branches: Sequence[Sequence]) -> list:
    """Select, for each batch position, the outputs of the branch that owns it.

    ``branches[w]`` is the tuple of data nodes of worker ``w``. Needs a pipeline built with
    ``enable_conditionals=True``, and a caller that AutoGraph converts (the ``if`` below is on
    data: AutoGraph turns it into DALI's split and merge).
    """
    result = list(branches[-1])
    for w in range(len(branches) - 2, -1, -1):
        if owner == w:
            result = list(branches[w])
    return result


@do_not_convert
def sharded_sources(
    config: StreamConfig, data: DataSet, *, start_epoch: int = 0, start_step: int = 0,
    stats_dir: Optional[str] = None, resume: Sequence = (), mix: Optional[Any] = None,
) -> Tuple[Optional[object], List[Sequence], List[WorkerSource]]:
    """Create the W parallel sources of ``data``; return ``(owner, branches, sources)``: the owner
    index node (``None`` with one worker, or when :func:`merge_by_concat` can merge the fields),
    per worker its output nodes (:func:`transfer_of`: its fields, then a bucketed stream's
    bucket index, then ``valid``), and the W sources (not yet shipped to their workers:
    :meth:`~WorkerSource.leave_out` may still narrow them). ``data.bytes_per_sample`` (shard
    bytes / samples, when known) sizes the shared memory once for the whole run.

    Call inside a function decorated with DALI's ``pipeline_def`` (see :mod:`dalistream.dali.pipeline`),
    whose ``py_num_workers`` equals ``config.workers``; merge with :func:`merged`.
    """
    from nvidia.dali import fn

    n_out = transfer_of(config).n_outputs
    branches, sources = [], []
    for w in range(config.workers):
        source = WorkerSource(
            config, data, w, start_epoch=start_epoch, start_step=start_step,
            stats_path=stats_path(stats_dir, w) if stats_dir else None, resume=resume, mix=mix,
        ).for_dali()
        receive_blobs(source, source.blob_outputs, config.batch_size)  # byte fields travel as blobs, cut here
        hint = shm_hint(config.batch_size, config.layout.slots[w], data.bytes_per_sample or 0, n_out)
        nodes = fn.external_source(
            source=source, num_outputs=n_out, batch=True, parallel=True, cycle="quiet",
            prefetch_queue_depth=config.prefetch, bytes_per_sample_hint=hint,
        )
        branches.append(nodes)
        sources.append(source)
    if config.workers == 1 or concat_mergeable(config.fields):
        return None, branches, sources
    return owner_of([valid_of(config, b) for b in branches]), branches, sources


@do_not_convert
def receive_blobs(source: Any, blobs: Sequence[int], batch_size: int) -> None:
    """Have the blobs at ``blobs`` (output indices; a list the source may still narrow) of every
    batch ``source`` ships cut into rows on receipt (:func:`received_rows`), from one placeholder
    made here."""
    on_receive(source, functools.partial(received_rows, blobs, empty_rows(batch_size)))


@do_not_convert  # runs once per batch: never as AutoGraph-converted code (a pipeline with conditionals converts what it calls)
def received_rows(packed: Sequence[int], placeholder: List[Any], outputs: list) -> list:
    """A worker's shipped outputs as DALI feeds them (main process): each byte field at ``packed``
    (a source's ``blob_outputs``: :class:`~dalistream.worker.source.WorkerSource`), a blob
    (:func:`~dalistream.worker.batch.pack`), as its rows, one ``TensorListCPU`` of views made from
    ``placeholder`` (:func:`~dalistream.dali.compat.empty_rows`: one per batch position)."""
    for i in packed:
        outputs[i] = tensor_list(placeholder, *row_bounds(outputs[i], len(placeholder)))
    return outputs


def concat_mergeable(fields: Sequence) -> bool:
    """Whether :func:`merge_by_concat` delivers these fields exactly: every kind merges them by a
    sum (integer scalars: zeros and the value) or a concatenation (one-dimensional arrays:
    empties and the value), not by the owner's conditionals (:meth:`dalistream.kinds.Kind.merge`)."""
    return all(f.spec.merge(f) != "owner" for f in fields)


@do_not_convert
def merge_by_concat(config: StreamConfig, branches: Sequence[Sequence]) -> list:
    """The fields' outputs (:func:`transfer_of`) of the W branches of :func:`sharded_sources`,
    merged without conditionals (see the module's notes)."""
    from nvidia.dali import fn

    out = []
    for i in range(transfer_of(config).fields):
        columns = [b[i] for b in branches]
        if len(columns) == 1:
            out.append(columns[0])
        elif config.fields[i].spec.merge(config.fields[i]) == "sum":
            out.append(functools.reduce(operator.add, columns))
        else:
            out.append(fn.cat(*columns, axis=0))
    return out


_by_owner = converted(merge)  # its `if` is on data; converted at first use, not at import


@do_not_convert
def merged(config: StreamConfig, owner: Any, branches: Sequence[Sequence]) -> tuple:
    """The merge of :func:`sharded_sources`' branches: ``(fields, bucket, valid)``, a node per
    field in the stream's order, a bucketed stream's bucket index node (``None`` without), and
    ``valid``. The bucket index and ``valid`` by a sum; the fields by :func:`merge_by_concat`, or,
    given an ``owner`` index (:func:`owner_of`), by :func:`merge`'s conditionals (AutoGraph-converted:
    the pipeline needs ``enable_conditionals=True``)."""
    form = transfer_of(config)
    n = form.fields
    own = [list(b[:n]) for b in branches]
    if not n:
        shipped = []
    elif owner is None:
        shipped = merge_by_concat(config, own)
    else:
        shipped = list(_by_owner(owner, own))
    bucket = functools.reduce(operator.add, [b[n] for b in branches]) if form.bucket else None
    return shipped, bucket, functools.reduce(operator.add, [b[-1] for b in branches])


@do_not_convert
def bucket_nodes(config: StreamConfig, bucket: Any) -> list:
    """A bucketed stream's nodes that carry each batch's bucket at every position, named by
    ``config.bucket_outputs``: the ``bucket`` index (one branch filled it, summed over the W
    branches), then its sizes by lookup tables (a step of padding only, index ``-1``,
    gets bucket 0's)."""
    from nvidia.dali import fn, types

    if config.buckets is None:
        return []
    table = config.buckets.table()
    keys = list(range(len(table) - 1))
    return [bucket] + [fn.lookup_table(bucket, keys=keys, values=table[:-1, j].tolist(),
                                       default_value=int(table[-1, j]), dtype=types.INT32)
                       for j in range(1, table.shape[1])]
