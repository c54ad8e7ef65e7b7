"""Run-time kernels on awkward input: warm calls that allocate bool or integer results, Python
scalars out of their parameter's range, the reserved parameter name `i`, ReductionKernel's stream=,
RowKernel and the vector forms on integer dtypes (two-word C++ types), and compile errors in a
reduction's map_expr / reduce_expr / identity and an unclosed '{'. The CPU backend on NumPy arrays;
the CUDA sources through NVRTC to PTX (no GPU needed; skipped without NVRTC)."""
import contextlib
import os

import numpy as np
import pytest

import ewkern
from ewkern.rtc import _build, _codegen
from ewkern.rtc._params import DTYPES, parse_params

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    monkeypatch.setenv("EWKERN_CACHE_DIR", str(d))
    return d


def _nvrtc():
    try:
        return _build.nvrtc()
    except RuntimeError as e:
        pytest.skip(str(e))


def _layout(mode, specs):
    """specs: (param string, dtype, kind); an output's name ends in _out"""
    args = []
    for ps, dt, kind in specs:
        (p,) = parse_params(ps, ps.endswith("_out"), "k")
        args.append((p, dt, kind, 0))
    return _codegen.Layout(mode, 1, args)


# ---- 1. warm calls whose results are not ewkern's dtypes ---------------------------------------

def test_warm_calls_allocate_bool_and_integer_results():
    """A plan that allocates a bool or integer result from a float input (ewkern's arrays hold
    only its float dtypes) runs again with the first call's answer."""
    x = np.array([-1.0, 2.0, 3.0], np.float32)
    pos = ewkern.ElementwiseKernel("float32 x", "bool y", "y = x > 0", "rv_pos")
    f2i = ewkern.ElementwiseKernel("T x", "int32 y", "y = (int)x", "rv_f2i")
    cnt = ewkern.ReductionKernel("T x", "int64 y", "x > 0", "a + b", "y = a", "0", "rv_count_pos")
    M = np.arange(12, dtype=np.float64).reshape(3, 4) - 5
    cases = [(lambda: pos(x), x > 0), (lambda: f2i(x.astype(np.float64) * 2.5), (x * 2.5).astype(np.int32)),
             (lambda: cnt(x), np.int64(2)), (lambda: cnt(M, axis=1), (M > 0).sum(1))]
    for run, want in cases:
        for _ in range(3):
            r = run()
            assert r.dtype == np.asarray(want).dtype
            np.testing.assert_array_equal(r, want)
    assert pos._plans and cnt._plans   # the later calls ran by a plan


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_warm_calls_allocate_bool_results_for_torch():
    pos = ewkern.ElementwiseKernel("float32 x", "bool y", "y = x > 0", "rv_pos_t")
    x = torch.tensor([-1.0, 2.0, 3.0])
    for _ in range(3):
        r = pos(x)
        assert isinstance(r, torch.Tensor) and r.dtype == torch.bool
        assert r.tolist() == [False, True, True]


# ---- 2. scalars out of their parameter's range -------------------------------------------------

@pytest.mark.parametrize("dt,value,exc", [
    ("uint8", 300, OverflowError), ("uint8", -1, OverflowError), ("int32", 2**40, OverflowError),
    ("int32", 2**70, OverflowError), ("int64", 2**63, OverflowError), ("uint64", 2**64, OverflowError),
    ("uint64", -1, OverflowError), ("int32", float("nan"), ValueError), ("int32", float("inf"), OverflowError),
    ("int16", 1e20, OverflowError), ("int32", np.int64(2**40), OverflowError)], ids=str)
def test_scalar_out_of_range_raises_cold_and_warm(dt, value, exc):
    """NumPy 2's rule (NEP 50; CuPy's CScalar assigns the same way): no wrapping, an error that
    names the kernel and the parameter, on the first call and on a warm call by a plan."""
    k = ewkern.ElementwiseKernel(f"T x, {dt} s", "T z", "z = x + s", f"rv_range_{dt}")
    x = np.zeros(4, np.float32)
    with pytest.raises(exc, match=rf"rv_range_{dt}: scalar s = .* {dt}"):
        k(x, value)
    np.testing.assert_array_equal(k(x, 1), x + 1)   # records the plan
    assert k._plans
    with pytest.raises(exc, match=rf"rv_range_{dt}: scalar s = .* {dt}"):
        k(x, value)


def test_scalar_in_range_unchanged():
    x = np.zeros(1, np.float64)
    for dt, value, want in [("uint8", 255, 255), ("int64", -2**63, -2**63), ("int64", 2**63 - 1, 2**63 - 1),
                            ("uint64", 2**64 - 1, 2**64 - 1), ("int32", 2.7, 2), ("int32", -2.7, -2),
                            ("int8", True, 1), ("int16", np.int64(-5), -5)]:
        k = ewkern.ElementwiseKernel(f"T x, {dt} s", f"{dt} z", "z = s", f"rv_ok_{dt}")
        for _ in range(2):
            r = k(x, value)
            assert r.dtype == np.dtype(dt) and int(r[0]) == want, (dt, value, r)


def test_bfloat16_scalar_past_float32_range_is_infinity():
    """A float past float32's range for a bfloat16 parameter is its infinity, as a float16 or
    float32 parameter takes it (and torch's bfloat16): it was an OverflowError (struct's float32
    packing), cold and warm."""
    x = np.array([1.0, -2.0, 0.5], np.float32)
    for dt in ("bfloat16", "float16", "float32"):
        k = ewkern.ElementwiseKernel(f"T x, {dt} s", "T z", "z = x + s", f"rv_inf_{dt}")
        for _ in range(2):
            np.testing.assert_array_equal(k(x, 1e39), [np.inf] * 3)
            np.testing.assert_array_equal(k(x, -1e300), [-np.inf] * 3)
        np.testing.assert_array_equal(k(x, 2.0), x + 2)


def test_a_result_past_sixteen_dimensions_names_the_kernel():
    """A result of more axes than ewkern's arrays hold is refused naming the kernel and output (the
    message named ewkern's internal allocation, _rtc_result); 16 axes run."""
    k = ewkern.ElementwiseKernel("T x", "T y", "y = x + 1", "rv_ndim")
    for dt in (np.float32, np.int32):
        with pytest.raises(ValueError, match=r"rv_ndim: output y would have 17 dimensions \(ewkern supports up to 16\)"):
            k(np.full((1,) * 17, 3, dt))
    np.testing.assert_array_equal(k(np.full((1,) * 15 + (2,), 2.5, np.float32)), np.full((1,) * 15 + (2,), 3.5))


def test_scalar_out_of_range_in_reduction_and_row_kernels():
    red = ewkern.ReductionKernel("T x, uint8 s", "T y", "x * s", "a + b", "y = a", "0", "rv_red_s")
    row = ewkern.RowKernel("T x, int8 s", "T y", "x", "a + b", "y = x * s - a", "0", "rv_row_s")
    M = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(red(M, 2, axis=1), [6, 6])
    with pytest.raises(OverflowError, match="rv_red_s: scalar s = 256"):
        red(M, 256, axis=1)
    np.testing.assert_array_equal(row(M, 2), M * 2 - 3)
    with pytest.raises(OverflowError, match="rv_row_s: scalar s = 128"):
        row(M, 128)


# ---- 3. the reserved parameter name i ----------------------------------------------------------

def test_parameter_named_i_is_rejected():
    """CuPy's ElementwiseKernel: "Can not use 'i' as a parameter name" (it would hide the loop
    index). RowKernel has i in scope likewise; CuPy's ReductionKernel takes it (no i there)."""
    with pytest.raises(ValueError, match=r"rv_i: can not use 'i' as a parameter name"):
        ewkern.ElementwiseKernel("T i", "T z", "z = i * 2", "rv_i")
    with pytest.raises(ValueError, match=r"rv_i_out: can not use 'i' as a parameter name"):
        ewkern.ElementwiseKernel("T x", "T i", "i = x", "rv_i_out")
    with pytest.raises(ValueError, match=r"rv_row_i: can not use 'i' as a parameter name"):
        ewkern.RowKernel("T i", "T y", "i", "a + b", "y = i - a", "0", "rv_row_i")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ewkern.ElementwiseKernel("T n", "T z", "z = n * 2", "rv_n")(x), x * 2)
    red = ewkern.ReductionKernel("T i", "T y", "i", "a + b", "y = a", "0", "rv_red_i")
    np.testing.assert_array_equal(red(x, axis=1), x.sum(1))


# ---- 4. ReductionKernel's stream= --------------------------------------------------------------

def test_reduction_stream_argument(monkeypatch):
    """stream=None as before; anything but an ewkern.Stream a TypeError (cold or warm); an
    ewkern.Stream runs the call inside `with ewkern.stream(s):` (a stand-in here: a Stream needs a
    CUDA device)."""
    l2 = ewkern.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "rv_l2")
    M = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = np.sqrt((M.astype(np.float64) ** 2).sum(1)).astype(np.float32)
    for _ in range(2):
        with pytest.raises(TypeError, match=r"rv_l2: stream= takes an ewkern.Stream or None, got str"):
            l2(M, axis=1, stream="not a stream")
        np.testing.assert_allclose(l2(M, axis=1, stream=None), want, rtol=1e-6)

    class FakeStream:
        pass
    entered = []

    @contextlib.contextmanager
    def fake_block(s):
        entered.append(s)
        yield s
    monkeypatch.setattr(ewkern, "Stream", FakeStream)
    monkeypatch.setattr(ewkern, "stream", fake_block)
    s = FakeStream()
    np.testing.assert_allclose(l2(M, axis=1, stream=s), want, rtol=1e-6)
    assert entered == [s]


# ---- 5. integer dtypes: two-word C++ types -----------------------------------------------------

@pytest.mark.parametrize("dt", INTS)
def test_row_kernel_on_integer_dtypes(dt):
    """`long long()` (a function-style cast of a two-word type) does not parse: a row kernel's
    output that is only assigned starts from a C-style cast."""
    rs = ewkern.RowKernel("T x", "T y", map_expr="x", reduce_expr="a + b", identity="0", operation="y = x - a",
                          name="rv_center")
    x = np.arange(6).reshape(2, 3).astype(dt)
    with np.errstate(over="ignore"):
        want = x - x.sum(1, keepdims=True, dtype=dt)
    for _ in range(2):
        r = rs(x)
        assert r.dtype == np.dtype(dt)
        np.testing.assert_array_equal(r, want)


@pytest.mark.parametrize("dt", INTS)
def test_nvrtc_compiles_integer_row_and_vector_forms(dt):
    """The CUDA sources for every integer dtype: the row kernel with every broadcast kind, and the
    default path's vector body with an output it only assigns."""
    _nvrtc()
    td = f"typedef {DTYPES[dt][1]} T;"
    for E in (1, 16 // DTYPES[dt][2]):
        lay = _layout("contig", [("T x", dt, "array"), ("T w", dt, "bcol"), ("T s", dt, "brow"), ("T o", dt, "bone"),
                                 ("T y_out", dt, "array")])
        src, entries = _codegen.row_source("cuda", "rvrow", lay, E, "x", "a + b", "y_out = x * w - a + s + o", "0",
                                           DTYPES[dt][1], "", td, set())
        text = _build.compile_cuda("rvrow", src, (9, 0), ptx_only=True)[0].decode(errors="replace")
        assert [e for e in entries if f".entry {e}" not in text] == []
    lay = _layout("vector", [("T a", dt, "array"), ("T b", dt, "bcol"), ("T o_out", dt, "array")])
    src, entries = _codegen.vector_source("rvvec", lay, "o_out = a * b", "", "", "", td, set())
    text = _build.compile_cuda("rvvec", src, (9, 0), ptx_only=True)[0].decode(errors="replace")
    assert all(f".entry {e}" in text for e in entries)


# ---- 6. compile errors in a reduction's parts ---------------------------------------------------

def test_compile_errors_quote_the_reductions_parts():
    x = np.arange(5, dtype=np.float32)
    for args, where in [(("x *", "a + b", "y = a", "0"), r"map_expr, line 1: x \*"),
                        (("x", "a +", "y = a", "0"), r"reduce_expr, line 1: a \+"),
                        (("x", "a + b", "y = a", "zer0"), r"identity, line 1: zer0")]:
        k = ewkern.ReductionKernel("T x", "T y", *args, "rv_bad_red")
        with pytest.raises(ewkern.rtc.CompileError, match=rf"(?s)'rv_bad_red'.*the error is in:\n  {where}\n"):
            k(x)
    row = ewkern.RowKernel("T x", "T y", "x", "a + b", "y = x - a", "zer0", "rv_bad_row")
    with pytest.raises(ewkern.rtc.CompileError, match=r"(?s)'rv_bad_row'.*identity, line 1: zer0"):
        row(x.reshape(1, 5))
    # an expression that ends in a // comment still compiles (its ')' is on a line of its own)
    k = ewkern.ReductionKernel("T x", "T y", "x * x // squared", "a + b // summed", "y = a", "0 // none", "rv_cmt")
    assert float(k(x)) == float((x.astype(np.float64) ** 2).sum())


def test_compile_error_names_an_unclosed_brace():
    k = ewkern.ElementwiseKernel("T x", "T z", "if (x > 0) {\n  z = x;\n", "rv_brace")
    with pytest.raises(ewkern.rtc.CompileError,
                       match=r"(?s)'rv_brace'.*do not pair in:\n  operation, line 1: if \(x > 0\) \{  \(an unclosed '\{'\)"):
        k(np.arange(3, dtype=np.float32))


def test_unbalanced():
    u = _build.unbalanced
    assert u("z = (x + 1) * y[0]; { }") is None
    assert u("if (x > 0) {\n z = x;\n") == ("{", 1)
    assert u("z = x;\n}") == ("}", 2)
    assert u("z = f(x]") == ("]", 1)
    assert u("z = ')' == c ? 1 : 2; // (\n/* { */ s = \"(\\\"\";") is None
    assert u("a = '\n(") == ("(", 2)


def test_nvrtc_reports_the_reductions_parts():
    _nvrtc()
    inl = _layout("strided", [("T x", "float32", "array")])
    outl = _layout("strided", [("T y_out", "float32", "array")])
    for m, r, ident, where in [("x *", "a + b", "0", r"map_expr, line 1: x \*"),
                               ("x", "a + b", "zer0", "identity, line 1: zer0")]:
        src, _ = _codegen.reduction_source("cuda", "rvnv", inl, outl, True, m, r, "y_out = a", ident, "float", "",
                                           "typedef float T;")
        parts = {"map_expr": m, "reduce_expr": r, "post_map_expr": "y_out = a", "identity": ident}
        with pytest.raises(ewkern.rtc.CompileError, match=rf"(?s)'rvnv'.*the error is in:\n  {where}\n"):
            _build.compile_cuda("rvnv", src, (9, 0), parts=parts, ptx_only=True)


# ---- integer division by zero in a CPU kernel ------------------------------------------------------

_FPE_CHILD = r"""
import sys, numpy as np, ewkern
dt = np.dtype(sys.argv[1])
x, y = np.load(sys.argv[4]), np.load(sys.argv[5])
q = ewkern.ElementwiseKernel("T x, T y", "T q, T r", "q = x / y; r = x % y", "ew_fpe_" + dt.name)(x, y)
s = ewkern.ElementwiseKernel("T x, raw T y", "T q", "q = x / y[0]", "ew_fpe_raw_" + dt.name)(x, y[1:2])
red = ewkern.ReductionKernel("T x, T y", "T z", "x / y", "a + b", "z = a", "0", "ew_fpe_red_" + dt.name)(x, y)
np.save(sys.argv[2], np.stack([q[0], q[1], s]))
np.save(sys.argv[3], np.array([red], dtype=dt))
"""


def _wrap(v, bits, signed):
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def _c_div(x, y, bits, signed):
    """C's x / y and x % y (truncating) wrapped to the type's width, and NumPy's 0 for a zero divisor."""
    if y == 0:
        return 0, 0
    q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
    return _wrap(q, bits, signed), _wrap(x - q * y, bits, signed)


@pytest.mark.skipif(not (os.uname().sysname == "Linux" and os.uname().machine == "x86_64"),
                    reason="the guard is Linux x86_64's")
@pytest.mark.parametrize("dt", INTS)
def test_integer_division_by_zero_on_the_cpu_gives_numpys_zero(dt, tmp_path):
    """A CPU kernel's x / 0 and x % 0 (and MIN / -1) raised SIGFPE in the div instruction and ended
    the interpreter; now they give NumPy's results (0; MIN / -1 wraps to MIN, MIN % -1 is 0), in an
    elementwise kernel, with a raw scalar divisor and in a reduction's map. In a child process, so
    that a regression is a failed test, not a crashed run."""
    import subprocess
    import sys
    d = np.dtype(dt)
    info = np.iinfo(d)
    bits, signed = 8 * d.itemsize, info.min < 0
    x = np.array([_wrap(v, bits, signed) for v in [7, -7, 9, 0, 5, info.min, info.min, info.max, 3, -3, 1, 100] * 3],
                 dtype=d)
    y = np.array([_wrap(v, bits, signed) for v in [2, 0, 0, 0, -2, -1, 1, 0, 3, 7, -1, 9] * 3], dtype=d)
    files = [tmp_path / f for f in ("q.npy", "r.npy", "x.npy", "y.npy")]
    np.save(files[2], x)
    np.save(files[3], y)
    r = subprocess.run([sys.executable, "-c", _FPE_CHILD, dt, *map(str, files)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    got, red = np.load(files[0]), np.load(files[1])
    # (8- and 16-bit values divide as int after C's promotion, then narrow: MIN / -1 wraps alike)
    ref = [_c_div(int(a), int(b), bits, signed) for a, b in zip(x, y)]
    assert got.dtype == d and red.dtype == d
    np.testing.assert_array_equal(got[0], np.array([q for q, _ in ref], dtype=d))
    np.testing.assert_array_equal(got[1], np.array([rr for _, rr in ref], dtype=d))
    np.testing.assert_array_equal(got[2], np.zeros(len(x), dtype=d))          # a raw divisor of 0
    np.testing.assert_array_equal(red, np.array([_wrap(sum(q for q, _ in ref), bits, signed)], dtype=d))


@pytest.mark.skipif(not (os.uname().sysname == "Linux" and os.uname().machine == "x86_64"),
                    reason="the guard is Linux x86_64's")
def test_the_division_guard_chains_to_the_handler_before_it():
    """SIGFPE outside the guarded kernels still reaches the handler that was there before (here
    Python's own, set by signal.signal), and without one still ends the process."""
    import subprocess
    import sys
    load = ("import numpy as np, ewkern\n"
            "k = ewkern.ElementwiseKernel('T x, T y', 'T z', 'z = x / y', 'ew_fpe_chain')\n"
            "k(np.arange(4, dtype=np.int32), np.zeros(4, dtype=np.int32))\n")
    caught = ("import os, signal\nseen = []\nsignal.signal(signal.SIGFPE, lambda s, f: seen.append(s))\n" + load +
              "os.kill(os.getpid(), signal.SIGFPE)\nprint('seen', seen)\n")
    r = subprocess.run([sys.executable, "-c", caught], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "seen [8]" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
    dies = ("import os, signal\n" + load +
            "print('loaded', flush=True)\nos.kill(os.getpid(), signal.SIGFPE)\nprint('alive')\n")
    r = subprocess.run([sys.executable, "-c", dies], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert r.returncode == -8 and "loaded" in r.stdout and "alive" not in r.stdout, (r.returncode, r.stdout)
