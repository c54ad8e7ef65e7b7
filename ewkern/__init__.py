"""ewkern: elementwise and batched-RMSE CUDA kernels for studying GPU memory bandwidth.

Every op takes any C-contiguous DLPack array (ewkern.Array, numpy, torch, CuPy, JAX) without a
copy and returns a result in the first input's framework. See ``ewkern.ops()`` for the op set,
``ewkern.variants(op)`` for the kernel versions of the reference studies, and
``python -m ewkern.bench`` for the benchmark harness.

Streams: with inputs from a framework that exposes the DLPack C exchange API (torch), ewkern
launches on that framework's current stream. Otherwise it launches on ewkern's current stream:
the legacy default stream unless a ``with ewkern.stream(s):`` block is active, and passes that
stream to producers' ``__dlpack__`` so their pending work is ordered before ewkern's.

Devices: a call runs on its arrays' device (or ``device=``). When that is not the CUDA runtime's
current device, ewkern switches for the call's own work and switches back before it returns, on
success and on error, so ``torch.cuda.current_device()`` and CuPy's current device stay the caller's.
The one exception is torch's own rule: when nothing in the process has used the caller's device yet
(no CUDA context on it), switching back would create that context (hundreds of MB of its memory),
so the switch is left in place.
"""
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import _C
from ._C import (  # noqa: F401  (the public surface)
    Array, Stream, Plan,
    empty, zeros, full, asarray, from_dlpack,
    cuda_available, device_count, synchronize, device_info,
    ops as _ops_table, variants, kernel_info, build_info, set_pdl, pdl_enabled,
    copy, fill, add, sub, mul, div, maximum, minimum, add_const, mul_const, axpby,
    neg, abs, exp, log, sqrt, rsqrt, erf, tanh, sigmoid, relu, gelu, silu,
    rmse,
    gelu_backward, silu_backward, sigmoid_backward, tanh_backward, erf_backward, exp_backward,
    log_backward, sqrt_backward, rsqrt_backward, abs_backward, relu_backward, mul_backward,
    div_backward, maximum_backward, minimum_backward, axpby_backward, rmse_backward,
)

__version__ = "0.1.0"

from .rtc import ElementwiseKernel, ReductionKernel, RowKernel  # noqa: E402  (run-time kernels, issue 21)
from ._fuse import fuse  # noqa: E402  (cupy.fuse's counterpart: a Python function as one kernel)


def ops() -> list[dict[str, Any]]:
    """The op table: a list of dicts with name, inputs, scalars, definition and family."""
    return _ops_table()


def default_device() -> str:
    """'cuda:0' when a CUDA device is present, else 'cpu' (what device=None means)."""
    return "cuda:0" if cuda_available() else "cpu"


def current_stream() -> "Stream | None":
    """The ewkern.Stream that ewkern launches on for its own arrays, or None (the legacy
    default stream)."""
    return _C._get_stream()


@contextmanager
def stream(s: "Stream | None") -> Iterator["Stream | None"]:
    """Launch ewkern's work on Stream ``s`` inside the block (None: the legacy default stream)."""
    prev = _C._set_stream(s)
    try:
        yield s
    finally:
        _C._set_stream(prev)


def __getattr__(name: str) -> object:
    """``ewkern.torch`` (ewkern's ops as torch custom ops) is imported on first use, so that
    ``import ewkern`` never imports torch."""
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'ewkern' has no attribute {name!r}")


# Spelled out (not built from the op table) so type checkers see the exports; tests/test_typing.py
# checks that it lists every op.
__all__ = [
    "Array", "Stream", "Plan", "empty", "zeros", "full", "asarray", "from_dlpack", "cuda_available",
    "device_count", "synchronize", "device_info", "ops", "variants", "kernel_info", "build_info",
    "set_pdl", "pdl_enabled",
    "default_device", "current_stream", "stream", "rmse", "ElementwiseKernel", "ReductionKernel", "RowKernel",
    "fuse", "copy", "fill", "add", "sub", "mul", "div", "maximum", "minimum", "add_const", "mul_const", "axpby",
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu", "silu",
    "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward", "erf_backward", "exp_backward",
    "log_backward", "sqrt_backward", "rsqrt_backward", "abs_backward", "relu_backward", "mul_backward",
    "div_backward", "maximum_backward", "minimum_backward", "axpby_backward", "rmse_backward",
]
