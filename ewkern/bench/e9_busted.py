"""E9: the elementwise plots again with cache busting: float32 against bfloat16 over sizes.

Each op in float32 and bfloat16, buffer sizes from 8 MiB to 2 GiB, timed cold (the run's
--cache mode; rotate when --cache hot). The paper's A100: under 60% of peak at 8 MiB, almost
85% at 2 GiB; bfloat16 a bit slower than float32 there.
"""

from __future__ import annotations

from .common import (check_bytes, check_names, elementwise_ops, line_figure, list_arg, md_table, pow2_sizes, sizes_arg,
                     fmt_gbs, fmt_pct)
from .timing import BufferPool, plan_elementwise
from .units import ITEMSIZE, fmt_bytes

NAME = "e9"
TITLE = "Elementwise bandwidth with cache busting, float32 against bfloat16"
DESCRIPTION = "add/add_const/log/erf GB/s vs size (8 MiB-2 GiB), cache-busted, float32 vs bfloat16"
PAPER = "elementwise-ops-on-gpus.md"
CPU = False
CPU_SKIP = "the GPU L2-vs-HBM size sweep; on a CPU, E3 times each op and dtype hot and cache-busted"
ARGS = [("--e9-sizes", dict(type=sizes_arg, metavar="SIZES", help="buffer sizes, e.g. 8MiB,128MiB,2GiB")),
        ("--e9-ops", dict(type=list_arg, metavar="OPS", help="ops (default add,add_const,log,erf)"))]


def _params(ctx):
    sizes = ctx.pick("e9_sizes", gpu_full=pow2_sizes(8 << 20, 2 << 30),
                     gpu_quick=[8 << 20, 128 << 20, 2 << 30], cpu_full=[], cpu_quick=[])
    ops = ctx.opt("e9_ops") or (["add", "log", "erf"] if ctx.quick else ["copy", "add", "add_const", "log", "erf"])
    return sizes, ops


def check(ctx):
    sizes, ops = _params(ctx)
    check_names("--e9-ops", ops, elementwise_ops())
    check_bytes(ctx, 3 * max(sizes), "e9's largest size")


def run(ctx, xr):
    sizes, ops = _params(ctx)
    dtypes = ["float32", "bfloat16"]
    cache = ctx.cold_cache
    xr.param(sizes=sizes, ops=ops, dtypes=dtypes, cache=cache, variant="auto")
    xr.note("size = bytes per buffer, so bfloat16 has twice the elements of float32 at a size")
    bar = xr.progress(len(sizes) * len(ops) * len(dtypes))
    for size in sizes:
        pool = BufferPool()
        for dtype in dtypes:
            n = size // ITEMSIZE[dtype]
            for op in ops:
                make_plan, set_bytes = plan_elementwise(op, dtype, (n,), ctx.device, pool=pool)
                xr.measure(what=f"{op} {dtype} {fmt_bytes(size)}", make_plan=make_plan, set_bytes=set_bytes,
                           cache=cache, series=f"{op} {dtype}", op=op, variant="auto", dtype=dtype, n=n,
                           size_bytes=size)
        pool.clear()
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    styles = {}
    from .plots import series_colors
    ops = list(dict.fromkeys(m["op"] for m in ms))
    colors = series_colors(ops)
    for m in ms:
        styles[m["series"]] = {"color": colors[m["op"]], "linestyle": "-" if m["dtype"] == "float32" else "--"}
    fig = line_figure(results, ms, styles=styles,
                      subtitle=f"cache busting ({ms[0]['cache']}): float32 solid, bfloat16 dashed")
    return [("e9_busted", fig)]


def summary(results, exp):
    ms = exp["measurements"]
    series = list(dict.fromkeys(m["series"] for m in ms))
    sizes = sorted({m["size_bytes"] for m in ms})
    rows = []
    for s in series:
        row = [s]
        for size in sizes:
            m = next((x for x in ms if x["series"] == s and x["size_bytes"] == size), None)
            row.append("-" if m is None else f"{fmt_gbs(m['gbs'])} ({fmt_pct(m.get('pct_peak'))})")
        rows.append(row)
    return md_table(["op dtype"] + [fmt_bytes(s) for s in sizes], rows)
