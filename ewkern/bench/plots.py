"""Figures from a results dict (a fresh run's or one loaded with ``ewkern.bench.load``).

Every function takes the results dict and returns matplotlib Figures; nothing here measures.
Figures are built with the object-oriented API (no pyplot state), so they save headless (Agg)
and display in notebooks alike.

    import ewkern.bench as eb
    res = eb.load("results/NVIDIA_H100_80GB_HBM3")
    for name, fig in eb.plots.figures(res, "e2"):
        fig.savefig(name + ".png")
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["figures", "save_all", "new_figure", "draw_bandwidth_lines", "bandwidth_title",
           "size_axis", "series_colors"]


def new_figure(width=8.0, height=4.8, ncols=1, nrows=1, sharey=False):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=sharey, squeeze=False)
    return fig, axes


def bandwidth_title(results: dict, kind: str = "element-wise", extra: str = "") -> str:
    """Titles like the paper's: "NVIDIA H100 80GB HBM3 element-wise bandwidth (peak 3352 GB/s)"."""
    name = results.get("device_name") or results.get("device") or "device"
    peak = results.get("peak_gbs")
    head = f"{name} {kind} bandwidth" + (f" (peak {peak:.0f} GB/s)" if peak else "")
    return head + (f"\n{extra}" if extra else "")


def draw_bandwidth_lines(ax, results: dict, *, orientation="h"):
    """The theoretical peak and the run's measured copy bandwidth, as lines on a GB/s axis."""
    peak = results.get("peak_gbs")
    ref = (results.get("reference") or {}).get("copy_gbs")
    line = ax.axhline if orientation == "h" else ax.axvline
    if peak:
        line(peak, color="black", linestyle="--", linewidth=1.2, label=f"theoretical peak {peak:.0f} GB/s")
    if ref:
        cache = (results.get("reference") or {}).get("cache", "")
        line(ref, color="dimgray", linestyle=":", linewidth=1.4,
             label=f"measured copy {ref:.0f} GB/s ({cache})")


def size_axis(ax, sizes=None, label="buffer size"):
    """A log2 x axis labelled in KiB/MiB/GiB."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    from .units import fmt_bytes
    ax.set_xscale("log", base=2)
    if sizes:
        ticks = sorted(set(int(s) for s in sizes))
        if len(ticks) > 12:
            ticks = ticks[::2]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_bytes(v).replace(" ", "")))
    ax.set_xlabel(label)
    for t in ax.get_xticklabels():
        t.set_rotation(30)


def mark_cache(ax, results: dict):
    """A vertical line at the L2 size (the last-level cache on a CPU)."""
    l2 = (results.get("device_info") or {}).get("l2_bytes") or results.get("cache_bytes")
    if l2:
        name = "L2" if (results.get("device_info") or {}).get("l2_bytes") else "LLC"
        ax.axvline(l2, color="tab:gray", alpha=0.4, linewidth=6, label=f"{name} {l2 / 2**20:.0f} MiB")


def series_colors(names):
    import matplotlib
    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def figures(results: dict, experiment: str):
    """[(file stem, Figure)] for one experiment of a results dict ([] when it has nothing to plot)."""
    from . import registry
    exp = (results.get("experiments") or {}).get(experiment)
    if not exp or exp.get("status") == "skipped":
        return []
    if not exp.get("measurements") and not exp.get("tables"):
        return []
    return registry.get(experiment).figures(results, exp)


def save_all(results: dict, out, dpi=110) -> list[str]:
    """Write every experiment's figures as PNG files under out; returns the file names."""
    out = Path(out)
    written = []
    for name in list((results.get("experiments") or {}).keys()):
        try:
            figs = figures(results, name)
        except Exception as exc:   # one bad figure must not cost the others
            import sys
            print(f"{name}: plotting failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        for stem, fig in figs:
            path = out / f"{stem}.png"
            fig.savefig(path, dpi=dpi)
            written.append(path.name)
    return written
