"""T1: training steps. Forward + backward of every differentiable op, ewkern.torch against torch.

One step is what a training loop runs for one op: y = op(inputs); grads = autograd.grad(y,
inputs, g) with a fresh gradient for every input (no accumulation into .grad). Three ways, on the
same inputs and incoming gradient g:

  ewkern.torch     ewkern.torch.<op> (eager: its torch.autograd.Function, the forward kernel and
                   one backward kernel from csrc/grads.def)
  torch eager      torch's own op (torch.nn.functional.gelu/silu, torch.exp, ...)
  torch.compile    torch.compile(torch's op), its forward and backward graphs by Inductor

timed as the peers are (frameworks.time_calls_in_turns; frameworks.time_calls with
--no-train-in-turns) in two methods:
  back-to-back     K steps captured into one CUDA graph, inputs rotated through >= 4x the L2
  single           one eager step, L2 flushed, queued behind a sleep kernel
(--cache hot: back-to-back takes the same inputs every step, labelled hot; --cache flush leaves it
rotating, since no flush fits between K steps run back to back: single is the flushed step)
and, for ewkern.torch and torch eager, the host-visible time of one step (events around one eager
step right after a synchronize, no sleep kernel in front: what `t0; step(); t1` sees when the GPU
waits for the host). A cell's ways are timed in turns (frameworks.time_calls_in_turns: graphs each
sample taking every way once, the first rotating; single steps in runs of 8 samples a way, the
first way of each block rotating, since a series of single launches repeats a pattern of four
samples up to 1.07 us apart on both GPUs), so that what drifts over the seconds a cell takes falls
on every way alike, and every way's k-th step takes the same inputs and incoming gradient
(frameworks.SharedSets). One way after another and sampled in rounds (--no-train-in-turns
--flush-rounds), single steps of one short kernel moved 2-14% between processes on the H200;
sampled in rounds in turns, `peers`' single launches moved by a median 0.09 between processes,
against 0.016 at the default 50 samples (BENCHMARKS.md, 2026-11-27).

Beyond ewkern's own ops, "rmse_kernel" is a user reduction in training: an ewkern.ReductionKernel
(sqrt of the mean of (a - b)^2 over rows of 1024, CuPy's `_in_ind.size() / _out_ind.size()`) made a
custom op by ewkern.torch.kernel_op, its backward derived (the reduction again, then one elementwise
kernel for both gradients), against torch's sqrt(((a - b) ** 2).mean(1)) as the "rmse" op's. And
"rmsnorm" is a user kernel in training: an ewkern.RowKernel
(y = x * rsqrt(mean(x^2) + eps) * w over rows of 4096) made a custom op by ewkern.torch.kernel_op,
its backward derived (a row-sum reduction, then one RowKernel for both gradients), against
torch.nn.functional.rms_norm eagerly and compiled.

Plus one step of a small MLP ("mlp" among the ops), Linear(d, 4d) -> gelu -> Linear(4d, d) -> rmse
loss against a target (mean over the batch), forward + backward of every parameter, with
ewkern.torch's gelu and rmse and with torch's (its two ways), in the run's float32 and bfloat16
(its dtypes), at its own size (4096 x 1024 on a GPU, 256 x 128 on a CPU; size_bytes: x's bytes).
Bytes per step (for GB/s) are the traffic of one forward and one backward kernel at one read or
write per array: read, the forward's inputs and the backward's grad + saved arrays; written, the
forward's output and the backward's gradients. The MLP step declares none (its time is the
matmuls'; its GB/s reads 0). Each record's impl is its way.
"""

from __future__ import annotations

import argparse

import math
import statistics
from functools import partial

from .common import (below_beyond_spread, check_bytes, how_timed, list_arg, md_table, method_caches, sizes_arg,
                     spread_note)
from .frameworks import SharedSets, set_maker
from .timing import BenchError, Skip
from .units import ITEMSIZE, fmt_bytes

NAME = "train"
TITLE = "Training steps: forward + backward, ewkern.torch vs torch eager and torch.compile"
DESCRIPTION = ("forward + backward of every differentiable op x float32/float16/bfloat16 x sizes and an MLP step, "
               "ewkern.torch vs torch eager and torch.compile, back-to-back and single step")
PAPER = "(issue 20)"
NEEDS_REFERENCE = False


ARGS = [("--train-ops", dict(type=list_arg, metavar="OPS",
                             help="ops: ewkern.torch's differentiable ops, rmsnorm, rmse_kernel, and mlp for the MLP "
                                  "step (default all of them; CPU quick: gelu,mul,rmse,mlp)")),
        ("--train-dtypes", dict(type=list_arg, metavar="DTYPES", help="dtypes: float32, float16, bfloat16, float64 "
                                                                      "(default float32,float16,bfloat16; quick: "
                                                                      "float32); the MLP step takes those of "
                                                                      "float32 and bfloat16")),
        ("--train-sizes", dict(type=sizes_arg, metavar="SIZES", help="bytes per tensor, e.g. 1MiB,64MiB (default GPU "
                                                                     "1MiB-1GiB, quick 64MiB; CPU 1MiB)")),
        ("--train-ways", dict(type=list_arg, metavar="WAYS", help="ewkern.torch, torch eager, torch.compile "
                                                                  "(default all three; torch.compile on a GPU only, "
                                                                  "not for the MLP step)")),
        ("--train-methods", dict(type=list_arg, metavar="METHODS", help="back-to-back, single, host (default GPU: "
                                                                        "all three; CPU: back-to-back; host on a GPU "
                                                                        "only)")),
        ("--train-in-turns", dict(action=argparse.BooleanOptionalAction, default=None,
                                  help="time a cell's ways in turns, each sample taking every way once "
                                       "(back-to-back and single step; the default), or with --no-train-in-turns "
                                       "one way's samples after another's"))]

WAYS = ("ewkern.torch", "torch eager", "torch.compile")
MLP_DTYPES = ("float32", "bfloat16")
MLP_WAYS = ("ewkern.torch", "torch eager")
METHODS = {"back-to-back": "rotate", "single": "flush"}
HOT_LABEL = "back-to-back (graph of K steps, the same inputs every step: hot)"
METHOD_LABEL = {"back-to-back": "back-to-back (graph of K steps, inputs rotated)",
                "single": "single step (L2 flushed, queued behind a sleep kernel)",
                "host": "host-visible step (events around one eager step after a synchronize)"}
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "axpby")
SCALARS = {"add_const": (0.25,), "mul_const": (1.5,), "axpby": (0.75, -1.25), "rmsnorm": (1e-6,)}
ROW = 4096   # rmsnorm's row length
# what the forward saves for the backward and what the backward writes, in arrays of the op's size
SAVED = {"copy": 0, "add": 0, "sub": 0, "add_const": 0, "mul_const": 0, "axpby": 0, "neg": 0}


def _torch_fn(torch, op):
    F = torch.nn.functional
    table = {"copy": lambda a: a.clone(), "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
             "maximum": torch.maximum, "minimum": torch.minimum, "add_const": lambda a, c: a + c,
             "mul_const": lambda a, c: a * c, "axpby": lambda a, b, al, be: al * a + be * b, "neg": torch.neg,
             "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
             "erf": torch.erf, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "gelu": F.gelu,
             "silu": F.silu,
             "rmse": lambda a, b: torch.sqrt(((a.float() - b.float()) ** 2).mean(1)),
             "rmse_kernel": lambda a, b: torch.sqrt(((a.float() - b.float()) ** 2).mean(1)),
             "rmsnorm": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)}
    return table[op]


_rmsnorm_ops: list = []


def rmsnorm_op():
    """ewkern's rmsnorm as a RowKernel custom op with its derived backward (made once)."""
    if not _rmsnorm_ops:
        import ewkern
        import ewkern.torch as ewt
        k = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                             "y = x * rsqrt(a / _row_size + eps) * w", "0", "bench_rmsnorm")
        _rmsnorm_ops.append(ewt.kernel_op(k, scalars=("eps",)))
    return _rmsnorm_ops[0]


_rmse_kernel_ops: list = []


def rmse_kernel_op():
    """A user's rmse over rows as a ReductionKernel custom op with its derived backward (made
    once), called as op(a, b) (axis 1)."""
    if not _rmse_kernel_ops:
        import ewkern
        import ewkern.torch as ewt
        k = ewkern.ReductionKernel("T x, T y", "float32 r", "(x - y) * (x - y)", "a + b",
                                   "r = sqrt(a / (_in_ind.size() / _out_ind.size()))", "0", "bench_rmse")
        op = ewt.kernel_op(k)
        _rmse_kernel_ops.append(lambda a, b: op(a, b, axis=1))
    return _rmse_kernel_ops[0]


def step_traffic(op, n, itemsize):
    """Declared (bytes read, bytes written) of one forward + backward: forward reads its inputs and
    writes y; backward reads g and what was saved and writes one gradient per input."""
    if op == "rmsnorm":
        return 3 * n * itemsize, 2 * n * itemsize     # x in, y out; g and x in, the gradient of x out
    if op in ("rmse", "rmse_kernel"):
        return 4 * n * itemsize, 2 * n * itemsize     # forward reads a, b; backward reads a, b, writes 2
    nin = _nin(op)
    if op in ("copy", "add", "add_const"):
        return nin * n * itemsize, n * itemsize       # no backward kernel: the gradient is g itself
    saved = SAVED.get(op, 2 if op in ("mul", "div", "maximum", "minimum") else 1)
    return (nin + 1 + saved) * n * itemsize, (1 + nin) * n * itemsize


def step_bytes(op, n, itemsize):
    """Declared bytes of one forward + backward: step_traffic's read + written."""
    return sum(step_traffic(op, n, itemsize))


def _step(torch, fn, ins, scalars, g):
    def call():
        y = fn(*ins, *scalars)
        return torch.autograd.grad(y, ins, g)
    return call


def _make_inputs(torch, op, shape, dtype, device):
    from .frameworks import op_inputs
    if op == "rmsnorm":
        (x,) = op_inputs("torch", "gelu", shape, dtype, device)
        (w,) = op_inputs("torch", "gelu", (shape[-1],), dtype, device)
        return [x.requires_grad_(), w.requires_grad_()]
    src = "sub" if op in ("rmse", "rmse_kernel") else op
    ins = [t.requires_grad_() for t in op_inputs("torch", src, shape, dtype, device)]
    return ins


def _step_set(torch, op, shape, dtype, device, scalars):
    """One step's inputs (requiring grad) and incoming gradient g, shaped as torch's result."""
    ins = _make_inputs(torch, op, shape, dtype, device)
    with torch.no_grad():
        y = _torch_fn(torch, op)(*ins, *scalars)
    return ins, torch.randn_like(y)


def _ways(ctx, torch, op, want):
    import ewkern.torch as ewt
    tfn = _torch_fn(torch, op)
    out = {}
    if "ewkern.torch" in want:
        user = {"rmsnorm": rmsnorm_op, "rmse_kernel": rmse_kernel_op}
        out["ewkern.torch"] = user[op]() if op in user else getattr(ewt, op)
    if "torch eager" in want:
        out["torch eager"] = tfn
    if "torch.compile" in want:
        # torch's ops compile through one wrapper code object, whose cache would hit the recompile
        # limit after eight ops: a fresh cache for each op
        torch._dynamo.reset()
        out["torch.compile"] = torch.compile(tfn, dynamic=False)
    return out


def _host_visible(torch, calls, samples=25):
    """Per call, samples of events around one eager step, started right after a synchronize (no
    sleep kernel to hide the host's launch work). Several calls (a cell's ways) are sampled in
    turns, the first rotating by sample, so that what the host does over the cell's seconds (its
    clock, other processes) falls on every way alike: one way's 15 samples after another's swung a
    way's median by up to 2x between runs on the H200's host (BENCHMARKS.md, 2026-11-28)."""
    for call in calls:
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    out = [[] for _ in calls]
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(samples):
        for j in range(len(calls)):
            k = (i + j) % len(calls)
            torch.cuda.synchronize()
            a.record()
            calls[k]()
            b.record()
            b.synchronize()
            out[k].append(a.elapsed_time(b) * 1e-3)
    return out


def _differentiable():
    """ewkern.torch's differentiable ops, or None where it cannot be imported (no torch: the run
    is skipped and says why, _torch_ready)."""
    try:
        from ewkern.torch import DIFFERENTIABLE
    except Exception:
        return None
    return list(DIFFERENTIABLE)


def _params(ctx):
    """(ops, dtypes, sizes, ways, methods), the options checked: BenchError naming the valid choices
    for a name it does not know or one the device cannot time. ops may hold "mlp", the MLP step."""
    small = not ctx.is_gpu and ctx.quick      # the CPU's quick run: three ops, one dtype
    every = _differentiable()
    ops = ctx.opt("train_ops") or (["gelu", "mul", "rmse", "mlp"] if small else
                                   (every or []) + ["rmsnorm", "rmse_kernel", "mlp"])
    # quick runs (make bench): float32 only (the GPU's quick run: every op at 64 MiB, about 30 s)
    dtypes = ctx.opt("train_dtypes") or (["float32"] if ctx.quick else ["float32", "float16", "bfloat16"])
    sizes = ctx.opt("train_sizes") or ctx.pick(
        "train_sizes_default", gpu_full=[1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30],
        gpu_quick=[64 << 20], cpu_full=[1 << 20], cpu_quick=[1 << 20])
    # torch.compile and the host-visible step (CUDA events) run on a GPU only
    can_ways = list(WAYS) if ctx.is_gpu else [w for w in WAYS if w != "torch.compile"]
    can_methods = list(METHOD_LABEL) if ctx.is_gpu else [m for m in METHOD_LABEL if m != "host"]
    ways = ctx.opt("train_ways") or can_ways
    methods = ctx.opt("train_methods") or (can_methods if ctx.is_gpu else ["back-to-back"])
    checks = [("--train-dtypes", dtypes, list(ITEMSIZE)), ("--train-ways", ways, list(WAYS)),
              ("--train-methods", methods, list(METHOD_LABEL))]
    if every is not None:
        checks.insert(0, ("--train-ops", ops, every + ["rmsnorm", "rmse_kernel", "mlp"]))
    for what, got, valid in checks:
        bad = [g for g in got if g not in valid]
        if bad:
            raise BenchError(f"{what}: unknown {', '.join(map(repr, bad))}; valid: {', '.join(valid)}")
    for what, got, can in (("--train-ways", ways, can_ways), ("--train-methods", methods, can_methods)):
        bad = [g for g in got if g not in can]
        if bad:
            raise BenchError(f"{what}: {', '.join(map(repr, bad))} on a GPU only; on {ctx.device}: {', '.join(can)}")
    if set(methods) == {"host"} and set(ways) == {"torch.compile"}:
        raise BenchError("--train-methods host times ewkern.torch and torch eager, not torch.compile: "
                         "--train-ways names neither")
    if "mlp" in (ctx.opt("train_ops") or ()) and not (_mlp_dtypes(dtypes) and _mlp_ways(ways)):
        raise BenchError(f"--train-ops mlp: the MLP step runs in {' or '.join(MLP_DTYPES)} (--train-dtypes gives "
                         f"{', '.join(dtypes)}) with {' or '.join(MLP_WAYS)} (--train-ways gives {', '.join(ways)})")
    return ops, dtypes, sizes, ways, methods


def _mlp_dtypes(dtypes):
    return [d for d in dtypes if d in MLP_DTYPES]


def _mlp_ways(ways):
    return [w for w in ways if w in MLP_WAYS]


def _nin(op):
    """The op's tensor inputs."""
    return 2 if op in BINARY or op in ("rmse", "rmse_kernel", "rmsnorm") else 1


def check(ctx):
    """Unknown option values, a way or method the device cannot time, and a cell that cannot fit,
    before anything runs."""
    ops, _, sizes, _, _ = _params(ctx)
    # one buffer set: the inputs, their gradients, the output and its incoming gradient (the MLP
    # step's size is its own, a few MiB)
    check_bytes(ctx, max(((_nin(op) * 3 + 2) * max(sizes) for op in ops if op != "mlp"), default=0),
                "train's largest step")


def _torch_ready(ctx):
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed") from None
    if ctx.is_gpu and not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    try:
        import ewkern.torch  # noqa: F401
    except Exception as exc:
        raise Skip(f"ewkern.torch cannot be imported: {type(exc).__name__}: {exc}") from None
    return torch


# A training step queues several kernels from Python (the forward, autograd's engine, the backward):
# in the single-step method the sleep kernel holds the stream for this long, several times what any
# of the ways takes to queue a step on the GPU machines (100-300 us measured), so that the step runs
# as queued work. What the host's queueing costs is the "host" method's measurement.
STEP_SPIN_US = 3000.0


def _measure_host(xr, bar, torch, entries):
    """The host-visible method for entries [(what, build, fields)], the ways sampled in turns; a
    step of the progress bar each, as the runner's measure_peer takes one."""
    built = [build() for _, build, _ in entries]     # (make_call, set_bytes, bytes read, bytes written)
    calls = [b[0]() for b in built]
    for (what, _, fields), (_, _, br, bw), secs in zip(entries, built, _host_visible(torch, calls)):
        med = statistics.median(secs)
        own = dict(fields)
        xr.add({"what": what, "impl": own.pop("impl_label"), "step_method": "host", "method": METHOD_LABEL["host"],
                "time_s": med, "samples_s": secs, "bytes_read": br, "bytes_written": bw, "bytes": br + bw,
                "gbs": (br + bw) / med / 1e9, "cache": "warm (host-visible)", **own})
        bar.step(f"{what}: {med * 1e6:.1f} us")


def _caches(ctx):
    return method_caches(ctx.cache, METHODS)


def _measure(ctx, xr, bar, torch, what, build, method, fields):
    if method == "host":
        _measure_host(xr, bar, torch, [(what, build, fields)])
        return
    xr.measure_peer(what=what, impl="torch", cache=_caches(ctx)[method], build=build, step_method=method,
                    spin_us=STEP_SPIN_US, **fields)


def run(ctx, xr):
    torch = _torch_ready(ctx)
    ops, dtypes, sizes, ways, methods = _params(ctx)
    dev = ctx.device
    in_turns = bool(ctx.opt("train_in_turns", True))
    mlp_dtypes, mlp_ways = (_mlp_dtypes(dtypes), _mlp_ways(ways)) if "mlp" in ops else ([], [])
    xr.param(ops=ops, dtypes=dtypes, sizes=sizes, ways=ways, methods=methods, mlp_dtypes=mlp_dtypes,
             torch=torch.__version__, in_turns=in_turns, caches={m: _caches(ctx)[m] for m in methods if m != "host"},
             method_labels={m: HOT_LABEL if m == "back-to-back" and ctx.cache == "hot" else METHOD_LABEL[m]
                            for m in methods})
    if ctx.cache == "flush" and "back-to-back" in methods:
        xr.note("--cache flush: back-to-back steps rotate their inputs (no flush fits between K steps run back "
                "to back); the single method is the flushed step")
    if "mlp" in ops and not (mlp_dtypes and mlp_ways):
        xr.note(f"the MLP step runs in {' or '.join(MLP_DTYPES)} with {' or '.join(MLP_WAYS)}: not run with "
                f"dtypes {', '.join(dtypes)} and ways {', '.join(ways)}")
    cells = [(op, dt, sz) for op in ops if op != "mlp" for dt in dtypes for sz in sizes]
    # one step a measurement (each (way, method) of a cell, the host method's ways but torch.compile)
    per_cell = sum(1 for w in ways for m in methods if not (m == "host" and w == "torch.compile"))
    bar = xr.progress(len(cells) * per_cell + len(mlp_dtypes) * len(mlp_ways) * len(methods))
    for op, dtype, size in cells:
        itemsize = ITEMSIZE[dtype]
        n = size // itemsize
        shape = (n // 1024, 1024) if op in ("rmse", "rmse_kernel") else \
            ((n // ROW, ROW) if op == "rmsnorm" else (n,))
        sc = SCALARS.get(op, ())
        nread, nwritten = step_traffic(op, n, itemsize)
        nin = _nin(op)
        turns = []    # (method, what, build, fields) timed in turns after the ways' own loop
        # timed in turns, every way's k-th step takes the same inputs and incoming gradient
        # (frameworks.SharedSets): where a set's buffers lie moved one short kernel by up to 10%
        make_set = partial(_step_set, torch, op, shape, dtype, dev, sc)
        sets = SharedSets(make_set) if in_turns else None
        for way, fn in _ways(ctx, torch, op, ways).items():
            def build(fn=fn):
                def bind(ins_g):
                    ins, g = ins_g
                    y = fn(*ins, *sc)
                    return _step(torch, fn, ins, sc, g if (g.shape, g.dtype) == (y.shape, y.dtype)
                                 else g.to(y.dtype).reshape(y.shape))
                make_call = set_maker(sets, make_set, bind)
                return make_call, (nin * 3 + 2) * size, nread, nwritten
            for method in methods:
                if method == "host" and way == "torch.compile":
                    continue
                what = f"{op} {dtype} {fmt_bytes(size)} {way} {method}"
                fields = dict(op=op, dtype=dtype, size_bytes=size, n=n, series=way, impl_label=way)
                if in_turns:
                    turns.append((method, what, build, fields))
                else:
                    _measure(ctx, xr, bar, torch, what, build, method, fields)
        for method in dict.fromkeys(m for m, *_ in turns):   # each timed method once, in order
            if method == "host":
                _measure_host(xr, bar, torch, [(w, b, f) for m, w, b, f in turns if m == method])
                continue
            xr.measure_peers_in_turns(entries=[(w, b, f) for m, w, b, f in turns if m == method],
                                      cache=_caches(ctx)[method], step_method=method, spin_us=STEP_SPIN_US,
                                      shared=True)
        sets = turns = None   # the cell's shared inputs go with it
    _mlp(ctx, xr, bar, torch, mlp_dtypes, mlp_ways, methods)
    bar.close()


def _mlp(ctx, xr, bar, torch, dtypes, ways, methods):
    """One training step of Linear -> gelu -> Linear -> rmse loss, ewkern.torch's gelu and rmse
    against torch's (ways of MLP_WAYS), in dtypes of MLP_DTYPES."""
    import ewkern.torch as ewt
    F = torch.nn.functional
    dev = ctx.device
    batch, d = (4096, 1024) if ctx.is_gpu else (256, 128)

    def loss_ewkern(x, t, w1, w2):
        return ewt.rmse(ewt.gelu(x @ w1) @ w2, t).mean()

    def loss_torch(x, t, w1, w2):
        y = F.gelu(x @ w1) @ w2
        return torch.sqrt(((y.float() - t.float()) ** 2).mean(1)).mean()
    losses = {"ewkern.torch": loss_ewkern, "torch eager": loss_torch}
    for dtype in dtypes:
        tdt = getattr(torch, dtype)
        for way, lf in ((w, losses[w]) for w in ways):
            def build(lf=lf):
                def make_call():
                    gen = torch.Generator(device=dev).manual_seed(5)
                    x = torch.randn(batch, d, device=dev, generator=gen).to(tdt)
                    t = torch.randn(batch, d, device=dev, generator=gen).to(tdt)
                    w1 = (torch.randn(d, 4 * d, device=dev, generator=gen) / math.sqrt(d)).to(tdt).requires_grad_()
                    w2 = (torch.randn(4 * d, d, device=dev, generator=gen) / math.sqrt(4 * d)).to(tdt).requires_grad_()
                    return lambda: torch.autograd.grad(lf(x, t, w1, w2), (w1, w2))
                return make_call, (2 * batch * d + 8 * d * d) * ITEMSIZE[dtype], 0, 0
            for method in methods:
                _measure(ctx, xr, bar, torch, f"mlp {dtype} {way} {method}", build, method,
                         dict(op="mlp", dtype=dtype, size_bytes=batch * d * ITEMSIZE[dtype], n=batch * d, series=way,
                              impl_label=way))


# --- reading the results --------------------------------------------------------------------------

def ratios(ms, method, base="torch eager"):
    """{(op, dtype, size): ewkern.torch speed / base speed} for one method."""
    t = {(m["op"], m["dtype"], m["size_bytes"], m["series"]): m["time_s"] for m in ms
         if m.get("step_method") == method and m.get("time_s")}
    out = {}
    for (op, dt, sz, way), secs in t.items():
        if way == "ewkern.torch" and (op, dt, sz, base) in t:
            out[(op, dt, sz)] = t[(op, dt, sz, base)] / secs
    return out


def figures(results, exp):
    import matplotlib.pyplot as plt
    ms = exp["measurements"]
    figs = []
    labels = {**METHOD_LABEL, **((exp.get("params") or {}).get("method_labels") or {})}
    methods = list(dict.fromkeys(m.get("step_method") for m in ms))
    for method in methods:
        r = ratios(ms, method)
        if not r:
            continue
        ops = list(dict.fromkeys(k[0] for k in r))
        fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(ops)), 3.6))
        dts = list(dict.fromkeys(k[1] for k in r))
        width = 0.8 / max(len(dts), 1)
        for j, dt in enumerate(dts):
            worst = [min((v for k, v in r.items() if k[0] == op and k[1] == dt), default=float("nan")) for op in ops]
            ax.bar([i + j * width for i in range(len(ops))], worst, width, label=dt)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ops))], ops, rotation=60, ha="right")
        ax.set_ylabel("ewkern.torch / torch eager speed\n(worst size)")
        ax.set_title(f"{results.get('device_name') or results.get('device')}: forward + backward, "
                     f"{labels.get(method, method)}", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs.append((f"train_{method.replace('-', '_')}", fig))
    return figs


def summary(results, exp):
    ms = exp["measurements"]
    labels = {**METHOD_LABEL, **((exp.get("params") or {}).get("method_labels") or {})}
    text = [how_timed(exp, ms, "A cell's ways")]
    for method in dict.fromkeys(m.get("step_method") for m in ms):
        r = ratios(ms, method)
        rc = ratios(ms, method, base="torch.compile")
        if not r:
            continue
        rows = []
        for op in dict.fromkeys(k[0] for k in r):
            for dt in dict.fromkeys(k[1] for k in r if k[0] == op):
                cells = {k[2]: v for k, v in r.items() if k[0] == op and k[1] == dt}
                cc = [v for k, v in rc.items() if k[0] == op and k[1] == dt]
                rows.append([op, dt, f"{min(cells.values()):.2f}", f"{statistics.median(cells.values()):.2f}",
                             f"{min(cc):.2f}" if cc else "-",
                             " ".join(f"{fmt_bytes(s)}:{v:.2f}" for s, v in sorted(cells.items()))])
        samples = {(m["op"], m["dtype"], m["size_bytes"], m["series"]): m.get("samples_s") for m in ms
                   if m.get("step_method") == method}
        below, sure = below_beyond_spread({k: (v, samples.get(k + ("torch eager",)), samples.get(k + ("ewkern.torch",)))
                                           for k, v in r.items()})
        text.append(f"### {labels.get(method, method)}\n\n{len(below)} of {len(r)} cells below 0.99 of torch "
                    f"eager{spread_note(below, sure)}\n\n" +
                    md_table(["op", "dtype", "worst vs eager", "median vs eager", "worst vs compile", "by size"], rows))
    return "\n\n".join(text) if len(text) > 1 else ""
