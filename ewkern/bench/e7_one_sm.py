"""E7: the bandwidth of one SM for vec1 / vec2 / vec4 copy, against the per-SM load/store ceiling.

One block (grid = 1) of a grid-stride copy runs on one SM. The ceiling is the paper's
4 bytes x LD/ST units per SM x SM clock (bytes per cycle if every LD/ST unit moved 4 bytes each
cycle from L1); LD/ST units per SM come from the paper's table by architecture.
"""

from __future__ import annotations

import subprocess

from .catalog import pick_variants
from .common import bars_figure, bytes_arg, check_bytes, count_arg, md_table, fmt_gbs
from .timing import Skip, plan_elementwise, variants

NAME = "e7"
TITLE = "Bandwidth of one SM: vec1 / vec2 / vec4"
DESCRIPTION = "copy on one block (one SM) for vec1/vec2/vec4 vs the per-SM LD/ST ceiling"
PAPER = "elementwise-ops-on-gpus.md"
CPU = False
CPU_SKIP = "one SM is a CUDA launch shape (grid = 1)"
ARGS = [("--e7-size", dict(type=bytes_arg(), metavar="BYTES", help="copy size (default 64MiB, quick 16MiB)")),
        ("--e7-block", dict(type=count_arg(), metavar="N",
                            help="threads in the one block (default: the device maximum)"))]

# LD/ST units per SM by compute capability: the paper's A100 (8.0) 32, A10 (8.6) 32, L4 (8.9) 16;
# Hopper and later taken as 32 like the A100.
LDST_PER_SM = {(7, 0): 32, (7, 5): 16, (8, 0): 32, (8, 6): 32, (8, 7): 16, (8, 9): 16, (9, 0): 32}


def _size(ctx):
    return ctx.opt("e7_size") or (16 << 20 if ctx.quick else 64 << 20)


def check(ctx):
    check_bytes(ctx, 2 * _size(ctx), "e7's copy")


def sm_clock_mhz(ctx) -> tuple[float | None, str]:
    info = ctx.info
    for key in ("clock_khz", "sm_clock_khz", "clock_rate_khz"):
        if info.get(key):
            return info[key] / 1e3, f"device_info {key}"
    index = ctx.device.split(":")[1] if ":" in ctx.device else "0"
    try:
        r = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=clocks.max.sm",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return float(r.stdout.strip().splitlines()[0]), "nvidia-smi clocks.max.sm"
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    try:
        import cupy
        rate = cupy.cuda.runtime.deviceGetAttribute(13, int(index))   # cudaDevAttrClockRate (kHz)
        if rate:
            return rate / 1e3, "cudaDevAttrClockRate"
    except Exception:
        pass
    return None, "unknown"


def _takes_grid(op, variant, device) -> bool:
    """Whether a variant accepts grid= (prepared once on a tiny input)."""
    from .timing import core, ew, new_filled
    try:
        a = new_filled((256,), "float32", device, 1.0)
        fn = getattr(ew(), op)
        core().prepare(fn, *([a] * (2 if op == "add" else 1)), variant=variant, grid=1)
        return True
    except ValueError:
        return False


def run(ctx, xr):
    size = _size(ctx)
    n = size // 4
    block = ctx.opt("e7_block") or ctx.info.get("max_threads_per_block") or 1024
    op, chosen = "copy", pick_variants("copy", "float32", ctx.device, "vec", [1, 2, 4], index_bits=32, grid=2)
    if len(chosen) < 2 or not _takes_grid("copy", next(iter(chosen.values())), ctx.device):
        # copy kernels that size their own grid cannot be put on one SM: use the add study's
        # grid-stride kernels (which take grid=) at V1/V2/V4 instead
        names = set(variants("add", "float32", ctx.device))
        alt = {v: f"ThreadBlockIV{v}U1{'N' if v == 1 else 'M'}Rgs" for v in (1, 2, 4)}
        alt = {v: name for v, name in alt.items() if name in names}
        if len(alt) < 2:
            raise Skip("no copy variant takes grid= and the add study's grid-stride kernels are missing")
        op, chosen = "add", alt
        xr.note("ewkern's copy variants choose their own grid, so one SM runs the add study's grid-stride "
                "kernels (ThreadBlockIV{1,2,4}U1{N,M}Rgs) with grid = 1; GB/s counts 3 x n x 4 bytes")
    cc = tuple(ctx.info.get("compute_capability") or ())
    ldst = LDST_PER_SM.get(cc[:2], 32)
    mhz, src = sm_clock_mhz(ctx)
    ceiling = 4 * ldst * mhz / 1e3 if mhz else None
    xr.param(op=op, size_bytes=size, block=block, grid=1, variants={f"vec{k}": v for k, v in chosen.items()},
             ldst_per_sm=ldst, sm_clock_mhz=mhz, sm_clock_source=src, ceiling_gbs=ceiling)
    xr.note(f"per-SM ceiling = 4 B x {ldst} LD/ST units x {mhz or '?'} MHz ({src}) = "
            f"{ceiling:.1f} GB/s" if ceiling else "SM clock unknown: no per-SM ceiling")
    bar = xr.progress(len(chosen))
    for vec, variant in sorted(chosen.items()):
        make_plan, set_bytes = plan_elementwise(op, "float32", (n,), ctx.device, variant=variant,
                                                block=block, grid=1)
        rec = xr.measure(what=f"{op} vec{vec} on one SM", make_plan=make_plan, set_bytes=set_bytes,
                         cache=ctx.cache, series=f"vec{vec}", op=op, variant=variant, dtype="float32",
                         n=n, size_bytes=size, vec=vec, grid=1, block=block)
        if rec is not None and ceiling:
            rec["pct_of_sm_ceiling"] = 100 * rec["gbs"] / ceiling
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    ceiling = exp["params"].get("ceiling_gbs")
    cats = [m["series"] for m in ms]
    vals = {(m["series"], "one SM"): m["gbs"] for m in ms}
    fig = bars_figure(results, cats, ["one SM"], vals, kind="", lines=False,
                      subtitle=f"{results.get('device_name')}: bandwidth of one SM (grid 1, block "
                               f"{exp['params'].get('block')}), {ms[0]['op'] if ms else 'copy'} float32, cache: "
                               f"{ms[0]['cache'] if ms else '?'}")
    ax = fig.axes[0]
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", label=f"per-SM LD/ST ceiling {ceiling:.0f} GB/s")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return [("e7_one_sm", fig)]


def summary(results, exp):
    ms = exp["measurements"]
    c = exp["params"].get("ceiling_gbs")
    rows = [[m["series"], m["variant"], fmt_gbs(m["gbs"]),
             f"{100 * m['gbs'] / c:.0f}%" if c else "-"] for m in ms]
    return md_table(["", "variant", "GB/s (1 SM)", "of per-SM ceiling"], rows) + \
        (f"\n\nper-SM ceiling: {c:.1f} GB/s" if c else "")
