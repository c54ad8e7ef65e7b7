"""Programmatic dependent launch (PDL): the switch, and chains of dependent auto kernels that
must see each other's results whether PDL is on or off, queued directly or replayed from a
CUDA graph. A kernel that touched memory before its wait would read stale data here."""
import importlib.util

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
