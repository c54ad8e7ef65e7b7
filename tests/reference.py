"""The float64 NumPy reference of every op and the one validator all tests use."""
import math

import numpy as np

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BF16 = None

DTYPES = ["float32", "float16", "bfloat16", "float64"]

# machine epsilon (spacing at 1) and the smallest normal of each dtype
EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}
TINY = {"float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126, "float64": 2.0**-1022}


def np_dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _maximum(a, b):
    return np.maximum(a, b)  # NumPy propagates NaN from either side


REF = {
    "copy": lambda a: a,
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": _maximum,
    "minimum": np.minimum,
    "add_const": lambda a, c: a + c,
    "mul_const": lambda a, c: a * c,
    "axpby": lambda a, b, alpha, beta: alpha * a + beta * b,
    "neg": lambda a: -a,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda a: 1.0 / np.sqrt(a),
    "erf": _erf,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda a: np.maximum(a, 0.0),
    # x/2 (1 + erf(x/sqrt2)) written with erfc, which has no cancellation for x << 0
    "gelu": lambda a: 0.5 * a * _erfc(-a / math.sqrt(2.0)),
    "silu": lambda a: a * _sigmoid(a),
}


def reference(op, *arrays, scalars=()):
    """The result of op on the inputs (any float dtype) as float64, with NumPy's warnings silenced.
    NumPy's own functions run in long double (80-bit on x86-64), so that a float64 result's bound
    of one or two ulp is not eaten by the reference's rounding (NumPy's float64 exp is itself
    about an ulp off at times); erf and erfc come from math (double) as before."""
    args = [np.asarray(x).astype(np.float64).astype(np.longdouble) for x in arrays]
    with np.errstate(all="ignore"):
        return np.asarray(REF[op](*args, *scalars), dtype=np.float64)


def rmse_reference(a, b, axis):
    a = np.asarray(a).astype(np.float64)
    b = np.asarray(b).astype(np.float64)
    with np.errstate(all="ignore"):
        return np.sqrt(np.mean((a - b) ** 2, axis=axis))


def random_input(rng, shape, dtype, op=None, low=None):
    """Random non-zero data suited to op's domain (positive for log/sqrt/rsqrt)."""
    x = rng.standard_normal(shape) * 3.0
    if op in ("log", "sqrt", "rsqrt"):
        x = np.abs(x) + 0.05
    elif op == "div":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    x = np.where(x == 0, 0.25, x)
    return x.astype(np_dtype(dtype))


def assert_close(out, ref, dtype, ulps=2.0, what=""):
    """out (any array) against the float64 reference: NaN and inf in the same places, finite
    values within atol + ulps * |ref| * eps(dtype)."""
    got = np.asarray(out).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    # the reference as the output dtype would hold it (overflow to inf, underflow to 0)
    with np.errstate(over="ignore"):
        ref_rounded = ref.astype(np_dtype(dtype)).astype(np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    nan_got, nan_ref = np.isnan(got), np.isnan(ref_rounded)
    assert np.array_equal(nan_got, nan_ref), \
        f"{what}: NaN positions differ at {np.flatnonzero(nan_got != nan_ref)[:10]}"
    inf_ref = np.isinf(ref_rounded)
    assert np.array_equal(got[inf_ref], ref_rounded[inf_ref]), f"{what}: inf values/positions differ"
    fin = ~(nan_ref | inf_ref)
    assert not np.isinf(got[fin]).any(), f"{what}: inf where the reference is finite"
    ulps = np.broadcast_to(np.asarray(ulps, dtype=np.float64), ref.shape)[fin]
    tol = ulps * EPS[dtype] * np.abs(ref[fin]) + TINY[dtype]
    err = np.abs(got[fin] - ref[fin])
    bad = err > tol
    if bad.any():
        i = np.flatnonzero(bad)[:5]
        raise AssertionError(f"{what}: {bad.sum()} of {fin.sum()} values off by more than {ulps[i]} ulp: "
                             f"got {got[fin][i]}, want {ref[fin][i]} (max err/ulp "
                             f"{np.max(err / (EPS[dtype] * np.maximum(np.abs(ref[fin]), TINY[dtype]))):.2f})")


# --- backward ops (csrc/grads.def): float64 formulas on the same rounded arguments ----------------
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu_terms(a):
    """Phi(a) and a phi(a), gelu's derivative being their sum."""
    return 0.5 * _erfc(-a / math.sqrt(2.0)), a * np.exp(-0.5 * a * a) * _INV_SQRT_2PI


def _silu_terms(a):
    s = _sigmoid(a)
    return s, s * a * (1.0 - s)


def _extreme_grads(g, a, b, sign):
    """torch's maximum (sign 1) / minimum (sign -1) backward: a tie splits grad in halves, the
    losing side gets 0, NaN loses nowhere."""
    h = np.where(a == b, 0.5 * g, g)
    return np.where(sign * (b - a) > 0, 0.0, h), np.where(sign * (a - b) > 0, 0.0, h)


GRAD_REF = {
    "gelu_backward": lambda g, a: g * sum(_gelu_terms(a)),
    "silu_backward": lambda g, a: g * sum(_silu_terms(a)),
    "sigmoid_backward": lambda g, y: g * y * (1.0 - y),
    "tanh_backward": lambda g, y: g * ((1.0 - y) * (1.0 + y)),    # no cancellation near |y| = 1
    "erf_backward": lambda g, a: g * 2.0 / math.sqrt(math.pi) * np.exp(-a * a),
    "exp_backward": lambda g, y: g * y,
    "log_backward": lambda g, a: g / a,
    "sqrt_backward": lambda g, y: g / (2.0 * y),
    "rsqrt_backward": lambda g, y: -0.5 * g * y ** 3,
    "abs_backward": lambda g, a: g * np.sign(a),
    "relu_backward": lambda g, y: np.where(y <= 0, 0.0, g),
    "mul_backward": lambda g, a, b: (g * b, g * a),
    "div_backward": lambda g, a, b: (g / b, -g * a / (b * b)),
    "maximum_backward": lambda g, a, b: _extreme_grads(g, a, b, 1.0),
    "minimum_backward": lambda g, a, b: _extreme_grads(g, a, b, -1.0),
    "axpby_backward": lambda g, alpha, beta: (alpha * g, beta * g),
}

# The size each bound is relative to (grads.def's accuracy column): the result itself, except
# where the derivative is a sum of terms that cancel near a zero of it.
GRAD_SCALE = {
    "gelu_backward": lambda g, a: np.abs(g) * sum(np.abs(t) for t in _gelu_terms(a)),
    "silu_backward": lambda g, a: np.abs(g) * sum(np.abs(t) for t in _silu_terms(a)),
}


def grad_reference(op, *arrays, scalars=()):
    """Gradient(s) of a backward op as float64 arrays, a tuple with one entry per output. The
    arithmetic runs in long double (80-bit on x86-64), so that a float64 result's bound of one or
    two ulp is not eaten by the reference's own roundings."""
    args = [np.asarray(x).astype(np.float64).astype(np.longdouble) for x in arrays]
    with np.errstate(all="ignore"):
        r = GRAD_REF[op](*args, *scalars)
    return tuple(np.asarray(x, dtype=np.float64) for x in (r if isinstance(r, tuple) else (r,)))


def rmse_grad_reference(g, a, b, r, axis):
    """d rmse / da and d rmse / db: (a - b) g / (n r) per batch, and its negative."""
    a = np.asarray(a).astype(np.float64)
    b = np.asarray(b).astype(np.float64)
    n = a.size // max(np.asarray(r).size, 1) if np.asarray(r).size else 0
    keep = list(a.shape)
    for ax in axis:
        keep[ax] = 1
    with np.errstate(all="ignore"):
        s = (np.asarray(g, dtype=np.float64) / (n * np.asarray(r, dtype=np.float64))).reshape(keep)
        ga = (a - b) * s
    return ga, -ga
