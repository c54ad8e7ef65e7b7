"""Warm calls of run-time kernels through the C module's _rtc_fast (csrc/rtc.c), the C twin of
ewkern/rtc/_kernel.py's _fast_call: it must run exactly the calls it can (the same results as
the full path, fresh results, given outputs returned) and miss, without an exception, every call
it cannot decide, which then takes the Python path; an error of the launch itself propagates."""
import struct

import numpy as np
import pytest

import ewkern
from conftest import gpu
from ewkern import _C
from ewkern.rtc import _kernel

try:
    import torch
except ImportError:   # pragma: no cover - torch is a test dependency
    torch = None

SC = _kernel._SCALARS


def c_only(kern):
    """Leave kern only its C plans: a warm call the C path misses then takes the full path."""
    kern._plans.clear()
    kern._plans["no signature matches this"] = None


def test_elementwise_warm_calls_run_in_c(full_calls):
    k = ewkern.ElementwiseKernel("T x, T y, float32 s, float64 d", "T z", "z = x * s + y * d", "cfast_fma")
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(1001).astype(np.float32) for _ in range(2))
    k(x, y, 2.0, 3.0)
    out = np.empty(1001, np.float32)
    k(x, y, 2.0, 3.0, out)
    assert len(k._cplans) == 2 and full_calls[0] == 2
    c_only(k)
    for s, d in ((0.5, -1.0), (3, 7), (True, 0.25)):
        x, y = (rng.standard_normal(1001).astype(np.float32) for _ in range(2))
        want = (x.astype(np.float64) * np.float32(s) + y.astype(np.float64) * float(d)).astype(np.float32)
        z = k(x, y, s, d)
        np.testing.assert_allclose(z, want, rtol=1e-6, atol=1e-6)
        assert k(x, y, s, d, out) is out
        np.testing.assert_array_equal(out, z)
        assert not np.shares_memory(z, out)
    assert full_calls[0] == 2


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_torch_tensors_results_and_tuple_outputs(full_calls):
    k = ewkern.ElementwiseKernel("T x", "T p, T q", "p = x + 1; q = x * 2", "cfast_two")
    x = torch.randn(64)
    k(x)
    c_only(k)
    x = torch.randn(64)
    p, q = k(x)
    assert isinstance(p, torch.Tensor) and isinstance(q, torch.Tensor)
    torch.testing.assert_close(p, x + 1)
    torch.testing.assert_close(q, x * 2)
    pg, qg = torch.empty(64), torch.empty(64)
    k(x, pg, qg)    # another signature: the full path, then its own plan
    n = full_calls[0]
    x = torch.randn(64)
    r = k(x, pg, qg)
    assert r[0] is pg and r[1] is qg and full_calls[0] == n
    torch.testing.assert_close(qg, x * 2)


def test_reduction_and_row_kernel_warm_calls_run_in_c(full_calls):
    red = ewkern.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "cfast_norm")
    row = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                           "y = x * rsqrt(a / _row_size + eps) * w", "0", "cfast_rms")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 40))
    w = rng.standard_normal(40)
    red(x, axis=1)
    red(x, axis=0, keepdims=True)
    row(x, w, 1e-5)
    c_only(red)
    c_only(row)
    n = full_calls[0]
    for _ in range(2):
        x = rng.standard_normal((6, 40))
        np.testing.assert_allclose(red(x, axis=1), np.sqrt((x * x).sum(1)), rtol=1e-12)
        np.testing.assert_allclose(red(x, axis=0, keepdims=True), np.sqrt((x * x).sum(0, keepdims=True)), rtol=1e-12)
        eps = float(rng.uniform(0.1, 1))
        want = x / np.sqrt((x * x).mean(1, keepdims=True) + np.float32(eps)) * w
        np.testing.assert_allclose(row(x, w, eps), want, rtol=1e-12)
    assert full_calls[0] == n
    red(x, axis=(0, 1))   # another (axis, keepdims): the full path
    assert full_calls[0] == n + 1


def test_calls_c_cannot_decide_take_the_python_path(full_calls):
    """NumPy scalars, integers past 2^53 and float16 scalar parameters are converted by Python's
    rule (_scalar_value); the results are the same as the full path's."""
    k = ewkern.ElementwiseKernel("T x, float32 s", "T z", "z = x * s", "cfast_scalars")
    x = np.arange(1.0, 9.0, dtype=np.float32)
    k(x, 2.0)
    big = 2 ** 60 + 2 ** 36 + 1     # two roundings (to double, then float) would differ from NumPy's one
    assert np.float32(np.float64(big)) != np.array(big).astype(np.float32)
    key, plan = next(iter(k._cplans.items()))
    assert _C._rtc_fast(k._cplans, (x, np.float32(3.0)), 1, None, SC) is NotImplemented
    assert _C._rtc_fast(k._cplans, (x, big), 1, None, SC) is NotImplemented
    np.testing.assert_array_equal(k(x, np.float32(3.0)), x * np.float32(3.0))
    np.testing.assert_array_equal(k(x, big), x * np.array(big).astype(np.float32))
    assert full_calls[0] == 1     # both ran by the Python plan
    h = ewkern.ElementwiseKernel("T x, float16 s", "T z", "z = x * s", "cfast_half")
    h(x, 0.1)
    assert not h._cplans and len(h._plans) == 1
    np.testing.assert_array_equal(h(x, 0.1), x * np.float32(np.float16(0.1)))


def test_given_outputs_c_must_not_run():
    """An output overlapping an input other than as itself, or a read-only one, is a miss in C
    (the full path copies the input, or raises)."""
    k = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "cfast_overlap")
    buf = np.zeros(1004)
    b = np.ones(1000)
    k(buf[:1000], b, np.zeros(1000))
    assert len(k._cplans) == 1
    assert _C._rtc_fast(k._cplans, (buf[:1000], b, buf[2:1002]), 2, None, SC) is NotImplemented
    ro = np.zeros(1000)
    ro.setflags(write=False)
    assert _C._rtc_fast(k._cplans, (buf[:1000], b, ro), 2, None, SC) is NotImplemented
    x = np.arange(1000.0)
    assert _C._rtc_fast(k._cplans, (x, b, x), 2, None, SC) is x    # in place: the very same view
    np.testing.assert_array_equal(x, np.arange(1000.0) * 2 + 1)
    assert _C._rtc_fast(k._cplans, (x[:999], b[:999], np.zeros(999)), 2, None, SC) is NotImplemented
    assert not ro.any()


def test_signatures():
    sig = lambda *a: _C._rtc_sig(a, SC)
    x = np.zeros(16, np.float32)
    assert sig(x, 1.0) == sig(np.ones(16, np.float32), 2.5) == sig(x, 3)
    assert len({sig(x, 1.0), sig(1.0, x), sig(x, x), sig(x[4:8], 1.0), sig(x[1:5], 1.0),
                sig(x.astype(np.float64), 1.0), sig(x.reshape(4, 4), 1.0)}) == 7
    assert sig(x[4:8], 1.0) == sig(x[8:12], 1.0)        # the same offset within 16 bytes
    assert sig(x, [1, 2]) is None and sig(x[::2]) is None   # not viewable C-contiguous
    assert sig(x, np.float32(1)) == sig(x, 1.0)          # a NumPy scalar is a scalar


def test_errors_of_the_run_propagate():
    k = ewkern.ElementwiseKernel("T x", "T z", "z = x + 1", "cfast_error")
    x = np.arange(4.0)
    k(x)
    (key, plan), = k._cplans.items()

    def boom(buf, stream):
        raise RuntimeError("the launch failed")
    k._cplans[key] = plan[:4] + (boom,) + plan[5:]
    with pytest.raises(RuntimeError, match="the launch failed"):
        k(x)
    with pytest.raises(TypeError):
        _C._rtc_fast(k._cplans, (x,), 1, None)


def _prog(plan):
    """A C plan's launches as int64 words (csrc/rtc.h, ew_rtc_run)."""
    return struct.unpack(f"<{len(plan[4]) // 8}q", plan[4])


def test_cpu_plans_call_the_kernel_address_from_c(full_calls):
    """A CPU kernel's C plan holds its launch as data (EW_PROG_CPU: the compiled function's
    address, threads), which _rtc_fast calls itself without the GIL (no ctypes call): one thread
    below CPU_PAR_MIN_ELEMENTWISE elements, every core from it; the same results as the full path
    on both sides of that size, every warm call in C, and a program without an address, with an
    unknown record or cut short fails with an error naming it, not a crash."""
    k = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x * y + 1", "cfast_direct")
    rng = np.random.default_rng(5)
    floor = _kernel.CPU_PAR_MIN_ELEMENTWISE
    for n in (7, floor - 1, floor, floor + 9):
        x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        want = k(x, y)
        run = [_prog(p) for p in k._cplans.values()]
        assert run and all(len(r) == 3 and r[0] == _kernel._PROG_CPU and r[1] for r in run)
        threads = {r[2] for r in run}
        assert threads <= {1, _kernel._threads(n, floor)}
        calls = full_calls[0]
        for _ in range(3):
            x2, y2 = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
            np.testing.assert_array_equal(k(x2, y2), (x2 * y2 + np.float32(1)).astype(np.float32))
        assert full_calls[0] == calls
        np.testing.assert_array_equal(want, (x * y + np.float32(1)).astype(np.float32))
    assert _kernel._threads(floor - 1, floor) == 1
    (key, plan), *_ = k._cplans.items()
    k._plans.clear()
    args = (np.zeros(7, np.float32), np.zeros(7, np.float32))
    for words, match in (((_kernel._PROG_CPU, 0, 1), "without a kernel address"),
                         ((9, 1, 2), "malformed launch record at word 0"),
                         ((_kernel._PROG_CPU, plan_addr := _prog(plan)[1]), "malformed launch record at word 0"),
                         ((_kernel._PROG_CPU, plan_addr, 1, 7), "malformed launch record at word 3"),
                         # a capped launch's record (14 words) cut short; one whose shared memory is
                         # negative (refused before any launch, or by a build without CUDA)
                         ((_kernel._PROG_LAUNCH_CAP, 0, 256, 1, 0, 1, 1, 0, 1, -1, -1, 0), "malformed launch record at word 0"),
                         ((_kernel._PROG_LAUNCH_CAP, 0, 256, 1, 0, 1, 1, 0, 1, -1, -1, 0, -5, -5),
                          "smem -5|a build without")):
        k._cplans.clear()
        k._cplans[key] = plan[:4] + (struct.pack(f"<{len(words)}q", *words),) + plan[5:]
        with pytest.raises(RuntimeError, match=match):
            _C._rtc_fast(k._cplans, args, 2, None, SC)


def test_hidden_outputs_are_allocated_and_not_returned():
    """A plan's hidden outputs (a column sum's partial rows): allocated after the results like the
    first array, their addresses written where the plan's slots say (with bytes added), not
    returned; a hidden count past the outputs is a miss."""
    x = np.arange(8, dtype=np.float32) + 0.5
    seen = []
    # slots (offset, argument, bytes added): x; the result (argument n + 0); the hidden array twice
    pslots = struct.pack("<12q", 0, 0, 0, 8, 1, 0, 16, 2, 0, 24, 2, 4)
    outs = (("float32", (8,)), ("float32", (3, 8)))
    plan = (bytes(32), pslots, b"", outs, lambda buf, stream: seen.append(bytes(buf)), 1, 1)
    key = (_C._rtc_sig((x,), SC), None)
    r = _C._rtc_fast({key: plan}, (x,), 1, None, SC)
    assert isinstance(r, np.ndarray) and r.shape == (8,) and r.dtype == np.float32
    px, pr, ph, ph4 = struct.unpack("<4Q", seen[-1])
    assert (px, pr) == (x.ctypes.data, r.ctypes.data) and ph not in (px, pr) and ph4 == ph + 4
    r2 = _C._rtc_fast({key: plan[:5] + (2, 1)}, (x,), 1, None, SC)   # every result: the one shown
    assert isinstance(r2, tuple) and len(r2) == 1 and r2[0].shape == (8,)
    assert _C._rtc_fast({key: plan[:6] + (3,)}, (x,), 1, None, SC) is NotImplemented
    assert _C._rtc_fast({key: plan[:6] + (-1,)}, (x,), 1, None, SC) is NotImplemented


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_gpu_warm_calls_run_in_c_on_the_callers_stream(full_calls):
    """On CUDA the C path views torch tensors on the current stream, allocates results there
    (torch's, on that device) and launches there; CuPy arrays get ewkern arrays, as on the full path."""
    k = ewkern.ElementwiseKernel("T x, float32 s", "T z", "z = x * s + 1", "cfast_gpu")
    x = torch.randn(100003, device="cuda")
    k(x, 2.0)
    c_only(k)
    side = torch.cuda.Stream()
    for rep in range(3):
        x = torch.randn(100003, device="cuda")
        side.wait_stream(torch.cuda.current_stream())   # x is written on the default stream
        with torch.cuda.stream(side):
            z = k(x, 0.5 + rep)
            side.synchronize()
        assert isinstance(z, torch.Tensor) and z.device == x.device
        torch.testing.assert_close(z, x * (0.5 + rep) + 1)
    assert full_calls[0] == 1
    cupy = pytest.importorskip("cupy")
    xc = cupy.random.standard_normal(4099).astype(cupy.float32)
    first = k(xc, 2.0)
    n = full_calls[0]
    xc = cupy.random.standard_normal(4099).astype(cupy.float32)
    zc = k(xc, 3.0)
    # results follow NumPy and torch; other producers (CuPy has no DLPack exchange API) get an
    # ewkern.Array on the same device, on either path
    assert type(zc) is type(first) is ewkern.Array and full_calls[0] == n
    assert zc.device == "cuda:%d" % xc.device.id
    # the kernel contracts x * s + 1 to one FMA, CuPy rounds twice
    cupy.testing.assert_allclose(cupy.from_dlpack(zc), xc * 3 + 1, rtol=1e-6, atol=1e-6)
