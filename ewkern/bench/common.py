"""Helpers the experiment modules share: option types, sweeps, standard figures and tables."""

from __future__ import annotations

import argparse

from .plots import (bandwidth_title, draw_bandwidth_lines, mark_cache, new_figure, series_colors,
                    size_axis)
from .summary import fmt_gbs, fmt_pct, md_table
from .units import fmt_bytes, parse_bytes, parse_count, parse_list, parse_shape

__all__ = ["sizes_arg", "shapes_arg", "shapes_of", "list_arg", "counts_arg", "bytes_arg", "count_arg",
           "shape_arg", "check_names", "elementwise_ops", "check_bytes", "method_caches", "pow2_sizes",
           "line_figure", "bars_figure", "size_table", "fmt_bytes", "fmt_gbs", "fmt_pct", "md_table",
           "median_ratio_interval", "below_beyond_spread", "spread_note"]

def _parsed(parse, text):
    """parse(text), its ValueError an ArgumentTypeError with the same message: argparse words a
    ValueError from a type as "invalid parse_shape value: 'abc'", naming an internal function and not
    what the option takes (the parse_* messages say that)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sizes_arg(text):
    """argparse type: a comma-separated list of byte sizes."""
    sizes = _parsed(lambda t: parse_list(t, parse_bytes), text)
    if not sizes or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive: {text!r}")
    return sizes


def _at_least(parse, least: int, unit: str = ""):
    """argparse type: one value parse() reads, of at least `least` (unit words it in the message)."""
    def value(text):
        n = -1 if str(text).strip().startswith("-") else _parsed(parse, text)   # "-5": not "not a size"
        if n < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}{unit}: {text!r}")
        return n
    return value


def bytes_arg(least: int = 1):
    """argparse type: one byte size of at least `least` bytes (4MiB, 1GiB, 2^20, or plain bytes)."""
    return _at_least(parse_bytes, least, f" byte{'s' if least != 1 else ''}")


def count_arg(least: int = 1):
    """argparse type: one whole count of at least `least` (20000, 2^20, 16M): elements, calls, runs."""
    return _at_least(parse_count, least)


def _shape_checked(shape, text, ndim, what):
    """shape when every axis is at least 1 and its axes number ndim (min, max; max None: no limit)."""
    low, high = ndim
    if len(shape) < low or (high is not None and len(shape) > high):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    if any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"every axis must be at least 1, got {text!r}")
    return shape


def shape_arg(what: str = "a shape", ndim=(1, None)):
    """argparse type: one shape (16x1024x1024) with every axis at least 1 and ndim = (min, max) axes
    (max None: any number); `what` words the expected form for the message."""
    def shape(text):
        return _shape_checked(_parsed(parse_shape, text), text, ndim, what)
    return shape


def shapes_of(what: str = "shapes", ndim=(1, None)):
    """argparse type: a comma-separated list of shapes (1024x3072,2048x3072), each as shape_arg's."""
    def shapes(text):
        out = _parsed(lambda t: parse_list(t, parse_shape), text)
        if not out:
            raise argparse.ArgumentTypeError(f"no shape given: {text!r} (expected e.g. 1024x3072,2048x3072)")
        return [_shape_checked(s, text, ndim, what) for s in out]
    return shapes


shapes_arg = shapes_of()


def counts_arg(text):
    """argparse type: a comma-separated list of counts, each at least 1."""
    counts = _parsed(lambda t: parse_list(t, parse_count), text)
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"counts must be at least 1: {text!r}")
    return counts


def list_arg(text):
    """argparse type: a comma-separated list of names (ops, dtypes, methods ...). An empty one is
    refused: it had meant the option's default, so `--peers-ops ""` timed every op."""
    names = parse_list(text)
    if not names:
        raise argparse.ArgumentTypeError(f"no name given: {text!r} (expected a comma-separated list; "
                                         "leave the option out for its default)")
    return names


def elementwise_ops() -> list[str]:
    """ewkern's elementwise ops (its registry's elementwise family), the names --*-ops take."""
    from .timing import ew
    return [r["name"] for r in ew().ops() if r.get("family", "elementwise") == "elementwise"]


def check_names(flag: str, named, known):
    """BenchError naming the values of flag that are not among known, and what it takes: before
    anything runs (an unknown op left every cell out and the run passed)."""
    bad = [x for x in named if x not in known]
    if bad:
        from .timing import BenchError
        raise BenchError(f"{flag}: {', '.join(bad)} not known; it takes {', '.join(known)}")


def method_caches(cache: str, methods: dict) -> dict:
    """Each timed method's cache mode (train's and fused's methods -> their fixed modes): back-to-back
    rotates its inputs, or takes the same inputs every call where the run asks for --cache hot;
    single calls are flushed whatever --cache says (the method is the mode), and --cache flush leaves
    back-to-back rotating, as no flush fits between K calls run back to back."""
    return {**methods, "back-to-back": "hot" if cache == "hot" else "rotate"}


def pow2_sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def check_bytes(ctx, nbytes: int, what: str):
    """BenchError when one buffer set of nbytes cannot be allocated on the run's device."""
    ctx.cfg.check_fits(int(nbytes), what)


def _by_series(ms, key):
    groups = {}
    for m in ms:
        groups.setdefault(m.get(key), []).append(m)
    return groups


def line_figure(results, ms, *, kind="element-wise", subtitle="", series_key="series",
                x_key="size_bytes", x_label="buffer size", styles=None):
    """GB/s against size, one line per series, with peak and measured-copy lines and the L2 size."""
    fig, axes = new_figure(8.5, 5.0)
    ax = axes[0][0]
    groups = _by_series(ms, series_key)
    colors = series_colors(list(groups))
    xs_all = []
    for name, rows in groups.items():
        rows = sorted((r for r in rows if r.get("gbs") is not None), key=lambda r: r[x_key])
        xs = [r[x_key] for r in rows]
        xs_all += xs
        style = (styles or {}).get(name, {})
        ax.plot(xs, [r["gbs"] for r in rows], marker="o", markersize=4, label=str(name),
                color=style.get("color", colors[name]), linestyle=style.get("linestyle", "-"))
    draw_bandwidth_lines(ax, results)
    mark_cache(ax, results)
    size_axis(ax, xs_all, x_label)
    ax.set_ylabel("GB/s (read + write)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(bandwidth_title(results, kind, subtitle), fontsize=10)
    return fig


def bars_figure(results, categories, groups, values, *, kind="element-wise", subtitle="",
                ylabel="GB/s (read + write)", lines=True, log=False):
    """Grouped bars: one cluster per category, one bar per group; values[(category, group)]."""
    fig, axes = new_figure(max(6.0, 1.1 * len(categories) + 3), 4.8)
    ax = axes[0][0]
    colors = series_colors(groups)
    width = 0.8 / max(1, len(groups))
    for gi, g in enumerate(groups):
        xs = [ci + (gi - (len(groups) - 1) / 2) * width for ci in range(len(categories))]
        ys = [values.get((c, g)) for c in categories]
        ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
               width=width, label=str(g), color=colors[g])
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels([str(c) for c in categories], rotation=30 if len(categories) > 6 else 0)
    if lines:
        draw_bandwidth_lines(ax, results)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(bandwidth_title(results, kind, subtitle) if kind else subtitle, fontsize=10)
    return fig


def size_table(ms, series_key="series", x_key="size_bytes"):
    """Markdown: rows = sizes, columns = series, cells = GB/s (% of peak)."""
    groups = _by_series(ms, series_key)
    sizes = sorted({m[x_key] for m in ms})
    rows = []
    for s in sizes:
        row = [fmt_bytes(s)]
        for g, items in groups.items():
            m = next((r for r in items if r[x_key] == s), None)
            row.append("-" if m is None else f"{fmt_gbs(m.get('gbs'))} ({fmt_pct(m.get('pct_peak'))})")
        rows.append(row)
    return md_table(["size"] + [f"{g} GB/s" for g in groups], rows)


def median_ratio_interval(theirs, mine, key, level=0.90, resamples=200):
    """(low, high): the central `level` interval of median(theirs) / median(mine), the speed ratio
    of `mine` against `theirs` from two series of per-sample times, over `resamples` bootstrap
    resamples of both, seeded by repr(key) (the same interval every time); None with fewer than two
    samples on either side."""
    import zlib
    import numpy as np
    a, b = (np.asarray(x or [], dtype=float) for x in (theirs, mine))
    if a.size < 2 or b.size < 2:
        return None
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
    r = np.median(rng.choice(a, (resamples, a.size)), axis=1) / np.median(rng.choice(b, (resamples, b.size)), axis=1)
    tail = (1.0 - level) / 2 * 100
    return float(np.percentile(r, tail)), float(np.percentile(r, 100 - tail))


def below_beyond_spread(cells, threshold=0.99, level=0.90):
    """cells: {key: (ratio, their samples, my samples)}. Returns (the keys whose ratio is under
    threshold, lowest first; those of them whose `level` bootstrap interval of the ratio lies wholly
    under it, as {key: (low, high)}): the cells that are behind beyond their samples' spread."""
    below = sorted((k for k, v in cells.items() if v[0] < threshold), key=lambda k: cells[k][0])
    sure = {}
    for k in below:
        ci = median_ratio_interval(cells[k][1], cells[k][2], k, level)
        if ci and ci[1] < threshold:
            sure[k] = ci
    return below, sure


def spread_note(below, sure):
    """The summaries' sentence end for below_beyond_spread's result: how many cells below are
    behind beyond their samples' spread, and which (op, dtype, size) they are."""
    if not below:
        return "."
    return (f", {len(sure)} of them with the 90% bootstrap interval of the ratio wholly below 0.99"
            + (" (" + "; ".join(f"{k[-3]} {k[-2]} {fmt_bytes(k[-1])} {lo:.3f}-{hi:.3f}"
                                for k, (lo, hi) in sure.items()) + ")" if sure else "") + ".")



def how_timed(exp, ms, ways: str) -> str:
    """A summary's sentence on how a cell's ways were timed: in turns (the experiment's in_turns
    parameter) or one after another, and across how many runs its cells are read (merge --pool)."""
    from .frameworks import TURNS_WORDS
    turns = (exp.get("params") or {}).get("in_turns")
    if turns == "partly":     # merge --combine of runs timed either way
        how = (f"{ways} were timed in turns ({TURNS_WORDS}) in some of the merged runs and one after "
               "another in the others (each run's arguments: results.json, parts)")
    else:
        how = f"{ways} were timed in turns ({TURNS_WORDS})" if turns else f"{ways} were timed one after another"
    runs = max((len((m.get("pooled_runs_samples_s") or {}).get("samples_s", [])) for m in ms), default=0)
    if runs > 1:
        how += f"; the cells are read across {runs} runs (bench.merge --pool)"
    return how + "."
