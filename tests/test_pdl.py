"""Programmatic dependent launch (PDL): the switch, and chains of dependent auto kernels that
must see each other's results whether PDL is on or off, queued directly or replayed from a
CUDA graph. A kernel that touched memory before its wait would read stale data here."""
import importlib.util
import math

import numpy as np
import pytest

import ewkern
from conftest import HAS_CUDA


def test_switch_returns_previous_and_restores():
    prev = ewkern.set_pdl(False)
    try:
        assert ewkern.pdl_enabled() is False
        assert ewkern.set_pdl(True) is False
        assert ewkern.pdl_enabled() is (True if ewkern.build_info().get("cuda") else False)
    finally:
        ewkern.set_pdl(prev)
    assert ewkern.set_pdl(prev) == prev


def _chain_ref(a, b, rounds):
    x = a.astype(np.float64)
    b64 = b.astype(np.float64)
    rm = []
    for _ in range(rounds):
        x = (x + b64) * 0.5 + 0.25
        rm.append(np.sqrt(np.mean((x - b64) ** 2)))
    return x, rm


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("n", [5, 4099, 3 << 20])
def test_dependent_chain(pdl, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    prev = ewkern.set_pdl(pdl)
    try:
        da, db = ewkern.asarray(a, device="cuda:0"), ewkern.asarray(b, device="cuda:0")
        x = ewkern.copy(da)
        rms = []
        for _ in range(12):
            ewkern.add(x, db, out=x)
            ewkern.mul_const(x, 0.5, out=x)
            ewkern.add_const(x, 0.25, out=x)
            rms.append(ewkern.rmse(x, db, axis=0))
        got = x.numpy()
        got_rm = [float(r.numpy()) for r in rms]
    finally:
        ewkern.set_pdl(prev)
    want, want_rm = _chain_ref(a, b, 12)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(got_rm, want_rm, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUDA and importlib.util.find_spec("torch")), reason="needs a CUDA GPU and torch")
@pytest.mark.parametrize("pdl", [True, False])
def test_dependent_chain_in_cuda_graph(pdl):
    """Captured into a torch CUDA graph (programmatic edges when PDL is on), replayed 3 times."""
    import torch
    n = (1 << 20) + 3
    g0 = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(n, device="cuda", generator=g0)
    b = torch.randn(n, device="cuda", generator=g0)
    x = torch.empty_like(a)
    r = torch.empty((), device="cuda")
    prev = ewkern.set_pdl(pdl)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ewkern.copy(a, out=x)   # warm-up outside capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                ewkern.copy(a, out=x)
                for _ in range(8):
                    ewkern.add(x, b, out=x)
                    ewkern.mul_const(x, 0.5, out=x)
                ewkern.rmse(x, b, axis=0, out=r)
        for _ in range(3):
            x.fill_(123.0)
            g.replay()
        torch.cuda.synchronize()
    finally:
        ewkern.set_pdl(prev)
    xr = a.double()
    for _ in range(8):
        xr = (xr + b.double()) * 0.5
    torch.testing.assert_close(x.double(), xr, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(r.double(), torch.sqrt(((xr - b.double()) ** 2).mean()), rtol=1e-5, atol=0)


def _programmatic_edges(graph_handle):
    """(programmatic, all) edge counts of a cudaGraph_t, read with the driver's cuGraphGetEdges_v2
    (an edge's type 1 is CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)."""
    import ctypes

    class EdgeData(ctypes.Structure):
        _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                    ("reserved", ctypes.c_ubyte * 5)]

    cu = ctypes.CDLL("libcuda.so.1")
    fn = cu.cuGraphGetEdges_v2
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    n = ctypes.c_size_t(0)
    assert fn(graph_handle, None, None, None, ctypes.byref(n)) == 0
    frm = (ctypes.c_void_p * n.value)()
    to = (ctypes.c_void_p * n.value)()
    data = (EdgeData * n.value)()
    assert fn(graph_handle, frm, to, data, ctypes.byref(n)) == 0
    return sum(1 for e in data if e.type == 1), n.value


def _kernel_names(graph_handle):
    """The mangled names of a cudaGraph_t's kernel nodes, read with the driver's cuGraphGetNodes,
    cuGraphNodeGetType, cuGraphKernelNodeGetParams_v2 and cuFuncGetName (cuKernelGetName where
    the node names a CUkernel only)."""
    import ctypes

    class KernelParams(ctypes.Structure):   # CUDA_KERNEL_NODE_PARAMS_v2
        _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                    ("shared_bytes", ctypes.c_uint), ("params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                    ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]

    cu = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_size_t(0)
    assert cu.cuGraphGetNodes(ctypes.c_void_p(graph_handle), None, ctypes.byref(n)) == 0
    nodes = (ctypes.c_void_p * n.value)()
    assert cu.cuGraphGetNodes(ctypes.c_void_p(graph_handle), nodes, ctypes.byref(n)) == 0
    names = []
    for node in nodes:
        kind = ctypes.c_int(-1)
        assert cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) == 0
        if kind.value != 0:   # CU_GRAPH_NODE_TYPE_KERNEL
            continue
        p = KernelParams()
        assert cu.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)) == 0
        name = ctypes.c_char_p()
        if p.func:
            assert cu.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(p.func)) == 0
        else:
            assert cu.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(p.kern)) == 0
        names.append(name.value.decode())
    return names


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUDA and importlib.util.find_spec("torch")), reason="needs a CUDA GPU and torch")
@pytest.mark.parametrize("pdl", [True, False])
def test_capture_asks_pdl_only_behind_ewkern_kernels(pdl):
    """In a captured graph an ewkern launch is a programmatic dependent only of a kernel ewkern
    launched: behind torch's kernels (which never trigger the early launch, so the edge would only
    cost) its edge is a plain one. Graph: mul (torch), add, add, mul (torch), exp, add, rmse, add,
    a user's ElementwiseKernel (ewkern's): programmatic edges add->add, exp->add, add->rmse,
    rmse->add, add->kernel with PDL on, none with it off (rmse per row of 64 x 1024 is one
    kernel); the results match torch's. The auto kernels launched without PDL (the two behind a
    torch kernel; all five with PDL off) are ew_fast's plain form, which does not wait."""
    import torch
    n = (1 << 16) + 5
    g0 = torch.Generator(device="cuda").manual_seed(7)
    a = torch.rand(n, device="cuda", generator=g0) + 0.5
    b = torch.rand(n, device="cuda", generator=g0) + 0.5
    x = torch.empty_like(a)
    y = torch.empty_like(a)
    r = torch.empty(64, device="cuda")
    rows = (64, 1024)
    fma = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x * y + 1", "pdl_fma")
    prev = ewkern.set_pdl(pdl)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ewkern.add(a, b, out=x)
            ewkern.rmse(x[:65536].view(rows), b[:65536].view(rows), axis=1, out=r)
            fma(x, b, x)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(g, stream=s):
                torch.mul(a, b, out=x)
                ewkern.add(x, b, out=x)
                ewkern.add(x, a, out=x)
                torch.mul(x, 0.25, out=y)
                ewkern.exp(y, out=y)
                ewkern.add(y, a, out=y)
                ewkern.rmse(y[:65536].view(rows), b[:65536].view(rows), axis=1, out=r)
                ewkern.add(y, b, out=y)
                fma(y, a, y)
            prog, edges = _programmatic_edges(g.raw_cuda_graph())
            names = _kernel_names(g.raw_cuda_graph())
            g.instantiate()
        g.replay()
        torch.cuda.synchronize()
    finally:
        ewkern.set_pdl(prev)
    assert edges == 8
    on = pdl and ewkern.pdl_enabled()
    assert prog == (5 if on else 0)
    auto = [k for k in names if "7ew_fastI" in k]
    plain = [k for k in auto if "Lb0EEEv" in k]   # ew_fast<..., WB false, PDL false>
    assert (len(auto), len(plain)) == (5, 2 if on else 5), names
    a64, b64 = a.double(), b.double()
    x64 = a64 * b64 + b64 + a64
    y64 = torch.exp(x64 * 0.25) + a64
    d = (y64 - b64)[:65536].view(rows)
    torch.testing.assert_close(r.double(), torch.sqrt((d ** 2).mean(dim=1)), rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), (y64 + b64) * a64 + 1, rtol=4e-6, atol=4e-6)
    torch.testing.assert_close(x.double(), x64, rtol=2e-6, atol=2e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUDA and importlib.util.find_spec("torch")), reason="needs a CUDA GPU and torch")
def test_capture_keeps_pdl_between_forward_and_autograds_backward():
    """autograd runs a backward on its own device thread: the backward kernel of ewkern.torch's exp
    must still be a programmatic dependent of the forward kernel (launched on the capturing
    thread), and the next step's forward of that backward, in a graph of two training steps."""
    import torch

    import ewkern.torch as ewt
    n = (1 << 16) + 3
    g0 = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(n, device="cuda", generator=g0).requires_grad_(True)
    g = torch.randn(n, device="cuda", generator=g0)
    prev = ewkern.set_pdl(True)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            (dx,) = torch.autograd.grad(ewt.exp(x), x, g)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(graph, stream=s):
                for _ in range(2):
                    (dx,) = torch.autograd.grad(ewt.exp(x), x, g)
            prog, edges = _programmatic_edges(graph.raw_cuda_graph())
            graph.instantiate()
        graph.replay()
        torch.cuda.synchronize()
    finally:
        ewkern.set_pdl(prev)
    assert edges == 3
    assert prog == (3 if ewkern.pdl_enabled() else 0)
    torch.testing.assert_close(dx.double(), g.double() * torch.exp(x.detach().double()), rtol=4e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUDA and importlib.util.find_spec("torch")), reason="needs a CUDA GPU and torch")
@pytest.mark.parametrize("pdl", [True, False])
def test_capture_backward_ops_take_the_plain_form_behind_torch(pdl):
    """A backward op's kernel (ew_fast_n) launched behind a torch kernel in a captured graph is the
    plain form (no wait, no prefetch), behind an ewkern kernel the PDL form: graph mul (torch),
    gelu_backward, mul_backward (both gradients), mul (torch), silu_backward; the gradients match
    float64 torch on a length with a tail and a misaligned start."""
    import torch
    n = (1 << 17) + 7
    g0 = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(n + 1, device="cuda", generator=g0)[1:]
    b = torch.randn(n + 1, device="cuda", generator=g0)[1:]
    g = torch.randn(n + 1, device="cuda", generator=g0)[1:]
    x, da, db, gs = (torch.empty(n + 1, device="cuda")[1:] for _ in range(4))
    prev = ewkern.set_pdl(pdl)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ewkern.gelu_backward(g, a, out=x)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(graph, stream=s):
                torch.mul(g, 0.5, out=x)
                ewkern.gelu_backward(x, a, out=x)
                ewkern.mul_backward(x, a, b, out=(da, db))
                torch.mul(db, 2.0, out=gs)
                ewkern.silu_backward(gs, b, out=gs)
            names = _kernel_names(graph.raw_cuda_graph())
            graph.instantiate()
        graph.replay()
        torch.cuda.synchronize()
    finally:
        ewkern.set_pdl(prev)
    grads = [k for k in names if "9ew_fast_nI" in k]
    plain = [k for k in grads if "Lb0EEEv" in k]
    on = pdl and ewkern.pdl_enabled()
    assert (len(grads), len(plain)) == (3, 2 if on else 3), names
    a64, b64, g64 = a.double(), b.double(), g.double()
    phi = torch.exp(-a64 ** 2 / 2) / math.sqrt(2 * math.pi)
    x64 = 0.5 * g64 * (0.5 * (1 + torch.special.erf(a64 / math.sqrt(2))) + a64 * phi)
    sb = torch.sigmoid(b64)
    gs64 = 2 * x64 * a64 * sb * (1 + b64 * (1 - sb))
    torch.testing.assert_close(x.double(), x64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(da.double(), x64 * b64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db.double(), x64 * a64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gs.double(), gs64, rtol=1e-5, atol=1e-6)
