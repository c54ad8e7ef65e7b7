"""float64 gelu and gelu_backward's math (gelu_f64, gelu_grad_f64 in csrc/cuda/elementwise_ops.cuh)
compiled for the host by nvcc (scripts/gelu64_check.cu) and checked against long double on random
inputs over [-40, 6], tiny |x| and random bit patterns: the largest error is within ops.def's and
grads.def's bound 4 + 2 a^2 (the program exits 1 otherwise), and the special values give what the
float64 formulas give. No GPU needed; skipped where nvcc is not found (CUDA_HOME, /usr/local/cuda,
PATH). The device's own results are checked against NumPy by the GPU tests (test_elementwise,
test_backward); this one reaches the ranges those sample thinly (x << 0, subnormal results)."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nvcc():
    for d in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if d and os.path.exists(os.path.join(d, "bin", "nvcc")):
            return os.path.join(d, "bin", "nvcc")
    return shutil.which("nvcc")


@pytest.fixture(scope="module")
def gelu64_check(tmp_path_factory):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (CUDA_HOME, /usr/local/cuda, PATH)")
    source = os.path.join(ROOT, "scripts", "gelu64_check.cu")
    if not os.path.exists(source):
        pytest.skip("scripts/gelu64_check.cu is not here (the sdist ships tests, not scripts)")
    exe = str(tmp_path_factory.mktemp("gelu64") / "gelu64_check")
    rep = subprocess.run([nvcc, "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"), "-I",
                          os.path.join(ROOT, "csrc", "cuda"), "-o", exe, source], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-2000:]
    return exe


@pytest.mark.parametrize("mode", ["", "grad"])
def test_within_the_bound(gelu64_check, mode):
    rep = subprocess.run([gelu64_check, "400000"] + ([mode] if mode else []), capture_output=True, text=True)
    out = rep.stdout
    ratio = float(re.search(r"max error / \(4 \+ 2 a\^2\) = ([0-9.]+)", out).group(1))
    assert rep.returncode == 0 and ratio <= 1.0, out
    # results below the smallest normal: within a few hundred units of 2^-1074 (one rounding of a
    # product whose factors carry ~1 ulp each, scaled into the subnormal range)
    sub = float(re.search(r"max \|error\| \S+ = ([0-9.]+) x 2\^-1074", out).group(1))
    assert sub <= 512, out
    if not mode:   # the kernels' batched core (Batch<Op_gelu_f64>) gives the same bits
        assert re.search(r"batched core \(8 at a time\): 0 results differ", out), out


def test_special_values(gelu64_check):
    """NaN where the float64 formula has it (gelu(-inf) = -inf * 0; gelu'(+-inf) has x phi(x) = inf * 0),
    the limits elsewhere."""
    got = {}
    for mode in ("", "grad"):
        out = subprocess.run([gelu64_check, "1000"] + ([mode] if mode else []), capture_output=True,
                             text=True).stdout
        for name, x, v in re.findall(r"^(gelu'?)\((\S+)\) = (\S+)", out, re.M):
            got[(name, x)] = float(v)     # x as printed (%.17g): "nan" is no dict key as a float
    for key, want in {("gelu", "inf"): float("inf"), ("gelu", "0"): 0.0, ("gelu", "-1000000"): 0.0,
                      ("gelu'", "0"): 0.625, ("gelu'", "1.7976931348623157e+308"): 1.25,
                      ("gelu'", "-1000000"): 0.0}.items():
        assert got[key] == want, (key, got[key])
    for key in (("gelu", "-inf"), ("gelu", "nan"), ("gelu'", "inf"), ("gelu'", "-inf"), ("gelu'", "nan")):
        assert got[key] != got[key], (key, got[key])
