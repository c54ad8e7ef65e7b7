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
