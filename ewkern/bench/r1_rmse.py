"""R1: the batched-RMSE optimisation ladder on 16 batches of 1024 x 1024 float32.

Every ewkern.rmse version in ladder order (atomic, block, multiblock, occupancy, int32, auto):
min / median / mean +- sd / max time per launch, registers per thread (ewkern.kernel_info, as
the paper reads CUDA.registers), the first results and the largest relative error against a
float64 NumPy reference. The paper went from about 20 ms (atomics) to about 0.7 ms.
"""

from __future__ import annotations

import math

from .common import bars_figure, md_table, shape_arg
from .frameworks import available, rmse_call
from .timing import BufferPool, ew, kernel_info, plan_rmse, variants
from .units import fmt_shape

NAME = "r1"
TITLE = "Batched RMSE optimisation ladder"
DESCRIPTION = "rmse versions (atomic -> block -> multiblock -> occupancy -> int32 -> auto) on 16x1024x1024: times, registers"
PAPER = "batched-rmse-kernel-analysis.txt"
# a 1-D shape is one batch (ewkern.rmse), which the per-batch reference does not read so
ARGS = [("--r1-shape", dict(type=shape_arg("BxHxW or BxN (batch first, then the reduced axes)", ndim=(2, None)),
                            metavar="BxHxW", help="shape, batch first (default 16x1024x1024; CPU 16x256x256, "
                                                  "quick 16x128x128)"))]

LADDER = ["atomic", "block", "multiblock", "occupancy", "int32", "auto"]


def _shape(ctx):
    return tuple(ctx.pick("r1_shape", gpu_full=(16, 1024, 1024), gpu_quick=(16, 1024, 1024),
                          cpu_full=(16, 256, 256), cpu_quick=(16, 128, 128)))


def check(ctx):
    from .common import check_bytes
    check_bytes(ctx, 2 * 4 * math.prod(_shape(ctx)), "r1's inputs")


def _order(names):
    known = [v for v in LADDER if v in names]
    return known + [v for v in names if v not in known]


def run(ctx, xr):
    import numpy
    shape = _shape(ctx)
    names = _order(variants("rmse", "float32", ctx.device)) or ["auto"]
    xr.param(shape=list(shape), dtype="float32", variants=names, batches=shape[0],
             elements_per_batch=math.prod(shape[1:]))
    if shape != (16, 1024, 1024):
        xr.note(f"shape {fmt_shape(shape)} (the paper's is 16x1024x1024)")
    missing = [v for v in LADDER if v not in names]
    if missing:
        xr.note(f"versions not built for {ctx.device}: {', '.join(missing)}")
    rng = numpy.random.default_rng(1)
    a = rng.random(shape, dtype=numpy.float32)
    b = rng.random(shape, dtype=numpy.float32)
    ref = numpy.sqrt(((a.astype(numpy.float64) - b) ** 2).reshape(shape[0], -1).mean(axis=1))
    ea, eb = ew().asarray(a, device=ctx.device), ew().asarray(b, device=ctx.device)
    torch_why = available("torch", ctx.device)
    bar = xr.progress(len(names) + (0 if torch_why else 1))
    pool = BufferPool()
    for v in names:
        try:
            res = numpy.asarray(ew().rmse(ea, eb, variant=v).numpy(), dtype=numpy.float64).reshape(-1)
            err = float(numpy.max(numpy.abs(res - ref) / ref))
            first = [float(x) for x in res[:3]]
        except Exception as exc:
            xr.error(f"rmse {v}", exc)
            continue
        ki = kernel_info("rmse", v, "float32")
        make_plan, set_bytes = plan_rmse(shape, "float32", ctx.device, variant=v, pool=pool)
        xr.measure(what=f"rmse {v}", make_plan=make_plan, set_bytes=set_bytes, cache=ctx.cache, series=v,
                   op="rmse", variant=v, dtype="float32", shape=list(shape), n=math.prod(shape),
                   registers=ki.get("num_regs"), local_bytes=ki.get("local_size_bytes"),
                   about=ki.get("about"), first=first, max_rel_err=err)
    if torch_why is None:
        xr.measure_peer(what="torch eager", impl="torch", cache=ctx.cache,
                        build=lambda: rmse_call("torch eager", (shape[0], math.prod(shape[1:])), "float32",
                                                ctx.device, 1),
                        series="torch eager", op="rmse", variant="torch.sqrt(((a-b)**2).mean(1))",
                        dtype="float32", shape=list(shape), n=math.prod(shape))
    pool.clear()
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    cats = [m["series"] for m in ms]
    vals = {(m["series"], "median"): m["time_s"] * 1e3 for m in ms}
    fig = bars_figure(results, cats, ["median"], vals, kind="", lines=False, log=True,
                      ylabel="time per launch (ms, median)",
                      subtitle=f"{results.get('device_name')}: batched RMSE "
                               f"{fmt_shape(ms[0]['shape']) if ms else ''} float32, cache: "
                               f"{ms[0]['cache'] if ms else '?'}")
    ax = fig.axes[0]
    for i, m in enumerate(ms):
        if m.get("registers"):
            ax.annotate(f"{m['registers']} regs", (i, m["time_s"] * 1e3), ha="center", va="bottom", fontsize=8)
    return [("r1_rmse", fig)]


def summary(results, exp):
    ms = exp["measurements"]
    rows = []
    for m in ms:
        st = m["stats_s"]
        rows.append([m["series"], f"{st['min'] * 1e3:.3f}", f"{st['median'] * 1e3:.3f}",
                     f"{st['mean'] * 1e3:.3f} +- {st['std'] * 1e3:.3f}", f"{st['max'] * 1e3:.3f}",
                     f"{m['gbs']:.0f}", m.get("registers") or "-",
                     ", ".join(f"{x:.7f}" for x in (m.get("first") or [])) or "-",
                     f"{m['max_rel_err']:.1e}" if m.get("max_rel_err") is not None else "-"])
    return md_table(["version", "min ms", "median ms", "mean +- sd ms", "max ms", "GB/s", "registers",
                     "first results", "max rel err"], rows)
