"""V1: vectorised elementwise add: f32, f32x4, f16, f16x2, f16x8, f16x8pack (and bf16 packs), with torch.

For S, K in {1024, 2048, 4096}: each variant's median time per launch in ms and the first two
output values on random inputs, printed like the tutorial's table; torch.add is the ``_th`` row.
"""

from __future__ import annotations

from .catalog import V1_NAMES
from .common import bars_figure, counts_arg, md_table
from .frameworks import available, elementwise_call
from .timing import BufferPool, Skip, ew, plan_elementwise, variants

NAME = "v1"
TITLE = "Vectorised add: f32 / f32x4 / f16 / f16x2 / f16x8 / f16x8pack"
DESCRIPTION = "the f16x8 tutorial's S x K table: add variants' time (ms) and first outputs, torch reference"
PAPER = "cuda-vectorization-f16x8.md"
ARGS = [("--v1-sizes", dict(type=counts_arg, metavar="N,N", help="values of S and K (default 1024,2048,4096)")),
        ("--v1-no-bf16", dict(action="store_true", help="leave out the bfloat16 packs"))]

DTYPE_OF = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _dtype(name: str) -> str:
    return DTYPE_OF[name.split("x")[0]]


def find_variants(device: str, with_bf16=True) -> dict:
    """{paper name: ewkern variant} for the tutorial's kernels ewkern has."""
    out = {}
    for want in V1_NAMES:
        if want.startswith("bf16") and not with_bf16:
            continue
        names = variants("add", _dtype(want), device)
        for v in names:
            low = v.lower()
            if low == want or low.endswith("_" + want) or low == "add_" + want:
                out[want] = v
                break
    return out


def _inputs(S, K, seed=0):
    import numpy
    rng = numpy.random.default_rng(seed)
    return (rng.standard_normal((S, K), dtype=numpy.float32),
            rng.standard_normal((S, K), dtype=numpy.float32))


def _to_dtype(x, dtype):
    import numpy
    if dtype == "bfloat16":
        import ml_dtypes
        return x.astype(ml_dtypes.bfloat16)
    return x.astype(numpy.dtype(dtype))


def run(ctx, xr):
    import numpy
    sizes = ctx.opt("v1_sizes") or [1024, 2048, 4096]
    found = find_variants(ctx.device, with_bf16=not ctx.opt("v1_no_bf16", False))
    if not found:
        raise Skip(f"ewkern has none of the tutorial's add variants ({', '.join(V1_NAMES)}) on {ctx.device}: "
                   "they are CUDA kernels")
    torch_why = available("torch", ctx.device)
    xr.param(sizes=sizes, variants=found, torch=torch_why is None)
    if torch_why:
        xr.note(f"no torch reference rows: {torch_why}")
    ref_dtypes = list(dict.fromkeys(_dtype(k) for k in found))
    bar = xr.progress(len(sizes) ** 2 * (len(found) + (0 if torch_why else len(ref_dtypes))))
    for S in sizes:
        for K in sizes:
            a32, b32 = _inputs(S, K)
            pool = BufferPool()
            for dtype in ref_dtypes:
                a, b = _to_dtype(a32, dtype), _to_dtype(b32, dtype)
                ref = (a.astype(numpy.float64) + b.astype(numpy.float64))
                ea = ew().asarray(a, device=ctx.device)
                eb = ew().asarray(b, device=ctx.device)
                for pname, variant in found.items():
                    if _dtype(pname) != dtype:
                        continue
                    out = numpy.asarray(ew().add(ea, eb, variant=variant).numpy()).astype(numpy.float64)
                    make_plan, set_bytes = plan_elementwise("add", dtype, (S, K), ctx.device, variant=variant,
                                                            pool=pool)
                    xr.measure(what=f"{pname} S={S} K={K}", make_plan=make_plan, set_bytes=set_bytes,
                               cache=ctx.cache, series=pname, op="add", variant=variant, dtype=dtype,
                               shape=[S, K], n=S * K, S=S, K=K, first=[float(out.flat[0]), float(out.flat[1])],
                               max_abs_err=float(numpy.max(numpy.abs(out - ref.astype(out.dtype)))))
                if torch_why is None:
                    th = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype] + "_th"
                    first = None
                    try:
                        import torch
                        ta = torch.from_numpy(a32[0, :2].copy()).to(ctx.device).to(
                            {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype])
                        tb = torch.from_numpy(b32[0, :2].copy()).to(ctx.device).to(ta.dtype)
                        first = [float(x) for x in torch.add(ta, tb).float().cpu()]
                    except Exception:
                        pass
                    xr.measure_peer(what=f"{th} S={S} K={K}", impl="torch", cache=ctx.cache,
                                    build=lambda d=dtype: elementwise_call("torch", "add", d, (S, K), ctx.device),
                                    series=th, op="add", variant="torch.add", dtype=dtype, shape=[S, K],
                                    n=S * K, S=S, K=K, first=first)
            pool.clear()
    bar.close()


def paper_table(exp) -> str:
    """The tutorial's layout: per S, K a block of 'out_NAME: [v0, v1], time:T ms' lines."""
    ms = exp["measurements"]
    lines = []
    keys = list(dict.fromkeys((m["S"], m["K"]) for m in ms))
    rule = "-" * 85
    for S, K in keys:
        lines += [rule, f"{'S=%d, K=%d' % (S, K):^85}"]
        sel = [m for m in ms if (m["S"], m["K"]) == (S, K)]
        last = None
        for m in sel:
            fam = m["dtype"]
            if last is not None and fam != last:
                lines.append(rule)
            last = fam
            first = m.get("first") or [float("nan")] * 2
            lines.append(f"{'out_' + m['series']:>18}: [{first[0]:.8f}, {first[1]:.8f}], "
                         f"time:{m['time_s'] * 1e3:.8f}ms")
        lines.append(rule)
    return "\n".join(lines)


def figures(results, exp):
    ms = exp["measurements"]
    cats = list(dict.fromkeys(f"{m['S']}x{m['K']}" for m in ms))
    groups = list(dict.fromkeys(m["series"] for m in ms))
    vals = {(f"{m['S']}x{m['K']}", m["series"]): m["time_s"] * 1e3 for m in ms}
    fig = bars_figure(results, cats, groups, vals, kind="", lines=False, ylabel="time per launch (ms, median)",
                      subtitle=f"{results.get('device_name')}: elementwise add variants (S x K), "
                               f"cache: {ms[0]['cache'] if ms else '?'}", log=True)
    return [("v1_f16x8", fig)]


def summary(results, exp):
    ms = exp["measurements"]
    table = md_table(["S x K", "kernel", "variant", "first outputs", "median ms", "GB/s", "max abs err"],
                     [[f"{m['S']}x{m['K']}", m["series"], m.get("variant"),
                       ", ".join(f"{v:.8g}" for v in (m.get("first") or [])), f"{m['time_s'] * 1e3:.5f}",
                       f"{m['gbs']:.0f}", m.get("max_abs_err", "-")] for m in ms])
    return "```\n" + paper_table(exp) + "\n```\n\n" + table
