"""Captions batched by length: every batch one length bucket, its token rows padded to the bucket's length.

::

    import dalistream
    from dalistream.pipelines import caption_buckets

    buckets = dalistream.LengthBuckets(field="txt", edges=[16, 32, 64, 128])
    with caption_buckets.loader("/data/captions-{0000..0099}.tar", batch_size=256, buckets=buckets) as loader:
        for batch in loader:
            tokens, lengths = batch["tokens"], batch["length"]   # (B, L): L the bucket's length

A batch may come empty (every output's first dimension 0: ``exact``'s last step of a rank no
sample is left for, or every sample of the batch skipped with ``on_error="skip"``). A training
step still takes it — forward, a zero loss that keeps the graph (``out.sum() * 0.0``: a mean over no
sample is NaN), backward — so that under DDP every rank joins the gradient all-reduce
(docs/guide/training.md, "An empty batch"; ``warn_empty=True`` warns at each epoch's first).

The shards need the member's byte length in their manifest (``dalistream index SOURCES --keys
txt``; ``dalistream write`` records ``txt``). The token field is the bucketed member read as
tokens: ``token_bytes=1`` takes each byte as a token (byte-level models: each UTF-8 byte of a
caption), ``2``/``4`` read little-endian ``int16``/``int32`` ids (a member a tokenizer wrote as raw
ids; the buckets' edges are then in bytes, ``token_bytes`` × tokens). Every row is padded with
zeros to the batch's bucket (``bucket_length`` bytes, one per sample, the same in the whole batch;
the last, open bucket pads to the batch's longest): a batch of bucket ``i`` has
``edges[i] / token_bytes`` tokens per row, so a model sees a few fixed shapes.

Outputs (``B`` = samples in the batch, ``L`` = its bucket's length in tokens):

=================  ============================  ==========  ============================
name               dtype                         shape       device
=================  ============================  ==========  ============================
``tokens``         ``torch.int32``, 0 = padding  ``(B, L)``  CUDA on a GPU stream, else CPU
``length``         ``torch.int64``: real tokens  ``(B,)``    CUDA on a GPU stream, else CPU
``bucket``         ``torch.int32``               ``(B,)``    CPU
``bucket_length``  ``torch.int32``: bytes        ``(B,)``    CPU
=================  ============================  ==========  ============================
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import dalistream
from dalistream.config import WORKERS
from dalistream.errors import ConfigError
from dalistream import ops

from .fields import loader_options, merged_fields, with_read_fields


@dalistream.pipeline_def
def pipeline(stream: "dalistream.Stream", token_bytes: int = 1) -> Dict[str, Any]:
    """The caption graph; ``stream`` must be opened with :class:`~dalistream.LengthBuckets` and
    have a field ``tokens`` (the bucketed member's bytes); its other fields and the bucket's
    outputs are returned as read."""
    from nvidia.dali import fn, types

    device = stream.device
    data = dalistream.read(stream)
    if "bucket_length" not in data:
        raise ConfigError("caption_buckets: the stream has no length buckets",
                          hint="open it with buckets=dalistream.LengthBuckets(field=..., edges=[...])")
    tokens = ops.pad_tokens(data["tokens"], data["bucket_length"], token_bytes=token_bytes)
    length = fn.cast(data["tokens"].shape()[0] // token_bytes, dtype=types.INT64)
    outputs = {"tokens": ops.to_device(tokens, device), "length": ops.to_device(length, device)}
    return with_read_fields(outputs, data)


def loader(sources: Any, *, batch_size: int = 64, workers: int = WORKERS, device: str = "auto",
           buckets: Optional["dalistream.LengthBuckets"] = None, token_bytes: int = 1,
           dali_options: Optional[Mapping[str, Any]] = None, **stream_options: Any) -> "dalistream.Loader":
    """A :class:`dalistream.Loader` over ``sources`` running :func:`pipeline`, batched by
    ``buckets`` (a :class:`~dalistream.LengthBuckets`; its ``field`` is the member read as
    ``tokens``).

    ``stream_options`` (but the Loader's own ``progress``, ``stats_dir``, ``wait_warning``,
    ``warn_empty``) go to :meth:`dalistream.Stream.open` (``seed``, ``policy``, ``rank``, ``world_size``, ``manifest``, …),
    ``dali_options`` to the DALI pipeline. ``fields`` (optional) is merged over the default (an
    entry named ``tokens`` replaces it; any other entry, e.g. ``{"key": "__key__"}``, is read too
    and returned as read).
    """
    if not isinstance(buckets, dalistream.LengthBuckets):
        raise ConfigError(f"caption_buckets: buckets must be a dalistream.LengthBuckets, got {buckets!r}",
                          hint="e.g. buckets=dalistream.LengthBuckets(field='txt', edges=[16, 32, 64, 128])")
    shown = loader_options(stream_options)  # progress, stats_dir, wait_warning, warn_empty: the Loader's own
    fields = merged_fields({"tokens": buckets.field}, stream_options.pop("fields", None))
    stream = dalistream.Stream.open(sources, fields=fields, batch_size=batch_size, workers=workers, device=device,
                                    buckets=buckets, **stream_options)
    return dalistream.Loader(stream, pipeline, **shown, token_bytes=token_bytes, **dict(dali_options or {}))
