"""ewkern.fuse (ewkern/_fuse.py): a Python function of arrays traced once per argument signature
into one ElementwiseKernel (a ReductionKernel with one np.sum, mean, max, min or prod), as
cupy.fuse does. Results against float64 NumPy references on awkward sizes and broadcasts, NumPy's
type rules (NEP 50), ewkern's own ops inside (csrc/ops.c hands a call on a traced value to it), the
refusals, the reductions' CUDA sources through NVRTC, and the kernel as a torch op with a derived
backward."""
import numpy as np
import pytest

import ewkern
from conftest import gpu
from reference import EPS, REF, TINY, np_dtype
from ewkern.rtc import _build, _codegen
from ewkern.rtc._params import DTYPES

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["bool", "int8", "uint8", "int32", "int64", "uint64"]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EWKERN_CACHE_DIR", str(tmp_path / "kernels"))


def rand(shape, dtype, seed, lo=-3.0, hi=3.0):
    x = np.random.default_rng(seed).uniform(lo, hi, shape)
    return x.astype(np_dtype(dtype))


def assert_close(out, ref, dtype, ulps):
    """|out - ref| <= ulps eps (|ref| + 1): each operation rounds once in its compute type (16-bit
    in float32, rounded where stored)."""
    out = np.asarray(out).astype(np.float64)
    bound = ulps * EPS[dtype] * (np.abs(ref) + 1.0) + TINY[dtype]
    bad = np.abs(out - ref) > bound
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: worst {np.max(np.abs(out - ref) / bound):.2f} bounds"


@ewkern.fuse
def fma(a, b, c):
    return a * b + c


@ewkern.fuse(kernel_name="gated")
def swish_gate(a, b):
    return a / (1 + np.exp(-b))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 7, 1001, 4099])
def test_fma_matches_float64(dtype, n):
    a, b, c = (rand(n, dtype, s) for s in (1, 2, 3))
    r = fma(a, b, c)
    assert r.dtype == np_dtype(dtype) and r.shape == (n,)
    f = [x.astype(np.float64) for x in (a, b, c)]
    assert_close(r, f[0] * f[1] + f[2], dtype, 2 if dtype == "float64" else 1)


@pytest.mark.parametrize("dtype", FLOATS)
def test_broadcast_row_against_matrix_and_a_misaligned_view(dtype):
    a = rand((33, 17), dtype, 4)
    row = rand(17, dtype, 5)
    big = rand(34 * 17 + 1, dtype, 6)
    view = big[1:].reshape(34, 17)[1:]                  # a start off every vector boundary
    r = swish_gate(view, row)
    f = view.astype(np.float64), row.astype(np.float64)
    assert r.shape == (33, 17)
    assert_close(r, f[0] / (1 + np.exp(-f[1])), dtype, 4 if dtype == "float64" else 2)
    r2 = fma(a, row, 0.25)
    assert_close(r2, a.astype(np.float64) * f[1] + 0.25, dtype, 2)


# ewkern's elementwise ops on traced values, each against its own float64 reference
UNARY = ["copy", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu", "silu"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("op", UNARY)
def test_ewkern_unary_ops_inside(op, dtype):
    positive = op in ("log", "sqrt", "rsqrt")
    x = rand(513, dtype, 7, 0.01 if positive else -6.0, 6.0)
    if op == "gelu":   # the far negative tail, where x (1 + erf) cancels
        x = np.concatenate([x, np.linspace(-12, -4, 64).astype(np_dtype(dtype))])
    fn = ewkern.fuse(lambda a: getattr(ewkern, op)(a) * 1)
    r = fn(x)
    ref = REF[op](x.astype(np.float64))
    ulps = {"exp": 4, "log": 4, "erf": 4, "tanh": 4, "sigmoid": 6, "silu": 8, "rsqrt": 3, "sqrt": 2}.get(op, 1)
    if op == "gelu":
        ulps = 8 + 2 * float(np.max(x.astype(np.float64) ** 2))
    assert_close(r, ref, dtype, ulps)
    if op == "gelu":   # relative accuracy in the tail: gelu(-8) is about -5e-15, not 0
        tail = x.astype(np.float64) < -4
        got, want = np.asarray(r, np.float64)[tail], ref[tail]
        if dtype == "float64":
            assert np.all(np.abs(got - want) <= 1e-10 * np.abs(want))


@pytest.mark.parametrize("op,args,ref", [
    ("add", 2, lambda a, b: a + b), ("sub", 2, lambda a, b: a - b), ("mul", 2, lambda a, b: a * b),
    ("div", 2, lambda a, b: a / b), ("maximum", 2, np.maximum), ("minimum", 2, np.minimum),
])
def test_ewkern_binary_ops_inside(op, args, ref):
    a, b = rand(300, "float32", 8), rand(300, "float32", 9, 0.5, 3.0)
    a[::7] = np.nan   # maximum and minimum carry NaN from either side
    r = ewkern.fuse(lambda x, y: getattr(ewkern, op)(x, y))(a, b)
    want = ref(a.astype(np.float64), b.astype(np.float64))
    assert np.array_equal(np.isnan(r), np.isnan(want))
    ok = ~np.isnan(want)
    assert_close(np.asarray(r)[ok], want[ok], "float32", 1)


def test_ewkern_scalar_ops_inside():
    a, b = rand(100, "float64", 10), rand(100, "float64", 11)
    r = ewkern.fuse(lambda x, y: ewkern.axpby(ewkern.add_const(x, 0.5), ewkern.mul_const(y, 3.0), 2.0, -1.5))(a, b)
    assert_close(r, 2.0 * (a + 0.5) - 1.5 * (3.0 * b), "float64", 4)


def test_numpy_type_rules():
    """NEP 50: a Python scalar takes the array's type; a NumPy scalar is strongly typed; integers
    divide into float64; comparisons give bool."""
    h = rand(10, "float16", 12)
    i = np.arange(1, 11, dtype=np.int32)
    assert fma(h, 2.5, 1).dtype == np.float16
    assert fma(h, np.float64(2.5), 1).dtype == np.float64
    assert fma(h, rand(10, "float32", 13), 1).dtype == np.float32
    half = ewkern.fuse(lambda x: x / 2)(i)
    assert half.dtype == np.float64 and np.array_equal(half, i / 2)
    cmp = ewkern.fuse(lambda x, y: (x < y, np.isnan(y), x == 3))(i, np.where(i > 5, np.nan, 1.0))
    assert [c.dtype for c in cmp] == [np.bool_] * 3
    assert np.array_equal(cmp[0], i < np.where(i > 5, np.nan, 1.0)) and np.array_equal(cmp[1], i > 5)
    assert np.array_equal(cmp[2], i == 3)


def test_python_int_out_of_an_integer_type_raises_and_compares_exactly():
    """NEP 50: a Python int that an integer array's type cannot hold is NumPy's OverflowError in
    arithmetic (an int8 array + 300 gave 45: the argument, an int64 parameter, was cast in C and
    wrapped), on every call of the signature; a comparison takes it exactly (int8 < 300 is True;
    as a constant of the body it had raised, as an argument wrapped to 44)."""
    x = np.array([1, 50, -7, 100], np.int8)
    add = ewkern.fuse(lambda a, s: a + s, kernel_name="int_range_add")
    np.testing.assert_array_equal(add(x, 3), x + 3)
    for s in (300, -129):
        with pytest.raises(OverflowError, match=f"int_range_add: argument 1: Python integer {s} out of bounds for int8"):
            add(x, s)
    with pytest.raises(OverflowError, match="out of bounds for uint8"):
        add(x.astype(np.uint8), -1)
    np.testing.assert_array_equal(add(x.astype(np.int16), 300), x.astype(np.int16) + 300)
    lt = ewkern.fuse(lambda a, s: a < s, kernel_name="int_range_lt")
    consts = ewkern.fuse(lambda a: (a < 300, a > -300, a < 44), kernel_name="int_range_c")
    for dt in ("int8", "uint8", "uint32"):
        y = np.array([1, 50, 0, 100], dt)
        for s in (300, -300, 44, 5):
            np.testing.assert_array_equal(lt(y, s), y < s, err_msg=f"{dt} < {s} (argument)")
        for got, want in zip(consts(y), (y < 300, y > -300, y < 44)):
            np.testing.assert_array_equal(got, want, err_msg=f"{dt} (constants)")


def test_where_and_several_outputs():
    a, b = rand(257, "float32", 14), rand(257, "float32", 15)

    @ewkern.fuse
    def split(x, y, s):
        t = x * y
        return np.where(x > 0, t, s * t), np.maximum(x, y), -t

    r = split(a, b, 0.125)
    f = a.astype(np.float64), b.astype(np.float64)
    assert isinstance(r, tuple) and len(r) == 3
    assert_close(r[0], np.where(f[0] > 0, f[0] * f[1], 0.125 * (f[0] * f[1])), "float32", 2)
    assert np.array_equal(r[1], np.maximum(a, b))
    assert_close(r[2], -(f[0] * f[1]), "float32", 1)


def test_traced_once_per_signature_and_the_scalars_passed_each_call():
    calls = []

    @ewkern.fuse
    def scaled(x, s):
        calls.append(1)
        return x * s + 1.5

    a = rand(64, "float32", 16)
    r1, r2 = scaled(a, 2.0), scaled(a, -3.0)
    assert len(calls) == 1
    assert_close(r1, a.astype(np.float64) * 2 + 1.5, "float32", 1)
    assert_close(r2, a.astype(np.float64) * -3 + 1.5, "float32", 1)
    scaled(a.astype(np.float64), 2.0)
    scaled(a, 2)                     # an int scalar: another signature
    assert len(calls) == 3
    k = scaled.kernel(a, 2.0)
    assert isinstance(k, ewkern.ElementwiseKernel) and k is scaled.kernel(a, 5.0)


def test_a_value_used_twice_is_computed_once():
    """A value used twice at each of 24 steps (inlined, the expression would double 24 times): the
    body is one `const` statement an operation, with the same result; a tree of operations stays
    one expression (the form a backward is derived from)."""
    @ewkern.fuse
    def chain(x):
        for _ in range(24):
            x = x * x * 0.5 + x * 0.25
        return x

    a = rand(100, "float64", 17, 0.1, 0.9)
    want = a.copy()
    for _ in range(24):
        want = want * want * 0.5 + want * 0.25
    r = chain(a)
    body = chain.kernel(a).operation
    assert body.count("const double _ewf_t") == 24 * 4 and body.endswith(f"out0 = _ewf_t{24 * 4 - 1};"), body[-200:]
    assert_close(r, want, "float64", 64)
    assert fma.kernel(a, a, a).operation == "out0 = ((in0 * in1) + in2);"


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_reduction_runs_as_one_reduction_kernel(dtype):
    """One np.sum or np.mean (axis=, keepdims=, or the .sum()/.mean() methods): its input's
    expression is the map, what follows (with scalars) the post map, as a ReductionKernel: the
    mean over rows of (a - b)^2 under a square root is rmse's form."""
    @ewkern.fuse
    def rms_rows(a, b):
        d = a - b
        return np.sqrt(np.mean(d * d, axis=1))

    @ewkern.fuse
    def scaled_colsum(a, s):
        return (a * a).sum(axis=0, keepdims=True) * s

    x, y = rand((9, 1001), dtype, 21), rand((9, 1001), dtype, 22)
    f = x.astype(np.float64), y.astype(np.float64)
    r = rms_rows(x, y)
    assert isinstance(rms_rows.kernel(x, y), ewkern.ReductionKernel) and r.dtype == np_dtype(dtype) and r.shape == (9,)
    # a sum of n terms in the reduction's type (float for 16-bit and float32): about sqrt(n) ulps
    ulps = 4 + 2 * 1001 ** 0.5
    assert_close(r, np.sqrt(((f[0] - f[1]) ** 2).mean(axis=1)), dtype, ulps)
    c = scaled_colsum(x, 0.5)
    assert c.shape == (1, 1001)
    assert_close(c, (f[0] ** 2).sum(axis=0, keepdims=True) * 0.5, dtype, 4)
    m = ewkern.fuse(lambda a: a.mean())(x)
    assert np.asarray(m).shape == ()
    # the mean of values of both signs: the bound scales with their size, not the mean's
    assert abs(float(m) - f[0].mean()) <= ulps * EPS[dtype if dtype == "float64" else "float32"] * np.abs(f[0]).mean() \
        + (EPS[dtype] * abs(f[0].mean()) if dtype in ("float16", "bfloat16") else 0)


# (shape, axis, keepdims): one element, odd sizes, the last, first and a middle axis
REDUCED = [((1,), None, False), ((9, 33), -1, False), ((9, 33), 0, True), ((5, 3, 7), 1, True)]
SPELLED = {"max": (np.max, np.amax, "max"), "min": (np.min, np.amin, "min"), "prod": (np.prod, np.prod, "prod")}


def reduction(kind, k, axis, keepdims):
    """np.<kind> spelt the k-th way of three (the function, its a-name, the method)"""
    how = SPELLED[kind][k % 3]
    if isinstance(how, str):
        return lambda x: getattr(x, how)(axis=axis, keepdims=keepdims)
    return lambda x: how(x, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", ["max", "min", "prod"])
def test_max_min_prod_match_float64(dtype, kind):
    """np.max (np.amax, .max()), min and prod, a product as the map and a scale as the post map,
    in NumPy's shapes and type. max over negative values and min over positive ones (an identity
    of 0 would show) are exact: rounding commutes with them, so the one rounding to the dtype is
    NumPy's. The product of values near +-1: a rounding a multiplication in the reduction's type
    (float for 16-bit), then the store's."""
    lo, hi = {"max": (-3.0, -0.25), "min": (0.25, 3.0), "prod": (0.9, 1.1)}[kind]
    for k, (shape, axis, keepdims) in enumerate(REDUCED):
        a, b = rand(shape, dtype, 30 + k, lo, hi), rand(shape, dtype, 40 + k, *((0.9, 1.1) if kind == "prod" else (0.25, 3.0)))
        if kind == "prod":
            a[np.random.default_rng(50 + k).random(shape) < 0.5] *= -1
        red = reduction(kind, k, axis, keepdims)
        fn = ewkern.fuse(lambda x, y: red(x * y) * 2, kernel_name=f"{kind}{k}")
        r = fn(a, b)
        want = getattr(np, kind)(a.astype(np.float64) * b.astype(np.float64), axis=axis, keepdims=keepdims) * 2
        assert isinstance(fn.kernel(a, b), ewkern.ReductionKernel)
        assert r.dtype == np_dtype(dtype) and np.shape(r) == want.shape, (shape, axis, keepdims)
        if kind == "prod":
            n = a.size // want.size
            assert_close(r, want, dtype, 1 if dtype in ("float16", "bfloat16") else 2 * n + 2)
        else:
            assert np.array_equal(np.asarray(r).astype(np.float64), want.astype(np_dtype(dtype)).astype(np.float64))


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_and_min_carry_nan_as_numpy(dtype):
    """A NaN in what is reduced is the result, as NumPy's max and min give it (fmax's would drop
    it): first, in the middle and last of a row, in a row of -inf; along the rows, across them and
    over all; a row of inf (min's identity) and one of -inf (max's) give themselves."""
    a = rand((6, 9), dtype, 51)
    a[0, 0] = a[1, 4] = a[2, 8] = np.nan
    a[3], a[4] = -np.inf, np.inf
    a[3, 5] = np.nan
    f = a.astype(np.float64)
    rows = ewkern.fuse(lambda x: np.max(x, axis=1))(a)
    np.testing.assert_array_equal(np.asarray(rows, np.float64), f.max(axis=1))
    cols = ewkern.fuse(lambda x: x.min(axis=0, keepdims=True))(a)
    np.testing.assert_array_equal(np.asarray(cols, np.float64), f.min(axis=0, keepdims=True))
    assert np.isnan(cols).sum() == 4
    every = ewkern.fuse(lambda x: np.amin(x))
    assert np.isnan(float(every(a))) and float(every(a[4:5])) == np.inf
    assert np.asarray(ewkern.fuse(lambda x: np.max(x, axis=1))(a[3:5]), np.float64)[1] == np.inf


@pytest.mark.parametrize("dtype", INTS)
def test_integer_and_bool_reductions_in_numpy_types(dtype):
    """Exact, in NumPy's result types: max and min from the type's lowest and highest values (a
    row of each extreme gives it back); prod and sum in int64 (uint64) as NumPy's (int8's 3^5
    does not wrap at 127); mean in float64."""
    rng = np.random.default_rng(60)
    lo, hi = (0, 1) if dtype == "bool" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    ext = rng.integers(lo, hi, (5, 7), dtype=np.dtype(dtype), endpoint=True)
    ext[0], ext[1] = lo, hi
    if dtype == "bool":
        small = rng.random((5, 7)) < 0.8
        small[:, 0] = True
    else:
        small = rng.integers(1, 3, (5, 7), dtype=np.dtype(dtype), endpoint=True)
        small[:, 0] = 3
        if np.iinfo(dtype).min < 0:
            small[rng.random((5, 7)) < 0.4] *= -1
    cases = [(lambda x: np.max(x, axis=1, keepdims=True), ext, lambda x: x.max(axis=1, keepdims=True)),
             (lambda x: x.min(axis=-1), ext, lambda x: x.min(axis=-1)),
             (lambda x: np.prod(x, axis=0), small, lambda x: x.prod(axis=0)),
             (lambda x: x.sum(), small, lambda x: x.sum()),
             (lambda x: np.mean(x, axis=1), small, lambda x: x.mean(axis=1))]
    for k, (fn, x, ref) in enumerate(cases):
        r, want = ewkern.fuse(fn, kernel_name=f"int{k}")(x), ref(x)
        assert np.asarray(r).dtype == want.dtype and np.shape(r) == want.shape, k
        assert np.array_equal(r, want), (k, r, want)


def test_max_and_min_over_an_empty_axis_raise_as_numpy():
    """NumPy's ValueError where max or min reduce no element into an output (the kernel called
    itself gives its identity); an empty result is no error; prod and sum give 1 and 0."""
    top = ewkern.fuse(lambda x: np.max(x, axis=0))
    e = np.zeros((0, 3), np.float32)
    with pytest.raises(ValueError, match="zero-size array to reduction operation maximum"):
        top(e)
    with pytest.raises(ValueError, match="zero-size array to reduction operation minimum"):
        ewkern.fuse(lambda x, y: (x * y).min(keepdims=True))(np.zeros((2, 0), np.int32), 3)
    assert top(np.zeros((3, 0), np.float32)).shape == (0,)
    assert np.all(top.kernel(e)(e, axis=0) == -np.inf)
    p = ewkern.fuse(lambda x: np.prod(x, axis=0))(e)
    assert p.dtype == np.float32 and np.array_equal(p, np.ones(3))
    assert np.array_equal(ewkern.fuse(lambda x: x.sum(axis=0))(np.zeros((0, 3), np.int8)), np.zeros(3))


@pytest.mark.parametrize("dtype", FLOATS + INTS + ["int16", "uint16", "uint32"])
def test_cuda_sources_of_the_reductions_compile(dtype):
    """No GPU needed: the CUDA sources of both reduction engines (the rows engine for inputs dense
    with the reduced axes last, the general kernel for others) with each fused reduction's map,
    reduce expression, identity and type compile under NVRTC (INFINITY, the integers' extremes
    as spelt, 1-byte and bool reduce types)."""
    try:
        _build.nvrtc()
    except RuntimeError as e:
        pytest.skip(str(e))
    x = np.ones((3, 5), np_dtype(dtype))
    for kind in ("max", "min", "prod", "sum", "mean"):
        k = ewkern.fuse(lambda a, s: getattr(np, kind)(a, axis=1) * s, kernel_name=f"cu_{kind}").kernel(x, 2)
        ins = [(p, p.dtype, "array" if p.name == "in0" else "scalar", 0) for p in k.in_params]
        out = _codegen.Layout("strided", 1, [(p, p.dtype, "array", 0) for p in k.out_params])
        tdefs = _codegen.typedefs((), k.in_params, [p.dtype for p in k.in_params], k.out_params,
                                  [p.dtype for p in k.out_params])
        parts = (k.map_expr, k.reduce_expr, k.post_map_expr, k.identity, k.reduce_type, "", tdefs)
        rows, entries = _codegen.reduction_rows_source(k.name, _codegen.Layout("contig", 1, ins), out,
                                                       16 // DTYPES[dtype][2], *parts)
        other, entry = _codegen.reduction_source("cuda", k.name, _codegen.Layout("strided", 2, ins), out, True, *parts)
        for src, names in ((rows, entries), (other, [entry])):
            ptx, _, _ = _build.compile_cuda(k.name, src, (9, 0), ptx_only=True)
            assert all((".entry " + e).encode() in ptx for e in names), (kind, names)


def test_refusals_name_what_cannot_be_fused():
    a = rand(8, "float32", 18)
    outside = rand(8, "float32", 19)
    cases = [
        (lambda x: x if x > 0 else -x, "np.where"),
        (lambda x: np.cumsum(x), "numpy.cumsum .*np.max .*np.prod"),
        (lambda x: np.sum(x, dtype=np.float64), "numpy.sum with dtype"),
        (lambda x: np.sum(x) + np.mean(x), "one reduction"),
        (lambda x: np.max(x) + x.prod(), "one reduction: np.sum, np.mean, np.max"),
        (lambda x: np.max(x, initial=0.0), "numpy.max with initial .*axis= and keepdims= only"),
        (lambda x: x.min(where=x > 0), "numpy.min with where"),
        (lambda x: np.amax(x, out=x), "numpy.max with out"),
        (lambda x: x.prod(0, np.float64), "numpy.prod with arguments after axis"),
        (lambda x: np.prod(x, axis=0.5), "axis must be None, an int or a tuple"),
        (lambda x: np.max(x, axis=0) * x, "not the array in0"),
        (lambda x: np.sum(x, axis=0) + x, "not the array in0"),
        (lambda x: (np.sum(x), x * 2)[1], "reduction's result must be what the function returns"),
        (lambda x: (np.sum(x), np.sum(x) * 2)[1], "one reduction"),
        (lambda x: x + outside, "as the function's arguments"),
        (lambda x: 3.0, "must return a traced value"),
        (lambda x: x // 2, "floor_divide"),
        (lambda x: np.gcd(x, x), "gcd"),
        (lambda x: x.shape, "attribute 'shape'"),
        (lambda x: ewkern.exp(x, out=x), "keyword"),
        (lambda x: ewkern.gelu_backward(x, x), "gelu_backward"),
        (lambda x: np.sin(x) & x, "bitwise_and of float32"),
    ]
    for k, (fn, words) in enumerate(cases):
        with pytest.raises(TypeError, match=words):
            ewkern.fuse(fn, kernel_name=f"bad{k}")(a)
    with pytest.raises(TypeError, match="at least one array"):
        fma(1.0, 2.0, 3.0)
    with pytest.raises(TypeError, match="argument 1 must be an array"):
        fma(a, [1.0], a)
    with pytest.raises(TypeError, match="@ewkern.fuse"):
        ewkern.fuse(1, 2)


def test_ewkern_ops_keep_their_own_type_errors():
    """The hand-off in csrc/ops.c is looked for only after a TypeError and only on arguments that
    define __ewkern_fuse__: other errors reach the caller as they were."""
    with pytest.raises(TypeError, match="expected an array that supports DLPack"):
        ewkern.exp(object())
    with pytest.raises(TypeError, match="expected an array that supports DLPack"):
        ewkern.add(np.ones(3, np.float32), "x")
    with pytest.raises(ValueError):
        ewkern.add(np.ones(3, np.float32), np.ones(4, np.float32))


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_torch_in_torch_out_and_the_kernel_as_an_op_with_a_derived_backward():
    import ewkern.torch as ewt
    x = torch.randn(3, 65, dtype=torch.float64, requires_grad=True)
    w = torch.randn(65, dtype=torch.float64, requires_grad=True)

    @ewkern.fuse
    def gelu_mul(a, b):
        return ewkern.gelu(a) * b

    y = gelu_mul(x.detach(), w.detach())
    want = torch.nn.functional.gelu(x) * w
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-14)
    op = ewt.kernel_op(gelu_mul.kernel(x, w))
    op(x, w).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    want.sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw, w.grad, rtol=1e-10, atol=1e-12)
    # a fused reduction as an op: its sum's backward derived too (ReductionKernel's rule)
    rms = ewkern.fuse(lambda a, b: np.sqrt(np.mean((a - b) * (a - b), axis=1)))
    y = torch.randn(3, 65, dtype=torch.float64)
    x.grad = None
    r = ewt.kernel_op(rms.kernel(x.detach(), y))(x, y, axis=1)
    r.sum().backward()
    gx = x.grad.clone()
    x.grad = None
    want = ((x - y) ** 2).mean(1).sqrt()
    want.sum().backward()
    torch.testing.assert_close(r.detach(), want.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gx, x.grad, rtol=1e-10, atol=1e-12)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_fused_on_torch_cuda_tensors(dtype):
    """On CUDA the fused kernel is an ElementwiseKernel's launch: torch tensors in and out on
    torch's stream, an odd size and a misaligned start; `x + y` fused gives ewkern.add's bits; a
    mean over rows runs as a ReductionKernel."""
    tdt = getattr(torch, dtype)
    n = (1 << 20) + 3
    a, b, c = (torch.randn(n + 1, device="cuda").to(tdt)[1:] for _ in range(3))
    r = fma(a, b, c)
    assert r.device.type == "cuda" and r.dtype == tdt
    want = (a.double() * b.double() + c.double())
    torch.testing.assert_close(r.double(), want, rtol=EPS[dtype] * 2, atol=EPS[dtype] * 2)
    plus = ewkern.fuse(lambda x, y: x + y)
    x, y = torch.randn(n, device="cuda").to(tdt), torch.randn(n, device="cuda").to(tdt)
    assert torch.equal(plus(x, y), ewkern.add(x, y))
    # a reduction: the rows engine's mean over rows of (a - b)^2, square-rooted
    rms = ewkern.fuse(lambda p, q: np.sqrt(np.mean((p - q) * (p - q), axis=1)))
    p, q = (torch.randn(256, 4096, device="cuda").to(tdt) for _ in range(2))
    torch.testing.assert_close(rms(p, q).double(), ((p.double() - q.double()) ** 2).mean(1).sqrt(),
                               rtol=EPS[dtype] * 4, atol=EPS[dtype])


def test_a_call_finds_its_signature_by_argument_types():
    """After the first call of a signature the kernel is found by each argument's (type, dtype):
    the same kernels as the full signature's (a weak int, a bool, a strong NumPy scalar and another
    array dtype each their own), and a refused argument is refused on every call, not remembered."""
    f = ewkern.fuse(lambda x, s: x * s)
    x = np.arange(1, 6, dtype=np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(f(x, 3), x * 3)
        assert f(x, 3).dtype == np.float32 and f(x, True).dtype == np.float32
        assert f(x, np.float64(2.5)).dtype == np.float64 and f(x.astype(np.float64), 3).dtype == np.float64
        with pytest.raises(TypeError, match="must be an array"):
            f(x, "3")
    assert len(f._kernels) == len(f._by_types) == 4
    assert set(map(id, f._by_types.values())) == set(map(id, f._kernels.values()))


_INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
_INT_FUNCS = {
    "mul_div": lambda a, b: (a * 2) / 2,
    "sum_compare": lambda a, b: (a + b) > 3,
    "sub_mul": lambda a, b: (a - b) * b + a,
    "neg_square_abs": lambda a, b: np.abs(-a + np.square(b)),
    "invert_bits": lambda a, b: ~a + (a ^ b),
    "sum_of_product": lambda a, b: np.sum(a * 3),
    "rows_sum": lambda a, b: np.sum(a * b, axis=1) * 3,
    "rows_prod": lambda a, b: np.prod(a + 1, axis=1),
}


@pytest.mark.parametrize("dt", _INT_DTYPES)
def test_integer_intermediates_wrap_as_numpy(dt):
    """Every integer operation's value wraps to its NumPy type (C computes narrow integers in
    int, so uint8 200 * 2 was 400 there), including a reduction's map, its sum or product and
    its post map; signed add, subtract and multiply wrap too (computed unsigned: no signed
    overflow), with each type's extremes among the values."""
    info = np.iinfo(dt)
    rng = np.random.default_rng(7)
    a = rng.integers(info.min, info.max, (4, 6), dtype=dt, endpoint=True)
    b = rng.integers(info.min, info.max, (4, 6), dtype=dt, endpoint=True)
    a[0, :3] = [info.min, info.max, 0]
    with np.errstate(all="ignore"):
        for n, f in _INT_FUNCS.items():
            want = np.asarray(f(a, b))
            got = np.asarray(ewkern.fuse(f, kernel_name=f"wrap_{n}")(a, b))
            assert got.dtype == want.dtype, n
            np.testing.assert_array_equal(got, want, err_msg=n)


def test_uint8_repro_values():
    a = np.array([200, 100, 255], np.uint8)
    np.testing.assert_array_equal(ewkern.fuse(lambda a: (a * 2) / 2)(a), [72, 100, 127])
    np.testing.assert_array_equal(ewkern.fuse(lambda a, b: (a + b) > 250)(a, a), [False, False, True])
    assert int(ewkern.fuse(lambda a: np.sum(a * 2))(a)) == 598


@pytest.mark.parametrize("dt", ["float32", "float64", "float16"])
def test_signbit_fuses_on_the_cpu(dt):
    x = np.array([-0.0, 0.0, -1.5, 2.0, -np.inf, np.nan], dt)
    np.testing.assert_array_equal(ewkern.fuse(lambda a: np.signbit(a))(x), np.signbit(x))
