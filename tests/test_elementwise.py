"""Every elementwise op x dtype x backend against the float64 NumPy reference, NaN/inf
propagation, in-place aliasing, and every CUDA variant on awkward sizes and misaligned starts."""
import importlib.util
import re
import zlib

import ml_dtypes
import numpy as np
import pytest

import ewkern
from conftest import HAS_CUDA, device_params
from dlpack_util import offset_view
from reference import DTYPES, EPS, TINY, assert_close, np_dtype, random_input, reference

OPS = {d["name"]: d for d in ewkern.ops() if d["family"] == "elementwise"}
SCALARS = {"add_const": (1.75,), "mul_const": (-0.375,), "axpby": (1.5, -0.25), "fill": (2.625,)}

# Accuracy bound in ulp of the output dtype (the docstrings state the same). Exact ops are
# exact; arithmetic is correctly rounded in float32/float64 (1 ulp covers the float32 -> half
# double rounding); transcendental ops are bounded by the CUDA/libm float32 functions they use.
ULPS = {"copy": 0, "fill": 0, "neg": 0, "abs": 0, "relu": 0, "maximum": 0, "minimum": 0,
        "add": 1, "sub": 1, "mul": 1, "div": 1, "add_const": 1, "mul_const": 1, "axpby": 2,
        "exp": 3, "log": 4, "sqrt": 1, "rsqrt": 2, "erf": 4, "tanh": 4, "sigmoid": 4, "gelu": 4, "silu": 5}
# ops whose error is bounded relative to the size of their terms rather than the result
TERM_SCALED = {"axpby"}


def ulp_bound(op, xs):
    """gelu's condition number grows like a^2 for a << 0: rounding a / sqrt(2) (in the kernel, and
    in the float64 reference itself) costs up to about a^2 / 2 ulp each, so its bound is
    4 + 2 a^2 ulp (ulp here is eps x the value, up to twice the true spacing)."""
    if op == "gelu":
        return ULPS[op] + 2 * np.asarray(xs[0], dtype=np.float64) ** 2
    return ULPS[op]


def op_args(op, rng, shape, dtype):
    n_in = OPS[op]["inputs"]
    xs = [random_input(rng, shape, dtype, op) for _ in range(n_in)]
    return xs, SCALARS.get(op, ())


def call(op, inputs, scalars, out=None, **kw):
    fn = getattr(ewkern, op)
    if op == "fill":
        return fn(out, *scalars, **kw)
    return fn(*inputs, *scalars, out=out, **kw) if out is not None else fn(*inputs, *scalars, **kw)


def check(op, got, xs, scalars, dtype, what):
    if op == "fill":
        want = np.full(np.asarray(got).shape, scalars[0])
    else:
        # the reference sees the inputs as the dtype holds them
        want = reference(op, *xs, scalars=scalars)
    if op in TERM_SCALED:
        a, b = (np.asarray(x, dtype=np.float64) for x in xs)
        scale = np.abs(scalars[0] * a) + np.abs(scalars[1] * b)
        err = np.abs(np.asarray(got).astype(np.float64) - want)
        assert np.all(err <= ULPS[op] * EPS[dtype] * scale + TINY[dtype]), what
        return
    assert_close(got, want, dtype, ulp_bound(op, xs), what)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(OPS))
def test_op_against_numpy(op, dtype, device):
    rng = np.random.default_rng(zlib.crc32(f"{op} {dtype}".encode()))   # the same inputs in every run
    for shape in [(0,), (1,), (7,), (1023,), (2**20 + 3,), (3, 5, 7)]:
        xs, sc = op_args(op, rng, shape, dtype)
        ins = [ewkern.asarray(x, device=device) for x in xs]
        out = ewkern.full(shape, 99.0, dtype=dtype, device=device)
        res = call(op, ins, sc, out=out)
        assert res is out
        check(op, out.numpy(), xs, sc, dtype, f"{op} {dtype} {device} {shape}")
        if op != "fill":
            r2 = call(op, ins, sc)
            assert isinstance(r2, ewkern.Array) and r2.shape == shape and r2.dtype == dtype
            check(op, r2.numpy(), xs, sc, dtype, f"{op} {dtype} {device} {shape} (new result)")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(set(OPS) - {"fill"}))
def test_in_place_alias(op, dtype, device):
    """out= aliasing the first input (a += b) works for every op."""
    rng = np.random.default_rng(11)
    xs, sc = op_args(op, rng, (4099,), dtype)
    ins = [ewkern.asarray(x.copy(), device=device) for x in xs]
    assert call(op, ins, sc, out=ins[0]) is ins[0]
    check(op, ins[0].numpy(), xs, sc, dtype, f"{op} in place")


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.5, -2.0, 1e-3, 3.0, -0.0], dtype=np.float64)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(set(OPS) - {"fill", "copy"}))
def test_nan_inf_propagate_like_numpy(op, dtype, device):
    n_in = OPS[op]["inputs"]
    a = np.repeat(SPECIALS, len(SPECIALS)).astype(np_dtype(dtype))
    b = np.tile(SPECIALS, len(SPECIALS)).astype(np_dtype(dtype))
    xs = [a, b][:n_in]
    sc = SCALARS.get(op, ())
    got = call(op, [ewkern.asarray(x, device=device) for x in xs], sc).numpy()
    want = reference(op, *xs, scalars=sc).astype(np_dtype(dtype)).astype(np.float64)
    got = got.astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{op}: NaN positions"
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), f"{op}: inf positions/signs"


def stated_ulps(op):
    """The bound ewkern states for op (ewkern.ops() and the docstring), in ulp."""
    acc = OPS[op]["accuracy"]
    if acc.startswith("exact") or acc.startswith("the value rounded once"):
        return 0
    m = re.match(r"within (\d+)( \+ 2 a\^2)? ulp", acc)
    assert m, f"{op}: unparsed accuracy {acc!r}"
    return int(m.group(1))


def test_fill_value_conversion_and_docstrings():
    x = ewkern.empty((5,), dtype="float16", device="cpu")
    ewkern.fill(x, 65536.0)  # overflows float16
    assert np.isinf(x.numpy()).all()
    for name in OPS:
        doc = getattr(ewkern, name).__doc__
        assert OPS[name]["definition"] in doc
        assert "Accuracy: " + OPS[name]["accuracy"] in " ".join(doc.split())
        # the bound the tests assert is the one the docstring states
        assert stated_ulps(name) == ULPS[name], name
    assert "a^2" in OPS["gelu"]["accuracy"] and "MUFU.LG2" in OPS["log"]["accuracy"]


UNARY = sorted(op for op in OPS if OPS[op]["inputs"] == 1 and op != "copy")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", UNARY)
def test_every_16bit_input(op, dtype, device):
    """Every finite float16/bfloat16 value through each one-input op, against the float64
    reference within the stated bound (random inputs can miss the worst cases, e.g. log just
    below and above 1, subnormal inputs); the vector body and the scalar edge both run."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np_dtype(dtype))
    with np.errstate(invalid="ignore"):
        x = x[np.isfinite(x.astype(np.float64))]
    x = x[1:]  # an odd count from an odd start: head, vectors and tail elements
    sc = SCALARS.get(op, ())
    want = reference(op, x, scalars=sc)
    # results at the dtype's largest finite value may round either way to it or to inf
    big = float(ml_dtypes.finfo(np_dtype(dtype)).max)
    edge = np.abs(want) >= big
    got = call(op, [ewkern.asarray(x, device=device)], sc).numpy()
    keep = ~edge
    check(op, got[keep], [x[keep]], sc, dtype, f"{op} {dtype} {device}, every value")


# ---- CUDA variants -------------------------------------------------------------------------------

VARIANT_SIZES = [0, 1, 3, 4, 5, 8 * 37 + 7, 2**20 + 3]


def cuda_variant_params():
    if not HAS_CUDA:
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason="no CUDA GPU"))]
    params = []
    for op in sorted(OPS):
        for dtype in DTYPES:
            for v in ewkern.variants(op, dtype=dtype):
                params.append(pytest.param(op, dtype, v, id=f"{op}-{dtype}-{v}"))
    return params


def _float64_awkward(op):
    """float64 inputs where the float64 math of sigmoid/silu/gelu is fragile: gelu for x << 0 (no
    cancellation allowed down to where results underflow, -38.6), around its clamp (|x| = 40) and
    near 0; sigmoid/silu where e^-|x| turns subnormal (|x| > 708) and 1 + e^x rounds to 1; subnormal,
    huge, infinite and NaN inputs."""
    tiny = [5e-324, 1e-320, 2.0**-1022, 1e-300, 1e-200, 1e-20, 2.0**-30, 1e-8, 1e-3]
    edges = tiny + [0.25, 0.5, 1.0, 2.0, 3.0, 1e10, 1e300, 1.7976931348623157e308, np.inf]
    x = [0.0, -0.0, np.nan] + edges + [-v for v in edges]
    if op == "gelu":
        x += list(np.linspace(-40.0, -5.0, 35001)) + list(np.linspace(-5.0, 6.0, 22001))
        x += list(np.linspace(-38.7, -37.3, 2001)) + list(np.linspace(39.99, 40.01, 201))
        x += list(np.linspace(-40.01, -39.99, 201)) + list(np.linspace(-1e-3, 1e-3, 2001))
    else:
        x += list(np.linspace(-746.0, -700.0, 4601)) + list(np.linspace(-260.0, -250.0, 1001))
        x += list(np.linspace(-40.0, 40.0, 8001)) + list(np.linspace(700.0, 746.0, 461))
    return np.array(x, dtype=np.float64)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("op", ["gelu", "sigmoid", "silu"])
def test_float64_awkward_inputs(op, device):
    """float64 gelu/sigmoid/silu on the inputs of _float64_awkward, within the stated bound (gelu:
    4 + 2 a^2 ulp; an erf form 1 + erf(x / sqrt 2) would be off by ~1e6 ulp at x = -5), NaN and inf
    where the ops.def formula gives them (gelu(-inf) = NaN, gelu(inf) = inf, silu(-inf) = NaN).
    On the GPU this checks the float64 forms of elementwise_ops.cuh (gelu_f64, the branch-free
    m_div_1to2); the vector body and the scalar edge both run (odd length, offset view)."""
    x = _float64_awkward(op)
    want = reference(op, x)
    with np.errstate(over="ignore"):
        # |x| > 1000: gelu is x or 0 exactly; 4 ulp there keeps the tolerance from overflowing
        bound = np.where(np.abs(x) > 1e3, 4.0, ulp_bound(op, [x]))
    for view in (False, True):
        arr = ewkern.asarray(np.concatenate([[0.5], x]) if view else x, device=device)
        if view:
            arr = offset_view(arr, 1, x.size)
        got = call(op, [arr], ()).numpy()
        assert_close(got, want, "float64", bound, f"{op} float64 {device} awkward (offset {view})")
    if op == "gelu":
        g = call(op, [ewkern.asarray(np.array([np.inf, -np.inf, np.nan, -40.0, -1e6]), device=device)], ()).numpy()
        assert g[0] == np.inf and np.isnan(g[1]) and np.isnan(g[2]) and g[3] == 0.0 and g[4] == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("op, dtype, variant", cuda_variant_params())
def test_cuda_variant(op, dtype, variant):
    rng = np.random.default_rng(7)
    naive = variant.startswith("Naive")
    for n in VARIANT_SIZES[:-1] if naive else VARIANT_SIZES:
        for offset in (0, 1, 3):
            xs, sc = op_args(op, rng, (n,), dtype)
            ins = []
            for x in xs:
                pad = np.full(offset, 1.5, dtype=x.dtype)
                base = ewkern.asarray(np.concatenate([pad, x]) if offset else x, device="cuda:0")
                ins.append(offset_view(base, offset, n) if offset else base)
            ob = ewkern.full((n + 2,), 77.0, dtype=dtype, device="cuda:0")
            out = offset_view(ob, 1, n)   # misaligned output too; guards around it
            call(op, ins, sc, out=out, variant=variant)
            check(op, out.numpy(), xs, sc, dtype, f"{op} {variant} n={n} offset={offset}")
            guard = ob.numpy().astype(np.float64)
            assert guard[0] == 77.0 and guard[-1] == 77.0, f"{variant} wrote outside its output"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("variant", ["auto", "auto_wb"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("op", ["add", "copy", "log"])
def test_auto_grid_shapes(op, dtype, variant):
    """auto picks 1, 2 or 4 vectors per thread from the device's waves (SMs x threads per SM):
    sizes around 0.6, 1.5, 3.9 and 5 waves take each path, with a misaligned start so the
    head and tail land on the last block's spare threads; with PDL on (1 vector prefetched at 3.9
    waves, or 4 without the prefetch where the memory moves >= 30 GB/s an SM, the H200) and off
    (4 vectors at 3.9 waves where the 4-vector kernel fills a wave)."""
    if variant == "auto_wb" and dtype == "float64":
        pytest.skip("auto_wb (a study variant) has no float64 kernels")
    info = ewkern.device_info("cuda:0")
    per_wave = info["sm_count"] * info["max_threads_per_sm"]
    vec = 16 // np.dtype(np_dtype(dtype)).itemsize
    rng = np.random.default_rng(11)
    cases = [(w, pdl) for pdl in (True, False) for w in (0.6, 1.5, 3.9, 5.0)]
    for waves, pdl in cases:
        prev = ewkern.set_pdl(pdl)
        try:
            _auto_grid_case(op, dtype, variant, rng, waves, per_wave, vec)
        finally:
            ewkern.set_pdl(prev)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("op", ["exp", "sigmoid", "silu", "log", "tanh", "erf", "gelu"])
def test_auto_float64_math_plans(op):
    """float64 libm-class math takes its class's vectors per thread (exp and sigmoid 1 at any
    size, silu 4 past 8 waves, log, tanh and erf 1 up to 4 waves and 2 beyond, gelu 1 up to 2
    waves and 4 beyond): sizes at 0.3, 0.6, 1.5, 2.5, 3.9, 5 and 9 waves reach each, misaligned,
    PDL on and off."""
    info = ewkern.device_info("cuda:0")
    per_wave = info["sm_count"] * info["max_threads_per_sm"]
    rng = np.random.default_rng(12)
    for pdl in (True, False):
        prev = ewkern.set_pdl(pdl)
        try:
            for waves in (0.3, 0.6, 1.5, 2.5, 3.9, 5.0, 9.0):
                _auto_grid_case(op, "float64", "auto", rng, waves, per_wave, 2)
        finally:
            ewkern.set_pdl(prev)


def _auto_grid_case(op, dtype, variant, rng, waves, per_wave, vec):
    """One auto call at `waves` device waves from a misaligned start, with guard elements."""
    n = int(waves * per_wave) * vec + 5
    xs, sc = op_args(op, rng, (n,), dtype)
    ins = [offset_view(ewkern.asarray(np.concatenate([np.ones(1, x.dtype), x]), device="cuda:0"), 1, n)
           for x in xs]
    ob = ewkern.full((n + 2,), 77.0, dtype=dtype, device="cuda:0")
    out = offset_view(ob, 1, n)
    call(op, ins, sc, out=out, variant=variant)
    check(op, out.numpy(), xs, sc, dtype, f"{op} {variant} {dtype} {waves} waves n={n}")
    guard = ob.numpy().astype(np.float64)
    assert guard[0] == 77.0 and guard[-1] == 77.0, f"{variant} wrote outside its output"


def test_variant_listing_and_errors():
    assert ewkern.variants("add", device="cpu") == ["auto"]
    with pytest.raises(ValueError, match="unknown variant"):
        ewkern.add(np.ones(3, np.float32), np.ones(3, np.float32), variant="ThreadBlockIV4U4MRgs_nope")
    if HAS_CUDA:
        assert "auto" in ewkern.variants("add")
        info = ewkern.kernel_info("add", "auto", "float32")
        assert info["num_regs"] > 0 and info["max_threads_per_block"] >= 32


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_variant_dtype_not_supported():
    f16 = [v for v in ewkern.variants("add", dtype="float16") if v != "auto"]
    f32only = [v for v in ewkern.variants("add", dtype="float32") if v not in ewkern.variants("add", dtype="float16")]
    if not f32only:
        pytest.skip("every add variant supports float16")
    x = ewkern.full((10,), 1.0, dtype="float16", device="cuda:0")
    with pytest.raises(TypeError, match="does not support dtype float16"):
        ewkern.add(x, x, variant=f32only[0])
    assert f16 is not None


@pytest.mark.serial
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not (HAS_CUDA and importlib.util.find_spec("torch")), reason="needs a CUDA GPU and torch")
def test_more_than_2_31_elements():
    """2^31 + 5 elements: 64-bit indexing in the default path and every variant that can take
    it; a variant limited to 32-bit indices must refuse clearly rather than write wrong data."""
    import torch
    n = 2**31 + 5
    free = torch.cuda.mem_get_info()[0]
    if free < 3 * 4 * n + (2 << 30):
        pytest.skip("not enough GPU memory for three float32 arrays of 2^31 + 5 elements")
    for dtype in ("float16", "float32"):
        tdt = getattr(torch, dtype)
        a = torch.randn(n, device="cuda", dtype=tdt)
        b = torch.randn(n, device="cuda", dtype=tdt)
        want = a + b
        out = torch.empty_like(a)
        for v in ewkern.variants("add", dtype=dtype):
            if v.startswith("Naive"):
                continue  # one thread over 2^31 elements takes minutes
            out.fill_(7)
            try:
                ewkern.add(a, b, out=out, variant=v)
            except ValueError as e:
                assert "2^31" in str(e) or "32-bit" in str(e), f"{v}: unclear refusal {e}"
                continue
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"add {v} {dtype} wrong at n = 2^31 + 5"
        c = ewkern.copy(a)
        assert torch.equal(c, a)
        if dtype == "float16":
            # a transcendental op takes auto's other vectors-per-thread rule
            del b, want
            x = a.abs().add_(0.5)
            got = ewkern.log(x, out=out)
            torch.cuda.synchronize()
            torch.testing.assert_close(got, torch.log(x), rtol=2e-3, atol=1e-3,
                                       msg="log float16 wrong at n = 2^31 + 5")
            del x, got
            b = want = None
        del a, b, want, out, c
        torch.cuda.empty_cache()
    # float64 libm-class math past 2^31 elements: the 64-bit instance of tanh's kernel, whose math
    # runs ahead of the store guard (elementwise_kernel.cuh, MathFirst), and exp's, which keeps it
    if free >= 3 * 8 * n + (2 << 30):
        x = torch.rand(n, device="cuda", dtype=torch.float64).mul_(6).sub_(3)
        for op in ("tanh", "exp"):
            got = getattr(ewkern, op)(x, out=torch.full_like(x, float("nan")))   # NaN where unwritten
            want = getattr(torch, op)(x)
            torch.cuda.synchronize()
            step = 1 << 27   # compared in pieces: assert_close's temporaries of 2^31 float64 do not fit
            for s in range(0, n, step):
                torch.testing.assert_close(got[s:s + step], want[s:s + step], rtol=4e-16, atol=0,
                                           msg=f"{op} float64 wrong at n = 2^31 + 5, from element {s}")
            del got, want
        del x
        torch.cuda.empty_cache()
