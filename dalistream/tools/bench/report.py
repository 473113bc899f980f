"""``dalistream bench`` output: the medians table and ratios, where dalistream's time went, the
sweep table and plot."""

from __future__ import annotations

from typing import Any, Dict, List

from ...errors import ConfigError


def fmt(value: Any, width: int = 8, digits: int = 0) -> str:
    """A number right-aligned in ``width`` with ``digits`` decimals, or a dash."""
    return f"{value:{width}.{digits}f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


def _value(figures: Dict[str, Any], key: str) -> Any:
    if key.endswith("_us_per_sample"):  # shown in µs, kept in ms
        ms = figures.get(key.replace("_us_", "_ms_"))
        return ms * 1000 if isinstance(ms, (int, float)) else None
    return figures.get(key)


def format_report(report: Dict[str, Any]) -> str:
    """The medians table, ratios and dalistream's per-worker counters, as text."""
    cols = [("samples/s", "samples_per_s", 0), ("MB/s", "mb_per_s", 1), ("1st batch s", "first_batch_s", 2),
            ("RSS MB", "peak_rss_mb", 0), ("PSS MB", "peak_pss_mb", 0), ("shm MB", "peak_shm_mb", 1),
            ("CPU µs/smp", "steady_cpu_us_per_sample", 1), ("main µs", "main_cpu_us_per_sample", 1),
            ("workers µs", "workers_cpu_us_per_sample", 1), ("CPU ms/MB", "cpu_ms_per_mb", 1),
            ("convert s", "convert_s", 2)]
    head = f"{'system':18s}" + "".join(f"{c[0]:>12s}" for c in cols)
    lines = [head, "-" * len(head)]
    c = report.get("config", {})
    if "loadavg_1m" in c:
        lines.insert(0, f"(medians of {report.get('runs')} runs; {c['cpus']} CPUs, load average "
                        f"{c['loadavg_1m'][0]} before / {c['loadavg_1m'][1]} after: other load inflates wall times, "
                        f"CPU ms/sample much less)")
    if c.get("counts_from"):
        native = "; DALI's reader indexes the tars in every run" if "dali-native" in report.get("peers", {}) else ""
        lines.insert(1, f"(dalistream's counts: {c['counts_from']}, with an empty scan cache in every run, as on a "
                        f"user's first run{native})")
    rows = [("dalistream", report)] + list(report.get("peers", {}).items())
    for name, fig in rows:
        lines.append(f"{name:18s}" + "".join(fmt(_value(fig, key), 12, d) for _, key, d in cols))
    for name, fig in report.get("peers", {}).items():
        r = fig["ratio"]
        if name == "sequential-read":
            lines.append(f"dalistream delivers {fmt(100 * (r['samples_per_s'] or 0), 5, 1)}% of the sample rate of a "
                         "plain sequential read of the same files (the I/O limit)")
            continue
        lines.append(f"{'dalistream / ' + name:30s} throughput {fmt(r['samples_per_s'], 5, 2)}x   first batch "
                     f"{fmt(r['first_batch_s'], 5, 2)}x   peak RSS {fmt(r['peak_rss_mb'], 5, 2)}x   "
                     f"CPU/sample {fmt(r['steady_cpu_ms_per_sample'], 5, 2)}x   CPU/MB {fmt(r['cpu_ms_per_mb'], 5, 2)}x")
    epochs = [(name, fig.get("epoch_samples_per_s")) for name, fig in rows]
    if any(len(rates or ()) > 1 for _, rates in epochs):
        lines.append("samples/s per epoch (the first from its first batch on):")
        lines += [f"  {name:18s}" + "".join(fmt(r, 10) for r in rates) for name, rates in epochs if rates]
        for name, fig in report.get("peers", {}).items():
            if any(fig["ratio"].get("epoch_samples_per_s") or ()):
                lines.append(f"  {'dalistream / ' + name:30s}" + "".join(
                    fmt(r, 7, 2) + "x" for r in fig["ratio"]["epoch_samples_per_s"]))
    stats = report.get("worker_stats")
    if stats:
        lines.extend(_where_time_goes(stats))
        lines.extend(_epochs_io(stats))
    return "\n".join(lines)


def _epochs_io(stats: Dict[str, Any]) -> List[str]:
    """dalistream's remote bytes and byte-cache use per epoch (last run)."""
    lines = []
    for epoch, sums in sorted((int(e), v) for e, v in (stats.get("by_epoch") or {}).items()):
        io = sums.get("io") or {}
        if io.get("bytes") or io.get("cache_hits") or io.get("cache_misses"):
            lines.append(f"  epoch {epoch}: {io.get('bytes', 0) / 1e6:.1f} MB from the store in {io.get('requests', 0)} "
                         f"requests; cache {io.get('cache_hits', 0)} hits ({io.get('cache_bytes', 0) / 1e6:.1f} MB), "
                         f"{io.get('cache_misses', 0)} misses, {io.get('cache_evictions', 0)} evictions")
    return (["remote reads and the byte cache per epoch (last run; an epoch's read-ahead counts in it):"] + lines
            if lines else [])


def _where_time_goes(stats: Dict[str, Any]) -> List[str]:
    """dalistream's per-worker and loader counters of the last run, as text."""
    lines = ["where dalistream's time went (last run; worker counters include prefetched batches):"]
    for w in stats["workers"]:
        wall = w.get("wall_s") or 0.0
        io_wait, read, batch = w.get("io_wait_s", 0.0), w.get("read_s", 0.0), w.get("batch_s", 0.0)
        idle = max(0.0, wall - read - batch)
        pct = (lambda x: f"{100 * x / wall:4.0f}%") if wall else (lambda x: "   -")
        lines.append(f"  worker {w['worker']}: {w['samples']} samples, {w['bytes'] / 1e6:.1f} MB read; of {wall:.2f} s: "
                     f"I/O wait {pct(io_wait)}, parse {pct(read - io_wait)}, batching {pct(batch)}, idle {pct(idle)}; "
                     f"padded {w['padded']}")
    loop = stats.get("loader")
    if loop and loop.get("batches"):
        lines.append(f"  training loop: {loop['batches']} batches, waited {loop['wait_s']:.2f} s for them, "
                     f"{loop['step_s']:.2f} s in its own steps")
    lines.append("  (workers mostly idle: decode or the training step is the limit; I/O wait high: storage; "
                 "parse high: add workers)")
    return lines


def format_sweep(key: str, points: List[Dict[str, Any]]) -> str:
    """One line per swept value: samples/s and peak memory of each system."""
    names = ["dalistream"] + list(points[0].get("peers", {})) if points else []
    lines = [f"{key:>10s} " + "".join(f"{n + ' sps':>24s}{'RSS MB':>8s}{'PSS MB':>8s}" for n in names)]
    for point in points:
        figs = [point] + [point["peers"][n] for n in names[1:]]
        lines.append(f"{point['value']:>10d} " + "".join(
            f"{fmt(f.get('samples_per_s'), 24)}{fmt(f.get('peak_rss_mb'), 8)}{fmt(f.get('peak_pss_mb'), 8)}"
            for f in figs))
    return "\n".join(lines)


def plot_sweep(key: str, points: List[Dict[str, Any]], path: str) -> None:
    """Plot median samples/s (bars: min–max over repeats) and steady CPU ms per sample against
    the swept value (matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib", hint='pip install "dalistream[bench]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["dalistream"] + [n for n in points[0].get("peers", {}) if n != "sequential-read"]  # off the scale
    xs = [p["value"] for p in points]
    fig, (ax, ax_cpu) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for name in names:
        figs = [p if name == "dalistream" else p["peers"][name] for p in points]
        ys = [f.get("samples_per_s") or 0 for f in figs]
        runs = [[v for v in f.get("samples_per_s_runs", []) if v] or [0] for f in figs]
        err = [[y - min(r) for y, r in zip(ys, runs)], [max(r) - y for y, r in zip(ys, runs)]]
        label = name + (" (no workers: same run at every x)" if name == "dali-native" and key == "workers" else "")
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        ax_cpu.plot(xs, [f.get("steady_cpu_ms_per_sample") or 0 for f in figs], marker="o", label=name)
    c = points[0]["config"]
    fixed = ", ".join(f"{k.replace('_', ' ')} {c[k]}" for k in ("batch_size", "workers") if k != key)
    for axis, ylabel in ((ax, "samples/s (median; bars min-max)"), (ax_cpu, "CPU ms per sample, whole process tree")):
        axis.set_xlabel(key.replace("_", " "))
        axis.set_ylabel(ylabel)
        axis.set_xticks(xs)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{c['pipeline']}, {fixed}, {c['device']} decode, {c['cpus']} cores, "
                 f"{c.get('size', '')} px output", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
