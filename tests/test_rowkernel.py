"""ewkern.RowKernel (issue 21): a row's reduction and an operation over the same row in one kernel.
The CPU backend against float64 NumPy references (every dtype, awkward shapes, every broadcast
kind, in place, overlap, errors), the launch plan, the CUDA source through NVRTC to PTX (no GPU
needed), and the GPU runs (marked gpu): every plan form, misaligned starts, > 2^31 elements."""
import re
import numpy as np
import pytest

import ewkern
from ewkern.rtc import _build, _codegen
from ewkern.rtc._params import parse_params
from ewkern.rtc._rowkernel import row_plan
from conftest import blocks_per_sm, gpu, ptxas_registers
from reference import EPS, TINY, np_dtype

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

FLOATS = ["float32", "float16", "bfloat16", "float64"]
EPS_RMS = 1e-6

rmsnorm = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                           "y = x * rsqrt(a / _row_size + eps) * w", "0", name="rmsnorm_t")
row_max_scale = ewkern.RowKernel("T x", "T y, T d", "x", "max(a, b)", "y = x / a; d = x - a", "-INFINITY",
                                 name="row_max_scale")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EWKERN_CACHE_DIR", str(tmp_path / "kernels"))


def _rand(rng, shape, dtype, low=0.0):
    x = rng.standard_normal(shape) + low
    return x.astype(np_dtype(dtype))


def _rms_ref(x, w):
    x = np.asarray(x, np.float64)
    eps = float(np.float32(EPS_RMS))     # the kernel's eps parameter is float32
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, np.float64)


def _check_rms(y, x, w, dtype):
    """|y - ref| <= |ref| x (3 ulps of the output + the float32 sum's worst case over a row) + the
    output's subnormal spacing."""
    ref = _rms_ref(x, w)
    n = x.shape[-1]
    acc = EPS["float64"] if dtype == "float64" else 2.0 ** -24
    bound = 3 * EPS[dtype] + 2 * n * acc
    got = np.asarray(y, np.float64)
    assert got.shape == ref.shape
    err = np.abs(got - ref) - np.abs(ref) * bound - TINY[dtype] * EPS[dtype]
    assert np.all(err <= 0), float(err.max())


# ---- the CPU backend ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7,), (4, 3, 64), (2, 1001)])
def test_rmsnorm_against_float64(dtype, shape):
    rng = np.random.default_rng(sum(shape))
    x = _rand(rng, shape, dtype)
    w = _rand(rng, shape[-1:], dtype, 1.0)
    y = rmsnorm(x, w, EPS_RMS)
    assert y.dtype == x.dtype and y.shape == x.shape and rmsnorm._last_path == "cpu"
    _check_rms(y, x, w, dtype)
    # the same bits from a second call, and into a given output
    out = np.full_like(x, np.nan)
    assert rmsnorm(x, w, EPS_RMS, out) is out
    np.testing.assert_array_equal(out.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("shape", [(0, 4), (2, 0), (0,)])
def test_empty_rows_or_columns(shape):
    x = np.ones(shape, np.float32)
    y = rmsnorm(x, np.ones(shape[-1:], np.float32), EPS_RMS)
    assert y.shape == shape and y.dtype == np.float32


def test_broadcast_kinds_and_strided_inputs():
    """An input may be the full shape, one row (bcol), one value per row (brow), one value (bone)
    or a scalar; other broadcasts and strided views are read from a dense copy."""
    k = ewkern.RowKernel("T x, T w, T s, T c, float32 eps", "T y", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w * s + c", "0", name="rms_kinds")
    rng = np.random.default_rng(1)
    x = _rand(rng, (6, 33), "float32")
    w = _rand(rng, (33,), "float32", 1.0)
    s = _rand(rng, (6, 1), "float32", 2.0)
    c = np.array([0.25], np.float32)
    want = _rms_ref(x, w) * s + 0.25
    y = k(x, w, s, c, EPS_RMS)
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=1e-6)
    y = k(x, w, 3.0, 0.5, EPS_RMS)      # scalars
    np.testing.assert_allclose(y, _rms_ref(x, w) * 3 + 0.5, rtol=2e-5, atol=1e-6)
    xt = np.ascontiguousarray(x.T).T     # strided (column-major)
    np.testing.assert_allclose(k(xt, w, s, c, EPS_RMS), want, rtol=2e-5, atol=1e-6)
    # [r, 1, n] against [r, m, n]: a broadcast the kernel cannot read in place
    x3 = _rand(rng, (2, 4, 8), "float32")
    w3 = _rand(rng, (2, 1, 8), "float32", 1.0)
    y3 = k(x3, w3, 1.0, 0.0, EPS_RMS)
    np.testing.assert_allclose(y3, _rms_ref(x3, w3), rtol=2e-5, atol=1e-6)
    # a strided output: computed apart and copied in
    out = np.zeros((33, 6), np.float32).T
    assert k(x, w, s, c, EPS_RMS, out) is out
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=1e-6)


def test_in_place_and_overlapping_input():
    rng = np.random.default_rng(2)
    x = _rand(rng, (5, 40), "float32")
    w = np.ones(40, np.float32)
    want = _rms_ref(x, w)
    y = x.copy()
    assert rmsnorm(y, w, EPS_RMS, y) is y            # in place: the same array in and out
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=1e-6)
    buf = np.concatenate([x.ravel(), np.zeros(40, np.float32)])
    src, dst = buf[:200].reshape(5, 40), buf[40:240].reshape(5, 40)   # shifted by a row
    rmsnorm(src, w, EPS_RMS, dst)
    np.testing.assert_allclose(dst, want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_max_reduction_two_outputs(dtype):
    rng = np.random.default_rng(3)
    x = _rand(rng, (9, 17), dtype, 5.0)
    x[2, :] = -np.abs(x[2, :].astype(np.float32)).astype(x.dtype)   # a row of negatives: identity -inf
    y, d = row_max_scale(x)
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    np.testing.assert_allclose(y.astype(np.float64), x64 / m, rtol=2 * EPS[dtype], atol=0)
    np.testing.assert_allclose(d.astype(np.float64), x64 - m, rtol=0, atol=2 * EPS[dtype] * np.abs(x64).max())


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_cpu_in_torch_out(dtype):
    x = torch.randn(4, 96, dtype=getattr(torch, dtype))
    w = torch.rand(96, dtype=x.dtype) + 0.5
    y = rmsnorm(x, w, EPS_RMS)
    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS_RMS) * w.double()
    torch.testing.assert_close(y.double(), want, rtol=4 * EPS[dtype], atol=1e-6)


def test_errors_name_what_was_expected():
    with pytest.raises(ValueError, match="needs an identity"):
        ewkern.RowKernel("T x", "T y", "x", "a + b", "y = x", None)
    with pytest.raises(ValueError, match="raw parameters"):
        ewkern.RowKernel("raw T x", "T y", "x", "a + b", "y = x", "0")
    with pytest.raises(ValueError, match="at least one output"):
        ewkern.RowKernel("T x", "", "x", "a + b", "", "0")
    with pytest.raises(ValueError, match="more than once"):
        ewkern.RowKernel("T x", "T x", "x", "a + b", "x = a", "0")
    with pytest.raises(TypeError, match="operation must be a str"):
        ewkern.RowKernel("T x", "T y", "x", "a + b", 3, "0")
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="wrong number of arguments"):
        rmsnorm(x)
    with pytest.raises(ValueError, match="has shape"):
        rmsnorm(x, np.ones(3, np.float32), 1.0, np.empty((1, 3), np.float32))
    with pytest.raises(ValueError, match="do not broadcast"):
        rmsnorm(x, np.ones(4, np.float32), 1.0)
    with pytest.raises(ValueError, match="at least one dimension"):
        rmsnorm(np.array(1, np.float32), np.array(1, np.float32), 1.0)
    with pytest.raises(TypeError):
        rmsnorm(x, np.ones(3, np.float64), 1.0)     # T bound twice to different dtypes
    out = np.full((2, 3), 7.0, np.float32)
    with pytest.raises(ValueError):
        rmsnorm(x, np.ones(4, np.float32), 1.0, out)
    assert np.all(out == 7.0)                       # nothing written


def test_compile_error_names_kernel_and_line():
    bad = ewkern.RowKernel("T x", "T y", "x", "a + b", "y = x;\ny = x +* a", "0", name="bad_row")
    with pytest.raises(ewkern.rtc.CompileError, match=r"bad_row[\s\S]*y = x \+\* a"):
        bad(np.ones((2, 2), np.float32))


# ---- the launch plan ---------------------------------------------------------------------------

@pytest.mark.parametrize("nv", [1, 3, 32, 1000, 1024, 4096, 4097, 100_000])
def test_row_plan_holds_every_row(nv):
    """Every vector of a row has a lane; the fewest lanes that hold it in 4 vectors each, and the
    fewest vectors per lane (a power of two) that cover it."""
    G, vpl = row_plan(nv)
    assert G & (G - 1) == 0 and 1 <= G <= 1024
    if vpl == 0:
        assert nv > 4 * 1024 and G == 1024
        return
    assert vpl in (1, 2, 4) and G * vpl >= nv and (vpl == 1 or G * (vpl // 2) < nv)
    assert G * 4 >= nv and (G == 1 or (G // 2) * 4 < nv)


# ---- CUDA sources through NVRTC (no GPU needed) -----------------------------------------------

def _nvrtc():
    try:
        return _build.nvrtc()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("E", [1, 0])
def test_nvrtc_compiles_every_form(dtype, E):
    _nvrtc()
    E = E or 16 // {"float64": 8, "float32": 4}.get(dtype, 2)
    ps = parse_params("T x, T w, T s, float32 eps", False, "k") + parse_params("T y", True, "k")
    lay = _codegen.Layout("contig", 1, [(ps[0], dtype, "array", 0), (ps[1], dtype, "bcol", 0),
                                        (ps[2], dtype, "brow", 0), (ps[3], "float32", "scalar", 0),
                                        (ps[4], dtype, "array", 0)])
    tdefs = _codegen.typedefs((("T", dtype),), ps[:4], [dtype, dtype, dtype, "float32"], ps[4:], [dtype])
    rt = "double" if dtype == "float64" else "float"
    src, entries = _codegen.row_source("cuda", "rowk", lay, E, "x * x", "a + b",
                                       "y = x * rsqrt(a / _row_size + eps) * w * s", "0", rt, "", tdefs, set())
    ptx, kind, _ = _build.compile_cuda("rowk", src, (9, 0), ptx_only=True)
    text = ptx.decode(errors="replace")
    assert [e for e in entries if f".entry {e}" not in text] == []
    assert "shfl.sync.bfly" in text and "st.global.cs" in text and "griddepcontrol.wait" in text
    if E * {"float64": 8, "float32": 4}.get(dtype, 2) == 16:
        assert "ld.global.v4" in text or "ld.global.v2.f64" in text or "ld.global.v2.u64" in text


def test_row_kernel_compiled_per_g_fits_more_blocks(tmp_path):
    """RowKernel compiles per lane count G: with G a constant, rmsnorm's float32 form at VPL 4
    (rows of 4096: G = 256) needs fewer registers than with G read at run time, and more blocks
    of 256 fit on an SM (ptxas's resource report for sm_90; 46 -> 32 registers when written)."""
    _nvrtc()
    ps = parse_params("T x, float32 eps", False, "k") + parse_params("T y", True, "k")
    lay = _codegen.Layout("contig", 1, [(ps[0], "float32", "array", 0), (ps[1], "float32", "scalar", 0),
                                        (ps[2], "float32", "array", 0)])
    tdefs = _codegen.typedefs((("T", "float32"),), ps[:2], ["float32", "float32"], ps[2:], ["float32"])
    G, vpl = row_plan(4096 // 4)
    assert (G, vpl) == (256, 4)
    regs = {}
    for g in (None, G):
        src, entries = _codegen.row_source("cuda", "rowg", lay, 4, "x * x", "a + b",
                                           "y = x * rsqrt(a / _row_size + eps)", "0", "float", "", tdefs, set(), None, g)
        ptx, _, _ = _build.compile_cuda("rowg", src, (9, 0), ptx_only=True)
        regs[g] = ptxas_registers(ptx, tmp_path)[entries[_codegen.ROW_FORMS.index(vpl)]]
    assert blocks_per_sm(regs[G], 256) > blocks_per_sm(regs[None], 256), regs


def test_bfloat16_forms_take_no_more_registers_than_float16(tmp_path):
    """bfloat16 rows held as 32-bit words (ewrtc::Held): rmsnorm with a weight, every form at G
    256, takes no more registers than float16's (sm_90; as 16-bit values NVVM split each word in
    two and the 4-vector form took 55 registers against float16's 40)."""
    _nvrtc()
    regs = {}
    for dtype in ("float16", "bfloat16"):
        ps = parse_params("T x, T w, float32 eps", False, "k") + parse_params("T y", True, "k")
        lay = _codegen.Layout("contig", 1, [(ps[0], dtype, "array", 0), (ps[1], dtype, "bcol", 0),
                                            (ps[2], "float32", "scalar", 0), (ps[3], dtype, "array", 0)])
        tdefs = _codegen.typedefs((("T", dtype),), ps[:3], [dtype, dtype, "float32"], ps[3:], [dtype])
        src, entries = _codegen.row_source("cuda", "rowb", lay, 8, "x * x", "a + b",
                                           "y = x * rsqrt(a / _row_size + eps) * w", "0", "float", "", tdefs, set(),
                                           None, 256)
        assert ("ewrtc::elem(_r_x[_q], _k)" in src) and ("_H_x _r_x[_ewrtc_VPL" in src)
        ptx, _, _ = _build.compile_cuda("rowb", src, (9, 0), ptx_only=True)
        regs[dtype] = ptxas_registers(ptx, tmp_path)
    assert all(regs["bfloat16"][e] <= regs["float16"][e] for e in regs["float16"]), regs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_second_reduction_layernorm(dtype):
    """A row kernel's second reduction (the derived backwards' machinery), as a layer norm: the
    mean first, then the variance about it with the mean in scope, then both in the operation;
    against float64 on the CPU, and the CUDA source through NVRTC."""
    ln = ewkern.RowKernel("T x, float32 eps", "T y", "x", "a + b",
                          "y = (x - a / _row_size) * rsqrt(_ewk_s / _row_size + eps)", "0", f"ln2_{dtype}",
                          _stage2=("(x - a / _row_size) * (x - a / _row_size)", "a + b", "0"))
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((37, 300)) * 3 + 5).astype(np_dtype(dtype))
    y = np.asarray(ewkern.asarray(ln(ewkern.asarray(x), 1e-5), dtype="float64"))
    x64 = np.asarray(ewkern.asarray(ewkern.asarray(x), dtype="float64"))
    mu = x64.mean(1, keepdims=True)
    want = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(1, keepdims=True) + np.float32(1e-5))
    tol = {"float32": 1e-5, "bfloat16": 1.6e-2, "float64": 1e-6}[dtype]
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)
    try:
        _build.nvrtc()
    except RuntimeError:
        return
    ps = parse_params("T x, float32 eps", False, "k") + parse_params("T y", True, "k")
    lay = _codegen.Layout("contig", 1, [(ps[0], dtype, "array", 0), (ps[1], "float32", "scalar", 0),
                                        (ps[2], dtype, "array", 0)])
    tdefs = _codegen.typedefs((("T", dtype),), ps[:2], [dtype, "float32"], ps[2:], [dtype])
    src, entries = _codegen.row_source("cuda", "ln2", lay, 1, "x", "a + b", ln.operation, "0",
                                       "double" if dtype == "float64" else "float", "", tdefs, set(), ln._stage2)
    assert "_sh2[32]" in src
    ptx, _, _ = _build.compile_cuda("ln2", src, (9, 0), ptx_only=True)
    assert [e for e in entries if f".entry {e}" not in ptx.decode(errors="replace")] == []


def test_cuda_source_holds_only_what_the_reduction_needs():
    """A repeated row (a weight) is read where it is used (in the apply, or in the map when the
    map reads it), one vector load a lane's vector, not held in registers through the reduction;
    every dense input is held."""
    ps = parse_params("T x, T w, T r, float32 eps", False, "k") + parse_params("T y", True, "k")
    lay = _codegen.Layout("contig", 1, [(ps[0], "float32", "array", 0), (ps[1], "float32", "bcol", 0),
                                        (ps[2], "float32", "array", 0), (ps[3], "float32", "scalar", 0),
                                        (ps[4], "float32", "array", 0)])
    tdefs = _codegen.typedefs((("T", "float32"),), ps[:4], ["float32"] * 4, ps[4:], ["float32"])

    def src(map_expr):
        return _codegen.row_source("cuda", "rowh", lay, 4, map_expr, "a + b",
                                   "y = x * rsqrt(a / _row_size + eps) * w + r", "0", "float", "", tdefs, set())[0]
    s1 = src("x * x")
    assert "_r_x[_ewrtc_VPL" in s1 and "_r_r[_ewrtc_VPL" in s1 and "_r_w[" not in s1 and "_c_w = ewrtc::hold(_u_w + _v)" in s1
    assert s1.count("_c_w = ewrtc::hold(_u_w + _v)") == 1    # the apply's alone
    s2 = src("x * w")   # read where the map uses it too: a vector there, its elements from it
    assert "_r_w[" not in s2 and "ewrtc::ld(&_u_w[_v].v[_k])" not in s2
    assert s2.count("_c_w = ewrtc::hold(_u_w + _v)") == 2 and "const float w = ewrtc::elem(_c_w, _k)" in s2


# ---- the GPU (skipped without one) ------------------------------------------------------------

@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rows,cols,start,form", [
    (1, 1, 0, "VPL=1"), (5, 3, 1, "E=1"), (4096, 8, 0, "G="), (1000, 4096, 0, "VPL="), (2, 4096, 0, "VPL="),
    (17, 4099, 1, "E=1"), (64, 4096, 3, "E=1"), (3, 70_000, 0, "VPL=0"), (1 << 16, 64, 0, "G=")])
def test_gpu_rmsnorm_every_form(dtype, rows, cols, start, form):
    """Short rows on a few lanes, 4 vectors a lane, few rows, rows that cannot be vectorised (odd lengths, misaligned starts), rows read twice; against float64, the
    same bits from a second call, the bytes around the output untouched."""
    tdt = getattr(torch, dtype)
    n = rows * cols
    buf = torch.randn(n + 8, dtype=tdt, device="cuda")
    x = buf[start:start + n].view(rows, cols)
    w = torch.rand(cols, dtype=tdt, device="cuda") + 0.5
    out = torch.full((n + 8,), float("nan"), dtype=tdt, device="cuda")
    y = out[start:start + n].view(rows, cols)
    assert rmsnorm(x, w, EPS_RMS, y) is y
    assert form in rmsnorm._last_path, rmsnorm._last_path
    pick = torch.unique(torch.cat([torch.arange(min(rows, 4)), torch.randint(0, rows, (60,)),
                                   torch.tensor([rows - 1])])).cuda()
    _check_rms(y[pick].double().cpu().numpy(), x[pick].double().cpu().numpy(), w.double().cpu().numpy(),
               dtype)
    assert torch.isnan(out[:start]).all() and torch.isnan(out[start + n:]).all()
    again = rmsnorm(x, w, EPS_RMS)
    assert torch.equal(again, y)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("rows,cols,form", [(300, 4, "VPL=1"), (300, 8, "VPL=2"), (300, 1000, "VPL=4"), (64, 4096, "VPL=4"),
                                            (3, 70_000, "VPL=0"), (5, 3, "E=1")])
def test_gpu_second_reduction_layernorm_every_form(rows, cols, form):
    """The second reduction on CUDA (registers again, or the row read again), as a layer norm
    against torch's in float64."""
    ln = ewkern.RowKernel("T x, float32 eps", "T y", "x", "a + b",
                          "y = (x - a / _row_size) * rsqrt(_ewk_s / _row_size + eps)", "0", "gpu_ln2",
                          _stage2=("(x - a / _row_size) * (x - a / _row_size)", "a + b", "0"))
    x = torch.randn(rows, cols, device="cuda") * 3 + 5
    y = ln(x, 1e-5)
    assert form in ln._last_path, ln._last_path
    want = torch.nn.functional.layer_norm(x.double(), (cols,), eps=1e-5)
    torch.testing.assert_close(y.double(), want, rtol=2e-5, atol=2e-5)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_broadcast_kinds_in_place_and_max():
    k = ewkern.RowKernel("T x, T w, T s, T c, float32 eps", "T y", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w * s + c", "0", name="rms_kinds_gpu")
    x = torch.randn(300, 512, device="cuda")
    w = torch.rand(512, device="cuda") + 0.5
    s = torch.rand(300, 1, device="cuda") + 1
    c = torch.tensor([0.25], device="cuda")
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS_RMS) * w.double()
    torch.testing.assert_close(k(x, w, s, c, EPS_RMS).double(), want * s.double() + 0.25, rtol=1e-5, atol=1e-6)
    x3 = torch.randn(2, 4, 512, device="cuda")
    w3 = torch.rand(2, 1, 512, device="cuda") + 0.5
    want3 = x3.double() * torch.rsqrt(x3.double().pow(2).mean(-1, keepdim=True) + EPS_RMS) * w3.double()
    torch.testing.assert_close(k(x3, w3, 1.0, 0.0, EPS_RMS).double(), want3, rtol=1e-5, atol=1e-6)
    y = x.clone()
    rmsnorm(y, w, EPS_RMS, y)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-6)
    buf = torch.cat([x.flatten(), torch.zeros(512, device="cuda")])
    dst = buf[512:].view(300, 512)
    rmsnorm(buf[:-512].view(300, 512), w, EPS_RMS, dst)   # the output overlaps the input shifted by a row
    torch.testing.assert_close(dst.double(), want, rtol=1e-5, atol=1e-6)
    xm = torch.randn(1000, 77, device="cuda", dtype=torch.float64) - 3
    ym, dm = row_max_scale(xm)
    m = xm.max(-1, keepdim=True).values
    assert torch.equal(dm, xm - m)
    torch.testing.assert_close(ym, xm / m, rtol=2e-16, atol=0)


rmsnorm_nw = ewkern.RowKernel("T x, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps)",
                              "0", name="rmsnorm_nw")


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_many_rows_lean_form(dtype, monkeypatch):
    """Rows of 4096 enough to fill _LEAN_WAVES waves run the lean two-pass form (VPL=-2; asked for
    on any GPU, whatever its GB/s an SM): against float64, in place, the same bits from a second
    call, the bytes after the output untouched."""
    from ewkern.rtc import _rowkernel
    monkeypatch.setattr(_rowkernel, "_LEAN_SM_GBS", 0.0)
    info = ewkern.device_info("cuda:0")
    G = row_plan(4096 * {"float32": 4}.get(dtype, 2) // 16)[0]
    rows = -(-_rowkernel._LEAN_WAVES * info["sm_count"] * info["max_threads_per_sm"] // (2 * G)) + 3
    tdt = getattr(torch, dtype)
    x = (torch.randn(rows, 4096, device="cuda") * 3 + 0.5).to(tdt)
    out = torch.full((rows * 4096 + 8,), float("nan"), dtype=tdt, device="cuda")
    y = out[:rows * 4096].view(rows, 4096)
    rmsnorm_nw(x, EPS_RMS, y)
    assert "VPL=-2" in rmsnorm_nw._last_path, rmsnorm_nw._last_path
    pick = torch.unique(torch.cat([torch.arange(4), torch.randint(0, rows, (60,)), torch.tensor([rows - 1])])).cuda()
    ones = np.ones(4096)
    _check_rms(y[pick].double().cpu().numpy(), x[pick].double().cpu().numpy(), ones, dtype)
    assert torch.isnan(out[rows * 4096:]).all()
    assert torch.equal(rmsnorm_nw(x, EPS_RMS), y)
    rmsnorm_nw(x, EPS_RMS, x)            # in place: each lane loads its step before it stores it
    assert torch.equal(x, y)


@pytest.mark.serial
@pytest.mark.slow
@gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_more_than_2_31_elements(monkeypatch):
    """2^31 + 4096 x 3 float16 elements in rows of 4096: the rows past 2^31 elements are right,
    in the register form and in the lean two-pass form (asked for on any GPU)."""
    from ewkern.rtc import _rowkernel
    monkeypatch.setattr(_rowkernel, "_LEAN_SM_GBS", 0.0)
    rows, cols = (1 << 19) + 3, 4096
    if torch.cuda.mem_get_info()[0] < 2 * 2 * rows * cols + (2 << 30):
        pytest.skip("not enough GPU memory for two float16 arrays of 2^31 + 12288 elements")
    x = torch.empty(rows, cols, dtype=torch.float16, device="cuda")
    x[:, :] = torch.arange(cols, device="cuda", dtype=torch.float16) / 1024 + 0.5
    x[-1] *= 2
    w = torch.ones(cols, dtype=torch.float16, device="cuda")
    y = rmsnorm(x, w, 0.0)
    torch.cuda.synchronize()
    for r in (0, (1 << 19) - 1, 1 << 19, rows - 1):
        xr = x[r].double()
        torch.testing.assert_close(y[r].double(), xr / xr.pow(2).mean().sqrt(), rtol=2e-3, atol=0)
    del y
    y = rmsnorm_nw(x, 0.0)                # without the weight: the lean two-pass form
    assert "VPL=-2" in rmsnorm_nw._last_path, rmsnorm_nw._last_path
    torch.cuda.synchronize()
    for r in (0, (1 << 19) - 1, 1 << 19, rows - 1):
        xr = x[r].double()
        torch.testing.assert_close(y[r].double(), xr / xr.pow(2).mean().sqrt(), rtol=2e-3, atol=0)
    del x, y


# ---- column-sum outputs (a weight row's gradient in ewkern.torch's derived backwards) ------------

_CS_OP = "y = x * rsqrt(a / _row_size + eps) * w; gw = x * rsqrt(a / _row_size + eps)"


def _colsum_kernel(tag):
    return ewkern.RowKernel("T x, T w, float32 eps", "T y, T gw", "x * x", "a + b", _CS_OP, "0", f"cs_{tag}",
                            _colsum=("gw",))


def _colsum_ref(x, w, eps):
    x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    r = x / np.sqrt((x * x).mean(1, keepdims=True) + np.float32(eps))
    return r * w, r.sum(0), np.abs(r).sum(0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", [(1, 64), (37, 64), (4, 9, 40), (2000, 8)])
def test_column_sum_output_on_the_cpu(dtype, shape):
    """An output named in _colsum gets the sum over every row of its values, shape [cols]: the
    same as summing a per-element output afterwards, the same bits on every call."""
    k = _colsum_kernel(f"cpu_{dtype}_{len(shape)}")
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(shape[-1]).astype(dtype)
    y, gw = k(x, w, 1e-5)
    ry, rgw, scale = _colsum_ref(x, w, 1e-5)
    assert y.shape == shape and gw.shape == (shape[-1],) and gw.dtype == np.dtype(dtype)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(y.reshape(-1, shape[-1]), ry, rtol=0, atol=8 * eps * np.abs(ry).max())
    assert np.all(np.abs(gw - rgw) <= 8 * eps * scale * np.sqrt(x.size // shape[-1]) + 1e-300)
    again = np.full(shape[-1], np.nan, dtype)
    k(x, w, 1e-5, np.empty(shape, dtype), again)
    np.testing.assert_array_equal(again, gw)       # given outputs; the same bits


@pytest.mark.parametrize("cols", [1, 7, 512, 513, 1300])
def test_cpu_float16_rows_are_float32_rounded_once(cols):
    """The CPU form takes float16 rows a tile of 512 columns at a time (F16C): the results are the
    float32 kernel's on the same values, rounded once to float16, bit for bit, for a weight row
    (bcol), a value per row (brow), a two-pass reduction, an output the operation reads, in place,
    a column sum, and rows of any length (1, a tile and one more, several tiles and a tail)."""
    rng = np.random.default_rng(cols)
    rows = 5
    x16 = _rand(rng, (rows, cols), "float16")
    w16 = _rand(rng, (cols,), "float16", 1.0)
    s16 = _rand(rng, (rows, 1), "float16", 2.0)
    f32 = {n: v.astype(np.float32) for n, v in (("x", x16), ("w", w16), ("s", s16))}
    k = ewkern.RowKernel("T x, T w, T s, float32 eps", "T y", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w * s", "0", name="f16_tiles")
    want = k(f32["x"], f32["w"], f32["s"], EPS_RMS).astype(np.float16)
    got = k(x16, w16, s16, EPS_RMS)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    y = x16.copy()
    k(y, w16, s16, EPS_RMS, y)                       # in place
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
    ln = ewkern.RowKernel("T x, float32 eps", "T y", "x", "a + b",
                          "y = (x - a / _row_size) * rsqrt(_ewk_s / _row_size + eps)", "0", "f16_tiles_ln",
                          _stage2=("(x - a / _row_size) * (x - a / _row_size)", "a + b", "0"))
    want = ln(f32["x"], 1e-5).astype(np.float16)
    np.testing.assert_array_equal(ln(x16, 1e-5).view(np.uint16), want.view(np.uint16))
    two = ewkern.RowKernel("T x, T w", "T y", "x", "a + b", "y = y + (x - a / _row_size) * w", "0",
                           name="f16_tiles_read")
    y0 = _rand(rng, (rows, cols), "float16")
    want = two(f32["x"], f32["w"], y0.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(two(x16, w16, y0.copy()).view(np.uint16), want.view(np.uint16))
    cs = _colsum_kernel(f"f16_{cols}")
    y32, g32 = cs(f32["x"], f32["w"], 1e-5)
    y16, g16 = cs(x16, w16, 1e-5)
    np.testing.assert_array_equal(y16.view(np.uint16), y32.astype(np.float16).view(np.uint16))
    assert g16.dtype == np.float16 and g16.shape == (cols,)


def test_column_sum_output_errors():
    with pytest.raises(ValueError, match="not an output"):
        ewkern.RowKernel("T x", "T y", "x", "a + b", "y = x", "0", "cs_bad1", _colsum=("x",))
    with pytest.raises(ValueError, match="written only"):
        ewkern.RowKernel("T x", "T y", "x", "a + b", "y += x", "0", "cs_bad2", _colsum=("y",))
    k = _colsum_kernel("shape")
    x = np.ones((3, 8))
    with pytest.raises(ValueError, match=r"output gw has shape \(3, 8\); expected \(8,\) \(a column sum\)"):
        k(x, np.ones(8), 1e-5, np.empty((3, 8)), np.empty((3, 8)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("g", [None, 256])
def test_nvrtc_compiles_column_sums_in_every_form(dtype, g):
    """The CUDA source with a column-sum output: each block runs its tiles of rows in turn, each
    group sums into its own partial row (no stores of the output per element), every form."""
    _nvrtc()
    E = 16 // {"float64": 8, "float32": 4}.get(dtype, 2)
    ins, outs = parse_params("T x, T w, float32 eps", False, "k"), parse_params("T y, T gw", True, "k")
    lay = _codegen.Layout("contig", 1, [(ins[0], dtype, "array", 0), (ins[1], dtype, "bcol", 0),
                                        (ins[2], "float32", "scalar", 0), (outs[0], dtype, "array", 0),
                                        (outs[1], dtype, "colsum", 0)])
    tdefs = _codegen.typedefs((("T", dtype),), ins, [dtype, dtype, "float32"], outs, [dtype, dtype])
    src, entries = _codegen.row_source("cuda", "csk", lay, E, "x * x", "a + b", _CS_OP, "0",
                                       "double" if dtype == "float64" else "float", "", tdefs, set(), None, g)
    assert "for (long long _t = 0; _t < _ewrtc_PP.tiles; ++_t)" in src and "_pa_gw[_k] += gw" in src
    assert "(_u_gw + _v" not in src and "stv(_u_y + _v, _w_y, _ewrtc_PP.wb)" in src
    # the two-pass forms (VPL 0 and the lean -2) add into the partial row in memory, a lane's vector
    # loaded, added to and stored again: both zero it first
    assert ("ewrtc::ld_part(_cs_gw + _v * _ewrtc_E, _pa_gw);" in src
            and "ewrtc::st_part(_cs_gw + _v * _ewrtc_E, _pa_gw);" in src)
    assert ("if constexpr (_ewrtc_VPL <= 0)\n        for (int _v = _lane; _v < _nv; _v += _G)\n"
            "            ewrtc::st_part(_cs_gw + _v * _ewrtc_E, _ca_gw[0]);") in src
    assert entries[-1] == "ewrtc_csk_sum_gw" and len(entries) == len(_codegen.ROW_FORMS) + 1
    ptx, _, _ = _build.compile_cuda("csk", src, (9, 0), ptx_only=True)
    text = ptx.decode(errors="replace")
    assert [e for e in entries if f".entry {e}" not in text] == []
    # every form writes a lane's partial columns as 16-byte vectors, not one by one
    C, vec = ("f64", "v2.f64") if dtype == "float64" else ("f32", "v4.f32")
    for e in [e for e in entries if re.fullmatch(r"ewrtc_csk_[rt]\d", e)]:
        body = text.split(f".entry {e}(")[1].split(".entry ")[0]
        assert f"st.global.{vec}" in body and f"st.global.{C} " not in body, e


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows,cols", [(1, 64), (300, 4096), (5000, 1024), (3, 70_000)])
def test_gpu_column_sums(dtype, rows, cols):
    """On CUDA: the column sums against float64, every form, the same bits on a second call."""
    tdt = getattr(torch, dtype)
    k = _colsum_kernel(f"gpu_{dtype}")
    x = torch.randn(rows, cols, device="cuda").to(tdt)
    w = (torch.rand(cols, device="cuda") + 0.5).to(tdt)
    y, gw = k(x, w, 1e-5)
    assert gw.shape == (cols,) and gw.dtype == tdt
    xd = x.double()
    r = xd * torch.rsqrt((xd * xd).mean(1, keepdim=True) + 1e-5)
    tol = {"float32": 2e-6, "bfloat16": 1e-2}[dtype]
    torch.testing.assert_close(gw.double(), r.sum(0), rtol=tol, atol=tol * float(r.abs().sum(0).max()))
    torch.testing.assert_close(y.double(), r * w.double(), rtol=tol, atol=tol)
    assert torch.equal(k(x, w, 1e-5)[1], gw)


def test_column_sum_warm_calls_run_by_plan(full_calls):
    """A warm call with a column-sum output runs by its plan: fresh partial rows, the sum into a
    fresh (or the given) output, the same values as the full path."""
    k = _colsum_kernel("plan")
    rng = np.random.default_rng(12)
    for rep in range(3):
        x = rng.standard_normal((50, 32))
        w = rng.standard_normal(32)
        y, gw = k(x, w, 0.5)
        ry, rgw, scale = _colsum_ref(x, w, 0.5)
        np.testing.assert_allclose(gw, rgw, rtol=0, atol=1e-13 * scale.max())
    assert full_calls[0] == 2    # the kernel's first call and its column sum's
    gw_out = np.empty(32)
    k(x, w, 0.5, np.empty((50, 32)), gw_out)
    n = full_calls[0]
    x2 = rng.standard_normal((50, 32))
    r = k(x2, w, 0.5, np.empty((50, 32)), gw_out)
    assert r[1] is gw_out and full_calls[0] == n
    np.testing.assert_allclose(gw_out, _colsum_ref(x2, w, 0.5)[1], rtol=0, atol=1e-13 * 50)


def test_strided_output_read_by_the_operation_starts_as_the_callers_values():
    """An operation that reads its output (`y = y + ...`) into a non-dense output: the CPU's
    dense stand-in for it starts as the output's values (not uninitialised memory) and is
    written back."""
    k = ewkern.RowKernel("T x", "T y", map_expr="x", reduce_expr="a + b", identity="0",
                         operation="y = y + x / a", name="acc_row_strided")
    x = np.arange(1, 13, dtype=np.float64).reshape(3, 4)
    want = 100 + x / x.sum(1, keepdims=True)
    yt = np.full((4, 3), 100.0).T
    k(x, yt)
    np.testing.assert_allclose(yt, want, rtol=1e-15)
