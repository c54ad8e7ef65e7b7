"""ewkern.rmse: every version x dtype x backend against the float64 reference, both layouts,
the edge cases, determinism of auto, and the errors."""
import numpy as np
import pytest

import ewkern
from conftest import HAS_CUDA, device_params
from dlpack_util import offset_view
from reference import DTYPES, np_dtype, random_input, rmse_reference

RTOL = {"float32": 2e-6, "float16": 2e-6, "bfloat16": 2e-6, "float64": 1e-12}


def versions(device):
    return ewkern.variants("rmse", device="cpu" if device == "cpu" else "cuda")


def reduced_axes(ndim, axis):
    """ewkern's axis=None: every axis but the first (a 1-D input is one batch)."""
    if axis is None:
        return tuple(range(1, ndim)) if ndim > 1 else (0,)
    return axis


def check(got, a, b, axis, dtype, what, rtol=None):
    want = rmse_reference(a, b, reduced_axes(np.ndim(a), axis))
    got = np.asarray(got)
    assert got.dtype == (np.float64 if dtype == "float64" else np.float32), what
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol or RTOL[dtype], atol=0, err_msg=what)


def ladder_rtol(variant, dtype, n):
    """The study's versions (all but auto) add a batch's n squares into one float32 sum in the
    order their atomics or strides land: that error grows as sqrt(n) float32 epsilons (random
    rounding of a sum of positive terms), about 6e-6 of the rmse at n = 70001 on the H200. auto
    adds fixed chunks in a fixed tree and keeps RTOL at every n."""
    if variant == "auto" or dtype == "float64":
        return RTOL[dtype]
    return max(RTOL[dtype], 2 * float(np.finfo(np.float32).eps) * np.sqrt(n))


def layouts(rng):
    """(shape, axis) pairs: contiguous batches (trailing axes reduced) and batch-last."""
    return [((5, 1000), None), ((3, 7, 33), None), ((1, 1), None), ((9, 1), None), ((17, 4097), -1),
            ((2, 3, 5, 7), (2, 3)), ((1000, 5), 0), ((33, 7, 3), (0, 1)), ((4097, 3), 0), ((6,), None),
            ((int(rng.integers(1, 50)), int(rng.integers(1, 3000))), None),
            # rows cut into chunks (the CPU's 2^16-element units, float16's 256-element tiles with a
            # tail), and batch-last rows wider than one 256-column unit
            ((2, 70001), -1), ((37, 300), 0)]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_versions(device, dtype):
    rng = np.random.default_rng(2024)
    for variant in versions(device):
        for shape, axis in layouts(rng):
            a = random_input(rng, shape, dtype)
            b = random_input(rng, shape, dtype)
            A, B = ewkern.asarray(a, device=device), ewkern.asarray(b, device=device)
            info = ewkern.kernel_info("rmse", variant, dtype, device="cpu" if device == "cpu" else "cuda")
            batch_last = axis is not None and (0 in np.atleast_1d(axis)) and len(shape) > 1
            if batch_last and variant != "auto":
                with pytest.raises(ValueError, match="contiguous batches"):
                    ewkern.rmse(A, B, axis=axis, variant=variant)
                continue
            r = ewkern.rmse(A, B, axis=axis, variant=variant)
            n = int(np.prod([shape[k] for k in np.atleast_1d(reduced_axes(len(shape), axis))]))
            check(r.numpy(), a, b, axis, dtype, f"rmse {variant} {dtype} {device} {shape} axis={axis}",
                  ladder_rtol(variant, dtype, n))
            assert info["variant"] == variant


@pytest.mark.parametrize("device", device_params())
def test_numpy_in_numpy_out_and_out_argument(device):
    rng = np.random.default_rng(1)
    a, b = random_input(rng, (4, 300), "float32"), random_input(rng, (4, 300), "float32")
    if device == "cpu":
        r = ewkern.rmse(a, b)
        assert isinstance(r, np.ndarray)
        check(r, a, b, (1,), "float32", "numpy")
    A, B = ewkern.asarray(a, device=device), ewkern.asarray(b, device=device)
    out = ewkern.full((4,), 5.0, device=device)
    assert ewkern.rmse(A, B, out=out) is out
    check(out.numpy(), a, b, (1,), "float32", "out=")


@pytest.mark.parametrize("device", device_params())
def test_edge_cases(device):
    z = ewkern.rmse(ewkern.zeros((0, 5), device=device), ewkern.zeros((0, 5), device=device))
    assert z.shape == (0,)
    e = ewkern.rmse(ewkern.zeros((3, 0), device=device), ewkern.zeros((3, 0), device=device)).numpy()
    assert e.shape == (3,) and np.isnan(e).all()
    a = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, np.inf], [1.0, 2.0, 3.0]], dtype=np.float32)
    b = np.ones_like(a)
    r = ewkern.rmse(ewkern.asarray(a, device=device), ewkern.asarray(b, device=device)).numpy()
    assert np.isnan(r[0]) and np.isinf(r[1]) and r[2] == pytest.approx(np.sqrt(5 / 3))
    s = ewkern.rmse(ewkern.asarray(a[2], device=device), ewkern.asarray(b[2], device=device))
    assert s.shape == () and float(s.numpy()) == pytest.approx(np.sqrt(5 / 3))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("shape, axis", [((16, 1 << 16), None), ((3, 100001), None), ((65536, 64), None),
                                          ((1 << 16, 16), 0), ((7, 9, 1000), (0, 1))])
def test_auto_is_deterministic(device, shape, axis):
    rng = np.random.default_rng(9)
    A = ewkern.asarray(random_input(rng, shape, "float32"), device=device)
    B = ewkern.asarray(random_input(rng, shape, "float32"), device=device)
    first = ewkern.rmse(A, B, axis=axis).numpy()
    for _ in range(20):
        assert np.array_equal(ewkern.rmse(A, B, axis=axis).numpy().view(np.uint32), first.view(np.uint32))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("shape", [(8192, 64), (65536, 64), (262144, 16), (1024, 4096), (333, 4099), (32768, 127),
                                   (4096, 512), (2048, 1000), (1031, 2047), (777, 1537), (300, 4096 * 3 + 5)])
def test_auto_same_bits_with_pdl_on_and_off(shape):
    """auto's grid differs with PDL on (prefetching; between one and two waves of group-kernel
    blocks become one wave) and off; the result is the reference's and the same bits either way.
    The shapes take the group kernel, the rows kernel at 64, 128 and 256 threads (misaligned rows
    included) and the chunked rows kernel with its combine."""
    rng = np.random.default_rng(5)
    a, b = (random_input(rng, shape, "float32") for _ in range(2))
    A, B = (ewkern.asarray(x, device="cuda:0") for x in (a, b))
    got = {}
    for pdl in (True, False):
        prev = ewkern.set_pdl(pdl)
        try:
            got[pdl] = ewkern.rmse(A, B).numpy()
        finally:
            ewkern.set_pdl(prev)
        check(got[pdl], a, b, None, "float32", f"{shape} pdl={pdl}")
    assert np.array_equal(got[True].view(np.uint32), got[False].view(np.uint32)), shape


SHORT_NS = [1, 2, 3, 5, 8, 16, 31, 32]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_short_rows(device, dtype):
    """Rows of up to 32 elements (auto's short kernel on a GPU when a and b are 16-byte aligned and
    there are at least 128 tiles of whole rows, else the group kernel): batch counts around a
    tile's (the 16-byte multiple of rows that fits 1024 vectors) and around 128 tiles, 16-byte
    aligned and misaligned starts, and the same bits on a second call."""
    rng = np.random.default_rng(31)
    W = 16 // np.dtype(np_dtype(dtype)).itemsize
    for n in SHORT_NS:
        tb = 1024 * W // n
        for batches in (1, 7, tb - 1, tb, tb + 1, 3 * tb + 5, 127 * tb + 1, 128 * tb + tb // 2 + 3):
            flat_a = random_input(rng, (batches * n + 1,), dtype)
            flat_b = random_input(rng, (batches * n + 1,), dtype)
            for start in (0, 1):
                a = flat_a[start:start + batches * n].reshape(batches, n)
                b = flat_b[start:start + batches * n].reshape(batches, n)
                A, B = (offset_view(ewkern.asarray(f, device=device), start, batches * n, (batches, n))
                        for f in (flat_a, flat_b))
                r = ewkern.rmse(A, B).numpy()
                check(r, a, b, None, dtype, f"{dtype} {device} {batches}x{n} start {start}")
                again = ewkern.rmse(A, B).numpy()
                assert np.array_equal(r.view(np.uint8), again.view(np.uint8)), (dtype, n, batches, start)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_columns(device, dtype):
    """Batch-last shapes across auto's column kernels: the shortcols kernel (at most 32 float32
    rows, 256 16-bit rows, 8 float64 rows, at least 128 blocks of 1024 column vectors; row counts
    that are and are not multiples of its 4-row step) and the cols kernel's narrow and wide column tiles, one row chunk
    or several (with the combine), rows fewer than a thread's unrolled step, and column counts that
    are not whole 16-byte vectors."""
    rng = np.random.default_rng(32)
    for n, batches in ((1, 4096), (3, 100003), (4, 1 << 18), (3, 1 << 19), (5, (1 << 20) + 8), (7, 2048),
                       (9, 1 << 20), (16, (1 << 20) + 8), (31, 1 << 20),
                       (32, 65536), (64, 8192), (1000, 1024),
                       (4096, 1024), (4099, 136), (65, 3), (20000, 16), (5, 6)):
        a = random_input(rng, (n, batches), dtype)
        b = random_input(rng, (n, batches), dtype)
        A, B = ewkern.asarray(a, device=device), ewkern.asarray(b, device=device)
        r = ewkern.rmse(A, B, axis=0).numpy()
        check(r, a, b, 0, dtype, f"{dtype} {device} [{n}, {batches}] axis=0")
        assert np.array_equal(r.view(np.uint8), ewkern.rmse(A, B, axis=0).numpy().view(np.uint8)), (dtype, n, batches)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("dtype,n", [("float16", 9), ("bfloat16", 32), ("float16", 18), ("float32", 7),
                                     ("float32", 32), ("float16", 64), ("bfloat16", 100)])
def test_auto_shortcols_units_change_no_bits(dtype, n):
    """The shortcols kernel takes 1, 2 or 4 column units a thread by the grid it would start on
    the device at hand (2^24 columns: 4 on an H100 or H200; 2^22: 2; 2^20: 1). Each column's sum
    is in row order whatever that choice, so a column's result is the same bits in the wide array
    as in a narrow copy of its first or last 2^20 columns, and the narrow one matches the float64
    reference; with PDL on and off. Past 32 rows (16-bit) the kernel sums runs of 32 rows (its
    SPLIT form, 2 blocks an SM at 4 units a thread): the same choice of units at these widths."""
    torch = pytest.importorskip("torch")
    cols = 1 << 24
    g = torch.Generator(device="cuda").manual_seed(n)
    tdt = getattr(torch, dtype)
    a = (torch.randn((n, cols), device="cuda", generator=g) * 2).to(tdt)
    b = (torch.randn((n, cols), device="cuda", generator=g) * 2).to(tdt)
    for pdl in (True, False):
        prev = ewkern.set_pdl(pdl)
        try:
            wide = torch.from_dlpack(ewkern.rmse(a, b, axis=0))
            for width in (1 << 22, 1 << 20):
                for sl in (slice(0, width), slice(cols - width, cols)):
                    x, y = a[:, sl].contiguous(), b[:, sl].contiguous()
                    part = torch.from_dlpack(ewkern.rmse(x, y, axis=0))
                    assert torch.equal(part.view(torch.int32), wide[sl].view(torch.int32)), (dtype, n, width, sl, pdl)
                    if width == 1 << 20 and sl.start == 0:
                        want = ((x.double() - y.double()) ** 2).mean(0).sqrt()
                        np.testing.assert_allclose(part.double().cpu().numpy(), want.cpu().numpy(),
                                                   rtol=RTOL[dtype], atol=0)
        finally:
            ewkern.set_pdl(prev)
    del a, b
    torch.cuda.empty_cache()


_LONG_SHORTCOLS = r"""
import sys, numpy as np, torch, ewkern
rtol = float(sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(7)
for dtype in ("float32", "float16", "bfloat16"):
    tdt = getattr(torch, dtype)
    for n in (32, 33, 64, 97, 128):
        cols = (1 << 20) + 64
        a = (torch.randn((n, cols), device="cuda", generator=g) * 2).to(tdt)
        b = (torch.randn((n, cols), device="cuda", generator=g) * 2).to(tdt)
        want = ((a.double() - b.double()) ** 2).mean(0).sqrt().cpu().numpy()
        for pdl in (True, False):
            ewkern.set_pdl(pdl)
            got = torch.from_dlpack(ewkern.rmse(a, b, axis=0))
            np.testing.assert_allclose(got.double().cpu().numpy(), want, rtol=rtol, atol=0,
                                       err_msg=f"{dtype} n={n} pdl={pdl}")
            again = torch.from_dlpack(ewkern.rmse(a, b, axis=0))
            assert torch.equal(got.view(torch.int32), again.view(torch.int32)), (dtype, n, pdl)
    # 1, 2 and 4 units a thread (2^20, 2^22 and 2^24 columns) give the same bits over runs of rows
    n = 64
    a = (torch.randn((n, 1 << 24), device="cuda", generator=g) * 2).to(tdt)
    b = (torch.randn((n, 1 << 24), device="cuda", generator=g) * 2).to(tdt)
    wide = torch.from_dlpack(ewkern.rmse(a, b, axis=0))
    for width in (1 << 22, 1 << 20):
        part = torch.from_dlpack(ewkern.rmse(a[:, -width:].contiguous(), b[:, -width:].contiguous(), axis=0))
        assert torch.equal(part.view(torch.int32), wide[-width:].view(torch.int32)), (dtype, width)
    del a, b
    torch.cuda.empty_cache()
print("ok")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_auto_shortcols_runs_of_rows():
    """The shortcols kernel past 32 rows (float sums in runs of 32 rows, the runs' sums added in
    order), forced on for up to 128 rows by EWKERN_RMSE_SHORT_COLS_N in a child process (float32's
    default limit is 32 rows, 16-bit's 256): float32 / float16 / bfloat16 at 32, 33, 64, 97, 128 rows against the float64
    reference at the stated bound, the same bits on a second call, with PDL on and off, and the same
    bits at 1, 2 and 4 column units a thread."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    env = dict(os.environ, EWKERN_RMSE_SHORT_COLS_N="128")
    r = subprocess.run([sys.executable, "-c", _LONG_SHORTCOLS, repr(RTOL["float32"])], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_auto_one_element_batches_are_elementwise(dtype):
    """n == 1: each result is the square root of one square, in the arithmetic type (float32, or
    float64 for float64 inputs), rounded once to the output type, whatever kernel runs it (the
    shortcols kernel over one row when a, b and out are 16-byte aligned and the batch count is
    whole 16-byte vectors; the short / cols kernels otherwise). Batch-first [k, 1] and batch-last
    [1, k] (the same memory), aligned and misaligned starts, batch counts from one vector to
    enough for 4 units a thread, with PDL on and off: bit for bit against NumPy."""
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    acc = torch.float64 if dtype == "float64" else torch.float32
    g = torch.Generator(device="cuda").manual_seed(41)
    for k in (8, 24, 1000, 4096 + 8, 1 << 18, (1 << 20) + 16, 1 << 23):
        flat_a = (torch.randn(k + 8, device="cuda", generator=g) * 3).to(tdt)
        flat_b = (torch.randn(k + 8, device="cuda", generator=g) * 3).to(tdt)
        for start in (0, 1, 8):
            a, b = flat_a[start:start + k], flat_b[start:start + k]
            want = ((a.to(acc) - b.to(acc)) ** 2).sqrt()
            for pdl in (True, False):
                prev = ewkern.set_pdl(pdl)
                try:
                    for shape, axis in (((k, 1), 1), ((1, k), 0)):
                        got = torch.from_dlpack(ewkern.rmse(a.view(shape), b.view(shape), axis=axis))
                        assert got.dtype == acc and got.shape == (k,)
                        assert torch.equal(got, want), (dtype, k, start, shape, pdl)
                finally:
                    ewkern.set_pdl(prev)


@pytest.mark.serial
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("layout", ["first", "last"])
def test_auto_past_2_31_elements(layout):
    """float16 rows of 3 with 2^31 + 4 elements in each input (64-bit offsets in the short and
    column kernels): the first and last batches against the float64 reference."""
    torch = pytest.importorskip("torch")
    batches = (2**31 + 4) // 3 + 1
    need = 2 * batches * 3 * 2 + (1 << 30)
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip("not enough GPU memory for two float16 arrays of 2^31 + 4 elements")
    g = torch.Generator(device="cuda").manual_seed(3)
    shape = (batches, 3) if layout == "first" else (3, batches)
    a = (torch.randn(shape, device="cuda", generator=g) * 3).half()
    b = (torch.randn(shape, device="cuda", generator=g) * 3).half()
    r = torch.from_dlpack(ewkern.rmse(a, b, axis=None if layout == "first" else 0))
    assert r.shape == (batches,) and r.dtype == torch.float32
    for sl in (slice(0, 1000), slice(batches - 1000, batches)):
        x, y = (a[sl], b[sl]) if layout == "first" else (a[:, sl].T, b[:, sl].T)
        want = ((x.double() - y.double()) ** 2).mean(1).sqrt()
        np.testing.assert_allclose(r[sl].double().cpu().numpy(), want.cpu().numpy(), rtol=RTOL["float16"], atol=0)
    del a, b, r
    torch.cuda.empty_cache()


@pytest.mark.parametrize("device", device_params())
def test_float32_accuracy_long_batches(device):
    """float32 partial sums combined in a tree: 1e-6 relative for batches of 2^24 elements."""
    rng = np.random.default_rng(5)
    n = 1 << 24
    a = (rng.random((2, n), dtype=np.float32) + 0.5)
    b = rng.random((2, n), dtype=np.float32)
    r = ewkern.rmse(ewkern.asarray(a, device=device), ewkern.asarray(b, device=device)).numpy()
    np.testing.assert_allclose(r, rmse_reference(a, b, 1), rtol=1e-6)


def test_errors():
    a = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="shape mismatch"):
        ewkern.rmse(a, np.ones((4, 7), np.float32))
    with pytest.raises(TypeError, match="dtype mismatch"):
        ewkern.rmse(a, np.ones((4, 8), np.float64))
    with pytest.raises(ValueError, match="out has shape"):
        ewkern.rmse(a, a, out=np.empty(5, np.float32))
    with pytest.raises(TypeError, match="out is float64"):
        ewkern.rmse(a, a, out=np.empty(4, np.float64))
    with pytest.raises(ValueError, match="out of bounds"):
        ewkern.rmse(a, a, axis=2)
    with pytest.raises(ValueError, match="contiguous run"):
        ewkern.rmse(np.ones((2, 3, 4), np.float32), np.ones((2, 3, 4), np.float32), axis=(0, 2))
    with pytest.raises(ValueError, match="repeated"):
        ewkern.rmse(a, a, axis=(1, -1))
    with pytest.raises(TypeError, match="axis"):
        ewkern.rmse(a, a, axis="x")
    with pytest.raises(TypeError, match="axis entries must be ints, got float"):
        ewkern.rmse(a, a, axis=(1.0,))
    with pytest.raises(ValueError, match="axis 1180591620717411303424 is out of bounds"):   # not OverflowError
        ewkern.rmse(a, a, axis=2 ** 70)
    # NumPy's integers, alone or in a sequence, are axes as ints are (as NumPy takes them)
    for ax in (np.int64(1), (np.int32(-1),), [np.intp(1)]):
        np.testing.assert_array_equal(ewkern.rmse(a, a + 1, axis=ax), np.ones(4, np.float32))
        np.testing.assert_array_equal(ewkern.rmse_backward(np.ones(4, np.float32), a, a + 1,
                                                           np.ones(4, np.float32), axis=ax)[0], np.full_like(a, -1 / 8))
    with pytest.raises(ValueError, match="unknown variant"):
        ewkern.rmse(a, a, variant="fastest")
    if HAS_CUDA:
        g = ewkern.asarray(a, device="cuda:0")
        with pytest.raises(ValueError, match="device mismatch"):
            ewkern.rmse(g, g, out=np.empty(4, np.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_kernel_info_reports_registers():
    for v in ewkern.variants("rmse"):
        info = ewkern.kernel_info("rmse", v, "float32")
        assert info["num_regs"] > 0, v
