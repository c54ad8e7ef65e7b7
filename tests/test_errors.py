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
