"""From a user's own images, videos or audio files to WebDataset shards: :func:`write`
(``dalistream write SOURCE OUTPUT``).

The input (:mod:`.inputs`) is a folder in the ImageFolder layout or a CSV/JSONL listing of
``path,label[,caption]`` rows, listed and checked before anything is written. Samples are
shuffled across shards by default (seeded): shards written from a class-sorted folder then hold
mixed classes, which is what a training stream needs from its shards. Shards are written in
parallel (one process per core, :mod:`.shards`), each image checked as the loader checks it, each
video and audio file probed (PyAV: the ``video`` extra), and
land whole or not at all (:mod:`.commit`): the marker first, shards under temporary names, then
renamed, then ``dalistream-manifest.json`` with counts, offsets, member layouts, each sample's
keys (what the check read: an image's size; a video's size, frames, duration, rate and codec; an
audio file's duration, rate and channels; the caption's length: :mod:`dalistream.manifest.keys`),
the class names and each key's source file, last. ``OUTPUT`` is a folder or an ``s3://`` prefix.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError, SampleError
from ..kinds.video import pyav
from ..sources.unfinished import MANIFEST, PART
from .commit import Target, begin, check_output, commit, survey
from .inputs import SHOWN, Inputs, Item, file_kind, image_folder, listing, read_inputs
from .shards import ON_BAD, Written, run

log = logging.getLogger(__name__)

__all__ = ["MANIFEST", "Item", "Inputs", "bad_files", "image_folder", "listing", "plan_shards", "write"]


def plan_shards(items: Sequence[Item], *, samples_per_shard: int, shuffle: bool, seed: int) -> List[List[int]]:
    """The item indices of each shard: a seeded permutation (identity without ``shuffle``) cut into
    shards of ``samples_per_shard`` (the last may be shorter)."""
    order = list(range(len(items)))
    if shuffle:
        random.Random(seed).shuffle(order)
    return [order[i:i + samples_per_shard] for i in range(0, len(order), samples_per_shard)]


def _relative(path: str, root: str) -> str:
    """``path`` (relative to the current folder, or absolute) against ``root`` (absolute), where it
    lies under it; else absolute. Either joins onto ``root`` to the file."""
    path = os.path.abspath(path)
    return os.path.relpath(path, root) if path.startswith(root.rstrip(os.sep) + os.sep) else path


def bad_files(bad: Sequence[Tuple[str, str]]) -> Tuple[str, str]:
    """What ``bad`` files are, ``(noun, reason)``: ``("images", "bad_image")``, videos, audio
    files, or ``("files", "bad_sample")`` for a mix (the noun in the singular for one)."""
    kinds = {file_kind(path) for path, _ in bad}
    kind = kinds.pop() if len(kinds) == 1 else None
    noun = {"image": "image", "video": "video", "audio": "audio file"}.get(kind or "", "file")
    return noun + ("s" if len(bad) > 1 else ""), f"bad_{kind}" if kind else "bad_sample"


def bad_files_error(bad: Sequence[Tuple[str, str]], source: str) -> SampleError:
    """The error of ``on_bad="error"``: every bad file named (:data:`~.inputs.SHOWN` of them, and a count)."""
    shown = "; ".join(f"{path}: {problem}" for path, problem in bad[:SHOWN])
    more = f" (and {len(bad) - SHOWN} more)" if len(bad) > SHOWN else ""
    noun, reason = bad_files(bad)
    return SampleError(f"{len(bad)} bad {noun}, nothing written: {shown}{more}", url=source, reason=reason,
                       hint="replace or remove these files, or pass --on-bad skip (on_bad='skip') to leave bad "
                            "files out and count them")


def _record(inputs: Inputs, written: Sequence[Written], bad: Sequence[Tuple[str, str]]) -> Dict[str, Any]:
    """What the manifest says about the source: class names, each key's file, every file left out
    (those of a shard none of whose files was written too)."""
    return {"classes": inputs.classes,
            "source": {"root": inputs.root,
                       "keys": {key: _relative(path, inputs.root) for w in written for key, path in w.samples},
                       "skipped": {_relative(path, inputs.root): problem for path, problem in bad}}}


def write(source: str, output: str, *, samples_per_shard: int = 1000, shuffle: bool = True, seed: int = 0,
          prefix: str = "train", processes: Optional[int] = None, on_bad: str = "error", overwrite: bool = False,
          storage_options: Optional[Mapping[str, Any]] = None,
          progress: Optional[Callable[[int], None]] = None,
          on_listed: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
    """Write ``source`` (a class-folder tree or a CSV/JSONL listing of images, videos or audio files) as WebDataset shards into
    ``output`` (a folder or an ``s3://`` prefix) with a manifest beside them; returns a summary
    (``shards``, ``samples``, ``classes``, ``manifest``, ``urls``, ``skipped`` and ``bad``: the
    files left out and why, ``duplicates``: files listed more than once, written once).

    ``on_bad``: files that fail the check (0 bytes, cut short, not an image; a video or audio file
    PyAV cannot read to its end) stop the write, every one of them named in one
    :class:`SampleError` once all are checked, no shard kept (``"error"``, the default), or are
    left out, counted and named (``"skip"``). Videos or audio files without PyAV installed: a
    :class:`ConfigError` before anything is written.
    An output holding another set is refused unless ``overwrite``; one holding a write that did
    not finish, whose process on this host has ended, is replaced. Interrupted (an error,
    Ctrl-C, SIGTERM, SIGKILL, the store gone away), the output holds the marker without a
    manifest, which a read refuses. ``on_listed(total)`` is called once the source is listed,
    ``progress(n)`` as shards are written, with their item counts."""
    from ..manifest import build_manifest, write_manifest

    if samples_per_shard < 1:
        raise ConfigError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    if on_bad not in ON_BAD:
        raise ConfigError(f"on_bad must be one of {ON_BAD}, got {on_bad!r}")
    inputs = read_inputs(source)  # every row checked before anything is written
    if any(file_kind(item.path) != "image" for item in inputs.items):
        pyav()  # probing media needs PyAV: refused now, not once per file in the processes
    target = Target(output, storage_options)
    found = survey(target)
    check_output(target, found, overwrite)
    if on_listed:
        on_listed(len(inputs.items))
    items = inputs.items
    shards = plan_shards(items, samples_per_shard=samples_per_shard, shuffle=shuffle, seed=seed)
    width = max(5, len(str(len(shards) - 1)))
    names = [f"{prefix}-{i:0{width}d}.tar" for i in range(len(shards))]
    begin(target, found, len(names))
    if target.remote:
        from ..lifetime import temp_folder

        folder = temp_folder("write")
        paths = [os.path.join(folder, name) for name in names]
    else:
        folder = None
        paths = [target.url_of(name + PART) for name in names]
    digits = len(str(len(items)))
    jobs = [(path, [items[i] for i in shard], [f"{i:0{digits}d}" for i in shard], on_bad)
            for path, shard in zip(paths, shards)]
    rows: Dict[str, Any] = {}  # shard path -> its manifest row, scanned as it is finished
    final = dict(zip(paths, names))
    placed: List[str] = []  # shards uploaded under their final names

    def finished(shard: Written) -> None:
        if shard.samples and not (on_bad == "error" and shard.bad):
            keys = {name: tuple(values) for name, values in shard.keys.items() if any(v >= 0 for v in values)}
            rows[shard.path] = replace(build_manifest([shard.path], offsets=True)[0], keys=keys or None,
                                       url=target.url_of(final[shard.path]))
            if target.remote:  # each PUT is atomic: uploaded now, under its final name
                target.place(final[shard.path], shard.path)
                placed.append(final[shard.path])
        else:  # every file of it left out (no empty shard), or a write that fails: none of it kept
            os.remove(shard.path)
        if progress:
            progress(len(shard.samples) + len(shard.bad))

    try:
        everything = run(jobs, max(1, min(processes or os.cpu_count() or 1, len(jobs))), finished)
        bad = [(path, problem) for w in everything for path, problem in w.bad]
        if bad and on_bad == "error":
            for name in placed:  # the marker stays, as after any error: a read refuses the output
                target.delete(name)
            raise bad_files_error(bad, source)
        if bad:
            log.warning("%d bad %s left out (on_bad='skip'): %s%s", len(bad), bad_files(bad)[0],
                        "; ".join(f"{path}: {problem}" for path, problem in bad[:5]), " …" if len(bad) > 5 else "")
        written = [w for w in everything if w.samples]
        if not written:
            raise ConfigError(f"all {len(items)} {bad_files(bad)[0]} are bad, nothing to write (the first: {bad[0][0]}: "
                              f"{bad[0][1]})", url=source)
        commit(target, [] if target.remote else [(final[w.path], w.path) for w in written],
               lambda: write_manifest([rows[w.path] for w in written], target.url_of(MANIFEST), storage_options,
                                      extra=_record(inputs, written, bad)))
        names = [final[w.path] for w in written]
    except BaseException:
        for path in paths:  # what is not placed yet: the marker stays, and a read refuses the output
            if os.path.exists(path):
                os.remove(path)
        raise
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return {"shards": len(names), "samples": sum(len(w.samples) for w in written), "classes": inputs.classes,
            "manifest": target.url_of(MANIFEST), "urls": [target.url_of(n) for n in names], "skipped": len(bad),
            "bad": bad, "duplicates": len(inputs.duplicates)}
