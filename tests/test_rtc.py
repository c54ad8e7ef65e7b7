"""ewkern.ElementwiseKernel / ReductionKernel (issue 21): CuPy's documented examples, its type and
broadcasting rules, the CPU backend against float64 NumPy references, the disk cache, errors,
and the CUDA sources compiled by NVRTC to PTX (no GPU needed; skipped without NVRTC). The GPU runs
are marked gpu."""
import ctypes
import os
import re
import struct

import numpy as np
import pytest

import ewkern
from ewkern.rtc import _build, _codegen
from ewkern.rtc._params import parse_params
from conftest import blocks_per_sm, gpu, ptxas_registers
from reference import BF16, EPS, TINY, np_dtype

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

FLOATS = ["float32", "float16", "bfloat16", "float64"]
HEADER = os.path.join(os.path.dirname(__file__), "..", "csrc", "cuda", _codegen.VECTOR_HEADER)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    monkeypatch.setenv("EWKERN_CACHE_DIR", str(d))
    return d


def close(out, ref, dtype, ulps=1.0, scale=None):
    """|out - ref| <= ulps x eps(dtype) x (scale + the smallest normal), scale: |ref|, or the size
    of the terms where a sum cancels (the smallest normal covers results that round to a
    subnormal, whose spacing is eps x the smallest normal)."""
    out = np.asarray(out).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape
    tol = 1e-300 + ((np.abs(ref) if scale is None else scale) + TINY[dtype]) * EPS[dtype] * ulps
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.all(np.abs(out[ok] - ref[ok]) <= tol[ok]), np.max(np.abs(out[ok] - ref[ok]) - tol[ok])


# ---- CuPy's documentation examples ------------------------------------------------------------

squared_diff = ewkern.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)",
                                        "squared_diff")
squared_diff_generic = ewkern.ElementwiseKernel("T x, T y", "T z", "z = (x - y) * (x - y)",
                                                "squared_diff_generic")
squared_diff_super_generic = ewkern.ElementwiseKernel("X x, Y y", "Z z", "z = (x - y) * (x - y)",
                                                      "squared_diff_super_generic")
add_reverse = ewkern.ElementwiseKernel("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse")
l2norm = ewkern.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")


def test_cupy_squared_diff_broadcast_and_scalar():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    y = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(squared_diff(x, y), (x - y) ** 2)
    np.testing.assert_array_equal(squared_diff(x, 5), (x - 5) ** 2)
    z = np.empty((2, 5), np.float32)
    assert squared_diff(x, y, z) is z
    np.testing.assert_array_equal(z, (x - y) ** 2)


def test_cupy_generic_and_super_generic():
    x = np.arange(10, dtype=np.float64).reshape(2, 5) * 1.5
    y = np.arange(5, dtype=np.float64)
    r = squared_diff_generic(x, y)
    assert r.dtype == np.float64
    np.testing.assert_array_equal(r, (x - y) ** 2)
    z = np.empty((2, 5), np.float32)
    squared_diff_super_generic(x, y.astype(np.float32), z)
    np.testing.assert_allclose(z, (x - y) ** 2, rtol=1e-6)
    with pytest.raises(TypeError, match="cannot determine the type Z"):
        squared_diff_super_generic(x, y)


def test_cupy_raw_add_reverse():
    x = np.arange(7, dtype=np.float32)
    y = np.arange(7, dtype=np.float32) * 10
    np.testing.assert_array_equal(add_reverse(x, y), x + y[::-1])
    # raw input that is not contiguous is read as a contiguous copy
    y2 = (np.arange(14, dtype=np.float32) * 3)[::2]
    np.testing.assert_array_equal(add_reverse(x, y2), x + y2[::-1])


def test_cupy_l2norm():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    close(l2norm(x, axis=1), np.sqrt((x.astype(np.float64) ** 2).sum(1)), "float32", 4)
    close(l2norm(x), np.sqrt((x.astype(np.float64) ** 2).sum()), "float32", 4)
    r = l2norm(x, axis=0, keepdims=True)
    assert r.shape == (1, 5)
    close(r, np.sqrt((x.astype(np.float64) ** 2).sum(0, keepdims=True)), "float32", 4)


def test_multiple_outputs_and_return_tuple():
    k = ewkern.ElementwiseKernel("T x, T y", "T s, T d", "s = x + y; d = x - y", "sumdiff")
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(33), rng.standard_normal(33)
    s, d = k(x, y)
    np.testing.assert_array_equal(s, x + y)
    np.testing.assert_array_equal(d, x - y)
    one = ewkern.ElementwiseKernel("T x", "T y", "y = x * 2", "twice", return_tuple=True)
    (r,) = one(x)
    np.testing.assert_array_equal(r, 2 * x)
    assert ewkern.ElementwiseKernel("T x", "T y", "y = x", "nor", no_return=True)(x) is None


# ---- sizes, layouts, dtypes -------------------------------------------------------------------

axpy = ewkern.ElementwiseKernel("T x, T y, T a", "T z", "z = a * x + y", "axpy")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 7, 255, 1025, 70001])
def test_axpy_sizes_dtypes(dtype, n):
    rng = np.random.default_rng(n)
    dt = np_dtype(dtype)
    x = rng.standard_normal(n + 1).astype(dt)[1:]   # misaligned start
    y = rng.standard_normal(n).astype(dt)
    r = axpy(x, y, 0.75)
    assert r.dtype == dt and r.shape == (n,)
    ref = 0.75 * x.astype(np.float64) + y.astype(np.float64)
    # 16-bit: computed in float32, rounded once on the store; float32/64: two roundings of the terms
    if dtype in ("float16", "bfloat16"):
        close(r, ref, dtype, 1.0)
    else:
        close(r, ref, dtype, 2.0, scale=np.abs(0.75 * x.astype(np.float64)) + np.abs(y.astype(np.float64)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(5, 7), (300, 1001), (3, 4, 33), (2, 1)], ids=str)
def test_cpu_rows_form_for_broadcast_inputs(dtype, shape):
    """Inputs broadcast over rows (one row repeated, one element per row, one element) run on the
    CPU as rows of the last axis, a row's columns one loop (`rows`), with NumPy's values (one
    rounding of a float computation for 16-bit); the index i is the element's; a raw parameter, a
    broadcast output or an input that is none of those kinds keeps the strided kernel."""
    rng = np.random.default_rng(sum(shape))
    dt = np_dtype(dtype)
    x = rng.standard_normal(shape).astype(dt)
    row = rng.standard_normal(shape[-1:]).astype(dt)            # one row, repeated (bcol)
    col = rng.standard_normal(shape[:-1] + (1,)).astype(dt)     # one element a row (brow)
    one = rng.standard_normal((1,)).astype(dt)
    k = ewkern.ElementwiseKernel("T x, T r, T c, T o", "T z, float64 j", "z = x * c + r * o; j = i", "rows_bc")
    z, j = k(x, row, col, one)
    assert k._last_path == ("rows" if shape[-1] > 1 else "strided")    # rows of one: the strided kernel
    f = [a.astype(np.float64) for a in (x, row, col, one)]
    ref = f[0] * f[2] + f[1] * f[3]
    if dtype in ("float16", "bfloat16"):
        close(z, ref, dtype, 1.0)
    else:
        close(z, ref, dtype, 2.0, scale=np.abs(f[0] * f[2]) + np.abs(f[1] * f[3]))
    np.testing.assert_array_equal(np.asarray(j), np.arange(x.size, dtype=np.float64).reshape(shape))
    if shape[-1] == 1:
        return
    raw = ewkern.ElementwiseKernel("T x, T c, raw T q", "T z", "z = x * c + q[0]", "rows_raw")
    zr = raw(x, col, one)
    assert raw._last_path == "strided"
    close(zr, f[0] * f[2] + f[3][0], dtype, 2.0, scale=np.abs(f[0] * f[2]) + np.abs(f[3][0]))
    spaced = np.repeat(col, 2, axis=-1)[..., :1]    # one element a row, rows not adjacent in memory
    k(x, row, spaced, one)
    assert k._last_path == "strided"
    if len(shape) == 3:     # a [n0, 1, n2] input over [n0, n1, n2]: neither kind, the strided kernel
        mid = rng.standard_normal((shape[0], 1, shape[2])).astype(dt)
        z2, _ = k(x, mid, col, one)
        assert k._last_path == "strided"
        close(z2, f[0] * f[2] + mid.astype(np.float64) * f[3], dtype, 2.0,
              scale=np.abs(f[0] * f[2]) + np.abs(mid.astype(np.float64) * f[3]))


@pytest.mark.parametrize("dtype", FLOATS)
def test_cpu_strided_kernel_by_rows(dtype):
    """The CPU's strided kernel (views, broadcasts the rows form does not take) walks rows of the
    last axis, each array stepped by its own stride, or tiles of the last two axes where an array
    is transposed: NumPy's values for transposes (2-D and 3-D, reversed, with partial tiles at
    both edges, a transposed output), a reversed and stepped view, a middle-axis broadcast in 3-D
    and 4-D, the index i, a raw parameter."""
    rng = np.random.default_rng(5)
    dt = np_dtype(dtype)
    k = ewkern.ElementwiseKernel("T x, T y", "T z, float64 j", "z = x * y + 1; j = i", "strided_rows")
    a = rng.standard_normal((37, 29)).astype(dt)
    b = rng.standard_normal((29, 37)).astype(dt)
    c = rng.standard_normal((5, 1, 33)).astype(dt)
    d = rng.standard_normal((5, 7, 33)).astype(dt)
    e = rng.standard_normal((3, 4, 1, 6)).astype(dt)
    f = rng.standard_normal((3, 1, 5, 6)).astype(dt)
    g = rng.standard_normal((70, 45)).astype(dt)     # rows of 90 bytes and more: tiles in every dtype
    h = rng.standard_normal((3, 45, 70)).astype(dt)
    m = rng.standard_normal((3, 70, 45)).astype(dt)
    for x, y in ((a.T, b), (a[::-2, 1::3], b[:19:1, ::-4][:, :10]), (c, d), (d[:, ::-1], c), (e, f),
                 (g.T, g.T[::-1].copy()), (g[::-1].T, g.T[:, ::-1]), (h.transpose(0, 2, 1), m),
                 (h[:, ::-1].transpose(0, 2, 1), m.transpose(0, 2, 1).copy().transpose(0, 2, 1))):
        z, j = k(x, y)
        assert k._last_path == "strided"
        ref = x.astype(np.float64) * y.astype(np.float64) + 1
        close(z, ref, dtype, 2.0, scale=np.abs(ref) + 1)
        np.testing.assert_array_equal(np.asarray(j), np.arange(ref.size, dtype=np.float64).reshape(ref.shape))
    # a transposed output: each element written once, where NumPy's own values put it
    zt, jt = np.zeros((45, 70), dt).T, np.zeros((70, 45))
    k(g, g[::-1], zt, jt)
    ref = g.astype(np.float64) * g[::-1].astype(np.float64) + 1
    close(zt, ref, dtype, 2.0, scale=np.abs(ref) + 1)
    np.testing.assert_array_equal(jt, np.arange(ref.size, dtype=np.float64).reshape(ref.shape))
    raw = ewkern.ElementwiseKernel("T x, raw T q", "T z", "z = x + q[i % 3]", "strided_rows_raw")
    q = rng.standard_normal(3).astype(dt)
    zr = raw(a.T, q)
    close(zr, a.T.astype(np.float64) + q.astype(np.float64)[np.arange(a.size).reshape(a.T.shape) % 3], dtype, 2.0,
          scale=np.abs(a.T.astype(np.float64)) + 3)


def test_cpu_float16_reduction_reads_every_half_exactly():
    """A CPU reduction converts its float16 inputs one by one (F16C's one-element form where the
    build has it, else the integer form): every finite half, summed by rows in float64 (exact),
    gives NumPy's float64 sums bit for bit; an infinity and a NaN come through as such."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isfinite(h)].reshape(-1, 64)
    k = ewkern.ReductionKernel("T x", "float64 y", "x", "a + b", "y = a", "0", "h16_sum", reduce_type="double")
    np.testing.assert_array_equal(np.asarray(k(h, axis=1)), h.astype(np.float64).sum(1))
    special = np.array([[1.0, np.inf], [np.nan, 2.0]], dtype=np.float16)
    r = np.asarray(k(special, axis=1))
    assert r[0] == np.inf and np.isnan(r[1])


def test_noncontiguous_and_broadcast_layouts():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 8))
    col = rng.standard_normal((6, 1))
    np.testing.assert_array_equal(axpy(a.T, col.T, 2.0), 2.0 * a.T + col.T)
    np.testing.assert_array_equal(axpy(a[:, ::3], a[:, 1::3], -1.0), -a[:, ::3] + a[:, 1::3])
    np.testing.assert_array_equal(axpy(a[::-1], 1.5, 3.0), 3.0 * a[::-1] + 1.5)
    # a 0-d array and a scalar
    np.testing.assert_array_equal(axpy(np.float64(2.0) * np.ones(()), a, 0.5), 0.5 * 2.0 + a)
    with pytest.raises(ValueError, match="do not broadcast"):
        axpy(a, rng.standard_normal(5), 1.0)


def test_output_overlapping_an_input():
    x = np.arange(10.0)
    k = ewkern.ElementwiseKernel("T x", "T y", "y = x * 2", "twice_inplace")
    k(x, x)   # the same view: in place
    np.testing.assert_array_equal(x, np.arange(10.0) * 2)
    x = np.arange(10.0)
    k(x[:-1], x[1:])   # shifted views: the input is read as it was
    np.testing.assert_array_equal(x, np.concatenate([[0.0], np.arange(9.0) * 2]))


def _bits16(a):
    return np.asarray(a).view(np.uint16)


def test_float16_bfloat16_round_to_nearest_even():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 200000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    # also ties, subnormals, overflow edges
    x = np.concatenate([x, np.float32([65504, 65519.99, 65520, 2**-24, 2**-25, 3 * 2**-26, 1 + 2**-11,
                                       1 + 3 * 2**-11, -0.0, np.inf, -np.inf, 1e-45, 3.4e38])])
    h = ewkern.ElementwiseKernel("float32 x", "float16 z", "z = x", "to_half")(x)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float16)
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(_bits16(h)[ok], _bits16(ref)[ok])
    assert np.all(np.isnan(h[~ok]))
    if BF16 is not None:
        b = ewkern.ElementwiseKernel("float32 x", "bfloat16 z", "z = x", "to_bf16")(x)
        with np.errstate(all="ignore"):
            refb = x.astype(BF16)
        okb = ~np.isnan(refb.astype(np.float32))
        np.testing.assert_array_equal(_bits16(b)[okb], _bits16(refb)[okb])
        # and back: 16-bit -> float32 exactly
        back = ewkern.ElementwiseKernel("bfloat16 x", "float32 z", "z = x", "from_bf16")(refb)
        np.testing.assert_array_equal(back[okb], refb.astype(np.float32)[okb])
    backh = ewkern.ElementwiseKernel("float16 x", "float32 z", "z = x", "from_half")(ref)
    np.testing.assert_array_equal(backh[ok], ref.astype(np.float32)[ok])


def test_float16_conversions_every_half_and_every_rounding_case():
    """The CPU's float16 conversions (branch-free, they vectorise; F16C in float16 tiles where the
    CPU has it): every one of the 65536 halves to float32 exactly (NaNs keep sign and payload and
    come out quiet, as F16C and IEEE 754 have it; NumPy keeps a signaling NaN signaling), and
    float32 to float16 round to nearest even for every float whose low 13 bits sit at or around a
    half's rounding point (2^19 x 6 inputs: every half's ties, both sides, subnormals, overflow),
    against NumPy; NaNs quiet, payload kept."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f = ewkern.ElementwiseKernel("float16 x", "float32 z", "z = x", "all_halves")(h.view(np.float16))
    want = h.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(f.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    hb = h[nan].astype(np.uint32)
    np.testing.assert_array_equal(f.view(np.uint32)[nan], ((hb & 0x8000) << 16) | 0x7fc00000 | ((hb & 0x3ff) << 13))
    # the same bits where the tile's tail converts by software (n not a multiple of 8)
    f7 = ewkern.ElementwiseKernel("float16 x", "float32 z", "z = x", "all_halves")(h[-7:].view(np.float16))
    np.testing.assert_array_equal(f7.view(np.uint32), f.view(np.uint32)[-7:])
    hi = np.arange(2**19, dtype=np.uint32) << 13
    x = (hi[:, None] | np.uint32([0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff])[None, :]).ravel().view(np.float32)
    z = ewkern.ElementwiseKernel("float32 x", "float16 z", "z = x", "all_rounding")(x)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float16)
    ok = ~np.isnan(x)
    np.testing.assert_array_equal(z.view(np.uint16)[ok], ref.view(np.uint16)[ok])
    ax = x.view(np.uint32)[~ok] & 0x7fffffff
    sign = (x.view(np.uint32)[~ok] >> 16) & 0x8000
    np.testing.assert_array_equal(z.view(np.uint16)[~ok], (sign | 0x7e00 | ((ax >> 13) & 0x3ff)).astype(np.uint16))


def test_math_names_and_integers():
    k = ewkern.ElementwiseKernel("T x", "T y", "y = max(exp(x) - 1, tanh(x)) + min(erf(x), sqrt(fabs(x)))",
                                 "mathy")
    x = np.linspace(-3, 3, 101)
    from math import erf
    ref = np.maximum(np.exp(x) - 1, np.tanh(x)) + np.minimum(np.vectorize(erf)(x), np.sqrt(np.abs(x)))
    close(k(x), ref, "float64", 8)
    ki = ewkern.ElementwiseKernel("int32 a, int32 b", "int64 c", "c = (long long)a * b + i", "imul")
    a = np.arange(-5, 5, dtype=np.int32)
    np.testing.assert_array_equal(ki(a, 3), a.astype(np.int64) * 3 + np.arange(10))


def test_size_with_raw_only_and_loop_prep():
    k = ewkern.ElementwiseKernel("raw T x", "raw T y", "y[i] = x[i] * 2 + x.size()", "rawonly")
    x = np.arange(6.0)
    y = np.zeros(6)
    k(x, y, size=6)
    np.testing.assert_array_equal(y, x * 2 + 6)
    with pytest.raises(ValueError, match="undecided"):
        k(x, y)
    with pytest.raises(ValueError, match="size= can be given only"):
        axpy(x, x, 1.0, size=3)
    # CuPy's size is a Py_ssize_t: a float or a str is a TypeError, not truncated (2.5 ran 2 elements)
    for bad in (2.5, "6", True):
        y[:] = -1
        with pytest.raises(TypeError, match="rawonly: size must be an int or None"):
            k(x, y, size=bad)
        np.testing.assert_array_equal(y, -1)
    k(x, y, size=np.int64(3))
    np.testing.assert_array_equal(y, np.r_[x[:3] * 2 + 6, [-1] * 3])


# ---- frameworks -------------------------------------------------------------------------------

@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", FLOATS)
def test_torch_in_torch_out(dtype):
    t = torch.randn(3, 17, dtype=getattr(torch, dtype))
    row = torch.randn(17, dtype=getattr(torch, dtype))
    r = squared_diff_generic(t, row)
    assert isinstance(r, torch.Tensor) and r.dtype == t.dtype and r.shape == (3, 17)
    ref = (t.double() - row.double()) ** 2
    close(r.double().numpy(), ref.numpy(), dtype, 2)
    # non-contiguous torch input
    r2 = squared_diff_generic(t.T, t.T)
    assert isinstance(r2, torch.Tensor)
    assert float(r2.abs().max()) == 0.0 and r2.shape == (17, 3)
    s = l2norm(t.float(), axis=1)
    assert isinstance(s, torch.Tensor)
    close(s.numpy(), torch.linalg.vector_norm(t.double(), dim=1).numpy(), "float32", 8)


def test_ewkern_array_in_array_out():
    a = ewkern.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), device="cpu")
    r = squared_diff_generic(a, 1.0)
    assert isinstance(r, ewkern.Array) and r.dtype == "float32"
    np.testing.assert_array_equal(r.numpy(), (np.arange(12, dtype=np.float32).reshape(3, 4) - 1) ** 2)


# ---- reductions -------------------------------------------------------------------------------

def test_reduction_axes_identity_and_determinism():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 6, 7))
    ssum = ewkern.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "ssum")
    for axis in [None, 0, 1, 2, -1, (0, 2), (1,)]:
        close(ssum(x, axis=axis), x.sum(axis=axis), "float64", 64)
        assert ssum(x, axis=axis, keepdims=True).shape == x.sum(axis=axis, keepdims=True).shape
    big = rng.standard_normal(100003).astype(np.float32)
    r1, r2 = ssum(big), ssum(big)
    assert r1.tobytes() == r2.tobytes()
    close(r1, big.astype(np.float64).sum(), "float32", 2000)
    vmax = ewkern.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", None, "vmax")
    np.testing.assert_array_equal(vmax(x, axis=1), x.max(axis=1))
    with pytest.raises(ValueError, match="zero elements"):
        vmax(np.zeros((0, 3)), axis=0)
    np.testing.assert_array_equal(ssum(np.zeros((0, 3)), axis=0), np.zeros(3))
    # mean with the index sizes, scalar input broadcast, float16 input reduced in float
    mean = ewkern.ReductionKernel("T x, T w", "T y", "x * w", "a + b", "y = a / (_in_ind.size() / _out_ind.size())",
                                  "0", "wmean")
    close(mean(x, 2.0, axis=2), 2.0 * x.mean(axis=2), "float64", 64)
    h = rng.standard_normal((4, 300)).astype(np.float16)
    close(ssum(h, axis=1), h.astype(np.float64).sum(1), "float16", 4)
    out = np.empty(5)
    assert ssum(x, axis=(1, 2), out=out) is out
    np.testing.assert_allclose(out, x.sum((1, 2)))
    with pytest.raises(ValueError, match="out of bounds"):
        ssum(x, axis=3)
    with pytest.raises(ValueError, match="has shape"):
        ssum(x, axis=0, out=np.empty(3))


# ---- errors -----------------------------------------------------------------------------------

def test_bad_params_and_arguments():
    with pytest.raises(ValueError, match="wrong type 'float'"):
        ewkern.ElementwiseKernel("float x", "float y", "y = x", "k")
    with pytest.raises(ValueError, match="wrong type 'half'"):
        ewkern.ElementwiseKernel("half x", "T y", "y = x", "k")
    with pytest.raises(ValueError, match="syntax error"):
        ewkern.ElementwiseKernel("x", "T y", "y = x", "k")
    with pytest.raises(ValueError, match="unknown keyword 'const'"):
        ewkern.ElementwiseKernel("const T x", "T y", "y = x", "k")
    with pytest.raises(ValueError, match="used twice"):
        ewkern.ElementwiseKernel("T x, T x", "T y", "y = x", "k")
    with pytest.raises(ValueError, match="C identifier"):
        ewkern.ElementwiseKernel("T x", "T y", "y = x", "my kernel")
    x32, x64 = np.ones(3, np.float32), np.ones(3)
    with pytest.raises(TypeError, match="wrong number of arguments: expected 2 inputs or 3"):
        squared_diff(x32)
    with pytest.raises(TypeError, match="type is mismatched: x is float32"):
        squared_diff(x64, x32)
    with pytest.raises(TypeError, match="T is already float64"):
        squared_diff_generic(x64, x32)
    with pytest.raises(TypeError, match="cannot determine the type T"):
        squared_diff_generic(1.0, 2.0)
    with pytest.raises(TypeError, match="must be an array or a scalar"):
        squared_diff(x32, [1, 2, 3])
    with pytest.raises(ValueError, match="output z has shape"):
        squared_diff(x32, x32, np.empty(1, np.float32))
    with pytest.raises(ValueError, match="do not broadcast"):
        squared_diff(x32, x32, np.empty(4, np.float32))
    with pytest.raises(TypeError, match="run-time kernels do not take"):
        squared_diff_generic(np.ones(3, np.complex64), np.ones(3, np.complex64))
    assert [p.name for p in parse_params("T x, raw float32 y", False, "k")] == ["x", "y"]


def test_compile_error_names_kernel_and_line():
    k = ewkern.ElementwiseKernel("T x", "T y", "T t = x * 2;\ny = t + undefined_name", "broken")
    with pytest.raises(ewkern.rtc.CompileError) as e:
        k(np.ones(3))
    msg = str(e.value)
    assert "'broken'" in msg and "operation, line 2: y = t + undefined_name" in msg


# ---- the caches -------------------------------------------------------------------------------

def test_disk_cache_written_reused_and_damaged_entry_recompiled(cache_dir):
    src = "y = x * 3 + 1"
    k = ewkern.ElementwiseKernel("T x", "T y", src, "cached")
    x = np.arange(5.0)
    np.testing.assert_array_equal(k(x), x * 3 + 1)
    files = [f for f in os.listdir(cache_dir) if f.endswith(".so")]
    assert len(files) == 1
    path = os.path.join(cache_dir, files[0])
    good = open(path, "rb").read()
    assert good.startswith(b"EWRTC1 ")
    key = files[0][:-3]
    assert _build.disk_get(key, ".so") == good[good.index(b"\n") + 1:]
    # damage it: the next process (memory cache cleared) must not load it, and rewrites it
    with open(path, "r+b") as f:
        f.seek(len(good) // 2)
        f.write(b"\xff" * 64)
    assert _build.disk_get(key, ".so") is None
    _build._loaded.clear()
    k2 = ewkern.ElementwiseKernel("T x", "T y", src, "cached")
    np.testing.assert_array_equal(k2(x), x * 3 + 1)
    assert open(path, "rb").read() == good
    # truncated to nothing
    open(path, "wb").close()
    _build._loaded.clear()
    np.testing.assert_array_equal(ewkern.ElementwiseKernel("T x", "T y", src, "cached")(x), x * 3 + 1)
    assert open(path, "rb").read() == good
    assert not [f for f in os.listdir(cache_dir) if f.startswith(".tmp-")]


def test_warm_call_skips_generation(monkeypatch):
    k = ewkern.ElementwiseKernel("T x", "T y", "y = x + 1", "warm")
    x = np.arange(4.0)
    k(x)

    def boom(*a, **kw):
        raise AssertionError("regenerated")
    monkeypatch.setattr(_codegen, "elementwise_source", boom)
    np.testing.assert_array_equal(k(x), x + 1)


def test_warm_calls_run_by_plan_with_fresh_pointers_scalars_and_results(full_calls):
    """A second call of the same signature runs by the first one's plan: new data, new scalars,
    fresh allocated results, given outputs written and returned; another signature (a
    misaligned view, outputs given) takes the full path once and then has its own plan."""
    k = ewkern.ElementwiseKernel("T x, T y, float32 s", "T z", "z = x * s + y", "plan_fma")
    rng = np.random.default_rng(5)

    def fma_close(z, x, s, y):   # |error| within 2 float32 ulp of the terms' size
        close(z, x.astype(np.float64) * np.float32(s) + y, "float32", ulps=2,
              scale=np.abs(x.astype(np.float64) * np.float32(s)) + np.abs(y))

    def pair(n=1001):
        return (rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32))

    x, y = pair()
    z0 = k(x, y, 2.0)
    assert full_calls[0] == 1 and len(k._plans) == 1
    fma_close(z0, x, 2, y)
    for s in (0.5, -3.0, 7):
        x, y = pair()
        z = k(x, y, s)
        assert not np.shares_memory(z, z0)
        fma_close(z, x, s, y)
    assert full_calls[0] == 1
    z0[:] = 1.0   # the plan kept no reference to an earlier result
    x, y = pair()
    fma_close(k(x, y, 1.5), x, 1.5, y)
    # outputs given: a new signature, then its plan
    x, y = pair()
    out = np.full(1001, np.nan, np.float32)
    assert k(x, y, 2.0, out) is out
    fma_close(out, x, 2, y)
    assert full_calls[0] == 2
    x, y = pair()
    assert k(x, y, -1.0, out) is out
    fma_close(out, x, -1.0, y)
    assert full_calls[0] == 2
    # a view 4 bytes past a 16-byte boundary is another signature
    x, y = pair(1002)
    fma_close(k(x[1:], y[1:], 3.0), x[1:], 3, y[1:])
    assert full_calls[0] == 3
    # torch tensors of the same signature: the plan runs, the result is torch's
    if torch is not None:
        x, y = pair()
        r = k(torch.from_numpy(x), torch.from_numpy(y), 2.0)
        assert isinstance(r, torch.Tensor)
        fma_close(r.numpy(), x, 2, y)
        assert full_calls[0] == 3


def test_warm_call_overlap_read_only_and_in_place(full_calls):
    """After a plan is recorded, an output that overlaps an input other than as itself still
    reads the input as it was (the full path's copy), a read-only output is refused with
    nothing written, and the very same view runs in place by the plan."""
    k = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "plan_overlap")
    rng = np.random.default_rng(6)
    a = rng.standard_normal(1001)
    b = rng.standard_normal(1000)
    c = np.zeros(1001)
    k(a[:-1], b, c[1:])            # records the signature (aligned in, offset 8 out)
    assert full_calls[0] == 1
    x = rng.standard_normal(1001)
    want = x.copy()
    want[1:] = x[:-1] * 2 + b
    k(x[:-1], b, x[1:])            # the same signature, but z over x shifted by one
    np.testing.assert_array_equal(x, want)
    assert full_calls[0] == 2
    ro = np.zeros(1000)
    ro.setflags(write=False)
    k(a[:-1], b, np.zeros(1000))   # the signature of an aligned output
    n = full_calls[0]
    with pytest.raises(ValueError, match="plan_overlap: output z is read-only"):
        k(a[:-1], b, ro)
    assert not ro.any() and full_calls[0] == n + 1
    x = rng.standard_normal(1000)
    want = x * 2 + b
    assert k(x, b, x) is x         # in place: the plan runs it
    np.testing.assert_array_equal(x, want)
    assert full_calls[0] == n + 1
    x = rng.standard_normal(1000)
    want = x * 2 + b
    k(x, b, x)
    np.testing.assert_array_equal(x, want)
    assert full_calls[0] == n + 1



def test_warm_reduction_calls_by_plan_per_axis_keepdims_and_out(full_calls):
    """A ReductionKernel's plan is per signature and per (axis, keepdims): each runs by its own
    plan once recorded, out= and a positional output are one signature, results are fresh."""
    ssum = ewkern.ReductionKernel("T x, T w", "T y", "x * w", "a + b", "y = a", "0", "plan_wsum")
    rng = np.random.default_rng(7)
    calls = [dict(axis=1), dict(axis=(0, 2)), dict(axis=[0, 2]), dict(axis=-1, keepdims=True), dict()]
    for rep in range(3):
        for kw in calls:
            x = rng.standard_normal((5, 6, 7))
            w = float(rep + 1)
            ax = tuple(kw["axis"]) if isinstance(kw.get("axis"), list) else kw.get("axis")
            want = (x * w).sum(axis=ax, keepdims=kw.get("keepdims", False))
            got = ssum(x, w, **kw)
            assert got.shape == want.shape
            close(got, want, "float64", 64, scale=np.abs(x * w).sum(axis=ax, keepdims=kw.get("keepdims", False)))
        first = full_calls[0]
        if rep == 0:
            assert first == len(calls) - 1   # axis=[0, 2] ran by axis=(0, 2)'s plan
        else:
            assert full_calls[0] == len(calls) - 1
    out = np.empty(5)
    x = rng.standard_normal((5, 6, 7))
    assert ssum(x, 1.0, out=out, axis=(1, 2)) is out
    n = full_calls[0]
    x = rng.standard_normal((5, 6, 7))
    assert ssum(x, 2.0, out, axis=(1, 2)) is out   # the positional output: the same plan
    close(out, 2 * x.sum((1, 2)), "float64", 64, scale=2 * np.abs(x).sum((1, 2)))
    assert full_calls[0] == n
    with pytest.raises(TypeError, match="axis must be an int"):
        ssum(x, 1.0, axis=True)


def test_warm_row_kernel_calls_by_plan(full_calls):
    """A RowKernel (rmsnorm with a weight row, eps a scalar) runs warm calls by its plan with new
    data and scalars; another row length is another plan."""
    rms = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                           "y = x * rsqrt(a / _row_size + eps) * w", "0", "plan_rmsnorm")
    rng = np.random.default_rng(8)
    for cols in (64, 96):
        for eps in (1e-6, 0.5, 2.0):
            x = rng.standard_normal((7, cols)).astype(np.float32)
            w = rng.standard_normal(cols).astype(np.float32)
            x64 = x.astype(np.float64)
            want = x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + np.float32(eps)) * w
            close(rms(x, w, eps), want, "float32", 8)
    assert full_calls[0] == 2 and len(rms._plans) == 2



# ---- CUDA sources through NVRTC (no GPU needed) -----------------------------------------------

def _nvrtc():
    try:
        return _build.nvrtc()
    except RuntimeError as e:
        pytest.skip(str(e))


def _layout(mode, ndim, specs):
    """specs: (param string, dtype, kind, raw ndim)"""
    args = []
    for ps, dt, kind, rnd in specs:
        (p,) = parse_params(ps, ps.endswith("_out"), "k")
        args.append((p, dt, kind, rnd))
    return _codegen.Layout(mode, ndim, args)


def test_nvrtc_missing_message(monkeypatch):
    monkeypatch.setattr(_build, "_nvrtc", None)
    monkeypatch.setenv("EWKERN_NVRTC", "/nonexistent/libnvrtc.so.13")
    with pytest.raises(RuntimeError, match=r"pip install ewkern\[nvrtc\]"):
        _build.nvrtc()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["contig", "strided"])
def test_nvrtc_compiles_elementwise_to_ptx(dtype, mode):
    nv = _nvrtc()
    lay = _layout(mode, 2, [("T x", dtype, "array", 0), ("raw T y", dtype, "raw", 1), ("T a", dtype, "scalar", 0),
                            ("T z_out", dtype, "array", 0)])
    tdefs = _codegen.typedefs((("T", dtype),), (), (), (), ())
    src, entry = _codegen.elementwise_source("cuda", "ewtest", lay, "z_out = a * exp(x) + y[_ind.size() - i - 1]",
                                             "", "", "", tdefs)
    ptx, kind, _ = _build.compile_cuda("ewtest", src, (9, 0), ptx_only=True)
    assert kind == "ptx"
    text = ptx.decode(errors="replace")
    assert f".entry {entry}" in text and "griddepcontrol.wait" in text
    if nv.has_cubin:
        cubin, kind, _ = _build.compile_cuda("ewtest", src, (9, 0))
        assert kind == "cubin" and cubin[:4] == b"\x7fELF"


def test_nvrtc_compiles_reduction_and_reports_user_line():
    _nvrtc()
    inl = _layout("strided", 2, [("T x", "float16", "array", 0)])
    outl = _layout("strided", 1, [("T y_out", "float16", "array", 0)])
    tdefs = _codegen.typedefs((("T", "float16"),), (), (), (), ())
    src, entry = _codegen.reduction_source("cuda", "l2n", inl, outl, True, "x * x", "a + b", "y_out = sqrt(a)", "0",
                                           "float", "", tdefs)
    ptx, _, _ = _build.compile_cuda("l2n", src, (8, 0), ptx_only=True)
    assert f".entry {entry}" in ptx.decode(errors="replace")
    bad, _ = _codegen.elementwise_source("cuda", "bad", _layout("contig", 1, [("T x", "float32", "array", 0)]),
                                         "x +* 2", "", "", "", "typedef float T;")
    with pytest.raises(ewkern.rtc.CompileError, match=r"(?s)'bad'.*operation, line 1: x \+\* 2"):
        _build.compile_cuda("bad", bad, (9, 0), parts={"operation": "x +* 2"}, ptx_only=True)


def test_writes_only_finds_reads_of_an_output():
    w = _codegen.writes_only
    assert w("o = a * b + c", "o") and w("o = a > 0 ? a : -a", "o") and w("foo = o2; o = 1", "o")
    assert w("{ o = a; }", "o")
    assert not w("o += a", "o") and not w("o = o * 2", "o") and not w("if (o == 0) o = 1", "o")
    assert not w("f(o); o = 1", "o") and not w("o++", "o") and not w("p = &o", "o")
    # assigned under a condition: the element keeps its value where the condition fails (CuPy's
    # outputs are references), so the kernel must load it (conservative: any branching statement)
    assert not w("if (a > 0) o = a", "o") and not w("a > 0 && (o = a)", "o") and not w("c ? (o = 1) : 0", "o")
    assert not w("if (a > 0) o = a; else o = -a", "o") and not w("for (int k = 0; k < 2; ++k) o = k", "o")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_an_output_assigned_under_a_condition_keeps_its_other_elements(dtype):
    """`if (x > 0) z = x;` writes only where x > 0; elsewhere z keeps what it held (CuPy's
    semantics), on the CPU's element loop and its float16 tiles alike."""
    k = ewkern.ElementwiseKernel("T x", "T z", "if (x > 0) z = x", "cond_assign")
    x = np.linspace(-3, 3, 1001).astype(np_dtype(dtype))
    z = np.full_like(x, 7)
    k(x, z)
    want = np.where(x.astype(np.float64) > 0, x.astype(np.float64), 7.0)
    np.testing.assert_array_equal(z.astype(np.float64), want)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_an_output_assigned_under_a_condition_keeps_its_other_elements(dtype):
    """The default path's vector body loads an output assigned under a condition (CuPy's
    outputs are references): elsewhere it keeps what it held."""
    k = ewkern.ElementwiseKernel("T x", "T z", "if (x > 0) z = x", "cond_assign_gpu")
    x = torch.linspace(-3, 3, 100003, device="cuda").to(getattr(torch, dtype))
    z = torch.full_like(x, 7)
    k(x, z)
    assert k._last_path == "vector"
    torch.testing.assert_close(z, torch.where(x > 0, x, torch.full_like(x, 7)), rtol=0, atol=0)


class _FakeArr:
    def __init__(self, ptr, dtype):
        self.ptr, self.dtype = ptr, dtype


def test_vector_head_aligns_every_array_together():
    h = ewkern.rtc._kernel._vector_head
    f32 = lambda p: _FakeArr(p, "float32")
    f16 = lambda p: _FakeArr(p, "float16")
    assert h([f32(4096), f32(8192)], 4) == 0
    assert h([f32(4096 + 4), f32(8192 + 4)], 4) == 3          # both 12 bytes short of 16
    assert h([f32(4096 + 4), f32(8192 + 8)], 4) is None      # offsets differ: the fallback kernel
    # float16 beside float32: vectors of 4 elements, 8 bytes of the float16 array
    assert h([f32(4096 + 8), f16(2048 + 4)], 4) == 2
    assert h([f32(4096 + 8), f16(2048 + 2)], 4) is None
    assert h([_FakeArr(4096 + 8, "float64"), f16(2048 + 2)], 2) == 1
    assert h([_FakeArr(4096, "float64"), f16(2048 + 2)], 2) is None


@pytest.mark.parametrize("dtypes", [("float32",) * 4, ("float16",) * 4, ("bfloat16",) * 4, ("float64",) * 4,
                                    ("float32", "float16", "float32", "float32")])
def test_nvrtc_compiles_vector_forms(dtypes):
    """The default path's body for a user kernel: its four forms, 16-byte loads of the widest
    array, stores by the launch's policy (write-back or streaming under the params' wb), the PDL
    wait and the L2 prefetch."""
    _nvrtc()
    specs = [(f"{dt} {n}", dt, "array", 0) for n, dt in zip("abc", dtypes[:3])]
    lay = _layout("vector", 1, specs)
    (o,) = parse_params(f"{dtypes[3]} o", True, "k")
    lay = _codegen.Layout("vector", 1, list(lay.args) + [(o, dtypes[3], "array", 0)])
    src, entries = _codegen.vector_source("vfma", lay, "o = a * b + c", "", "", "", "", set())
    ptx, _, _ = _build.compile_cuda("vfma", src, (9, 0), ptx_only=True)
    text = ptx.decode(errors="replace")
    assert all(f".entry {e}" in text for e in entries) and len(entries) == 4
    assert "ld.global.v4" in text or "ld.global.v2.f64" in text
    assert "griddepcontrol.wait" in text and "prefetch.global.L2" in text
    assert "@w st.global.v4.b32" in text and "@!w st.global.cs.v4.b32" in text and "P.wb" in src
    # an output the body reads is loaded with the inputs
    src2, _ = _codegen.vector_source("vacc", lay, "o += a * b + c", "", "", "", "", {"o"})
    assert "_r_o[_q] = " in src2 and "_r_o[_q] = " not in src


@pytest.mark.parametrize("op", ["o = exp(a)", "o = 1.0 / (1.0 + exp(-a))", "o = a / (1.0 + exp(-a))"])
def test_vector_forms_maxnreg_twin_does_not_spill(op, tmp_path):
    """The host's twin of a float64 user kernel's forms (__maxnreg__(64) in place of
    __launch_bounds__(1024), which ptxas met for exp and sigmoid at 1-2 vectors a thread by spilling
    at 32 registers): every form assembles for sm_90 without a spill, at most 64 registers."""
    _nvrtc()
    lay = _layout("vector", 1, [("float64 a", "float64", "array", 0)])
    (o,) = parse_params("float64 o", True, "k")
    lay = _codegen.Layout("vector", 1, list(lay.args) + [(o, "float64", "array", 0)])
    src, entries = _codegen.vector_source("v64", lay, op, "", "", "", "", set(), regs64=True)
    assert src.count("__maxnreg__(64)") == 4 and "__launch_bounds__" not in src
    ptx, _, _ = _build.compile_cuda("v64", src, (9, 0), ptx_only=True)
    assert ptx.decode(errors="replace").count(".maxnreg 64") == 4
    regs = ptxas_registers(ptx, tmp_path)    # fails on a spill
    assert sorted(regs) == sorted(entries) and max(regs.values()) <= 64


@pytest.mark.parametrize("out,user,want", [("float16", (), "div.full.f32"), ("bfloat16", (), "div.full.f32"),
                                             ("float16", ("--prec-div=true",), "div.rn.f32"),
                                             ("float32", (), "div.rn.f32")])
def test_sixteen_bit_outputs_divide_approximately(out, user, want):
    """A kernel whose every output is 16-bit divides in float by div.full.f32 (HALF_OUT_OPTIONS,
    ahead of the user's options, which win: --prec-div=true keeps IEEE division); a float32 output
    keeps IEEE division (div.rn.f32, with its slow path's calls)."""
    from ewkern.rtc._kernel import HALF_OUT_OPTIONS, _nvrtc_options
    assert _nvrtc_options(("float16", "bfloat16"), ("-lineinfo",)) == HALF_OUT_OPTIONS + ("-lineinfo",)
    assert _nvrtc_options(("float16", "float32"), ()) == () and _nvrtc_options((), ()) == ()
    _nvrtc()
    lay = _layout("vector", 1, [(f"{out} a", out, "array", 0), (f"{out} b", out, "array", 0)])
    (o,) = parse_params(f"{out} o", True, "k")
    lay = _codegen.Layout("vector", 1, list(lay.args) + [(o, out, "array", 0)])
    src, _ = _codegen.vector_source("vdiv", lay, "o = a / (1 + exp(-b))", "", "", "", "", set())
    ptx = _build.compile_cuda("vdiv", src, (9, 0), options=_nvrtc_options((out,), user), ptx_only=True)[0]
    text = ptx.decode(errors="replace")
    other = "div.rn.f32" if want == "div.full.f32" else "div.full.f32"
    assert want in text and other not in text


@pytest.mark.parametrize("op,nin", [("o = a * b + c", 3), ("o = a + b", 2), ("o = a / (1 + exp(-b))", 2)])
def test_vector_forms_bfloat16_without_spill(op, nin, tmp_path):
    """bfloat16 inputs held as their 32-bit words (BfWords): every form, 4 vectors a thread
    included, assembles for sm_90 under __launch_bounds__(1024) without a spill. Held as 16-bit
    values the 4-vector forms of these spilled 788, 80 and 92 bytes, and the plan's cap kept
    bfloat16 user kernels at 2 vectors a thread."""
    _nvrtc()
    specs = [(f"bfloat16 {n}", "bfloat16", "array", 0) for n in "abc"[:nin]]
    lay = _layout("vector", 1, specs)
    (o,) = parse_params("bfloat16 o", True, "k")
    lay = _codegen.Layout("vector", 1, list(lay.args) + [(o, "bfloat16", "array", 0)])
    src, entries = _codegen.vector_source("vbf", lay, op, "", "", "", "", set())
    assert src.count("ewrtc::Held<ewrtc::bf16_bits, 8>::type _r_") == nin and "ewrtc::elem(_r_a[_q], _k)" in src
    ptx, _, _ = _build.compile_cuda("vbf", src, (9, 0), ptx_only=True)
    regs = ptxas_registers(ptx, tmp_path)    # fails on a spill
    assert sorted(regs) == sorted(entries) and max(regs.values()) <= 64
    # beside float32 (vectors of 4 elements, two words of bfloat16) and float64 (2, one word)
    for wide in ("float32", "float64"):
        lay2 = _layout("vector", 1, [(f"{wide} a", wide, "array", 0), ("bfloat16 b", "bfloat16", "array", 0)])
        (o2,) = parse_params(f"{wide} o", True, "k")
        lay2 = _codegen.Layout("vector", 1, list(lay2.args) + [(o2, wide, "array", 0)])
        src2, _ = _codegen.vector_source("vbm", lay2, "o = a * b", "", "", "", "", set())
        assert src2.count("ewrtc::Held<ewrtc::bf16_bits, ") == 1
        ptxas_registers(_build.compile_cuda("vbm", src2, (9, 0), ptx_only=True)[0], tmp_path)


@pytest.mark.parametrize("aligned", [True, False])
def test_rows_engine_takes_the_last_vectors_as_one_step(aligned, tmp_path):
    """The aligned rows forms take a lane's last 1-3 vectors as one step, every load under its
    bound ahead of the math (a loop of one vector a pass waited for each load: two DRAM round
    trips for 16-bit rows of 4096 at 256 lanes); the chunked forms keep the loop. Both build for
    sm_90, the aligned one in no more registers than the loop took (54 for this mse)."""
    _nvrtc()
    lay = _layout("contig", 1, [("T a", "float16", "array", 0), ("T b", "float16", "array", 0)])
    out = _layout("strided", 1, [("T y_out", "float16", "array", 0)])
    mse = "((float)a - (float)b) * ((float)a - (float)b)"
    src, entries = _codegen.reduction_rows_source("msetail", lay, out, 8, mse, "a + b", "y_out = a", "0", "float", "",
                                                  _codegen.typedefs((("T", "float16"),), [], [], [], []),
                                                  True, aligned, 0)
    step = "if (_v < _nv) {" in src and "_r_a[3];" in src and "if (_v + _q * _G < _nv) {" in src
    loop = re.search(r"for \(; _v < (_nv|_v1); _v \+= _G\)", src) is not None
    assert (step, loop) == ((True, False) if aligned else (False, True))
    ptx, _, _ = _build.compile_cuda("msetail", src, (9, 0), ptx_only=True)
    if aligned:
        assert ptxas_registers(ptx, tmp_path)[entries[0]] <= 54


@pytest.mark.parametrize("E", [1, 4, 8])
def test_nvrtc_compiles_reduction_rows_engine(E):
    _nvrtc()
    dt = {1: "float32", 4: "float32", 8: "float16"}[E]
    lay = _layout("contig", 1, [("T a", dt, "array", 0), ("T b", dt, "array", 0), ("float32 s", "float32", "scalar", 0)])
    out = _layout("strided", 1, [("float32 y_out", "float32", "array", 0)])
    src, entries = _codegen.reduction_rows_source("msek", lay, out, E, "(a - b) * (a - b) * s", "a + b",
                                                  "y_out = sqrt(a / _in_ind.size() * _out_ind.size())", "0",
                                                  "float", "", f"typedef {'float' if E != 8 else 'float'} T;")
    ptx, _, _ = _build.compile_cuda("msek", src, (9, 0), ptx_only=True)
    text = ptx.decode(errors="replace")
    assert all(f".entry {e}" in text for e in entries) and len(entries) == 2
    assert "griddepcontrol.wait" in text and "bar.sync" in text
    if E > 1:
        assert "ld.global.v4" in text


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_engine_forms_fit_their_occupancy(dtype, tmp_path):
    """The rows engine's entries by ptxas's resource report for sm_90, mse over rows of two
    inputs: every form holds at least 5 blocks of 256 an SM (at 4, 64 registers with 64-bit
    divisions for the group and chunk, Nsight Compute put the single-launch gap to torch.compile
    on that occupancy), and the aligned short form (one chunk a row, no head or tail, 32-bit
    vector indices) at least 6; without spills in any. Built with __launch_bounds__(256, 4) (what
    the host asks for first, and keeps where the entry has no local memory), the aligned forms keep
    every load of the 4-vector step ahead of the math in more registers, still without spills."""
    _nvrtc()
    E = 4 if dtype == "float32" else 8
    lay = _layout("contig", 1, [("T a", dtype, "array", 0), ("T b", dtype, "array", 0)])
    out = _layout("strided", 1, [("T y_out", dtype, "array", 0)])
    blocks, regs = {}, {}
    for full in (False, True):
        for aligned in (False, True):
            for bound in ((0, 4) if aligned else (0,)):
                src, entries = _codegen.reduction_rows_source("msew", lay, out, E,
                                                              "((float)a - (float)b) * ((float)a - (float)b)",
                                                              "a + b", "y_out = a", "0", "float", "",
                                                              _codegen.typedefs((("T", dtype),), [], [], [], []),
                                                              full, aligned, bound)
                assert ("const int _G = 256," in src) == full and ("_task / _ewrtc_PP.nchunks" in src) == (not aligned)
                assert (f"__launch_bounds__(256, {bound}) ewrtc_msew_rows" in src) == (bound > 0)
                assert "__launch_bounds__(256) ewrtc_msew_comb" in src
                ptx, _, _ = _build.compile_cuda("msew", src, (9, 0), ptx_only=True)
                regs[full, aligned, bound] = ptxas_registers(ptx, tmp_path)[entries[0]]
                if not bound:
                    blocks[full, aligned] = blocks_per_sm(regs[full, aligned, bound], _codegen.ROWS_BLOCK)
    assert min(blocks.values()) >= 5 and blocks[False, True] >= 6 and blocks[True, True] >= 6, blocks
    for full in (False, True):   # the bound lets ptxas keep more in flight: more registers, 4 blocks
        assert regs[full, True, 0] < regs[full, True, 4] <= 64, regs


def test_broadcast_layout_kinds():
    K = ewkern.rtc._kernel
    Arr = lambda ptr, dt, shape: K._Arr(None, dt, shape, K._c_strides(shape, K.DTYPES[dt][2]), ptr, None, "cuda:0")
    shape = (64, 4096)
    ps = parse_params("T x, T r, T c, T s", False, "k") + parse_params("T o", True, "k")
    arrs = {"x": Arr(1 << 20, "float32", shape), "r": Arr(2 << 20, "float32", (64, 1)),
            "c": Arr(3 << 20, "float32", (4096,)), "s": Arr(4 << 20, "float32", (1,)), "o": Arr(5 << 20, "float32", shape)}
    largs = [(p, "float32", "array", 0) for p in ps]
    values = {k: (a, K._broadcast_strides(a, shape)) for k, a in arrs.items()}
    got = K._broadcast_layout(largs, values, shape)
    assert [k for _, _, k, _ in got] == ["array", "brow", "bcol", "bone", "array"]
    # a row of 4098 floats is not a whole number of 4-element vectors; a misaligned row vector; an
    # output that broadcasts: the strided kernel
    shape2 = (64, 4098)
    a2 = {k: Arr(a.ptr, "float32", shape2 if a.shape == shape else a.shape) for k, a in arrs.items() if k != "c"}
    a2["c"] = Arr(3 << 20, "float32", (4098,))
    assert K._broadcast_layout(largs, {k: (a, K._broadcast_strides(a, shape2)) for k, a in a2.items()}, shape2) is None
    arrs["c"] = Arr((3 << 20) + 4, "float32", (4096,))
    assert K._broadcast_layout(largs, {k: (a, K._broadcast_strides(a, shape)) for k, a in arrs.items()}, shape) is None


def test_nvrtc_compiles_vector_broadcast_kinds():
    _nvrtc()
    lay = _layout("vector", 1, [("T x", "float16", "array", 0), ("T r", "float16", "brow", 0),
                                ("float32 c", "float32", "bcol", 0), ("T s", "float16", "bone", 0),
                                ("T o_out", "float16", "array", 0)])
    src, entries = _codegen.vector_source("bk", lay, "o_out = x * r + c * s", "", "", "", "typedef float T;", set())
    assert "ewrtc::hold(_u_c + _v % _cvec)" in src and "_v / _cvec" in src
    # every read of an input comes after PDL's wait (before it, only L2 prefetches): the previous
    # kernel may be writing any of them
    run = src[src.index("void ewrtc_bk_run"):]
    wait = run.index("pdl_wait();")
    for read in ("ewrtc::ld(", "ewrtc::hold("):
        assert run.index(read) > wait, read
    ptx, _, _ = _build.compile_cuda("bk", src, (9, 0), ptx_only=True)
    assert all(f".entry {e}" in ptx.decode(errors="replace") for e in entries)


# ---- the GPU (skipped without one) ------------------------------------------------------------

@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", FLOATS)
def test_gpu_elementwise_and_reduction(dtype):
    tdt = getattr(torch, dtype)
    x = torch.randn(3, 1001, dtype=tdt, device="cuda")
    row = torch.randn(1001, dtype=tdt, device="cuda")
    r = squared_diff_generic(x, row)
    assert r.is_cuda and r.dtype == tdt
    close(r.double().cpu().numpy(), ((x.double() - row.double()) ** 2).cpu().numpy(), dtype, 2)
    r = axpy(x[:, 1:].contiguous(), x[:, 1:].contiguous(), 2.0)
    close(r.double().cpu().numpy(), (3 * x[:, 1:].double()).cpu().numpy(), dtype, 2)
    s = l2norm(x.float(), axis=1)
    close(s.cpu().numpy(), torch.linalg.vector_norm(x.double(), dim=1).cpu().numpy(), "float32", 64)
    a = ewkern.asarray(np.arange(9.0, dtype=np.float32), device="cuda:0")
    y = add_reverse(a, a)
    assert isinstance(y, ewkern.Array)
    np.testing.assert_array_equal(y.numpy(), np.full(9, 8.0, np.float32))


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_sixteen_bit_division_within_one_unit_of_ieee(dtype):
    """16-bit outputs divide by div.full.f32: against the same kernel with IEEE division
    (options=("--prec-div=true",)) every result is the same or the adjacent 16-bit value (one unit
    in the last place), and nearly all are the same; both within 1 ulp of float64's (plus the
    rounding) on the vector path, on a misaligned start and on the strided (broadcasting) kernel
    (CUDA views are C-contiguous: a strided slice is a ValueError, tested elsewhere)."""
    tdt = getattr(torch, dtype)
    src = ("T a, T b", "T o", "o = a / (1 + exp(-b))")
    fast = ewkern.ElementwiseKernel(*src, f"sig_fast_{dtype}")
    ieee = ewkern.ElementwiseKernel(*src, f"sig_ieee_{dtype}", options=("--prec-div=true",))
    g = torch.Generator(device="cuda").manual_seed(5)
    a = (torch.randn(1 << 20, device="cuda", generator=g) * 4).to(tdt)
    b = (torch.randn(1 << 20, device="cuda", generator=g) * 4).to(tdt)
    for x, y in ((a, b), (a[1:-2], b[3:]), (a.view(1024, 1024), b[1:1025])):
        f, e = fast(x, y), ieee(x, y)
        assert f.dtype == tdt and f.shape == x.shape
        fb, eb = f.view(torch.int16).int(), e.view(torch.int16).int()
        assert int((fb - eb).abs().max()) <= 1
        assert float((fb != eb).float().mean()) < 0.01
        ref = x.double() / (1 + torch.exp(-y.double()))
        eps = torch.finfo(tdt).eps
        assert bool(((f.double() - ref).abs() <= eps * ref.abs() + torch.finfo(tdt).tiny).all())


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cols", [4096, 1001])
def test_gpu_sixteen_bit_division_in_row_and_reduction_kernels(dtype, cols):
    """The same rule in RowKernel and ReductionKernel (every output 16-bit: div.full.f32): a
    division by element in a RowKernel's operation and in a ReductionKernel's map, one by row in
    their post-maps, on vector rows and on odd rows; against the same kernels with IEEE division
    the same or the adjacent 16-bit value, nearly all the same, and near float64."""
    tdt = getattr(torch, dtype)
    eps = torch.finfo(tdt).eps
    g = torch.Generator(device="cuda").manual_seed(11)
    x = (torch.randn(777, cols, device="cuda", generator=g) * 3).to(tdt)
    y = (torch.rand(777, cols, device="cuda", generator=g) + 0.5).to(tdt)
    name = f"{dtype}_{cols}"
    row = ("T x, float32 eps", "T o", "(float)x * (float)x", "a + b", "o = x / sqrt(a / _row_size + eps)", "0")
    red = ("T x, T y", "T o", "(float)x / (float)y", "a + b", "o = a / (_in_ind.size() / _out_ind.size())", "0")
    rk = [ewkern.RowKernel(*row, f"rowdiv_{k}_{name}", reduce_type="float", options=opts)
          for k, opts in (("fast", ()), ("ieee", ("--prec-div=true",)))]
    qk = [ewkern.ReductionKernel(*red, f"reddiv_{k}_{name}", options=opts)
          for k, opts in (("fast", ()), ("ieee", ("--prec-div=true",)))]
    xd, yd = x.double(), y.double()
    cases = ((rk, (x, 1e-6), {}, xd / torch.sqrt((xd * xd).mean(1, keepdim=True) + 1e-6), 0.0),
             (qk, (x, y), {"axis": 1}, (xd / yd).mean(1), float((xd / yd).abs().mean(1).max()) * 2.0 ** -16))
    for kernels, args, kw, ref, slack in cases:
        f, e = (k(*args, **kw) for k in kernels)
        assert f.dtype == tdt and f.shape == ref.shape
        fb, eb = f.view(torch.int16).int(), e.view(torch.int16).int()
        assert int((fb - eb).abs().max()) <= 1
        assert float((fb != eb).float().mean()) < 0.01
        assert bool(((f.double() - ref).abs() <= eps * ref.abs() + slack + torch.finfo(tdt).tiny).all())


fma3 = ewkern.ElementwiseKernel("T a, T b, T c", "T o", "o = a * b + c", "fma3")


def _took_vector_path(kernel):
    return kernel._last_path == "vector"


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 2, 7, 31, 255, 1025, 70001, 2**20 + 3, 3 * 2**22 + 1])
@pytest.mark.parametrize("start", [0, 1, 3])
def test_gpu_vector_path_sizes_and_starts(dtype, n, start):
    """The default path's body for a user kernel: every size class of the launch rule (1, 2 and 4
    vectors per thread, head and tail elements) and starts off a 16-byte boundary, against
    float64 with one rounding (the body computes in float32 for 16-bit types: a*b+c rounds
    twice in float32, far below a 16-bit ulp)."""
    tdt = getattr(torch, dtype)
    base = [torch.randn(n + 8, dtype=tdt, device="cuda") for _ in range(3)]
    a, b, c = (t[start:start + n] for t in base)
    out = torch.full((n + 8,), float("nan"), dtype=tdt, device="cuda")
    o = out[start:start + n]
    # a warm call of a recorded signature (dtype, shape, address mod 16: start 1 and 3 are one for
    # float64) runs by its plan and leaves _last_path as it was: forget the plans, so that this
    # call decides its path (under pytest-xdist the float32 case before it had left "contig")
    fma3._plans.clear()
    fma3._cplans.clear()
    r = fma3(a, b, c, o)
    assert r is o
    ab = a.double() * b.double()
    want = (ab + c.double()).cpu().numpy()
    close(o.double().cpu().numpy(), want, dtype, 1.0 if dtype in ("float16", "bfloat16") else 2.0,
          scale=np.abs(want) + np.abs(ab.cpu().numpy()))
    # the elements around the view are untouched
    assert torch.isnan(out[:start]).all() and torch.isnan(out[start + n:]).all()
    # the vector path unless the view ends before its first aligned vector would start
    head = (-start) % (16 // a.element_size())
    assert fma3._last_path == ("vector" if head <= n else "contig")


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_vector_path_mixed_dtypes_reads_index_and_raw():
    n = 100003
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    c = torch.randn(n, device="cuda")
    mixed = ewkern.ElementwiseKernel("float32 a, float16 b, float32 c", "float32 o", "o = a * b + c", "mixed3")
    o = mixed(a, b, c)
    # the kernel may contract a * b + c into one fma, torch rounds the product first
    torch.testing.assert_close(o, a * b.float() + c, rtol=1e-6, atol=1e-6)
    assert _took_vector_path(mixed)
    acc = ewkern.ElementwiseKernel("T a", "T o", "o += a * 2", "acc2")
    o0 = torch.randn(n, device="cuda")
    o = o0.clone()
    acc(a, o)
    torch.testing.assert_close(o, o0 + 2 * a, rtol=0, atol=0)
    assert _took_vector_path(acc)
    idx = ewkern.ElementwiseKernel("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1] + (T)(i % 3)", "idx_raw")
    z = idx(a[:n - 1], c[1:])
    i = torch.arange(n - 1, device="cuda")
    torch.testing.assert_close(z, a[:n - 1] + c.flip(0)[:n - 1] + (i % 3).float(), rtol=0, atol=1e-6)
    assert _took_vector_path(idx)
    # an input whose offset from a 16-byte boundary differs from the output's: the fallback kernel
    o = mixed(a[1:], b[1:], c[1:])
    torch.testing.assert_close(o, a[1:] * b[1:].float() + c[1:], rtol=1e-6, atol=1e-6)
    assert mixed._last_path == "contig"


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", FLOATS)
def test_gpu_user_add_equals_ewkern_add(dtype):
    """`z = x + y` as a user kernel gives ewkern.add's bits (both compute in float32 or float64
    and round once)."""
    tdt = getattr(torch, dtype)
    x, y = (torch.randn(1 << 20 | 5, dtype=tdt, device="cuda") for _ in range(2))
    useradd = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x + y", "useradd")
    assert torch.equal(useradd(x, y), ewkern.add(x, y))
    assert _took_vector_path(useradd)


@pytest.mark.serial
@pytest.mark.gpu
@pytest.mark.slow
@gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_vector_path_more_than_2_31_elements():
    """2^31 + 5 float16 elements: the 64-bit form, with the index i checked at both ends."""
    n = 2**31 + 5
    if torch.cuda.mem_get_info()[0] < 2 * 2 * n + (2 << 30):
        pytest.skip("not enough GPU memory for two float16 arrays of 2^31 + 5 elements")
    x = torch.ones(n, device="cuda", dtype=torch.float16)
    k = ewkern.ElementwiseKernel("T x", "T z", "z = x + (T)(i % 3)", "big_index")
    z = k(x)
    torch.cuda.synchronize()
    for j in (0, 1, 2, 2**31 - 1, 2**31, 2**31 + 1, n - 1):
        assert float(z[j]) == 1 + j % 3, j
    assert int((z == 1).sum()) == (n + 2) // 3
    assert _took_vector_path(k)


sumsq_rows = ewkern.ReductionKernel("T x", "float32 y", "(float)x * (float)x", "a + b", "y = a", "0", "sumsq_rows",
                                    reduce_type="float")
mse_rows = ewkern.ReductionKernel("T a, T b", "float32 y", "((float)a - (float)b) * ((float)a - (float)b)", "a + b",
                                  "y = sqrt(a / (_in_ind.size() / _out_ind.size()))", "0", "mse_rows",
                                  reduce_type="float")


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows,cols,start", [(1, 1, 0), (5, 3, 1), (4096, 8, 0), (65536, 16, 3), (1000, 4096, 0),
                                             (17, 4099, 1), (3, 1 << 22, 0), (1, 10_000_019, 2), (1 << 18, 64, 0)])
def test_gpu_reduction_rows_engine(dtype, rows, cols, start):
    """Every plan of the rows engine (short rows on few lanes, a warp per row, chunked rows with
    the combine launch, misaligned starts with head and tail elements) against float64, and the
    same bits on a second call (deterministic)."""
    tdt = getattr(torch, dtype)
    buf = torch.randn(rows * cols + 8, dtype=tdt, device="cuda")
    x = buf[start:start + rows * cols].view(rows, cols)
    y = sumsq_rows(x, axis=1)
    path = sumsq_rows._last_path
    assert path.startswith("rows")
    E = 4 if dtype == "float32" else 8   # the short form: one chunk, rows starting at whole vectors
    assert path.endswith(" aligned") == (start == 0 and cols % E == 0 and " chunks=1 " in path), path
    want = (x.double() ** 2).sum(1)
    torch.testing.assert_close(y.double(), want, rtol=2e-6 * max(1, cols) ** 0.5, atol=1e-6)
    assert torch.equal(sumsq_rows(x, axis=1), y)
    b = torch.randn_like(x)
    r = mse_rows(x, b, axis=1)
    torch.testing.assert_close(r.double(), ((x.double() - b.double()) ** 2).mean(1).sqrt(), rtol=1e-5, atol=1e-6)
    if dtype != "float32" or start:
        return
    # a user's (a - b)^2 -> sum -> sqrt(r / n) is rmse
    torch.testing.assert_close(r, ewkern.rmse(x, b, axis=1).float(), rtol=1e-5, atol=1e-7)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_reduction_rows_capped_launch_in_eager_calls_and_a_graph(monkeypatch):
    """With the rows cap on (the default), a programmatic rows-engine launch of a small grid (256 rows of
    4096: 2 blocks an SM of the 132-SM GPUs, below the kernel's occupancy) runs with the dynamic
    shared memory that caps its blocks an SM (the path names it), eagerly and replayed from a CUDA
    graph over other inputs, with float64's results; with PDL off (its plan's uncapped launch) the
    same bits; _rtc_cap gives no cap at or past the kernel's occupancy and one at every count below. (A kernel of its own: a
    plan another test left would run the first call without the full path.)"""
    from ewkern.rtc import _kernel
    monkeypatch.setattr(_kernel, "_ROWS_CAP", True)
    monkeypatch.setattr(_kernel, "_caps", {})
    mse_rows = ewkern.ReductionKernel("T a, T b", "float32 y", "((float)a - (float)b) * ((float)a - (float)b)",
                                      "a + b", "y = sqrt(a / (_in_ind.size() / _out_ind.size()))", "0",
                                      "mse_rows_capped", reduce_type="float")
    a, b = (torch.randn(256, 4096, device="cuda") for _ in range(2))
    want = ((a.double() - b.double()) ** 2).mean(1).sqrt()
    saved = ewkern.pdl_enabled()
    try:
        ewkern.set_pdl(True)
        r = mse_rows(a, b, axis=1)
        torch.testing.assert_close(r.double(), want, rtol=1e-5, atol=1e-6)
        smem = re.search(r" smem=(\d+)", mse_rows._last_path)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        if sms >= 128:
            assert smem and int(smem.group(1)) > 0, mse_rows._last_path
        sets = [tuple(torch.randn(256, 4096, device="cuda") for _ in range(2)) for _ in range(4)]
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            mse_rows(*sets[0], axis=1)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                outs = [mse_rows(x, y, axis=1) for x, y in sets]
            g.replay()
        s.synchronize()
        for (x, y), o in zip(sets, outs):
            torch.testing.assert_close(o.double(), ((x.double() - y.double()) ** 2).mean(1).sqrt(), rtol=1e-5,
                                       atol=1e-6)
        ewkern.set_pdl(False)
        assert torch.equal(mse_rows(a, b, axis=1), r)   # by the plan's PDL-off launch (no path recorded)
    finally:
        ewkern.set_pdl(saved)
    h = next(v[0][0] for v in mse_rows._compiled.values() if isinstance(v, tuple) and len(v) == 4)
    occ = ewkern._C._rtc_occupancy(h, 256, 0)
    assert ewkern._C._rtc_cap(h, 256, 0, occ) == 0 and ewkern._C._rtc_cap(h, 256, 0, occ + 3) == 0
    # every count below the occupancy has a cap, within the small carveout (a block's share of 64 KiB)
    caps = [ewkern._C._rtc_cap(h, 256, 0, k) for k in range(1, occ)]
    assert all(0 < c < 65536 // k for k, c in enumerate(caps, 1)), (occ, caps)


heavy_rows = ewkern.ReductionKernel("T a, T b, T c", "T y", "erf(a) * exp(b) * tanh(c)", "a + b", "y = a", "0",
                                    "heavy_rows")


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_reduction_rows_launch_bound_where_it_does_not_spill():
    """The rows entry is built with __launch_bounds__(256, 4) where ptxas fits it without local
    memory (two-input mse, the aligned short form: 54 registers for sm_90), and without the bound
    where that would spill (three float64 inputs through erf, exp and tanh: over 300 bytes of
    spill stores at 64 registers): both give the float64 reference's result."""
    a, b = (torch.randn(64, 4096, dtype=torch.float16, device="cuda") for _ in range(2))
    r = mse_rows(a, b, axis=1)
    assert " blocks=4 " in mse_rows._last_path + " ", mse_rows._last_path
    torch.testing.assert_close(r.double(), ((a.double() - b.double()) ** 2).mean(1).sqrt(), rtol=1e-5, atol=1e-6)
    x, y, z = (torch.rand(32, 1024, dtype=torch.float64, device="cuda") for _ in range(3))
    h = heavy_rows(x, y, z, axis=1)
    assert " blocks=0" in heavy_rows._last_path, heavy_rows._last_path
    torch.testing.assert_close(h, (torch.erf(x) * torch.exp(y) * torch.tanh(z)).sum(1), rtol=1e-12, atol=0)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_reduction_rows_axis_none_keepdims_and_fallback():
    x = torch.randn(3, 1000, 7, device="cuda")
    s = l2norm(x)   # axis=None: one output, chunked
    assert l2norm._last_path.startswith("rows")
    torch.testing.assert_close(s.double(), x.double().norm(), rtol=1e-5, atol=0)
    s = l2norm(x, axis=(1, 2), keepdims=True)
    assert s.shape == (3, 1, 1) and l2norm._last_path.startswith("rows")
    torch.testing.assert_close(s.double(), x.double().norm(dim=(1, 2), keepdim=True), rtol=1e-5, atol=0)
    s = l2norm(x, axis=1)   # the reduced axis is not last: the strided kernel
    assert l2norm._last_path == "strided"
    torch.testing.assert_close(s.double(), x.double().norm(dim=1), rtol=1e-5, atol=0)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_gpu_vector_path_broadcast_rows_columns_and_one(dtype):
    """rmsnorm's apply (x * rsqrt(m + eps) with m per row), a bias row added to every row, and a
    one-element array: the default path's body with broadcast inputs, against torch."""
    tdt = getattr(torch, dtype)
    x = torch.randn(257, 1024, dtype=tdt, device="cuda")
    m = x.float().pow(2).mean(1, keepdim=True)
    apply = ewkern.ElementwiseKernel("T x, float32 m, float32 eps", "T y", "y = x * rsqrt(m + eps)", "rms_apply")
    y = apply(x, m, 1e-6)
    assert apply._last_path == "vector"
    torch.testing.assert_close(y.float(), (x.float() * torch.rsqrt(m + 1e-6)), rtol=max(EPS[dtype], EPS["float32"]) * 4,
                               atol=1e-6)
    bias = ewkern.ElementwiseKernel("T x, T b, T s", "T y", "y = x + b * s", "bias_add")
    b = torch.randn(1024, dtype=tdt, device="cuda")
    s = torch.randn(1, dtype=tdt, device="cuda")
    y = bias(x, b, s)
    assert bias._last_path == "vector"
    want = (x.double() + b.double() * s.double())
    torch.testing.assert_close(y.double(), want, rtol=EPS[dtype] * 4, atol=EPS[dtype] * 4)
    x2, b2 = torch.randn(257, 1001, dtype=tdt, device="cuda"), torch.randn(1001, dtype=tdt, device="cuda")
    y = bias(x2, b2, s)   # rows of 1001 elements: not whole vectors, the strided kernel
    assert bias._last_path == "strided"
    torch.testing.assert_close(y.double(), x2.double() + b2.double() * s.double(), rtol=EPS[dtype] * 4,
                               atol=EPS[dtype] * 4)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_output_overlapping_an_input_reads_a_copy():
    """An output over part of an input (shifted views) reads the input as it was, as on the CPU;
    the very same view runs in place."""
    k = ewkern.ElementwiseKernel("T x", "T y", "y = x * 2", "twice_shift")
    x = torch.arange(100003.0, device="cuda")
    k(x[:-1], x[1:])
    want = torch.cat([torch.zeros(1, device="cuda"), torch.arange(100002.0, device="cuda") * 2])
    torch.testing.assert_close(x, want, rtol=0, atol=0)
    k(x, x)
    torch.testing.assert_close(x, want * 2, rtol=0, atol=0)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_warm_calls_by_plan_heads_streams_and_overlap(full_calls):
    """On CUDA a plan runs each vector head it was recorded for (the head is part of the
    signature), on the caller's current stream, with fresh results; an overlapping output still
    reads a copy."""
    k = ewkern.ElementwiseKernel("T x, T y, float32 s", "T z", "z = x * s + y", "gpu_plan_fma")
    n = 100003
    base_x = torch.randn(n + 8, device="cuda")
    base_y = torch.randn(n + 8, device="cuda")
    side = torch.cuda.Stream()
    for rep in range(3):
        for start in range(4):
            x, y = base_x[start:start + n], base_y[start:start + n]
            s = 1.0 + rep + start / 4
            side.wait_stream(torch.cuda.current_stream())   # x, y written on the default stream
            with torch.cuda.stream(side):
                z = k(x, y, s)
                torch.cuda.current_stream().synchronize()
            want = x.double() * s + y.double()
            assert torch.allclose(z.double(), want, rtol=0, atol=4e-6 * float(want.abs().max()))
            base_x.add_(0.25)   # new data for the next call
    assert full_calls[0] == 4 and len(k._plans) == 4
    x = torch.randn(n + 1, device="cuda")
    k(x[:-1], x[:-1], 2.0, torch.empty(n + 1, device="cuda")[1:])   # the plan of an output 4 bytes in
    want = torch.cat([x[:1], x[:-1] * 3])
    k(x[:-1], x[:-1], 2.0, x[1:])   # z over x shifted by one element: not the same view
    torch.testing.assert_close(x, want, rtol=1e-6, atol=1e-6)
    # a row kernel and a reduction (the rows engine) by their plans, on a side stream
    rms = ewkern.RowKernel("T x, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps)", "0",
                           "gpu_plan_rms")
    msq = ewkern.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a / _in_ind.size() * _out_ind.size()", "0",
                                 "gpu_plan_msq")
    for rep in range(3):
        x = torch.randn(300, 4096, device="cuda") * (rep + 1)
        # x is written on the default stream: without the wait the side stream may read it first
        # (all 300 results inf on the H200 once, 5691b91, with four test processes on the GPU)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y, m = rms(x, 1e-5), msq(x, axis=1)
            torch.cuda.current_stream().synchronize()
        m64 = (x.double() ** 2).mean(1)
        torch.testing.assert_close(m.double(), m64, rtol=1e-5, atol=0)
        torch.testing.assert_close(y.double(), x.double() * torch.rsqrt(m64 + 1e-5)[:, None], rtol=2e-6, atol=1e-6)
    assert len(rms._plans) == 1 and len(msq._plans) == 1 and full_calls[0] == 8


@gpu
@pytest.mark.gpu
def test_gpu_cupy_documentation_examples_match_cupy():
    """CuPy's own documentation examples (ElementwiseKernel: squared_diff, its generic and
    super-generic forms, add_reverse with a raw input; ReductionKernel: l2norm), defined from the
    same strings in CuPy and in ewkern, on the same CuPy arrays: the same values."""
    cupy = pytest.importorskip("cupy")

    def as_cupy(a):
        return a if isinstance(a, cupy.ndarray) else cupy.from_dlpack(a)
    defs = [("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff_generic"),
            ("X x, Y y", "Z z", "z = (x - y) * (x - y)", "squared_diff_super_generic"),
            ("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse")]
    x = cupy.arange(1000003, dtype=cupy.float32).reshape(1000003, 1)[:, 0] * 0.5
    y = cupy.arange(1000003, dtype=cupy.float32) * 0.25 + 1
    m = cupy.random.default_rng(1).standard_normal((257, 1024), dtype=cupy.float32)
    row = cupy.random.default_rng(2).standard_normal(1024, dtype=cupy.float32)
    for ins, outs, op, name in defs:
        ck, ek = cupy.ElementwiseKernel(ins, outs, op, name), ewkern.ElementwiseKernel(ins, outs, op, name)
        if name == "squared_diff_super_generic":
            want, got = cupy.empty_like(x), cupy.empty_like(x)
            ck(x, y, want)
            ek(x, y, got)
        else:
            want, got = ck(x, y), as_cupy(ek(x, y))
        assert got.dtype == want.dtype
        cupy.testing.assert_allclose(got, want, rtol=0, atol=0)
    sq_c = cupy.ElementwiseKernel(*defs[0][:3], "sq")
    sq_e = ewkern.ElementwiseKernel(*defs[0][:3], "sq")
    cupy.testing.assert_allclose(as_cupy(sq_e(m, row)), sq_c(m, row), rtol=0, atol=0)   # broadcast
    cupy.testing.assert_allclose(as_cupy(sq_e(m, 5.0)), sq_c(m, 5.0), rtol=0, atol=0)   # a Python scalar
    l2 = ("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")
    lc, le = cupy.ReductionKernel(*l2), ewkern.ReductionKernel(*l2)
    for axis in (1, None):
        cupy.testing.assert_allclose(as_cupy(le(m, axis=axis)), lc(m, axis=axis), rtol=2e-6)   # another order


def test_cpu_dense_kernel_keeps_its_vector_loop_on_one_thread(tmp_path):
    """A dense CPU elementwise kernel runs one thread below CPU_PAR_MIN_ELEMENTWISE elements (and on
    a one-core machine). Its loop is written twice: under `omp parallel for simd` where _threads > 1,
    and as an `omp simd` loop on the calling thread, so that a one-thread call opens no parallel
    region (libgomp starts and ends a team of one on each: about 0.6 us a call on the CI host). Both
    loops are vector code: the outlined team loop and the entry's own (objdump, with the flags the
    CPU builds use; an earlier `if(_threads > 1)` clause put a scalar loop behind the one-thread
    test: float32 add at 2^16 elements 19.6 us against 7.7 with the vector loop, bfloat16 76 against
    7.7)."""
    import shutil
    import subprocess
    if not (shutil.which("objdump") and os.uname().machine == "x86_64"):
        pytest.skip("needs objdump on x86_64")
    try:
        path, _, omp = _build.cxx()
    except RuntimeError:
        pytest.skip("no C++ compiler")
    if not omp:
        pytest.skip("the compiler has no OpenMP")
    flags, link, _ = _build.cpu_target()
    packed = re.compile(r"^v?\w+ps\b.*%[xyz]mm")   # SSE's packed forms too (EWKERN_CPU_ISA=baseline)
    for dt in ("float32", "bfloat16"):
        lay = _layout("contig", 1, [("T x", dt, "array", 0), ("T y", dt, "array", 0), ("T z_out", dt, "array", 0)])
        src, entry = _codegen.elementwise_source("cpu", "omp1", lay, "z_out = x + y", "", "", "",
                                                 _codegen.typedefs((("T", dt),), [], [], [], []))
        lines = src.splitlines()
        assert [ln for ln in lines if ln.startswith("#pragma omp")] == [
            "#pragma omp parallel for simd schedule(static) num_threads(_threads)", "#pragma omp simd"], dt
        assert "    if (_threads > 1) {" in lines and sum("z_out = x + y;" in ln for ln in lines) == 2
        cpp, so = tmp_path / f"{dt}.cpp", tmp_path / f"{dt}.so"
        cpp.write_text(src)
        subprocess.run([path, "-O3", "-fno-math-errno", "-fPIC", "-shared", "-std=c++17", "-w", "-fopenmp"] + flags
                       + ["-o", str(so), str(cpp)] + link, check=True, capture_output=True)
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], check=True, capture_output=True,
                             text=True).stdout
        for fn in (entry, f"{entry}._omp_fn.0"):
            body = dis.split(f"<{fn}>:", 1)[1].split("\n\n", 1)[0]
            ins = [ln.split("\t", 1)[-1].strip() for ln in body.splitlines() if "\t" in ln]
            assert any(packed.match(i) for i in ins), (dt, fn, "no packed float instruction")


def test_cpu_float16_tiles_take_their_pointers_once_a_tile():
    """The float16 tiles of a CPU kernel read each tiled array's pointer into a local once a tile:
    P's address reaches the OpenMP region, so through `P.p_x` in the chunk loop gcc reloaded every
    pointer from the stack after each 16-bit store (float16 `z = x + y` at 0.93 of ewkern.add on the
    CI host, 0.97-0.99 with the locals). Contiguous and rows forms, an output the body reads."""
    for mode, op in (("contig", "z_out = x + y"), ("contig", "z_out = z_out + x * y"), ("rows", "z_out = x + y")):
        args = [("T x", "float16", "array", 0), ("T y", "float16", "array", 0), ("T z_out", "float16", "array", 0)]
        lay = _layout(mode, 2 if mode == "rows" else 1, args)
        src, _ = _codegen.elementwise_source("cpu", "tiles", lay, op, "", "", "",
                                             _codegen.typedefs((("T", "float16"),), [], [], [], []))
        lines = src.splitlines()
        chunks = [k for k, ln in enumerate(lines) if ln.strip() == "#if EWRTC_HV"]
        assert len(chunks) == 2, (mode, op)    # the team's loop and the calling thread's
        for k in chunks:
            end = lines.index("#endif", k)
            body = lines[k:end]
            assert any("h2f_v(_h_x + _j0" in ln for ln in body) and any("f2h_v(_f_z_out, _h_z_out + _j0)" in ln for ln in body)
            assert not [ln for ln in body if "P.p_" in ln], (mode, op, body)
            assert any(ln.strip().startswith("ewrtc::half_bits *const _h_z_out = (ewrtc::half_bits *)_ewrtc_P.p_z_out")
                       for ln in lines[k - 6:k]), (mode, op)


def test_cpu_float_result_of_an_integer_first_input():
    """A float output allocated where the first input array holds integers (ewkern allocates float
    dtypes only): made like the first float input, or apart in the first input's framework; the
    warm calls (which allocate like the first input) give the same."""
    half = ewkern.ElementwiseKernel("int32 x", "float64 y", "y = x * 0.5", "half_of_int")
    scale = ewkern.ElementwiseKernel("int32 x, float32 z", "float32 y", "y = x * z", "int_times_float")
    i = np.arange(-3, 5, dtype=np.int32)
    z = np.linspace(0.5, 2.0, 8, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(half(i), i * 0.5)
        np.testing.assert_array_equal(scale(i, z), (i * z).astype(np.float32))
    if torch is not None:
        r = half(torch.from_numpy(i))
        assert isinstance(r, torch.Tensor) and r.dtype == torch.float64
        np.testing.assert_array_equal(r.numpy(), i * 0.5)


SCALED_RMS = ("T x, float32 s", "T y", "x * x", "a + b", "y = sqrt(a / (_in_ind.size() / _out_ind.size())) * s", "0")


@pytest.mark.parametrize("axis,keepdims", [(1, False), (None, False), (0, True)])
def test_cpu_reduction_post_map_sees_the_scalar_parameters(axis, keepdims):
    """As in CuPy, whose POST_MAP runs inside the kernel whose parameters the scalars are, a
    ReductionKernel's post_map_expr may use its scalar inputs (it could not: 's' was not declared)."""
    k = ewkern.ReductionKernel(*SCALED_RMS, "scaled_rms")
    x = np.random.default_rng(20).standard_normal((5, 97)).astype(np.float32)
    got = k(x, 2.5, axis=axis, keepdims=keepdims)
    want = np.sqrt((x.astype(np.float64) ** 2).mean(axis=axis, keepdims=keepdims)) * 2.5
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-6)


@pytest.mark.parametrize("aligned", [True, False])
def test_cuda_reduction_sources_with_a_scalar_in_post_map_compile(aligned):
    """The CUDA sources of both reduction engines (the rows engine's rows and combine entries, the
    general one) declare the scalar inputs where post_map_expr runs: NVRTC compiles them."""
    _nvrtc()
    lay = _layout("contig", 1, [("T x", "float32", "array", 0), ("float32 s", "float32", "scalar", 0)])
    out = _layout("strided", 1, [("T y_out", "float32", "array", 0)])
    tdefs = _codegen.typedefs((("T", "float32"),), [], [], [], [])
    post = "y_out = sqrt(a) * s"
    src, entries = _codegen.reduction_rows_source("rows_s", lay, out, 4, "x * x", "a + b", post, "0", "float", "",
                                                  tdefs, False, aligned, 0)
    ptx, _, _ = _build.compile_cuda("rows_s", src, (9, 0), ptx_only=True)
    assert all((".entry " + e).encode() in ptx for e in entries)
    src, entry = _codegen.reduction_source("cuda", "gen_s", lay, out, True, "x * x", "a + b", post, "0", "float", "",
                                           tdefs)
    ptx, _, _ = _build.compile_cuda("gen_s", src, (9, 0), ptx_only=True)
    assert (".entry " + entry).encode() in ptx


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("shape,axis", [((256, 4096), 1), ((3, 1 << 20), None), ((64, 100), 0)])
def test_gpu_reduction_post_map_sees_the_scalar_parameters(shape, axis):
    """The same on CUDA: the rows engine (one chunk a row; chunks and a combine launch for
    axis=None) and the general kernel (axis 0)."""
    k = ewkern.ReductionKernel(*SCALED_RMS, "scaled_rms_gpu")
    x = torch.randn(*shape, device="cuda")
    got = k(x, 2.5, axis=axis)
    want = (x.double() ** 2).mean(dim=axis).sqrt() * 2.5 if axis is not None else (x.double() ** 2).mean().sqrt() * 2.5
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


# ---- the review's defects: overlap, raw writes, scalars, link errors, names, axes -------------

def test_reduction_out_overlapping_an_input_reads_a_copy():
    """out= overlapping the input (a row of it) gives NumPy's result: the input is read from a
    copy, as ElementwiseKernel's and NumPy's ufuncs are; serial (4 x 4) and threaded (1000 x
    1000) CPU loops, and a warm call after a plan of the same signature exists."""
    s = ewkern.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "ovl_sum")
    x = np.arange(16.0).reshape(4, 4)
    want = x.sum(axis=1)
    s(x, axis=1, out=x[-1, :])
    np.testing.assert_array_equal(x[-1], want)
    x = np.arange(1e6).reshape(1000, 1000) % 7
    want = x.sum(axis=1)
    s(x, axis=1, out=np.empty(1000))   # a plan for this signature (dtypes, shapes, alignment)
    s(x, axis=1, out=x[0, :])
    np.testing.assert_array_equal(x[0], want)


def test_raw_input_written_through_a_strided_view_is_kept():
    """A raw parameter is writable (CuPy's are): writes into a non-contiguous raw input, which
    the CPU runs on a contiguous copy, are copied back; a raw input only read is not."""
    k = ewkern.ElementwiseKernel("T x, raw T y", "", "y[i] = x * 2", "scatter_raw")
    x = np.arange(5.0)
    base = np.zeros(10)
    k(x, base[::2])
    np.testing.assert_array_equal(base, [0, 0, 2, 0, 4, 0, 6, 0, 8, 0])
    inc = ewkern.ElementwiseKernel("raw T y", "T z", "z = y[i]; y[i] += 1", "inc_raw")
    base = np.zeros((4, 4))
    np.testing.assert_array_equal(inc(base[:, 1], np.empty(4)), 0)
    np.testing.assert_array_equal(base[:, 1], 1)
    assert not _codegen.may_write_raw("z = y[_ind.size() - i - 1] + y.size()", "y")
    assert _codegen.may_write_raw("y[i] = 1", "y") and _codegen.may_write_raw("f(y)", "y")


def test_raw_input_same_view_as_output_is_not_run_in_place():
    """A raw input may be read at any index, so the very same array as an output is read from a
    copy (only non-raw parameters, element i reading element i, may run in place), on the full
    path and on a warm call whose signature has a plan."""
    rev = ewkern.ElementwiseKernel("raw T x", "T y", "y = x[_ind.size() - i - 1]", "rev_raw")
    x = np.arange(8.0)
    rev(x, np.empty(8))
    rev(x, np.empty(8))   # plans for the signature
    rev(x, x)
    np.testing.assert_array_equal(x, np.arange(8.0)[::-1])
    # the C plan of a kernel with raw parameters runs no given output that overlaps an input, the
    # very same view included (rtc_fast_overlap's strict test), and the rest as any plan
    from ewkern import _C
    from ewkern.rtc._kernel import _SCALARS
    assert rev._cplans
    x, o = np.arange(8.0), np.empty(8)
    assert _C._rtc_fast(rev._cplans, (x, x), 1, None, _SCALARS) is NotImplemented
    assert _C._rtc_fast(rev._cplans, (x, o), 1, None, _SCALARS) is o
    np.testing.assert_array_equal(o, x[::-1])


@pytest.mark.parametrize("bad", [np.str_("2"), np.bytes_(b"2"), np.datetime64(2, "s"), np.timedelta64(2, "s"), "2",
                                 b"2", None])
def test_non_numeric_scalars_are_refused(bad):
    """Only numbers are scalars (bool, int, float, NumPy's bool and numbers): a NumPy string,
    bytes, datetime or timedelta, a str or None is a TypeError naming the kernel and parameter,
    cold and after a plan for a float scalar exists."""
    k = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x + y", "add_scalar")
    a = np.arange(4.0)
    k(a, 2.0)
    k(a, 2.0)
    with pytest.raises(TypeError, match="add_scalar: y"):
        k(a, bad)
    np.testing.assert_array_equal(k(a, np.float32(2)), a + 2)


def test_scalars_are_decided_by_type_for_the_tuple_asked():
    """The warm path (csrc/rtc.c) and Python's decide once a type whether an argument is a
    scalar: a float subclass is one, cold and warm; the C module's answer follows the tuple it is
    given (a NumPy int8 is a scalar for _SCALARS, an array argument it cannot view for a tuple
    without it, and a scalar again after)."""
    from ewkern import _C
    from ewkern.rtc._kernel import _SCALARS, _is_scalar

    class F(float):
        pass

    k = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x + y", "add_float_subclass")
    a = np.arange(4.0) + 0.5
    for _ in range(3):
        np.testing.assert_array_equal(k(a, F(2.25)), a + 2.25)
    assert _is_scalar(F(1.0)) and _is_scalar(np.int8(1)) and not _is_scalar(a) and not _is_scalar(np.timedelta64(1))
    s = np.int8(2)
    assert isinstance(_C._rtc_sig((a, s), _SCALARS), bytes)
    assert _C._rtc_sig((a, s), (bool, int, float)) is None
    assert isinstance(_C._rtc_sig((a, s), _SCALARS), bytes)


def test_block_size_is_checked_on_the_cpu_too():
    k = ewkern.ElementwiseKernel("T x", "T z", "z = x", "bs_check")
    a = np.arange(4.0)
    with pytest.raises(TypeError, match="bs_check: block_size"):
        k(a, block_size="x")
    with pytest.raises(ValueError, match="bs_check: block_size"):
        k(a, block_size=0)
    np.testing.assert_array_equal(k(a, block_size=128), a)


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_torch_sparse_input_is_a_type_error():
    k = ewkern.ElementwiseKernel("T x", "T z", "z = x", "sparse_in")
    s = ewkern.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sparse_sum")
    for f in (k, s):
        with pytest.raises(TypeError, match="x is a torch tensor of layout torch.sparse_coo"):
            f(torch.eye(3).to_sparse())


@pytest.mark.parametrize("body,preamble,symbol", [("z = undefined_fn(x)", "float undefined_fn(float);",
                                                   "undefined_fn(float)"),
                                                  ("z = ewk_c_fn(x)", 'extern "C" float ewk_c_fn(float);', "ewk_c_fn")])
def test_cpu_kernel_that_does_not_link_is_a_compile_error_and_not_cached(cache_dir, body, preamble, symbol):
    """A body that compiles but calls a function defined nowhere is CompileError naming the
    kernel and the symbol (not an OSError naming a deleted temporary file), and nothing is
    written to the disk cache (a later run compiles again rather than loading a broken library)."""
    k = ewkern.ElementwiseKernel("T x", "T z", body, "no_link", preamble=preamble)
    for _ in range(2):
        with pytest.raises(ewkern.rtc.CompileError, match=r"'no_link' failed to link.*undefined symbol '%s'"
                           % re.escape(symbol)):
            k(np.ones(3, np.float32))
    assert not list(cache_dir.glob("*.so")) if cache_dir.exists() else True


@pytest.mark.parametrize("dt", ["float64", "float32", "float16"])
def test_cpu_max_min_of_mixed_float_types_drop_nan_as_cuda(dt):
    """max(x, 0.0) with a float x (float and double: CUDA's max(float, double) is fmax) gives
    the other operand for a NaN, as max(double, double) does, on both backends."""
    x = np.array([np.nan, -1, 2], dt)
    k = ewkern.ElementwiseKernel("T x", "T z, T w", "z = max(x, 0.0); w = min(x, 0.0)", "relu_lit")
    z, w = k(x)
    np.testing.assert_array_equal(z, [0, 0, 2])
    np.testing.assert_array_equal(w, [0, -1, 0])
    ki = ewkern.ElementwiseKernel("T x", "T z", "z = max(x, 2)", "imax")   # integers: < as before
    np.testing.assert_array_equal(ki(np.array([1, 3, -5], np.int32)), [2, 3, 2])


@pytest.mark.parametrize("pname", ["P", "PP", "P_", "off_x", "row_x", "tile_x", "o", "r"])
def test_parameter_names_that_were_generated_locals(pname):
    """Names the generated code once used for its own locals (the argument struct P, per-array
    byte offsets off_<name>, a reduction's loop indices o and r) are ordinary parameter names:
    elementwise (contiguous, strided, broadcast rows), reduction and as a scalar in post_map."""
    x = np.arange(12.0).reshape(3, 4)
    k = ewkern.ElementwiseKernel(f"T x, T {pname}", "T z", f"z = x + 2 * {pname}", "names_ek")
    np.testing.assert_array_equal(k(x, x), 3 * x)
    np.testing.assert_array_equal(k(x.T, x.T), 3 * x.T)
    np.testing.assert_array_equal(k(x, x[0]), x + 2 * x[0])
    r = ewkern.ReductionKernel(f"T x, T {pname}", "T y", "x", "a + b", f"y = a * {pname}", "0", "names_rk")
    np.testing.assert_array_equal(r(x, 2.0, axis=1), x.sum(1) * 2)
    r2 = ewkern.ReductionKernel(f"T x, T {pname}", "T y", f"x * {pname}", "a + b", "y = a", "0", "names_rk2")
    np.testing.assert_array_equal(r2(x.T, x.T, axis=0), (x * x).sum(1))


@pytest.mark.parametrize("pname", ["_c", "_r", "_o", "_acc", "_ewrtc_x", "_c0", "_acc2", "_C", "_c_x", "_cb_x"])
def test_parameter_names_reserved_for_generated_code_are_refused(pname):
    with pytest.raises(ValueError, match=f"bad_name: parameter name '{pname}' is reserved"):
        ewkern.ElementwiseKernel(f"T x, T {pname}", "T z", "z = x", "bad_name")


# E, Idx, VPT, VPL and TPC: the CUDA forms' template parameters and kernel-scope constants, which
# the generated code now spells _ewrtc_E, _ewrtc_Idx, ...: ordinary parameter names (E for an
# energy, say), no longer refused
_FREED = ("E", "Idx", "VPT", "VPL", "TPC")


def _nonzero(rng, shape, dtype, low=0.25):
    """random values of either sign, |v| in [low, 2): none zero"""
    v = rng.uniform(low, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    return v.astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_parameters_named_like_the_cuda_forms_constants_work_on_the_cpu(dtype):
    """An ElementwiseKernel, a ReductionKernel and a RowKernel whose parameters are named E, Idx,
    VPT, VPL and TPC (inputs, broadcast rows, scalars and outputs) match float64 NumPy on odd
    shapes of non-zero random data: contiguous, a broadcast row, a transposed view."""
    rng = np.random.default_rng(2107)
    f64 = lambda v: np.asarray(v, np.float64)   # noqa: E731
    rows, cols = 7, 13
    E, VPT, TPC = (_nonzero(rng, (rows, cols), dtype) for _ in range(3))
    VPL = _nonzero(rng, (cols,), dtype)
    s = np.dtype(dtype).type(0.75)

    ek = ewkern.ElementwiseKernel("T E, T VPT, T VPL, T TPC", "T Idx", "Idx = E * VPT + VPL - TPC", "freed_ek")
    for mode, args in (("contig", (E, VPT, np.broadcast_to(VPL, E.shape).copy(), TPC)),   # every array dense
                       ("rows", (E, VPT, VPL, s)),                          # a broadcast row and a scalar
                       ("strided", (E.T, VPT.T, TPC[:, 0], TPC.T))):        # transposed views
        a64 = [f64(a) for a in args]
        want = a64[0] * a64[1] + a64[2] - a64[3]
        scale = np.abs(a64[0] * a64[1]) + np.abs(a64[2]) + np.abs(a64[3])
        got = ek(*args)
        assert got.dtype == np.dtype(dtype) and got.shape == args[0].shape and ek._last_path == mode
        close(got, want, dtype, 2, scale)

    rk = ewkern.ReductionKernel("T E, T Idx, T TPC", "T VPL", "E * Idx", "a + b", "VPL = a * TPC", "0", "freed_rk")
    for x, y, axis in ((E, VPT, 1), (E.T, VPT.T, 0), (E, VPT, None)):
        want = (f64(x) * f64(y)).sum(axis) * 0.75
        scale = (np.abs(f64(x) * f64(y))).sum(axis) * 0.75
        got = rk(x, y, s, axis=axis)
        close(got, want, dtype, 2 * cols * rows, scale)

    rowk = ewkern.RowKernel("T E, T VPL, T VPT, T TPC", "T Idx", "E * E", "a + b",
                            "Idx = E * rsqrt(a / _row_size + TPC) * VPL + VPT", "0", name="freed_row")
    VPT1 = _nonzero(rng, (rows, 1), dtype)
    norm = f64(E) / np.sqrt((f64(E) ** 2).mean(1, keepdims=True) + 0.75)
    want = norm * f64(VPL) + f64(VPT1)
    scale = np.abs(norm * f64(VPL)) + np.abs(f64(VPT1))
    for x in (E, np.ascontiguousarray(E.T).T):   # dense, column-major
        got = rowk(x, VPL, VPT1, s)
        assert got.shape == E.shape and rowk._last_path == "cpu"
        close(got, want, dtype, 4 * cols, scale)


def _freed_forms(dtype, roles, ew_op, red_map, red_post, row_map, row_op):
    """(form, CUDA source, entries) of every generated form for parameters given as roles: (name,
    kind, is_output), kinds as Layout's (broadcast kinds as dense arrays where a form has none)"""
    rt = _codegen.DTYPES[dtype][1]   # the compute type: T, in0_type and the reduce type
    td = f"typedef {rt} T; typedef {rt} in0_type;"
    E = 16 // {"float64": 8, "float32": 4}.get(dtype, 2)

    def lay(mode, ndim, dense=False, colsum=False, which=None):
        """which: None every parameter, False the inputs, True the outputs"""
        out = []
        for name, kind, is_out in roles:
            if which is not None and is_out != which:
                continue
            (p,) = parse_params(f"T {name}", is_out, "freed")
            k = "array" if dense and kind != "scalar" else kind
            out.append((p, dtype, "colsum" if colsum and is_out else k, 0))
        return _codegen.Layout(mode, ndim, out)

    C = _codegen
    yield "vector", *C.vector_source("fv", lay("vector", 1), ew_op, "", "", "", td, set())
    src, entry = C.elementwise_source("cuda", "fe", lay("strided", 2, True), ew_op, "", "", "", td)
    yield "elementwise strided", src, [entry]
    src, entry = C.reduction_source("cuda", "fr", lay("strided", 2, True, which=False),
                                    lay("strided", 1, True, which=True), True, red_map, "a + b", red_post, "0", rt,
                                    "", td)
    yield "reduction", src, [entry]
    yield "reduction rows", *C.reduction_rows_source("fw", lay("contig", 1, True, which=False),
                                                     lay("contig", 1, True, which=True), E, red_map, "a + b",
                                                     red_post, "0", rt, "", td)
    yield "row", *C.row_source("cuda", "fk", lay("contig", 1), E, row_map, "a + b", row_op, "0", rt, "", td, set())
    yield "row colsum", *C.row_source("cuda", "fc", lay("contig", 1, colsum=True), E, row_map, "a + b", row_op, "0",
                                      rt, "", td, set(), stage2=(row_map, "a + b", "0"), g=256)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", ["scalars", "arrays"])
def test_nvrtc_compiles_parameters_named_like_the_cuda_forms_constants(dtype, case):
    """The CUDA sources of kernels whose parameters are named E, Idx, VPT, VPL and TPC compile with
    NVRTC to PTX in every form (the vector body, the fallback, both reductions, the row kernel with
    and without column sums): each name once a scalar (declared where the forms' template
    parameters and constants are in scope) and once an array or output, and the generated code
    declares none of them itself."""
    _nvrtc()
    if case == "scalars":
        roles = [("E", "array", False), ("Idx", "bcol", False), ("VPT", "scalar", False), ("VPL", "scalar", False),
                 ("TPC", "scalar", False), ("y", "array", True)]
        forms = _freed_forms(dtype, roles, "y = E * Idx + VPT * VPL - TPC", "E * Idx + VPT", "y = a * VPL - TPC",
                             "E * E", "y = E * rsqrt(a / _row_size + VPT * VPT) * Idx + VPL - TPC")
    else:
        roles = [("VPT", "array", False), ("VPL", "bcol", False), ("E", "scalar", False), ("Idx", "brow", False),
                 ("x", "bone", False), ("TPC", "array", True)]
        forms = _freed_forms(dtype, roles, "TPC = VPT * VPL + E * Idx - x", "VPT * VPL + E", "TPC = a * E",
                             "VPT * VPT", "TPC = VPT * rsqrt(a / _row_size + E * E) * VPL + Idx * x")
    assert all(parse_params(f"T {n}", False, "k") for n in _FREED)
    for form, src, entries in forms:
        own = src   # the generated kernel, without the ewrtc namespace's helpers (their templates' E is theirs)
        for prelude in (_codegen.PRELUDE, _codegen.VECTOR_PRELUDE, _codegen.SHFL_PRELUDE):
            own = own.replace(prelude, "")
        declared = {w.split()[-1] for t in re.findall(r"template <([^>]*)>", own) for w in t.split(",")}
        declared |= set(re.findall(r"enum \{ (\w+)", own))
        assert not declared & set(_FREED), (form, declared)
        name = f"freed_{case}_{form.replace(' ', '_')}"
        ptx, kind, _ = _build.compile_cuda(name, src, (9, 0), ptx_only=True)
        assert kind == "ptx" and [e for e in entries if f".entry {e}".encode() not in ptx] == [], form


@pytest.mark.parametrize("axis", [0, -1, (0,), 1])
def test_reduction_axis_of_a_0d_input_is_out_of_bounds(axis):
    """A 0-d input has no axis: every axis is a ValueError (NumPy's AxisError is one), not only
    -1; axis=None and axis=() reduce nothing."""
    s = ewkern.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "rsum0d")
    z = np.array(5.0)
    with pytest.raises(ValueError, match="rsum0d: axis .* out of bounds"):
        s(z, axis=axis)
    assert float(s(z)) == 5.0 and float(s(z, axis=())) == 5.0
