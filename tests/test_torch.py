"""ewkern.torch, ewkern's ops as torch custom ops: results against the float64 references,
gradcheck in float64 and torch's own gradients, torch.library.opcheck for every op, the fake
kernels, torch.compile(fullgraph=True) against eager, CUDA-graph capture; and the plain API's
refusal of tensors that require grad. Skips without torch; the CUDA cases skip without a GPU."""
import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ewkern  # noqa: E402
import ewkern.torch as ewt  # noqa: E402
from conftest import HAS_CUDA, device_params, vmap_rules_only  # noqa: E402
from reference import DTYPES, EPS, random_input, rmse_reference  # noqa: E402
from test_elementwise import OPS, SCALARS, check, op_args  # noqa: E402

gpu_torch = pytest.mark.skipif(not (HAS_CUDA and torch.cuda.is_available()),
                               reason="needs a CUDA GPU that torch sees (runs on the GPU machine)")
ELEMENTWISE = sorted(op for op in OPS if op != "fill")
TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "float64": torch.float64}
TORCH_OP = {   # torch's own version of each op, for its gradients
    "copy": lambda a: a.clone(), "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "add_const": lambda a, c: a + c,
    "mul_const": lambda a, c: a * c, "axpby": lambda a, b, alpha, beta: alpha * a + beta * b,
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "erf": torch.erf, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
}


def to_torch(x, dtype, device="cpu", requires_grad=False):
    """A NumPy array (ml_dtypes.bfloat16 too) as a torch tensor of dtype, values unchanged."""
    t = torch.from_numpy(np.asarray(x).astype(np.float64)).to(device=device, dtype=TORCH_DTYPE[dtype])
    return t.requires_grad_(requires_grad)


def to_numpy(t):
    return t.detach().cpu().double().numpy()


def torch_device(device):
    return "cuda:0" if device != "cpu" else "cpu"


def inputs(op, dtype, device, shape=(3, 5, 7), seed=0, requires_grad=False):
    rng = np.random.default_rng(seed + len(op))
    xs, scalars = op_args(op, rng, shape, dtype)
    if op in ("abs", "relu", "maximum", "minimum"):   # stay away from the kinks
        xs = [np.where(np.abs(x.astype(np.float64)) < 0.05, 0.5, x).astype(x.dtype) for x in xs]
    return xs, [to_torch(x, dtype, torch_device(device), requires_grad) for x in xs], scalars


# --- results -------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ELEMENTWISE)
def test_op_and_out_against_reference(op, dtype, device):
    for shape in [(0,), (7,), (3, 5, 7)]:
        xs, ts, scalars = inputs(op, dtype, device, shape)
        r = getattr(ewt, op)(*ts, *scalars)
        assert isinstance(r, torch.Tensor) and r.dtype == ts[0].dtype and r.device == ts[0].device
        check(op, to_numpy(r), xs, scalars, dtype, f"ewkern.torch.{op} {dtype} {device} {shape}")
        out = torch.full(shape, 123.0, dtype=ts[0].dtype, device=ts[0].device)
        assert getattr(ewt, op)(*ts, *scalars, out=out) is out
        check(op, to_numpy(out), xs, scalars, dtype, f"ewkern.torch.{op} out= {dtype} {device} {shape}")


@pytest.mark.parametrize("device", device_params())
def test_fill_and_layouts(device):
    dev = torch_device(device)
    out = torch.zeros(4, 6, device=dev)
    assert ewt.fill(out, 2.5) is out and bool((out == 2.5).all())
    strided = torch.zeros(6, 4, device=dev).T          # any layout: a contiguous temporary is copied in
    ewt.fill(strided, -1.0)
    assert bool((strided == -1).all())
    a = torch.randn(8, 5, device=dev, dtype=torch.float64).T     # non-contiguous inputs are copied first
    b = torch.randn(5, 8, device=dev, dtype=torch.float64)
    torch.testing.assert_close(ewt.sub(a, b), a - b, rtol=0, atol=0)
    o = torch.empty(8, 5, device=dev, dtype=torch.float64).T
    assert ewt.mul(a, b, out=o) is o
    torch.testing.assert_close(o, a * b, rtol=0, atol=0)
    x = a.contiguous()
    ewt.add(x, b, out=x)                                           # out may be an input
    torch.testing.assert_close(x, a + b, rtol=0, atol=0)


RMSE_LAYOUTS = [((5, 100), None), ((3, 7, 33), None), ((6,), None), ((17, 41), -1), ((2, 3, 5, 7), (2, 3)),
                ((100, 5), 0), ((33, 7, 3), (0, 1))]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmse_against_reference(dtype, device):
    rng = np.random.default_rng(7)
    for shape, axis in RMSE_LAYOUTS:
        a, b = random_input(rng, shape, dtype), random_input(rng, shape, dtype)
        red = axis if axis is not None else (tuple(range(1, len(shape))) if len(shape) > 1 else (0,))
        want = rmse_reference(a, b, red)
        ta, tb = to_torch(a, dtype, torch_device(device)), to_torch(b, dtype, torch_device(device))
        r = ewt.rmse(ta, tb, axis=axis)
        assert r.dtype == (torch.float64 if dtype == "float64" else torch.float32)
        np.testing.assert_allclose(to_numpy(r), want, rtol=1e-12 if dtype == "float64" else 2e-6)
        out = torch.empty(want.shape, dtype=r.dtype, device=r.device)
        assert ewt.rmse(ta, tb, axis, out=out) is out
        torch.testing.assert_close(out, r, rtol=0, atol=0)


# --- gradients -----------------------------------------------------------------------------------

def test_every_op_but_fill_is_differentiable():
    assert set(ewt.DIFFERENTIABLE) == set(ELEMENTWISE) | {"rmse"}


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_gradcheck_float64(op):
    """torch.autograd.gradcheck and gradgradcheck (the backward formulas are ewkern ops too)."""
    _, ts, scalars = inputs(op, "float64", "cpu", (4, 5), requires_grad=True)
    fn = getattr(ewt, op)

    def f(*t):
        return fn(*t, *scalars)
    assert torch.autograd.gradcheck(f, tuple(ts))
    assert torch.autograd.gradgradcheck(f, tuple(ts))


@pytest.mark.parametrize("shape,axis", [((3, 8), None), ((8,), None), ((7, 3), 0), ((2, 3, 4), (1, 2)),
                                        ((2, 3, 4), 1)])
def test_rmse_gradcheck_float64(shape, axis):
    rng = np.random.default_rng(11)
    a, b = (torch.from_numpy(rng.standard_normal(shape)).requires_grad_() for _ in range(2))
    assert torch.autograd.gradcheck(lambda a, b: ewt.rmse(a, b, axis), (a, b))
    assert torch.autograd.gradgradcheck(lambda a, b: ewt.rmse(a, b, axis), (a, b))


# a gradient composed of several ewkern ops (16-bit inputs: in float32, rounded once) against torch's
# single kernel: a few units of the dtype's epsilon, relative to the gradient's largest element
# where a derivative crosses zero (gelu's Phi(x) + x phi(x) cancels near x = -0.75)
GRAD_RTOL = {"float64": 1e-12, "float32": 2e-6, "float16": 4 * EPS["float16"], "bfloat16": 4 * EPS["bfloat16"]}


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ELEMENTWISE + ["rmse"])
def test_gradients_match_torch(op, dtype, device):
    """ewkern.torch's gradients against torch's own for the same function, same dtype."""
    if op == "rmse":
        _, ts, scalars = inputs("sub", dtype, device, (6, 50), requires_grad=True)
        wide = torch.float64 if dtype == "float64" else torch.float32    # rmse's result dtype
        ours, theirs = ewt.rmse, lambda a, b: torch.sqrt(((a.to(wide) - b.to(wide)) ** 2).mean(1))
    else:
        _, ts, scalars = inputs(op, dtype, device, (6, 50), requires_grad=True)
        ours, theirs = getattr(ewt, op), TORCH_OP[op]
    y = ours(*ts, *scalars)
    g = torch.randn(y.shape, dtype=y.dtype, device=y.device)
    got = torch.autograd.grad(y, ts, g)
    want = torch.autograd.grad(theirs(*ts, *scalars), ts, g)
    rtol = GRAD_RTOL[dtype]
    for k, (x, w) in enumerate(zip(got, want)):
        assert x.dtype == w.dtype and x.shape == w.shape
        scale = w.double().abs().max().item()
        torch.testing.assert_close(x.double(), w.double(), rtol=rtol, atol=rtol * scale,
                                   msg=lambda m: f"{op} {dtype} {device} grad {k}: {m}")


def _python_functions(monkeypatch):
    """Eager calls through the Python Functions and the Python faces' checks, not the C++ module."""
    monkeypatch.setattr(ewt, "_APPLY", dict(ewt._PY_APPLY))
    monkeypatch.setattr(ewt, "_EAGER", dict(ewt._PY_EAGER))


@pytest.mark.parametrize("op,need,want", [
    ("gelu", (True,), ["gelu_backward"]), ("tanh", (True,), ["tanh_backward"]), ("exp", (True,), ["exp_backward"]),
    ("mul", (True, True), ["mul_backward"]), ("mul", (True, False), ["mul"]), ("div", (True, True), ["div_backward"]),
    ("div", (True, False), ["div"]), ("maximum", (False, True), ["maximum_backward"]),
    ("axpby", (True, True), ["axpby_backward"]), ("add", (True, True), []), ("rmse", (True, True), ["rmse_backward"]),
    ("neg", (True,), ["neg"]), ("mul_const", (True,), ["mul_const"]), ("add_const", (True,), []), ("copy", (True,), [])])
def test_eager_backward_is_one_kernel(monkeypatch, op, need, want):
    """An eager backward of ewkern.torch's Python Functions calls one C function of ewkern (the
    backward kernel, or the forward op that is the gradient), not a composition of ops and not the
    custom ops' dispatch (the C++ nodes' count: test_torch_native.py)."""
    _python_functions(monkeypatch)
    calls = []
    for name, fn in list(vars(ewkern._C).items()):
        if callable(fn) and not isinstance(fn, type) and not name.startswith("_"):
            monkeypatch.setattr(ewkern._C, name, lambda *a, _f=fn, _n=name, **k: (calls.append(_n), _f(*a, **k))[1])
    shape = (6, 50)
    xs = [torch.rand(shape, dtype=torch.float64) + 0.5 for _ in range(1 if len(need) == 1 else 2)]
    ts = [x.requires_grad_(k) for x, k in zip(xs, need)]
    sc = SCALARS.get(op, ())
    y = ewt.rmse(*ts) if op == "rmse" else getattr(ewt, op)(*ts, *sc)
    calls.clear()
    grads = torch.autograd.grad(y, [t for t in ts if t.requires_grad], torch.ones_like(y))
    assert calls == want, calls
    ref_fn = (lambda a, b: torch.sqrt(((a - b) ** 2).mean(1))) if op == "rmse" else TORCH_OP[op]
    ref = torch.autograd.grad(ref_fn(*ts, *sc), [t for t in ts if t.requires_grad], torch.ones_like(y))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", device_params())
def test_rmse_gradients_of_no_elements(monkeypatch, device):
    """rmse's backward on empty batches (none, or of no rows) through the Python Function, whose
    C call gets torch's empty tensors (no memory: NULL pointers): the CPU kernel refused those
    (EINVAL) until 2026-11-28."""
    _python_functions(monkeypatch)
    for shape in ((0, 7), (3, 0), (0,)):
        a = torch.rand(shape, device=torch_device(device), requires_grad=True)
        b = torch.rand(shape, device=torch_device(device), requires_grad=True)
        r = ewt.rmse(a, b)
        ga, gb = torch.autograd.grad(r, (a, b), torch.ones_like(r), allow_unused=True)
        assert ga.shape == gb.shape == shape
        (only_b,) = torch.autograd.grad(ewt.rmse(a.detach(), b), (b,), torch.ones_like(r))
        assert only_b.shape == shape


@pytest.mark.parametrize("op", ["gelu", "add", "mul_const", "axpby", "rmse"])
def test_eager_calls_the_functions_cpp_apply(monkeypatch, op):
    """An eager call that needs a gradient enters the op's autograd.Function through torch's C++
    apply, not Function.apply's Python wrapper (which adds about 1 us of host time a call), with
    the same node and gradients as through the wrapper (the Python path, where the C++ nodes are
    not used)."""
    _python_functions(monkeypatch)
    sc = SCALARS.get(op, ())
    xs = [torch.rand(6, 50, dtype=torch.float64) + 0.5 for _ in range(1 if op in ("gelu", "mul_const") else 2)]

    def step(call):
        ts = [x.clone().requires_grad_() for x in xs]
        y = call(ts)
        return y, torch.autograd.grad(y, ts, torch.ones_like(y))

    def refuse(*a, **k):
        raise AssertionError("Function.apply's wrapper was called")
    with monkeypatch.context() as m:       # what the wrapper calls before the C++ apply (torch 2.11)
        m.setattr(torch._functorch.utils, "unwrap_dead_wrappers", refuse)
        y, grads = step(lambda ts: ewt.rmse(*ts) if op == "rmse" else getattr(ewt, op)(*ts, *sc))
    assert type(y.grad_fn).__name__ == ("_RmseFunctionBackward" if op == "rmse" else f"{op}_functionBackward")
    y2, grads2 = step(lambda ts: ewt._FUNCTION[op].apply(*ts, *([None] if op == "rmse" else sc)))
    torch.testing.assert_close(y, y2, rtol=0, atol=0)
    for g, g2 in zip(grads, grads2):
        torch.testing.assert_close(g, g2, rtol=0, atol=0)


def test_functorch_leaked_wrapper_on_the_direct_path():
    """A tensor leaked out of torch.func.grad (a dead wrapper) is unwrapped on the direct path as
    Function.apply unwraps it."""
    x = torch.randn(3, 40, dtype=torch.float64)
    leaked = []

    def f(r):
        leaked.append(r * 1)                # a functorch wrapper, dead once grad returns
        return (r * r).sum()
    torch.func.grad(f)(x[0])
    for op in ("gelu", "add"):
        args = (leaked[0],) * (2 if op == "add" else 1)
        torch.testing.assert_close(ewt._APPLY[op](*args), ewt._FUNCTION[op].apply(*args), rtol=0, atol=0)


def _torch_rmse(a, b, axis=None):
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    _, _, red = ewt.rmse_split(a.shape, axis)
    return torch.sqrt(((a.to(wide) - b.to(wide)) ** 2).mean(dim=red))


def _functorch_case(op, dtype, device):
    """(ewkern's function, torch's, tensor inputs) of one op for the transforms' tests: scalars bound."""
    if op == "rmse":
        _, ts, _ = inputs("sub", dtype, device, (3, 4, 6))
        return ewt.rmse, _torch_rmse, ts
    _, ts, scalars = inputs(op, dtype, device, (3, 4, 6))
    fn, ref = getattr(ewt, op), TORCH_OP[op]
    return (lambda *t: fn(*t, *scalars)), (lambda *t: ref(*t, *scalars)), ts


def _assert_same(got, want, dtype, what):
    rtol = GRAD_RTOL[dtype]
    for k, (x, w) in enumerate(zip(got, want)):
        assert x.dtype == w.dtype and x.shape == w.shape, what
        torch.testing.assert_close(x.double(), w.double(), rtol=rtol, atol=rtol * max(w.double().abs().max().item(), 1),
                                   msg=lambda m: f"{what} {k}: {m}")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("op", ELEMENTWISE + ["rmse"])
def test_functorch_grad_jvp_vmap_match_torch(op, dtype, device):
    """torch.func.grad (reverse mode), jvp (forward mode) and vmap over every differentiable op,
    against the same transforms of torch's function. torch's custom ops cannot take grad or jvp
    (their autograd.Function has no setup_context): the faces apply ewkern.torch's own Function
    under a transform, and vmap runs the ops' batching rule (torch's fallback loop disabled)."""
    ours, theirs, ts = _functorch_case(op, dtype, device)
    nin = len(ts)
    argnums = tuple(range(nin))
    with vmap_rules_only():             # a missing batching rule raises instead of looping
        for transform in ("grad", "jvp", "vmap"):
            if transform == "grad":
                got, want = (torch.func.grad(lambda *t: f(*t).double().sum(), argnums=argnums)(*ts)
                             for f in (ours, theirs))
            elif transform == "jvp":
                tangents = tuple(torch.randn_like(t) for t in ts)
                got, want = ((torch.func.jvp(f, tuple(ts), tangents)[1],) for f in (ours, theirs))
            else:   # the first input batched over its second axis, the second (if any) not at all
                dims = (1, None)[:nin]
                ins = (ts[0], ts[1][:, 0]) if nin == 2 else ts
                got, want = ((torch.func.vmap(f, in_dims=dims)(*ins),) for f in (ours, theirs))
            _assert_same(got, want, dtype, f"{transform} of {op} {dtype} {device}")


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("op", ELEMENTWISE + ["rmse"])
def test_forward_mode_ad_outside_functorch(monkeypatch, op, device, path):
    """torch.autograd.forward_ad's dual tensors carry their tangents through every op, as through
    torch's (the eager paths, native and Python, give a dual_level's calls to the Function with a
    jvp; before, the native path dropped the tangent without a word), also where the input needs a
    gradient too."""
    import torch.autograd.forward_ad as fwad
    ewt.autograd_path()                 # the native module loaded where it can be
    if path == "python":
        _python_functions(monkeypatch)
    ours, theirs, ts = _functorch_case(op, "float64", device)
    tangents = [torch.randn_like(t) for t in ts]
    for requires_grad in (False, True):
        got = []
        for f in (ours, theirs):
            with fwad.dual_level():
                duals = [fwad.make_dual(t.detach().requires_grad_(requires_grad), u) for t, u in zip(ts, tangents)]
                tangent = fwad.unpack_dual(f(*duals)).tangent
                assert tangent is not None, f"{op}: the tangent was dropped"
                got.append(tangent.detach())
        _assert_same(got[:1], got[1:], "float64", f"forward AD of {op} {device} requires_grad={requires_grad}")


@pytest.mark.parametrize("op", ["gelu", "div", "maximum", "rsqrt", "rmse"])
def test_functorch_transforms_nest(op):
    """Transforms of transforms: the Hessian (forward over reverse), vmap of grad, jacrev of jacrev."""
    ours, theirs, ts = _functorch_case(op, "float64", "cpu")
    x, rest = ts[0][:2], [t[:2] for t in ts[1:]]
    per_row = [torch.func.vmap(torch.func.grad(lambda r, *o: f(r, *o).sum()))(x, *rest) for f in (ours, theirs)]
    if op == "rmse":
        ours, theirs = (lambda a, b: ewt.rmse(a, b, [1, 2])), (lambda a, b: _torch_rmse(a, b, [1, 2]))

    def total(f):
        return lambda t: f(t, *rest).sum()
    for transform in (torch.func.hessian, lambda f: torch.func.jacrev(torch.func.jacrev(f))):
        _assert_same([transform(total(ours))(x)], [transform(total(theirs))(x)], "float64", op)
    _assert_same(per_row[:1], per_row[1:], "float64", f"vmap of grad of {op}")


def test_vmap_rmse_moves_the_reduced_axes():
    """rmse under vmap: each sample's axis= names the sample's axes, the batch axis anywhere."""
    rng = np.random.default_rng(5)
    a, b = (torch.from_numpy(rng.standard_normal((5, 4, 6))) for _ in range(2))
    for axis in (None, 0, [0, 1], -1):
        got = torch.func.vmap(lambda p, q: ewt.rmse(p, q, axis), in_dims=(1, 1))(a, b)
        want = torch.stack([_torch_rmse(a[:, k], b[:, k], axis) for k in range(4)])
        torch.testing.assert_close(got, want, rtol=1e-13, atol=0)


def test_out_is_not_differentiable():
    x = torch.randn(5, requires_grad=True)
    out = torch.empty(5)
    with pytest.raises(RuntimeError, match=r"ewkern.torch.gelu\(\): out= is not differentiable"):
        ewt.gelu(x, out=out)
    with pytest.raises(RuntimeError, match="out= is not differentiable"):
        ewt.fill(torch.zeros(3, requires_grad=True), 1.0)
    with pytest.raises(RuntimeError, match="out= is not differentiable"):
        ewt.rmse(x.view(1, 5), x.view(1, 5), out=torch.empty(1))
    with torch.no_grad():
        ewt.gelu(x, out=out)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x.detach()))


# --- the plain API and requires_grad ----------------------------------------------------------------

@pytest.mark.parametrize("fn,args", [("add", 2), ("gelu", 1), ("rmse", 2)])
def test_plain_api_refuses_tensors_that_require_grad(fn, args):
    x = torch.randn(4, 6, requires_grad=True)
    y = torch.randn(4, 6)
    f = getattr(ewkern, fn)
    for ins in ([x, y], [y, x])[: 2 if args == 2 else 1]:
        with pytest.raises(RuntimeError, match=rf"requires grad.*Use ewkern\.torch\.{fn} "):
            f(*ins[:args])
    with torch.no_grad():
        r = f(*[x, y][:args])
    with torch.inference_mode():
        r2 = f(*[x, y][:args])
    r3 = f(*[x.detach(), y][:args])
    torch.testing.assert_close(r, r3, rtol=0, atol=0)
    torch.testing.assert_close(r2, r3, rtol=0, atol=0)
    assert not r.requires_grad


def test_plain_api_out_that_requires_grad():
    a, b = torch.randn(5), torch.randn(5)
    leaf = torch.zeros(5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"add\(\): out requires grad"):
        ewkern.add(a, b, out=leaf)
    with pytest.raises(RuntimeError, match=r"fill\(\): out requires grad"):
        ewkern.fill(leaf, 1.0)
    with pytest.raises(RuntimeError, match=r"rmse\(\): out requires grad"):
        ewkern.rmse(a.view(1, 5), b.view(1, 5), out=torch.zeros(1, requires_grad=True))
    # the gradient named is the one given: out[1] alone was called out[0]
    r = torch.ones(1)
    for o, name in ((0, r"out\[0\]"), (1, r"out\[1\]")):
        outs = [None, None]
        outs[o] = torch.zeros(1, 5, requires_grad=True)
        with pytest.raises(RuntimeError, match=rf"rmse_backward\(\): {name} requires grad"):
            ewkern.rmse_backward(r, a.view(1, 5), b.view(1, 5), r, out=tuple(outs))
    assert bool((leaf == 0).all())
    with torch.no_grad():
        assert ewkern.add(a, b, out=leaf) is leaf
    torch.testing.assert_close(leaf.detach(), a + b)
    out = torch.empty(5)
    assert ewkern.add(a, b, out=out) is out      # nothing requires grad: the fast path as before


def test_import_ewkern_alone_does_not_import_torch():
    code = ("import sys, ewkern; assert 'torch' not in sys.modules; m = ewkern.torch; "
            "assert 'torch' in sys.modules and m.gelu.__module__ == 'ewkern.torch'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# --- torch.library: opcheck and the fake kernels ---------------------------------------------------

def opcheck_cases(device):
    dev = torch_device(device)
    for op in ELEMENTWISE:
        _, ts, scalars = inputs(op, "float32", device, (3, 4), requires_grad=True)
        yield getattr(torch.ops.ewkern, op).default, (*ts, *scalars)
        plain = [t.detach() for t in ts]
        yield getattr(torch.ops.ewkern, f"{op}_out").default, (*plain, *scalars, torch.empty(3, 4, device=dev))
    yield torch.ops.ewkern.fill.default, (torch.empty(3, 4, device=dev), 1.5)
    a, b = torch.randn(2, 3, 4, device=dev, requires_grad=True), torch.randn(2, 3, 4, device=dev, requires_grad=True)
    yield torch.ops.ewkern.rmse.default, (a, b)
    yield torch.ops.ewkern.rmse.default, (a, b, [0])
    yield torch.ops.ewkern.rmse_out.default, (a.detach(), b.detach(), [1, 2], torch.empty(2, device=dev))


@pytest.mark.parametrize("device", device_params())
def test_opcheck_every_op(device):
    cases = list(opcheck_cases(device))
    assert len(cases) == 2 * len(ELEMENTWISE) + 4
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_fake_kernels_give_shapes_dtypes_and_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    cases = [((4, 6), None, (4,)), ((4, 6), 0, (6,)), ((2, 3, 5), (1, 2), (2,)), ((7,), None, ()),
             ((2, 3, 5), [0, 1], (5,))]
    with FakeTensorMode():
        for dtype in TORCH_DTYPE.values():
            x = torch.empty(3, 5, dtype=dtype)
            assert ewt.gelu(x).shape == (3, 5) and ewt.axpby(x, x, 1.0, 2.0).dtype == dtype
            want = torch.float64 if dtype == torch.float64 else torch.float32
            for shape, axis, rshape in cases:
                r = ewt.rmse(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype), axis)
                assert r.shape == rshape and r.dtype == want
    for mode in (FakeTensorMode(), torch.device("cpu")):   # fake and real kernels fail alike
        with mode:
            x = torch.empty(3, 5)
            with pytest.raises(ValueError, match="does not broadcast"):
                ewt.add(x, torch.empty(5))
            with pytest.raises(TypeError, match="dtype mismatch"):
                ewt.mul(x, torch.empty(3, 5, dtype=torch.float64))
            with pytest.raises(TypeError, match="unsupported dtype"):
                ewt.exp(torch.empty(3, dtype=torch.int64))
            with pytest.raises(ValueError, match="contiguous run"):
                ewt.rmse(torch.empty(2, 3, 4), torch.empty(2, 3, 4), (0, 2))
            with pytest.raises(ValueError, match="out of bounds"):
                ewt.rmse(x, x, 2)


# --- torch.compile and CUDA graphs ------------------------------------------------------------------

def every_op(x, y, p):
    """Each differentiable op once, on positive p where the domain needs it."""
    t = ewt.add(ewt.sub(x, y), ewt.mul(ewt.div(x, p), ewt.maximum(x, y)))
    t = ewt.axpby(ewt.minimum(t, y), ewt.add_const(ewt.mul_const(x, 0.5), 0.25), 0.75, -1.5)
    t = ewt.add(ewt.neg(ewt.abs(t)), ewt.mul(ewt.exp(ewt.mul_const(y, 0.1)), ewt.log(p)))
    t = ewt.add(ewt.sub(ewt.sqrt(p), ewt.rsqrt(p)), ewt.mul(ewt.erf(t), ewt.tanh(x)))
    t = ewt.add(ewt.sigmoid(t), ewt.add(ewt.relu(ewt.copy(y)), ewt.mul(ewt.gelu(t), ewt.silu(x))))
    return ewt.rmse(t, y)


def compile_inputs(device, dtype=torch.float32, n=(6, 40)):
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(n, generator=g, dtype=dtype).to(device).requires_grad_() for _ in range(2))
    p = (torch.rand(n, generator=g, dtype=dtype) + 0.5).to(device).requires_grad_()
    return x, y, p


def compare_with_eager(fn, compiled, args, rtol=2e-5):
    want = fn(*args)
    want_g = torch.autograd.grad(want.sum(), args)
    got = compiled(*args)
    got_g = torch.autograd.grad(got.sum(), args)
    torch.testing.assert_close(got, want, rtol=rtol, atol=1e-6)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_every_op_fullgraph_aot_eager(dynamic):
    """Dynamo traces every op without a graph break; AOTAutograd traces the backward formulas."""
    torch._dynamo.reset()
    compiled = torch.compile(every_op, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    compare_with_eager(every_op, compiled, compile_inputs("cpu"))
    if dynamic:   # another shape, the same graph
        compare_with_eager(every_op, compiled, compile_inputs("cpu", n=(3, 17)))


def small_loss(x, y, w):
    """rmse inside a compiled function, with torch ops around it for Inductor to fuse."""
    return ewt.rmse(ewt.gelu(x) * w + 1.0, y).mean()


@pytest.mark.parametrize("device", device_params())
def test_compile_inductor_fullgraph(device):
    torch._dynamo.reset()
    dev = torch_device(device)
    args = compile_inputs(dev)
    compiled = torch.compile(small_loss, fullgraph=True)
    compare_with_eager(small_loss, compiled, args)
    explained = torch._dynamo.explain(small_loss)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = {str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("ewkern.rmse" in o for o in ops) and any("ewkern.gelu" in o for o in ops), ops


def test_compile_out_variant_under_no_grad():
    def f(a, b, out):
        ewt.add(a, b, out=out)
        return ewt.gelu(out)
    a, b = torch.randn(33), torch.randn(33)
    o1, o2 = torch.empty(33), torch.empty(33)
    with torch.no_grad():
        want = f(a, b, o1)
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(a, b, o2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)


@pytest.mark.gpu
@gpu_torch
def test_cuda_graph_capture_and_reduce_overhead():
    x, y, w = compile_inputs("cuda", n=(8, 1 << 14))
    x, y, w = x.detach(), y.detach(), w.detach()
    want = small_loss(x, y, w)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        small_loss(x, y, w)               # warm up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = small_loss(x, y, w)
    x.mul_(2.0)
    graph.replay()
    torch.testing.assert_close(captured, small_loss(x, y, w), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(captured, want)
    torch._dynamo.reset()
    compiled = torch.compile(small_loss, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            got = compiled(x, y, w)
    torch.testing.assert_close(got, small_loss(x, y, w), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@gpu_torch
def test_results_on_a_busy_side_stream():
    x = torch.randn(1 << 22, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())   # x is written on the default stream
    with torch.cuda.stream(s):
        torch.cuda._sleep(1_000_000)      # keeps s busy: a launch elsewhere would run first
        y = ewt.exp(x)
        z = ewt.rmse(y.view(4, -1), x.view(4, -1))
    s.synchronize()
    torch.testing.assert_close(y, torch.exp(x))
    torch.testing.assert_close(z, torch.sqrt(((torch.exp(x) - x) ** 2).view(4, -1).mean(1)))


@pytest.mark.parametrize("device", device_params())
def test_opcheck_backward_ops(device):
    """torch.ops.ewkern.<op>_backward (the custom ops a compiled backward calls): schema, fake
    kernel and real kernel agree (torch.library.opcheck)."""
    dev = torch_device(device)
    infos = [d for d in ewkern.ops() if d["family"] == "backward"]
    assert len(infos) == 16
    for info in infos:
        args = [torch.rand(3, 4, device=dev, dtype=torch.float64) + 0.5 for _ in info["args"]]
        scalars = [1.5, -0.25][: info["scalars"]]
        torch.library.opcheck(getattr(torch.ops.ewkern, info["name"]).default, (*args, *scalars))
    a, b = torch.rand(2, 3, 4, device=dev) + 0.5, torch.rand(2, 3, 4, device=dev)
    r = ewkern.rmse(a, b)
    torch.library.opcheck(torch.ops.ewkern.rmse_backward.default, (torch.rand_like(r), a, b, r))
    torch.library.opcheck(torch.ops.ewkern.rmse_backward.default, (torch.rand(4, device=dev), a, b,
                                                                   ewkern.rmse(a, b, (0, 1)), [0, 1]))


def test_out_refuses_forward_mode_ad_as_torch_does():
    """out= has no forward-mode derivative: a dual tensor (a dual_level, torch.func.jvp) among the
    inputs or out is a NotImplementedError, as with torch.exp(out=), where the result was written
    without its tangent (a jvp of zeros)."""
    import torch.autograd.forward_ad as fwAD
    x, t = torch.randn(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        with pytest.raises(NotImplementedError, match="out= does not support forward-mode AD"):
            ewt.exp(d, out=torch.empty(3, dtype=torch.float64))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            ewt.exp(x, out=fwAD.make_dual(torch.empty(3, dtype=torch.float64), t))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            ewt.rmse(d.reshape(1, 3), d.reshape(1, 3), out=torch.empty(1, dtype=torch.float64))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            ewt.fill(fwAD.make_dual(torch.empty(3, dtype=torch.float64), t), 1.0)
        o = torch.empty(3, dtype=torch.float64)
        assert ewt.exp(x, out=o) is o          # no dual tensor: out= as ever
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        torch.func.jvp(lambda a: ewt.exp(a, out=torch.empty(3, dtype=torch.float64)), (x,), (t,))
    _, tangent = torch.func.jvp(ewt.exp, (x,), (t,))
    torch.testing.assert_close(tangent, torch.exp(x))


def test_a_tensor_for_a_scalar_argument_is_refused():
    """c, alpha, beta and fill's value are numbers: a tensor (whose gradient the eager call dropped,
    and which torch.compile's schema refused) is a TypeError in every path; NumPy scalars and ints
    are numbers."""
    import numpy as np
    a = torch.randn(4, requires_grad=True)
    for c in (torch.tensor(2.0), torch.tensor(2.0, requires_grad=True)):
        with pytest.raises(TypeError, match="scalar argument must be a Python number"):
            ewt.mul_const(a, c)
        with pytest.raises(TypeError, match="scalar argument must be a Python number"):
            ewt.add_const(a.detach(), c)
        with pytest.raises(TypeError, match="scalar argument must be a Python number"):
            ewt.axpby(a, a, c, 1.0)
        with pytest.raises(TypeError, match="scalar argument must be a Python number"):
            ewt.fill(torch.empty(3), c)
    for c in (2, 2.0, np.float32(2.0), np.float64(2.0)):
        torch.testing.assert_close(ewt.mul_const(a, c), a.detach() * 2)


def test_rmse_axis_takes_numpy_integers():
    import numpy as np
    a, b = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    for ax in (np.int64(2), [np.int64(2)], (np.int32(2),)):
        torch.testing.assert_close(ewt.rmse(a, b, axis=ax), ewt.rmse(a, b, axis=2))
    with pytest.raises(TypeError, match="axis: an integer or a sequence of integers"):
        ewt.rmse(a, b, axis="2")


def test_non_tensors_and_other_layouts_are_refused_clearly():
    """A number where an op takes a tensor is a TypeError naming the op (the dispatcher's was a
    RuntimeError); a sparse tensor goes to the custom op, which has no sparse kernel
    (NotImplementedError), not into the strided kernels; a torch integer tensor's dtype is named."""
    a = torch.randn(4)
    with pytest.raises(TypeError, match=r"ewkern.torch.add\(\): expected torch tensors, got float \(add_const"):
        ewt.add(a, 2.0)
    with pytest.raises(TypeError, match=r"ewkern.torch.mul\(\): expected torch tensors, got list"):
        ewt.mul(a, [1.0, 2.0, 3.0, 4.0], out=torch.empty(4))
    with pytest.raises(NotImplementedError):
        ewt.exp(a.to_sparse())
    with pytest.raises(TypeError, match="unsupported dtype int32"):
        ewt.exp(torch.arange(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="unsupported dtype bool"):
        ewkern.exp(torch.ones(4, dtype=torch.bool))


def test_jvp_takes_a_tangent_of_another_dtype():
    """torch's forward AD lets a tangent's dtype differ from its primal's (torch's own ops promote);
    the elementwise ops' jvp took it into a dtype mismatch inside the formula."""
    x = torch.rand(5, dtype=torch.float64) + 0.5
    t = torch.linspace(-1, 1, 5, dtype=torch.float32)
    for op, ref in ((ewt.exp, torch.exp), (ewt.gelu, torch.nn.functional.gelu), (ewt.log, torch.log)):
        _, got = torch.func.jvp(op, (x,), (t,))
        _, want = torch.func.jvp(ref, (x,), (t.double(),))
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want)
    _, got = torch.func.jvp(ewt.mul, (x, x), (t, t.double()))
    torch.testing.assert_close(got, 2 * x * t.double())


def _grad_args(op, device="cpu", shape=(5,)):
    """Inputs in op's domain that require grad, and its scalars."""
    _, ts, scalars = inputs("sub" if op == "rmse" else op, "float64", device, shape, seed=5, requires_grad=True)
    return ts, scalars


def _ours_and_torch(op):
    if op == "rmse":
        return (lambda a, b: ewt.rmse(a.view(1, -1), b.view(1, -1)),
                lambda a, b: torch.sqrt(((a.view(1, -1) - b.view(1, -1)) ** 2).mean(1)))
    return getattr(ewt, op), TORCH_OP[op]


@pytest.mark.parametrize("path", ["default", "python"])
@pytest.mark.parametrize("op", ELEMENTWISE + ["rmse"])
def test_batched_gradients_as_torch_computes_them(monkeypatch, op, path):
    """autograd.grad(is_grads_batched=True), and so torch.autograd.functional.jacobian and hessian
    with vectorize=True, run the backward under torch's legacy vmap, whose gradients have no memory:
    the one-kernel backwards read their data pointer ("Cannot access data pointer of Tensor that
    doesn't have storage") on both eager paths, for every op but those whose gradient is the
    incoming one. Such a gradient goes to the backward kernels as custom ops (and the composed
    formula's ops, with create_graph, to the custom ops), which torch batches."""
    if path == "python":
        _python_functions(monkeypatch)
    ts, scalars = _grad_args(op)
    ours, theirs = _ours_and_torch(op)
    y, yt = ours(*ts, *scalars), theirs(*ts, *scalars)
    eye = torch.eye(y.numel(), dtype=y.dtype).view(-1, *y.shape)
    for create_graph in (False, True):
        got = torch.autograd.grad(y, ts, eye, is_grads_batched=True, retain_graph=True, create_graph=create_graph)
        want = torch.autograd.grad(yt, ts, eye, is_grads_batched=True, retain_graph=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=lambda m: f"{op} {create_graph}: {m}")
    x, rest = ts[0].detach(), [t.detach() for t in ts[1:]]
    jac = torch.autograd.functional.jacobian(lambda a: ours(a, *rest, *scalars), x, vectorize=True)
    torch.testing.assert_close(jac, torch.autograd.functional.jacobian(lambda a: theirs(a, *rest, *scalars), x),
                               rtol=1e-12, atol=1e-12)
    for create_graph in (False, True):
        hess = torch.autograd.functional.hessian(lambda a: ours(a, *rest, *scalars).sum(), x, vectorize=True,
                                                 create_graph=create_graph)
        want = torch.autograd.functional.hessian(lambda a: theirs(a, *rest, *scalars).sum(), x)
        torch.testing.assert_close(hess, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path", ["default", "python"])
@pytest.mark.parametrize("op", ELEMENTWISE + ["rmse"])
def test_an_incoming_gradient_with_the_negative_bit(monkeypatch, op, path):
    """A gradient with the negative bit (grad_outputs=torch._neg_view(t)) holds -g in memory: the
    C++ nodes' one-kernel backwards read it as it lay (a gradient of the wrong sign, silently), the
    Python Functions' refused it (ValueError from ewkern's C functions). It goes to the backward
    kernels as custom ops, which the dispatcher resolves; the same gradients as with g resolved."""
    if path == "python":
        _python_functions(monkeypatch)
    ts, scalars = _grad_args(op, shape=(4, 6))
    ours = ewt.rmse if op == "rmse" else getattr(ewt, op)
    y = ours(*ts, *scalars)
    g = torch.linspace(-1.5, 2.5, y.numel(), dtype=y.dtype).reshape(y.shape)
    for create_graph in (False, True):
        want = torch.autograd.grad(y, ts, g, retain_graph=True)
        got = torch.autograd.grad(y, ts, torch._neg_view(-g), retain_graph=True, create_graph=create_graph)
        for k, (x, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(x, w, rtol=1e-12, atol=1e-12, msg=lambda m: f"{op} grad {k}: {m}")


def test_out_with_the_negative_bit_is_written_with_its_sign():
    """An out= with the negative bit (torch._neg_view) gets the values, as torch.exp(x, out=) does:
    torch's fallback for the bit cannot run a mutating op that returns nothing, so every out= (and
    fill) raised RuntimeError("Expected Tensor but got None")."""
    x = torch.linspace(-2.0, 1.5, 12, dtype=torch.float64).reshape(3, 4)
    y = torch.linspace(0.5, 3.0, 12, dtype=torch.float64).reshape(3, 4)
    mem = torch.zeros(3, 4, dtype=torch.float64)
    out = torch._neg_view(mem)
    assert ewt.exp(x, out=out) is out
    torch.testing.assert_close(out, torch.exp(x))
    torch.testing.assert_close(mem, -torch.exp(x))
    assert ewt.axpby(x, y, 2.0, -0.5, out=out) is out
    torch.testing.assert_close(out, 2.0 * x - 0.5 * y)
    assert ewt.mul(torch._neg_view(x), y, out=out) is out
    torch.testing.assert_close(out, -x * y)
    assert ewt.fill(out, 2.5) is out
    torch.testing.assert_close(mem, torch.full_like(mem, -2.5))
    r = torch.zeros(3, dtype=torch.float64)
    out_r = torch._neg_view(r)
    assert ewt.rmse(x, y, out=out_r) is out_r
    torch.testing.assert_close(r, -torch.sqrt(((x - y) ** 2).mean(1)))


@pytest.mark.parametrize("fn", ["gelu_backward", "mul_backward", "rmse_backward"])
def test_plain_backward_refusal_names_a_function_that_exists(fn):
    """A backward op given a tensor that requires grad pointed to ewkern.torch.<op>_backward, which
    does not exist: it names the forward op of ewkern.torch whose autograd runs the kernel."""
    a, b = torch.rand(3, 4, dtype=torch.float64) + 0.5, torch.rand(3, 4, dtype=torch.float64)
    g = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    args = {"gelu_backward": (g, a), "mul_backward": (g, a, b),
            "rmse_backward": (torch.rand(3, dtype=torch.float64, requires_grad=True), a, b, ewkern.rmse(a, b))}[fn]
    forward = fn[: -len("_backward")]
    with pytest.raises(RuntimeError, match=rf"requires grad.*the backward of ewkern\.torch\.{forward},") as e:
        getattr(ewkern, fn)(*args)
    assert f"ewkern.torch.{fn}" not in str(e.value) and hasattr(ewt, forward)
