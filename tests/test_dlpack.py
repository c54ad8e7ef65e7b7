"""DLPack exchange: export (versioned and legacy), import from every producer, ownership,
and the malformed-capsule errors."""
import gc
import importlib.util

import numpy as np
import pytest

import ewkern
from conftest import device_params
from dlpack_util import capsule_name, make_capsule

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_CUPY = importlib.util.find_spec("cupy") is not None



def handmade_capsule(buf, **fields):
    return make_capsule(buf.ctypes.data, owner=buf, **fields)


@pytest.mark.parametrize("device", device_params())
def test_export_capsule_kinds(device):
    a = ewkern.full((3, 2), 2.0, device=device)
    assert capsule_name(a.__dlpack__()) == "dltensor"
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert a.__dlpack_device__() == ((1, 0) if device == "cpu" else (2, 0))


def test_numpy_from_dlpack_is_zero_copy_and_keeps_memory_alive():
    a = ewkern.asarray(np.arange(1, 11, dtype=np.float32), device="cpu")
    b = ewkern.add(a, a)
    x = np.from_dlpack(b)
    assert x.ctypes.data == b.data_ptr
    del b, a
    gc.collect()
    assert x.tolist() == [2.0 * i for i in range(1, 11)]


def test_from_dlpack_capsule_and_consumed_capsule():
    a = ewkern.full((5,), 3.0, device="cpu")
    cap = a.__dlpack__(max_version=(1, 0))
    b = ewkern.from_dlpack(cap)
    assert b.data_ptr == a.data_ptr and b.numpy().tolist() == [3.0] * 5
    assert capsule_name(cap) == "used_dltensor_versioned"
    with pytest.raises(BufferError, match="already consumed"):
        ewkern.from_dlpack(cap)
    del a
    gc.collect()
    assert b.numpy().tolist() == [3.0] * 5


def test_unconsumed_capsule_releases_owner():
    a = ewkern.full((5,), 3.0, device="cpu")
    import sys
    before = sys.getrefcount(a)
    for _ in range(100):
        cap = a.__dlpack__(max_version=(1, 0))
        del cap
        cap = a.__dlpack__()
        del cap
    assert sys.getrefcount(a) == before


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(code=0, bits=32), TypeError, "unsupported dtype"),
    (dict(code=2, bits=32, device_type=4), ValueError, "device type"),
    (dict(ndim=17, shape=(1,) * 17), ValueError, "dimensions"),
    (dict(ndim=2, shape=(2, 2), strides=(1, 2)), ValueError, "not C-contiguous"),
    (dict(name=b"something"), TypeError, "named"),
    (dict(name=b"used_dltensor"), BufferError, "already consumed"),
])
def test_malformed_capsules(kwargs, exc, msg):
    buf = np.arange(1, 5, dtype=np.float32)
    cap = handmade_capsule(buf, **kwargs)
    with pytest.raises(exc, match=msg):
        ewkern.from_dlpack(cap)

    class Producer:  # the same capsule reaching an op through __dlpack__
        def __dlpack__(self, stream=None, max_version=None):
            return handmade_capsule(buf, **kwargs)

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(exc, match=msg):
        ewkern.copy(Producer())
    assert buf.tolist() == [1, 2, 3, 4]


def test_handmade_capsule_works_when_valid():
    buf = np.arange(1, 5, dtype=np.float32)
    a = ewkern.from_dlpack(handmade_capsule(buf))
    assert a.numpy().tolist() == [1, 2, 3, 4]


def test_bad_dlpack_producers():
    class NotCapsule:
        def __dlpack__(self, stream=None, max_version=None):
            return 42

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match="not a DLPack capsule"):
        ewkern.add(NotCapsule(), NotCapsule())
    with pytest.raises(TypeError, match="supports DLPack"):
        ewkern.add([1.0, 2.0], [3.0, 4.0])


def test_readonly_inputs_and_outputs():
    x = np.arange(1, 5, dtype=np.float32)
    x.setflags(write=False)
    a = ewkern.from_dlpack(x)
    assert a.readonly
    out = ewkern.add(x, x)
    assert out.tolist() == [2, 4, 6, 8]
    with pytest.raises(ValueError, match="read-only"):
        ewkern.add(x, x, out=x)
    with pytest.raises(ValueError, match="read-only"):
        ewkern.copy(x, out=a)
    assert x.tolist() == [1, 2, 3, 4]
    cap = a.__dlpack__(max_version=(1, 0))
    y = np.from_dlpack(type("P", (), {"__dlpack__": lambda s, **k: cap,
                                      "__dlpack_device__": lambda s: (1, 0)})())
    assert not y.flags.writeable


@pytest.mark.parametrize("device", device_params())
def test_dlpack_copy_and_device_arguments(device):
    a = ewkern.full((4,), 1.5, device=device)
    c = ewkern.from_dlpack(a.__dlpack__(max_version=(1, 0), copy=True))
    assert c.data_ptr != a.data_ptr and c.numpy().tolist() == [1.5] * 4
    h = ewkern.from_dlpack(a.__dlpack__(max_version=(1, 0), dl_device=(1, 0)))
    assert h.device == "cpu" and h.numpy().tolist() == [1.5] * 4
    if device != "cpu":
        with pytest.raises(BufferError, match="copy=False"):
            a.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
        with pytest.raises(ValueError, match="ambiguous"):
            a.__dlpack__(stream=0)
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(7, 0))
    for bad in ([1, 0], 1, "cpu"):   # a SystemError from the argument parser before
        with pytest.raises(TypeError, match=r"dl_device must be a \(device_type, device_id\) tuple"):
            a.__dlpack__(dl_device=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TORCH and ewkern.cuda_available()), reason="needs torch and a CUDA GPU")
def test_torch_round_trip_zero_copy():
    import torch
    t = torch.arange(1, 1001, dtype=torch.float32, device="cuda")
    u = torch.ones_like(t)
    r = ewkern.add(t, u)                       # torch in -> torch out
    assert isinstance(r, torch.Tensor) and r.device == t.device
    assert torch.equal(r, t + 1)
    out = torch.empty_like(t)
    assert ewkern.add(t, u, out=out) is out and out.data_ptr() != 0 and torch.equal(out, t + 1)
    a = ewkern.from_dlpack(t)                   # zero-copy view of a torch tensor
    assert a.data_ptr == t.data_ptr()
    e = ewkern.full((1000,), 2.0, device="cuda:0")
    v = torch.from_dlpack(e)                    # zero-copy torch view of ewkern memory
    assert v.data_ptr() == e.data_ptr
    del e
    gc.collect()
    torch.cuda.synchronize()
    assert torch.all(v == 2.0)
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(333, device="cuda", dtype=dt)
        assert torch.equal(ewkern.copy(x), x)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUPY and ewkern.cuda_available()), reason="needs CuPy and a CUDA GPU")
def test_cupy_round_trip_zero_copy():
    import cupy
    c = cupy.arange(1, 101, dtype=cupy.float32)
    r = ewkern.add(c, c)                        # cupy has no exchange API: ewkern.Array out
    assert isinstance(r, ewkern.Array)
    assert cupy.asarray(r).data.ptr == r.data_ptr
    v = cupy.from_dlpack(r)
    assert v.data.ptr == r.data_ptr
    del r
    gc.collect()
    assert cupy.allclose(v, 2 * c)
    a = ewkern.from_dlpack(c)
    assert a.data_ptr == c.data.ptr


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TORCH and ewkern.cuda_available()), reason="needs torch and a CUDA GPU")
def test_torch_current_stream_is_used():
    import torch
    s = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        y = ewkern.mul_const(x, 2.0)
        z = y * 1  # ordered after ewkern on the same stream
    s.synchronize()
    assert torch.equal(z, x * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not ewkern.cuda_available(), reason="no CUDA GPU")
def test_ewkern_stream_context():
    s = ewkern.Stream()
    x = ewkern.full((1 << 20,), 1.0, device="cuda:0")
    ewkern.synchronize()
    with ewkern.stream(s):
        assert ewkern.current_stream() is s
        y = ewkern.add(x, x)
    assert ewkern.current_stream() is None
    s.synchronize()
    assert float(y.numpy()[-1]) == 2.0


def test_consumed_capsule_as_second_input_keeps_the_buffer_error():
    """The first input's deleter (Python code here) runs while the BufferError is on its way:
    it must neither hide it behind a SystemError nor run twice."""
    from dlpack_fuzz import Producer, deleted, make
    good = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    cap, addr = make("versioned", good.ctypes.data, {})
    used = np.zeros((2, 4), np.float32)
    used_cap, used_addr = make("legacy", used.ctypes.data, {"name": b"used_dltensor"})
    with pytest.raises(BufferError, match="already consumed"):
        ewkern.add(Producer(cap), Producer(used_cap))
    assert deleted.get(addr) == 1 and deleted.get(used_addr) is None
    del cap, used_cap
    assert deleted.get(addr) == 1 and deleted.get(used_addr) is None


@pytest.mark.parametrize("major", [0, 2])
def test_other_major_version_is_taken_and_freed(major):
    """The spec: a consumer that cannot read the major version must still call the deleter."""
    from dlpack_fuzz import deleted, make
    buf = np.zeros((2, 4), np.float32)
    cap, addr = make("versioned", buf.ctypes.data, {"version": (major, 0)})
    with pytest.raises(BufferError, match="major version %d is not supported" % major):
        ewkern.from_dlpack(cap)
    assert capsule_name(cap) == "used_dltensor_versioned" and deleted.get(addr) == 1
    del cap
    assert deleted.get(addr) == 1
