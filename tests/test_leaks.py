"""Reference counts and capsule deleters are exact: no growth over 10,000 calls."""
import gc
import importlib.util
import sys

import numpy as np
import pytest

import ewkern


def count_objects():
    gc.collect()
    return len(gc.get_objects())


def run(fn, n=10_000):
    fn()
    before = count_objects()
    for _ in range(n):
        fn()
    return count_objects() - before


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(
    not ewkern.cuda_available(), reason="no CUDA GPU"))])
def test_no_object_growth(device):
    a = ewkern.full((64,), 1.0, device=device)
    b = ewkern.full((64,), 2.0, device=device)
    o = ewkern.empty((64,), device=device)
    refs = (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(o))
    assert run(lambda: ewkern.add(a, b)) <= 2
    assert run(lambda: ewkern.add(a, b, out=o)) <= 2
    assert run(lambda: ewkern.from_dlpack(a.__dlpack__(max_version=(1, 0)))) <= 2
    assert run(lambda: np.from_dlpack(ewkern.copy(a)) if device == "cpu" else a.__dlpack__()) <= 2
    assert (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(o)) == refs


def test_numpy_inputs_no_growth():
    x = np.ones(32, np.float32)
    assert run(lambda: ewkern.add(x, x)) <= 2
    assert run(lambda: ewkern.asarray(x)) <= 2
    r = sys.getrefcount(x)
    for _ in range(1000):
        ewkern.copy(x)
    assert sys.getrefcount(x) == r


def test_asarray_with_a_dtype_keeps_every_count():
    """asarray(x, dtype=<another>) gave back a reference to None it did not own (and leaked the
    device string) on every call: the interpreter aborted after a few thousand calls."""
    x = np.ones(4, np.float32)
    none = sys.getrefcount(None)
    for _ in range(2000):
        ewkern.asarray(x, dtype="float16")
    assert abs(sys.getrefcount(None) - none) < 50
    assert run(lambda: ewkern.asarray(x, dtype="float16", device="cpu")) <= 2


def test_errors_leak_nothing():
    x = np.ones(8, np.float32)
    y = np.ones(4, np.float32)

    def bad():
        try:
            ewkern.add(x, y)
        except ValueError:
            pass
    assert run(bad) <= 2


@pytest.mark.serial
@pytest.mark.skipif(importlib.util.find_spec("torch") is None or not ewkern.cuda_available(),
                    reason="needs torch and a CUDA GPU")
def test_device_memory_does_not_grow():
    import torch
    a = ewkern.full((1 << 20,), 1.0, device="cuda:0")
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(100):
        ewkern.add(a, a)
        ewkern.add(t, t)
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    alloc0 = torch.cuda.memory_allocated()
    for _ in range(10_000):
        ewkern.add(a, a)
        ewkern.add(t, t)
        torch.from_dlpack(a)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == alloc0
    assert free0 - torch.cuda.mem_get_info()[0] < 64 << 20
