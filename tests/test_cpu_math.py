"""The CPU math ops (exp, log, sqrt, rsqrt, erf, tanh, sigmoid, gelu, silu) on awkward inputs.

With glibc's libmvec (ewkern.build_info()["cpu_math"]) they run libmvec's vector functions of the
widest ISA the CPU has (AVX-512, AVX2 or SSE), so results may differ between machines, within the
bounds below (csrc/cpu/CPU_NOTES.md lists the measured maxima). The tests assert the bounds, not
bits. Errors are in the convention of ops.def: 1 ulp = eps(dtype) x |exact| (+ the smallest normal,
so results near or below it are compared absolutely). float32 results are checked against a
float64 reference (exact enough for float32), float64 results against mpmath at 60 digits.
"""

import math

import numpy as np
import pytest

import ewkern

mpmath = pytest.importorskip("mpmath")

MATH_OPS = ["exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "gelu", "silu"]

# ulp bounds on the CPU (ops.def's accuracy column); gelu adds 2 a^2 for a < 0 (its condition)
CPU_ULPS = {"exp": 3, "log": 4, "sqrt": 1, "rsqrt": 2, "erf": 4, "tanh": 4, "sigmoid": 4, "gelu": 4, "silu": 5}
EPS = {"float32": 2.0**-23, "float64": 2.0**-52, "float16": 2.0**-10, "bfloat16": 2.0**-7}
TINY = {"float32": 2.0**-126, "float64": 2.0**-1022, "float16": 2.0**-14, "bfloat16": 2.0**-126}


def _mp(op, x):
    """op(x) in mpmath (x a Python float), as a float64 (inf/nan where the limit is)."""
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        lim = {"exp": (math.inf, 0.0), "log": (math.inf, math.nan), "sqrt": (math.inf, math.nan),
               "rsqrt": (0.0, math.nan), "erf": (1.0, -1.0), "tanh": (1.0, -1.0), "sigmoid": (1.0, 0.0),
               "gelu": (math.inf, math.nan), "silu": (math.inf, math.nan)}[op]
        # gelu(-inf), silu(-inf): -inf x 0 in their formulas (ops.def), NaN as in tests/reference.py
        return lim[0] if x > 0 else lim[1]
    if x == 0 and op in ("erf", "tanh", "sqrt", "gelu", "silu"):
        return x   # odd functions keep the zero's sign
    with mpmath.workdps(60):
        a = mpmath.mpf(x)
        if op == "exp":
            r = mpmath.exp(a)
        elif op == "log":
            if x < 0:
                return math.nan
            if x == 0:
                return -math.inf
            r = mpmath.log(a)
        elif op == "sqrt":
            if x < 0:
                return math.nan
            if x == 0:
                return x
            r = mpmath.sqrt(a)
        elif op == "rsqrt":
            if x < 0:
                return math.nan
            if x == 0:
                return math.copysign(math.inf, x)
            r = 1 / mpmath.sqrt(a)
        elif op == "erf":
            r = mpmath.erf(a)
        elif op == "tanh":
            r = mpmath.tanh(a)
        elif op == "sigmoid":
            r = 1 / (1 + mpmath.exp(-a))
        elif op == "silu":
            r = a / (1 + mpmath.exp(-a))
        elif abs(x) > 60:      # mpmath's erfc overflows for huge arguments; gelu is a or -0 there
            return x if x > 0 else -0.0
        else:
            r = a / 2 * mpmath.erfc(-a / mpmath.sqrt(2))
        try:
            return float(r)
        except OverflowError:
            return math.copysign(math.inf, float(mpmath.sign(r)))


def _awkward(op, dtype):
    """Subnormals, zeros, infinities, NaN, the domain's edges, and a spread of ordinary values."""
    f = np.finfo(dtype)
    tiny, sub, big = float(f.tiny), float(f.smallest_subnormal), float(f.max)
    vals = [0.0, -0.0, math.inf, -math.inf, math.nan, sub, -sub, tiny, -tiny, tiny / 3, -tiny / 3,
            2 * sub, big, -big, 1.0, -1.0, 0.5, 2.0, 1e-3, -1e-3]
    if dtype == "float32":
        edges = [88.72283, 88.7228, 88.72284, 89.0, -87.33655, -103.27893, -103.97208, -104.0, -150.0,
                 9.0, 9.01, 10.0, -9.0, 3.9192059, 3.92, 4.0, -3.92, -10.0, -14.0, -13.0, 15.0,
                 1.0000001, 0.99999994, 1e38, 1e-38, 0.6931472]
    else:
        edges = [709.782712893384, 709.78, 709.79, -708.3964, -744.44, -745.1332191019411, -745.2, -800.0,
                 19.0, 19.1, 22.0, -19.0, 5.9, 5.92, 6.0, -5.92, -27.0, -30.0, -37.0, 40.0,
                 1.0000000000000002, 0.9999999999999999, 1e308, 1e-308, 0.6931471805599453]
    rng = np.random.default_rng(hash(op) % 2**32)
    spread = np.concatenate([rng.standard_normal(600) * 4, rng.uniform(-60, 60, 300),
                             np.exp(rng.uniform(-80, 80, 300))]).astype(dtype).astype(float).tolist()
    return np.array(vals + edges + [-e for e in edges] + spread, dtype=dtype)


def _check(op, dtype, x, got, want):
    nan_w, nan_g = np.isnan(want), np.isnan(got)
    assert (nan_w == nan_g).all(), (op, dtype, x[nan_w != nan_g], got[nan_w != nan_g], want[nan_w != nan_g])
    big = float(np.finfo(dtype).max)
    # where the exact result overflows the dtype, inf (or the largest finite, for values within
    # the bound of the edge) is right; compare the rest in ulp
    over = ~nan_w & (np.abs(want) > big)
    assert np.all(np.abs(got[over]) >= big) and np.all(np.sign(got[over]) == np.sign(want[over])), \
        (op, dtype, x[over], got[over])
    fin = ~nan_w & ~over
    g, w, xs = got[fin].astype(np.float64), want[fin], x[fin].astype(np.float64)
    bound = np.full(w.shape, float(CPU_ULPS[op]))
    if op == "gelu":
        bound += np.minimum(2 * np.where(xs < 0, xs, 0.0) ** 2, 1e30)   # capped: no inf x 0
    tol = bound * EPS[dtype] * np.abs(w) + TINY[dtype]
    err = np.abs(g - w)
    bad = ~(err <= tol)
    assert not bad.any(), (f"{op} {dtype}: {bad.sum()} values beyond {CPU_ULPS[op]} ulp: x={xs[bad][:5]}, "
                           f"got {g[bad][:5]}, want {w[bad][:5]}")
    # the sign of a zero result where the exact one is a signed zero (sqrt(-0) = -0, ...)
    z = fin & (want == 0)
    assert np.all(np.signbit(got[z]) == np.signbit(want[z])), (op, dtype, x[z], got[z])


def test_build_info_names_the_math_library():
    lib = ewkern.build_info()["cpu_math"]
    assert isinstance(lib, str)
    assert lib.startswith("glibc libmvec") or lib.startswith("scalar libm"), lib


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", MATH_OPS)
def test_math_op_ulp_bound(op, dtype):
    x = _awkward(op, dtype)
    want = np.array([_mp(op, float(v)) for v in x])
    if dtype == "float32":   # the exact result rounded to float64 is exact enough here
        want = want.astype(np.float64)
    # each value alone (scalar tails) and all together (the vector loop), and multi-threaded
    together = np.asarray(getattr(ewkern, op)(ewkern.asarray(x)))
    _check(op, dtype, x, together, want)
    for v, w in zip(x[:40], want[:40]):
        one = np.asarray(getattr(ewkern, op)(ewkern.asarray(np.array([v], dtype=dtype))))
        _check(op, dtype, np.array([v]), one, np.array([w]))
    big = np.tile(x, 40)      # past the threshold where the OpenMP team runs it
    _check(op, dtype, big, np.asarray(getattr(ewkern, op)(ewkern.asarray(big))), np.tile(want, 40))


@pytest.mark.parametrize("op", MATH_OPS)
def test_float32_dense(op):
    """A million float32 values spread over every exponent of the op's domain, against float64."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    import torch
    t = torch.from_numpy(x.astype(np.float64))
    ref = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
           "erf": torch.special.erf, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
           "silu": lambda t: t * torch.sigmoid(t),
           "gelu": lambda t: 0.5 * t * torch.special.erfc(-t / math.sqrt(2))}[op](t).numpy()
    got = np.asarray(getattr(ewkern, op)(ewkern.asarray(x)))
    # torch's float64 silu/gelu/sigmoid lose accuracy where the result underflows float64's
    # range relative to float32's: keep the values whose reference is far from that edge
    keep = np.isnan(ref) | (np.abs(ref) > 1e-300) | (ref == 0)
    _check(op, "float32", x[keep], got[keep], ref[keep])


def test_float32_gelu_and_its_gradient_every_251st_float():
    """float32 gelu and gelu_backward on every 251st float with |a| <= 40 (8.8 million; the AVX2 and
    AVX-512 forms compute both by a fitted erfc, csrc/cpu/cpu_math.h, checked there on every such
    float), against float64: gelu within 4 ulp + 2 a^2 for a < 0 (_check), the gradient within 4 +
    2 a^2 ulp of |Phi(a)| + |a phi(a)| (test_backward.py's scale)."""
    torch = pytest.importorskip("torch")
    top = int(np.array(40.0, np.float32).view(np.uint32))
    pos = np.arange(0, top + 1, 251, dtype=np.uint32).view(np.float32)
    x = np.concatenate([pos, -pos[1:]])
    t = torch.from_numpy(x.astype(np.float64))
    cdf = 0.5 * torch.special.erfc(-t / math.sqrt(2))
    apdf = t * torch.exp(-t * t / 2) / math.sqrt(2 * math.pi)
    _check("gelu", "float32", x, np.asarray(ewkern.gelu(ewkern.asarray(x))), (t * cdf).numpy())
    got = np.asarray(ewkern.gelu_backward(ewkern.asarray(np.ones_like(x)), ewkern.asarray(x))).astype(np.float64)
    want, scale = (cdf + apdf).numpy(), (cdf.abs() + apdf.abs()).numpy()
    tol = (4 + 2 * x.astype(np.float64) ** 2) * EPS["float32"] * scale + TINY["float32"]
    bad = np.abs(got - want) > tol
    assert not bad.any(), (x[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", MATH_OPS)
def test_16bit_every_value(op, dtype):
    """Every float16/bfloat16 bit pattern: computed in float32, rounded once to the dtype (to
    nearest even; NaN stays NaN). The result is within the float32 bound plus half an ulp."""
    ml = pytest.importorskip("ml_dtypes")
    bits = np.arange(1 << 16, dtype=np.uint16)
    npdt = np.float16 if dtype == "float16" else ml.bfloat16
    x = bits.view(npdt)
    x32 = x.astype(np.float32)
    got = np.asarray(ewkern.asarray(getattr(ewkern, op)(ewkern.asarray(x32, dtype=dtype)), dtype="float32"))
    want = np.array([_mp(op, float(v)) for v in x32]) if op in ("gelu",) else None
    if want is None:
        import torch
        t = torch.from_numpy(x32.astype(np.float64))
        want = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
                "erf": torch.special.erf, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                "silu": lambda t: t * torch.sigmoid(t)}[op](t).numpy()
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), op
    big = float(np.finfo(np.float16).max) if dtype == "float16" else 3.3895313892515355e38
    fin = ~nan & (np.abs(want) <= big)
    w = want[fin]
    err = np.abs(got[fin].astype(np.float64) - w)
    bound = 0.5 + CPU_ULPS[op] * 2.0**-23 / EPS[dtype]
    tol = bound * EPS[dtype] * np.abs(w) + TINY[dtype]
    if op == "gelu":
        tol += 2 * np.minimum(x32[fin], 0).astype(np.float64) ** 2 * 2.0**-23 * np.abs(w)
    bad = ~(err <= tol)
    assert not bad.any(), (op, dtype, x32[fin][bad][:5], got[fin][bad][:5], w[bad][:5])


_LUT_SCRIPT = r"""
import sys, numpy as np, torch, ewkern
op, dtype = sys.argv[1], sys.argv[2]
x = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.int16)).view(getattr(torch, dtype))
f = getattr(ewkern, op)
bits = lambda t: t.view(torch.int16).numpy().copy()
# first in pieces below the table's threshold (the tile path: no table exists yet in this process)
small = np.concatenate([bits(f(x[k:k + 4096])) for k in range(0, 1 << 16, 4096)])
big = bits(f(x))                # builds and reads the table
again = bits(f(x[:100]))        # a small call, by the table now
assert (small == big).all(), np.flatnonzero(small != big)[:10]
assert (again == big[:100]).all()
print("same")
"""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["exp", "gelu"])
def test_16bit_table_gives_the_tiles_bits(op, dtype):
    """float16/bfloat16 math ops read a table of all 65536 results once a call is large enough
    (csrc/cpu/elementwise.c, ew_lut): in a fresh process, the tile path's results (small calls
    before any table exists) and the table's are the same bits for every input, NaNs included."""
    import subprocess
    import sys
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-c", _LUT_SCRIPT, op, dtype], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "same" in r.stdout, r.stderr[-2000:]


# a saturating input of each op and the value libm gives it (csrc/cpu/elementwise.c, "saturated lanes")
SATURATING = {"exp": [(120.0, np.inf), (-150.0, 0.0), (np.inf, np.inf), (-np.inf, 0.0)],
              "log": [(0.0, -np.inf), (-0.0, -np.inf), (-2.5, np.nan), (np.inf, np.inf), (-np.inf, np.nan)],
              "sigmoid": [(200.0, 1.0), (-200.0, 0.0)],
              "silu": [(200.0, 200.0), (-200.0, -0.0)],
              "gelu": [(-20.0, -0.0), (-1e30, -0.0)]}


@pytest.mark.parametrize("op", sorted(SATURATING))
def test_float32_saturated_lanes_keep_every_bit(op):
    """float32 exp, log, sigmoid, silu, gelu take a chunk with saturating lanes through their
    saturated form (libmvec's scalar fallback spared): the saturated lanes get libm's value (the
    zero's sign and NaN included), every other lane of the chunk the same bits as a call without
    them, and a NaN input stays NaN."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(5000) * 4).astype(np.float32)
    if op == "log":
        x = np.abs(x) + np.float32(1e-3)
    plain = np.asarray(getattr(ewkern, op)(ewkern.asarray(x))).view(np.uint32)
    for value, want in SATURATING[op] + [(np.nan, np.nan)]:
        mixed = x.copy()
        mixed[::7] = value
        got = np.asarray(getattr(ewkern, op)(ewkern.asarray(mixed)))
        keep = np.ones(x.size, bool)
        keep[::7] = False
        np.testing.assert_array_equal(got.view(np.uint32)[keep], plain[keep])
        sat = got[::7]
        if np.isnan(want):
            assert np.isnan(sat).all()
        else:
            np.testing.assert_array_equal(sat, np.full(sat.size, want, np.float32))
            assert (np.signbit(sat) == np.signbit(np.float32(want))).all()
    if op == "log":   # NaN for a negative input and for a NaN, in a chunk of them alone
        got = np.asarray(ewkern.log(ewkern.asarray(np.array([-1.0, np.nan] * 600, np.float32))))
        with np.errstate(invalid="ignore"):
            assert np.isnan(got).all()


@pytest.mark.parametrize("op,value,want", [("gelu", -20.0, 0.0), ("gelu", 20.0, "g"), ("gelu", -1e30, 0.0),
                                           ("erf", 20.0, 0.0), ("erf", -300.0, 0.0),
                                           ("silu", -200.0, 0.0), ("silu", 200.0, "g")])
def test_float32_backward_saturated_lanes_keep_every_bit(op, value, want):
    """gelu_backward, erf_backward and silu_backward take float32 chunks with saturating saved
    inputs through their saturated form: those lanes get their limit (0, or the incoming gradient
    itself), the chunk's other lanes the same bits as a call without them."""
    rng = np.random.default_rng(12)
    a = (rng.standard_normal(5000) * 3).astype(np.float32)
    g = rng.standard_normal(5000).astype(np.float32)
    fn = getattr(ewkern, op + "_backward")
    plain = np.asarray(fn(ewkern.asarray(g), ewkern.asarray(a))).view(np.uint32)
    mixed = a.copy()
    mixed[::5] = value
    got = np.asarray(fn(ewkern.asarray(g), ewkern.asarray(mixed)))
    keep = np.ones(a.size, bool)
    keep[::5] = False
    np.testing.assert_array_equal(got.view(np.uint32)[keep], plain[keep])
    np.testing.assert_array_equal(got[::5], g[::5] if want == "g" else np.zeros(g[::5].size, np.float32))
