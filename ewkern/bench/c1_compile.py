"""C1: torch.compile with ewkern's rmse inside the compiled graph, against plain Inductor.

Two small functions of two float32 tensors, each run four ways on the same inputs:

    rmse(a, b)            = sqrt(mean((a - b)**2)) per batch (the first axis)
    scaled rmse(a, b)     = rmse(0.5 * a, b)  (a torch op before the reduction: plain Inductor
                            fuses it into its reduction; with ewkern's op it runs as its own kernel)

  torch eager             the function in torch ops
  torch.compile           the same, compiled (plain Inductor)
  ewkern.torch eager      ewkern.torch.rmse, the custom op, called eagerly
  compile + ewkern        torch.compile(fullgraph=True) of the function written with ewkern.torch.rmse

Every call is timed as the peers are (frameworks.time_calls: K calls captured into one CUDA graph
on a GPU; host clock on a CPU), GB/s by the rmse convention (2 x n x 4 bytes read, 4 per batch
written). The compiled ewkern function's graph breaks (torch._dynamo.explain) and every result's
largest relative error against a float64 reference are kept.
"""

from __future__ import annotations

import math

from .common import bars_figure, md_table, shapes_of
from .timing import Skip
from .units import fmt_shape

NAME = "c1"
TITLE = "torch.compile with ewkern's rmse in the graph"
DESCRIPTION = "rmse and scaled rmse: torch eager / torch.compile / ewkern.torch eager / torch.compile with ewkern.torch.rmse"
PAPER = "(issue 12)"
NEEDS_REFERENCE = False


# the functions reduce axis 1 of two-axis inputs: another shape failed inside the run or its summary
ARGS = [("--c1-shapes", dict(type=shapes_of("BATCHESxN shapes (two axes)", ndim=(2, 2)), metavar="SHAPES",
                             help="BATCHESxN shapes (default 16x2^20,1024x4096; CPU 8x2^14, quick 4x4096)")),
        ("--c1-backend", dict(metavar="NAME", help="torch.compile backend (default inductor; aot_eager traces "
                                                   "the same graph without generating code)"))]

WAYS = ("torch eager", "torch.compile", "ewkern.torch eager", "compile + ewkern")
FUNCTIONS = ("rmse", "scaled rmse")


def _shapes(ctx):
    gpu = [(16, 1 << 20), (1024, 4096)]
    return ctx.pick("c1_shapes", gpu_full=gpu, gpu_quick=gpu, cpu_full=[(8, 1 << 14)], cpu_quick=[(4, 4096)])


def _torch_ready(device):
    """The torch module, or Skip with the reason it cannot run here."""
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed (c1 compares torch.compile with and without ewkern's op)") from None
    if device != "cpu" and not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    try:
        import ewkern.torch  # noqa: F401
    except Exception as exc:
        raise Skip(f"ewkern.torch cannot be imported: {type(exc).__name__}: {exc}") from None
    return torch


def functions(torch, backend="inductor"):
    """{(function, way): callable(a, b)} and {function: (torch's, ewkern's)}; the compiled ones
    compile on their first call."""
    import ewkern.torch as ewt

    def torch_rmse(a, b):
        return torch.sqrt(((a - b) ** 2).mean(1))

    def torch_scaled(a, b):
        return torch.sqrt(((0.5 * a - b) ** 2).mean(1))

    def ew_scaled(a, b):
        return ewt.rmse(0.5 * a, b)
    plain = {"rmse": (torch_rmse, ewt.rmse), "scaled rmse": (torch_scaled, ew_scaled)}
    out = {}
    for fn, (tfn, efn) in plain.items():
        out[(fn, "torch eager")] = tfn
        out[(fn, "torch.compile")] = torch.compile(tfn, dynamic=False, backend=backend)
        out[(fn, "ewkern.torch eager")] = efn
        out[(fn, "compile + ewkern")] = torch.compile(efn, dynamic=False, fullgraph=True, backend=backend)
    return out, plain


def _build(torch, f, shape, device):
    n = math.prod(shape)

    def make_call():
        g = torch.Generator(device=device).manual_seed(n)
        a = torch.rand(shape, device=device, generator=g)
        b = torch.rand(shape, device=device, generator=g)
        return lambda: f(a, b)
    return lambda: (make_call, 2 * n * 4, 2 * n * 4, shape[0] * 4)


def run(ctx, xr):
    torch = _torch_ready(ctx.device)
    shapes = _shapes(ctx)
    backend = ctx.opt("c1_backend", "inductor")
    fns, plain = functions(torch, backend)
    xr.param(shapes=[list(s) for s in shapes], dtype="float32", ways=list(WAYS), functions=list(FUNCTIONS),
             torch=torch.__version__, backend=backend)
    if backend != "inductor":
        xr.note(f"torch.compile backend {backend} (not Inductor): the graphs are traced, no code is generated")
    dev = ctx.device
    breaks = []
    for fn, (_, efn) in plain.items():
        a = torch.rand(shapes[0], device=dev)
        ex = torch._dynamo.explain(efn)(a, a)
        breaks.append({"function": fn, "graph_count": ex.graph_count, "graph_breaks": ex.graph_break_count,
                       "ewkern_ops": sorted({str(node.target) for g in ex.graphs for node in g.graph.nodes
                                             if "ewkern" in str(node.target)})})
    torch._dynamo.reset()
    xr.table("graph_breaks", breaks)
    bar = xr.progress(len(shapes) * len(fns))
    for shape in shapes:
        g = torch.Generator(device=dev).manual_seed(1)
        a = torch.rand(shape, device=dev, generator=g)
        b = torch.rand(shape, device=dev, generator=g)
        for (fn, way), f in fns.items():
            scale = 0.5 if fn == "scaled rmse" else 1.0
            ref = torch.sqrt(((scale * a.double() - b.double()) ** 2).mean(1))
            try:
                err = float(((f(a, b).double() - ref).abs() / ref).max())
            except Exception as exc:
                xr.skip(f"{fn} {way} {fmt_shape(shape)}", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            xr.measure_peer(what=f"{fn} {way} {fmt_shape(shape)}", impl="torch", cache=ctx.cache,
                            build=_build(torch, f, shape, dev), series=way, function=fn, op="rmse",
                            dtype="float32", shape=list(shape), n=math.prod(shape), max_rel_err=err)
    bar.close()


def _label(m):
    return f"{m['function']} {fmt_shape(m['shape'])}"


def figures(results, exp):
    ms = exp["measurements"]
    cats = list(dict.fromkeys(_label(m) for m in ms))
    vals = {(_label(m), m["series"]): m["gbs"] for m in ms}
    ways = [w for w in WAYS if any(m["series"] == w for m in ms)]
    fig = bars_figure(results, cats, ways, vals, kind="", lines=False,
                      subtitle=f"{results.get('device_name') or results.get('device')}: rmse float32 in "
                               f"torch.compile, with and without ewkern's op (cache: "
                               f"{ms[0]['cache'] if ms else '?'})")
    return [("c1_compile", fig)]


def summary(results, exp):
    ms = exp["measurements"]
    rows = []
    for cat in dict.fromkeys(_label(m) for m in ms):
        row = [cat]
        for w in WAYS:
            m = next((x for x in ms if _label(x) == cat and x["series"] == w), None)
            row.append("-" if m is None else f"{m['gbs']:.4g} ({m['time_s'] * 1e6:.1f} us, err "
                                             f"{m['max_rel_err']:.0e})")
        rows.append(row)
    text = md_table(["function, shape"] + [f"{w} GB/s" for w in WAYS], rows)
    gb = exp.get("tables", {}).get("graph_breaks") or []
    if gb:
        text += "\n\n" + md_table(["compiled with ewkern.torch", "graphs", "graph breaks", "ewkern ops in the graph"],
                                  [[r["function"], r["graph_count"], r["graph_breaks"], ", ".join(r["ewkern_ops"])]
                                   for r in gb])
    return text
