"""Every ISA form of the CPU kernels on one machine. The math ops, the 16-bit converters and the
backward loops are compiled for AVX-512, AVX2 + FMA and the baseline and picked per call by what
the CPU has (csrc/cpu/cpu_math.h); EWKERN_CPU_ISA=avx2 or =baseline caps the pick (read once per
process), so the forms this CPU would not pick run here too: the CPU accuracy tests of the forward
math ops and of the backward ops in a process under each cap, and bit equality with the widest
form wherever no libmvec function is called (libmvec's ISA variants may differ in the last bits,
within the stated bounds that the accuracy tests assert)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ewkern

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CAPS = ["avx2", "baseline"]

# backward ops whose CPU loop calls no libmvec function (gelu, silu and erf call exp / erfc)
EXACT_OPS = ["mul_backward", "div_backward", "maximum_backward", "minimum_backward", "relu_backward",
             "abs_backward", "sigmoid_backward", "tanh_backward", "exp_backward", "log_backward",
             "sqrt_backward", "rsqrt_backward", "axpby_backward"]
DTYPES = ["float32", "float16", "bfloat16", "float64"]

_GRADS = """
import sys, numpy as np, ewkern
sys.path.insert(0, %r)
from reference import np_dtype
rng = np.random.default_rng(7)
out = {}
for op in %r:
    for dt in %r:
        n = 3 * 1024 + 5
        g, a, b = ((rng.standard_normal(n) + 1.5).astype(np_dtype(dt)) for _ in range(3))
        a = np.abs(a) + np.asarray(0.25, dtype=a.dtype)   # in every op's domain (log, sqrt, rsqrt)
        args = {"axpby_backward": (g, 0.5, -2.0)}.get(op) or ((g, a, b) if op in (
            "mul_backward", "div_backward", "maximum_backward", "minimum_backward") else (g, a))
        r = getattr(ewkern, op)(*args)
        for k, x in enumerate(r if isinstance(r, tuple) else (r,)):
            out[f"{op} {dt} {k}"] = np.asarray(x).view(np.uint8)
np.savez(sys.argv[1], **out)
"""


def _env(cap):
    """this process's environment with ewkern importable and EWKERN_CPU_ISA set to cap (None: unset)"""
    env = {k: v for k, v in os.environ.items() if k != "EWKERN_CPU_ISA"}
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    if cap:
        env["EWKERN_CPU_ISA"] = cap
    return env


def _grads(cap, path):
    subprocess.run([sys.executable, "-c", _GRADS % (HERE, EXACT_OPS, DTYPES), str(path)], env=_env(cap),
                   check=True, cwd=ROOT)
    return dict(np.load(path))


@pytest.mark.parametrize("cap", CAPS)
def test_accuracy_tests_pass_under_each_isa_cap(cap):
    """The CPU parts of test_backward.py and test_cpu_math.py, in a process capped at `cap`."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", "not cuda",
                           os.path.join(HERE, "test_backward.py"), os.path.join(HERE, "test_cpu_math.py")],
                          env=_env(cap), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


@pytest.mark.parametrize("cap", CAPS)
def test_backward_bits_match_across_isa_forms(cap, tmp_path):
    widest = _grads(None, tmp_path / "widest.npz")
    capped = _grads(cap, tmp_path / f"{cap}.npz")
    assert widest.keys() == capped.keys() and len(widest) >= len(EXACT_OPS) * len(DTYPES)
    differ = [k for k in widest if not np.array_equal(widest[k], capped[k])]
    assert not differ, differ


@pytest.mark.parametrize("cap", CAPS)
def test_build_info_names_the_capped_isa(cap):
    code = "import ewkern; print(ewkern.build_info()['cpu_math'])"
    what = subprocess.run([sys.executable, "-c", code], env=_env(cap), cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    lib = ewkern.build_info()["cpu_math"]
    if not lib.startswith("glibc libmvec"):
        pytest.skip(f"no libmvec in this build: {lib}")
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if cap == "baseline":
        assert what == "glibc libmvec, SSE variants (EWKERN_CPU_ISA=baseline)", what
    elif " avx2" in flags and " fma" in flags:
        assert what == "glibc libmvec, AVX2 variants (EWKERN_CPU_ISA=avx2)", what
