"""E5: grid sizing, grid_dim1 = ceil(n / simd / block) against grid_dim2 = SMs x threads_per_SM / block x 32.

grid_dim2 depends only on the hardware (a grid-stride loop covers the rest); the paper found no
case where it wins. Both variants are timed for copy and for an elementwise op over sizes, in
the run's cache mode.
"""

from __future__ import annotations

from .catalog import pick_variants
from .common import check_bytes, check_names, elementwise_ops, line_figure, list_arg, pow2_sizes, size_table, sizes_arg
from .timing import BufferPool, plan_elementwise
from .units import fmt_bytes

NAME = "e5"
TITLE = "Grid sizing: grid_dim1 against grid_dim2"
DESCRIPTION = "copy and an elementwise op with grid_dim1 = ceil(n/simd/block) vs grid_dim2 = SMs x waves, GB/s vs size"
PAPER = "elementwise-ops-on-gpus.md"
CPU = False
CPU_SKIP = "grid sizing is a CUDA launch choice"
ARGS = [("--e5-sizes", dict(type=sizes_arg, metavar="SIZES", help="buffer sizes, e.g. 4MiB,64MiB,1GiB")),
        ("--e5-ops", dict(type=list_arg, metavar="OPS", help="ops (default copy and the first unary op "
                                                           "with grid variants)"))]

CANDIDATE_OPS = ["add_const", "log", "erf", "exp", "neg", "abs", "relu", "add", "mul"]


def _sizes(ctx):
    return ctx.pick("e5_sizes", gpu_full=pow2_sizes(1 << 20, 2 << 30),
                    gpu_quick=[4 << 20, 64 << 20, 256 << 20, 1 << 30], cpu_full=[], cpu_quick=[])


def check(ctx):
    # an unknown op was skipped cell by cell (e3's and peers' check say the same)
    check_names("--e5-ops", ctx.opt("e5_ops") or [], elementwise_ops())
    check_bytes(ctx, 3 * max(_sizes(ctx)), "e5's largest size")


def grid_dims(info: dict, n: int, simd: int, block: int = 256, waves: int = 32) -> tuple[int, int]:
    """The paper's two grid sizes for n elements."""
    g1 = -(-n // simd // block) if n else 0
    g2 = info["sm_count"] * info["max_threads_per_sm"] // block * waves
    return g1, g2


def run(ctx, xr):
    sizes = _sizes(ctx)
    ops = ctx.opt("e5_ops")
    chosen = {}
    for op in (ops or ["copy"] + CANDIDATE_OPS):
        prefer = {"vec": 4, "index_bits": 32} if op == "copy" else {}
        pair = pick_variants(op, "float32", ctx.device, "grid", [1, 2], **prefer)
        if len(pair) == 2:
            chosen[op] = pair
            if not ops and len(chosen) == 2:
                break
        elif ops:
            xr.skip(op, f"ewkern has no grid_dim1/grid_dim2 variants of {op}")
    if not chosen:
        from .timing import Skip
        raise Skip("no op has both grid_dim1 and grid_dim2 variants")
    xr.param(sizes=sizes, variants={op: {f"grid_dim{k}": v for k, v in p.items()} for op, p in chosen.items()},
             dtype="float32")
    info = ctx.info
    if info.get("sm_count") and info.get("max_threads_per_sm"):
        g2 = info["sm_count"] * info["max_threads_per_sm"] // 256 * 32
        xr.note(f"grid_dim2 = {info['sm_count']} SMs x {info['max_threads_per_sm']} threads / 256 x 32 "
                f"waves = {g2} blocks (block 256); grid_dim1 passes grid_dim2 at "
                f"{fmt_bytes(g2 * 256 * 4 * 4)} float32 with vec4")
    bar = xr.progress(len(sizes) * sum(len(p) for p in chosen.values()))
    for size in sizes:
        pool = BufferPool()
        n = size // 4
        for op, pair in chosen.items():
            for g, variant in sorted(pair.items()):
                make_plan, set_bytes = plan_elementwise(op, "float32", (n,), ctx.device, variant=variant, pool=pool)
                xr.measure(what=f"{op} grid_dim{g} {fmt_bytes(size)}", make_plan=make_plan, set_bytes=set_bytes,
                           cache=ctx.cache, series=f"{op} grid_dim{g}", op=op, variant=variant,
                           dtype="float32", n=n, size_bytes=size, grid_choice=g)
        pool.clear()
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    figs = []
    for op in dict.fromkeys(m["op"] for m in ms):
        sel = [m for m in ms if m["op"] == op]
        kind = "global memory" if op == "copy" else "element-wise"
        fig = line_figure(results, sel, kind=kind,
                          subtitle=f"{op} float32, grid_dim1 vs grid_dim2, cache: {sel[0]['cache']}")
        figs.append((f"e5_grid_{op}", fig))
    return figs


def summary(results, exp):
    return size_table(exp["measurements"])
