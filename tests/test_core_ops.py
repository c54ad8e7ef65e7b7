"""copy and add, the foundation's two ops, on both backends: every dtype, awkward sizes,
2-D/3-D shapes, out= given or not, and inputs from each framework."""
import importlib.util

import numpy as np
import pytest

import ewkern
from conftest import device_params
from reference import DTYPES, assert_close, random_input, reference

SIZES = [0, 1, 7, 1023, 2**20 + 3]
SHAPES = [(3, 5), (2, 3, 7), (1, 1, 1)]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(n,) for n in SIZES] + SHAPES)
def test_copy_add(device, dtype, shape):
    rng = np.random.default_rng(sum(shape) + len(dtype))
    x = random_input(rng, shape, dtype)
    y = random_input(rng, shape, dtype)
    want = reference("add", x, y)
    a, b = ewkern.asarray(x.copy(), device=device), ewkern.asarray(y, device=device)
    c = ewkern.copy(a)
    assert isinstance(c, ewkern.Array) and c.device == device and c.shape == shape
    assert_close(c.numpy(), reference("copy", x), dtype, 0, "copy")
    s = ewkern.add(a, b)
    assert_close(s.numpy(), want, dtype, 1, "add")
    out = ewkern.full(shape, 123.0, dtype=dtype, device=device)
    assert ewkern.add(a, b, out=out) is out
    assert_close(out.numpy(), want, dtype, 1, "add out=")
    assert ewkern.add(a, b, out=a) is a           # in place: a += b
    assert_close(a.numpy(), want, dtype, 1, "add in place")


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_in_numpy_out(dtype):
    rng = np.random.default_rng(3)
    x, y = random_input(rng, (4, 9), dtype), random_input(rng, (4, 9), dtype)
    r = ewkern.add(x, y)
    assert isinstance(r, np.ndarray) and r.dtype == x.dtype and r.shape == x.shape
    assert_close(r, reference("add", x, y), dtype, 1)
    o = np.empty_like(x)
    assert ewkern.copy(x, out=o) is o and np.array_equal(o.astype(np.float64), x.astype(np.float64))


@pytest.mark.parametrize("device", device_params())
def test_misaligned_views(device):
    """A slice starting at element 1 (4-byte aligned, not 16) through DLPack."""
    rng = np.random.default_rng(5)
    base = random_input(rng, (4099,), "float32")
    x = base[1:]
    y = random_input(rng, (4098,), "float32")
    if device == "cpu":
        r = ewkern.add(x, y)
    else:
        g = ewkern.asarray(base, device=device)
        import ctypes  # noqa: F401
        # view of g starting at element 1: through a NumPy-like producer is not possible on the
        # GPU, so use torch/cupy when present
        if importlib.util.find_spec("torch") is None:
            pytest.skip("needs torch to make a misaligned CUDA view")
        import torch
        t = torch.from_dlpack(g)[1:]
        r = ewkern.add(t, torch.from_numpy(y).cuda()).cpu().numpy()
    assert_close(r, reference("add", x, y), "float32", 1)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("torch") is None or not ewkern.cuda_available(),
                    reason="needs torch and a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_inputs_on_gpu(dtype):
    import torch
    tdt = getattr(torch, dtype)
    x = torch.randn(2**20 + 3, device="cuda", dtype=tdt)
    y = torch.randn(2**20 + 3, device="cuda", dtype=tdt)
    r = ewkern.add(x, y)
    assert isinstance(r, torch.Tensor) and r.dtype == tdt
    assert_close(r.float().cpu().numpy() if dtype == "bfloat16" else r.cpu().numpy(),
                 reference("add", x.double().cpu().numpy(), y.double().cpu().numpy()), dtype, 1)
