"""Bad input gets a clear exception of the right kind, and nothing is written."""
import numpy as np
import pytest

import ewkern
from conftest import HAS_CUDA


def arrs(n=8, dtype=np.float32):
    return np.arange(1, n + 1, dtype=dtype), np.full(n, 2, dtype=dtype)


def test_dtype_mismatch():
    a, b = arrs()
    with pytest.raises(TypeError, match="dtype mismatch: a is float32 but b is float64"):
        ewkern.add(a, b.astype(np.float64))
    o = np.full(8, 5.0, np.float16)
    with pytest.raises(TypeError, match="out is float16"):
        ewkern.add(a, b, out=o)
    assert (o == 5).all()


def test_shape_mismatch_no_broadcasting():
    a, b = arrs()
    with pytest.raises(ValueError, match="does not broadcast"):
        ewkern.add(a, b[:4])
    with pytest.raises(ValueError, match="shape mismatch"):
        ewkern.add(a.reshape(2, 4), b.reshape(4, 2))
    o = np.full(4, 5.0, np.float32)
    with pytest.raises(ValueError, match="out has shape"):
        ewkern.copy(a, out=o)
    assert (o == 5).all()


def test_non_contiguous_rejected():
    a = np.arange(1, 17, dtype=np.float32).reshape(4, 4)
    with pytest.raises(ValueError, match="not a C-contiguous"):
        ewkern.copy(a.T)
    with pytest.raises(ValueError, match="C-contiguous"):
        ewkern.copy(a[:, ::2])


def test_unsupported_dtype():
    with pytest.raises(TypeError, match="unsupported dtype"):
        ewkern.copy(np.arange(4, dtype=np.int64))
    with pytest.raises(TypeError, match="unsupported dtype"):
        ewkern.copy(np.arange(4, dtype=np.complex64))


def test_not_an_array():
    with pytest.raises(TypeError, match="supports DLPack"):
        ewkern.copy("hello")
    with pytest.raises(TypeError, match="supports DLPack"):
        ewkern.copy(None)


def test_argument_errors():
    a, b = arrs()
    with pytest.raises(TypeError, match="missing required argument 'b'"):
        ewkern.add(a)
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        ewkern.add(a, b, c=1)
    with pytest.raises(TypeError, match="multiple values"):
        ewkern.add(a, b, a=a)
    with pytest.raises(TypeError, match="at most 3 positional"):
        ewkern.add(a, b, a, a)
    with pytest.raises(TypeError, match="variant must be a str"):
        ewkern.add(a, b, variant=3)
    with pytest.raises(TypeError, match="real number"):
        ewkern.add_const(a, "x")


def test_partial_overlap_rejected():
    buf = np.arange(1, 17, dtype=np.float32)
    with pytest.raises(ValueError, match="partially overlaps"):
        ewkern.copy(buf[:8], out=buf[4:12])
    assert buf.tolist() == list(range(1, 17))


def test_unknown_variant_lists_valid_ones():
    a, b = arrs()
    with pytest.raises(ValueError, match=r"unknown variant 'nope' on cpu; valid variants: \['auto'"):
        ewkern.add(a, b, variant="nope")
    with pytest.raises(ValueError, match="unknown op"):
        ewkern.variants("nope")


def test_block_and_grid_checks_on_cpu():
    a, b = arrs()
    with pytest.raises(ValueError, match="block"):
        ewkern.add(a, b, block=256)
    with pytest.raises(ValueError, match="positive"):
        ewkern.add(a, b, block=0)
    with pytest.raises(ValueError, match="positive"):
        ewkern.add(a, b, grid=-1)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: device mismatch between cpu and cuda")
def test_device_mismatch():
    a, b = arrs()
    g = ewkern.asarray(b, device="cuda:0")
    with pytest.raises(ValueError, match="device mismatch: a is on cpu but b is on cuda:0"):
        ewkern.add(a, g)
    with pytest.raises(ValueError, match="device mismatch"):
        ewkern.copy(g, out=np.empty(8, np.float32))


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU error")
def test_cuda_unavailable():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        ewkern.zeros(4, device="cuda:0")
    assert ewkern.cuda_available() is False


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_out_of_memory_is_memory_error():
    with pytest.raises(MemoryError):
        ewkern.empty((1 << 50,), dtype="float32", device="cuda:0")
    x = ewkern.full((4,), 1.0, device="cuda:0")  # the device still works afterwards
    assert ewkern.add(x, x).numpy().tolist() == [2.0] * 4


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_bad_cuda_variant_params():
    x = ewkern.full((1000,), 1.0, device="cuda:0")
    gs = [v for v in ewkern.variants("add", dtype="float32") if v.endswith("gs")]
    if not gs:
        pytest.skip("no grid-stride variants built")
    with pytest.raises(ValueError, match="multiple of the warp size"):
        ewkern.add(x, x, variant=gs[0], block=100)
    with pytest.raises(ValueError, match="exceeds the limit"):
        ewkern.add(x, x, variant=gs[0], block=2048)
    with pytest.raises(ValueError, match="positive"):
        ewkern.add(x, x, variant=gs[0], grid=0)
    with pytest.raises(ValueError, match="not a grid-stride kernel"):
        ewkern.add(x, x, variant="auto", grid=10)


@pytest.mark.parametrize("shape", [(1 << 20,) * 4, (1 << 62, 4), (0, 1 << 40, 1 << 40), (1 << 55,)])
def test_overflowing_shape_rejected(shape):
    with pytest.raises(ValueError, match=r"more than 2\^56 bytes"):
        ewkern.empty(shape, device="cpu")
    with pytest.raises(ValueError, match=r"more than 2\^56 bytes"):
        ewkern.zeros(shape, device="cpu")


def test_out_that_starts_where_an_input_starts_is_no_alias():
    """rmse's result is a batch of values: an out= that starts at an input's first byte but
    covers only part of it is a partial overlap (its early rows would be overwritten before they
    are read), not the exact alias an elementwise op may take."""
    a = np.random.default_rng(0).random((4096, 64), dtype=np.float32)
    b = np.random.default_rng(1).random((4096, 64), dtype=np.float32)
    keep = a.copy()
    with pytest.raises(ValueError, match="out overlaps an input"):
        ewkern.rmse(a, b, out=a.reshape(-1)[:4096])
    assert np.array_equal(a, keep)
    r = ewkern.rmse(a, b)
    buf = np.zeros(a.size, np.float32)
    grad = buf[:4096]
    grad[:] = 1.0
    with pytest.raises(ValueError, match="partially overlaps"):   # a gradient over grad's bytes and more
        ewkern.rmse_backward(grad, a, b, r, out=(buf.reshape(a.shape), None))
    assert (grad == 1).all() and (buf[4096:] == 0).all()


def test_two_gradients_may_not_overlap():
    x = np.arange(1, 9, dtype=np.float32)
    y = np.full(8, 10, np.float32)
    g = np.ones(8, np.float32)
    buf = np.full(12, 7.0, np.float32)
    with pytest.raises(ValueError, match="two gradients' out= arrays overlap"):
        ewkern.mul_backward(g, x, y, out=(buf[:8], buf[4:12]))
    assert (buf == 7).all()
    a = np.random.default_rng(2).random((4, 4), dtype=np.float32)
    b = np.random.default_rng(3).random((4, 4), dtype=np.float32)
    r = ewkern.rmse(a, b)
    big = np.full(20, 7.0, np.float32)
    with pytest.raises(ValueError, match="two gradients' out= arrays overlap"):
        ewkern.rmse_backward(np.ones(4, np.float32), a, b, r,
                             out=(big[:16].reshape(4, 4), big[4:20].reshape(4, 4)))
    assert (big == 7).all()


def test_read_only_array_leaves_only_as_a_versioned_capsule():
    """The legacy capsule has no read-only flag: exporting a read-only array through it would hand
    out its memory as writable (NumPy raises BufferError the same way)."""
    ro = np.full(4, 7.0, np.float32)
    ro.flags.writeable = False
    arr = ewkern.asarray(ro)
    with pytest.raises(BufferError, match="read-only"):
        arr.__dlpack__()
    assert ewkern.from_dlpack(arr.__dlpack__(max_version=(1, 0))).numpy().tolist() == [7.0] * 4
    with pytest.raises(ValueError, match="read-only"):
        ewkern.fill(ewkern.from_dlpack(arr.__dlpack__(max_version=(1, 0))), 1.0)
    assert ewkern.from_dlpack(arr.__dlpack__(copy=True)).numpy().tolist() == [7.0] * 4
    assert ro.tolist() == [7.0] * 4


def test_shape_entries():
    assert ewkern.empty((np.int64(3), 2)).shape == (3, 2)
    assert ewkern.zeros(np.int32(5)).shape == (5,)
    for bad in [(3, -2), (3, -1), -2]:
        with pytest.raises(ValueError, match="negative dimension"):
            ewkern.empty(bad)
    with pytest.raises(ValueError, match="too large"):
        ewkern.empty((3, 2 ** 70))
    with pytest.raises(TypeError, match="shape entries must be ints, got float"):
        ewkern.empty((3, 2.0))


def test_malformed_dlpack_device_is_a_type_error():
    class W:
        def __dlpack__(self, **kw):
            return np.zeros(2, np.float32).__dlpack__(**kw)

        def __dlpack_device__(self):
            return "cpu"

    with pytest.raises(TypeError, match=r"__dlpack_device__\(\) must return a \(device_type, device_id\) tuple"):
        ewkern.from_dlpack(W())


@pytest.mark.parametrize("bad", [None, object(), [1j, 2], "abc", {"a": 1}])
def test_asarray_takes_real_numbers_only(bad):
    with pytest.raises(TypeError, match="expected an array, a real number or a sequence of real numbers"):
        ewkern.asarray(bad)
