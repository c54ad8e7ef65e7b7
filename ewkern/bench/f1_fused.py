"""F1: fused expressions a user writes, ewkern's run-time kernels against CuPy, torch eager and torch.compile.

Each expression is written once as a CuPy-style kernel definition (ElementwiseKernel or
ReductionKernel source strings) and run by ewkern (``ewkern.ElementwiseKernel`` /
``ewkern.ReductionKernel``) and by CuPy (``cupy.ElementwiseKernel`` / ``cupy.ReductionKernel``) from
the SAME strings, and written as a torch user would write it (eager, and the same function under
``torch.compile``):

  fma         o = a * b + c
  gelu_mul    o = gelu(a) * b                     (the erf form in float: 0.5f*a*(1.0f+erf(a*0.70710678f)))
  swish_gate  o = a * sigmoid(b)                  (a / (1 + exp(-b)))
  rmsnorm     y = x * rsqrt(mean(x^2) + eps)      per row of [rows, 4096]: CuPy runs a
                                                  ReductionKernel for the mean of squares (axis=1,
                                                  keepdims) and an ElementwiseKernel that broadcasts
                                                  it over the row (it has no one-kernel form);
                                                  ewkern one RowKernel (the row read once)
  mse_rows    y = mean((a - b)^2)                 per row of [rows, 4096], one ReductionKernel
  mixed       o = a * b + c                       a, c, o float32, b float16 or bfloat16 (upcast)
  add         z = x + y                           the control: against ewkern.add itself

in float32, float16 and bfloat16 (the kernels use the placeholder T and compute 16-bit types in
float; torch computes in the dtype as it does; mixed's dtype is b's), at sizes given per input
array. Where every output is 16-bit ewkern divides in float by div.full.f32 (its default since
e4628a5, as Triton's kernels divide); CuPy compiles the same source with IEEE division. Ways (each timed the same way for every expression):

  ewkern          the run-time kernels on torch tensors (they launch on torch's current stream)
  ewkern 2k       rmsnorm only: ewkern running CuPy's two kernels (the same source as cupy)
  cupy            CuPy's kernels from the same source strings, on CuPy arrays
  torch eager     the torch expression
  torch.compile   torch.compile(the torch expression written into out, dynamic=False), Inductor's
                  default mode: ``out.copy_(expr)`` inside the compiled function, which Inductor
                  fuses into the expression's one kernel (its stores go to out)
  ewkern.add      ewkern.add(x, y, out=z), for the add control only
  ewkern.fuse     the expression as a Python function under ``ewkern.fuse`` (cupy.fuse's counterpart:
                  traced once into one ElementwiseKernel, or a ReductionKernel for mse_rows, the same
                  kernel forms as the ewkern way's), called as a fuse user calls it: on the inputs,
                  its result allocated each call as cupy.fuse's and torch eager's are; not rmsnorm,
                  whose array is used after its row's reduction (one kernel only as a RowKernel)

timed as the peers are (frameworks.time_calls) in two methods:
  back-to-back    K calls captured into one CUDA graph, inputs rotated through >= 4x the L2
  single          one eager call, L2 flushed, queued behind a sleep kernel
(--cache hot: back-to-back takes the same inputs every call, labelled hot; --cache flush leaves it
rotating, since no flush fits between K calls run back to back: single is the flushed call)
--fused-in-turns times the ways on torch's stream (all but CuPy) in turns, each sample taking every
way once, on the same buffers (frameworks.time_calls_in_turns, SharedSets), not one way's samples
after another's.
Outputs are preallocated per input set and written by ewkern, CuPy and torch.compile alike. Where
a result is allocated in a captured graph, the allocator hands every call the block the previous
call freed: one output that stays in L2 while the inputs rotate, which the others' rotated outputs
do not get (on the H100, rmsnorm at 16 MiB: torch.compile allocating 11.2 us, writing a rotated out
13.7; ewkern 10.2 and 12.2). Torch eager allocates its results (its one-op-per-kernel expression
has nowhere to put an out). On a CPU the ways are ewkern's CPU backend of the same
kernels and NumPy expressions (numpy), timed by the host clock, back-to-back only by default.

Before any timing, each way's result on each cell is checked once against a float64 NumPy
reference computed from that way's own (rounded) inputs, on a sample of elements (the first and
last 2^15 and 2^15 random ones; whole rows for the row expressions): tolerance
ulps x eps(output dtype) x scale (+ a float32 accumulation term for the row reductions, + the
16-bit subnormal spacing), scale = the size of the terms where a sum cancels. A mismatch is
recorded as an error and that way is not timed on that cell. Bytes = every input read once +
every output written once (rmsnorm's per-row mean is not counted: a fused kernel would not write
it). Ratios are speeds: ewkern's speed / the other way's (> 1: ewkern is faster); the issue's
target is >= 0.99 of the better of CuPy and torch.compile, and of ewkern.add for the control.
"""

from __future__ import annotations

import importlib
import math
import statistics
from dataclasses import dataclass

from .common import below_beyond_spread, how_timed, list_arg, md_table, method_caches, sizes_arg, spread_note
from .timing import BenchError, Skip
from .units import ITEMSIZE, fmt_bytes

NAME = "fused"
TITLE = "Fused user kernels: ewkern.ElementwiseKernel/ReductionKernel vs CuPy's, torch eager and torch.compile"
DESCRIPTION = ("user-written fused expressions (a*b+c, gelu(a)*b, a*sigmoid(b), rmsnorm and mse rows, mixed dtypes, "
               "x+y) x float32/float16/bfloat16 x sizes, ewkern's run-time kernels vs CuPy's same source, torch eager "
               "and torch.compile, back-to-back and single launch")
PAPER = "(issue 21)"


ARGS = [("--fused-exprs", dict(type=list_arg, metavar="EXPRS",
                               help="expressions: fma, gelu_mul, swish_gate, rmsnorm, mse_rows, mixed, add "
                                    "(default all)")),
        ("--fused-dtypes", dict(type=list_arg, metavar="DTYPES",
                                help="dtypes (default float32,float16,bfloat16; quick: float32); mixed takes the "
                                     "16-bit ones as b's dtype (float16 when none is given)")),
        ("--fused-sizes", dict(type=sizes_arg, metavar="SIZES",
                               help="bytes per input array, e.g. 1MiB,64MiB (default GPU 1MiB,16MiB,256MiB,1GiB, "
                                    "quick 64MiB; CPU 1MiB,16MiB, quick 1MiB)")),
        ("--fused-ways", dict(type=list_arg, metavar="WAYS",
                              help="ewkern, ewkern 2k, cupy, torch eager, torch.compile, ewkern.add, numpy, "
                                   "ewkern.fuse (default GPU: all but numpy; CPU: ewkern, ewkern 2k, numpy, "
                                   "ewkern.add, ewkern.fuse)")),
        ("--fused-methods", dict(type=list_arg, metavar="METHODS",
                                 help="back-to-back, single (default both; CPU: back-to-back)")),
        ("--fused-in-turns", dict(action="store_true",
                                  help="time the ways on torch's stream (ewkern, ewkern 2k, torch eager, "
                                       "torch.compile, ewkern.add, ewkern.fuse) in turns, each sample taking every "
                                       "way once; "
                                       "CuPy (its own stream) alone as before"))]

COLS = 4096          # the row length of rmsnorm and mse_rows
RMS_EPS = 1e-6
WAYS = ("ewkern", "ewkern 2k", "cupy", "torch eager", "torch.compile", "ewkern.add", "numpy", "ewkern.fuse")
GPU_WAYS = ("ewkern", "ewkern 2k", "cupy", "torch eager", "torch.compile", "ewkern.add", "ewkern.fuse")
CPU_WAYS = ("ewkern", "ewkern 2k", "numpy", "ewkern.add", "ewkern.fuse")
OURS = ("ewkern", "ewkern 2k", "ewkern.add", "ewkern.fuse")     # ewkern's ways: a failure is an error
BEST_OF = ("cupy", "torch.compile")     # the target: >= 0.99 of the better of these
DTYPES = ("float32", "float16", "bfloat16", "float64")
HALF = ("float16", "bfloat16")
METHODS = {"back-to-back": "rotate", "single": "flush"}
HOT_LABEL = "back-to-back (graph of K calls, the same inputs every call: hot)"
METHOD_LABEL = {"back-to-back": "back-to-back (graph of K calls, inputs rotated)",
                "single": "single call (L2 flushed, queued behind a sleep kernel)"}
# The single-call method holds the stream with a sleep kernel while the host queues the call: the
# two-launch rmsnorm through ewkern's Python launch path and torch.compile's guards take tens of
# microseconds; this outlasts them several times over.
CALL_SPIN_US = 1000.0
CHECK_PART = 1 << 15     # elements in each part of the checked sample (first, last, random)
CHECK_ROWS = 16          # rows in each part of the checked sample of a row expression

EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float64": 2.0 ** -52}
SUBNORMAL = {"float32": 2.0 ** -149, "float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float64": 0.0}


@dataclass(frozen=True)
class Expr:
    """One expression: its formula, input and output dtypes (roles "T": the cell's dtype, "B":
    mixed's 16-bit dtype, or a dtype name), whether it runs over [rows, COLS] rows and reduces each
    row, the kernel definitions (class name, positional args, keyword args; "{B}" is b's dtype),
    and the tolerance of its check (ulps of the output dtype; accum: float32 ulps for the row
    reductions' summation)."""
    name: str
    formula: str
    ins: tuple
    out: str
    rows: bool
    reduce: bool
    kernels: tuple
    ulps: float
    accum: float = 0.0
    own: tuple = ()      # ewkern's definitions where they differ from CuPy's (a kernel CuPy lacks)


# the row mean as a constant (rows are COLS long, a power of two: exact); CuPy's ReductionKernel has
# no _in_ind/_out_ind in post_map, so a source using them would not compile there
_MEAN = f"a * {1.0 / COLS!r}f"
EXPRS = {e.name: e for e in (
    Expr("fma", "o = a * b + c", ("T", "T", "T"), "T", False, False,
         (("ElementwiseKernel", ("T a, T b, T c", "T o", "o = a * b + c", "fused_fma"), {}),), 4),
    Expr("gelu_mul", "o = gelu(a) * b", ("T", "T"), "T", False, False,
         (("ElementwiseKernel", ("T a, T b", "T o", "o = 0.5f * a * (1.0f + erf(a * 0.70710678f)) * b",
                                 "fused_gelu_mul"), {}),), 4),
    Expr("swish_gate", "o = a * sigmoid(b)", ("T", "T"), "T", False, False,
         (("ElementwiseKernel", ("T a, T b", "T o", "o = a / (1 + exp(-b))", "fused_swish_gate"), {}),), 4),
    Expr("rmsnorm", "y = x * rsqrt(mean(x^2, row) + eps)", ("T",), "T", True, False,
         (("ReductionKernel", ("T x", "float32 m", "(float)x * (float)x", "a + b", "m = " + _MEAN, "0",
                               "fused_rms_meansq"), {"reduce_type": "float"}),
          ("ElementwiseKernel", ("T x, float32 m, float32 eps", "T y", "y = x * rsqrt(m + eps)",
                                 "fused_rms_apply"), {})), 8, 4 * math.sqrt(COLS),
         (("RowKernel", ("T x, float32 eps", "T y", "(float)x * (float)x", "a + b",
                         "y = x * rsqrt(" + _MEAN + " + eps)", "0", "fused_rmsnorm"), {"reduce_type": "float"}),)),
    Expr("mse_rows", "y = mean((a - b)^2, row)", ("T", "T"), "T", True, True,
         (("ReductionKernel", ("T a, T b", "T y", "((float)a - (float)b) * ((float)a - (float)b)", "a + b",
                               "y = " + _MEAN, "0", "fused_mse_rows"), {"reduce_type": "float"}),),
         8, 4 * math.sqrt(COLS)),
    Expr("mixed", "o = a * b + c (a, c, o float32; b 16-bit)", ("float32", "B", "float32"), "float32", False, False,
         (("ElementwiseKernel", ("float32 a, {B} b, float32 c", "float32 o", "o = a * b + c", "fused_mixed_{B}"),
           {}),), 4),
    Expr("add", "z = x + y", ("T", "T"), "T", False, False,
         (("ElementwiseKernel", ("T x, T y", "T z", "z = x + y", "fused_add"), {}),), 2),
)}


# --- the expressions in each way -------------------------------------------------------------

def _kernel_call(name, own=False):
    """f(kernels, ins, out, tmp) -> out: one call of the expression's kernels (ewkern's or CuPy's:
    the two take the same arguments; own: ewkern's own definitions, Expr.own)."""
    if own and name == "rmsnorm":
        return lambda ks, ins, out, tmp: ks[0](ins[0], RMS_EPS, out)
    if name == "rmsnorm":
        def f(ks, ins, out, tmp):
            (x,), (m,) = ins, tmp
            ks[0](x, out=m, axis=1, keepdims=True)
            return ks[1](x, m, RMS_EPS, out)
        return f
    if name == "mse_rows":
        return lambda ks, ins, out, tmp: ks[0](*ins, out=out, axis=1)
    return lambda ks, ins, out, tmp: ks[0](*ins, out)


def _torch_fn(torch, name):
    """The expression as a torch user writes it."""
    F = torch.nn.functional
    return {"fma": lambda a, b, c: a * b + c,
            "gelu_mul": lambda a, b: F.gelu(a) * b,
            "swish_gate": lambda a, b: a * torch.sigmoid(b),
            "rmsnorm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS),
            "mse_rows": lambda a, b: ((a - b) ** 2).mean(-1),
            "mixed": lambda a, b, c: a * b + c,
            "add": lambda x, y: x + y}[name]


def _fuse_fn(name):
    """The expression as an ewkern.fuse user writes it (the ElementwiseKernel's formula: gelu by
    erf, sigmoid as a division; Python scalars weak, so float16 inputs stay float16 outside the
    kernel's float arithmetic, but bfloat16 times a Python float is float32 by NumPy's rules with
    ml_dtypes, which ewkern.fuse follows: gelu_mul's bfloat16 result is float32). Skip for
    rmsnorm: its array is used after its row's reduction."""
    import numpy as np
    import ewkern
    if name == "rmsnorm":
        raise Skip("ewkern.fuse cannot fuse rmsnorm: x is used after its row's reduction (ewkern.RowKernel "
                   "is its one-kernel form, the ewkern way)")
    body = {"fma": lambda a, b, c: a * b + c,
            "gelu_mul": lambda a, b: 0.5 * a * (1.0 + ewkern.erf(a * 0.70710678)) * b,
            "swish_gate": lambda a, b: a / (1 + np.exp(-b)),
            "mse_rows": lambda a, b: np.mean((a - b) * (a - b), axis=1),
            "mixed": lambda a, b, c: a * b + c,
            "add": lambda x, y: x + y}[name]
    return ewkern.fuse(kernel_name=f"fused_{name}_fuse")(body)


def _numpy_fn(name, dtype):
    """The expression as a NumPy user writes it (row means accumulated in float32, as NumPy does for
    float16 and as one must ask for bfloat16; float16's exp in float32, where exp(-b) would overflow)."""
    import numpy as np
    if name == "gelu_mul":
        try:
            from scipy.special import erf
        except ImportError:
            raise Skip("NumPy has no erf (scipy is not installed)") from None
        return lambda a, b: 0.5 * a * (1 + erf(a * 0.70710678)) * b
    if name == "swish_gate":
        if dtype == "float16":
            return lambda a, b: (a / (1 + np.exp(-b.astype(np.float32)))).astype(a.dtype)
        return lambda a, b: a / (1 + np.exp(-b))
    if name == "rmsnorm":
        return lambda x: x * (1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32) + RMS_EPS)
                              ).astype(x.dtype)
    if name == "mse_rows":
        return lambda a, b: np.mean((a - b) ** 2, axis=-1, dtype=np.float32).astype(a.dtype)
    return {"fma": lambda a, b, c: a * b + c, "mixed": lambda a, b, c: a * b + c,
            "add": lambda x, y: x + y}[name]


def _erfc(x):
    import numpy as np
    return np.vectorize(math.erfc, otypes=[np.float64])(x)


def _reference(name, ins):
    """(float64 reference, scale, magnitude) from float64 copies of the inputs: the check allows
    ulps x eps x scale (scale: the size of the terms, where a sum cancels) and a few subnormal
    spacings x (1 + magnitude)."""
    import numpy as np
    if name in ("fma", "mixed"):
        a, b, c = ins
        ab = a * b
        return ab + c, np.abs(ab) + np.abs(c), np.abs(ab) + np.abs(c)
    if name == "gelu_mul":
        a, b = ins
        ref = 0.5 * a * _erfc(-a / math.sqrt(2.0)) * b     # erfc: no cancellation for a << 0
        return ref, np.abs(a * b), np.abs(a * b)
    if name == "swish_gate":
        a, b = ins
        with np.errstate(over="ignore"):
            ref = a / (1.0 + np.exp(-b))
        return ref, np.abs(ref), np.abs(a)
    if name == "rmsnorm":
        (x,) = ins
        ref = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)
        return ref, np.abs(ref), np.abs(ref)
    if name == "mse_rows":
        a, b = ins
        ref = np.mean((a - b) ** 2, axis=-1)
        return ref, ref, ref
    x, y = ins
    return x + y, np.abs(x) + np.abs(y), np.abs(x) + np.abs(y)


# --- cells -------------------------------------------------------------------------------------

class Cell:
    """One (expression, dtype, size): shapes, dtypes, declared bytes."""

    def __init__(self, expr: Expr, dtype: str, size: int):
        self.expr, self.dtype, self.size = expr, dtype, size
        role = {"T": dtype, "B": dtype}
        self.in_dtypes = [role.get(r, r) for r in expr.ins]
        self.out_dtype = role.get(expr.out, expr.out)
        first = ITEMSIZE[self.in_dtypes[0]]
        self.rows: int | None = None
        self.shape: tuple[int, ...]
        self.out_shape: tuple[int, ...]
        self.tmp: list[tuple[tuple[int, ...], str]] = []
        if expr.rows:
            rows = max(1, size // first // COLS)
            self.rows, self.shape = rows, (rows, COLS)
            self.out_shape = (rows,) if expr.reduce else self.shape
            if expr.name == "rmsnorm":
                self.tmp = [((rows, 1), "float32")]     # the per-row mean of squares
        else:
            self.shape = (max(1, size // first),)
            self.out_shape = self.shape
        self.n = math.prod(self.shape)
        self.bytes_read = sum(self.n * ITEMSIZE[d] for d in self.in_dtypes)
        self.bytes_written = math.prod(self.out_shape) * ITEMSIZE[self.out_dtype]
        self.set_bytes = self.bytes_read + self.bytes_written + sum(math.prod(s) * ITEMSIZE[d] for s, d in self.tmp)

    @property
    def size_bytes(self) -> int:
        """The bytes of the first input as run (rows round down to whole rows of COLS)."""
        return self.n * ITEMSIZE[self.in_dtypes[0]]

    def label(self) -> str:
        return f"{self.expr.name} {self.dtype} {fmt_bytes(self.size_bytes)}"


def _params(ctx):
    """(exprs, dtypes, sizes, ways, methods), the options checked (BenchError for unknown names)."""
    exprs = ctx.opt("fused_exprs") or list(EXPRS)
    dtypes = ctx.opt("fused_dtypes") or (["float32"] if ctx.quick else ["float32", "float16", "bfloat16"])
    sizes = ctx.opt("fused_sizes") or ctx.pick(
        "fused_sizes_default", gpu_full=[1 << 20, 16 << 20, 256 << 20, 1 << 30], gpu_quick=[64 << 20],
        cpu_full=[1 << 20, 16 << 20], cpu_quick=[1 << 20])
    ways = ctx.opt("fused_ways") or list(GPU_WAYS if ctx.is_gpu else CPU_WAYS)
    methods = ctx.opt("fused_methods") or (list(METHODS) if ctx.is_gpu else ["back-to-back"])
    for what, got, valid in (("--fused-exprs", exprs, list(EXPRS)), ("--fused-dtypes", dtypes, DTYPES),
                             ("--fused-ways", ways, WAYS), ("--fused-methods", methods, list(METHODS))):
        bad = [g for g in got if g not in valid]
        if bad:
            raise BenchError(f"{what}: unknown {', '.join(map(repr, bad))}; valid: {', '.join(valid)}")
    return exprs, dtypes, sizes, ways, methods


def _cells(exprs, dtypes, sizes):
    """Every cell in run order; mixed takes the 16-bit dtypes as b's (float16 when none is asked)."""
    out = []
    for name in exprs:
        e = EXPRS[name]
        dts = ([d for d in dtypes if d in HALF] or ["float16"]) if name == "mixed" else dtypes
        out += [Cell(e, dt, sz) for dt in dts for sz in sizes]
    return out


def check(ctx):
    """Unknown option values and cells that cannot fit, before anything runs."""
    exprs, dtypes, sizes, _, _ = _params(ctx)
    cells = _cells(exprs, dtypes, sizes)
    big = max(cells, key=lambda c: c.set_bytes)
    # one buffer set, the float32 source of a 16-bit input, and a result torch allocates
    ctx.cfg.check_fits(big.set_bytes + 4 * big.n + big.bytes_written, f"fused's largest cell ({big.label()})")


# --- arrays in each framework ---------------------------------------------------------------

def _randn(fw, shape, dtype, device, seed):
    """Standard normal x 2 drawn in float32, rounded to dtype (gelu and sigmoid see both tails)."""
    from . import frameworks
    if fw == "torch":
        import torch
        x = torch.randn(shape, dtype=torch.float32, device=device)
        x *= 2.0
        return x.to(frameworks._torch_dtype(dtype))
    if fw == "cupy":
        import cupy
        with cupy.cuda.Device(frameworks._index(device)):
            return (cupy.random.standard_normal(shape, dtype=cupy.float32) * 2.0).astype(frameworks._cupy_dtype(dtype))
    import numpy as np
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * np.float32(2.0)
    return x.astype(frameworks._numpy_dtype(dtype))


def _sync(fw, device):
    if fw == "torch":
        import torch
        if device != "cpu":
            torch.cuda.synchronize(device)
    elif fw == "cupy":
        import cupy
        cupy.cuda.get_current_stream().synchronize()


def _sample(cell: Cell):
    """The checked part: ("rows", row indices) or ("flat", element indices), sorted, unique."""
    import numpy as np
    rng = np.random.default_rng(1234)
    total = cell.rows if cell.rows is not None else cell.n
    part = CHECK_ROWS if cell.rows is not None else CHECK_PART
    if total <= 3 * part:
        idx = np.arange(total, dtype=np.int64)
    else:
        idx = np.unique(np.concatenate([np.arange(part), np.arange(total - part, total),
                                        rng.integers(0, total, part)]).astype(np.int64))
    return ("rows" if cell.expr.rows else "flat"), idx


def _host(fw, x, sel):
    """float64 NumPy copy of the selected part of x."""
    import numpy as np
    kind, idx = sel
    if fw == "torch":
        import torch
        t = torch.from_numpy(idx).to(x.device)
        v = x.index_select(0, t) if kind == "rows" else x.reshape(-1).index_select(0, t)
        return v.to(torch.float64).cpu().numpy()
    if fw == "cupy":
        import cupy
        t = cupy.asarray(idx)
        return cupy.asnumpy(x[t] if kind == "rows" else x.reshape(-1)[t]).astype(np.float64)
    x = np.asarray(x)
    return (x[idx] if kind == "rows" else x.reshape(-1)[idx]).astype(np.float64)


class Mismatch(AssertionError):
    """A way's result is not within the tolerance of the float64 reference."""


def check_result(cell: Cell, fw, ins, out, sel):
    """(elements compared, max |err| / tol) of out against the float64 reference; Mismatch when
    an element is outside its tolerance (NaN and inf compared by position, never skipped)."""
    import numpy as np
    e = cell.expr
    got = _host(fw, out, sel)
    ref, scale, mag = _reference(e.name, [_host(fw, x, sel) for x in ins])
    if got.shape != ref.shape:
        raise Mismatch(f"{cell.label()}: result shape {got.shape} (checked part), expected {ref.shape}")
    od = cell.out_dtype
    tol = (e.ulps * EPS[od] + e.accum * EPS["float32"]) * scale + 4 * SUBNORMAL[od] * (1 + mag) + 1e-300
    with np.errstate(invalid="ignore"):
        err = np.abs(got - ref)
        bad = ~(err <= tol)
    same_nonfinite = (np.isnan(got) & np.isnan(ref)) | (np.isinf(got) & (got == ref))
    bad &= ~same_nonfinite
    ratio = float(np.nanmax(np.where(np.isfinite(err), err / tol, np.inf))) if err.size else 0.0
    if bad.any():
        k = int(np.flatnonzero(bad.reshape(-1))[0])
        where = np.unravel_index(k, bad.shape)
        raise Mismatch(f"{cell.label()}: {int(bad.sum())} of {bad.size} checked elements outside the tolerance; "
                       f"first at checked index {tuple(int(v) for v in where)}: got {got[where]!r}, "
                       f"reference {ref[where]!r}, tolerance {tol[where]:.3g}")
    return int(got.size), ratio


# --- ways ----------------------------------------------------------------------------------------

class _Kernels:
    """Kernel objects per (module, expression, b's dtype), made once per run: ewkern and CuPy cache
    their compiled code in them."""

    def __init__(self):
        self._made = {}

    def get(self, module, cell: Cell, own: bool = False):
        b = cell.dtype if cell.expr.name == "mixed" else ""
        key = (module.__name__, cell.expr.name, b, own)
        if key not in self._made:
            ks = []
            for cls, args, kw in (cell.expr.own if own else cell.expr.kernels):
                args = tuple(a.replace("{B}", b) if isinstance(a, str) else a for a in args)
                ks.append(getattr(module, cls)(*args, **kw))
            self._made[key] = ks
        return self._made[key]


def _buffers(ctx, fw, cell: Cell):
    """(arrays, empties) of a cell in framework fw: arrays() -> the inputs (random, each call the
    next seeds), empties() -> (out, temporaries)."""
    from . import frameworks
    dev = ctx.device
    seeds = iter(range(10 ** 9))

    def arrays():
        s = next(seeds) * 8
        return [_randn(fw, cell.shape, d, dev, s + k) for k, d in enumerate(cell.in_dtypes)]

    def empties():
        out = frameworks._empty(fw, cell.out_shape, cell.out_dtype, dev)
        return out, [frameworks._empty(fw, s, d, dev) for s, d in cell.tmp]
    return arrays, empties


def shared_sets(ctx, cell: Cell):
    """frameworks.SharedSets of (inputs, out, temporaries) as torch tensors: the buffers that the
    ways on torch's stream share when timed in turns (--fused-in-turns)."""
    from . import frameworks
    arrays, empties = _buffers(ctx, "torch", cell)
    return frameworks.SharedSets(lambda: (arrays(), *empties()))


def _way(ctx, way, cell: Cell, kernels: _Kernels, shared=None):
    """(fw, impl timed by frameworks.time_calls, make_set); make_set() -> (inputs, call), call()
    returning the result. Skip when the way cannot run this cell. shared (shared_sets): the sets a
    way on torch tensors takes its buffers from, the k-th make_set() the k-th set; make_set.fresh()
    gives another make_set (on shared sets starting again at the first set)."""
    from . import frameworks
    dev = ctx.device
    gpu = ctx.is_gpu
    name = cell.expr.name
    if way in OURS:
        fw = impl = "torch" if gpu else "numpy"     # on a GPU: torch tensors, timed through torch's graphs
        why = None
    elif way == "cupy":
        fw = impl = "cupy"
        why = frameworks.available("cupy", dev)
    elif way in ("torch eager", "torch.compile"):
        fw, impl = "torch", ("torch" if way == "torch eager" else "torch.compile")
        why = frameworks.available("torch", dev)
    else:
        fw = impl = "numpy"
        why = frameworks.available("numpy", dev)
    if why:
        raise Skip(why)
    for d in cell.in_dtypes + [cell.out_dtype]:    # bfloat16 where the framework has none
        if fw == "cupy":
            frameworks._cupy_dtype(d)
        elif fw == "numpy":
            frameworks._numpy_dtype(d)
    arrays, empties = _buffers(ctx, fw, cell)
    writes = True   # the call writes into out (and temporaries); else it returns a new result
    if way in ("ewkern", "ewkern 2k", "cupy"):
        own = way == "ewkern" and bool(cell.expr.own)
        ks = kernels.get(importlib.import_module(way.split()[0]), cell, own)
        f = _kernel_call(name, own)

        def bind(ins, out, tmp):
            return lambda: f(ks, ins, out, tmp)
    elif way == "ewkern.add":
        import ewkern

        def bind(ins, out, tmp):
            return lambda: ewkern.add(ins[0], ins[1], out=out)
    elif way == "ewkern.fuse":
        fn = _fuse_fn(name)
        writes = False

        def bind(ins, out, tmp):
            return lambda: fn(*ins)
    elif way == "numpy":
        fn = _numpy_fn(name, cell.dtype)
        writes = False

        def bind(ins, out, tmp):
            return lambda: fn(*ins)
    else:
        import torch
        fn = _torch_fn(torch, name)
        if way == "torch.compile":
            # one code object per expression: a fresh cache for each cell keeps Dynamo under its
            # recompile limit (dtypes x sizes), as t1_train does
            torch._dynamo.reset()
            cfn = torch.compile(lambda *a: a[-1].copy_(fn(*a[:-1])), dynamic=False)

            def bind(ins, out, tmp):
                return lambda: cfn(*ins, out)
        else:
            writes = False

            def bind(ins, out, tmp):
                return lambda: fn(*ins)
    sets = shared if fw == "torch" else None

    def fresh():
        """a make_set; on shared sets its first call takes the first set again"""
        made = frameworks.set_maker(sets, lambda: (arrays(), *(empties() if writes else (None, None))),
                                    lambda io: (io[0], bind(*io)))
        made.fresh = fresh
        return made
    return fw, impl, fresh()


def _ways_for(cell: Cell, ways):
    return [w for w in ways if (w != "ewkern.add" or cell.expr.name == "add") and (w != "ewkern 2k" or cell.expr.own)]


def _prepare(ctx, xr, way, cell, kernels, shared=None):
    """The way's (impl, make_set) after one checked call; None when skipped or wrong (recorded).
    shared: as _way takes it."""
    from . import frameworks
    what = f"{cell.label()} {way}"
    ours = way in OURS
    try:
        fw, impl, make_set = _way(ctx, way, cell, kernels, shared)
        ins, call = make_set()
        out = call()
        _sync(fw, ctx.device)
        try:
            checked, worst = check_result(cell, fw, ins, out, _sample(cell))
        except Mismatch as exc:
            if ours:
                raise
            # a peer outside ewkern's tolerance (torch.compile's approximate exp is a few ulp off) is
            # still timed: its speed is what users get; the discrepancy is reported beside it
            xr.note(f"{what}: timed although outside the check's tolerance: {exc}")
            checked, worst = 0, float("nan")
        del ins, call, out
    except Skip as exc:
        xr.skip(what, str(exc))
        return None
    except Mismatch as exc:     # ewkern's wrong result is an error and is not timed
        xr.error(what, exc)
        return None
    except (KeyboardInterrupt, BenchError):
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        if ours:        # ewkern failing is ewkern's problem: an error
            xr.error(what, exc)
        else:           # a peer failing (torch.compile, CuPy's compiler) is the peer's: skipped, reason kept
            xr.skip(what, (f"torch.compile failed: {text}" if way == "torch.compile" else text))
        return None
    finally:
        frameworks.release_peer_memory()
    return impl, make_set, checked, worst


def _ready(ctx):
    """torch on a GPU (every GPU way but CuPy's runs on torch tensors and is timed through torch's
    graph capture); nothing beyond NumPy on a CPU."""
    if not ctx.is_gpu:
        return None
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed (the GPU ways run on torch tensors and are timed through its "
                   "CUDA graphs)") from None
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    return torch


def _caches(ctx):
    return method_caches(ctx.cache, METHODS)


def _labels(ctx, methods):
    hot = {m: ctx.cache == "hot" and m == "back-to-back" for m in methods}
    if ctx.is_gpu:
        return {m: HOT_LABEL if hot[m] else METHOD_LABEL[m] for m in methods}
    return {m: "host clock, " + m + (", the same inputs every call: hot" if hot[m] else "") for m in methods}


def run(ctx, xr):
    from . import frameworks
    torch = _ready(ctx)
    exprs, dtypes, sizes, ways, methods = _params(ctx)
    cells = _cells(exprs, dtypes, sizes)
    labels = _labels(ctx, methods)
    caches = _caches(ctx)
    xr.param(exprs=exprs, dtypes=dtypes, sizes=sizes, ways=ways, methods=methods, cols=COLS, rms_eps=RMS_EPS,
             torch=getattr(torch, "__version__", None), method_labels=labels, caches={m: caches[m] for m in methods},
             formulas={n: EXPRS[n].formula for n in exprs},
             kernels={n: [[cls, list(args), kw] for cls, args, kw in EXPRS[n].kernels] for n in exprs},
             ewkern_kernels={n: [[cls, list(args), kw] for cls, args, kw in EXPRS[n].own] for n in exprs
                             if EXPRS[n].own})
    if not ctx.is_gpu:
        xr.note("CPU: ewkern's CPU backend of the same kernels (compiled by the system C++ compiler) against "
                "NumPy expressions, host clock; CuPy and torch are GPU ways here")
    xr.note("bytes = every input read once + every output written once (rmsnorm's per-row mean is not "
            "counted); ratios are ewkern's speed / the other way's")
    if ctx.cache == "flush" and "back-to-back" in methods:
        xr.note("--cache flush: back-to-back calls rotate their inputs (no flush fits between K calls run back "
                "to back); the single method is the flushed call")
    in_turns = ctx.is_gpu and bool(ctx.opt("fused_in_turns", False))
    xr.param(in_turns=in_turns)
    kernels = _Kernels()
    bar = xr.progress(sum(len(_ways_for(c, ways)) * len(methods) for c in cells))
    for cell in cells:
        recs = {}
        common = dict(op=cell.expr.name, formula=cell.expr.formula, dtype=cell.dtype,
                      in_dtypes=",".join(cell.in_dtypes), out_dtype=cell.out_dtype, shape=list(cell.shape),
                      n=cell.n, size_bytes=cell.size_bytes)
        together = []   # (way, build, fields): the ways on torch's stream, timed in turns (--fused-in-turns)
        # in turns, on the same buffers (frameworks.SharedSets: where a set lies moves a short launch)
        shared = shared_sets(ctx, cell) if in_turns else None
        for way in _ways_for(cell, ways):
            got = _prepare(ctx, xr, way, cell, kernels, shared)
            if got is None:
                continue
            impl, make_set, checked, worst = got

            def build(make_set=make_set):
                # on shared sets a fresh maker for every measurement, each starting at the first set
                ms = make_set.fresh() if hasattr(make_set, "fresh") else make_set
                return (lambda: ms()[1]), cell.set_bytes, cell.bytes_read, cell.bytes_written
            fields = dict(series=way, check_elements=checked, check_max_err_over_tol=worst)
            if in_turns and impl.startswith("torch"):
                together.append((way, build, fields))
                continue
            for method in methods:
                recs[(way, method)] = xr.measure_peer(
                    what=f"{cell.label()} {way} {method}", impl=impl, impl_label=way, build=build,
                    cache=caches[method], spin_us=CALL_SPIN_US, launch=method, **common, **fields)
                frameworks.release_peer_memory()
        for method in methods if together else ():
            got = xr.measure_peers_in_turns(
                entries=[(f"{cell.label()} {way} {method}", build, dict(fields, impl_label=way))
                         for way, build, fields in together],
                cache=caches[method], spin_us=CALL_SPIN_US, launch=method, shared=True, **common)
            for rec in got:
                if rec is not None:
                    recs[(rec["series"], method)] = rec
            frameworks.release_peer_memory()
        _add_ratios(recs, methods)
    bar.close()


def rederive(measurements):
    """The ratios of every cell's ewkern records to the other ways (_add_ratios) made again from
    the records' times: after bench.merge --pool has read cells across runs."""
    cells = {}
    for m in measurements:
        key = (m.get("op"), m.get("dtype"), m.get("in_dtypes"), m.get("size_bytes"), m.get("launch"))
        cells.setdefault(key, {})[(m.get("series"), m.get("launch"))] = m
    for key, recs in cells.items():
        _add_ratios(recs, [key[-1]])


def _add_ratios(recs, methods):
    """Each method's ewkern record gets its speed ratio to every other way of the cell (vs_<way>,
    None where it did not run) and to the best of best_of (vs_best, best_way): in the CSV's rows,
    where merged runs keep them."""
    have = {w for (w, _m), r in recs.items() if r is not None}
    bases = BEST_OF if have & set(BEST_OF) else ("numpy",)
    for method in methods:
        mine = recs.get(("ewkern", method))
        if not mine or not mine.get("time_s"):
            continue
        t = {w: r["time_s"] for (w, m), r in recs.items() if m == method and r and r.get("time_s")}
        for w in WAYS[1:]:
            mine[f"vs_{w.replace(' ', '_').replace('.', '_')}"] = t[w] / mine["time_s"] if w in t else None
        best = min(((t[b], b) for b in bases if b in t), default=None)
        mine["vs_best"], mine["best_way"] = (best[0] / mine["time_s"], best[1]) if best else (None, None)


# --- reading the results --------------------------------------------------------------------------

def _times(ms, launch):
    return {(m["op"], m["dtype"], m["size_bytes"], m["series"]): m["time_s"] for m in ms
            if m.get("launch") == launch and m.get("time_s")}


def best_of(ms) -> tuple:
    """The ways ewkern's target compares with: CuPy and torch.compile, or NumPy where neither ran (CPU)."""
    have = {m.get("series") for m in ms}
    return BEST_OF if have & set(BEST_OF) else ("numpy",)


def ratios(ms, launch, base=None):
    """{(op, dtype, size): (ewkern's speed / base's, the base way)}; base: one way, or None for the
    best of best_of(ms) (the faster one of each cell)."""
    t = _times(ms, launch)
    bases = best_of(ms) if base is None else (base,)
    out = {}
    for (op, dt, sz, way), secs in t.items():
        if way != "ewkern":
            continue
        have = [(t[(op, dt, sz, b)], b) for b in bases if (op, dt, sz, b) in t]
        if have:
            best, who = min(have)
            out[(op, dt, sz)] = (best / secs, who)
    return out


def figures(results, exp):
    from .plots import draw_bandwidth_lines, new_figure, series_colors, size_axis
    ms = exp["measurements"]
    figs = []
    base = " and ".join(best_of(ms))
    name = results.get("device_name") or results.get("device")
    labels = (exp.get("params") or {}).get("method_labels") or METHOD_LABEL
    for launch in dict.fromkeys(m.get("launch") for m in ms):
        r = ratios(ms, launch)
        if r:
            ops = list(dict.fromkeys(k[0] for k in r))
            dts = list(dict.fromkeys(k[1] for k in r))
            fig, axes = new_figure(max(6.0, 0.9 * len(ops) + 2), 3.8)
            ax = axes[0][0]
            width = 0.8 / max(len(dts), 1)
            for j, dt in enumerate(dts):
                worst = [min((v[0] for k, v in r.items() if k[0] == op and k[1] == dt), default=float("nan"))
                         for op in ops]
                ax.bar([i + j * width for i in range(len(ops))], worst, width, label=dt)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.axhline(0.99, color="tab:red", lw=0.8, ls="--", label="0.99 (issue 21)")
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ops))], ops, rotation=30, ha="right")
            ax.set_ylabel(f"ewkern / best of {base}\n(speed, worst size)")
            ax.set_title(f"{name}: user kernels, {labels.get(launch, launch)}", fontsize=9)
            ax.legend(fontsize=7)
            figs.append((f"fused_{launch.replace('-', '_')}_ratio", fig))
        rows = [m for m in ms if m.get("launch") == launch and m.get("gbs")]
        if not rows:
            continue
        ops = list(dict.fromkeys(m["op"] for m in rows))
        # one row per expression, its dtypes left to right (mixed's are b's 16-bit dtypes)
        dts = {op: list(dict.fromkeys(m["dtype"] for m in rows if m["op"] == op)) for op in ops}
        ncols = max(len(v) for v in dts.values())
        ways = list(dict.fromkeys(m["series"] for m in rows))
        colors = series_colors(ways)
        fig, axes = new_figure(3.6 * ncols + 1.5, 2.6 * len(ops) + 0.6, ncols=ncols, nrows=len(ops))
        for i, op in enumerate(ops):
            for j in range(ncols):
                ax = axes[i][j]
                if j >= len(dts[op]):
                    ax.set_visible(False)
                    continue
                dt = dts[op][j]
                sizes = []
                for w in ways:
                    pts = sorted((m["size_bytes"], m["gbs"]) for m in rows
                                 if m["op"] == op and m["dtype"] == dt and m["series"] == w)
                    if pts:
                        sizes += [p[0] for p in pts]
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                                color=colors[w], label=w)
                if not sizes:
                    ax.set_visible(False)
                    continue
                draw_bandwidth_lines(ax, results)
                size_axis(ax, sizes, "bytes per input")
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
                ax.set_title(f"{op} {dt}", fontsize=8)
                if j == 0:
                    ax.set_ylabel("GB/s (read + write)", fontsize=8)
        handles, lbls = [], []
        for row in axes:
            for ax in row:
                if ax.get_visible():
                    for h, lb in zip(*ax.get_legend_handles_labels()):
                        if lb not in lbls:
                            handles.append(h)
                            lbls.append(lb)
        fig.legend(handles, lbls, loc="outside lower center", ncols=min(4, len(lbls)), fontsize=7)
        fig.suptitle(f"{name}: user kernels, {labels.get(launch, launch)}", fontsize=10)
        figs.append((f"fused_{launch.replace('-', '_')}_gbs", fig))
    return figs


def summary(results, exp):
    ms = exp["measurements"]
    base = best_of(ms)
    names = {"cupy": "CuPy", "numpy": "NumPy"}
    base_text = ("the better of " if len(base) > 1 else "") + " and ".join(names.get(b, b) for b in base)
    eager = any(m.get("series") == "torch eager" for m in ms)
    labels = (exp.get("params") or {}).get("method_labels") or METHOD_LABEL
    text = [how_timed(exp, ms, "A cell's ways on torch's stream (all but CuPy)")] if ms else []
    for launch in dict.fromkeys(m.get("launch") for m in ms):
        r = ratios(ms, launch)
        re_ = ratios(ms, launch, base="torch eager")
        radd = ratios(ms, launch, base="ewkern.add")
        if not r and not re_:
            continue
        rows = []
        keys = list(dict.fromkeys(list(r) + list(re_)))
        for op in dict.fromkeys(k[0] for k in keys):
            for dt in dict.fromkeys(k[1] for k in keys if k[0] == op):
                cells = {k[2]: v for k, v in r.items() if k[0] == op and k[1] == dt}
                ce = [v[0] for k, v in re_.items() if k[0] == op and k[1] == dt]
                worst = min(cells.items(), key=lambda kv: kv[1][0]) if cells else None
                rows.append([op, dt,
                             f"{worst[1][0]:.2f} ({worst[1][1]}, {fmt_bytes(worst[0])})" if worst else "-",
                             f"{statistics.median(v[0] for v in cells.values()):.2f}" if cells else "-"]
                            + ([f"{min(ce):.2f}" if ce else "-"] if eager else [])
                            + [" ".join(f"{fmt_bytes(s)}:{v[0]:.2f}" for s, v in sorted(cells.items()))])
        head = f"### {labels.get(launch, launch)}\n\n"
        if r:
            samples = {(m["op"], m["dtype"], m["size_bytes"], m["series"]): m.get("samples_s") for m in ms
                       if m.get("launch") == launch}
            below, sure = below_beyond_spread({k: (v[0], samples.get(k + (v[1],)), samples.get(k + ("ewkern",)))
                                               for k, v in r.items()})
            head += f"{len(below)} of {len(r)} cells below 0.99 of {base_text}" + spread_note(below, sure)
        if radd:
            worst_add = min(v[0] for v in radd.values())
            head += f" Control z = x + y: ewkern's kernel / ewkern.add worst {worst_add:.2f} (target >= 0.99)."
        text.append(head + "\n\n" + md_table(
            ["expr", "dtype", f"worst vs {base_text}", "median"] + (["worst vs torch eager"] if eager else [])
            + ["by size (vs best)"], rows))
    checked = {(m["op"], m["dtype"], m["size_bytes"], m["series"]) for m in ms if m.get("check_elements")}
    wrong = [e["what"] for e in exp.get("errors") or [] if str(e.get("error", "")).startswith("Mismatch")]
    if checked or wrong:
        text.append(f"Checked against float64 NumPy references before timing: {len(checked)} (way, cell) results "
                    f"within tolerance (the largest error {max((m.get('check_max_err_over_tol') or 0) for m in ms):.2f}"
                    f" of its tolerance), {len(wrong)} outside"
                    + (" (not timed): " + "; ".join(wrong[:8]) if wrong else "") + ".")
    return "\n\n".join(text)
