"""overhead: microseconds per Python call on tiny inputs, ewkern against torch and CuPy.

ewkern.add(a, b, out=c) (and without out=) on ewkern arrays, torch tensors and NumPy arrays,
ewkern.copy on ewkern arrays, against torch.add(a, b, out=c), cupy.add(a, b, out=c) and
numpy.add; a user's ewkern.ElementwiseKernel "z = x + y" (warm calls, by its recorded plan) on NumPy
arrays and torch tensors, against CuPy's ElementwiseKernel of the same source, and a
ReductionKernel (a row's sum of squares) and a RowKernel (rmsnorm) on the same arrays viewed as
rows of 4 (CuPy's ReductionKernel of the same source against the first); ewkern.rmse (one batch of the tiny inputs, with and without out=) on ewkern arrays and
torch tensors, against torch's sqrt(mean((a - b)**2)); and a training step, rmsnorm with a weight
forward and both gradients, as a user's RowKernel through ewkern.torch.kernel_op (eagerly, and
through torch.ops) against torch's F.rms_norm, on torch tensors. Host wall clock (time.perf_counter) around many calls, including one synchronize at
the end of each repeat; the median of the repeats is reported, with the timer's resolution.
"""

from __future__ import annotations

import importlib.util
import statistics
import time

from .common import bars_figure, count_arg, md_table
from .frameworks import available
from .timing import ew, summarize

NAME = "overhead"
TITLE = "Per-call overhead on tiny inputs"
DESCRIPTION = ("microseconds per Python call: ewkern add/copy/rmse on ewkern/torch/numpy arrays vs torch.add(out=), "
               "cupy.add and torch's rmse expression")
PAPER = "(foundation issue)"
NEEDS_REFERENCE = False
ARGS = [("--overhead-calls", dict(type=count_arg(), metavar="N", help="calls per repeat (default 20000, quick 2000)")),
        ("--overhead-repeats", dict(type=count_arg(), metavar="N", help="repeats (default 7)")),
        ("--overhead-n", dict(type=count_arg(), metavar="N", help="elements of the tiny inputs (default 16)"))]


def timer_resolution() -> dict:
    info = time.get_clock_info("perf_counter")
    deltas = []
    for _ in range(2000):
        t0 = time.perf_counter_ns()
        t1 = time.perf_counter_ns()
        while t1 == t0:
            t1 = time.perf_counter_ns()
        deltas.append(t1 - t0)
    return {"clock": "time.perf_counter", "implementation": info.implementation,
            "declared_resolution_s": info.resolution, "measured_min_tick_ns": min(deltas),
            "measured_median_tick_ns": statistics.median(deltas)}


def per_call_seconds(fn, sync, calls: int, repeats: int) -> list:
    """Host seconds per call of fn: after min(200, calls) warm-up calls, `repeats` times the wall
    clock around `calls` calls and one sync() (which waits for the work they queued)."""
    for _ in range(min(200, calls)):
        fn()
    sync()
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - t0) / calls)
    return per_call


def _cases(ctx, n):
    """[(label, impl, fn, sync)] with inputs already made."""
    import numpy
    E = ew()
    dev = ctx.device
    cases = []
    a = E.empty((n,), dtype="float32", device=dev)
    E.fill(a, 1.0)
    b = E.empty((n,), dtype="float32", device=dev)
    E.fill(b, 2.0)
    c = E.empty((n,), dtype="float32", device=dev)
    sync_ew = (lambda: E.synchronize(dev)) if ctx.is_gpu else (lambda: None)
    cases.append(("ewkern.add(out=) on ewkern arrays", "ewkern", lambda: E.add(a, b, out=c), sync_ew))
    cases.append(("ewkern.add() on ewkern arrays", "ewkern", lambda: E.add(a, b), sync_ew))
    cases.append(("ewkern.copy(out=) on ewkern arrays", "ewkern", lambda: E.copy(a, out=c), sync_ew))
    r0 = E.empty((), dtype="float32", device=dev)
    cases.append(("ewkern.rmse(out=) on ewkern arrays", "ewkern", lambda: E.rmse(a, b, out=r0), sync_ew))
    na, nb, nc = (numpy.full(n, 1.0, numpy.float32), numpy.full(n, 2.0, numpy.float32), numpy.empty(n, numpy.float32))
    cases.append(("ewkern.add(out=) on numpy arrays (host)", "ewkern", lambda: E.add(na, nb, out=nc), lambda: None))
    cases.append(("numpy.add(out=) (host)", "numpy", lambda: numpy.add(na, nb, out=nc), lambda: None))
    uk = E.ElementwiseKernel("T x, T y", "T z", "z = x + y", "overhead_add")
    rk = E.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "overhead_sumsq")
    rn = E.RowKernel("T x, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps)", "0",
                     "overhead_rmsnorm")
    rows = (n // 4, 4) if n % 4 == 0 else (1, n)
    if not ctx.is_gpu:
        r2, o2 = na.reshape(rows), nc.reshape(rows)
        rr = numpy.empty(rows[0], numpy.float32)
        cases.append(("ewkern.ElementwiseKernel(out=) on numpy arrays (host)", "ewkern", lambda: uk(na, nb, nc),
                      lambda: None))
        cases.append(("ewkern.ReductionKernel(out=) on numpy arrays (host)", "ewkern",
                      lambda: rk(r2, rr, axis=1), lambda: None))
        cases.append(("ewkern.RowKernel(out=) on numpy arrays (host)", "ewkern", lambda: rn(r2, 1e-6, o2),
                      lambda: None))
    if ctx.is_gpu and available("torch", dev) is None:
        import torch
        ta = torch.full((n,), 1.0, device=dev)
        tb = torch.full((n,), 2.0, device=dev)
        tc = torch.empty((n,), device=dev)
        tsync = torch.cuda.synchronize
        cases.append(("ewkern.add(out=) on torch tensors", "ewkern", lambda: E.add(ta, tb, out=tc), tsync))
        cases.append(("ewkern.add() on torch tensors", "ewkern", lambda: E.add(ta, tb), tsync))
        cases.append(("torch.add(out=)", "torch", lambda: torch.add(ta, tb, out=tc), tsync))
        cases.append(("ewkern.ElementwiseKernel(out=) on torch tensors", "ewkern", lambda: uk(ta, tb, tc), tsync))
        cases.append(("ewkern.ElementwiseKernel() on torch tensors", "ewkern", lambda: uk(ta, tb), tsync))
        t2, tc2, tr1 = ta.view(rows), tc.view(rows), torch.empty(rows[0], device=dev)
        cases.append(("ewkern.ReductionKernel(out=) on torch tensors", "ewkern", lambda: rk(t2, tr1, axis=1), tsync))
        cases.append(("ewkern.RowKernel(out=) on torch tensors", "ewkern", lambda: rn(t2, 1e-6, tc2), tsync))
        tr = torch.empty((), device=dev)
        cases.append(("ewkern.rmse(out=) on torch tensors", "ewkern", lambda: E.rmse(ta, tb, out=tr), tsync))
        cases.append(("ewkern.rmse() on torch tensors", "ewkern", lambda: E.rmse(ta, tb), tsync))
        cases.append(("torch sqrt(mean((a - b)**2))", "torch", lambda: torch.sqrt(torch.mean((ta - tb) ** 2)), tsync))
    # a training step on torch tensors, on the CPU too (torch is no timed peer there, but the step's
    # host time is what a CPU training loop pays)
    if (available("torch", dev) is None if ctx.is_gpu else importlib.util.find_spec("torch") is not None):
        cases += _training_step_cases(dev, rows)
    if ctx.is_gpu and available("cupy", dev) is None:
        import cupy
        with cupy.cuda.Device(int(dev.split(":")[1])):
            ca = cupy.full((n,), 1.0, dtype=cupy.float32)
            cb = cupy.full((n,), 2.0, dtype=cupy.float32)
            cc = cupy.empty((n,), dtype=cupy.float32)
        csync = cupy.cuda.get_current_stream().synchronize
        cases.append(("ewkern.add(out=) on cupy arrays", "ewkern", lambda: E.add(ca, cb, out=cc), csync))
        cases.append(("cupy.add(out=)", "cupy", lambda: cupy.add(ca, cb, out=cc), csync))
        ck = cupy.ElementwiseKernel("T x, T y", "T z", "z = x + y", "overhead_add")
        cases.append(("cupy.ElementwiseKernel(out=)", "cupy", lambda: ck(ca, cb, cc), csync))
        cr = cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "overhead_sumsq")
        with cupy.cuda.Device(int(dev.split(":")[1])):
            cr2, crr = ca.reshape(rows), cupy.empty(rows[0], dtype=cupy.float32)
        cases.append(("cupy.ReductionKernel(out=)", "cupy", lambda: cr(cr2, crr, axis=1), csync))
    return cases


def _training_step_cases(dev, rows):
    """A training step's host time: rmsnorm with a weight, forward and both gradients, as a user's
    RowKernel through ewkern.torch.kernel_op (eager: its autograd.Function; and through
    torch.ops, the custom op's dispatch) against torch's own F.rms_norm, on torch tensors."""
    import torch
    from .t1_train import rmsnorm_op
    op = rmsnorm_op()     # the train experiment's (made once per process)
    x = torch.randn(rows, device=dev, requires_grad=True)
    w = torch.rand(rows[1], device=dev, requires_grad=True)
    g = torch.randn(rows, device=dev)
    via = torch.ops.ewkern_user.bench_rmsnorm
    rms_norm = torch.nn.functional.rms_norm
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    return [("ewkern.torch.kernel_op rmsnorm forward + backward", "ewkern",
             lambda: torch.autograd.grad(op(x, w, 1e-6), (x, w), g), sync),
            ("the same through torch.ops (custom-op dispatch)", "ewkern",
             lambda: torch.autograd.grad(via(x, w, 1e-6), (x, w), g), sync),
            ("torch rms_norm forward + backward", "torch",
             lambda: torch.autograd.grad(rms_norm(x, (rows[1],), w, 1e-6), (x, w), g), sync)]


def run(ctx, xr):
    calls = ctx.opt("overhead_calls", 2000 if ctx.quick else 20000)
    repeats = ctx.opt("overhead_repeats", 7)
    n = ctx.opt("overhead_n", 16)
    res = timer_resolution()
    xr.param(calls=calls, repeats=repeats, n=n, timer=res)
    xr.note(f"timer: {res['clock']} ({res['implementation']}), declared resolution "
            f"{res['declared_resolution_s']:.1e} s, smallest measured tick {res['measured_min_tick_ns']} ns; "
            f"each repeat times {calls} calls, so the timer's share per call is "
            f"{res['measured_median_tick_ns'] / calls:.3g} ns")
    cases = _cases(ctx, n)
    bar = xr.progress(len(cases))
    for label, impl, fn, sync in cases:
        try:
            per_call = per_call_seconds(fn, sync, calls, repeats)
        except Exception as exc:
            xr.error(label, exc)
            continue
        st = summarize(per_call)
        op = ("train" if "backward" in label or "torch.ops" in label else "kernel" if "Kernel(" in label
              else "rmse" if "rmse" in label or "sqrt(mean" in label else "add" if "add" in label else "copy")
        xr.add({"series": label, "impl": impl, "op": op, "dtype": "float32", "n": n,
                "calls": calls, "samples_s": per_call, "stats_s": st, "time_s": st["median"],
                "us_per_call": st["median"] * 1e6, "method": "host wall clock, median of repeats",
                "cache": "hot"})
        bar.step(f"{label}: {st['median'] * 1e6:.2f} us")
    bar.close()


def figures(results, exp):
    ms = exp["measurements"]
    cats = [m["series"].replace(" on ", "\non ") for m in ms]
    vals = {(c, "us per call"): m["us_per_call"] for c, m in zip(cats, ms)}
    fig = bars_figure(results, cats, ["us per call"], vals, kind="", lines=False, ylabel="microseconds per call (median)",
                      subtitle=f"{results.get('device_name')}: per-call overhead, {ms[0]['n'] if ms else ''} "
                               f"float32 elements")
    fig.set_size_inches(max(9, 1.0 * len(cats) + 2), 5.5)
    for t in fig.axes[0].get_xticklabels():
        t.set_rotation(60)
        t.set_fontsize(7)
    return [("overhead", fig)]


def summary(results, exp):
    ms = exp["measurements"]
    t = exp["params"].get("timer") or {}
    rows = [[m["series"], f"{m['us_per_call']:.2f}", f"{m['stats_s']['min'] * 1e6:.2f}",
             f"{m['stats_s']['max'] * 1e6:.2f}"] for m in ms]
    return md_table(["call", "us per call (median)", "min", "max"], rows) + \
        f"\n\ntimer resolution: declared {t.get('declared_resolution_s')} s, measured tick {t.get('measured_min_tick_ns')} ns"
