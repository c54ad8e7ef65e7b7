"""A second GPU: ewkern, torch and CuPy arrays on cuda:1 (whatever the frameworks' current device),
streams and out= on cuda:1, rmse and bfloat16 there, alternating devices, the mixed-device error,
every kind of call leaving the caller's current device as it was, and the benchmark on
--device cuda:1. Marked multigpu; skipped below two GPUs."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ewkern
from reference import assert_close, np_dtype, random_input, reference, rmse_reference
from test_elementwise import ULPS

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_CUPY = importlib.util.find_spec("cupy") is not None
NGPU = ewkern.device_count() if ewkern.cuda_available() else 0

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu,
              pytest.mark.skipif(NGPU < 2, reason="needs two CUDA GPUs (%d present)" % NGPU)]
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
needs_cupy = pytest.mark.skipif(not HAS_CUPY, reason="needs CuPy")

# (op, inputs, scalars): exact ops, rounded ones and transcendental ones, at their stated accuracy
OPS = [("add", 2, ()), ("mul", 2, ()), ("mul_const", 1, (-0.375,)), ("exp", 1, ()), ("erf", 1, ()),
       ("neg", 1, ()), ("copy", 1, ())]
DTYPES = ["float32", "float16", "bfloat16", "float64"]
N = (1 << 16) + 3   # odd tail


def inputs(op, dtype, k, seed=1):
    rng = np.random.default_rng(seed)
    return [random_input(rng, (N,), dtype, op) for _ in range(k)]


def call(op, arrays, scalars, **kw):
    return getattr(ewkern, op)(*arrays, *scalars, **kw)


def current_devices():
    """The calling thread's current CUDA device as the CUDA runtime has it (the one every library
    in the process shares), and as torch and CuPy report it where they are installed."""
    seen = {"runtime": ewkern._C._current_device()}
    if HAS_TORCH:
        import torch
        seen["torch"] = torch.cuda.current_device()
    if HAS_CUPY:
        import cupy
        seen["cupy"] = cupy.cuda.runtime.getDevice()
    return seen


def select_device(d):
    """Make d the current device the way a program does: with torch, else CuPy (ewkern has no
    setter: it never changes the current device for longer than a call)."""
    if HAS_TORCH:
        import torch
        torch.cuda.set_device(d)
    elif HAS_CUPY:
        import cupy
        cupy.cuda.runtime.setDevice(d)
    else:
        pytest.skip("needs torch or CuPy to select the current device")


def with_contexts():
    """Both devices get their CUDA context now, so that torch's own guards really switch back (torch
    leaves the device switched when the one to return to has no context yet)."""
    ewkern.synchronize("cuda:0")
    ewkern.synchronize("cuda:1")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op, k, scalars", OPS)
def test_ewkern_arrays_on_cuda1(op, k, scalars, dtype):
    xs = inputs(op, dtype, k)
    ds = [ewkern.asarray(x, device="cuda:1") for x in xs]
    assert all(d.device == "cuda:1" for d in ds)
    r = call(op, ds, scalars)
    assert isinstance(r, ewkern.Array) and r.device == "cuda:1" and r.dtype == dtype
    assert_close(r.numpy(), reference(op, *xs, scalars=scalars), dtype, ulps=ULPS[op], what=f"{op} {dtype} cuda:1")


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_on_cuda1(dtype):
    a, b = inputs("add", dtype, 2)
    da, db = ewkern.asarray(a, device="cuda:1"), ewkern.asarray(b, device="cuda:1")
    out = ewkern.zeros((N,), dtype=dtype, device="cuda:1")
    assert ewkern.add(da, db, out=out) is out
    assert_close(out.numpy(), reference("add", a, b), dtype, ulps=ULPS["add"], what="out= on cuda:1")
    ref = reference("mul_const", a, scalars=(2.0,))
    ewkern.mul_const(da, 2.0, out=da)            # in place on cuda:1
    assert_close(da.numpy(), ref, dtype, ulps=ULPS["mul_const"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("shape, axis", [((16, 4099), None), ((4099, 16), 0), ((3, 65536), 1)])
def test_rmse_on_cuda1(dtype, shape, axis):
    rng = np.random.default_rng(7)
    a, b = (random_input(rng, shape, dtype) for _ in range(2))
    r = ewkern.rmse(ewkern.asarray(a, device="cuda:1"), ewkern.asarray(b, device="cuda:1"), axis=axis)
    assert r.device == "cuda:1" and r.dtype == ("float64" if dtype == "float64" else "float32")
    ref = rmse_reference(a, b, 1 if axis is None else axis)
    np.testing.assert_allclose(r.numpy(), ref, rtol=1e-5 if dtype != "float64" else 1e-12)


def test_alternating_devices():
    rng = np.random.default_rng(3)
    ref_dev = {0: "cuda:0", 1: "cuda:1"}
    for i in range(40):
        d = i % 2
        x = rng.standard_normal(1000 + i).astype(np.float32)
        a = ewkern.asarray(x, device=ref_dev[d])
        r = ewkern.exp(ewkern.add(a, a))
        assert r.device == ref_dev[d]
        assert_close(r.numpy(), np.exp(2 * x.astype(np.float64)), "float32", ulps=ULPS["exp"], what=f"round {i}")
    # arrays made on one device stay usable after work on the other
    a0 = ewkern.full((N,), 1.0, device="cuda:0")
    a1 = ewkern.full((N,), 2.0, device="cuda:1")
    for _ in range(5):
        a0 = ewkern.add(a0, a0)
        a1 = ewkern.add(a1, a1)
    assert a0.numpy()[-1] == 32.0 and a1.numpy()[-1] == 64.0


def test_mixed_devices_are_a_value_error_and_write_nothing():
    a0 = ewkern.full((8,), 1.0, device="cuda:0")
    a1 = ewkern.full((8,), 2.0, device="cuda:1")
    with pytest.raises(ValueError, match="device mismatch: a is on cuda:0 but b is on cuda:1"):
        ewkern.add(a0, a1)
    out1 = ewkern.full((8,), 5.0, device="cuda:1")
    with pytest.raises(ValueError, match="device mismatch: a is on cuda:0 but out is on cuda:1"):
        ewkern.copy(a0, out=out1)
    with pytest.raises(ValueError, match="device mismatch"):
        ewkern.rmse(a0, a1)
    assert out1.numpy().tolist() == [5.0] * 8
    assert a0.numpy().tolist() == [1.0] * 8 and a1.numpy().tolist() == [2.0] * 8


def test_ewkern_stream_on_cuda1():
    s = ewkern.Stream(device="cuda:1")
    assert s.device == "cuda:1"
    x = ewkern.asarray(np.arange(N, dtype=np.float32), device="cuda:1")
    ewkern.synchronize("cuda:1")
    with ewkern.stream(s):
        y = ewkern.mul_const(x, 3.0)
        z = ewkern.add(y, x)                         # ordered after y on s
        assert y.device == "cuda:1"
    s.synchronize()
    assert_close(z.numpy(), 4.0 * np.arange(N, dtype=np.float64), "float32", ulps=ULPS["add"])
    # a stream of cuda:1 does not capture work on cuda:0 (that runs on cuda:0's default stream)
    w = ewkern.full((N,), 1.0, device="cuda:0")
    with ewkern.stream(s):
        v = ewkern.add(w, w)
    assert v.device == "cuda:0" and v.numpy()[-1] == 2.0


def device_check(current):
    """check(what): torch's and the runtime's current device are still `current` after `what`."""
    import torch

    def check(what):
        assert torch.cuda.current_device() == current, "%s left torch's current device switched" % what
        assert ewkern._C._current_device() == current, "%s left the runtime's current device switched" % what
    return check


@needs_torch
@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_on_cuda1(current, dtype):
    import torch
    tdt = getattr(torch, dtype)
    with_contexts()
    torch.cuda.set_device(current)

    unchanged = device_check(current)
    try:
        a = torch.randn(N, device="cuda:1", dtype=torch.float64).to(tdt)
        b = torch.randn(N, device="cuda:1", dtype=torch.float64).to(tdt)
        unchanged("torch")    # the premise: torch's own work on cuda:1 switches back
        r = ewkern.add(a, b)
        unchanged("ewkern.add")
        assert isinstance(r, torch.Tensor) and r.device == torch.device("cuda:1") and r.dtype == tdt
        an, bn = (t.double().cpu().numpy().astype(np_dtype(dtype)) for t in (a, b))
        assert_close(r.double().cpu().numpy(), reference("add", an, bn), dtype, ulps=ULPS["add"])
        out = torch.empty_like(a)
        assert ewkern.erf(a, out=out) is out
        unchanged("ewkern.erf(out=)")
        assert_close(out.double().cpu().numpy(), reference("erf", an), dtype, ulps=ULPS["erf"], what="torch erf")
        m = N - N % 16
        rm = ewkern.rmse(a[:m].view(16, -1), b[:m].view(16, -1))
        unchanged("ewkern.rmse")
        assert rm.device == torch.device("cuda:1")
        ref = rmse_reference(an[:m].reshape(16, -1), bn[:m].reshape(16, -1), 1)
        np.testing.assert_allclose(rm.double().cpu().numpy(), ref, rtol=1e-5 if dtype != "float64" else 1e-12)
        plan = ewkern._C.prepare(ewkern.mul_const, a, 2.0, out=out)
        unchanged("ewkern._C.prepare")
        plan()
        unchanged("a Plan")
        torch.cuda.synchronize(1)
        assert torch.equal(out, a * 2)
        e = ewkern.from_dlpack(a)
        unchanged("ewkern.from_dlpack")
        assert torch.equal(torch.from_dlpack(e), a)
        unchanged("torch.from_dlpack(an ewkern.Array)")
        del e
        unchanged("freeing an ewkern.Array")
    finally:
        torch.cuda.set_device(0)


@pytest.mark.parametrize("current, target", [(0, 1), (1, 0)])
def test_calls_leave_the_current_device_alone(current, target):
    """Every kind of ewkern call on the other device, including the ones that fail after they
    switched: the caller's current device is the same after each (ewkern switches for its own
    work only, and switches back on every path)."""
    dev = "cuda:%d" % target
    other = "cuda:%d" % current
    with_contexts()
    select_device(current)
    try:
        before = current_devices()
        assert before["runtime"] == current        # else the test would prove nothing
        x = np.arange(4096, dtype=np.float32)
        a = ewkern.asarray(x, device=dev)
        b = ewkern.full((4096,), 2.0, device=dev)
        o = ewkern.empty((4096,), device=dev)
        a2 = ewkern.asarray(x.reshape(16, -1), device=dev)
        s = ewkern.Stream(device=dev)
        plan = ewkern._C.prepare(ewkern.add, a, b, out=o)
        flush = ewkern.empty((1 << 20,), device=dev)
        calls = [
            ("empty", lambda: ewkern.empty((8,), device=dev)),
            ("zeros", lambda: ewkern.zeros((8,), device=dev)),
            ("full", lambda: ewkern.full((8,), 1.5, device=dev)),
            ("asarray from numpy", lambda: ewkern.asarray(x, device=dev)),
            ("asarray to the cpu", lambda: ewkern.asarray(a, device="cpu")),
            ("asarray with a dtype", lambda: ewkern.asarray(a, dtype="float64")),
            ("asarray from the other device", lambda: ewkern.asarray(ewkern.full((8,), 1.0, device=other),
                                                                     device=dev)),
            ("from_dlpack", lambda: ewkern.from_dlpack(a)),
            ("Array.numpy", lambda: a.numpy()),
            ("numpy.asarray", lambda: np.asarray(a)),
            ("add", lambda: ewkern.add(a, b)),
            ("add out=", lambda: ewkern.add(a, b, out=o)),
            ("exp", lambda: ewkern.exp(a)),
            ("axpby", lambda: ewkern.axpby(a, b, 2.0, 3.0)),
            ("fill", lambda: ewkern.fill(o, 3.0)),
            ("rmse", lambda: ewkern.rmse(a2, a2)),
            ("rmse out=", lambda: ewkern.rmse(a2, a2, out=ewkern.empty((16,), device=dev))),
            ("Stream", lambda: ewkern.Stream(device=dev)),
            ("Stream.synchronize", lambda: s.synchronize()),
            ("an op in a stream block", lambda: _in_stream(s, lambda: ewkern.add(a, b))),
            ("synchronize", lambda: ewkern.synchronize(dev)),
            ("device_info", lambda: ewkern.device_info(dev)),
            ("kernel_info", lambda: ewkern.kernel_info("add")),
            ("prepare", lambda: ewkern._C.prepare(ewkern.mul, a, b)),
            ("a Plan", lambda: plan()),
            ("time_plans", lambda: ewkern._C.time_plans([plan], samples=2, warmup=1)),
            ("time_plans graph flush=", lambda: ewkern._C.time_plans([plan], launches=4, samples=2, flush=flush)),
            ("__dlpack__", lambda: a.__dlpack__(stream=s.handle)),
            ("__dlpack__ versioned", lambda: a.__dlpack__(stream=s.handle, max_version=(1, 0))),
            ("__dlpack__ in a stream block", lambda: _in_stream(s, lambda: a.__dlpack__(stream=1))),
            ("__dlpack__ to the cpu", lambda: a.__dlpack__(dl_device=(1, 0), copy=True)),
        ]
        failing = [
            ("empty out of memory", MemoryError, lambda: ewkern.empty((1 << 42,), device=dev)),
            ("full with a bad value", TypeError, lambda: ewkern.full((8,), "x", device=dev)),
            ("rmse out= of a wrong shape", ValueError,
             lambda: ewkern.rmse(a2, a2, out=ewkern.empty((3,), device=dev))),
            ("ops on both devices", ValueError, lambda: ewkern.add(a, ewkern.empty((4096,), device=other))),
        ]
        moved = []
        for what, fn in calls:
            fn()    # the result is dropped at once: freeing it (an Array, a Stream) is checked too
            if current_devices() != before:
                moved.append("%s -> %s" % (what, current_devices()))
                select_device(current)
        for what, exc, fn in failing:
            with pytest.raises(exc):
                fn()
            if current_devices() != before:
                moved.append("%s (raising) -> %s" % (what, current_devices()))
                select_device(current)
        assert not moved, "calls on %s that left the current device switched (was %s): %s" % (dev, before, moved)
    finally:
        select_device(0)


def _in_stream(s, fn):
    with ewkern.stream(s):
        return fn()


@needs_torch
def test_torch_stream_on_cuda1():
    import torch
    with torch.cuda.device(1):
        s = torch.cuda.Stream()
        x = torch.randn(1 << 22, device="cuda:1")
        torch.cuda.synchronize(1)
        with torch.cuda.stream(s):
            y = ewkern.mul_const(x, 2.0)              # on torch's current stream of cuda:1
            z = y + 1                                  # ordered after ewkern's kernel on s
        s.synchronize()
    assert z.device == torch.device("cuda:1")
    assert torch.equal(z, x * 2 + 1)


@needs_torch
def test_torch_mixed_devices_value_error():
    import torch
    a = torch.ones(8, device="cuda:0")
    b = torch.ones(8, device="cuda:1")
    with pytest.raises(ValueError, match="device mismatch: a is on cuda:0 but b is on cuda:1"):
        ewkern.add(a, b)
    out = torch.full((8,), 5.0, device="cuda:1")
    with pytest.raises(ValueError, match="device mismatch"):
        ewkern.add(a, a, out=out)
    assert torch.equal(out, torch.full((8,), 5.0, device="cuda:1"))


@needs_cupy
@pytest.mark.parametrize("current", [0, 1])
def test_cupy_on_cuda1(current):
    import cupy
    with cupy.cuda.Device(1):
        a = cupy.random.standard_normal(N, dtype=cupy.float32)
        b = cupy.random.standard_normal(N, dtype=cupy.float32)
    with cupy.cuda.Device(current):
        r = ewkern.add(a, b)
        out = ewkern.empty((N,), device="cuda:1")
        ewkern.exp(a, out=out)
        assert cupy.cuda.runtime.getDevice() == current     # ewkern leaves CuPy's device alone
    assert isinstance(r, ewkern.Array) and r.device == "cuda:1"
    an, bn = cupy.asnumpy(a), cupy.asnumpy(b)
    assert_close(r.numpy(), reference("add", an, bn), "float32", ulps=ULPS["add"])
    assert_close(out.numpy(), reference("exp", an), "float32", ulps=ULPS["exp"])
    v = cupy.from_dlpack(r)                            # and back, zero-copy, on device 1
    assert v.device.id == 1 and v.data.ptr == r.data_ptr


def test_bench_peers_on_cuda1(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(ewkern.__file__)))
    out = tmp_path / "out"
    args = ["peers", "--device", "cuda:1", "--quick", "--samples", "3", "--min-sample-ms", "0.05",
            "--no-progress", "--no-plots", "--out", str(out), "--peers-sizes", "1MiB", "--peers-ops", "copy,add",
            "--peers-dtypes", "float32", "--peers-rmse-shapes", "16x1024", "--peers-ref-size", "4MiB"]
    p = subprocess.run([sys.executable, "-m", "ewkern.bench", *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=root), cwd=root)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["device"] == "cuda:1" and res["device_info"]["device"] == "cuda:1"
    assert (out / "peers.csv").exists() and len((out / "peers.csv").read_text().splitlines()) > 1


@needs_torch
@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_backward_training_and_user_kernels_on_cuda1(current, dtype):
    """The backward kernels (one- and two-gradient, rmse_backward), an ewkern.torch training step and
    a run-time compiled kernel on cuda:1, with torch's current device 0 and 1: results on cuda:1,
    right values, and the caller's current device left as it was."""
    import torch
    import ewkern.torch as ewt
    from reference import grad_reference, rmse_grad_reference
    tdt = getattr(torch, dtype)
    with_contexts()
    torch.cuda.set_device(current)

    unchanged = device_check(current)
    try:
        g, a, b = (torch.randn(N, device="cuda:1", dtype=torch.float64).to(tdt) for _ in range(3))
        gn, an, bn = (t.double().cpu().numpy().astype(np_dtype(dtype)) for t in (g, a, b))
        r = ewkern.gelu_backward(g, a)
        unchanged("ewkern.gelu_backward")
        assert r.device == torch.device("cuda:1")
        (want,) = grad_reference("gelu_backward", gn, an)
        scale = np.abs(gn.astype(np.float64)) * 2.0
        assert np.all(np.abs(r.double().cpu().numpy() - want) <= 1e-2 * scale + 1e-30), "gelu_backward on cuda:1"
        ga, gb = ewkern.mul_backward(g, a, b)
        unchanged("ewkern.mul_backward")
        wa, wb = grad_reference("mul_backward", gn, an, bn)
        assert_close(ga.double().cpu().numpy(), wa, dtype, ulps=1, what="mul_backward a")
        assert_close(gb.double().cpu().numpy(), wb, dtype, ulps=1, what="mul_backward b")
        m = N - N % 16
        x, y = a[:m].view(16, -1), b[:m].view(16, -1)
        rr = ewkern.rmse(x, y)
        gr = torch.randn_like(rr)
        ra, rb = ewkern.rmse_backward(gr, x, y, rr)
        unchanged("ewkern.rmse_backward")
        wa, wb = rmse_grad_reference(gr.cpu().numpy(), an[:m].reshape(16, -1), bn[:m].reshape(16, -1),
                                     rr.cpu().numpy(), (1,))
        assert_close(ra.double().cpu().numpy(), wa, dtype, ulps=2, what="rmse_backward a")
        # a training step through ewkern.torch
        w = a.detach().clone().requires_grad_()
        loss = ewt.rmse(ewt.gelu(w[:m]).view(16, -1), y).mean()
        (gw,) = torch.autograd.grad(loss, (w,))
        unchanged("an ewkern.torch training step")
        w2 = a.detach().clone().double().requires_grad_()
        loss2 = torch.sqrt(((torch.nn.functional.gelu(w2[:m]).view(16, -1) - y.double()) ** 2).mean(1)).mean()
        (gw2,) = torch.autograd.grad(loss2, (w2,))
        tol = 1e-9 if dtype == "float64" else 5e-2
        torch.testing.assert_close(gw.double(), gw2, rtol=tol, atol=tol * gw2.abs().max().item())
        # a run-time compiled kernel
        k = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x * y + x", "fma_like")
        z = k(a, b)
        unchanged("ewkern.ElementwiseKernel")
        assert z.device == torch.device("cuda:1")
        torch.testing.assert_close(z.double(), (a.double() * b.double() + a.double()), rtol=1e-2, atol=1e-2)
    finally:
        torch.cuda.set_device(0)
