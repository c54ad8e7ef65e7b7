"""ewkern.torch: ewkern's ops as torch custom ops, for torch.compile and training.

    import ewkern.torch as ewt
    loss = ewt.rmse(ewt.gelu(x), y).mean()      # autograd records it; torch.compile keeps it

Every elementwise op and rmse is registered with torch.library in the namespace ``ewkern``
(``torch.ops.ewkern.gelu``, ...), the way PyTorch documents custom kernels:
  - a kernel for cpu and cuda tensors that calls the same C entry as ``ewkern.gelu`` (the DLPack
    exchange-API fast path, torch's current stream, ewkern's CPU backend, the auto kernels);
  - a fake kernel that gives the result's shape and dtype, so torch.compile traces through it;
  - an autograd formula for every differentiable op, written with these same ops (so double
    backward works too), and with torch ops where ewkern has none (the masks of maximum,
    minimum, abs and relu; rmse's broadcast over the reduced axes);
  - a mutating ``<name>_out`` op (``Tensor(a!) out``, returns nothing) behind ``out=``.

Eager calls that need a gradient skip the dispatcher: the elementwise ops and rmse record C++
autograd nodes (ewkern/_torch_native, built for this torch on first use; ``autograd_path()`` says
whether they are in use), or else Python torch.autograd.Functions; both launch the same kernels.

torch.func works on them: grad, vjp, jacrev, jvp, jacfwd, hessian and vmap (each op has a batching
rule), and so does forward-mode AD with torch.autograd.forward_ad's dual tensors; under these the
functions apply an autograd.Function of this module around the custom op (torch's custom ops take
no grad or jvp themselves), whose gradients are the composed formulas.

The functions here take what ewkern's take, less variant/block/grid. Unlike ewkern's they accept
non-contiguous tensors (a contiguous copy is made first, as torch's own kernels do) and an out=
of any layout. out= follows torch's rule: it is not differentiable, so a call with out= that
would need a gradient raises. Importing this module imports torch; ``import ewkern`` alone does
not (``ewkern.torch`` is loaded on first use).
"""

from __future__ import annotations

import math
import operator
import os
import re
import struct
import threading
import warnings

import torch

from . import _C

__all__ = ["copy", "fill", "add", "sub", "mul", "div", "maximum", "minimum", "add_const", "mul_const",
           "axpby", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu",
           "silu", "rmse", "DIFFERENTIABLE", "kernel_op", "autograd_path"]

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"ewkern.torch needs torch 2.4 or newer (torch.library.custom_op); this is "
                      f"torch {torch.__version__}")

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INFO = {d["name"]: d for d in _C.ops() if d["family"] == "elementwise"}
_SCALARS = {0: (), 1: ("c",), 2: ("alpha", "beta")}
_FUNCTIONAL = {}    # name -> torch.ops.ewkern.<name>.default
_MUTATING = {}      # name -> torch.ops.ewkern.<name>_out.default (fill: torch.ops.ewkern.fill)
_FUNCTION = {}      # name -> the torch.autograd.Function eager calls run through
_BACKWARD = {d["name"]: d for d in _C.ops() if d["family"] == "backward"}
_dispatch_depth = torch._C._len_torch_dispatch_stack
E = torch.ops.ewkern

_OUT_GRAD = ("ewkern.torch.{}(): out= is not differentiable (as with torch's own out= functions), but an "
             "argument requires grad and grad mode is on; call it without out=, or under torch.no_grad()")


# --- kernels ----------------------------------------------------------------------------------------

def _as_tensor(r):
    """ewkern answers torch inputs with a torch tensor through the DLPack exchange API; a torch
    without that API gets an ewkern.Array, viewed here without a copy."""
    return r if isinstance(r, torch.Tensor) else torch.from_dlpack(r)


def _write(fn, out, *args, **kwargs):
    """fn(*args, **kwargs, out=out). ewkern writes contiguous memory only: an out of another layout
    gets a contiguous temporary, copied in."""
    if out.is_contiguous():
        fn(*args, **kwargs, out=out)
    else:
        tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
        fn(*args, **kwargs, out=tmp)
        out.copy_(tmp)


def _kernels(fn, nin):
    """The real kernels of one op: functional (returns the result) and mutating (writes out)."""
    def functional(*args):
        return _as_tensor(fn(*(t.contiguous() for t in args[:nin]), *args[nin:]))

    def mutating(*args):
        _write(fn, args[-1], *(t.contiguous() for t in args[:nin]), *args[nin:-1])
    return functional, mutating


# --- fake kernels: the checks of ops.c, on shapes and dtypes only ------------------------------------

def _check(name, tensors, names):
    """What ewkern's C entry checks (dtype, equal dtype/device/shape, no broadcasting), with the
    same exception types, so fake and real kernels fail alike."""
    a = tensors[0]
    if a.dtype not in DTYPES:
        raise TypeError(f"{name}(): unsupported dtype {a.dtype} (ewkern takes float32, float16, bfloat16 "
                        f"and float64)")
    for t, n in zip(tensors[1:], names[1:]):
        if t.device != a.device:
            raise ValueError(f"{name}(): device mismatch: {names[0]} is on {a.device} but {n} is on {t.device}")
        if t.dtype != a.dtype:
            raise TypeError(f"{name}(): dtype mismatch: {names[0]} is {a.dtype} but {n} is {t.dtype}")
        if t.shape != a.shape:
            raise ValueError(f"{name}(): shape mismatch: {names[0]} has shape {tuple(a.shape)} but {n} has "
                             f"shape {tuple(t.shape)} (ewkern does not broadcast)")


def _fakes(name, nin):
    names = ("a", "b")[:nin] + ("out",)

    def functional(*args):
        _check(name, args[:nin], names)
        return torch.empty(args[0].shape, dtype=args[0].dtype, device=args[0].device)

    def mutating(*args):
        _check(name, args[:nin] + args[-1:], names)
    return functional, mutating


def rmse_split(shape, axis):
    """(result shape, shape with the reduced axes kept as 1, reduced axes) of ewkern.rmse's axis=
    rule: None reduces every axis but the first (a 1-D input is one batch); the reduced axes must
    be one contiguous run."""
    nd = len(shape)
    if axis is None:
        red = list(range(0 if nd == 1 else 1, nd))
    else:
        red = []
        for ax in ([axis] if isinstance(axis, int) else axis):
            if not -nd <= ax < nd:
                raise ValueError(f"rmse(): axis {ax} is out of bounds for an array of {nd} dimensions")
            ax %= nd
            if ax in red:
                raise ValueError(f"rmse(): axis {ax} repeated")
            red.append(ax)
        red.sort()
    if red and red[-1] - red[0] + 1 != len(red):
        raise ValueError("rmse(): the reduced axes must be one contiguous run (for example the trailing axes, "
                         "each batch contiguous, or the leading axes, batch as the fastest axis)")
    kept = [shape[i] for i in range(nd) if i not in red]
    keep = [1 if i in red else shape[i] for i in range(nd)]
    return kept, keep, red


def _rmse_result(a, b, axis):
    _check("rmse", (a, b), ("a", "b"))
    kept, _, _ = rmse_split(a.shape, axis)
    return kept, (torch.float64 if a.dtype == torch.float64 else torch.float32)


# --- autograd formulas ------------------------------------------------------------------------------
# Two forms of each op's gradient:
#   FAST[name]: the backward kernels (csrc/grads.def: one kernel that reads grad and what the forward
#     saved once and writes each gradient once), or the gradient itself where it is that; called
#     through `ns`, either the plain C functions (eager: no dispatcher in the way) or the custom ops
#     (torch.ops.ewkern.*_backward, so torch.compile sees them). Not differentiable itself.
#   GRADS[name]: the same gradient composed of differentiable ewkern ops (the Python faces below, so
#     each step records its own node or, under a functorch transform, its own Function), used when
#     a graph of the backward is wanted (create_graph=True: double backward, gradgradcheck;
#     torch.func's transforms). 16-bit inputs are widened to float32 for the steps and rounded once
#     at the end.
# Each takes (grad, saved tensors, scalars, needs_input_grad) and returns the inputs' gradients.

def _wide(t):
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


_legacy_batched = getattr(getattr(torch._C, "_functorch", None), "is_legacy_batchedtensor", lambda t: False)


def _readable(g):
    """Whether the C functions can read an incoming gradient g as its values: a plain tensor
    without the negative bit, not batched (autograd.grad's is_grads_batched, and so
    torch.autograd.functional.jacobian(vectorize=True), run the backward under torch's legacy vmap;
    torch.func.vmap over autograd.grad gives functorch's batched tensors). Other gradients go to
    the backward kernels as custom ops (_Ops), which the dispatcher resolves or batches (as the
    C++ nodes do: readable() in ewkern/_torch_native/autograd.cpp)."""
    return type(g) is torch.Tensor and not g.is_neg() and not _legacy_batched(g) and not _functorch_active()


class _Eager:
    """The plain C functions: what an eager backward calls."""
    @staticmethod
    def f(name, *args):
        return _as_tensor(getattr(_C, name)(*args))

    @staticmethod
    def b(name, *args, need=(True, True)):
        r = getattr(_C, name)(*args, output_mask=tuple(need))
        return tuple(None if x is None else _as_tensor(x) for x in r)


class _Ops:
    """The custom ops: what a backward traced by torch.compile calls."""
    @staticmethod
    def f(name, *args):
        return getattr(E, name)(*args)

    @staticmethod
    def b(name, *args, need=(True, True)):
        r = getattr(E, name)(*args)
        return tuple(x if k else None for x, k in zip(r, need))


def _pair(both, only_a, only_b, need):
    """Two gradients: the one-pass kernel when both are wanted, a single op for one."""
    if need[0] and need[1]:
        return both()
    return (only_a() if need[0] else None, only_b() if need[1] else None)


def _unary_fast(bw):
    return lambda ns, g, s, c, need: (ns.f(bw, g, s[0]),)


FAST = {
    "copy": lambda ns, g, s, c, need: (g,),
    "add": lambda ns, g, s, c, need: (g, g),
    "sub": lambda ns, g, s, c, need: (g, ns.f("neg", g) if need[1] else None),
    "mul": lambda ns, g, s, c, need: _pair(lambda: ns.b("mul_backward", g, s[0], s[1]),
                                            lambda: ns.f("mul", g, s[1]), lambda: ns.f("mul", g, s[0]), need),
    "div": lambda ns, g, s, c, need: (ns.b("div_backward", g, s[0], s[1], need=need) if need[1]
                                      else (ns.f("div", g, s[1]), None)),
    "maximum": lambda ns, g, s, c, need: ns.b("maximum_backward", g, s[0], s[1], need=need),
    "minimum": lambda ns, g, s, c, need: ns.b("minimum_backward", g, s[0], s[1], need=need),
    "add_const": lambda ns, g, s, c, need: (g,),
    "mul_const": lambda ns, g, s, c, need: (ns.f("mul_const", g, c[0]),),
    "axpby": lambda ns, g, s, c, need: _pair(lambda: ns.b("axpby_backward", g, c[0], c[1]),
                                              lambda: ns.f("mul_const", g, c[0]),
                                              lambda: ns.f("mul_const", g, c[1]), need),
    "neg": lambda ns, g, s, c, need: (ns.f("neg", g),),
}
_UNARY_BACKWARD = ("abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu", "silu")
for _name in _UNARY_BACKWARD:
    FAST[_name] = _unary_fast(f"{_name}_backward")


def _d_div(g, s, c, need):
    a, b = s                                        # d(a/b)/db = -(a/b)/b
    ga = div(g, b)
    return ga, (neg(div(mul(ga, a), b)) if need[1] else None)


def _d_extreme(loses):
    """maximum/minimum as torch defines their gradient: a tie splits it in halves; a's part is
    zero where loses(a, b) (a < b for maximum), b's where loses(b, a); NaN loses nowhere."""
    def d(g, s, c, need):
        a, b = s
        shared = torch.where(a == b, mul_const(g, 0.5), g)
        return (shared.masked_fill(loses(a, b), 0) if need[0] else None,
                shared.masked_fill(loses(b, a), 0) if need[1] else None)
    return d


def _d_rsqrt(g, s, c, need):
    y = _wide(s[0])                                 # -1/2 a^(-3/2) = -y^3 / 2
    return (mul(mul_const(_wide(g), -0.5), mul(y, mul(y, y))).to(g.dtype),)


def _d_erf(g, s, c, need):
    x = _wide(s[0])                                 # 2/sqrt(pi) e^(-x^2)
    d = mul_const(exp(neg(mul(x, x))), 2.0 / math.sqrt(math.pi))
    return (mul(_wide(g), d).to(g.dtype),)


def _one_minus(t):
    return add_const(neg(t), 1.0)


def _d_tanh(g, s, c, need):
    y = _wide(s[0])                                 # 1 - y^2
    return (mul(_wide(g), _one_minus(mul(y, y))).to(g.dtype),)


def _d_sigmoid(g, s, c, need):
    y = _wide(s[0])                                 # y (1 - y)
    return (mul(mul(_wide(g), y), _one_minus(y)).to(g.dtype),)


def _d_gelu(g, s, c, need):
    x = _wide(s[0])                                 # Phi(x) + x phi(x)
    cdf = mul_const(add_const(erf(mul_const(x, math.sqrt(0.5))), 1.0), 0.5)
    pdf = mul_const(exp(mul_const(mul(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    return (mul(_wide(g), add(cdf, mul(x, pdf))).to(g.dtype),)


def _d_silu(g, s, c, need):
    x = _wide(s[0])                                 # sigma(x) (1 + x (1 - sigma(x)))
    sig = sigmoid(x)
    d = mul(sig, add_const(mul(x, _one_minus(sig)), 1.0))
    return (mul(_wide(g), d).to(g.dtype),)


# name -> (what the forward saves: a, b inputs, y the result; the composed formula)
GRADS = {
    "copy": ("", lambda g, s, c, need: (g,)),
    "add": ("", lambda g, s, c, need: (g, g)),
    "sub": ("", lambda g, s, c, need: (g, neg(g) if need[1] else None)),
    "mul": ("ab", lambda g, s, c, need: (mul(g, s[1]) if need[0] else None,
                                         mul(g, s[0]) if need[1] else None)),
    "div": ("ab", _d_div),
    "maximum": ("ab", _d_extreme(lambda a, b: a < b)),
    "minimum": ("ab", _d_extreme(lambda a, b: a > b)),
    "add_const": ("", lambda g, s, c, need: (g,)),
    "mul_const": ("", lambda g, s, c, need: (mul_const(g, c[0]),)),
    "axpby": ("", lambda g, s, c, need: (mul_const(g, c[0]) if need[0] else None,
                                         mul_const(g, c[1]) if need[1] else None)),
    "neg": ("", lambda g, s, c, need: (neg(g),)),
    "abs": ("a", lambda g, s, c, need: (mul(g, s[0].sgn()),)),
    "exp": ("y", lambda g, s, c, need: (mul(g, s[0]),)),
    "log": ("a", lambda g, s, c, need: (div(g, s[0]),)),
    "sqrt": ("y", lambda g, s, c, need: (mul_const(div(g, s[0]), 0.5),)),
    "rsqrt": ("y", _d_rsqrt),
    "erf": ("a", _d_erf),
    "tanh": ("y", _d_tanh),
    "sigmoid": ("y", _d_sigmoid),
    "relu": ("y", lambda g, s, c, need: (torch.ops.aten.threshold_backward(g, s[0], 0),)),
    "gelu": ("a", _d_gelu),
    "silu": ("a", _d_silu),
}
DIFFERENTIABLE = tuple(GRADS) + ("rmse",)


def _backward_of(name):
    """The gradient of one op: composed when a graph of the backward is wanted (create_graph,
    outside torch.compile), the backward kernels otherwise."""
    fast, composed = FAST[name], GRADS[name][1]

    def grads(ns, g, saved, scalars, need):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            return composed(g, saved, scalars, need)
        return fast(ns, g.contiguous(), saved, scalars, need)
    return grads


def _autograd(nin, saves, grads):
    """setup_context/backward of the custom op (what torch.compile and torch.ops.ewkern.<op> use)."""
    def setup_context(ctx, inputs, output):
        pick = {"a": inputs[0], "b": inputs[1] if nin > 1 else None, "y": output}
        ctx.save_for_backward(*(pick[k] for k in saves))
        ctx.scalars = tuple(inputs[nin:])

    def backward(ctx, grad):
        g = grads(_Ops, grad, ctx.saved_tensors, ctx.scalars, ctx.needs_input_grad[:nin])
        return tuple(g) + (None,) * len(ctx.scalars)
    return backward, setup_context


# two-input ops without scalars: their own forward and backward around FAST's gradient
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")


def _function(name, nin, saves, fast, composed):
    """The same op as a torch.autograd.Function that calls the C functions directly: what eager
    code runs (the custom op's dispatch costs tens of microseconds of host time per call, which a
    single training step pays while the GPU waits). One-input ops whose backward is one kernel of
    grads.def get a forward and backward without the general bookkeeping (about 6 us less of host
    time a step than the general form on the CI host), and so do the two-input ops without scalars
    (about 1 us less a step of add or mul on tiny tensors there: 19.2 -> 17.9 and 23.4 -> 22.5 us,
    torch's own 13.0 and 14.7; a bare autograd.Function costs about 3.3 us over torch)."""
    fn = getattr(_C, name)
    grad_enabled = torch.is_grad_enabled
    if nin == 1 and saves in ("a", "y") and name in _UNARY_BACKWARD:
        bw_name = f"{name}_backward"     # looked up at each call (tests count the C calls)
        keep_output = saves == "y"

        def forward1(ctx, a):
            y = _as_tensor(fn(a.contiguous()))
            ctx.save_for_backward(y if keep_output else a)
            return y

        def backward1(ctx, grad):
            (s,) = ctx.saved_tensors
            if grad_enabled():          # a graph of the backward is wanted: the composed formula
                return composed(grad, (s,), (), (True,))[0]
            if not _readable(grad):
                return fast(_Ops, grad, (s,), (), (True,))[0]
            return _as_tensor(getattr(_C, bw_name)(grad.contiguous(), s.contiguous()))
        return type(f"{name}_function", (torch.autograd.Function,),
                    {"forward": staticmethod(forward1), "backward": staticmethod(backward1)})

    if nin == 1 and not saves:
        # copy, neg, add_const, mul_const: the backward needs no tensor, at most the scalar (tiny
        # tensors, CI host: neg's step 18.8 -> 16.9 us, torch's 11.8; add_const 17.9 -> 15.7)
        def forward0(ctx, a, *c):
            ctx.scalars = c
            return _as_tensor(fn(a.contiguous(), *c))

        def backward0(ctx, grad):
            c = ctx.scalars
            if grad_enabled():          # a graph of the backward is wanted: the composed formula
                return tuple(composed(grad, (), c, (True,))) + (None,) * len(c)
            ns = _Eager if _readable(grad) else _Ops
            return tuple(fast(ns, grad.contiguous(), (), c, (True,))) + (None,) * len(c)
        return type(f"{name}_function", (torch.autograd.Function,),
                    {"forward": staticmethod(forward0), "backward": staticmethod(backward0)})

    if nin == 2 and name in _BINARY:
        keep = bool(saves)

        def forward2(ctx, a, b):
            y = _as_tensor(fn(a.contiguous(), b.contiguous()))
            if keep:
                ctx.save_for_backward(a, b)
            return y

        def backward2(ctx, grad):
            saved, need = ctx.saved_tensors, ctx.needs_input_grad
            if grad_enabled():          # a graph of the backward is wanted: the composed formula
                return composed(grad, saved, (), need)
            ns = _Eager if _readable(grad) else _Ops
            return tuple(fast(ns, grad.contiguous(), [t.contiguous() for t in saved], (), need))
        return type(f"{name}_function", (torch.autograd.Function,),
                    {"forward": staticmethod(forward2), "backward": staticmethod(backward2)})

    def forward(ctx, *args):
        y = _as_tensor(fn(*(t.contiguous() for t in args[:nin]), *args[nin:]))
        pick = {"a": args[0], "b": args[1] if nin > 1 else None, "y": y}
        ctx.save_for_backward(*(pick[k] for k in saves))
        ctx.scalars = tuple(args[nin:])
        return y

    def backward(ctx, grad):
        # eager only (torch.compile takes the custom op): composed when a graph of the backward is wanted
        saved, need = ctx.saved_tensors, ctx.needs_input_grad[:nin]
        g = (composed(grad, saved, ctx.scalars, need) if grad_enabled() else
             fast(_Eager if _readable(grad) else _Ops, grad.contiguous(), [t.contiguous() for t in saved],
                  ctx.scalars, need))
        return tuple(g) + (None,) * len(ctx.scalars)
    return type(f"{name}_function", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _rmse_setup(ctx, inputs, output):
    a, b, axis = inputs
    ctx.save_for_backward(a, b, output)
    ctx.axis = axis


def _rmse_grads(ns, ctx, grad):
    """d sqrt(mean((a-b)^2)) / da = (a - b) / (n r), n the elements per batch; -that for b: one
    kernel (rmse_backward) for both, or composed for a graph of the backward."""
    a, b, r = ctx.saved_tensors
    need = ctx.needs_input_grad[:2]
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        return _composed_rmse(grad, (a, b, r), ctx.axis, need) + (None,)
    if not _readable(grad):
        ns = _Ops
    ga, gb = ns.b("rmse_backward", grad.contiguous(), a.contiguous(), b.contiguous(), r, ctx.axis, need=need)
    return ga, gb, None


def _composed_rmse(grad, saved, axis, need):
    """rmse's gradients composed of differentiable ops (a graph of the backward is wanted); also
    what the C++ node's backward calls then."""
    a, b, r = saved
    _, keep, red = rmse_split(a.shape, None if axis is None else list(axis))
    n = math.prod(a.shape[i] for i in red)
    scale = (grad / (r * n)).reshape(keep)              # per batch: small, torch ops broadcast it
    ga = (_wide(sub(a, b)) * scale).to(a.dtype)
    return ga, (neg(ga) if need[1] else None)


def _rmse_backward(ctx, grad):
    return _rmse_grads(_Ops, ctx, grad)


class _RmseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, axis):
        r = _as_tensor(_C.rmse(a.contiguous(), b.contiguous(), axis))
        _rmse_setup(ctx, (a, b, axis), r)
        return r

    @staticmethod
    def backward(ctx, grad):
        return _rmse_grads(_Eager, ctx, grad)


# --- registration -----------------------------------------------------------------------------------

# torch.autograd.Function.apply is a Python classmethod around the C++ apply of
# torch._C._FunctionBase. For a Function without setup_context (every one here) and with no functorch
# transform active, all it adds is unwrapping dead functorch wrappers in Python (CI host, two tiny
# tensors: 4.00 us a forward against 2.92 through the C++ apply with the same unwrapping; a training
# step of add, gelu or mul_const 0.6-0.8 us less, of rmse 1.5). _APPLY holds each Function's direct
# call; a torch without these internals keeps Function.apply. Under a functorch transform (vmap,
# grad) _FUNCTORCH's Function around the custom op runs instead (_run): the C functions cannot read
# functorch's tensors.
_C_APPLY = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_forward_ad = torch.autograd.forward_ad      # _current_level >= 0 inside a dual_level (forward-mode AD)
_APPLY = {}         # name -> what an eager call that needs a gradient calls (_install_native)
_PY_APPLY = {}      # name -> a callable equal to _FUNCTION[name].apply (_direct_apply)
_EAGER = {}         # name -> what the Python face calls outside torch.compile with out=None
_PY_EAGER = {}      # name -> the checks of _eager in Python, then _APPLY, the C function or _run


def _direct_apply(cls, nin):
    """cls.apply(tensor x nin, *scalars) for calls made while no functorch transform is active
    (_eager), through the C++ apply where _C_APPLY allows it (the tensors are the first nin
    arguments, 1 or 2; nin None: every tensor among the arguments)."""
    defined = getattr(torch.autograd.function, "_is_setup_context_defined", None)
    if _C_APPLY is None or _unwrap_if_dead is None or defined is None or defined(cls.setup_context):
        return cls.apply
    capply, unwrap = _C_APPLY.__get__(None, cls), _unwrap_if_dead
    if nin == 1:
        return lambda a, *scalars: capply(unwrap(a), *scalars)
    if nin == 2:
        return lambda a, b, *scalars: capply(unwrap(a), unwrap(b), *scalars)
    return lambda *args: capply(*(unwrap(a) if isinstance(a, torch.Tensor) else a for a in args))


def _define(qualname, schema, kernel, fake, mutates=()):
    op = torch.library.custom_op(f"ewkern::{qualname}", kernel, mutates_args=mutates,
                                 device_types=("cpu", "cuda"), schema=schema)
    op.register_fake(fake)
    return op


def _register_elementwise(name, info):
    nin = info["inputs"]
    args = [f"Tensor {n}" for n in ("a", "b")[:nin]] + [f"float {n}" for n in _SCALARS[info["scalars"]]]
    kernel, kernel_out = _kernels(getattr(_C, name), nin)
    fake, fake_out = _fakes(name, nin)
    op = _define(name, f"({', '.join(args)}) -> Tensor", kernel, fake)
    saves = GRADS[name][0]
    grads = _backward_of(name)
    backward, setup_context = _autograd(nin, saves, grads)
    op.register_autograd(backward, setup_context=setup_context)
    _FUNCTION[name] = _function(name, nin, saves, FAST[name], GRADS[name][1])
    _PY_APPLY[name] = _direct_apply(_FUNCTION[name], nin)
    _define(f"{name}_out", f"({', '.join(args + ['Tensor(a!) out'])}) -> ()", kernel_out, fake_out, ("out",))
    _FUNCTIONAL[name] = getattr(E, name).default
    _MUTATING[name] = getattr(E, f"{name}_out").default


def _grad_fake(name, nin, nout):
    names = _BACKWARD[name]["args"]

    def fake(*args):
        _check(name, args[:nin], names)
        g = args[0]
        one = torch.empty(g.shape, dtype=g.dtype, device=g.device)
        return one if nout == 1 else (one, torch.empty_like(one))
    return fake


def _register_backward(name, info):
    """torch.ops.ewkern.<op>_backward: the backward kernel as a custom op (not differentiable),
    for the backward graphs torch.compile traces. Two-gradient ops return both."""
    nin, nout = info["inputs"], info["outputs"]
    args = [f"Tensor {n}" for n in info["args"]] + [f"float {n}" for n in _SCALARS[info["scalars"]]]
    ret = "Tensor" if nout == 1 else "(Tensor, Tensor)"
    fn = getattr(_C, name)

    def kernel(*a):
        r = fn(*(t.contiguous() for t in a[:nin]), *a[nin:])
        return _as_tensor(r) if nout == 1 else tuple(_as_tensor(x) for x in r)
    _define(name, f"({', '.join(args)}) -> {ret}", kernel, _grad_fake(name, nin, nout))


def _rmse_backward_kernel(grad, a, b, r, axis=None):
    ga, gb = _C.rmse_backward(grad.contiguous(), a.contiguous(), b.contiguous(), r.contiguous(), axis)
    return _as_tensor(ga), _as_tensor(gb)


def _rmse_backward_fake(grad, a, b, r, axis=None):
    _check("rmse_backward", (a, b), ("a", "b"))
    shape, dtype = _rmse_result(a, b, axis)
    if tuple(grad.shape) != tuple(shape) or grad.dtype != dtype:
        raise ValueError(f"rmse_backward(): grad must be {dtype} of shape {tuple(shape)}, got {grad.dtype} of "
                         f"shape {tuple(grad.shape)}")
    return torch.empty_like(a), torch.empty_like(b)


def _rmse_kernel(a, b, axis=None):
    return _as_tensor(_C.rmse(a.contiguous(), b.contiguous(), axis))


def _rmse_fake(a, b, axis=None):
    shape, dtype = _rmse_result(a, b, axis)
    return torch.empty(shape, dtype=dtype, device=a.device)


def _rmse_out_kernel(a, b, axis, out):
    _write(_C.rmse, out, a.contiguous(), b.contiguous(), axis)


def _rmse_out_fake(a, b, axis, out):
    shape, dtype = _rmse_result(a, b, axis)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != a.device:
        raise ValueError(f"rmse(): out must be {dtype} of shape {tuple(shape)} on {a.device}, got {out.dtype} "
                         f"of shape {tuple(out.shape)} on {out.device}")


def _register():
    for name, info in _INFO.items():
        if info["inputs"]:
            _register_elementwise(name, info)
    _define("fill", "(Tensor(a!) out, float value) -> ()", lambda out, value: _write(_C.fill, out, value=value),
            lambda out, value: _check("fill", (out,), ("out",)), ("out",))
    _MUTATING["fill"] = E.fill.default
    rmse_op = _define("rmse", "(Tensor a, Tensor b, int[]? axis=None) -> Tensor", _rmse_kernel, _rmse_fake)
    rmse_op.register_autograd(_rmse_backward, setup_context=_rmse_setup)
    _define("rmse_out", "(Tensor a, Tensor b, int[]? axis, Tensor(a!) out) -> ()", _rmse_out_kernel,
            _rmse_out_fake, ("out",))
    _FUNCTIONAL["rmse"] = E.rmse.default
    _MUTATING["rmse"] = E.rmse_out.default
    _FUNCTION["rmse"] = _RmseFunction
    _PY_APPLY["rmse"] = _direct_apply(_RmseFunction, 2)
    for name, info in _BACKWARD.items():
        _register_backward(name, info)
    _define("rmse_backward", "(Tensor grad, Tensor a, Tensor b, Tensor r, int[]? axis=None) -> (Tensor, Tensor)",
            _rmse_backward_kernel, _rmse_backward_fake)


_register()


# --- functorch transforms (torch.func.grad, vjp, jacrev, jvp, jacfwd, vmap) --------------------------
# torch's custom ops run their registered autograd through an autograd.Function without
# setup_context, which functorch refuses ("must override the setup_context staticmethod"). Under a
# functorch transform the faces call _FUNCTORCH[name] instead: an autograd.Function around the same
# custom op with setup_context, a backward (GRADS' composed formula, itself made of the faces, so
# transforms nest: a Hessian, vmap of grad) and a jvp (forward mode) from the same formula; vmap
# runs the custom op's batching rule (_vmap_rule): elementwise ops on the batch as one more axis,
# rmse with its reduced axes moved past it.
_FUNCTORCH = {}     # name -> the autograd.Function a call under a functorch transform applies


def _functorch_function(name, forward, setup_context, backward, jvp):
    return type(f"{name}_functorch", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
                 "backward": staticmethod(backward), "jvp": staticmethod(jvp), "generate_vmap_rule": True})


def _elementwise_functorch(name, nin):
    op, saves, composed = _FUNCTIONAL[name], GRADS[name][0], GRADS[name][1]
    backward, setup_backward = _autograd(nin, saves, _backward_of(name))

    def setup_context(ctx, inputs, output):
        setup_backward(ctx, inputs, output)
        pick = {"a": inputs[0], "b": inputs[1] if nin > 1 else None, "y": output}
        ctx.save_for_forward(*(pick[k] for k in saves))
        ctx.dtype = output.dtype

    def jvp(ctx, *tangents):
        # an elementwise op's derivative is diagonal: the tangent of the result is the sum over the
        # inputs of (input's tangent) x (its partial derivative), which is the input's gradient
        # formula with the tangent in the incoming gradient's place (a tangent of another dtype
        # than its primal's, which torch's forward AD allows, in the primal's, as torch's ops promote)
        saved, out = ctx.saved_tensors, None
        for k in range(nin):
            if tangents[k] is None:
                continue
            t = tangents[k] if tangents[k].dtype == ctx.dtype else tangents[k].to(ctx.dtype)
            d = composed(t, saved, ctx.scalars, tuple(j == k for j in range(nin)))[k]
            out = d if out is None else add(out, d)
        return out
    return _functorch_function(name, op, setup_context, backward, jvp)


def _rmse_functorch_setup(ctx, inputs, output):
    _rmse_setup(ctx, inputs, output)
    ctx.save_for_forward(*inputs[:2], output)


def _rmse_jvp(ctx, ta, tb, _):
    """d sqrt(mean((a-b)^2)) = sum((a - b)(da - db)) / (n r) over each batch."""
    a, b, r = ctx.saved_tensors
    _, _, red = rmse_split(a.shape, ctx.axis)
    n = math.prod(a.shape[i] for i in red)
    d = ta if tb is None else (-tb if ta is None else ta - tb)
    s = (_wide(a - b) * _wide(d)).sum(dim=red) if red else _wide(a - b) * _wide(d)
    return (s / (r * n)).to(r.dtype)


def _vmap_rule(name, nin):
    """torch.library's batching rule of an elementwise custom op: the batch as the leading axis of
    both inputs (an unbatched input expanded, which the kernel reads as a contiguous copy)."""
    op = _FUNCTIONAL[name]

    def rule(info, in_dims, *args):
        dims = in_dims[:nin]
        if nin == 1 or dims[0] == dims[1]:
            return op(*args), dims[0]
        ts = [t.movedim(d, 0) if d is not None else t.expand(info.batch_size, *t.shape)
              for t, d in zip(args[:nin], dims)]
        return op(*ts, *args[nin:]), 0
    return rule


def _rmse_vmap(info, in_dims, a, b, axis=None):
    """rmse per sample: the batch axis leads, the sample's reduced axes one further on."""
    a, b = (t.movedim(d, 0) if d is not None else t.expand(info.batch_size, *t.shape)
            for t, d in zip((a, b), in_dims[:2]))
    _, _, red = rmse_split(a.shape[1:], axis)
    return _FUNCTIONAL["rmse"](a, b, [ax + 1 for ax in red]), 0


# torch.library.register_vmap (torch 2.4+ as custom_op, but guarded): without it vmap takes torch's
# per-sample fallback loop
_register_vmap = getattr(torch.library, "register_vmap", lambda op, rule: None)


def _register_functorch():
    for name, info in _INFO.items():
        if info["inputs"]:
            _register_vmap(f"ewkern::{name}", _vmap_rule(name, info["inputs"]))
            if name in GRADS:
                _FUNCTORCH[name] = _elementwise_functorch(name, info["inputs"])
    _register_vmap("ewkern::rmse", _rmse_vmap)
    _FUNCTORCH["rmse"] = _functorch_function("rmse", _FUNCTIONAL["rmse"], _rmse_functorch_setup,
                                             _rmse_backward, _rmse_jvp)


_register_functorch()


# --- the C++ autograd nodes -------------------------------------------------------------------------
# ewkern/_torch_native/autograd.cpp: the elementwise ops' and rmse's forward and backward as C++ nodes
# that launch the same kernels through ewkern._C._native_api (no Python in the backward, no GIL). The
# Python Functions above cost a step about 4 us (forward) and 8-12 us (backward) more host time than
# torch's own nodes on the GPU machines. Built for this torch on the first eager call that needs a
# gradient (disk-cached: one build per torch, Python and ewkern version), so `import ewkern.torch`
# and gradient-free calls never wait for it. rmse's node launches rmse and rmse_backward the same way.

_native = None          # the module once tried; False where the Python path stays
_native_error = ""      # why it is False
_native_lock = threading.RLock()


def _composed_grads(name, grad, saved, scalars, need):
    """For the C++ nodes' backward when its graph is wanted (create_graph=True): GRADS' composed
    formula, as the Python Functions' backward calls it; or when the kernels cannot read the
    incoming gradient (_readable): the backward kernels as custom ops."""
    if not torch.is_grad_enabled():
        return tuple(FAST[name](_Ops, grad, tuple(saved), tuple(scalars), tuple(need)))
    return tuple(GRADS[name][1](grad, tuple(saved), tuple(scalars), tuple(need)))


def _node_rmse(grad, saved, axis, need):
    """The C++ rmse node's backward in Python: _composed_rmse where its graph is wanted, else (a
    gradient the kernels cannot read) rmse_backward as the custom op."""
    if torch.is_grad_enabled():
        return _composed_rmse(grad, saved, axis, need)
    a, b, r = saved
    return _Ops.b("rmse_backward", grad, a, b, r, list(axis), need=need)


def _install_native():
    """Point _APPLY at the C++ nodes (built or loaded now), or at the Python Functions where they
    cannot be had (EWKERN_TORCH_NATIVE=0; a failed build warns once, or raises under =1)."""
    global _native, _native_error
    with _native_lock:
        if _native is not None:
            return
        mode = os.environ.get("EWKERN_TORCH_NATIVE", "")
        mod = False
        if mode == "0":
            _native_error = "EWKERN_TORCH_NATIVE=0"
        else:
            try:
                from ._torch_native import load
                mod = load(torch)
                mod.init(_C._native_api, _composed_grads, _node_rmse)
            except Exception as e:
                if mode == "1":
                    raise
                mod, _native_error = False, f"{type(e).__name__}: {e}"
                warnings.warn("ewkern.torch: the C++ autograd nodes are not available, so each eager op that "
                              "needs a gradient runs through a Python torch.autograd.Function (more host time a "
                              f"step; EWKERN_TORCH_NATIVE=0 silences this). {_native_error}", RuntimeWarning,
                              stacklevel=3)
        _APPLY.update(_PY_APPLY)
        if mod:
            for name in mod.names():
                _APPLY[name] = mod.make(name, _PY_APPLY[name])
            # every eager call of the Python faces through the C++ function: its checks (plain
            # tensors, no dispatch mode or functorch transform) and the forward alone where no
            # gradient is wanted, in C (CI host: et.mul on tiny tensors 2.40 -> 0.87 us without a
            # gradient, 3.39 -> 2.72 with one; torch.mul 1.30 and 2.30)
            for name in set(mod.names()) & set(_PY_EAGER):
                _EAGER[name] = mod.make(name, _PY_EAGER[name], True)
        _native = mod


def _first_call(name):
    def apply(*args):
        _install_native()
        return _APPLY[name](*args)
    return apply


def autograd_path() -> str:
    """Which autograd nodes ewkern.torch's eager elementwise ops and rmse record: "c++" (the C++ nodes of
    ewkern/_torch_native, built for this torch on first use) or "python: <why>" (a
    torch.autograd.Function a call). Builds or loads the C++ module if that was not done yet."""
    _install_native()
    return "c++" if _native else "python: " + _native_error


_APPLY.update(_PY_APPLY)
if os.environ.get("EWKERN_TORCH_NATIVE", "") != "0":
    _APPLY.update({name: _first_call(name) for name in _FUNCTION})


# --- the Python face: ewkern's signatures ------------------------------------------------------------

def _eager(tensors):
    """Plain tensors on cpu/cuda outside torch.compile, FakeTensorMode and every other dispatch
    mode, functorch transforms and forward-mode AD: the C function (and an autograd.Function
    around it) is the op. Otherwise the custom op, so modes, subclasses and compilers see
    torch.ops.ewkern.<op> (under a transform or in a dual_level: _FUNCTORCH's Function around it).
    A tensor with the negative bit (torch._neg_view, the imaginary part of a real tensor's conj())
    goes to the custom op too: torch's DLPack export hands over its memory without the bit, and
    the dispatcher resolves it before a custom op runs; so does a tensor of torch's legacy vmap (a
    backward with create_graph under autograd.grad's is_grads_batched), which has no memory."""
    if (torch.compiler.is_compiling() or _dispatch_depth() or _functorch_active()
            or _forward_ad._current_level >= 0):
        return False
    for t in tensors:
        if (type(t) is not torch.Tensor or not (t.is_cuda or t.is_cpu) or t.is_neg() or t.layout is not _strided
                or _legacy_batched(t)):
            return False
    return True


def _tensors(name, tensors):
    """The custom op's schema takes tensors: anything else is a TypeError naming the op (the
    dispatcher's own is a RuntimeError)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ewkern.torch.{name}(): expected torch tensors, got {type(t).__name__}"
                            + (" (add_const and mul_const take a number)" if isinstance(t, (int, float)) else ""))


def _scalars(name, scalars):
    """A tensor given for a scalar argument (c, alpha, beta) is refused: eager calls would read its
    value and drop its gradient, and the custom op's schema (float) refuses it under torch.compile."""
    for c in scalars:
        if isinstance(c, torch.Tensor):
            raise TypeError(f"ewkern.torch.{name}(): a scalar argument must be a Python number, got a Tensor (its "
                            "gradient would be lost; use the tensor ops, e.g. ewkern.torch.mul, for a tensor factor)")


def _dual_among(tensors):
    """Whether, inside a forward_ad.dual_level (torch.func.jvp's too), a tensor carries a tangent."""
    return _forward_ad._current_level >= 0 and any(isinstance(t, torch.Tensor) and
                                                   _forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def _refuse_forward_ad_out(name, tensors):
    """out= has no forward-mode derivative, as torch's own out= functions: inside a dual level (and
    torch.func.jvp) a dual tensor among the inputs or out is refused, where the result would have
    been written without its tangent."""
    if _dual_among(tensors):
        raise NotImplementedError(f"ewkern.torch.{name}(): out= does not support forward-mode AD (dual tensors, "
                                  "torch.func.jvp), as torch's own out= functions; call it without out=")


def _run(name, tensors, scalars, out):
    if scalars:
        _scalars(name, scalars)
    if out is None:
        if not _eager(tensors):
            _tensors(name, tensors)
            if (name in _FUNCTORCH and (_functorch_active() or _forward_ad._current_level >= 0)
                    and not torch.compiler.is_compiling()):
                return _FUNCTORCH[name].apply(*tensors, *scalars)
            return _FUNCTIONAL[name](*tensors, *scalars)
        if torch.is_grad_enabled():
            for t in tensors:
                if t.requires_grad:
                    return _APPLY[name](*tensors, *scalars)
        return _as_tensor(getattr(_C, name)(*(t.contiguous() for t in tensors), *scalars))
    _tensors(name, (*tensors, out))
    if torch.is_grad_enabled():
        for t in (*tensors, out):
            if t.requires_grad:
                raise RuntimeError(_OUT_GRAD.format(name))
    _refuse_forward_ad_out(name, (*tensors, out))
    _mutate(_MUTATING[name], out, *tensors, *scalars)
    return out


def _mutate(op, out, *args):
    """op(*args, out): a mutating custom op. torch's fallback for the negative bit cannot run an op
    that returns nothing (RuntimeError "Expected Tensor but got None"), so an out with the bit
    (torch._neg_view) gets a plain temporary, copied in (copy_ writes through the bit). Not
    asked under torch.compile, whose tracer does not take is_neg()."""
    if _is_compiling() or not out.is_neg():
        op(*args, out)
        return
    tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
    op(*args, tmp)
    out.copy_(tmp)


def _doc(name, sig):
    info = _INFO[name]
    grad = "differentiable (GRADS in ewkern/torch.py has the formula)" if name in GRADS else "not differentiable"
    return (f"{name}({sig})\n\nElementwise {name}: {info['definition']}; ewkern's auto kernel as the torch "
            f"custom op torch.ops.ewkern.{name} ({grad}; out= calls torch.ops.ewkern.{name}_out, which is "
            f"not).\n\nAccuracy: {info['accuracy']}.\nInputs: torch tensors of equal shape, dtype (float32, "
            f"float16, bfloat16, float64) and device (cpu or cuda); no broadcasting.")


def _named(fn, name, sig):
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__doc__ = _doc(name, sig)
    return fn


_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
_strided = torch.strided


# The Python faces: outside torch.compile (whose tracer must see _run's custom op) with out=None,
# _EAGER[name]: the C++ function once the native module is installed (its checks in C), before
# that and without it the same checks in Python (_PY_EAGER): the common eager case without _run's
# generality, a plain cpu/cuda tensor and no mode.
def _unary(name):
    fn = getattr(_C, name)

    def eager(a):
        if (type(a) is _Tensor and not _dispatch_depth() and not _functorch_active()
                and _forward_ad._current_level < 0 and (a.is_cuda or a.is_cpu) and not a.is_neg()
                and a.layout is _strided and not _legacy_batched(a)):
            if a.requires_grad and torch.is_grad_enabled():
                return _APPLY[name](a)
            return _as_tensor(fn(a.contiguous()))
        return _run(name, (a,), (), None)
    _PY_EAGER[name] = _EAGER[name] = eager

    def op(a, out=None):
        if out is None and not _is_compiling():
            return _EAGER[name](a)
        return _run(name, (a,), (), out)
    return _named(op, name, "a, out=None")


def _binary(name):
    fn = getattr(_C, name)

    def eager(a, b):
        if (type(a) is _Tensor and type(b) is _Tensor and not _dispatch_depth() and not _functorch_active()
                and _forward_ad._current_level < 0
                and (a.is_cuda or a.is_cpu) and (b.is_cuda or b.is_cpu) and not (a.is_neg() or b.is_neg())
                and a.layout is _strided and b.layout is _strided and not (_legacy_batched(a) or _legacy_batched(b))):
            if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
                return _APPLY[name](a, b)
            return _as_tensor(fn(a.contiguous(), b.contiguous()))
        return _run(name, (a, b), (), None)
    _PY_EAGER[name] = _EAGER[name] = eager

    def op(a, b, out=None):
        if out is None and not _is_compiling():
            return _EAGER[name](a, b)
        return _run(name, (a, b), (), out)
    return _named(op, name, "a, b, out=None")


def _with_const(name):
    fn = getattr(_C, name)

    def eager(a, c):
        if (type(a) is _Tensor and not _dispatch_depth() and not _functorch_active()
                and _forward_ad._current_level < 0 and (a.is_cuda or a.is_cpu) and not a.is_neg()
                and a.layout is _strided and not _legacy_batched(a)
                and not isinstance(c, _Tensor)):
            if a.requires_grad and torch.is_grad_enabled():
                return _APPLY[name](a, c)
            return _as_tensor(fn(a.contiguous(), c))
        return _run(name, (a,), (c,), None)
    _PY_EAGER[name] = _EAGER[name] = eager

    def op(a, c, out=None):
        if out is None and not _is_compiling():
            return _EAGER[name](a, c)
        return _run(name, (a,), (c,), out)
    return _named(op, name, "a, c, out=None")


def axpby(a, b, alpha, beta, out=None):
    return _run("axpby", (a, b), (alpha, beta), out)


def fill(out, value):
    """fill(out, value)\n\nWrite value, rounded once to out's dtype, into every element of out (the
    mutating custom op torch.ops.ewkern.fill; not differentiable)."""
    if torch.is_grad_enabled() and out.requires_grad:
        raise RuntimeError(_OUT_GRAD.format("fill"))
    _scalars("fill", (value,))
    _refuse_forward_ad_out("fill", (out,))
    _mutate(lambda o: _MUTATING["fill"](o, value), out)
    return out


def _axes(axis):
    """axis= as the list the ops take: None, one integer (an int, a NumPy integer: any __index__),
    or a sequence of them."""
    if axis is None:
        return axis
    if isinstance(axis, int):
        return [axis]
    try:
        return [operator.index(axis)]
    except TypeError:
        pass
    try:
        return [operator.index(x) for x in axis]
    except TypeError:
        raise TypeError(f"axis: an integer or a sequence of integers, got {type(axis).__name__}") from None


def rmse(a, b, axis=None, out=None):
    """rmse(a, b, axis=None, out=None)

    Batched root-mean-square error sqrt(mean((a - b)**2)) over the reduced axes: ewkern.rmse's
    auto kernel as the torch custom op torch.ops.ewkern.rmse, differentiable in a and b (out=
    calls torch.ops.ewkern.rmse_out, which is not). axis: an int or a sequence of ints, one
    contiguous run of axes; None reduces every axis but the first (a 1-D input is one batch).
    The result has the other axes and dtype float32 (float64 for float64 inputs)."""
    axis = _axes(axis)
    if out is None and not _is_compiling():
        return _EAGER["rmse"](a, b, axis)
    return _run("rmse", (a, b), (axis,), out)


def _rmse_eager(a, b, axis):
    return _run("rmse", (a, b), (axis,), None)


_PY_EAGER["rmse"] = _EAGER["rmse"] = _rmse_eager


_named(axpby, "axpby", "a, b, alpha, beta, out=None")
copy = _unary("copy")
add, sub, mul, div, maximum, minimum = (_binary(n) for n in ("add", "sub", "mul", "div", "maximum", "minimum"))
add_const, mul_const = _with_const("add_const"), _with_const("mul_const")
neg, abs, exp, log, sqrt, rsqrt, erf, tanh, sigmoid, relu, gelu, silu = (
    _unary(n) for n in ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu",
                        "silu"))


# --- user kernels as custom ops ---------------------------------------------------------------------

_TORCH_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                      torch.float64: "float64"}


# where a derived RowKernel backward sums a weight's gradient in the kernel. On the CPU the
# gradient per element costs little memory time and the column sum's warm call more host time
# (CI host, rmsnorm forward + backward of [4, 64]: 119 us against 81)
_COLSUM_DEVICES = ("cuda",)


def _row_shaped(g, t) -> bool:
    """Whether input t broadcasts against the gradient g as one row repeated over g's rows (a
    weight: shape [cols] or [1, ..., cols])."""
    return g.dim() >= 2 and t.dim() >= 1 and t.shape[-1] == g.shape[-1] and t.numel() == g.shape[-1]


def _one_row(g, t) -> bool:
    """_row_shaped, on a device where the backward sums such an input's gradient itself."""
    return g.device.type in _COLSUM_DEVICES and _row_shaped(g, t)


def _row_backward(kernel, ins, outs, scalars):
    """The backward of a RowKernel with a sum reduction (kernel_op's docstring): bk(g, *inputs) ->
    the gradients (one, or a tuple), one RowKernel. The gradient of an input that is one row
    repeated over the rows (_one_row: a weight) is summed over the rows in that kernel (its
    column-sum output: a few partial rows per launch instead of a gradient per element summed
    afterwards) and comes shaped like the input. ValueError where the backward cannot be derived."""
    from .rtc import RowKernel
    from .rtc._autodiff import GRAD_PREFIX, row_backward_source
    # every gradient's source now (ValueError where it cannot be derived); others when asked for
    sources = {None: row_backward_source(kernel.name, kernel.map_expr, kernel.reduce_expr, kernel.identity,
                                         kernel.operation, ins, outs, scalars)}
    diff = [(k, p) for k, p in enumerate(ins) if p.name not in scalars]
    variants: dict = {}

    def variant(g, a, need):
        rows = frozenset(p.name for k, p in diff if (need is None or p.name in need) and _row_shaped(g, a[k])) \
            if g.device.type in _COLSUM_DEVICES else frozenset()
        k = variants.get((rows, need))
        if k is None:
            if need not in sources:
                sources[need] = row_backward_source(kernel.name, kernel.map_expr, kernel.reduce_expr,
                                                    kernel.identity, kernel.operation, ins, outs, scalars, need)
            bw_in, bw_out, stage2, body, consts = sources[need]
            k = variants[rows, need] = RowKernel(bw_in, bw_out, kernel.map_expr, "a + b", body, "0",
                                                 f"{kernel.name}_backward", reduce_type=kernel.reduce_type,
                                                 preamble=kernel.preamble, options=kernel.options, _stage2=stage2,
                                                 _colsum=tuple(GRAD_PREFIX + n for n in sorted(rows)), _consts=consts)
        return k, rows

    def bk(g, *a, need=None):
        k, rows = variant(g, a, need)
        r = k(g, *a)
        return _needed(diff, need, r, lambda j, p, gt: gt.reshape(a[j].shape) if p.name in rows else gt)
    bk.kernel = lambda g, a, need: variant(g, a, need)[0]
    return bk


def _needed(diff, need, r, fix=lambda j, p, gt: gt):
    """A backward kernel's result r (a tensor or a tuple, the gradients of the inputs in need, or
    of every input in diff when need is None) as the backward returns it: one per input of diff
    (None where not in need), fix(position, param, gradient) applied; a single tensor when diff
    has one input."""
    it = iter(r if isinstance(r, tuple) else (r,))
    out = tuple(fix(j, p, next(it)) if need is None or p.name in need else None for j, p in diff)
    return out[0] if len(out) == 1 else out


def _elementwise_backward(kernel, ins, outs, scalars):
    """The derived backward of an ElementwiseKernel: bk(g, *inputs, need=None) -> the gradients,
    one ElementwiseKernel per set of wanted gradients (need: the input names, None for all).
    ValueError where the backward cannot be derived."""
    from .rtc import ElementwiseKernel
    from .rtc._autodiff import backward_source
    full = backward_source(kernel.name, kernel.operation, ins, outs, scalars)   # ValueError now
    diff = [(k, p) for k, p in enumerate(ins) if p.name not in scalars]
    variants: dict = {}

    def variant(g, a, need):
        k = variants.get(need)
        if k is None:
            bw_in, bw_out, bw_body = full if need is None else backward_source(kernel.name, kernel.operation, ins,
                                                                               outs, scalars, need)
            k = variants[need] = ElementwiseKernel(bw_in, bw_out, bw_body, f"{kernel.name}_backward",
                                                   preamble=kernel.preamble)
        return k

    def bk(g, *a, need=None):
        return _needed(diff, need, variant(g, a, need)(g, *a))
    bk.kernel = variant
    return bk


def _user_autograd(ins, scalars, run_backward, masked=False):
    """(setup_context, backward, gradients) of a user op: the tensor inputs saved, the scalars
    kept, and the gradients from run_backward(grad, *inputs) (one kernel that broadcasts the inputs
    against the gradient), each summed to its input's shape. masked: run_backward takes need= (the
    names of the inputs whose gradients autograd wants, when not all: a kernel that writes only
    those). gradients(grad, wanted, args) is the backward without a context (the C++ node's,
    _with_eager_path): the tensor inputs' gradients in order, None where wanted (a bool per
    tensor input) says no; args every argument of the call."""
    nin = len(ins)
    at = [k for k, p in enumerate(ins) if p.name not in scalars]      # the tensor inputs' positions
    sat = [k for k, p in enumerate(ins) if p.name in scalars]
    tnames = [ins[k].name for k in at]

    def gradients(grad, wanted, a):
        if masked and not all(wanted):
            gs = run_backward(grad, *a, need=frozenset(n for n, w in zip(tnames, wanted) if w))
        else:
            gs = run_backward(grad, *a)
        out = []
        for k, gt in zip(at, gs if isinstance(gs, tuple) else (gs,)):
            if gt is not None and gt.shape != a[k].shape:
                gt = gt.sum_to_size(a[k].shape)
            out.append(gt)
        return out

    def setup(ctx, inputs, output):
        ctx.scalar_values = [inputs[k] for k in sat]
        ctx.save_for_backward(*[inputs[k] for k in at])

    def backward(ctx, grad):
        saved = ctx.saved_tensors
        if sat:
            a: list = [None] * nin
            for k, t in zip(at, saved):
                a[k] = t
            for k, v in zip(sat, ctx.scalar_values):
                a[k] = v
        else:
            a = saved
        flags = ctx.needs_input_grad
        res: list = [None] * nin
        for k, gt in zip(at, gradients(grad, [flags[k] for k in at], a)):
            res[k] = gt
        return tuple(res)
    return setup, backward, gradients


def _refuse_double_backward(name):
    if torch.is_grad_enabled():
        raise RuntimeError(f"torch.ops.ewkern_user.{name}: double backward is not supported")


def _node_grads(name, gradients):
    """The C++ node's backward (make_user's grads) over _user_autograd's gradients(grad, wanted,
    args): the gradients as a tuple; double backward refused as on the Python paths."""
    def node_grads(g, wanted, *a):
        _refuse_double_backward(name)
        return tuple(gradients(g, wanted, a))
    return node_grads


def _plan_answer(kern, args, grad_of=(), extra=None):
    """What make_user's plan functions answer: the C plan by which kern ran for args (extra: a
    ReductionKernel's (axis, keepdims) as its call keys them) (rtc._kernel.native_plan: the
    argument struct, its slots, the results, the launches as data) as (template, pointer slots,
    scalar slots, outputs, launches, hidden outputs, grad_of), or None where there is none (the
    native module keeps the Python path for that signature)."""
    from .rtc._kernel import native_plan
    p = native_plan(kern, args, extra)
    if p is None:
        return None
    template, pslots, sslots, outs, prog, _, *hidden = p
    return template, pslots, sslots, outs, prog, hidden[0] if hidden else 0, grad_of


def _chained_plan(plans, nin, grad_of):
    """The C++ node's plan of a ReductionKernel op's backward, two kernels: the reduction again
    (its arguments the op's: a = the sum of map_expr, kept dims) as a stage run first, then the
    ElementwiseKernel that writes the wanted gradients from (g, a, the op's arguments, n_in,
    n_out). plans: the two kernels' C plans (rtc._kernel.native_plan) for the call just run, or
    None in either place (no plan). Both renumbered into the node's numbering (0 the gradient,
    1 + k the op's argument k, then the reduction's result, then the gradients); n_in and n_out,
    fixed by the signature the plan is kept for, stay as the first call wrote them into the second
    kernel's template.
    None where a kernel has no plan or one that does not chain (hidden outputs, more than one
    reduced result)."""
    red, bwd = plans
    if red is None or bwd is None or len(red) != 6 or len(bwd) != 6 or len(red[3]) != 1:
        return None

    def renumber(words, at, fix):
        """slots of three words (pointer slots: offset, argument, bytes added; scalar slots:
        offset, kind, argument) with word `at`, the argument, renumbered by fix: None refuses the
        plan, -1 drops the slot"""
        out = []
        for slot in struct.iter_unpack("<3q", words):
            k = fix(slot[at])
            if k is None:
                return None
            if k >= 0:
                out += [*slot[:at], k, *slot[at + 1:]]
        return struct.pack(f"<{len(out)}q", *out)
    red_at = 1 + nin   # the reduction's result
    # the reduction kernel's arguments are the op's (k < nin), then its result
    red_p = renumber(red[1], 1, lambda k: 1 + k)
    red_s = renumber(red[2], 2, lambda k: 1 + k if k < nin else None)
    # the backward kernel's: g, a, the op's arguments, n_in, n_out (scalars: left as the call wrote
    # them into the template), then its results
    nb = nin + 4
    bwd_p = renumber(bwd[1], 1, lambda k: 0 if k == 0 else red_at if k == 1 else 1 + (k - 2) if k < nin + 2
                     else red_at + 1 + (k - nb) if k >= nb else None)
    bwd_s = renumber(bwd[2], 2, lambda k: k - 1 if 2 <= k < nin + 2 else -1 if k in (nin + 2, nin + 3) else None)
    if None in (red_p, red_s, bwd_p, bwd_s):
        return None
    stage = (red[0], red_p, red_s, red[3], red[4])
    return (bwd[0], bwd_p, bwd_s, bwd[3], bwd[4], 0, grad_of, (stage,))


def _node_plan(ins, scalars, bk):
    """The C++ node's plan(grad, wanted, *args) (make_user's plan), asked right after its backward
    ran for a signature: _plan_answer of bk's kernel with, for each gradient it writes, the tensor
    input it belongs to. The node then repeats the kernel without Python: on autograd's device
    thread a Python backward costs 19-31 us of host time a call where the calling thread's costs
    7-9 (scripts/device_thread_probe.py, H200)."""
    tnames = [p.name for p in ins if p.name not in scalars]

    def plan(g, wanted, *a):
        need = None if all(wanted) else frozenset(n for n, w in zip(tnames, wanted) if w)
        return _plan_answer(bk.kernel(g, a, need), (g, *a), tuple(j for j, w in enumerate(wanted) if w))
    return plan


def _forward_plan(kernel):
    """The C++ function's fplan(*args) (make_user's), asked right after the op's forward ran the
    kernel for a signature: its _plan_answer; the next calls of that signature run the kernel from
    C++ without Python."""
    return lambda *a: _plan_answer(kernel, a)


def _user_function(name, kernel, bk, ins, scalars, why):
    """The user op as a torch.autograd.Function that calls the kernels directly: what eager code
    runs (the custom op's dispatch costs about 13 us of host time per call on the CI host, twice
    in a training step). kernel(*inputs) and bk(grad, *inputs) take any layout (kernel_op's impl
    and bimpl); bk None: no backward (why: the reason)."""
    setup, grads, _ = _user_autograd(ins, scalars, bk, masked=True) if bk is not None else (None, None, None)

    def forward(ctx, *a):
        r = kernel(*a)
        if setup is not None:
            setup(ctx, a, r)
        return r

    def backward(ctx, *g):
        if grads is None:
            raise RuntimeError(f"torch.ops.ewkern_user.{name} has no backward: {why}")
        _refuse_double_backward(name)
        return grads(ctx, g[0].resolve_neg())     # the kernels read memory: a gradient's negative bit resolved
    return type(f"{name}_function", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _with_eager_path(op, function, kernel, scalars, ins, node=None, grad_native=True):
    """op (a CustomOpDef) made to run plain CPU/CUDA tensors outside torch.compile and dispatch
    modes itself (as ewkern's own ops do, see _eager); the custom op itself everywhere else. node:
    (name, grads(g, wanted, *args), plan, fplan) (plan: _node_plan's, fplan: _forward_plan's):
    such calls then go through the native module's function (make_user), which runs the forward
    and records a C++ node where a tensor needs a gradient (no Python Function around the kernels),
    and from the second call of a signature runs the forward and the backward by their kernels'
    plans without Python; grad_native False (an op without a backward): only the calls that need
    no gradient (a C++ node would keep the inputs for a backward that can only raise). Without the
    module (or a node): function.apply where a gradient is wanted, else kernel(*args) itself (no
    autograd node, about 7 us less host time a call on the CI host). The object stays a
    CustomOpDef (opcheck, register_fake, torch.ops take it): its class becomes a subclass whose
    __call__ decides."""
    tensor_at = [k for k, p in enumerate(ins) if p.name not in scalars]
    py_apply = _direct_apply(function, None)
    chosen = []   # the native module's function or None, picked on the first eager call

    def pick():
        fn = None
        if node is not None and _native_ready():
            fn = _native.make_user(node[0], kernel, node[1], tuple(tensor_at), len(ins), py_apply, node[2], node[3])
        chosen.append(fn)
        return fn

    class UserOp(type(op)):
        def __call__(self, *args, **kwargs):
            if not kwargs and len(args) == len(ins):
                tensors = [args[k] for k in tensor_at]
                if _eager(tensors):
                    fn = chosen[0] if chosen else pick()
                    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
                    if fn is not None and (grad_native or not grad):
                        return fn(*args)
                    return py_apply(*args) if grad else kernel(*args)
                _refuse_transforms(self._name, tensors)
            return super().__call__(*args, **kwargs)
    op.__class__ = UserOp
    return op


def _reduced_axes(axis, ndim):
    """ReductionKernel's axis (None: every axis; an int or a sequence) as a sorted tuple of axes
    in range, or ValueError."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = set()
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"axis {ax} is out of bounds for the inputs' {ndim} dimensions")
        out.add(ax % ndim if ndim else ax)
    if len(out) != len(axes):
        raise ValueError(f"axis {tuple(axes)} names an axis twice")
    return tuple(sorted(out))


def _user_vmap(op, ins, scalars, reduction=False):
    """torch.func.vmap's batching rule of a user kernel's op: the kernels broadcast as CuPy's do, so
    the batch becomes one more leading axis (a batched input's batch axis moved first, then ones
    up to the other inputs' rank; an unbatched input broadcasts against it as it is) and one call
    runs every sample; a ReductionKernel's axes (None: every axis of a sample) move one further
    on. Raw inputs, indexed by the kernel rather than broadcast, take one call a sample."""
    nin = len(ins)
    tensor_at = [k for k, p in enumerate(ins) if p.name not in scalars]
    raw = any(ins[k].raw for k in tensor_at)

    def rule(info, in_dims, *args):
        a, rest = list(args[:nin]), tuple(args[nin:])
        batched = [k for k in tensor_at if in_dims[k] is not None]
        if not batched:
            out = op(*a, *rest)
            return out, (None,) * len(out) if isinstance(out, tuple) else None
        if raw:
            per = [op(*[a[k].select(in_dims[k], b) if k in batched else a[k] for k in range(nin)], *rest)
                   for b in range(info.batch_size)]
            if isinstance(per[0], tuple):
                return tuple(torch.stack(x) for x in zip(*per)), (0,) * len(per[0])
            return torch.stack(per), 0
        rank = max(a[k].dim() - (k in batched) for k in tensor_at)
        for k in batched:
            t = a[k].movedim(in_dims[k], 0)
            a[k] = t.reshape(t.shape[0], *([1] * (rank + 1 - t.dim())), *t.shape[1:])
        if reduction:
            axis, keepdims = (rest + (None, False)[len(rest):])[:2]
            rest = ([ax + 1 for ax in _reduced_axes(axis, rank)], keepdims)
        out = op(*a, *rest)
        return out, (0,) * len(out) if isinstance(out, tuple) else 0
    return rule


def _reduction_op(kernel, name, scalars, args, ret, result_meta):
    """kernel_op of a ReductionKernel: torch.ops.ewkern_user.<name>(inputs..., axis=None,
    keepdims=False), its fake kernel the reduced shape, and where the reduction is a sum from 0
    with one output (y = f(a), a = the sum of map_expr), the backward derived: the reduction run
    again for a (kept dims), then one ElementwiseKernel writes every input's gradient g f'(a) m'(x)
    in one pass, g and a broadcast against the inputs (reduction_backward_source)."""
    from .rtc import ElementwiseKernel, ReductionKernel
    from .rtc._autodiff import reduction_backward_source
    ins, outs = kernel.in_params, kernel.out_params
    tensor_at = [k for k, p in enumerate(ins) if p.name not in scalars]

    def shapes(a, axis, keepdims):
        """(the inputs' broadcast shape, its reduced axes, the result's shape)"""
        shape = torch.broadcast_shapes(*[a[k].shape for k in tensor_at])
        axes = _reduced_axes(axis, len(shape))
        kept = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdims else \
            tuple(d for i, d in enumerate(shape) if i not in axes)
        return shape, axes, kept

    nin = len(ins)

    def split(a, kw):
        """(inputs, axis, keepdims) of a call as torch passes it (it leaves out trailing defaults)."""
        rest = dict(zip(("axis", "keepdims"), a[nin:]), **kw)
        return a[:nin], rest.get("axis"), rest.get("keepdims", False)

    def impl(*a, **kw):
        a, axis, keepdims = split(a, kw)
        r = kernel(*(t.contiguous() if isinstance(t, torch.Tensor) else t for t in a), axis=axis,
                   keepdims=keepdims)
        return tuple(r) if isinstance(r, tuple) else r

    def fake(*a, **kw):
        a, axis, keepdims = split(a, kw)
        _, dts = result_meta(a)
        _, _, kept = shapes(a, axis, keepdims)
        dev = a[tensor_at[0]].device
        res = [torch.empty(kept, dtype=dt, device=dev) for dt in dts]
        return res[0] if len(res) == 1 else tuple(res)

    schema = f"({args}, int[]? axis=None, bool keepdims=False) -> {ret}"
    op = torch.library.custom_op(f"ewkern_user::{name}", impl, mutates_args=(), device_types=("cpu", "cuda"),
                                 schema=schema)
    op.register_fake(fake)
    _register_vmap(op, _user_vmap(op, ins, scalars, reduction=True))
    try:
        reduction_backward_source(kernel.name, kernel.map_expr, kernel.reduce_expr, kernel.identity,
                                  kernel.post_map_expr, ins, outs, scalars)
    except ValueError as e:
        why = str(e)

        def no_backward(ctx, *grads):
            raise RuntimeError(f"torch.ops.ewkern_user.{name} has no backward: {why}")
        op.register_autograd(no_backward, setup_context=lambda ctx, inputs, output: None)
        return _reduction_eager(op, impl, tensor_at, len(ins))
    diff = [p for p in ins if p.name not in scalars]
    kernels: dict = {}

    def bimpl(g, *a, need=None, **kw):
        """The gradients of the tensor inputs (need: the names of those wanted, None for all; the
        others None), each of the inputs' broadcast shape."""
        a, axis, keepdims = split(a, kw)
        return backward_kernels(g, a, axis, keepdims, need)

    def backward_kernels(g, a, axis, keepdims, need, stash=None):
        """bimpl's work; stash (a dict): where the C plans its two kernels ran by go (the C++ node's
        plan function reads them right after)."""
        shape, axes, _ = shapes(a, axis, keepdims)
        rt = "float64" if any(a[k].dtype == torch.float64 for k in tensor_at) else "float32"
        ks = kernels.get((rt, need))
        if ks is None:
            bw_in, bw_out, body = reduction_backward_source(kernel.name, kernel.map_expr, kernel.reduce_expr,
                                                            kernel.identity, kernel.post_map_expr, ins, outs,
                                                            scalars, need, rt)
            red = kernels.get((rt, None), (None,))[0] or ReductionKernel(
                ", ".join(f"{p.ctype} {p.name}" for p in ins), f"{rt} _ewk_a", kernel.map_expr, kernel.reduce_expr,
                "_ewk_a = a", kernel.identity, f"{kernel.name}_sum", reduce_type=kernel.reduce_type,
                preamble=kernel.preamble, options=kernel.options)
            ks = kernels[rt, need] = (red, ElementwiseKernel(bw_in, bw_out, body, f"{kernel.name}_backward",
                                                             preamble=kernel.preamble, options=kernel.options))
        a = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in a]
        red_a = ks[0](*a, axis=axes, keepdims=True)
        # post_map_expr's _in_ind.size() and _out_ind.size()
        n_in, n_out = math.prod(shape), math.prod(d for i, d in enumerate(shape) if i not in axes)
        bargs = (g.reshape(red_a.shape).contiguous(), red_a, *a, float(n_in), float(n_out))
        r = ks[1](*bargs)
        if stash is not None:
            from .rtc._kernel import native_plan
            stash["plans"] = (native_plan(ks[0], tuple(a), (axes, True)), native_plan(ks[1], bargs))
        return _needed([(k, ins[k]) for k in tensor_at], need, r)

    def bfake(g, *a, **kw):
        a = split(a, kw)[0]
        shape = torch.broadcast_shapes(*[a[k].shape for k in tensor_at])
        res = [torch.empty(shape, dtype=a[k].dtype, device=g.device) for k in tensor_at]
        return res[0] if len(res) == 1 else tuple(res)
    bret = "Tensor" if len(diff) == 1 else "(" + ", ".join(["Tensor"] * len(diff)) + ")"
    bop = torch.library.custom_op(f"ewkern_user::{name}_backward", bimpl, mutates_args=(),
                                  device_types=("cpu", "cuda"),
                                  schema=f"(Tensor _g, {args}, int[]? axis=None, bool keepdims=False) -> {bret}")
    bop.register_fake(bfake)

    def setup(ctx, inputs, output):
        ctx.args = [None if k in tensor_at else inputs[k] for k in range(nin)] + list(inputs[nin:])
        ctx.save_for_backward(*[inputs[k] for k in tensor_at])

    def backward(ctx, grad):
        _refuse_double_backward(name)
        a = list(ctx.args)
        for k, t in zip(tensor_at, ctx.saved_tensors):
            a[k] = t
        flags = ctx.needs_input_grad
        if _eager([grad] + [a[k] for k in tensor_at]):
            # plain tensors (not traced): the gradients autograd wants, none other written
            want = frozenset(ins[k].name for k in tensor_at if flags[k])
            gs = bimpl(grad, *a, need=None if len(want) == len(tensor_at) else want)
        else:
            gs = bop(grad, *a)
        gs = gs if isinstance(gs, tuple) else (gs,)
        res: list = [None] * (nin + 2)
        for k, gt in zip(tensor_at, gs):
            if flags[k] and gt is not None:
                res[k] = gt if gt.shape == a[k].shape else gt.sum_to_size(a[k].shape)
        return tuple(res)
    op.register_autograd(backward, setup_context=setup)
    base_call = type(op).__call__
    nodes: dict = {}    # (axis, keepdims) -> the eager grad path's callable

    def grad_call(args, axis, keepdims):
        """An eager call that needs a gradient: through a C++ node (the native module's make_user,
        one callable per axis= and keepdims=, since its arguments past the inputs are floats),
        or the custom op where the module is not available."""
        key = (None if axis is None else tuple(axis), keepdims)
        fn = nodes.get(key)
        if fn is None:
            def fallback(*a):
                return base_call(op, *a, axis, keepdims)
            fn = fallback
            if _native_ready():
                stash: dict = {}
                grads = _user_autograd(ins, scalars, lambda g, *a, need=None: backward_kernels(
                    g, a, axis, keepdims, need, stash), masked=True)[2]
                extra = (tuple(axis) if isinstance(axis, list) else axis, bool(keepdims))   # the kernel's plan key

                def plan(g, wanted, *a):
                    plans = stash.pop("plans", None)
                    return _chained_plan(plans, nin, tuple(j for j, w in enumerate(wanted) if w)) if plans else None
                fn = _native.make_user(name, lambda *a: impl(*a, axis, keepdims), _node_grads(name, grads),
                                       tuple(tensor_at), nin, fallback, plan,
                                       lambda *a: _plan_answer(kernel, a, extra=extra))
            if len(nodes) >= 64:
                nodes.clear()
            nodes[key] = fn
        return fn(*args)
    return _reduction_eager(op, impl, tensor_at, nin, grad_call)


def _refuse_transforms(name, tensors):
    """A user kernel's op has no forward-mode derivative and a backward that is not itself
    differentiable: inside a forward_ad.dual_level a dual tensor among its inputs is refused
    (torch's custom op would return the result without its tangent), and so is a tensor that a
    torch.func grad or jvp transform tracks (torch's custom op would raise that its
    autograd.Function lacks setup_context). vmap alone, and tensors a transform does not track,
    run."""
    if _dual_among(tensors):
        raise NotImplementedError(f"torch.ops.ewkern_user.{name}: forward-mode AD (dual tensors) is not supported "
                                  "for user kernels; reverse mode (backward, torch.autograd.grad) is")
    if not _functorch_active():
        return
    ft = torch._C._functorch
    for t in tensors:
        while isinstance(t, torch.Tensor) and ft.is_functorch_wrapped_tensor(t):
            if ft.is_gradtrackingtensor(t) and t.requires_grad:
                raise NotImplementedError(
                    f"torch.ops.ewkern_user.{name}: torch.func's grad, vjp, jacrev, jvp and jacfwd are not "
                    "supported for user kernels (their derived backward is not differentiable); vmap is, and so "
                    "is reverse mode outside torch.func (backward, torch.autograd.grad)")
            t = ft.get_unwrapped(t)


def _native_ready() -> bool:
    """Whether the C++ nodes are available (built or loaded now, once; a call's check after that
    takes no lock: the no-grad eager calls ask it every time)."""
    if _native is None:
        _install_native()
    return bool(_native)


def _reduction_eager(op, impl, tensor_at, nin, grad_call=None):
    """A reduction's op called like the kernel (inputs, then axis= and keepdims= by keyword or
    position): plain tensors go to grad_call(inputs, axis, keepdims) where given and the native
    module is available (with or without a gradient), else those that need no gradient run the
    kernel itself, without the dispatcher, and those that do grad_call; everything else the custom
    op (its autograd, modes, torch.compile)."""
    class ReductionOp(type(op)):
        def __call__(self, *args, axis=None, keepdims=False):
            if len(args) > nin + 2:
                raise TypeError(f"{self._name}() takes {nin} inputs, then axis and keepdims, got {len(args)} "
                                "arguments")
            if len(args) > nin:
                axis, keepdims = (*args[nin:], keepdims)[:2]
                args = args[:nin]
            axis = _axes(axis)
            if len(args) == nin:
                tensors = [args[k] for k in tensor_at]
                if _eager(tensors):
                    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
                    if grad_call is not None and (grad or _native_ready()):
                        # the native module's function, which without a gradient runs the forward
                        # by its plan too (no node), as a user ElementwiseKernel op's does
                        return grad_call(args, axis, bool(keepdims))
                    if not grad:
                        return impl(*args, axis, bool(keepdims))
                _refuse_transforms(self._name, tensors)
            return super().__call__(*args, axis, bool(keepdims))
    op.__class__ = ReductionOp
    return op


# torch.ops.ewkern_user.<name> -> (what kernel_op made it from, the op): torch.library replaces an op
# registered again under its name, so a second kernel of the same name would have run in place of
# the first wherever the name is looked up (torch.compile's graphs)
_USER_OPS: dict[str, tuple] = {}


def _user_op_key(kernel, scalars):
    code = tuple((k, str(getattr(kernel, k, None))) for k in (
        "operation", "preamble", "loop_prep", "after_loop", "map_expr", "reduce_expr", "post_map_expr", "identity",
        "reduce_type", "options", "reduce_dims", "_stage2", "_consts", "_colsum"))
    return (type(kernel).__name__, tuple(kernel.in_params), tuple(kernel.out_params), code, tuple(scalars))


def _user_op_name(kernel, scalars, name):
    """(the op's name, the kernel's key, the op already made for it under that name or None):
    kernel_op of the same kernel (code, parameters, scalars) again gives the op it made; another
    kernel of the same default name gets the name with a digest of its code appended; an explicit
    name= that another kernel's op holds is a ValueError."""
    import hashlib
    key = _user_op_key(kernel, scalars)
    base = name or kernel.name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", base):
        raise ValueError(f"kernel_op: the op's name {base!r} is not an identifier")
    for cand in (base, f"{base}_{hashlib.sha256(repr(key).encode()).hexdigest()[:10]}"):
        held = _USER_OPS.get(cand)
        if held is None:
            return cand, key, None
        if held[0] == key:
            return cand, key, held[1]
        if name is not None:
            raise ValueError(f"kernel_op: torch.ops.ewkern_user.{name} already runs another kernel (an op's name "
                             "names one kernel: torch.compile looks it up by name); give this one another name=")
    raise ValueError(f"kernel_op: no free name for kernel {kernel.name!r}")


def kernel_op(kernel, scalars=(), name=None):
    """kernel_op(kernel, scalars=(), name=None)

    A user's ``ewkern.ElementwiseKernel``, ``ewkern.RowKernel`` or ``ewkern.ReductionKernel`` as a
    torch custom op ``torch.ops.ewkern_user.<name>`` (default: the kernel's name; where another
    kernel's op holds that name, the name and a digest of the code, as ``<name>_1a2b3c4d5e``), for
    torch.compile (fullgraph) and autograd. kernel_op of the same kernel again returns the same op;
    an explicit ``name`` that another kernel's op holds is a ValueError. Every input is a
    Tensor except the ones named in ``scalars`` (floats); the outputs are allocated (one Tensor, or
    a tuple). The fake kernel gives the outputs' broadcast shape and dtype by the kernel's own
    type rules.

    Autograd: when the operation is ``out = <expression>`` of the inputs built from arithmetic and
    exp, log, sqrt, rsqrt, erf, erfc, tanh, fabs, sin, cos, pow, its derivative is taken
    symbolically and compiled as one more kernel, ``torch.ops.ewkern_user.<name>_backward``, that
    reads the incoming gradient and the inputs once and writes every tensor input's gradient in one
    pass (a gradient of a broadcast input is then summed to its shape). The derivative is the
    formula's, with no guards of its own against overflow. Other operations get no autograd formula:
    a backward through them raises. Double backward is not supported.

    torch.func.vmap runs the op through a batching rule (the batch as one more leading axis, which
    the kernels broadcast; a ReductionKernel's axes move past it; raw inputs one call a sample).
    torch.func's grad and jvp transforms over the op, and forward-mode dual tensors, raise
    NotImplementedError (the derived backward is not differentiable, and there is no jvp).

    A ReductionKernel becomes ``op(*inputs, axis=None, keepdims=False)`` (the kernel's call, its
    fake kernel the reduced shape); one whose reduction is a sum from 0 with one output ``y = f(a)``
    (``_in_ind.size()`` and ``_out_ind.size()`` allowed in it) gets the gradient g f'(a) m'(x):
    the reduction runs again for ``a`` (kept dims), then one ElementwiseKernel broadcasts g and a
    against the inputs and writes every input's gradient (a broadcast input's then summed to its
    shape). Other reductions get no autograd formula (a backward raises).

    A RowKernel whose reduction is a sum from 0 (``'a + b'``, ``'0'``), with one output ``y =
    <expression>`` and a ``map_expr`` of the same kind, gets its backward derived the same way:
    with a = sum of m(x) over the row and y = f(x, a), the gradient g_k f_x + m'(x_k) S with S = the
    row's sum of g f_a. It runs as one RowKernel: it reduces ``a`` again and then S over the row
    (held in registers on CUDA: the row and the gradient are read once) and writes every input's
    gradient in the same pass; the gradient of an input that is one row repeated over the rows (a
    weight) is summed over the rows in that kernel. Other RowKernels get no autograd formula (a
    backward raises).

    Returns the op (callable like the kernel without output arguments): the custom op object,
    which for plain CPU/CUDA tensors outside torch.compile and dispatch modes runs the kernels
    under an autograd node of its own instead of torch's dispatcher (the same results, less host
    time a step: in the overhead experiment on the CI host, a forward + backward of a tiny rmsnorm
    takes 150 us through torch.ops and 86 us through a torch.autograd.Function), a C++ node where
    ewkern.torch's native module is available (``autograd_path()``), and no node when no tensor
    needs a gradient (under torch.no_grad, or none requires it). Through the native module the
    first call of a signature (the tensors' dtypes, shapes, devices and alignment) runs the
    kernels from Python and keeps the plans they ran by; later calls run the forward and the
    derived backward from C++ by those plans, without Python (on the H200's host a training step
    of rmsnorm [64, 4096] took 101 us this way, 137 with the backward in Python, 123 in torch)."""
    from .rtc import ElementwiseKernel, ReductionKernel, RowKernel
    if not isinstance(kernel, (ElementwiseKernel, RowKernel, ReductionKernel)):
        raise TypeError("kernel_op takes an ewkern.ElementwiseKernel, RowKernel or ReductionKernel, got "
                        f"{type(kernel).__name__}")
    scalars = tuple(scalars)
    name, key, made = _user_op_name(kernel, scalars, name)
    if made is not None:
        return made
    op = _kernel_op(kernel, scalars, name)
    _USER_OPS[name] = (key, op)
    return op


def _kernel_op(kernel, scalars, name):
    from .rtc import ReductionKernel, RowKernel
    from .rtc._params import decide_types
    ins, outs = kernel.in_params, kernel.out_params
    unknown = set(scalars) - {p.name for p in ins}
    if unknown:
        raise ValueError(f"kernel_op({kernel.name}): scalars {sorted(unknown)} are not inputs of the kernel")
    if any(p.raw for p in outs) or not outs:
        raise ValueError(f"kernel_op({kernel.name}): needs at least one output and no raw output (its size would "
                         "be unknown to the fake kernel)")
    args = ", ".join(f"float {p.name}" if p.name in scalars else f"Tensor {p.name}" for p in ins)
    ret = "Tensor" if len(outs) == 1 else "(" + ", ".join(["Tensor"] * len(outs)) + ")"

    def result_meta(tensors):
        shapes = [t.shape for p, t in zip(ins, tensors) if p.name not in scalars and not p.raw]
        shape = torch.broadcast_shapes(*shapes) if shapes else ()
        in_dt = tuple(None if p.name in scalars else _TORCH_DTYPE_NAMES.get(t.dtype, str(t.dtype).split(".")[-1])
                      for p, t in zip(ins, tensors))
        _, out_types, _ = decide_types(kernel.name, ins, outs, in_dt, (None,) * len(outs))
        return shape, [getattr(torch, dt) for dt in out_types]

    if isinstance(kernel, ReductionKernel):
        return _reduction_op(kernel, name, scalars, args, ret, result_meta)

    def impl(*a):
        # a custom op takes any layout, as torch's own ops do; ewkern's CUDA kernels read C-contiguous
        # memory (no copy when a tensor already is)
        r = kernel(*(t.contiguous() if isinstance(t, torch.Tensor) else t for t in a))
        return tuple(r) if isinstance(r, tuple) else r

    def fake(*a):
        shape, dts = result_meta(a)
        dev = next(t.device for p, t in zip(ins, a) if p.name not in scalars)
        res = [torch.empty(shape, dtype=dt, device=dev) for dt in dts]
        return res[0] if len(res) == 1 else tuple(res)

    op = torch.library.custom_op(f"ewkern_user::{name}", impl, mutates_args=(), device_types=("cpu", "cuda"),
                                 schema=f"({args}) -> {ret}")
    op.register_fake(fake)
    _register_vmap(op, _user_vmap(op, ins, scalars))
    try:
        bk = (_row_backward if isinstance(kernel, RowKernel) else _elementwise_backward)(kernel, ins, outs, scalars)
    except ValueError as e:
        why = str(e)

        def no_backward(ctx, *grads):
            raise RuntimeError(f"torch.ops.ewkern_user.{name} has no backward: {why}")
        op.register_autograd(no_backward, setup_context=lambda ctx, inputs, output: None)
        # the calls that need no gradient through the native function (the forward by its plan);
        # it takes one result
        node = (name, no_backward, None, _forward_plan(kernel)) if len(outs) == 1 else None
        return _with_eager_path(op, _user_function(name, impl, None, ins, scalars, why), impl, scalars, ins, node,
                                grad_native=False)
    diff = [p for p in ins if p.name not in scalars]
    bret = "Tensor" if len(diff) == 1 else "(" + ", ".join(["Tensor"] * len(diff)) + ")"

    def bimpl(g, *a, need=None):
        r = bk(g.contiguous(), *(t.contiguous() if isinstance(t, torch.Tensor) else t for t in a), need=need)
        return tuple(r) if isinstance(r, tuple) else r

    def bfake(g, *a):
        # a RowKernel's backward sums a repeated row's gradient itself (_row_backward)
        res = [torch.empty(t.shape if isinstance(kernel, RowKernel) and _one_row(g, t) else g.shape, dtype=t.dtype,
                           device=g.device) for p, t in zip(ins, a) if p.name not in scalars]
        return res[0] if len(res) == 1 else tuple(res)

    bop = torch.library.custom_op(f"ewkern_user::{name}_backward", bimpl, mutates_args=(),
                                  device_types=("cpu", "cuda"), schema=f"(Tensor _g, {args}) -> {bret}")
    bop.register_fake(bfake)
    if len(outs) != 1:   # several outputs: no derived backward (backward_source already refused)
        return _with_eager_path(op, _user_function(name, impl, None, ins, scalars, "several outputs"), impl,
                                scalars, ins)
    setup, backward, _ = _user_autograd(ins, scalars, bop)
    op.register_autograd(backward, setup_context=setup)
    node_grads = _node_grads(name, _user_autograd(ins, scalars, bimpl, masked=True)[2])
    return _with_eager_path(op, _user_function(name, impl, bimpl, ins, scalars, ""), impl, scalars, ins,
                            (name, node_grads, _node_plan(ins, scalars, bk), _forward_plan(kernel)))
