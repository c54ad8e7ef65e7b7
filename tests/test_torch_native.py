"""ewkern.torch's C++ autograd nodes (ewkern/_torch_native): built for this torch, used by eager
calls that need a gradient, with the same results and gradients as the Python Functions (bit for
bit: the same kernels), one kernel a backward, double backward through the composed formulas,
torch's saved-tensor checks, eager calls without a gradient (the forward alone, no node), the
fallback to the Python path for everything but plain tensors outside modes and transforms, and
the switch and the failed build's warning; rmse's node in every axis= layout; user kernels' nodes
(kernel_op: make_user). CUDA cases skip without a GPU."""
import contextlib
import os
import shutil
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import ewkern.torch as ewt  # noqa: E402
from conftest import HAS_CUDA, dispatch_recorder  # noqa: E402
from test_elementwise import SCALARS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_CXX = any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++"))
pytestmark = pytest.mark.skipif(not HAS_CXX or os.environ.get("EWKERN_TORCH_NATIVE") == "0",
                                reason="no C++ compiler to build the module with (or EWKERN_TORCH_NATIVE=0)")
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA and torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
NATIVE_OPS = ("copy", "neg", "add_const", "mul_const", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh",
              "sigmoid", "relu", "gelu", "silu", "add", "sub", "mul", "div", "maximum", "minimum", "axpby")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "axpby")
# rmse's axis= cases: (shape, axis) with the reduced axes one run, or none
RMSE_CASES = [((6, 50), None), ((50,), None), ((4, 6, 5), None), ((4, 6, 5), [0]), ((4, 6, 5), [0, 1]),
              ((4, 6, 5), [-1]), ((4, 6, 5), [1]), ((4, 6, 5), []), ((0, 7), None), ((3, 0), None), ((), None)]


def native():
    assert ewt.autograd_path() == "c++", ewt.autograd_path()
    return ewt._native


def make(op, dtype, device, shape=(6, 50), need=(True, True), seed=0):
    """Inputs in the ops' domains (positive, away from relu's and abs's kink), needing grad as told."""
    g = torch.Generator().manual_seed(seed)
    n = 2 if op in BINARY else 1
    positive = op in ("log", "sqrt", "rsqrt")
    xs = [(torch.rand(shape, generator=g, dtype=torch.float64) + 0.25) *
          (1 if positive else torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double())
          for _ in range(n)]
    return [x.to(device=device, dtype=dtype).requires_grad_(need[k]) for k, x in enumerate(xs)]


@contextlib.contextmanager
def python_path(eager_only=False):
    """Eager calls through the Python faces' checks (and, unless eager_only, the Python Functions),
    not the C++ module."""
    saved = ewt._APPLY, ewt._EAGER
    ewt._EAGER = dict(ewt._PY_EAGER)
    if not eager_only:
        ewt._APPLY = dict(ewt._PY_APPLY)
    try:
        yield
    finally:
        ewt._APPLY, ewt._EAGER = saved


def step(op, ts, path):
    """(result, gradients of the inputs that need them) through the C++ nodes or the Python Functions."""
    with python_path() if path == "python" else contextlib.nullcontext():
        y = getattr(ewt, op)(*ts, *SCALARS.get(op, ()))
        g = torch.linspace(-1.5, 2.0, y.numel(), dtype=torch.float64).reshape(y.shape).to(y)
        return y, torch.autograd.grad(y, [t for t in ts if t.requires_grad], g)


def test_the_module_is_built_and_runs_the_ops():
    mod = native()
    assert set(mod.names()) == set(NATIVE_OPS) | {"rmse"}
    x = torch.rand(5, requires_grad=True)
    y = ewt.gelu(x)
    assert "ewkern" in y.grad_fn.name() and "gelu" in y.grad_fn.name(), y.grad_fn.name()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", NATIVE_OPS)
def test_same_results_and_gradients_as_the_python_functions(op, dtype, device):
    """The same kernels, so the same bits: forward and every gradient, on a (6, 50) block, a
    transposed (non-contiguous) view, one element and none."""
    native()
    for shape, view in (((6, 50), False), ((50, 6), True), ((1,), False), ((0, 3), False)):
        ts = make(op, dtype, device, shape)
        if view:
            ts = [t.detach().t().requires_grad_() for t in ts]
        y, grads = step(op, ts, "c++")
        assert "ewkern" in y.grad_fn.name() and op in y.grad_fn.name(), y.grad_fn.name()
        y2, grads2 = step(op, ts, "python")
        assert "_function" in type(y2.grad_fn).__name__
        torch.testing.assert_close(y, y2, rtol=0, atol=0, equal_nan=True)
        assert len(grads) == len(grads2) == len(ts)
        for a, b in zip(grads, grads2):
            assert a.dtype == b.dtype == dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


EAGER_OPS = tuple(op for op in NATIVE_OPS if op != "axpby")   # axpby's face is _run's custom op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", EAGER_OPS)
def test_eager_calls_without_a_gradient_run_the_forward_alone_in_cpp(op, dtype, device):
    """Every eager call of a Python face goes through the C++ function (make(..., eager=True)):
    without a gradient to record (inputs that need none, or torch.no_grad) it launches the forward
    kernel with no node, the same bits as the Python path's ewkern._C call, on a block, a
    transposed view, one element and none."""
    native()
    assert type(ewt._EAGER[op]).__name__ == "builtin_function_or_method"
    for shape, view in (((6, 50), False), ((50, 6), True), ((1,), False), ((0, 3), False)):
        for need, grad_mode in (((False, False), True), ((True, True), False)):
            ts = make(op, dtype, device, shape, need)
            if view:
                ts = [t.detach().t().requires_grad_(t.requires_grad) for t in ts]
            with torch.set_grad_enabled(grad_mode):
                y = getattr(ewt, op)(*ts, *SCALARS.get(op, ()))
                with python_path(eager_only=True):
                    y2 = getattr(ewt, op)(*ts, *SCALARS.get(op, ()))
            assert y.grad_fn is None and not y.requires_grad and y.is_contiguous()
            assert y.dtype == dtype and y.shape == ts[0].shape and y.device == ts[0].device
            torch.testing.assert_close(y, y2, rtol=0, atol=0, equal_nan=True)


def test_eager_calls_leave_modes_transforms_and_bad_input_to_the_python_path():
    """What the Python faces' checks sent to the custom op or to ewkern's errors still goes there
    through the C++ function: a TorchDispatchMode sees torch.ops.ewkern.<op> for plain tensors
    with and without a gradient, vmap runs the custom op, and mixed dtypes, shapes that would
    broadcast, integer tensors and a non-number constant raise the Python path's errors."""
    native()
    x, y = torch.rand(8, requires_grad=True), torch.rand(8)
    for grad in (True, False):
        with dispatch_recorder() as m, torch.set_grad_enabled(grad):
            ewt.mul(x, y), ewt.gelu(y), ewt.add_const(y, 2.0)
        assert m.ops == ["ewkern.mul.default", "ewkern.gelu.default", "ewkern.add_const.default"], m.ops
    z = torch.rand(3, 5) - 0.5
    torch.testing.assert_close(torch.func.vmap(ewt.gelu)(z), torch.nn.functional.gelu(z))
    cases = [(lambda: ewt.add(torch.rand(4), torch.rand(4, dtype=torch.float64)), TypeError),
             (lambda: ewt.mul(torch.rand(4, 3), torch.rand(3)), ValueError),
             (lambda: ewt.exp(torch.arange(4)), TypeError),
             (lambda: ewt.add_const(torch.rand(4), "2"), TypeError)]
    for call, exc in cases:
        with pytest.raises(exc) as fast:
            call()
        with python_path(eager_only=True), pytest.raises(exc) as slow:
            call()
        assert str(fast.value) == str(slow.value)


def rmse_step(a, b, axis, path, need=(True, True)):
    with python_path() if path == "python" else contextlib.nullcontext():
        a, b = a.detach().requires_grad_(need[0]), b.detach().requires_grad_(need[1])
        r = ewt.rmse(a, b, axis)
        g = torch.linspace(0.5, 2.0, r.numel(), dtype=torch.float64).reshape(r.shape).to(r)
        return r, torch.autograd.grad(r, [t for t in (a, b) if t.requires_grad], g)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,axis", RMSE_CASES, ids=str)
def test_rmse_same_result_and_gradients_as_the_python_function(shape, axis, dtype, device):
    """rmse's node: the same bits as the Python Function for the result and both gradients, every
    layout of axis= (batch-first, batch-last, middle, none reduced, empty batches, a 0-d input)."""
    native()
    g = torch.Generator().manual_seed(len(shape))
    a, b = (torch.rand(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype) for _ in range(2))
    r, grads = rmse_step(a, b, axis, "c++")
    if r.numel():
        assert "Rmse" in r.grad_fn.name(), r.grad_fn.name()
    r2, grads2 = rmse_step(a, b, axis, "python")
    assert "_RmseFunction" in type(r2.grad_fn).__name__
    torch.testing.assert_close(r, r2, rtol=0, atol=0, equal_nan=True)
    for x, y in zip(grads, grads2):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmse_eager_without_a_gradient_is_the_forward_alone(dtype, device):
    """rmse's eager calls without a gradient (inputs that need none, torch.no_grad) take the node's
    forward kernel with no node: the Python path's bits (ewkern._C.rmse) in every axis= layout."""
    native()
    assert type(ewt._EAGER["rmse"]).__name__ == "builtin_function_or_method"
    for shape, axis in RMSE_CASES:
        g = torch.Generator().manual_seed(len(shape))
        a, b = (torch.rand(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype) for _ in range(2))
        for grad_mode, need in ((True, False), (False, True)):
            a.requires_grad_(need)
            with torch.set_grad_enabled(grad_mode):
                r = ewt.rmse(a, b, axis)
                with python_path(eager_only=True):
                    r2 = ewt.rmse(a, b, axis)
            assert r.grad_fn is None and r.dtype == r2.dtype and r.shape == r2.shape
            torch.testing.assert_close(r, r2, rtol=0, atol=0, equal_nan=True)


def test_rmse_axes_the_node_does_not_take_raise_as_before():
    native()
    a = torch.rand(3, 4, 5, requires_grad=True)
    with pytest.raises(ValueError, match="one contiguous run"):
        ewt.rmse(a, a.detach(), (0, 2))
    with pytest.raises(ValueError, match="out of bounds"):
        ewt.rmse(a, a.detach(), 3)
    with pytest.raises(ValueError, match="repeated"):
        ewt.rmse(a, a.detach(), (1, 1))
    with pytest.raises(ValueError, match="shape mismatch"):
        ewt.rmse(a, torch.rand(3, 4, 6))


@pytest.mark.parametrize("op,need,kernels", [
    ("rmse", (True, True), 1), ("rmse", (False, True), 1),
    ("gelu", (True,), 1), ("tanh", (True,), 1), ("exp", (True,), 1), ("relu", (True,), 1),
    ("mul", (True, True), 1), ("mul", (True, False), 1), ("mul", (False, True), 1), ("div", (True, True), 1),
    ("div", (True, False), 1), ("div", (False, True), 1), ("maximum", (False, True), 1),
    ("minimum", (True, True), 1), ("axpby", (True, True), 1), ("axpby", (False, True), 1),
    ("add", (True, True), 0), ("sub", (True, True), 1), ("sub", (True, False), 0), ("neg", (True,), 1),
    ("mul_const", (True,), 1), ("add_const", (True,), 0), ("copy", (True,), 0)])
def test_a_backward_is_at_most_one_kernel(op, need, kernels):
    """The backward launches one kernel (both gradients in one pass), or none where the gradient is
    the incoming one; and only the gradients asked for come back."""
    mod = native()
    ts = make("mul" if op == "rmse" else op, torch.float32, "cpu", need=need)
    y = getattr(ewt, op)(*ts, *SCALARS.get(op, ()))
    before = mod.launches()
    grads = torch.autograd.grad(y, [t for t in ts if t.requires_grad], torch.ones_like(y))
    assert mod.launches() - before == kernels
    assert len(grads) == sum(need)


@pytest.mark.parametrize("op", ["gelu", "silu", "tanh", "sigmoid", "erf", "rsqrt", "mul", "div", "axpby",
                                "maximum", "mul_const", "sub", "rmse"])
def test_double_backward_takes_the_composed_formula(op):
    """create_graph=True runs the composed formula (differentiable ops) from the C++ node's
    backward: gradcheck and gradgradcheck in float64."""
    native()
    ts = make("mul" if op == "rmse" else op, torch.float64, "cpu", shape=(3, 4))
    sc = SCALARS.get(op, ())
    fn = (lambda *a: getattr(ewt, op)(*a, *sc))
    assert torch.autograd.gradcheck(fn, ts)
    assert torch.autograd.gradgradcheck(fn, ts)


def test_a_saved_tensor_changed_in_place_is_refused():
    """torch's version check on saved tensors, as for its own nodes."""
    native()
    x = torch.rand(10, dtype=torch.float64, requires_grad=True)
    h = x * 1.0
    y = ewt.gelu(h)                     # saves h
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    r = ewt.rmse((x * 1.0).view(2, 5), x.detach().view(2, 5))   # saves a, b and its result
    r.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        r.sum().backward()
    z = ewt.exp(x * 1.0)                # saves its result
    z.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_nodes_free_what_they_saved():
    """The nodes are plain torch Nodes: a second backward without retain_graph is refused, with it
    the same gradients; a result the node saved (exp, rmse) does not keep its node alive (a node
    that leaked would keep the leaf it leads to alive through its gradient accumulator)."""
    import gc
    import weakref
    native()
    x = torch.rand(10, dtype=torch.float64, requires_grad=True)
    other = torch.rand(2, 5, dtype=torch.float64)
    for f in (lambda t: ewt.exp(t), lambda t: ewt.mul(t, t), lambda t: ewt.rmse(t.view(2, 5), other)):
        y = f(x)
        assert y.grad_fn.name().startswith("ewkern::"), y.grad_fn.name()
        (g1,) = torch.autograd.grad(y.sum(), x, retain_graph=True)
        (g2,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(g1, g2, rtol=0, atol=0)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            torch.autograd.grad(y.sum(), x)
        leaf = torch.rand(10, dtype=torch.float64, requires_grad=True)
        y, alive = f(leaf), weakref.ref(leaf)
        del y, leaf
        gc.collect()
        assert alive() is None


def test_what_the_native_path_does_not_take_goes_to_the_python_path():
    """Mismatched or unsupported inputs raise the Python path's errors; a tensor subclass and
    integer scalars still work."""
    native()
    a = torch.rand(4, requires_grad=True)
    with pytest.raises(ValueError, match="shape mismatch"):
        ewt.add(a, torch.rand(5, requires_grad=True))
    with pytest.raises(TypeError, match="dtype mismatch"):
        ewt.mul(a, torch.rand(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="unsupported dtype"):
        ewt.gelu(torch.rand(4, dtype=torch.complex64, requires_grad=True))
    with pytest.raises((TypeError, RuntimeError)):
        ewt.add_const(a, "1")
    y = ewt.add_const(a, 2)
    torch.testing.assert_close(y, a.detach() + 2)

    class Sub(torch.Tensor):
        pass
    s = a.detach().as_subclass(Sub).requires_grad_()
    ys = ewt.tanh(s)
    (gs,) = torch.autograd.grad(ys.sum(), s)
    torch.testing.assert_close(gs.as_subclass(torch.Tensor), 1 - torch.tanh(a.detach()) ** 2)


@pytest.mark.parametrize("path", ["c++", "python"])
@pytest.mark.parametrize("device", DEVICES)
def test_tensors_with_the_negative_bit_are_read_with_their_sign(device, path):
    """A tensor with the negative bit (torch._neg_view; the imaginary part of a real view's conj())
    holds -t in memory, and torch's DLPack export drops the bit: both eager paths hand such
    tensors to the custom op, which the dispatcher resolves, so results, out= and gradients keep
    the sign; ewkern's ops, rmse and a user kernel's op alike."""
    native()
    gen = torch.Generator().manual_seed(11)
    x = (torch.rand(6, 50, generator=gen, dtype=torch.float64) * 4 - 1.5).to(device)
    y = (torch.rand(6, 50, generator=gen, dtype=torch.float64) + 0.5).to(device)
    n = torch._neg_view(x)
    assert n.is_neg()
    with python_path() if path == "python" else contextlib.nullcontext():
        for op in ("exp", "gelu", "abs", "neg", "relu", "tanh"):
            ref = getattr(torch, op)(-x) if op != "gelu" else torch.nn.functional.gelu(-x)
            torch.testing.assert_close(getattr(ewt, op)(n), ref, msg=op)
        torch.testing.assert_close(ewt.sub(y, n), y + x)
        torch.testing.assert_close(ewt.mul(n, y), -x * y)
        torch.testing.assert_close(ewt.add_const(n, 2.0), 2.0 - x)
        torch.testing.assert_close(ewt.rmse(n, y), torch.sqrt(((-x - y) ** 2).mean(1)))
        out = torch.empty_like(x)
        assert ewt.exp(n, out=out) is out
        torch.testing.assert_close(out, torch.exp(-x))
        xr = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(ewt.mul(torch._neg_view(xr), y).sum(), xr)
        torch.testing.assert_close(gx, -y)
        (gx,) = torch.autograd.grad(ewt.exp(torch._neg_view(xr)).sum(), xr)
        torch.testing.assert_close(gx, -torch.exp(-x))
        op = user_rmsnorm()
        w = torch.ones(50, dtype=torch.float64, device=device)
        torch.testing.assert_close(op(n, w, 1e-5), op(-x, w, 1e-5))
    # ewkern's own functions take torch tensors through torch's export, which drops the bit (as
    # NumPy's from_dlpack does): they refuse such a tensor, read or written, and name the fix
    import ewkern
    with pytest.raises(ValueError, match=r"a: a torch tensor with the negative bit .*t\.resolve_neg\(\)"):
        ewkern.copy(n)
    target = torch.zeros_like(x)
    with pytest.raises(ValueError, match="negative bit"):
        ewkern.exp(x, out=torch._neg_view(target))
    assert not target.any()
    with pytest.raises(ValueError, match="negative bit"):
        ewkern.rmse(y, n)
    torch.testing.assert_close(torch.from_dlpack(ewkern.copy(n.resolve_neg())), -x)


@pytest.mark.parametrize("path", ["c++", "python"])
def test_a_pack_hook_that_raises_raises_its_own_exception(path):
    """A saved-tensor pack hook's exception reaches the caller as itself (it came back as a
    SystemError from the C++ nodes, and as an empty RuntimeError from a user op's node), so
    non-reentrant torch.utils.checkpoint, which stops its recomputation by raising from a hook, works
    with ewkern's ops and user ops: the same gradients as without it."""
    native()
    from torch.utils.checkpoint import checkpoint

    class Stop(Exception):
        pass

    def pack(t):
        raise Stop("from the pack hook")
    op = user_rmsnorm()
    x = torch.rand(6, 50, dtype=torch.float64, requires_grad=True)
    y = torch.rand(6, 50, dtype=torch.float64)
    w = torch.rand(50, dtype=torch.float64) + 0.5
    big = torch.rand(1 << 17, dtype=torch.float64, requires_grad=True)   # the forward without the GIL
    calls = [lambda: ewt.exp(x), lambda: ewt.mul(x, y), lambda: ewt.rmse(x, y), lambda: ewt.gelu(big),
             lambda: op(x, w, 1e-5)]
    with python_path() if path == "python" else contextlib.nullcontext():
        for f in calls:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with pytest.raises(Stop, match="from the pack hook"):
                    f()
        for f in (lambda a: ewt.exp(a).sum(), lambda a: ewt.mul(a, y).sum(), lambda a: op(a, w, 1e-5).sum()):
            (want,) = torch.autograd.grad(f(x), x)
            (got,) = torch.autograd.grad(checkpoint(f, x, use_reentrant=False), x)
            torch.testing.assert_close(got, want)


def test_init_and_make_refuse_what_they_cannot_use():
    """init takes ewkern's capsule only (and changes nothing otherwise); make knows its ops."""
    mod = native()
    with pytest.raises((TypeError, ValueError)):
        mod.init(object(), ewt._composed_grads)
    with pytest.raises(KeyError, match="no op fill"):
        mod.make("fill", lambda *a: None)
    x = torch.rand(3, requires_grad=True)
    torch.testing.assert_close(torch.autograd.grad(ewt.exp(x).sum(), x)[0], torch.exp(x.detach()))


_user_names = iter(range(10**6))


def user_rmsnorm():
    """A RowKernel rmsnorm made a custom op (a new name each call: torch.ops.ewkern_user.<name>)."""
    import ewkern
    k = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w", "0", f"native_rms{next(_user_names)}")
    return ewt.kernel_op(k, scalars=("eps",))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)], ids=str)
def test_user_kernels_record_a_cpp_node_with_the_python_functions_results(need, device):
    """kernel_op's eager grad path: a C++ node (make_user), no Python Function, and bit for bit the
    Python Function's results and gradients (the same kernels), also when one gradient is not
    wanted (the backward kernel then writes only the other); a weight broadcast over the rows."""
    native()
    op = user_rmsnorm()
    gen = torch.Generator().manual_seed(3)
    x = (torch.rand(6, 40, generator=gen, dtype=torch.float64) + 0.5).to(device).requires_grad_(need[0])
    w = (torch.rand(40, generator=gen, dtype=torch.float64) + 0.5).to(device).requires_grad_(need[1])
    g = torch.rand(6, 40, generator=gen, dtype=torch.float64).to(device)
    y = op(x, w, 1e-5)
    assert y.grad_fn.name() == f"ewkern_user::{op._name}Backward", y.grad_fn.name()
    ins = [t for t in (x, w) if t.requires_grad]
    grads = torch.autograd.grad(y, ins, g)
    via = getattr(torch.ops.ewkern_user, op._name)(x, w, 1e-5)     # the custom op's own autograd
    assert via.grad_fn.name() != y.grad_fn.name()
    torch.testing.assert_close(y, via, rtol=0, atol=0)
    for a, b in zip(grads, torch.autograd.grad(via, ins, g)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if all(need):
        assert torch.autograd.gradcheck(lambda a, b: op(a, b, 1e-5), (x, w))


def test_user_node_checks_saved_tensors_and_refuses_double_backward():
    """torch's saved-tensor rules hold for the user node: an input changed in place after the
    forward, and a second backward through a freed graph, raise; create_graph=True raises the
    Python path's error; a forward-mode dual tensor is refused (the op has no jvp)."""
    native()
    op = user_rmsnorm()
    x = torch.rand(4, 16, dtype=torch.float64, requires_grad=True)
    w = torch.rand(16, dtype=torch.float64, requires_grad=True)
    h = x * 1.0
    y = op(h, w, 1e-5)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = op(x, w, 1e-5)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(op(x, w, 1e-5).sum(), x, create_graph=True)
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level(), pytest.raises(NotImplementedError, match="forward-mode AD"):
        # refused by name, not a node (or custom op) that drops the tangent
        op(fwad.make_dual(x.detach(), torch.ones_like(x)), w, 1e-5)


def test_user_node_keeps_working_without_a_tensor_that_needs_grad_and_under_no_grad():
    """No node where no gradient is wanted; an int scalar is taken; a wrong argument count goes to
    the Python path's error."""
    native()
    op = user_rmsnorm()
    x = torch.rand(3, 8, requires_grad=True)
    w = torch.rand(8)
    with torch.no_grad():
        assert op(x, w, 1e-5).grad_fn is None
    assert op(x.detach(), w, 1e-5).grad_fn is None
    y = op(x, w, 1)
    assert y.grad_fn.name().startswith("ewkern_user::")
    torch.testing.assert_close(y, (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1) * w).detach())
    with pytest.raises(RuntimeError, match="missing value for argument 'eps'"):
        op(x, w)


def test_user_reductions_record_a_cpp_node_per_axis():
    """kernel_op of a ReductionKernel: eager grad calls record the C++ node (one callable per axis=
    and keepdims=, whose forward runs by the kernel's plan from its second call), with the custom
    op's values and gradients; a tensor subclass goes through the custom op's own autograd."""
    import ewkern
    k = ewkern.ReductionKernel("T x, T y", "T z", "(x - y) * (x - y)", "a + b",
                               "z = sqrt(a / (_in_ind.size() / _out_ind.size()))", "0",
                               f"native_red{next(_user_names)}")
    op = ewt.kernel_op(k)
    native()
    x = torch.rand(5, 7, dtype=torch.float64, requires_grad=True)
    y = torch.rand(7, dtype=torch.float64, requires_grad=True)
    for j, (axis, keepdims) in enumerate(((1, False), (None, True), ([0], True), (1, False))):
        before = ewt._native.user_forward_runs()
        r = op(x, y, axis=axis, keepdims=keepdims)
        # the forward by the kernel's plan from the second call of an axis= and keepdims= on
        assert ewt._native.user_forward_runs() - before == (j == 3)
        assert r.grad_fn.name() == f"ewkern_user::{k.name}Backward", r.grad_fn.name()
        via = getattr(torch.ops.ewkern_user, k.name)(x, y, None if axis is None else
                                                     ([axis] if isinstance(axis, int) else axis), keepdims)
        assert via.grad_fn.name() != r.grad_fn.name()
        torch.testing.assert_close(r, via, rtol=0, atol=0)
        g = torch.rand(r.shape, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad(r, (x, y), g), torch.autograd.grad(via, (x, y), g)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

    # without a gradient too: the native function's forward by the same plan, no node
    for ctx in (torch.no_grad(), contextlib.nullcontext()):
        with ctx:
            xs, ys = (x, y) if isinstance(ctx, torch.no_grad) else (x.detach(), y.detach())
            before = ewt._native.user_forward_runs()
            r = op(xs, ys, axis=1)
            assert ewt._native.user_forward_runs() - before == 1 and r.grad_fn is None
            torch.testing.assert_close(r, op(x, y, axis=1).detach(), rtol=0, atol=0)

    class Sub(torch.Tensor):
        pass
    s = x.detach().as_subclass(Sub).requires_grad_()
    (gs,) = torch.autograd.grad(op(s, y.detach(), axis=1).sum(), s)
    torch.testing.assert_close(gs.as_subclass(torch.Tensor), torch.autograd.grad(op(x, y.detach(), axis=1).sum(), x)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)], ids=str)
@pytest.mark.parametrize("axis, keepdims", [(1, False), (None, True)], ids=str)
def test_user_reduction_backward_repeats_its_two_kernels_without_python(axis, keepdims, need, dtype, device):
    """A ReductionKernel op's backward is two kernels (the reduction again, then the one that
    writes the wanted gradients from it): the first backward of a signature runs them from
    Python, every later one from C++ by their chained plans (the reduction's result scratch
    between them; a float scalar renumbered; n_in and n_out kept as the first call wrote them),
    the gradients bit for bit the Python path's (a broadcast input's summed to its shape); other
    values and another scalar against the custom op's own autograd."""
    import ewkern
    k = ewkern.ReductionKernel("T x, T y, float32 s", "T z", "(x - y) * (x - y) * s", "a + b",
                               "z = sqrt(a / (_in_ind.size() / _out_ind.size()))", "0",
                               f"native_redbw{next(_user_names)}")
    op = ewt.kernel_op(k, scalars=("s",))
    native()
    gen = torch.Generator().manual_seed(5)

    def inputs():
        x = (torch.rand(6, 40, generator=gen, dtype=torch.float64) + 1).to(device, dtype).requires_grad_(need[0])
        y = torch.rand(40, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_(need[1])
        return x, y

    def grads(x, y, s, g):
        r = op(x, y, s, axis=axis, keepdims=keepdims)
        return r, torch.autograd.grad(r, [t for t in (x, y) if t.requires_grad], g)

    x, y = inputs()
    shape = (6,) if axis == 1 else (1, 1)
    g = (torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5).to(device, dtype)
    (r0, want), runs = _plan_runs(lambda: grads(x, y, 0.5, g))
    assert runs == 0
    (r1, got), runs = _plan_runs(lambda: grads(x, y, 0.5, g))
    assert runs == 1
    for a, b, t in zip(got, want, [t for t in (x, y) if t.requires_grad]):
        assert a.shape == t.shape and a.dtype == t.dtype and a.device == t.device
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    x2, y2 = inputs()
    (r2, got2), runs = _plan_runs(lambda: grads(x2, y2, 1.75, g))
    assert runs == 1
    ins = [t for t in (x2, y2) if t.requires_grad]
    via = getattr(torch.ops.ewkern_user, k.name)(x2, y2, 1.75, None if axis is None else [axis], keepdims)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(r2, via.detach(), **tol)
    for a, b in zip(got2, torch.autograd.grad(via, ins, g)):
        torch.testing.assert_close(a, b, **tol)


def test_user_reduction_backward_refuses_a_chained_plan_that_does_not_fit(monkeypatch):
    """A chained plan whose earlier stage names an argument past its numbering, or whose scalar
    slot names a tensor, is refused (read_plan): every backward of that signature keeps the
    Python path, with the right gradients."""
    import ewkern
    orig = ewt._chained_plan
    for bad in ("pointer", "scalar"):
        def broken(plans, nin, grad_of, bad=bad):
            r = orig(plans, nin, grad_of)
            t, ps, ss, outs, prog = r[7][0]
            if bad == "pointer":
                ps = ps[:8] + struct.pack("<q", 99) + ps[16:]
            else:
                ss = struct.pack("<3q", 0, 0, 1) + ss
            return r[:7] + (((t, ps, ss, outs, prog),),)
        monkeypatch.setattr(ewt, "_chained_plan", broken)
        k = ewkern.ReductionKernel("T x, float32 s", "T z", "x * x * s", "a + b", "z = a", "0",
                                   f"native_redbad{next(_user_names)}")
        op = ewt.kernel_op(k, scalars=("s",))
        native()
        x = torch.rand(4, 9, dtype=torch.float64, requires_grad=True)
        for _ in range(3):
            (gx,), runs = _plan_runs(lambda: torch.autograd.grad(op(x, 1.5, axis=1), x, torch.ones(4,
                                                                                             dtype=torch.float64)))
            assert runs == 0
            torch.testing.assert_close(gx, 3 * x.detach(), rtol=1e-12, atol=0)


def test_user_op_without_a_backward_runs_its_forward_by_plan_without_a_gradient():
    """An op whose backward cannot be derived (a conditional): its calls that need no gradient go
    through the native function (from the second of a signature by the kernel's plan, the same
    bits); one that needs a gradient keeps the Python Function (no C++ node to keep the inputs for
    a backward that can only raise), whose backward raises saying why."""
    import ewkern
    k = ewkern.ElementwiseKernel("T a, T b", "T o", "o = a > b ? a : b * 0.5f", f"native_nobw{next(_user_names)}")
    op = ewt.kernel_op(k)
    native()
    a, b = torch.randn(33, 7), torch.randn(7)
    want = torch.where(a > b, a, b * 0.5)
    for j in range(3):
        y, fruns = _plan_runs(lambda: op(a, b), forward=True)
        assert fruns == (j > 0) and y.grad_fn is None
        torch.testing.assert_close(y, want, rtol=0, atol=0)
    ag = a.clone().requires_grad_()
    y, fruns = _plan_runs(lambda: op(ag, b), forward=True)
    assert fruns == 0 and type(y.grad_fn).__name__.endswith("_functionBackward"), type(y.grad_fn).__name__
    torch.testing.assert_close(y.detach(), want, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="no backward: .*conditionals"):
        y.sum().backward()


def _run(code, **env):
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=600)


def test_the_switch_keeps_the_python_path():
    """EWKERN_TORCH_NATIVE=0: ewkern's ops through their Python Functions, user kernels through
    theirs (an ElementwiseKernel) or the custom op's autograd (a ReductionKernel), gradients right."""
    r = _run("import torch, ewkern, ewkern.torch as ewt\n"
             "x = torch.rand(4, requires_grad=True)\n"
             "e = ewt.kernel_op(ewkern.ElementwiseKernel('T a', 'T o', 'o = a * a', 'sq_sw'))\n"
             "k = ewkern.ReductionKernel('T a', 'T o', 'a * a', 'a + b', 'o = a', '0', 'ss_sw')\n"
             "r = ewt.kernel_op(k)(x, axis=0)\n"
             "(g,) = torch.autograd.grad(r, x)\n"
             "assert torch.allclose(g, 2 * x.detach()), g\n"
             "print(type(ewt.gelu(x).grad_fn).__name__, type(e(x).grad_fn).__name__, r.grad_fn.name(), "
             "ewt.autograd_path())", EWKERN_TORCH_NATIVE="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["gelu_functionBackward", "sq_sw_functionBackward",
                                "GeneratedBackwardFor_ewkern_user_ss_sw_defaultBackward", "python:",
                                "EWKERN_TORCH_NATIVE=0"], r.stdout


def test_a_failed_build_warns_once_and_keeps_working(tmp_path):
    """No working compiler (CXX names one that fails, an empty cache): a RuntimeWarning that says
    why, the Python path's results; under EWKERN_TORCH_NATIVE=1 the build's error is raised."""
    code = ("import warnings, torch, ewkern.torch as ewt\n"
            "x = torch.rand(4, dtype=torch.float64, requires_grad=True)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    g1 = torch.autograd.grad(ewt.gelu(x).sum(), x)[0]\n"
            "    g2 = torch.autograd.grad(ewt.mul(x, x).sum(), x)[0]\n"
            "print(len([m for m in w if 'C++ autograd nodes are not available' in str(m.message)]))\n"
            "print(ewt.autograd_path().split(':')[0], torch.allclose(g2, 2 * x))\n")
    env = dict(CXX=shutil.which("false") or "false", EWKERN_CACHE_DIR=str(tmp_path))
    r = _run(code, **env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "python", "True"], r.stdout
    r = _run(code, EWKERN_TORCH_NATIVE="1", **env)
    assert r.returncode != 0 and "CompileError" in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA GPU that torch sees (runs on the GPU machine)")
def test_cuda_backward_runs_on_the_forwards_stream_and_device():
    """The backward's kernels go on the stream autograd gives the node (the forward's), on a side
    stream too, with results equal to the default stream's."""
    native()
    x = torch.randn(1 << 20, device="cuda", requires_grad=True)
    g = torch.randn_like(x)
    want = torch.autograd.grad(ewt.gelu(x), x, g)[0]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = torch.autograd.grad(ewt.gelu(x), x, g)[0]
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def user_fma():
    """An ElementwiseKernel with a broadcast input and a float scalar made a custom op."""
    import ewkern
    k = ewkern.ElementwiseKernel("T x, T y, float32 c", "T z", "z = x * exp(y) + c * x * x",
                                 f"native_fma{next(_user_names)}")
    return ewt.kernel_op(k, scalars=("c",))


def _plan_runs(fn, forward=False):
    """(fn()'s value, how many user backwards (forward: forwards) ran from their plan meanwhile)."""
    count = ewt._native.user_forward_runs if forward else ewt._native.user_plan_runs
    before = count()
    r = fn()
    return r, count() - before


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)], ids=str)
@pytest.mark.parametrize("kind", ["elementwise", "rows"])
def test_user_backward_repeats_its_kernel_without_python(kind, need, dtype, device):
    """The first forward and backward of a signature run the kernels from Python, then ask for the
    C plans they ran by; every later one (a new graph, a retained one, other values, no gradient
    at all) runs the plan from C++ (no Python: the counts of plan runs say which path ran) with
    the Python path's results and gradients bit for bit: a broadcast input's gradient summed to its
    shape, a weight's column sum, one gradient wanted or both (on CUDA the rows' backward sums the
    weight's gradient in its kernel and a column-sum launch, on the CPU as a broadcast input's)."""
    native()
    op = user_fma() if kind == "elementwise" else user_rmsnorm()
    scalar = 0.75 if kind == "elementwise" else 1e-5
    gen = torch.Generator().manual_seed(11)

    def inputs():
        x = (torch.rand(7, 40, generator=gen, dtype=torch.float64) + 0.5).to(device, dtype).requires_grad_(need[0])
        w = (torch.rand(40, generator=gen, dtype=torch.float64) - 0.25).to(device, dtype).requires_grad_(need[1])
        return x, w

    def grads(x, w, g):
        y = op(x, w, scalar)
        return y, torch.autograd.grad(y, [t for t in (x, w) if t.requires_grad], g)

    x, w = inputs()
    g = torch.rand(7, 40, generator=gen, dtype=torch.float64).to(device, dtype)
    ((y0, want), runs), fruns = _plan_runs(lambda: _plan_runs(lambda: grads(x, w, g)), forward=True)
    assert runs == fruns == 0                          # the first: Python, which learns the plans
    ((y1, got), runs), fruns = _plan_runs(lambda: _plan_runs(lambda: grads(x, w, g)), forward=True)
    assert runs == fruns == 1
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    for a, b, t in zip(got, want, [t for t in (x, w) if t.requires_grad]):
        assert a.shape == t.shape and a.dtype == t.dtype and a.device == t.device and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # other values of the same signature (the scalar too), against the custom op's own autograd
    # (the Python kernels)
    x2, w2 = inputs()
    scalar = scalar * 3
    y, fruns = _plan_runs(lambda: op(x2, w2, scalar), forward=True)
    with torch.no_grad():
        y_ng, fruns_ng = _plan_runs(lambda: op(x2, w2, scalar), forward=True)
    assert fruns == fruns_ng == 1 and y_ng.grad_fn is None
    ins = [t for t in (x2, w2) if t.requires_grad]
    (first,), runs = _plan_runs(lambda: [torch.autograd.grad(y, ins, g, retain_graph=True)])
    (second,), runs2 = _plan_runs(lambda: [torch.autograd.grad(y, ins, g)])
    assert runs == runs2 == 1
    via = getattr(torch.ops.ewkern_user, op._name)(x2, w2, scalar)
    torch.testing.assert_close(y, via, rtol=0, atol=0)
    torch.testing.assert_close(y_ng, via, rtol=0, atol=0)
    for a, b, c in zip(first, second, torch.autograd.grad(via, ins, g)):
        # the custom op's backward writes every gradient (its kernel's code differs from the one
        # that writes only the wanted gradient, and on CUDA may round differently)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0 if all(need) else None, atol=0 if all(need) else None)


@pytest.mark.parametrize("device", DEVICES)
def test_user_backward_plans_follow_the_signature(device):
    """A plan is the signature's: other shapes, dtypes, a start misaligned by an element (another
    vector head) or another wanted set each learn their own on their first backward; a saved input
    that is not contiguous always takes the Python path (its kernel reads a copy); create_graph
    still raises the Python path's error after the plan is known; and every gradient is the custom
    op's."""
    native()
    op = user_fma()
    gen = torch.Generator().manual_seed(5)
    base = (torch.rand(9, 65, generator=gen, dtype=torch.float64) + 0.5).to(device)
    wb = (torch.rand(65, generator=gen, dtype=torch.float64) - 0.25).to(device)

    def check(x, w, expect_runs):
        x = x.detach().requires_grad_()
        w = w.detach().requires_grad_()
        y = op(x, w, 0.5)
        g = torch.rand(y.shape, generator=gen, dtype=torch.float64).to(y)
        got, runs = _plan_runs(lambda: torch.autograd.grad(y, (x, w), g))
        assert runs == expect_runs, (x.shape, x.dtype, x.data_ptr() % 16)
        via = getattr(torch.ops.ewkern_user, op._name)(x, w, 0.5)
        for a, b in zip(got, torch.autograd.grad(via, (x, w), g)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)

    flat, w585 = (torch.rand(n, generator=gen, dtype=torch.float64).to(device) + 0.5 for n in (600, 585))
    for x, w in ((base, wb), (base.float(), wb.float()), (base[:, 1:].contiguous(), wb[1:]), (flat[2:587], w585),
                 (flat[1:586], w585)):   # the last: the same shape a float64 off (another vector head)
        check(x, w, 0)
        check(x, w, 1)
    check(base.t(), wb[:9], 0)                                       # not contiguous: Python each time
    (_, fruns) = _plan_runs(lambda: check(base.t(), wb[:9], 0), forward=True)
    assert fruns == 0
    x = base.detach().requires_grad_()
    w = wb.detach().requires_grad_()
    y = op(x, w, 0.5)
    _, runs = _plan_runs(lambda: torch.autograd.grad(y, x, torch.ones_like(y)))   # another wanted set
    assert runs == 0
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(op(x, w, 0.5).sum(), x, create_graph=True)


@pytest.mark.parametrize("kind", ["elementwise", "rows"])
def test_user_backward_reads_an_incoming_gradient_with_the_negative_bit(kind):
    """A gradient with the negative bit (grad_outputs=torch._neg_view(t)) holds -g in memory: a user
    op's C++ node refused it on the first backward of a signature (the Python kernels' ValueError)
    and, once the signature had a plan, read it as it lay (a gradient of the wrong sign, silently).
    The node resolves the bit first: the gradients of g, by the Python path and by the plan."""
    native()
    op = user_fma() if kind == "elementwise" else user_rmsnorm()
    scalar = 0.75 if kind == "elementwise" else 1e-5
    gen = torch.Generator().manual_seed(5)
    x = (torch.rand(7, 40, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    w = (torch.rand(40, generator=gen, dtype=torch.float64) - 0.25).requires_grad_()
    g = torch.rand(7, 40, generator=gen, dtype=torch.float64) - 0.5
    want = torch.autograd.grad(getattr(torch.ops.ewkern_user, op._name)(x, w, scalar), (x, w), g)
    for k in range(3):      # the first call by the Python kernels, the later ones by the plan
        got = torch.autograd.grad(op(x, w, scalar), (x, w), torch._neg_view(-g))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"call {k}: {m}")
