"""E2: copy bandwidth against buffer size, hot (as the paper measured) and cache-busted.

ewkern.copy float32 (variant auto) over buffer sizes from MiB to GiB on a log axis, with the
theoretical peak and the run's measured copy bandwidth drawn as lines. The hot series shows the
L2 region the paper saw (above peak while in+out fit in L2); the cold series does not.
"""

from __future__ import annotations

from .common import check_bytes, line_figure, pow2_sizes, size_table, sizes_arg
from .timing import BufferPool, plan_elementwise

NAME = "e2"
TITLE = "Copy bandwidth against buffer size"
DESCRIPTION = "ewkern.copy float32 GB/s vs buffer size (log x), hot and cache-busted, peak drawn"
PAPER = "elementwise-ops-on-gpus.md"
ARGS = [("--e2-sizes", dict(type=sizes_arg, metavar="SIZES",
                            help="buffer sizes (bytes per array), e.g. 1MiB,16MiB,1GiB"))]


def _sizes(ctx):
    return ctx.pick("e2_sizes",
                    gpu_full=pow2_sizes(1 << 20, 4 << 30),
                    gpu_quick=[1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30],
                    cpu_full=pow2_sizes(1 << 20, 512 << 20),
                    cpu_quick=[1 << 20, 8 << 20, 64 << 20])


def check(ctx):
    check_bytes(ctx, 2 * max(_sizes(ctx)), "e2's largest copy (input + output)")


def _modes(ctx):
    return ["hot"] if ctx.cache == "hot" else ["hot", ctx.cache]


def run(ctx, xr):
    sizes = _sizes(ctx)
    modes = _modes(ctx)
    xr.param(sizes=sizes, modes=modes, op="copy", dtype="float32", variant="auto")
    bar = xr.progress(len(sizes) * len(modes))
    for size in sizes:
        pool = BufferPool()
        n = size // 4
        for mode in modes:
            make_plan, set_bytes = plan_elementwise("copy", "float32", (n,), ctx.device, pool=pool)
            xr.measure(what=f"copy {size >> 20} MiB {mode}", make_plan=make_plan, set_bytes=set_bytes,
                       cache=mode, series=mode, op="copy", variant="auto", dtype="float32", n=n,
                       size_bytes=size)
        pool.clear()
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    if not ms:
        return []
    fig = line_figure(results, ms, kind="global memory",
                      subtitle="ewkern.copy float32; series = cache mode (hot = no cache busting)")
    return [("e2_copy_size", fig)]


def summary(results, exp):
    return size_table(exp["measurements"])
