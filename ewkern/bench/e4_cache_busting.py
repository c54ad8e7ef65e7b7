"""E4: the cache-busting copy experiment, per iteration.

Ten 16 MiB copies, each launch timed alone with no warm-up: once with offset 0 (the same
16 MiB every iteration: L2-hot after the first), once with the offset advancing 16 MiB per
iteration through a 2 GiB pool (cold every time). Only the segments the iterations touch are
allocated (iteration i uses segment i mod pool/size), and the L2 is flushed (time_plans' flush=)
before the first iteration of each series.
"""

from __future__ import annotations

from .common import bytes_arg, check_bytes, count_arg, md_table, fmt_gbs
from .plots import bandwidth_title, draw_bandwidth_lines, new_figure
from .timing import core, ew, new_filled, time_sequence
from .units import fmt_bytes

NAME = "e4"
TITLE = "Cache-busting copy: offset 0 against a rotating offset"
DESCRIPTION = "16 MiB copies x 10 iterations: same buffer (L2-hot) vs rotating offset in 2 GiB, GB/s per iteration"
PAPER = "elementwise-ops-on-gpus.md"
CPU = False
CPU_SKIP = "the paper's GPU L2 experiment; on a CPU, E2 and E3 compare hot with cache-busted timings"
ARGS = [("--e4-size", dict(type=bytes_arg(), metavar="BYTES", help="copy size (default 16MiB)")),
        ("--e4-pool", dict(type=bytes_arg(), metavar="BYTES", help="rotation pool (default 2GiB)")),
        ("--e4-iterations", dict(type=count_arg(), metavar="N", help="iterations (default 10)"))]


def _params(ctx):
    size = ctx.opt("e4_size", 16 << 20)
    pool = max(ctx.opt("e4_pool", 2 << 30), size)
    iters = ctx.opt("e4_iterations", 10)
    return size, pool, iters


def check(ctx):
    size, pool, iters = _params(ctx)
    segments = min(iters, pool // size)
    check_bytes(ctx, 2 * size * segments, "e4's rotating segments (input + output)")


def run(ctx, xr):
    size, pool, iters = _params(ctx)
    n = size // 4
    segments = max(1, min(iters, pool // size))
    xr.param(size_bytes=size, pool_bytes=pool, iterations=iters, op="copy", dtype="float32")
    xr.note(f"rotating: iteration i copies segment i mod {pool // size} of a {fmt_bytes(pool)} pool; "
            f"the {segments} segments touched are allocated")
    xr.note("each launch timed alone (CUDA events, no warm-up); GB/s counts read + write (2 x 16 MiB)")
    C = core()
    # the same 16 MiB every iteration
    a = new_filled((n,), "float32", ctx.device, 0.5)
    b = ew().empty((n,), dtype="float32", device=ctx.device)
    plan0 = C.prepare(ew().copy, a, out=b)
    bar = xr.progress(2)
    for series, plans in (("offset 0", None), (f"rotating offset ({fmt_bytes(pool)} pool)", "rot")):
        if plans == "rot":
            segs = [(new_filled((n,), "float32", ctx.device, 0.5),
                     ew().empty((n,), dtype="float32", device=ctx.device)) for _ in range(segments)]
            plans = [C.prepare(ew().copy, s[0], out=s[1]) for s in segs]
            seq = [plans[i % segments] for i in range(iters)]
        else:
            seq = [plan0] * iters
        secs = time_sequence(seq, flush_first=ctx.cfg.ewkern_flush_buffer())
        for i, t in enumerate(secs):
            gbs = 2 * size / t / 1e9
            xr.add({"series": series, "impl": "ewkern", "op": "copy", "variant": "auto", "dtype": "float32",
                    "n": n, "size_bytes": size, "iteration": i + 1, "cache": "hot" if series == "offset 0" else "rotate",
                    "bytes_read": size, "bytes_written": size, "bytes": 2 * size, "launches": 1, "sets": 1,
                    "samples_s": [t], "stats_s": {"min": t, "median": t, "mean": t, "std": 0.0, "max": t,
                                                  "count": 1},
                    "time_s": t, "gbs": gbs,
                    "pct_peak": 100 * gbs / ctx.peak_gbs if ctx.peak_gbs else None,
                    "method": "CUDA events, one launch per sample, ewkern._C.time_plans"})
        bar.step(series)
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    fig, axes = new_figure(8, 4.8)
    ax = axes[0][0]
    for series in dict.fromkeys(m["series"] for m in ms):
        rows = sorted((m for m in ms if m["series"] == series), key=lambda m: m["iteration"])
        ax.plot([m["iteration"] for m in rows], [m["gbs"] for m in rows], marker="o", label=series)
    draw_bandwidth_lines(ax, results)
    ax.set_xlabel("iteration")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    size = ms[0]["size_bytes"] if ms else 0
    ax.set_title(bandwidth_title(results, "global memory", f"{fmt_bytes(size)} copies, per iteration"),
                 fontsize=10)
    return [("e4_cache_busting", fig)]


def summary(results, exp):
    ms = exp["measurements"]
    series = list(dict.fromkeys(m["series"] for m in ms))
    iters = sorted({m["iteration"] for m in ms})
    rows = []
    for i in iters:
        row = [i]
        for s in series:
            m = next((x for x in ms if x["series"] == s and x["iteration"] == i), None)
            row.append(fmt_gbs(m["gbs"]) if m else "-")
        rows.append(row)
    return md_table(["iteration"] + [f"{s} GB/s" for s in series], rows)
