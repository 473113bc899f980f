"""The one timing rule of ``dalistream bench``, applied to every system by the same code.

A system is *opened* by a function of the spec that returns an :class:`Opened` (its batches,
how to count a batch, how to close it). :func:`run_system` imports the system's libraries,
then starts the clock, opens the system and drains it through :func:`timed`; nothing else in
the bench takes times. The rule:

- library imports (torch, DALI, webdataset, dalistream) happen before the clock, for every
  system: a training script has imported them anyway;
- time to first batch runs from the start of the loader's construction to the first batch;
- samples/s is the steady rate after the first batch: (samples − first batch's) / (end − first);
- CPU per sample is the CPU time of the process tree between the first batch and the end, split
  into the main process (all its threads, DALI's thread pool included) and its descendants
  (DALI's Python workers, DataLoader workers).

:func:`open_fake` is a system of known cost: the rule's own test.
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from .monitor import split_cpu_s

Count = Callable[[Any], Tuple[int, int]]


@dataclass
class Opened:
    """A system ready to run: ``batches`` (iterable), ``count(batch) -> (samples, payload bytes)``,
    ``close()``, and ``extra()``: figures the system adds to the result after the run."""

    batches: Iterable[Any]
    count: Count
    close: Callable[[], None] = lambda: None
    extra: Callable[[], Dict[str, Any]] = dict


def _own_cpu() -> Tuple[float, float]:
    return split_cpu_s(os.getpid())


# /proc counts CPU time in clock ticks: a steady phase shorter than a few ticks of CPU is not
# measured (None), rather than reported as 0 or as one tick's worth
MIN_CPU_TICKS = 5


def timed(batches: Iterable[Any], count: Count, t0: float, *, clock: Callable[[], float] = time.perf_counter,
          cpu: Callable[[], Tuple[float, float]] = _own_cpu) -> Dict[str, Any]:
    """Drain ``batches`` under the rule above; ``t0`` is the clock's reading before the system
    was opened. ``clock`` and ``cpu`` are injectable so that the rule itself can be tested."""
    samples = payload = n_batches = 0
    first: Optional[float] = None
    first_samples = first_payload = 0
    cpu_first = (0.0, 0.0)
    for batch in batches:
        n, b = count(batch)
        samples += n
        payload += b
        n_batches += 1
        if first is None:
            first = clock()
            first_samples, first_payload = n, b
            cpu_first = cpu()
    end = clock()
    if first is None:
        return {"samples": 0, "batches": 0, "first_batch_s": None, "samples_per_s": None}
    cpu_end = cpu()
    steady, steady_samples = end - first, samples - first_samples
    main_s, workers_s = cpu_end[0] - cpu_first[0], cpu_end[1] - cpu_first[1]
    measurable = cpu is not _own_cpu or main_s + workers_s >= MIN_CPU_TICKS / os.sysconf("SC_CLK_TCK")
    per_sample = (lambda s: s / steady_samples * 1000) if steady_samples and measurable else (lambda s: None)
    return {
        "samples": samples, "batches": n_batches, "payload_bytes": payload,
        "first_batch_s": first - t0, "total_s": end - t0,
        "samples_per_s": steady_samples / steady if steady > 0 else None,
        "overall_samples_per_s": samples / (end - t0) if end > t0 else None,
        "payload_mb_per_s": (payload - first_payload) / steady / 1e6 if steady > 0 else None,
        "steady_cpu_ms_per_sample": per_sample(main_s + workers_s),
        "main_cpu_ms_per_sample": per_sample(main_s),
        "workers_cpu_ms_per_sample": per_sample(workers_s),
    }


def run_system(spec: Mapping[str, Any],
               systems: Mapping[str, Tuple[Sequence[Union[str, Callable[[], Any]]], Callable[..., Opened]]], *,
               clock: Callable[[], float] = time.perf_counter,
               cpu: Callable[[], Tuple[float, float]] = _own_cpu) -> Dict[str, Any]:
    """Run ``spec["system"]``: ``systems[name] = (modules to import before the clock, open(spec))``; a
    module is named, or a function that imports it (a library imported in a way of its own)."""
    modules, open_system = systems[spec["system"]]
    for module in modules:
        module() if callable(module) else importlib.import_module(module)
    t0 = clock()
    opened = open_system(spec)
    try:
        result = timed(opened.batches, opened.count, t0, clock=clock, cpu=cpu)
        result.update(opened.extra())
    finally:
        opened.close()
    result["system"] = spec["system"]
    return result


# -- a system of known cost (tests the rule) ------------------------------------------------------

def open_fake(spec: Dict[str, Any], sleep: Callable[[float], None] = time.sleep) -> Opened:
    """``spec["batches"]`` batches of ``batch_size`` samples; opening takes ``open_s``, the first
    batch ``first_s``, every other ``per_batch_s`` (slept through ``sleep``)."""
    def batches():
        for i in range(spec["batches"]):
            sleep(spec["first_s"] if i == 0 else spec["per_batch_s"])
            yield spec["batch_size"]

    sleep(spec.get("open_s", 0.0))
    return Opened(batches(), lambda b: (b, 0), extra=lambda: {"device": "cpu"})
