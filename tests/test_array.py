"""ewkern.Array: creation, properties, NumPy conversion, asarray paths."""
import numpy as np
import pytest

import ewkern
from conftest import device_params
from reference import BF16, DTYPES, np_dtype, random_input


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_creation_and_properties(device, dtype):
    a = ewkern.empty((2, 3, 4), dtype=dtype, device=device)
    item = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[dtype]
    assert a.shape == (2, 3, 4) and a.ndim == 3 and a.size == 24
    assert a.dtype == dtype and a.device == device and a.itemsize == item
    assert a.nbytes == 24 * item and a.strides == (12 * item, 4 * item, item)
    r = repr(a)
    assert "(2, 3, 4)" in r and dtype in r and device in r
    z = ewkern.zeros(5, dtype=dtype, device=device)
    assert np.array_equal(z.numpy().astype(np.float64), np.zeros(5))
    f = ewkern.full((3,), -2.5, dtype=dtype, device=device)
    assert np.array_equal(f.numpy().astype(np.float64), np.full(3, -2.5))
    assert len(f) == 3


@pytest.mark.parametrize("device", device_params())
def test_zero_size_and_scalar_shapes(device):
    a = ewkern.empty((0, 3), device=device)
    assert a.size == 0 and a.numpy().shape == (0, 3)
    s = ewkern.full((), 3.0, device=device)
    assert s.shape == () and s.numpy() == 3.0


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_asarray_round_trip(device, dtype):
    rng = np.random.default_rng(1)
    x = random_input(rng, (7, 5), dtype)
    a = ewkern.asarray(x, device=device)
    assert a.dtype == dtype and a.device == device
    back = a.numpy()
    assert back.dtype == np_dtype(dtype)
    assert np.array_equal(back.astype(np.float64), x.astype(np.float64))
    assert np.array_equal(np.asarray(a).astype(np.float64), x.astype(np.float64))


def test_asarray_numpy_is_zero_copy_on_cpu():
    x = np.arange(1, 9, dtype=np.float32)
    a = ewkern.asarray(x)
    assert a.data_ptr == x.ctypes.data
    x[0] = 42
    assert a.numpy()[0] == 42
    assert ewkern.asarray(a) is a


def test_asarray_sequences_and_dtype_conversion():
    a = ewkern.asarray([[1.5, 2.5], [3.5, 4.5]], device="cpu")
    assert a.shape == (2, 2) and a.dtype == "float64"
    b = ewkern.asarray([1, 2, 3], device="cpu")
    assert b.dtype == "float64"
    c = ewkern.asarray(np.arange(1, 5, dtype=np.float64), dtype="float16", device="cpu")
    assert c.dtype == "float16" and c.numpy().tolist() == [1, 2, 3, 4]
    d = ewkern.asarray(c, dtype="bfloat16")
    assert d.dtype == "bfloat16" and d.numpy().astype(np.float64).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("dtype", DTYPES)
def test_asarray_with_dtype_converts_what_it_takes_without(dtype):
    """dtype= makes a converted copy of anything asarray takes: integer and bool sequences and
    NumPy arrays (an integer array was refused as an int64 array) and NumPy subclasses (masked
    arrays, memmaps, a user's), which have no .numpy()."""
    want = np.array([1, -2, 3, 40000], np.float64).astype(np_dtype(dtype)).astype(np.float64)
    for src in ([1, -2, 3, 40000], np.array([1, -2, 3, 40000], np.int64), np.array([1, -2, 3, 40000], np.int32),
                np.array([1.0, -2.0, 3.0, 40000.0]).view(type("Sub", (np.ndarray,), {})),
                np.ma.array([1.0, -2.0, 3.0, 40000.0])):
        a = ewkern.asarray(src, dtype=dtype, device="cpu")
        assert a.dtype == dtype, type(src)
        np.testing.assert_array_equal(a.numpy().astype(np.float64), want, err_msg=str(type(src)))
    b = ewkern.asarray(np.array([True, False]), dtype=dtype, device="cpu")
    assert b.numpy().astype(np.float64).tolist() == [1.0, 0.0]
    with pytest.raises(TypeError, match="unsupported dtype int64"):
        ewkern.asarray(np.arange(3))   # without dtype=: ewkern holds floating types only, said so


@pytest.mark.parametrize("device", device_params())
def test_asarray_with_dtype_converts_a_frameworks_integer_tensors(device):
    """A torch (or CuPy) integer or bool tensor with dtype= is converted as NumPy's integer arrays
    are, onto the tensor's own device unless device= names another (it was refused as an int32
    array, where a NumPy int32 array was taken); without dtype= it is still refused, naming its
    dtype, and a complex tensor still is with dtype= (NumPy's cast would drop its imaginary part)."""
    torch = pytest.importorskip("torch")
    vals = [-3, 0, 7, 40000, -123456]
    for tdt in (torch.int32, torch.int64, torch.int16, torch.uint8, torch.bool):
        src = np.array(vals).astype(str(tdt).split(".")[1])
        t = torch.from_numpy(src).to(device)
        for dtype in DTYPES:
            a = ewkern.asarray(t, dtype=dtype)
            assert (a.dtype, a.device) == (dtype, device), (tdt, dtype)
            want = src.astype(np.float64).astype(np_dtype(dtype)).astype(np.float64)
            np.testing.assert_array_equal(a.numpy().astype(np.float64), want, err_msg=f"{tdt} -> {dtype}")
    # a strided view, and device= taking it across
    t = torch.arange(12, dtype=torch.int64, device=device).reshape(3, 4)[:, 1::2]
    a = ewkern.asarray(t, dtype="float32", device="cpu")
    assert a.device == "cpu" and a.numpy().tolist() == [[1, 3], [5, 7], [9, 11]]
    with pytest.raises(TypeError, match="unsupported dtype int32"):
        ewkern.asarray(torch.arange(3, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="unsupported dtype complex64"):
        ewkern.asarray(torch.ones(3, dtype=torch.complex64, device=device), dtype="float32")
    with pytest.raises(ValueError, match="negative bit"):
        ewkern.asarray(torch._neg_view(torch.arange(3, device=device)), dtype="float32")


@pytest.mark.gpu
@pytest.mark.skipif(not ewkern.cuda_available(), reason="no CUDA GPU")
def test_asarray_with_dtype_converts_a_cupy_integer_array():
    cp = pytest.importorskip("cupy")
    x = cp.arange(-5, 5, dtype=cp.int32)
    a = ewkern.asarray(x, dtype="float16")
    assert (a.dtype, a.device) == ("float16", "cuda:0")
    assert a.numpy().astype(np.float64).tolist() == list(range(-5, 5))


def test_array_protocol_copy_false_refuses_another_dtype():
    """NumPy 2's __array__(dtype, copy=False) promises a view: another dtype is a ValueError, the
    same dtype a view of the array's memory (asked by np.asarray(x, dtype, copy=False))."""
    x = ewkern.asarray(np.arange(1.0, 4.0, dtype=np.float32))
    with pytest.raises(ValueError, match="copy=False"):
        np.asarray(x, dtype=np.float64, copy=False)
    v = np.asarray(x, dtype=np.float32, copy=False)
    assert np.shares_memory(v, x.numpy())
    assert np.asarray(x, dtype=np.float64).dtype == np.float64


@pytest.mark.gpu
@pytest.mark.skipif(not ewkern.cuda_available(), reason="no CUDA GPU")
def test_asarray_between_devices():
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    g = ewkern.asarray(x, device="cuda:0")
    h = ewkern.asarray(g, device="cpu")
    assert h.device == "cpu" and np.array_equal(h.numpy(), x)
    assert g.__cuda_array_interface__["shape"] == (1001,)
    assert g.__cuda_array_interface__["data"][0] == g.data_ptr


def test_bfloat16_numpy_uses_ml_dtypes():
    a = ewkern.full((4,), 1.25, dtype="bfloat16", device="cpu")
    assert a.numpy().dtype == BF16


def test_cpu_numpy_view_shares_memory():
    a = ewkern.full((4,), 1.0, device="cpu")
    v = a.numpy()
    v[1] = 7
    assert a.numpy()[1] == 7
    del a
    assert v[1] == 7  # the view keeps the Array alive


def test_array_cannot_be_instantiated_directly():
    with pytest.raises(TypeError, match="ewkern.empty"):
        ewkern.Array()


@pytest.mark.parametrize("bad, exc, msg", [
    ((-1, 2), ValueError, "negative dimension"),
    ("abc", TypeError, "shape"),
    ((1.5,), TypeError, "ints"),
    (tuple([1] * 17), ValueError, "too many dimensions"),
])
def test_bad_shapes(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        ewkern.empty(bad, device="cpu")


def test_bad_dtype_and_device():
    with pytest.raises(TypeError, match="float32"):
        ewkern.empty(3, dtype="int32", device="cpu")
    with pytest.raises(ValueError, match="unknown device"):
        ewkern.empty(3, device="tpu")
    with pytest.raises(TypeError, match="unsupported dtype"):
        ewkern.asarray(np.arange(3, dtype=np.int32))
    if not ewkern.cuda_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            ewkern.empty(3, device="cuda:0")
    else:
        with pytest.raises(ValueError, match="does not exist"):
            ewkern.empty(3, device="cuda:%d" % ewkern.device_count())


def test_current_device():
    """ewkern._C._current_device(): the CUDA runtime's current device of this thread, None without
    CUDA; calls leave it as they found it (on two GPUs, tests/test_multigpu.py checks every kind)."""
    cur = ewkern._C._current_device()
    if not ewkern.cuda_available():
        assert cur is None
        return
    assert 0 <= cur < ewkern.device_count()
    with pytest.raises(ValueError, match="does not exist"):
        ewkern.empty(3, device="cuda:%d" % ewkern.device_count())
    ewkern.add(ewkern.full(3, 1.0, device="cuda:0"), ewkern.zeros(3, device="cuda:0"))
    assert ewkern._C._current_device() == cur


def test_device_info_cpu():
    info = ewkern.device_info("cpu")
    assert info["device"] == "cpu" and info["cores"] >= 1


@pytest.mark.gpu
@pytest.mark.skipif(not ewkern.cuda_available(), reason="no CUDA GPU")
def test_device_info_cuda_peak_formula():
    info = ewkern.device_info("cuda:0")
    for key in ("name", "compute_capability", "sm_count", "l2_bytes", "max_threads_per_sm",
                "memory_bus_width_bits", "memory_clock_khz", "peak_bandwidth_gbs"):
        assert key in info
    if info["transfers_per_cycle"]:
        want = info["memory_bus_width_bits"] / 8 * info["transfers_per_cycle"] * info["memory_clock_khz"] * 1e-6
        assert info["peak_bandwidth_gbs"] == pytest.approx(want)
