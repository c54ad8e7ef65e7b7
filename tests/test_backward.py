"""The backward ops (csrc/grads.def, ewkern.<op>_backward and ewkern.rmse_backward) on every
backend and dtype against their float64 NumPy formulas, within the bounds the docstrings state:
awkward sizes, misaligned starts, in-place gradients, output_mask, NaN/inf, and bad input."""
import re
import zlib

import ml_dtypes
import numpy as np
import pytest

import ewkern
from conftest import HAS_CUDA, device_params
from dlpack_util import offset_view
from reference import (DTYPES, EPS, GRAD_SCALE, TINY, assert_close, grad_reference, np_dtype,
                       random_input, reference, rmse_grad_reference, rmse_reference)

GRADS = {d["name"]: d for d in ewkern.ops() if d["family"] == "backward"}
SCALARS = {"axpby_backward": (1.5, -0.25)}
# what each op's saved arguments are: the forward's input (a) or result (y), and its name
FORWARD = {name: name[: -len("_backward")] for name in GRADS}
# the bound in ulp each output is tested to (the docstrings state the same, test_stated_bounds)
ULPS = {"gelu_backward": 4, "silu_backward": 6, "sigmoid_backward": 2, "tanh_backward": 2,
        "erf_backward": 4, "exp_backward": 1, "log_backward": 1, "sqrt_backward": 1, "rsqrt_backward": 2,
        "abs_backward": 0, "relu_backward": 0, "mul_backward": (1, 1), "div_backward": (1, 2),
        "maximum_backward": (0, 0), "minimum_backward": (0, 0), "axpby_backward": (1, 1)}
SIZES = [(0,), (1,), (7,), (1023,), (2**20 + 3,), (3, 5, 7)]


def saved_args(op, rng, shape, dtype):
    """grad plus what the forward op saved, in the dtype: its inputs or its result y = f(a)."""
    info = GRADS[op]
    names = info["args"]
    g = random_input(rng, shape, dtype)
    fwd = FORWARD[op]
    if names[1:] == ["y"]:
        a = random_input(rng, shape, dtype, fwd)
        y = reference(fwd, a).astype(np_dtype(dtype))
        return [g, y]
    if op == "gelu_backward":
        # x << 0 included: gelu's derivative falls like x phi(x) there
        a = (rng.standard_normal(shape) * 4.0).astype(np_dtype(dtype))
        return [g, a]
    return [g] + [random_input(rng, shape, dtype, fwd) for _ in names[1:]]


def ulp_bounds(op, xs):
    u = ULPS[op]
    u = u if isinstance(u, tuple) else (u,)
    if op == "gelu_backward":
        return (u[0] + 2 * np.asarray(xs[1], dtype=np.float64) ** 2,)
    return u


def check(op, got, xs, sc, dtype, what):
    """got: a tuple with one entry per output (None where not asked for)."""
    want = grad_reference(op, *xs, scalars=sc)
    bounds = ulp_bounds(op, xs)
    for k, (g, w) in enumerate(zip(got, want)):
        if g is None:
            continue
        g = np.asarray(g)
        if op in GRAD_SCALE:
            scale = GRAD_SCALE[op](*(np.asarray(x, dtype=np.float64) for x in xs))
            err = np.abs(g.astype(np.float64) - w)
            fin = np.isfinite(w)
            assert np.array_equal(np.isnan(g.astype(np.float64)), np.isnan(w.astype(np_dtype(dtype)).astype(np.float64))), what
            tol = np.broadcast_to(bounds[k], w.shape)[fin] * EPS[dtype] * scale[fin] + TINY[dtype]
            bad = err[fin] > tol
            assert not bad.any(), (f"{what}: {bad.sum()} values off, got {g[fin][bad][:4]}, want {w[fin][bad][:4]}, "
                                   f"a {np.asarray(xs[1])[fin][bad][:4]}")
        else:
            assert_close(g, w, dtype, bounds[k], f"{what} output {k}")


def call(op, arrays, sc, **kw):
    r = getattr(ewkern, op)(*arrays, *sc, **kw)
    return r if isinstance(r, tuple) else (r,)


def as_numpy(r):
    return tuple(None if x is None else np.asarray(x.numpy() if isinstance(x, ewkern.Array) else x) for x in r)


def test_backward_ops_listed():
    assert set(GRADS) == set(ULPS)
    for op, info in GRADS.items():
        assert info["outputs"] == (2 if isinstance(ULPS[op], tuple) else 1), op
        assert info["args"][0] == "grad"
        assert len(info["args"]) == info["inputs"]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(ULPS))
def test_backward_against_numpy(op, dtype, device):
    rng = np.random.default_rng(zlib.crc32(f"{op} {dtype}".encode()))   # the same inputs in every run
    sc = SCALARS.get(op, ())
    for shape in SIZES:
        xs = saved_args(op, rng, shape, dtype)
        ins = [ewkern.asarray(x, device=device) for x in xs]
        got = as_numpy(call(op, ins, sc))
        assert all(isinstance(g, np.ndarray) and g.shape == shape for g in got)
        check(op, got, xs, sc, dtype, f"{op} {dtype} {device} {shape}")
        # NumPy in, NumPy out, the same values
        got_np = call(op, xs, sc) if device == "cpu" else None
        if got_np is not None:
            assert all(isinstance(g, np.ndarray) and g.dtype == np_dtype(dtype) for g in got_np)
            check(op, got_np, xs, sc, dtype, f"{op} {dtype} numpy in")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("op", sorted(ULPS))
def test_backward_out_and_in_place(op, dtype, device):
    """out= is written and returned; the gradient may be written over grad itself."""
    rng = np.random.default_rng(5)
    sc = SCALARS.get(op, ())
    xs = saved_args(op, rng, (4099,), dtype)
    nout = GRADS[op]["outputs"]
    ins = [ewkern.asarray(x.copy(), device=device) for x in xs]
    outs = [ewkern.full((4099,), 99.0, dtype=dtype, device=device) for _ in range(nout)]
    res = call(op, ins, sc, out=outs[0] if nout == 1 else tuple(outs))
    assert all(r is o for r, o in zip(res, outs))
    check(op, as_numpy(res), xs, sc, dtype, f"{op} out=")
    # in place over grad (the first gradient)
    res = call(op, ins, sc, out=ins[0] if nout == 1 else (ins[0], outs[1]))
    assert res[0] is ins[0]
    check(op, as_numpy(res), xs, sc, dtype, f"{op} in place")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("op", sorted(op for op in ULPS if GRADS[op]["outputs"] == 2))
def test_output_mask(op, device):
    """output_mask=(True, False) computes only a's gradient: b's slot is None and its out= is
    left untouched; (False, True) the reverse; (False, False) is refused."""
    rng = np.random.default_rng(9)
    sc = SCALARS.get(op, ())
    xs = saved_args(op, rng, (1001,), "float32")
    ins = [ewkern.asarray(x, device=device) for x in xs]
    for mask in ((True, False), (False, True)):
        guard = ewkern.full((1001,), 42.0, dtype="float32", device=device)
        outs = (None, guard) if mask == (True, False) else (guard, None)
        res = call(op, ins, sc, output_mask=mask, out=outs)
        assert (res[0] is None) == (not mask[0]) and (res[1] is None) == (not mask[1])
        check(op, as_numpy(res), xs, sc, "float32", f"{op} mask {mask}")
        assert np.all(guard.numpy() == 42.0), "an unasked gradient's out= was written"
        res = call(op, ins, sc, output_mask=mask)
        check(op, as_numpy(res), xs, sc, "float32", f"{op} mask {mask}, new results")
    with pytest.raises(ValueError, match="output_mask"):
        call(op, ins, sc, output_mask=(False, False))
    with pytest.raises(TypeError, match="output_mask"):
        call(op, ins, sc, output_mask="ab")


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.5, -2.0, 1e-3, 3.0, -0.0, 0.0], dtype=np.float64)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(ULPS))
def test_backward_nan_inf(op, dtype, device):
    """Every pair (and triple) of special values: NaN and inf where the float64 formula has them."""
    k = GRADS[op]["inputs"]
    grid = np.stack(np.meshgrid(*([SPECIALS] * k), indexing="ij")).reshape(k, -1)
    xs = [row.astype(np_dtype(dtype)) for row in grid]
    sc = SCALARS.get(op, ())
    got = as_numpy(call(op, [ewkern.asarray(x, device=device) for x in xs], sc))
    want = grad_reference(op, *xs, scalars=sc)
    for g, w in zip(got, want):
        g = g.astype(np.float64)
        w = w.astype(np_dtype(dtype)).astype(np.float64)
        assert np.array_equal(np.isnan(g), np.isnan(w)), f"{op} {dtype}: NaN positions {np.flatnonzero(np.isnan(g) != np.isnan(w))[:6]} of {grid[:, np.isnan(g) != np.isnan(w)][:, :3]}"
        inf = np.isinf(w)
        assert np.array_equal(g[inf], w[inf]), f"{op} {dtype}: inf positions/signs"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(op for op in ULPS if GRADS[op]["inputs"] == 2))
def test_every_16bit_saved_value(op, dtype, device):
    """Every finite float16/bfloat16 value as the saved argument, with grad 1.25 (exact), against
    the stated bound: random values miss the edges (tanh's y near 1, gelu's tail, subnormals)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np_dtype(dtype))
    with np.errstate(invalid="ignore"):
        x = x[np.isfinite(x.astype(np.float64))][1:]
    if GRADS[op]["args"][1] == "y":
        fwd = FORWARD[op]
        lo, hi = {"sigmoid": (0, 1), "tanh": (-1, 1), "exp": (0, np.inf), "sqrt": (0, np.inf),
                  "rsqrt": (0, np.inf), "relu": (-np.inf, np.inf)}[fwd]
        xf = x.astype(np.float64)
        x = x[(xf >= lo) & (xf <= hi)]
    g = np.full(x.shape, 1.25, dtype=np_dtype(dtype))
    xs = [g, x]
    want = grad_reference(op, *xs)[0]
    big = float(ml_dtypes.finfo(np_dtype(dtype)).max)
    keep = np.abs(want) < big
    got = as_numpy(call(op, [ewkern.asarray(v, device=device) for v in xs], ()))
    check(op, (got[0][keep],), [g[keep], x[keep]], (), dtype, f"{op} {dtype} {device}, every value")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(ULPS))
def test_backward_misaligned(op, dtype):
    """Starts offset by 0, 1 and 3 elements (inputs and outputs), guard elements around."""
    rng = np.random.default_rng(3)
    sc = SCALARS.get(op, ())
    nout = GRADS[op]["outputs"]
    for n in (1, 5, 8 * 37 + 7, 2**18 + 3):
        for offset in (0, 1, 3):
            xs = saved_args(op, rng, (n,), dtype)
            ins = [offset_view(ewkern.asarray(np.concatenate([np.full(offset, 1.5, x.dtype), x]), device="cuda:0"),
                               offset, n) for x in xs]
            bases = [ewkern.full((n + 2,), 77.0, dtype=dtype, device="cuda:0") for _ in range(nout)]
            outs = [offset_view(b, 1, n) for b in bases]
            res = call(op, ins, sc, out=outs[0] if nout == 1 else tuple(outs))
            check(op, as_numpy(res), xs, sc, dtype, f"{op} n={n} offset={offset}")
            for b in bases:
                guard = b.numpy().astype(np.float64)
                assert guard[0] == 77.0 and guard[-1] == 77.0, f"{op} wrote outside its output"


def test_backward_errors():
    g = np.ones(5, np.float32)
    with pytest.raises(ValueError, match="shape mismatch"):
        ewkern.gelu_backward(g, np.ones(6, np.float32))
    with pytest.raises(TypeError, match="dtype mismatch"):
        ewkern.mul_backward(g, g, np.ones(5, np.float64))
    with pytest.raises(TypeError, match="missing required argument"):
        ewkern.mul_backward(g, g)
    with pytest.raises(TypeError, match="out"):
        ewkern.mul_backward(g, g, g, out=np.empty(5, np.float32))   # two gradients: a pair of arrays
    with pytest.raises(ValueError, match="out"):
        ewkern.gelu_backward(g, g, out=np.empty(4, np.float32))
    with pytest.raises(TypeError, match="real number"):
        ewkern.axpby_backward(g, "2", 1.0)
    # nothing was written on failure
    o = np.full(5, 3.0, np.float32)
    with pytest.raises(ValueError):
        ewkern.mul_backward(g, g, np.ones(6, np.float32), out=(o, None))
    assert np.all(o == 3.0)


def test_stated_bounds():
    """Each docstring states the bound the tests assert."""
    for op, info in GRADS.items():
        doc = " ".join(getattr(ewkern, op).__doc__.split())
        assert info["definition"] in doc and info["accuracy"] in doc, op
        acc = info["accuracy"]
        if acc.startswith("exact"):
            assert ULPS[op] in (0, (0, 0)), op
            continue
        nums = [int(x) for x in re.findall(r"(\d+)(?: \+ 2 a\^2)? ulp", acc)]
        want = ULPS[op] if isinstance(ULPS[op], tuple) else (ULPS[op],)
        assert tuple(nums) == want or (len(nums) == 1 and all(n == nums[0] for n in want)), (op, acc)


# ---- rmse_backward ------------------------------------------------------------------------------

RMSE_CASES = [((16, 33), None), ((5, 3, 7), (1, 2)), ((64, 8), (0,)), ((3, 4, 5), (0, 1)), ((7,), None),
              ((2, 1024 + 3), None), ((1000, 3), (0,)),
              # past the CPU's pieces of 1024 and its OpenMP threshold, in each kind of row
              ((300, 2049), None), ((2050, 37), (0,)), ((20, 700, 33), (1,))]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmse_backward(dtype, device):
    rng = np.random.default_rng(17)
    rdt = "float64" if dtype == "float64" else "float32"
    for shape, axis in RMSE_CASES:
        a = random_input(rng, shape, dtype)
        b = random_input(rng, shape, dtype)
        red = tuple(range(1, len(shape))) if axis is None and len(shape) > 1 else (axis or (0,))
        r = rmse_reference(a, b, red).astype(rdt)
        gshape = r.shape
        g = random_input(rng, gshape, rdt)
        arrs = [ewkern.asarray(x, device=device) for x in (g, a, b, r)]
        ga, gb = as_numpy(ewkern.rmse_backward(*arrs, axis=axis))
        wa, wb = rmse_grad_reference(g, a, b, r, red)
        assert_close(ga, wa, dtype, 2, f"rmse_backward {dtype} {shape} {axis} grad_a")
        assert_close(gb, wb, dtype, 2, f"rmse_backward {dtype} {shape} {axis} grad_b")
        assert np.array_equal(ga.astype(np.float64), -gb.astype(np.float64))
        only_a = ewkern.rmse_backward(*arrs, axis=axis, output_mask=(True, False))
        assert only_a[1] is None
        assert np.array_equal(as_numpy(only_a)[0].astype(np.float64), ga.astype(np.float64))


def test_rmse_backward_errors():
    a = np.ones((4, 5), np.float32)
    r = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="shape"):
        ewkern.rmse_backward(np.ones(5, np.float32), a, a, r)
    with pytest.raises(TypeError, match="float32"):
        ewkern.rmse_backward(r.astype(np.float64), a, a, r)
    with pytest.raises(ValueError, match="axis"):
        ewkern.rmse_backward(r, a, a, r, axis=5)


@pytest.mark.serial
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_backward_more_than_2_31_elements():
    """2^31 + 5 float16 elements: the 64-bit-index instance of a two-gradient and a one-gradient
    backward kernel, against torch's own float16 arithmetic (mul's products are exact in float32,
    so the two round alike; gelu's within a few 16-bit ulp)."""
    torch = pytest.importorskip("torch")
    n = 2**31 + 5
    free = torch.cuda.mem_get_info()[0]
    if free < 6 * 2 * n + (2 << 30):
        pytest.skip("not enough GPU memory for six float16 arrays of 2^31 + 5 elements")
    g, a, b = (torch.randn(n, device="cuda", dtype=torch.float16) for _ in range(3))
    ga, gb = ewkern.mul_backward(g, a, b)
    torch.cuda.synchronize()
    assert torch.equal(ga, g * b) and torch.equal(gb, g * a), "mul_backward wrong at n = 2^31 + 5"
    del gb, b
    out = ewkern.gelu_backward(g, a, out=ga)
    want = torch.ops.aten.gelu_backward(g, a)
    torch.cuda.synchronize()
    assert out is ga
    torch.testing.assert_close(out, want, rtol=4e-3, atol=1e-4, msg="gelu_backward wrong at n = 2^31 + 5")
    for k in (0, n - 1):   # the first and the last element, where a wrong index would show
        assert abs(float(out[k]) - float(want[k])) <= 4e-3 * abs(float(want[k])) + 1e-4
