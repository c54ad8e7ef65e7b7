"""E3: elementwise bandwidth per op and dtype at the baby-replit shapes, without and with cache busting.

The paper's shapes 1024x3072 and 2048x3072 (12-48 MiB of traffic) fit in large L2 caches, so
without cache busting the caches decide the result. Each op x dtype is timed hot (same buffers)
and cold (the run's --cache mode, rotate when --cache hot).
"""

from __future__ import annotations

import math

from .common import (bars_figure, check_names, elementwise_ops, list_arg, md_table, shapes_arg, check_bytes, fmt_gbs,
                     fmt_pct)
from .timing import BufferPool, plan_elementwise
from .units import ITEMSIZE, fmt_shape

NAME = "e3"
TITLE = "Elementwise bandwidth per op and dtype at the baby-replit shapes"
DESCRIPTION = "add/add_const/log/erf/... GB/s in float32 and bfloat16 at 1024x3072, 2048x3072, hot vs cold"
PAPER = "elementwise-ops-on-gpus.md"
ARGS = [("--e3-shapes", dict(type=shapes_arg, metavar="SHAPES", help="shapes, e.g. 1024x3072,2048x3072")),
        ("--e3-ops", dict(type=list_arg, metavar="OPS", help="ops, e.g. copy,add,add_const,log,erf")),
        ("--e3-dtypes", dict(type=list_arg, metavar="DTYPES", help="dtypes (default float32,bfloat16)"))]

QUICK_OPS = ["copy", "add", "add_const", "log", "erf"]
FULL_OPS = ["copy", "add", "sub", "mul", "add_const", "mul_const", "log", "exp", "erf", "tanh",
            "sqrt", "relu", "gelu", "silu"]


def _params(ctx):
    shapes = ctx.opt("e3_shapes") or [(1024, 3072), (2048, 3072)]
    ops = ctx.opt("e3_ops") or (QUICK_OPS if ctx.quick else FULL_OPS)
    dtypes = ctx.opt("e3_dtypes") or ["float32", "bfloat16"]
    return shapes, ops, dtypes


def check(ctx):
    shapes, ops, dtypes = _params(ctx)
    for d in dtypes:
        if d not in ITEMSIZE:
            from .timing import BenchError
            raise BenchError(f"--e3-dtypes: unknown dtype {d!r} (float32, float16, bfloat16, float64)")
    # an unknown op was skipped cell by cell: the run passed with nothing measured for it
    check_names("--e3-ops", ops, elementwise_ops())
    biggest = max(math.prod(s) for s in shapes) * max(ITEMSIZE[d] for d in dtypes)
    check_bytes(ctx, 3 * biggest, "e3's largest shape (2 inputs + output)")


def run(ctx, xr):
    shapes, ops, dtypes = _params(ctx)
    modes = ["hot", ctx.cold_cache]
    xr.param(shapes=[list(s) for s in shapes], ops=ops, dtypes=dtypes, modes=modes, variant="auto")
    bar = xr.progress(len(shapes) * len(ops) * len(dtypes) * len(modes))
    for shape in shapes:
        pool = BufferPool()
        n = math.prod(shape)
        for dtype in dtypes:
            for op in ops:
                for mode in modes:
                    try:
                        make_plan, set_bytes = plan_elementwise(op, dtype, shape, ctx.device, pool=pool)
                    except Exception as exc:
                        xr.skip(f"{op} {dtype}", str(exc))
                        continue
                    xr.measure(what=f"{op} {dtype} {fmt_shape(shape)} {mode}", make_plan=make_plan,
                               set_bytes=set_bytes, cache=mode, series=mode, op=op, variant="auto",
                               dtype=dtype, shape=list(shape), n=n,
                               size_bytes=n * ITEMSIZE[dtype])
        pool.clear()
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    figs = []
    shapes = []
    for m in ms:
        if m["shape"] not in shapes:
            shapes.append(m["shape"])
    modes = list(dict.fromkeys(m["cache"] for m in ms))
    for shape in shapes:
        for mode in modes:
            sel = [m for m in ms if m["shape"] == shape and m["cache"] == mode]
            if not sel:
                continue
            ops = list(dict.fromkeys(m["op"] for m in sel))
            dtypes = list(dict.fromkeys(m["dtype"] for m in sel))
            vals = {(m["op"], m["dtype"]): m["gbs"] for m in sel}
            busting = "no cache busting" if mode == "hot" else f"cache busting: {mode}"
            fig = bars_figure(results, ops, dtypes, vals,
                              subtitle=f"{fmt_shape(shape)}, {busting}")
            figs.append((f"e3_{fmt_shape(shape)}_{mode}", fig))
    return figs


def summary(results, exp):
    ms = exp["measurements"]
    modes = list(dict.fromkeys(m["cache"] for m in ms))
    keys = list(dict.fromkeys((fmt_shape(m["shape"]), m["op"], m["dtype"]) for m in ms))
    rows = []
    for k in keys:
        row = list(k)
        for mode in modes:
            m = next((x for x in ms if (fmt_shape(x["shape"]), x["op"], x["dtype"]) == k and x["cache"] == mode), None)
            row.append("-" if m is None else f"{fmt_gbs(m['gbs'])} ({fmt_pct(m.get('pct_peak'))})")
        rows.append(row)
    return md_table(["shape", "op", "dtype"] + [f"{mode} GB/s" for mode in modes], rows)
