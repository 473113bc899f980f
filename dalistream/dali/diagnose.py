"""Diagnosis of a failed DALI pipeline: turn what DALI raised back into a dalistream error.

DALI hands a worker's exception to the main process as a plain ``Exception`` whose text holds
the worker's traceback; its image and video decoders fail with no sample index. This module
rebuilds our own error (class, shard, member, rank, worker) from that text, and for a decoder
failure re-reads the batch in this process to name the undecodable image (PIL) or clip (PyAV).
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Callable, List, Optional

import numpy as np

from .. import errors
from ..config import Field
from ..errors import WorkerError
from ..kinds.video import clip_problem
from ..worker import WorkerSource

if TYPE_CHECKING:  # annotations only: the stream module imports nothing from here
    from ..stream import Stream

log = logging.getLogger(__name__)
_ERROR_LINE = re.compile(r"dalistream\.errors\.(\w+): (.+)")

_WORKER_TB = "Exception traceback received from worker thread:"
_DECODER = re.compile(r"fn\.decoders\.\w+|decoders__\w+|nvImageCodec")
_LAST_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.*)$")


def translate(error: Exception, rank: int, where: Optional[tuple] = None) -> Exception:
    """Turn what a failed DALI pipeline raised into a dalistream error.

    - an error of dalistream's own code in a worker (DALI passes on only its traceback text):
      the same class with the same fields (shard, member, rank, worker, hint), rebuilt from the
      note :meth:`DalistreamError.at` attached in the worker;
    - any other exception in a worker: :class:`WorkerError` naming its type and message;
    - DALI's image decoder failing (a corrupt image that passed the workers' cheap check): a
      :class:`SampleError` naming the shard and key when they can be found (``where`` is
      ``(stream, epoch, step)`` of the batch asked for; see :func:`_locate_bad_images`); its video
      decoder failing (damage inside a stream that passed the workers' probe) likewise
      (``bad_video``), its audio decoder with the batch's keys (``bad_audio``);
    - anything else: :class:`WorkerError` with DALI's message.

    The worker's traceback, where there is one, is kept in ``worker_traceback``; it is added as a
    note to a :class:`WorkerError` (an unexpected exception), and to dalistream's own errors only
    when this module logs at DEBUG (``--log-level DEBUG``).
    """
    if isinstance(error, errors.DalistreamError):
        if error.rank is None:
            error.rank = rank
            error.args = (error.render(),)
        return error
    text = str(error)
    traceback_text = text.split(_WORKER_TB, 1)[1].strip("\n") if _WORKER_TB in text else None
    out: Optional[errors.DalistreamError] = None
    if traceback_text is not None:
        out = _from_worker_traceback(traceback_text, rank)
    elif _DECODER.search(text):
        out = _decoder_error(text, rank, where)
    elif "Worker data receiving interrupted" in text:
        out = WorkerError("a DALI worker process stopped while the pipeline waited for its data", rank=rank,
                          hint="a killed worker is often the out-of-memory killer: check memory, `dmesg`, and the "
                               "size of /dev/shm")
    if out is None:
        out = WorkerError(f"DALI pipeline failed: {text.strip()[-3000:]}", rank=rank)
    if traceback_text is not None:
        tb = errors.redact("\n".join(line for line in traceback_text.splitlines()
                                      if not line.startswith(errors.FIELDS_NOTE)))
        out.worker_traceback = tb  # type: ignore[attr-defined]
        # dalistream's own errors say what and where (URL, member, hint): their worker traceback
        # would only bury the message; anything else is a bug whose traceback is the message
        if isinstance(out, WorkerError) or log.isEnabledFor(logging.DEBUG):
            out.add_note("Traceback in the DALI worker process:\n" + tb)
    return out


def _from_worker_traceback(tb: str, rank: int) -> errors.DalistreamError:
    for line in reversed(tb.splitlines()):
        if line.startswith(errors.FIELDS_NOTE):
            try:
                fields = json.loads(line[len(errors.FIELDS_NOTE):])
            except ValueError:
                break
            out = errors.DalistreamError.from_fields(fields)
            if out.rank is None:
                out.rank = rank
                out.args = (out.render(),)
            return out
    found = _ERROR_LINE.findall(tb)
    if found:  # a dalistream error raised without .at() (no fields note): class and text only
        name, message = found[-1]
        cls = getattr(errors, name, WorkerError)
        if isinstance(cls, type) and issubclass(cls, errors.DalistreamError):
            out = cls(message.strip())
            out.args = (message.strip() + (f" [rank {rank}]" if "rank " not in message else ""),)
            return out
    last = next((m for m in (_LAST_LINE.match(x) for x in reversed(tb.splitlines())) if m), None)
    what = f"{last.group(1)}: {last.group(2)}" if last else tb.strip().splitlines()[-1]
    return WorkerError(f"a DALI worker raised {what}", rank=rank,
                       hint="see the worker's traceback below; the pipeline has been stopped")


def _decoder_error(text: str, rank: int, where: Optional[tuple]) -> errors.DalistreamError:
    op = _DECODER.search(text).group(0)
    if "video" in op or "audio" in op:
        return _media_decoder_error(op, rank, where)
    status = re.search(r"nvImageCodec failure: '?([^'\n]*)'?", text)
    what = f"nvImageCodec failure {status.group(1)}" if status else "decoder error"
    found: List[tuple] = []
    keys: List[str] = []
    if where is not None:
        stream, epoch, step = where
        try:
            found, keys = _locate_bad_images(stream, epoch, step)
        except Exception as e:  # locating is a courtesy: never hide the real error behind it
            log.debug("could not locate the undecodable image: %s", e)
    if found:
        url, key, field, problem, bad_step = found[0]
        skipping = where[0].config.on_error == "skip"
        more = f" ({len(found) - 1} more in the same batches)" if len(found) > 1 else ""
        return errors.SampleError(
            f"DALI's image decoder ({op}) failed ({what}); the undecodable image is field {field!r} of the batch at "
            f"epoch {epoch}, step {bad_step}: {problem}{more}", url=url, member=key, rank=rank, reason="bad_image",
            hint="re-encode or remove the image: " + ("on_error='skip' is on, but it" if skipping else
                                                       "on_error='skip' would not help, it") +
                 " skips only images that fail the workers' cheap check (signature and end marker), not images "
                 "that only DALI's decoder rejects")
    shown = ", ".join(keys[:8]) + (", …" if len(keys) > 8 else "")
    near = f" of the batch at epoch {where[1]}, step {where[2]} (keys: {shown})" if where is not None and keys else ""
    return errors.SampleError(
        f"DALI's image decoder ({op}) failed ({what}) on a sample{near}. DALI does not say which sample, and no image "
        "of that batch failed to decode with PIL", rank=rank, reason="bad_image",
        hint="check the images of these samples; the pipeline has been stopped")


def _media_decoder_error(op: str, rank: int, where: Optional[tuple]) -> errors.DalistreamError:
    """DALI's video or audio decoder failed a batch: for video, the clip found by decoding the
    batch's video fields with PyAV in this process (damage inside a stream passes the workers'
    probe); otherwise the batch's keys."""
    video = "video" in op
    reason, what = ("bad_video", "video") if video else ("bad_audio", "audio")
    found: List[tuple] = []
    keys: List[str] = []
    if where is not None:
        try:
            found, keys = _locate_bad_images(*where, check=_clip_check if video else None)
        except Exception as e:  # locating is a courtesy: never hide the real error behind it
            log.debug("could not locate the undecodable %s: %s", what, e)
    if found:
        url, key, field, problem, bad_step = found[0]
        more = f" ({len(found) - 1} more in the same batches)" if len(found) > 1 else ""
        return errors.SampleError(
            f"DALI's video decoder ({op}) failed; the undecodable clip is field {field!r} of the batch at epoch "
            f"{where[1]}, step {bad_step}: {problem}{more}", url=url, member=key, rank=rank, reason=reason,
            hint="re-encode or remove the clip, or decode in the workers (decode='worker'), where such a clip is "
                 "named and skipped by on_error for itself")
    shown = ", ".join(keys[:8]) + (", …" if len(keys) > 8 else "")
    near = f" of the batch at epoch {where[1]}, step {where[2]} (keys: {shown})" if where is not None and keys else ""
    return errors.SampleError(
        f"DALI's {what} decoder ({op}) failed on a sample{near}. DALI does not say which sample"
        + (", and every clip of that batch decodes with PyAV" if video and keys else ""), rank=rank, reason=reason,
        hint=f"check the {what} of these samples; the pipeline has been stopped")


def _clip_check(field: Field, data: bytes) -> Optional[str]:
    if field.kind != "video" or field.ndim != 1:  # (frames decoded in the worker never meet DALI's decoder)
        return None
    problem = clip_problem(data, field.decoder)
    return None if problem is None else f"PyAV: {problem}"


def _locate_bad_images(stream: "Stream", epoch: int, step: int, depth: int = 2,
                       check: Optional[Callable[[Field, bytes], Optional[str]]] = None):
    """Re-read, in this process, the batches ``step .. step + depth`` of ``epoch`` (DALI may fail
    on a prefetched batch) and decode their image fields with PIL (or give every field's values to
    ``check``, which says what is wrong with one, or ``None``); return ``([(url, key, field,
    problem, step), ...], keys of the batch at step)``. Only called after a decoder failure."""
    import dataclasses
    import io

    c = stream.config
    images = list(range(len(c.fields))) if check is not None else \
        [i for i, f in enumerate(c.fields) if any(f.spec.member_flag(f, e) for e in f.exts)]  # (the bytes kind's images)
    if not images:
        return [], []
    try:
        from PIL import Image
    except ImportError:
        Image = None  # noqa: N806
    extra = (Field("__dalistream_key__", ("__key__",), kind="meta"), Field("__dalistream_url__", ("__url__",), kind="meta"))
    config = dataclasses.replace(c, fields=tuple(c.fields) + extra)
    n = len(c.fields)
    found, keys = [], []
    last = min(stream.steps(epoch, stream.resume), step + depth + 1)
    for w in range(c.workers):
        source = WorkerSource(config, stream.data, w, start_epoch=epoch, start_step=step, resume=stream.resume)
        batches = source.epoch_batches(epoch, step)
        try:
            for s, batch in zip(range(step, last), batches):
                valid = batch[-1]
                for pos in range(len(valid)):
                    if not int(valid[pos]):
                        continue
                    key = bytes(batch[n][pos]).decode("utf-8", "replace")
                    url = bytes(batch[n + 1][pos]).decode("utf-8", "replace")
                    if s == step:
                        keys.append(key)
                    for i in images:
                        if check is not None:
                            problem = check(c.fields[i], bytes(np.asarray(batch[i][pos])))
                            if problem is not None:
                                found.append((url, key, c.fields[i].name, problem, s))
                            continue
                        data = bytes(batch[i][pos])
                        if not data or Image is None:
                            continue
                        try:
                            with Image.open(io.BytesIO(data)) as im:
                                im.load()
                        except Exception as e:
                            found.append((url, key, c.fields[i].name, f"PIL: {type(e).__name__}: {e}", s))
        finally:
            batches.close()
    return found, keys
