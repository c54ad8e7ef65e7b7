"""Run-time kernels on the CPU: the build targets the widest vector ISA the CPU has and calls
glibc's libmvec vector functions from its simd loops (ewkern/rtc/_build.cpu_target), as ewkern's
own CPU math ops do. Results may then differ between machines within libmvec's documented bound
(4 ulp); the tests assert bounds, not bits, on awkward sizes and a misaligned start, in the
convention of tests/test_cpu_math.py (1 ulp = eps(dtype) x |exact| + the smallest normal)."""

import math
import os
import sys

import numpy as np
import pytest

import ewkern
from ewkern.rtc import _build

mpmath = pytest.importorskip("mpmath")

FUNCS = ["exp", "log", "erf", "erfc", "tanh", "sin", "cos", "expm1", "log1p", "cbrt"]
EPS = {"float32": 2.0**-23, "float64": 2.0**-52}
TINY = {"float32": 2.0**-126, "float64": 2.0**-1022}


def _inputs(fn, n, dtype, rng):
    """Inputs in each function's domain, never zero, with both signs where it has them."""
    x = rng.standard_normal(n) * 4
    if fn in ("log", "log1p"):
        x = np.abs(x) * 10 + (0.5 if fn == "log" else -0.9)
    if fn == "exp":
        x = np.clip(x * 5, -80, 80)
    return x.astype(dtype)


def _exact(fn, x):
    with mpmath.workdps(40):
        f = {"exp": mpmath.exp, "log": mpmath.log, "erf": mpmath.erf, "erfc": mpmath.erfc, "tanh": mpmath.tanh,
             "sin": mpmath.sin, "cos": mpmath.cos, "expm1": mpmath.expm1, "log1p": mpmath.log1p,
             "cbrt": lambda v: mpmath.sign(v) * mpmath.cbrt(abs(v))}[fn]
        return np.array([float(f(mpmath.mpf(float(v)))) for v in x])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fn", FUNCS)
def test_user_kernel_math_within_libmvec_bounds(fn, dtype):
    """y = fn(x) by an ElementwiseKernel on NumPy arrays: within 4 ulp of the exact value (5 for
    float64's trigonometric functions, whose arguments here reach 16: libmvec reduces them
    itself) on sizes 1, 17 and 4099 and a misaligned start."""
    k = ewkern.ElementwiseKernel("T x", "T y", f"y = {fn}(x)", f"cpu_math_{fn}")
    rng = np.random.default_rng(sum(map(ord, fn + dtype)))
    bound = 5 if dtype == "float64" and fn in ("sin", "cos") else 4
    for n, start in ((1, 0), (17, 0), (4099, 0), (4099, 1)):
        x = _inputs(fn, n + start, dtype, rng)[start:]
        y = k(x)
        exact = _exact(fn, x)
        err = np.abs(y.astype(np.float64) - exact) / (EPS[dtype] * np.abs(exact) + TINY[dtype])
        assert err.max() <= bound, (fn, dtype, n, start, float(err.max()), x[np.argmax(err)])


def test_cpu_target_flags_follow_the_cpu_and_the_switches(monkeypatch):
    """The ISA flags come from /proc/cpuinfo (x86 Linux), EWKERN_CPU_ISA=baseline drops them and
    EWKERN_NO_LIBMVEC=1 drops libmvec; libmvec is declared only where a program that calls it
    links (glibc 2.35+: the second tier, with erf and tanh)."""
    _build.cxx()
    flags, link, what = _build.cpu_target()
    assert ("-lmvec" in link) == any(f.startswith("-DEWRTC_MVEC=") for f in flags)
    if sys.platform.startswith("linux") and os.uname().machine == "x86_64":
        cpu = open("/proc/cpuinfo").read()
        if " avx2" in cpu and " fma" in cpu and os.environ.get("EWKERN_CPU_ISA") != "baseline":
            assert "-mavx2" in flags and "-mfma" in flags and "-ffp-contract=off" in flags, flags
        if "-lmvec" in link:
            assert "glibc libmvec" in what
    monkeypatch.setattr(_build, "_cpu_target_info", None)
    monkeypatch.setenv("EWKERN_CPU_ISA", "baseline")
    monkeypatch.setenv("EWKERN_NO_LIBMVEC", "1")
    base = _build.cpu_target()
    assert base == ([], [], "the baseline ISA")
    monkeypatch.setenv("EWKERN_CPU_ISA", "avx2")   # no wider than AVX2 + FMA (as the built-in kernels)
    isa_flags, isa_name = _build._cpu_isa()
    assert not any(f.startswith("-mavx512") for f in isa_flags) and "AVX-512" not in isa_name
    if sys.platform.startswith("linux") and os.uname().machine == "x86_64" and " avx2" in cpu and " fma" in cpu:
        assert "-mavx2" in isa_flags and isa_name.startswith("AVX2 + FMA"), (isa_flags, isa_name)
    monkeypatch.setattr(_build, "_cpu_target_info", None)   # the next call probes again


def test_baseline_and_vector_builds_agree_within_bounds(monkeypatch):
    """The same kernel built for the baseline ISA with scalar libm and for this CPU with libmvec
    (two cache entries: the flags are in the key) gives results within the bound of each other."""
    k = ewkern.ElementwiseKernel("T a, T b", "T z", "z = a / (1 + exp(-b)) + tanh(a) * erf(b)", "cpu_math_mix")
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(10007).astype(np.float32) * 3 for _ in range(2))
    fast = k(a, b)
    monkeypatch.setattr(_build, "_cpu_target_info", None)
    monkeypatch.setenv("EWKERN_CPU_ISA", "baseline")
    monkeypatch.setenv("EWKERN_NO_LIBMVEC", "1")
    k2 = ewkern.ElementwiseKernel("T a, T b", "T z", "z = a / (1 + exp(-b)) + tanh(a) * erf(b)", "cpu_math_mix")
    slow = k2(a, b)
    monkeypatch.setattr(_build, "_cpu_target_info", None)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 / (1 + np.exp(-b64)) + np.tanh(a64) * np.array([math.erf(v) for v in b64])
    scale = np.abs(a64) + 2 * np.abs(a64 / (1 + np.exp(-b64))) + 1   # the terms' size: cancellation
    for y in (fast, slow):
        assert (np.abs(y - exact) / (EPS["float32"] * scale)).max() <= 16


def _kernel(expr, n=1, name="cuda_math"):
    ins = ", ".join(f"T x{j}" for j in range(n))
    return ewkern.ElementwiseKernel(ins, "T z", f"z = {expr}", name)


def test_cuda_inverse_error_functions_on_the_cpu():
    """CUDA's erfinv, erfcinv, normcdf and normcdfinv exist on the CPU: erf(erfinv(y)) = y and
    erfc(erfcinv(z)) = z to rounding (math.erf / math.erfc), the ends and outside the domain as
    CUDA's; normcdf and normcdfinv against statistics.NormalDist."""
    import statistics
    y = np.concatenate([np.linspace(-0.999999, 0.999999, 2001), [0.5, -0.5, 1e-300, -1e-10, 1 - 2.0**-53]])
    back = np.array([math.erf(v) for v in _kernel("erfinv(x0)")(y)])
    np.testing.assert_allclose(back, y, rtol=4e-16, atol=0)
    np.testing.assert_array_equal(_kernel("erfinv(x0)")(np.array([1.0, -1.0, 0.0])), [np.inf, -np.inf, 0.0])
    assert np.isnan(_kernel("erfinv(x0)")(np.array([1.5, np.nan]))).all()
    z = np.concatenate([np.geomspace(1e-300, 1, 2000), np.linspace(0, 2, 1001)[1:-1]])
    c = _kernel("erfcinv(x0)")(z)
    np.testing.assert_allclose([math.erfc(v) for v in c], z, rtol=1e-12)
    np.testing.assert_array_equal(_kernel("erfcinv(x0)")(np.array([0.0, 2.0])), [np.inf, -np.inf])
    nd = statistics.NormalDist()
    p = np.linspace(1e-9, 1 - 1e-9, 999)
    np.testing.assert_allclose(_kernel("normcdfinv(x0)")(p), [nd.inv_cdf(v) for v in p], rtol=1e-12, atol=1e-15)
    x = np.linspace(-7, 7, 1001)
    np.testing.assert_allclose(_kernel("normcdf(x0)")(x), [nd.cdf(v) for v in x], rtol=1e-14, atol=1e-16)
    f = np.linspace(-0.9, 0.9, 101).astype(np.float32)
    np.testing.assert_allclose(_kernel("erfinvf(x0)", name="erfinvf")(f),
                               _kernel("erfinv(x0)")(f.astype(np.float64)).astype(np.float32), rtol=1e-7)


def test_cuda_intrinsics_and_functions_on_the_cpu():
    """CUDA's fast intrinsics (__expf, __logf, __sinf, __cosf, __powf, __fdividef, __saturatef)
    and its functions the C++ library lacks (sinpi, cospi, rcbrt, rsqrt, norm3d, exp10,
    signbit) are there on the CPU with their values (the intrinsics as the exact functions)."""
    xf = np.linspace(-3, 3, 101).astype(np.float32)
    cases = [("__expf(x0)", np.exp(xf)), ("__logf(x0 + 4)", np.log(xf + 4)), ("__sinf(x0)", np.sin(xf)),
             ("__cosf(x0)", np.cos(xf)), ("__powf(x0 + 4, 1.5f)", (xf + 4) ** 1.5), ("__fdividef(x0, 3.0f)", xf / 3),
             ("__saturatef(x0)", np.clip(xf, 0, 1)), ("rcbrt(x0 + 4)", 1 / np.cbrt(xf + 4)),
             ("rsqrt(x0 + 4)", 1 / np.sqrt(xf + 4)), ("norm3d(x0, 2 * x0, 3.0f)", np.sqrt(5 * xf * xf + 9)),
             ("exp10f(x0)", 10.0 ** xf), ("sinpif(x0)", np.sin(np.pi * xf.astype(np.float64)))]
    for expr, want in cases:
        np.testing.assert_allclose(_kernel(expr, name="intrinsic")(xf), want, rtol=4e-7, atol=1e-7, err_msg=expr)
    assert _kernel("__saturatef(x0)", name="sat")(np.array([np.nan], np.float32))[0] == 0
    x = np.concatenate([np.linspace(-5, 5, 10001), np.arange(-6, 6.5, 0.5)])
    np.testing.assert_allclose(_kernel("sinpi(x0)")(x), np.sin(np.pi * x), rtol=0, atol=4e-15)
    np.testing.assert_allclose(_kernel("cospi(x0)")(x), np.cos(np.pi * x), rtol=0, atol=4e-15)
    np.testing.assert_array_equal(_kernel("sinpi(x0)")(np.arange(-3.0, 4)), 0)
    np.testing.assert_array_equal(_kernel("cospi(x0)")(np.arange(-3.0, 4) + 0.5), 0)
    sb = ewkern.ElementwiseKernel("T x", "bool z", "z = signbit(x)", "sb")
    np.testing.assert_array_equal(sb(np.array([-0.0, 1.0, -2.0])), [True, False, True])
