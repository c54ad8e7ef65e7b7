"""Peers (torch, CuPy, NumPy) timed with the same method as ewkern.

On a GPU a peer's K back-to-back calls are captured into one CUDA graph (torch.cuda.CUDAGraph or
CuPy stream capture), and each sample replays the graph between two CUDA events, behind a spin
kernel that holds the stream while the host queues the sample, so no Python runs between the
timed launches. In flush mode a sample is one launch, made eagerly behind the spin kernel (a
graph's own start-up would otherwise be timed), which is what ewkern's time_plans does. Cache modes are those of ``timing.py``: ``rotate`` cycles the captured calls
through distinct buffer sets, ``flush`` reads (GPU; writes on a CPU) a buffer of twice the cache
size before each one-launch sample, as ewkern's timing core does. On a CPU (NumPy) the host
clock times K calls in a loop.

After a foreign kernel (``time_calls(..., before=...)``, torch on a GPU, rotate): one graph of K
(foreign call, call) pairs and one of the K foreign calls alone, on the same buffers, replayed in
turns sample by sample; a sample is (pair graph - foreign graph) / K, what the call costs when the
kernel before it is someone else's (one that never triggers an early launch of the next).

torch and CuPy are imported only when a peer is asked for; a missing one is skipped.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import statistics
import sys
from contextlib import contextmanager
from functools import partial

from .timing import (BETWEEN_ELEMENTS, BenchError, Skip, Timing, TimingConfig, choose_launches, choose_sets,
                     sample_rounds)
from .timing import flush_words as _flush_words
from .units import ITEMSIZE

__all__ = ["available", "versions", "time_calls", "time_calls_in_turns", "SharedSets", "elementwise_call",
           "rmse_call", "PEER_OPS", "PEER_STANDINS", "op_inputs",
           "RMSE_PEERS", "ewkern_in_torch_call", "EWKERN_GRAPH",
           "EWKERN_NOPDL", "pdl_off", "pdl_active", "release_peer_memory", "FOREIGN", "foreign_call"]

EWKERN_GRAPH = "ewkern (torch graph)"   # the label of ewkern timed with torch's method
EWKERN_NOPDL = "ewkern (PDL off)"       # ewkern's auto kernels with programmatic dependent launch off

SPIN_US = 300.0
# A sample is queued behind the spin kernel only if the host queues it before the spin (and the flush)
# end; if the start event has already fired by then, the sample timed the host, not the GPU (a 16-core
# host busy elsewhere gave medians of 38 and 164 us for 8 us launches, H100 single launch). Such a
# sample is taken again, up to LATE_TRIES times, and the run's notes count them.
LATE_TRIES = 4
# Ways timed in turns, single launches: after the first round, each sample's spin lasts SPIN_HOST_FACTOR
# x the 90th percentile of the times the host took to queue one of that round's samples (at least
# SPIN_FLOOR_US, at most the spin asked for; with the longest, train's spin stayed at its 3000 us on
# the H200), so that the many samples of the adaptive rounds (timing.sample_rounds) cost their flush
# and call more than their spin; a sample queued late is still taken again.
SPIN_HOST_FACTOR = 3.0
SPIN_FLOOR_US = 40.0
# ...and the host queues a sample only once the sample LAG_SAMPLES before it has ended: with a spin
# longer than the host's queueing the GPU falls further behind with every sample, and a full launch
# queue (about a thousand entries) would block the host inside a launch, which the host's queueing
# time would then count (and the spin follow it back up).
LAG_SAMPLES = 16


def release_peer_memory():
    """Hand the peers' cached device memory back to the driver (torch's caching allocator and
    CuPy's pool keep freed blocks, which ewkern's own allocations cannot use)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass


def pdl_active(info: dict) -> bool:
    """Whether ewkern's auto kernels use programmatic dependent launch on this device now."""
    import ewkern
    cc = info.get("compute_capability") or (0, 0)
    return bool(ewkern.pdl_enabled()) and tuple(cc) >= (9, 0)


@contextmanager
def pdl_off():
    """Programmatic dependent launch switched off inside the block (restored after)."""
    import ewkern
    prev = ewkern.set_pdl(False)
    try:
        yield
    finally:
        ewkern.set_pdl(prev)


def _import(name):
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def available(impl: str, device: str) -> str | None:
    """None when impl can run on device, otherwise why not."""
    gpu = device != "cpu"
    if impl == "numpy":
        return None if not gpu else "NumPy runs on the host only"
    if impl in ("torch", "torch.compile"):
        torch = _import("torch")
        if torch is None:
            return "torch is not installed"
        if gpu and not torch.cuda.is_available():
            return "torch sees no CUDA device"
        if not gpu:
            return "torch peers are timed on CUDA devices only (NumPy is the CPU peer)"
        return None
    if impl == "cupy":
        if not gpu:
            return "CuPy runs on CUDA devices only"
        cupy = _import("cupy")
        if cupy is None:
            return "CuPy is not installed"
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                return "CuPy sees no CUDA device"
        except Exception as exc:
            return f"CuPy cannot reach the GPU ({exc})"
        return None
    return f"unknown peer {impl!r}"


def versions() -> dict:
    """Installed versions of the peers, read from package metadata (nothing is imported)."""
    out = {}
    for name in ("numpy", "torch", "matplotlib", "scipy", "ml_dtypes", "tqdm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["cupy"] = None
    try:
        for dist in importlib.metadata.distributions():
            name = (dist.metadata["Name"] or "").lower()
            if name == "cupy" or name.startswith("cupy-cuda"):
                out["cupy"] = dist.version
                break
    except Exception:
        pass
    return out


# --- arrays in each framework ------------------------------------------------------------------

def _torch_dtype(dtype):
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "float64": torch.float64}[dtype]


def _cupy_dtype(dtype):
    import cupy
    import numpy
    if dtype == "bfloat16":
        bf = getattr(cupy, "bfloat16", None)
        if bf is None:
            raise Skip("CuPy has no bfloat16")
        return bf
    return numpy.dtype(dtype)


def _numpy_dtype(dtype):
    import numpy
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise Skip("NumPy bfloat16 needs ml_dtypes") from None
        return numpy.dtype(ml_dtypes.bfloat16)
    return numpy.dtype(dtype)


def _full(impl, shape, dtype, device, value):
    if impl.startswith("torch"):
        import torch
        return torch.full(tuple(shape), value, dtype=_torch_dtype(dtype), device=device)
    if impl == "cupy":
        import cupy
        with cupy.cuda.Device(_index(device)):
            return cupy.full(tuple(shape), value, dtype=_cupy_dtype(dtype))
    import numpy
    return numpy.full(tuple(shape), value, dtype=_numpy_dtype(dtype))


def _empty(impl, shape, dtype, device):
    if impl.startswith("torch"):
        import torch
        return torch.empty(tuple(shape), dtype=_torch_dtype(dtype), device=device)
    if impl == "cupy":
        import cupy
        with cupy.cuda.Device(_index(device)):
            return cupy.empty(tuple(shape), dtype=_cupy_dtype(dtype))
    import numpy
    return numpy.empty(tuple(shape), dtype=_numpy_dtype(dtype))


def _index(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0


# --- the ops ------------------------------------------------------------------------------------

_BINARY = {"add", "sub", "mul", "div", "maximum", "minimum", "axpby"}
_UNARY = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu", "silu"}
PEER_OPS = {"copy", "fill", "add_const", "mul_const"} | _BINARY | _UNARY
_NUMPY_NAMES = {"sub": "subtract", "mul": "multiply", "div": "divide", "neg": "negative",
                "abs": "absolute"}
_FILL = {"log": 1.5, "sqrt": 1.5, "rsqrt": 1.5, "div": 0.75}
# what stands in for an op where the peer has no kernel of its own: same bytes, one launch
PEER_STANDINS = {"axpby": "a + beta * b (torch.add with alpha; no framework has alpha * a + beta * b in one kernel)"}


def _op_fn(impl: str, op: str):
    """fn(ins, out) performing op in impl, writing into out."""
    if impl.startswith("torch"):
        import torch
        if op == "copy":
            return lambda ins, out: out.copy_(ins[0])
        if op == "fill":
            return lambda ins, out: out.fill_(1.0)
        if op == "add_const":
            return lambda ins, out: torch.add(ins[0], 1.0, out=out)
        if op == "mul_const":
            return lambda ins, out: torch.mul(ins[0], 1.0, out=out)
        if op == "axpby":
            return lambda ins, out: torch.add(ins[0], ins[1], alpha=0.5, out=out)
        if op == "relu":
            return lambda ins, out: torch.clamp_min(ins[0], 0.0, out=out)
        if op in ("gelu", "silu"):
            f = getattr(torch.ops.aten, op).out      # torch.nn.functional's kernels, with out=
            return lambda ins, out: f(ins[0], out=out)
        f = getattr(torch, {"maximum": "maximum", "minimum": "minimum"}.get(op, op))
        if op in _BINARY:
            return lambda ins, out: f(ins[0], ins[1], out=out)
        return lambda ins, out: f(ins[0], out=out)
    if impl == "cupy":
        import cupy
        if op == "copy":
            return lambda ins, out: cupy.copyto(out, ins[0])
        if op == "fill":
            return lambda ins, out: out.fill(1.0)
        if op == "add_const":
            return lambda ins, out: cupy.add(ins[0], 1.0, out=out)
        if op == "mul_const":
            return lambda ins, out: cupy.multiply(ins[0], 1.0, out=out)
        if op == "erf":
            special = _import("cupyx.scipy.special")
            if special is None:
                raise Skip("cupyx.scipy.special is missing")
            return lambda ins, out: special.erf(ins[0], out=out)
        if op == "rsqrt":
            return lambda ins, out: cupy.divide(1.0, cupy.sqrt(ins[0]), out=out)
        if op == "relu":
            return lambda ins, out: cupy.maximum(ins[0], 0.0, out=out)
        if op in ("sigmoid", "gelu", "silu", "axpby"):
            raise Skip(f"CuPy has no {op} ufunc")
        f = getattr(cupy, _NUMPY_NAMES.get(op, op))
        if op in _BINARY:
            return lambda ins, out: f(ins[0], ins[1], out=out)
        return lambda ins, out: f(ins[0], out=out)
    import numpy
    if op == "copy":
        return lambda ins, out: numpy.copyto(out, ins[0])
    if op == "fill":
        return lambda ins, out: out.fill(1.0)
    if op == "add_const":
        return lambda ins, out: numpy.add(ins[0], out.dtype.type(1.0), out=out)
    if op == "mul_const":
        return lambda ins, out: numpy.multiply(ins[0], out.dtype.type(1.0), out=out)
    if op == "erf":
        special = _import("scipy.special")
        if special is None:
            raise Skip("NumPy has no erf (scipy is not installed)")
        return lambda ins, out: special.erf(ins[0], out=out)
    if op == "relu":
        return lambda ins, out: numpy.maximum(ins[0], out.dtype.type(0.0), out=out)
    if op in ("rsqrt", "sigmoid", "gelu", "silu", "axpby"):
        raise Skip(f"NumPy has no {op} ufunc")
    f = getattr(numpy, _NUMPY_NAMES.get(op, op))
    if op in _BINARY:
        return lambda ins, out: f(ins[0], ins[1], out=out)
    return lambda ins, out: f(ins[0], out=out)


def _nin(op: str) -> int:
    return 0 if op == "fill" else (2 if op in _BINARY else 1)


def op_inputs(impl: str, op: str, shape, dtype: str, device: str) -> list:
    """The inputs of op for impl: random data in the op's domain (standard normal x 2, so gelu,
    erf, tanh, sigmoid and silu see both tails; |x| + 0.05 for log, sqrt, rsqrt; |x| + 0.5 for a
    divisor), drawn in float32 and rounded to dtype. ewkern and its peers are timed on the same
    distribution: constant inputs would hide data-dependent branches."""
    out = []
    for k in range(_nin(op)):
        # |x| + shift for inputs that must be positive (and away from 0 for a divisor)
        shift = 0.05 if op in ("log", "sqrt", "rsqrt") else (0.5 if op == "div" and k == 1 else None)
        if impl.startswith("torch"):
            import torch
            x = torch.randn(tuple(shape), dtype=torch.float32, device=device) * 2.0
            if shift is not None:
                x = x.abs_().add_(shift)
            out.append(x.to(_torch_dtype(dtype)))
            del x
        elif impl == "cupy":
            import cupy
            with cupy.cuda.Device(_index(device)):
                x = cupy.random.standard_normal(tuple(shape), dtype=cupy.float32) * 2.0
                if shift is not None:
                    x = cupy.abs(x) + shift
                out.append(x.astype(_cupy_dtype(dtype)))
        else:
            import numpy
            x = numpy.random.default_rng(k).standard_normal(tuple(shape), dtype=numpy.float32) * 2.0
            if shift is not None:
                x = numpy.abs(x) + numpy.float32(shift)
            out.append(x.astype(_numpy_dtype(dtype)))
    return out


def elementwise_call(impl: str, op: str, dtype: str, shape, device: str, *, sets: SharedSets | None = None):
    """(make_call, set_bytes, bytes_read, bytes_written) for op in a peer framework; sets: buffer
    sets (inputs, output) shared with other ways (torch_sets), for impl torch only."""
    if op not in PEER_OPS:
        raise Skip(f"no {impl} equivalent of {op}")
    why = available(impl, device)
    if why:
        raise Skip(why)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    nin = _nin(op)
    n = math.prod(shape)
    s = ITEMSIZE[dtype]
    fn = _op_fn(impl, op)
    # probe the dtype once so an unsupported one is a Skip, not an error mid-capture
    probe = [_full(impl, (8,), dtype, device, _FILL.get(op, 0.5)) for _ in range(nin)]
    try:
        fn(probe, _empty(impl, (8,), dtype, device))
    except Skip:
        raise
    except Exception as exc:
        raise Skip(f"{impl} {op} does not take {dtype}: {type(exc).__name__}: {exc}") from None

    if sets is not None and impl != "torch":
        raise ValueError(f"shared buffer sets are torch tensors, not {impl}'s")
    make_call = set_maker(sets, partial(_op_set, impl, op, shape, dtype, device), lambda io: lambda: fn(*io))
    return make_call, (nin + 1) * n * s, nin * n * s, n * s


def _op_set(impl: str, op: str, shape, dtype: str, device: str) -> tuple:
    """One buffer set of op in impl's arrays: (its inputs (op_inputs), an output)."""
    return op_inputs(impl, op, shape, dtype, device), _empty(impl, shape, dtype, device)


def torch_sets(op: str, dtype: str, shape, device: str, *, chain: bool = False) -> SharedSets:
    """SharedSets of op's torch inputs (op_inputs) and output, for ewkern_in_torch_call and
    elementwise_call("torch", ...) timed in turns on the same buffers; chain: ChainSets (each set's
    first input the set before's output)."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    return (ChainSets if chain else SharedSets)(partial(_op_set, "torch", op, shape, dtype, device))


RMSE_PEERS = ("torch eager", "torch vector_norm", "torch.compile", "cupy ReductionKernel", "numpy")

_CUPY_RMSE = {}
_COMPILED = {}


def _cupy_rmse_kernel():
    if "k" not in _CUPY_RMSE:
        import cupy
        _CUPY_RMSE["k"] = cupy.ReductionKernel(
            "T x, T y", "float32 z",
            "(float(x) - float(y)) * (float(x) - float(y))", "a + b",
            "z = sqrt(a / (float)(_in_ind.size() / _out_ind.size()))", "0.0f", "ewbench_rmse",
            reduce_type="float")
    return _CUPY_RMSE["k"]


def rmse_call(peer: str, shape, dtype: str, device: str, axis: int, *, out_itemsize: int = 4,
              shared_compile: bool = False):
    """(make_call, set_bytes, bytes_read, bytes_written) for a peer's RMSE over axis of a 2-D shape
    (out_itemsize: the bytes of one result the peer writes; shared_compile: torch.compile once per
    axis and dtype with Dynamo's automatic dynamic shapes, instead of once per shape)."""
    impl = {"torch eager": "torch", "torch vector_norm": "torch", "torch.compile": "torch.compile",
            "cupy ReductionKernel": "cupy", "numpy": "numpy"}[peer]
    why = available(impl, device)
    if why:
        raise Skip(why)
    n_red = shape[axis]
    n = math.prod(shape)
    batches = n // n_red
    s = ITEMSIZE[dtype]
    if peer == "torch eager":
        import torch

        def f(a, b):
            return torch.sqrt(((a - b) ** 2).mean(axis))
    elif peer == "torch vector_norm":
        import torch
        root = math.sqrt(n_red)

        def f(a, b):
            return torch.linalg.vector_norm(a - b, dim=axis) / root
    elif peer == "torch.compile":
        import torch

        def eager(a, b):
            return torch.sqrt(((a - b) ** 2).mean(axis))
        try:
            if shared_compile:
                # one compiled function per (axis, dtype): Dynamo specialises on the first shape
                # and recompiles with dynamic shapes on the next, as for a user calling it often
                key = (axis, dtype)
                if key not in _COMPILED:
                    _COMPILED[key] = torch.compile(eager)
                f = _COMPILED[key]
            else:
                f = torch.compile(eager, dynamic=False)
        except Exception as exc:
            raise Skip(f"torch.compile failed: {exc}") from None
    elif peer == "cupy ReductionKernel":
        k = _cupy_rmse_kernel()

        def f(a, b, out=None):
            return k(a, b, axis=axis, out=out)
    else:
        import numpy

        def f(a, b):
            return numpy.sqrt(((a - b) ** 2).mean(axis=axis))

    def make_call():
        a = _full(impl, shape, dtype, device, 0.75)
        b = _full(impl, shape, dtype, device, 0.25)
        if peer == "cupy ReductionKernel":
            out = _empty("cupy", (batches,), "float32", device)
            return lambda: f(a, b, out)
        return lambda: f(a, b)

    if peer == "torch.compile":   # compile now, so a failure is a Skip with a reason
        try:
            make_call()()
        except Exception as exc:
            raise Skip(f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    return make_call, 2 * n * s, 2 * n * s, batches * out_itemsize


def ewkern_in_torch_call(op: str, dtype: str, shape, device: str, *, axis=None, sets: SharedSets | None = None):
    """ewkern's op (variant auto) on torch tensors, so it can be timed exactly as torch is.

    ewkern launches on torch's current stream for torch inputs, so the calls are captured into
    the same kind of CUDA graph as the torch peer's. op "rmse" takes axis (None: batch-first).
    sets: buffer sets (inputs, output) shared with other ways (torch_sets; not for rmse)."""
    why = available("torch", device)
    if why:
        raise Skip(why)
    from .timing import ew, ew_op
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    n = math.prod(shape)
    s = ITEMSIZE[dtype]
    if op == "rmse":
        if sets is not None:
            raise ValueError("rmse's calls make their own buffers: no shared sets")
        batches = n // (shape[0] if axis == 0 else math.prod(shape[1:]))
        rmse = ew().rmse

        def make_call():
            a = _full("torch", shape, dtype, device, 0.75)
            b = _full("torch", shape, dtype, device, 0.25)
            out = _empty("torch", (batches,), "float32", device)
            if axis is None:
                return lambda: rmse(a, b, out=out)
            return lambda: rmse(a, b, axis=axis, out=out)

        return make_call, 2 * n * s, 2 * n * s, 4 * batches
    fn, nin, nsc = ew_op(op)
    scalars = (1.0, 0.5)[:nsc]

    def bind(io):
        ins, out = io
        if op == "fill":
            return lambda: fn(out, *scalars)
        return lambda: fn(*ins, *scalars, out=out)

    make_call = set_maker(sets, partial(_op_set, "torch", op, shape, dtype, device), bind)
    return make_call, (nin + 1) * n * s, nin * n * s, n * s


FOREIGN = "torch.mul"   # the foreign kernel that peers' after_torch puts before each timed call


def foreign_call(dtype: str, shape, device: str):
    """(make_call, set_bytes) of the foreign kernel before each call in peers' after_torch:
    torch.mul(a, b, out=c) on buffers of the timed op's shape and dtype, a set of its own, random
    data: a memory-bound elementwise kernel of torch's, which never triggers the early launch of
    the kernel after it."""
    make_call, set_bytes, _, _ = elementwise_call("torch", "mul", dtype, shape, device)
    return make_call, set_bytes


# --- timing -------------------------------------------------------------------------------------

def time_calls(cfg: TimingConfig, impl: str, make_call, set_bytes: int, cache: str, *,
               samples: int | None = None, before=None, spin_us: float = SPIN_US) -> Timing:
    """Time a peer workload; make_call() allocates one buffer set and returns a zero-argument call.

    before: (make_before, before_bytes) from foreign_call, a foreign call put before each call
    (torch on a GPU, cache rotate): the samples are then the call's cost after it, (K pairs - K
    foreign calls alone) / K, with the medians of both graphs in Timing.extra. Every buffer set
    holds one of each, and there are enough sets that the foreign calls alone rotate through
    4x the cache, so neither graph finds its inputs in the cache."""
    if before is not None and (impl != "torch" or cfg.is_cpu or cache != "rotate"):
        raise ValueError(f"a foreign call before each call is timed for torch on a GPU with cache rotate, "
                         f"not {impl} on {cfg.device} with cache {cache}")
    nsets, notes = choose_sets(cfg, cache, set_bytes if before is None else before[1])
    working = nsets * (set_bytes if before is None else set_bytes + before[1])
    cfg.check_fits(working, "this measurement")
    calls = [make_call() for _ in range(nsets)]
    foreign = None if before is None else [before[0]() for _ in range(nsets)]
    n = samples or (cfg.flush_samples if cache == "flush" else cfg.samples)
    extra = {}
    late = (0, 0)    # samples taken again, samples still late (the GPU methods, behind the spin kernel)
    if impl == "numpy" or cfg.is_cpu:
        secs, k, method = _time_host(cfg, calls, cache, n)
    elif impl.startswith("torch"):
        secs, k, method, alone, late = _time_torch(cfg, calls, cache, n, foreign, spin_us)
        if foreign is not None:
            extra = {"foreign": FOREIGN, "pair_time_s": statistics.median(secs),
                     "foreign_time_s": statistics.median(alone), "pair_samples_s": secs,
                     "foreign_samples_s": alone}
            secs = [p - a for p, a in zip(secs, alone)]
            if not statistics.median(secs) > 0:
                raise Skip(f"the call after {FOREIGN} took no measurable time: the median pair "
                           f"({extra['pair_time_s'] * 1e6:.2f} us) is not above {FOREIGN} alone "
                           f"({extra['foreign_time_s'] * 1e6:.2f} us)")
    elif impl == "cupy":
        secs, k, method, late = _time_cupy(cfg, calls, cache, n)
    else:
        raise ValueError(f"unknown peer {impl!r}")
    if cache == "flush":
        method += _flush_words(cfg, torch_path=impl.startswith("torch") and not cfg.is_cpu)
    return Timing(secs, k, nsets, working, cache, method, list(notes) + late_notes(late), extra=extra)


def _between_call(cfg, torch, cache: str):
    """The untimed call queued after each single launch on torch's stream (cfg.single_between), or
    None: "mul" is torch.mul(a, b, out=c) on BETWEEN_ELEMENTS float32, its buffers allocated once a
    run."""
    if cache != "flush" or cfg.single_between == "none":
        return None
    if cfg.single_between != "mul":
        raise ValueError(f"single_between must be 'none' or 'mul', not {cfg.single_between!r}")
    bufs = cfg._flush.get("between")
    if bufs is None:
        bufs = cfg._flush["between"] = [torch.empty(BETWEEN_ELEMENTS, dtype=torch.float32, device=cfg.device)
                                        for _ in range(3)]
    a, b, c = bufs
    return lambda: torch.mul(a, b, out=c)


def _events_around(torch, queue):
    """launch() for queued_sample: queue() between two timing events, which it returns"""
    def launch():
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        queue()
        b.record()
        return a, b
    return launch


class _RmseFlush:
    """The torch methods' flush under cfg.flush_kind "rmse": the buffer read by one ewkern.rmse over
    its two halves (rows of 4096) into a preallocated result, on torch's current stream: one
    kernel, no allocation and no memset, where the flush "sum" is torch's reduction."""

    def __init__(self, torch, buf):
        half = buf.numel() // 2
        rows = max(1, half // 4096)
        cols = min(4096, half)
        self.a = buf[:rows * cols].view(rows, cols)
        self.b = buf[half:half + rows * cols].view(rows, cols)
        self.out = torch.empty(rows, dtype=torch.float32, device=buf.device)
        from .timing import ew
        self._rmse = ew().rmse

    def sum(self):
        self._rmse(self.a, self.b, out=self.out)


def _torch_flush(cfg, torch):
    """The flush of the torch methods, made once per config: flush.sum() reads cfg.flush_factor x
    the cache (cfg.flush_kind "sum": torch's sum of the buffer; "rmse": _RmseFlush)."""
    flush = cfg._flush.get("torch")
    if flush is None:
        buf = torch.empty(cfg.flush_factor * cfg.cache_bytes // 4, dtype=torch.float32,
                          device=torch.device(cfg.device))
        flush = cfg._flush["torch"] = _RmseFlush(torch, buf) if cfg.flush_kind == "rmse" else buf
    return flush


def _eager_reason(exc) -> str:
    """Why a torch method launches eagerly: _Eager's own reason, or the capture's failure."""
    if isinstance(exc, _Eager):
        return str(exc)
    return "graph capture failed: " + (f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                                       if str(exc) else type(exc).__name__)


class TogetherTooBig(Exception):
    """time_calls_in_turns: the ways' buffer sets together exceed the memory budget."""


class SharedSets:
    """Buffer sets that the ways of one cell share when they are timed in turns: the k-th call a
    way makes (its k-th make_call()) works on the k-th set, the same set every other way's k-th
    call gets. Where a set's buffers lie moves a short launch: on the H200, in one process and in
    turns, ewkern's and torch's copy and exp at 1 MiB in float32 read 0.99-1.01 on the same buffers
    and 0.92-1.10 on buffers of their own, and `peers` timed in turns on buffers of each way's own
    moved its 1-4 MiB single-launch ratios by up to 0.3 between processes (BENCHMARKS.md, 2026-11-27).
    make_set() -> one set (made when a way first asks for it, kept while this object lives)."""

    def __init__(self, make_set):
        self._make_set = make_set
        self._sets = []

    def maker(self, bind):
        """make_call for one way: each call of it takes the way's next set s and returns bind(s)."""
        taken = [0]

        def make_call():
            k = taken[0]
            if k == len(self._sets):
                self._sets.append(self._make_set())
            taken[0] += 1
            return bind(self._sets[k])
        return make_call


class ChainSets(SharedSets):
    """SharedSets in which every set but the first reads the set before's output as its first
    input, so that a graph of calls over the sets in order (time_calls' rotation) has each call
    read what the call before it wrote: a stream of dependent work, as a program's next op takes
    the last op's result. The first set keeps an input of its own (one call in each pass over the
    sets is not chained)."""

    def __init__(self, make_set):
        def chained():
            ins, out = make_set()
            return (self._sets[-1][1], *ins[1:]) if self._sets else tuple(ins), out
        super().__init__(chained)


def set_maker(sets: SharedSets | None, make_set, bind):
    """A way's make_call: bind(s) on the shared sets' next set, or without sets on a set of its own
    (make_set()) each call."""
    if sets is not None:
        return sets.maker(bind)
    return lambda: bind(make_set())


ORDERS = ("rotate", "alternate", "runs")   # time_calls_in_turns' orders of the ways' samples (_schedule)
# order "runs": a way's samples in runs of this many. The default for single launches: on both GPUs
# (2026-11-27), a series of single launches timed on torch's stream repeats a pattern of four
# samples, the four 0, +0.3, +0.38 and +1.07 us apart at every size from 1 MiB to 2 GiB (CuPy's
# path, with its own spin, flush and events, shows none). Rotating two ways (a b, b a, ...) gives
# one way phases 0 and 3 of it and the other phases 1 and 2, which way getting the slow one
# depending on where the process's count of samples stood: up to 0.25 between processes at 1 MiB.
# Runs of 8 give every way two of each phase, as 50 samples one after another do.
RUN_LENGTH = 8
# how time_calls_in_turns' default orders read in notes and summaries
TURNS_WORDS = (f"graphs: each sample takes every way once, the first rotating; single launches: runs of "
               f"{RUN_LENGTH} samples a way, the first way of each block of runs rotating")


def _schedule(order: str, first: int, samples: int, nways: int) -> list:
    """The ways' launches of samples first .. first + samples - 1, each way exactly samples times:
    "rotate" a b, b a, a b, ... (sample i's first way rotating by i); "alternate" a b, a b, ...;
    "runs" RUN_LENGTH samples of a, then as many of b, ..., the next block of runs starting with b
    (the last runs shorter)."""
    if order == "rotate":
        return [(i + j) % nways for i in range(first, first + samples) for j in range(nways)]
    if order == "alternate":
        return list(range(nways)) * samples
    if order == "runs":   # the first way of each block of runs rotating, so drift falls on all alike
        return [(w + first // RUN_LENGTH + r // RUN_LENGTH) % nways for r in range(0, samples, RUN_LENGTH)
                for w in range(nways) for _ in range(min(RUN_LENGTH, samples - r))]
    raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")


def time_calls_in_turns(cfg: TimingConfig, ways, cache: str, *, samples: int | None = None,
                        spin_us: float = SPIN_US, shared: bool = False, order: str | None = None,
                        between=None) -> list:
    """Time several ways of one workload (ways: [(make_call, set_bytes)], each launched on torch's
    current stream: torch, torch.compile, ewkern.torch) in turns, one Timing each: every sample of
    the run takes each way once (order, below: by default single launches in runs of RUN_LENGTH
    samples a way, graphs the first way of sample i rotating by i), so that what drifts over the
    seconds a cell takes (clocks, temperature, the memory's state) falls on every way alike, where
    time_calls would time one way's samples after the other's. cache "flush": one eager launch
    per sample behind the spin kernel and the flush, as time_calls; "rotate": each way's graph of K
    launches (K chosen per way), the graphs replayed in turns. Where capture fails, every way is
    launched eagerly behind the spin kernel. The host is kept within LAG_SAMPLES samples of the GPU.
    With cfg.flush_target > 0 (--flush-rounds), single launches (cache "flush", samples not given)
    are taken in rounds (timing.sample_rounds) until every way's median is known to
    +-cfg.flush_target, the spin after the first round SPIN_HOST_FACTOR x the host's queueing.
    shared: the ways' make_calls share their buffer sets (SharedSets: fresh makers, each way's k-th
    call on the k-th set), so the memory they need together is one way's. order (ORDERS, _schedule)
    and between (a call queued, untimed, after every sample, before the next sample's spin and
    flush; without it, single launches take cfg.single_between's) are for probing what a launch
    inherits from the kernels before it. On a CPU device:
    time_calls for each way in turn (order and between do not apply)."""
    if order is None:
        order = "runs" if cache == "flush" else "rotate"
    _schedule(order, 0, 0, 1)
    if cfg.is_cpu:
        return [time_calls(cfg, "torch", mc, sb, cache, samples=samples, spin_us=spin_us) for mc, sb in ways]
    import time
    import torch
    n = samples or (cfg.flush_samples if cache == "flush" else cfg.samples)
    adaptive = cache == "flush" and samples is None and cfg.flush_target > 0   # sample_rounds takes rounds
    plans = [choose_sets(cfg, cache, sb) for _, sb in ways]
    try:
        need = [ns * sb for (ns, _), (_, sb) in zip(plans, ways)]
        cfg.check_fits(max(need) if shared else sum(need), "these measurements together")
    except BenchError as exc:   # each may still fit alone: the caller times them one after another
        raise TogetherTooBig(str(exc)) from None
    calls = [[mc() for _ in range(ns)] for (mc, _), (ns, _) in zip(ways, plans)]
    lates = [[0, 0] for _ in ways]   # each way's samples taken again / still late
    with torch.cuda.device(torch.device(cfg.device)):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                for cs in calls:
                    for c in cs:
                        c()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        flush = _torch_flush(cfg, torch) if cache == "flush" else None
        after = between if between is not None else _between_call(cfg, torch, cache)
        spin = [spin_us]             # microseconds; shortened once, after the first round (SPIN_HOST_FACTOR)
        rounds = [0]                 # samples taken so far: which way goes first in the next

        def start():
            torch.cuda._sleep(int(spin[0] * 2000))   # cycles at ~2 GHz
            if flush is not None:
                flush.sum()

        def in_turns(queues, ks, samples, late):
            events = [[] for _ in queues]
            ends = []                # flush mode: every sample's end event, in the order queued
            host = []                # how long the host took to queue each sample (spin, flush, events, work)
            clock = adaptive and rounds[0] == 0   # only the first round of adaptive rounds sets the spin
            for w in _schedule(order, rounds[0], samples, len(queues)):
                if flush is not None and len(ends) >= LAG_SAMPLES:
                    ends[-LAG_SAMPLES].synchronize()
                t0 = time.perf_counter() if clock else 0.0
                events[w].append(queued_sample(start, _events_around(torch, queues[w]), lambda e: e.query(),
                                               late[w]))
                if clock:
                    host.append(time.perf_counter() - t0)
                ends.append(events[w][-1][1])
                if after is not None:
                    after()
            if clock:
                p90 = sorted(host)[(9 * len(host)) // 10] if host else 0.0
                spin[0] = min(spin_us, max(SPIN_FLOOR_US, SPIN_HOST_FACTOR * p90 * 1e6))
            rounds[0] += samples
            torch.cuda.synchronize()
            return [[a.elapsed_time(b) * 1e-3 / k for a, b in pairs] for pairs, k in zip(events, ks)]

        def capture(cs, k):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(k):
                    cs[i % len(cs)]()
            return g

        def eager(cs, k):
            def launch():
                for i in range(k):
                    cs[i % len(cs)]()
            return launch

        turns = f"{len(ways)} ways in turns, " + {"rotate": "the first rotating", "alternate": "in one order",
                                                  "runs": f"in runs of {RUN_LENGTH} samples"}[order]
        if between is not None:
            turns += ", another kernel after each sample"
        try:
            if cache == "flush":
                raise _Eager("flush mode: one eager launch per sample behind the spin kernel")
            # K per way as time_calls chooses it (the faster of two samples of its one-pass graph,
            # after one untimed replay); then each way's graph of K launches
            graphs, ks = [], []
            for cs in calls:
                g0 = capture(cs, len(cs))
                g0.replay()
                t0 = min(in_turns([g0.replay], [len(cs)], 2, [[0, 0]])[0])
                ks.append(choose_launches(t0, len(cs), cfg.min_sample_s))
                del g0
                graphs.append(capture(cs, ks[-1]))
                graphs[-1].replay()
            secs = in_turns([g.replay for g in graphs], ks, n, lates)
            method = f"CUDA events around replayed CUDA graphs ({turns}, torch.cuda.CUDAGraph)"
        except Exception as exc:
            torch.cuda.synchronize()
            reason = _eager_reason(exc)
            ks = [1 if cache == "flush" else max(len(cs), 8) for cs in calls]
            queues = [eager(cs, k) for cs, k in zip(calls, ks)]
            secs = sample_rounds(cfg, lambda m: in_turns(queues, ks, m, lates), n, fixed=not adaptive)
            method = f"CUDA events around eager launches behind a spin kernel ({turns}; {reason})"
    rounds_note = []
    if cache == "flush":
        method += _flush_words(cfg, torch_path=True)
        if len(secs[0]) > n:
            rounds_note = [f"{len(secs[0])} samples, in rounds until each way's median was known to "
                           f"+-{cfg.flush_target:.2%} (90%) or {cfg.flush_cap} samples or {cfg.flush_budget_s:g} s; "
                           f"spin {spin[0]:.0f} us after the first round ({SPIN_HOST_FACTOR:g}x the host's "
                           f"90th-percentile queueing of a sample)"]
    return [Timing(sc, k, ns, ns * sb, cache, method, list(notes) + rounds_note + late_notes(late))
            for sc, k, (ns, notes), (_, sb), late in zip(secs, ks, plans, ways, lates)]


def late_notes(late) -> list:
    """The notes for late[0] samples taken again because the host queued them after the spin kernel
    had ended, and late[1] samples still late after LATE_TRIES tries (kept: their times include the
    host's)."""
    out = []
    if late[0]:
        out.append(f"{late[0]} samples taken again: the host queued them after the spin kernel had ended")
    if late[1]:
        out.append(f"{late[1]} samples still queued late after {LATE_TRIES} tries: their times include the host's")
    return out


def queued_sample(start, launch, done, late) -> tuple:
    """One sample behind the spin kernel: start() queues the spin (and flush), launch() the timed
    work between two events and returns them, done(first_event) says whether that event had already
    fired when the work was queued. Returns the events; adds the tries taken again to late[0] and
    a sample still late after LATE_TRIES tries to late[1]."""
    for k in range(LATE_TRIES):
        start()
        ev = launch()
        if not done(ev[0]):
            break
        if k == LATE_TRIES - 1:
            late[1] += 1
        else:
            late[0] += 1
    return ev


class _Eager(Exception):
    """Internal: time eager launches rather than a graph (flush mode)."""


def _time_host(cfg, calls, cache, n):
    import time
    import numpy
    for c in calls:
        c()
    if cache == "flush":
        buf = cfg._flush.get("numpy")
        if buf is None:
            buf = cfg._flush["numpy"] = numpy.zeros(cfg.flush_factor * cfg.cache_bytes // 4, numpy.float32)
        out = []
        for i in range(n):
            buf.fill(i)
            t0 = time.perf_counter()
            calls[0]()
            out.append(time.perf_counter() - t0)
        return out, 1, "host clock (time.perf_counter)"
    t0 = time.perf_counter()
    for c in calls:
        c()
    k = choose_launches((time.perf_counter() - t0) / len(calls), len(calls), cfg.min_sample_s)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        for i in range(k):
            calls[i % len(calls)]()
        out.append((time.perf_counter() - t0) / k)
    return out, k, "host clock (time.perf_counter)"


def _time_torch(cfg, calls, cache, n, foreign=None, spin_us=SPIN_US):
    """(seconds per step, one per sample; K; method; the foreign calls' own samples or None).

    A step is one call, or with foreign the pair foreign[i], calls[i]; then a graph of the K
    foreign calls alone, same K and buffers, is replayed in turns with the pairs' graph."""
    import torch
    device = torch.device(cfg.device)
    steps = [calls] if foreign is None else [foreign, calls]   # what step i calls, in order
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                for i in range(len(calls)):
                    for seq in steps:
                        seq[i]()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        flush = _torch_flush(cfg, torch) if cache == "flush" else None
        between = _between_call(cfg, torch, cache)
        spin = int(spin_us * 2000)   # cycles at ~2 GHz; only has to outlast the host's queueing

        def capture(k, seqs=steps):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(k):
                    for seq in seqs:
                        seq[i % len(seq)]()
            return g

        late = [0, 0]

        def start():
            torch.cuda._sleep(spin)
            if flush is not None:
                flush.sum()

        def timed(queues, k, samples):
            """Seconds per step of each queue, the queues taking turns: each sample is
            [spin] [flush] ev0 queue() ev1 [between], k steps (taken again when queued late)."""
            events = [[] for _ in queues]
            for _ in range(samples):
                for queue, pairs in zip(queues, events):
                    pairs.append(queued_sample(start, _events_around(torch, queue), lambda e: e.query(), late))
                    if between is not None:
                        between()
            torch.cuda.synchronize()
            return [[a.elapsed_time(b) * 1e-3 / k for a, b in pairs] for pairs in events]

        def run(graphs, k, samples):
            for g in graphs:
                g.replay()
            return timed([g.replay for g in graphs], k, samples)

        def split(per_queue):
            """(the calls' or pairs' samples, the foreign calls' alone or None)"""
            return per_queue[0], (None if foreign is None else per_queue[1])

        what = "" if foreign is None else f"K ({FOREIGN}, call) pairs and K {FOREIGN} alone in turns, "
        reason = None
        try:
            if cache == "flush":
                # one launch per sample: a graph launch would add its own start-up to the timed
                # region, so launch eagerly (the spin kernel already hides the host), as time_plans does
                raise _Eager("flush mode: one eager launch per sample behind the spin kernel")
            g0 = capture(len(calls))
            k = choose_launches(min(run([g0], len(calls), 2)[0]), len(calls), cfg.min_sample_s)
            del g0
            graphs = [capture(k)] + ([] if foreign is None else [capture(k, [foreign])])
            secs, alone = split(run(graphs, k, n))
            return secs, k, f"CUDA events around a replayed CUDA graph ({what}torch.cuda.CUDAGraph)", alone, late
        except Exception as exc:   # capture refused: time eager launches behind the spin instead
            torch.cuda.synchronize()
            reason = _eager_reason(exc)
            k = 1 if cache == "flush" else max(len(calls), 8)

            def queue(seqs):
                def launch():
                    for i in range(k):
                        for seq in seqs:
                            seq[i % len(seq)]()
                return launch
            queues = [queue(steps)] + ([] if foreign is None else [queue([foreign])])
            secs, alone = split(timed(queues, k, n))
            return secs, k, f"CUDA events around eager launches behind a spin kernel ({what}{reason})", alone, late


_CUPY_SPIN = {}


def _cupy_spin():
    if "k" not in _CUPY_SPIN:
        import cupy
        try:
            _CUPY_SPIN["k"] = cupy.RawKernel(r'''
extern "C" __global__ void ewbench_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}''', "ewbench_spin")
        except Exception:
            _CUPY_SPIN["k"] = None
    return _CUPY_SPIN["k"]


def _time_cupy(cfg, calls, cache, n):
    import cupy
    import numpy
    with cupy.cuda.Device(_index(cfg.device)):
        stream = cupy.cuda.Stream(non_blocking=True)
        spin = _cupy_spin()
        flush = None
        if cache == "flush":
            flush = cfg._flush.get("cupy")
            if flush is None:
                flush = cfg._flush["cupy"] = cupy.zeros(cfg.flush_factor * cfg.cache_bytes // 4, cupy.float32)
        with stream:
            for _ in range(2):
                for c in calls:
                    c()
            stream.synchronize()

            def capture(k):
                stream.begin_capture()
                try:
                    for i in range(k):
                        calls[i % len(calls)]()
                finally:
                    g = stream.end_capture()
                return g

            def launch_graph(g, k):
                g.launch(stream)

            def launch_eager(_g, k):
                for i in range(k):
                    calls[i % len(calls)]()

            late = [0, 0]

            def start():
                if spin is not None:
                    spin((1,), (1,), (numpy.int64(int(SPIN_US * 2000)),))
                if flush is not None:
                    flush.sum()

            def run(g, k, samples, launch):
                launch(g, k)
                pairs = []

                def between():
                    a, b = cupy.cuda.Event(), cupy.cuda.Event()
                    a.record(stream)
                    launch(g, k)
                    b.record(stream)
                    return a, b
                for _ in range(samples):
                    # without a spin kernel (no NVRTC) nothing holds the stream: no sample is late
                    pairs.append(queued_sample(start, between, lambda e: spin is not None and e.done, late))
                stream.synchronize()
                return [cupy.cuda.get_elapsed_time(a, b) * 1e-3 / k for a, b in pairs]

            method = "CUDA events around a replayed CUDA graph (CuPy stream capture)"
            try:
                if cache == "flush":
                    raise _Eager("flush mode: one eager launch per sample behind the spin kernel")
                else:
                    g0 = capture(len(calls))
                    k = choose_launches(min(run(g0, len(calls), 2, launch_graph)), len(calls),
                                        cfg.min_sample_s)
                g = capture(k)
                secs = run(g, k, n, launch_graph)
            except Exception as exc:
                stream.synchronize()
                k = 1 if cache == "flush" else max(len(calls), 8)
                secs = run(None, k, n, launch_eager)
                why = str(exc) if isinstance(exc, _Eager) else f"graph capture failed: {type(exc).__name__}"
                method = f"CUDA events around eager launches behind a spin kernel ({why})"
            if spin is None:
                method += " (no spin kernel: NVRTC unavailable)"
            return secs, k, method, late
