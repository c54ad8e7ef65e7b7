"""E6: vectorisation: vec1 / vec2 / vec4 copy bandwidth against size.

In the global-memory region the paper found vec4 helping on the A100 only, and helping in L2.
Timed in the run's cache mode.
"""

from __future__ import annotations

from .catalog import pick_variants
from .common import check_bytes, line_figure, pow2_sizes, size_table, sizes_arg
from .timing import BufferPool, Skip, plan_elementwise, variants
from .units import fmt_bytes

NAME = "e6"
TITLE = "Vectorisation: vec1 / vec2 / vec4 copy against size"
DESCRIPTION = "copy float32 with vec1/vec2/vec4 loads and stores, GB/s vs size"
PAPER = "elementwise-ops-on-gpus.md"
ARGS = [("--e6-sizes", dict(type=sizes_arg, metavar="SIZES", help="buffer sizes, e.g. 1MiB,64MiB,1GiB"))]


def _sizes(ctx):
    return ctx.pick("e6_sizes", gpu_full=pow2_sizes(1 << 20, 2 << 30),
                    gpu_quick=[4 << 20, 64 << 20, 1 << 30],
                    cpu_full=pow2_sizes(1 << 20, 256 << 20), cpu_quick=[1 << 20, 16 << 20])


def check(ctx):
    check_bytes(ctx, 2 * max(_sizes(ctx)), "e6's largest copy")


def vec_variants(ctx):
    """{1: name, 2: name, 4: name} for copy; 32-bit indices and grid_dim1 preferred."""
    chosen = pick_variants("copy", "float32", ctx.device, "vec", [1, 2, 4], index_bits=32, grid=1)
    if len(chosen) < 2:
        chosen = pick_variants("copy", "float32", ctx.device, "vec", [1, 2, 4])
    return chosen


def run(ctx, xr):
    sizes = _sizes(ctx)
    chosen = vec_variants(ctx)
    if len(chosen) < 2:
        have = ", ".join(variants("copy", "float32", ctx.device)) or "none"
        raise Skip(f"ewkern has no vec1/vec2/vec4 copy variants on {ctx.device} (variants: {have})")
    xr.param(sizes=sizes, variants={f"vec{k}": v for k, v in chosen.items()}, dtype="float32")
    bar = xr.progress(len(sizes) * len(chosen))
    for size in sizes:
        pool = BufferPool()
        n = size // 4
        for vec, variant in sorted(chosen.items()):
            make_plan, set_bytes = plan_elementwise("copy", "float32", (n,), ctx.device, variant=variant, pool=pool)
            xr.measure(what=f"copy vec{vec} {fmt_bytes(size)}", make_plan=make_plan, set_bytes=set_bytes,
                       cache=ctx.cache, series=f"vec{vec}", op="copy", variant=variant, dtype="float32",
                       n=n, size_bytes=size, vec=vec)
        pool.clear()
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    return [("e6_vector", line_figure(results, ms, kind="global memory",
                                      subtitle=f"copy float32 vec1/vec2/vec4, cache: {ms[0]['cache']}"))]


def summary(results, exp):
    return size_table(exp["measurements"])
