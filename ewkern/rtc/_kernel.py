"""ewkern.ElementwiseKernel and ewkern.ReductionKernel: CuPy's user-defined kernels on any
DLPack arrays, compiled at run time (NVRTC for CUDA arrays, the system C++ compiler for CPU
arrays). See the class docstrings."""
from __future__ import annotations

import ctypes
import math
import os
import struct
from struct import pack_into as _pack_into, unpack_from as _unpack_from
import sys
import threading
from typing import Any, Callable

import numpy as np

from . import _build, _codegen
from ._params import DTYPES, EWKERN_DTYPES, Param, decide_types, parse_params

# the scalars a kernel takes for a parameter: Python's numbers and NumPy's bool and number types,
# each named (np.generic also holds np.str_, np.bytes_ and np.datetime64, and np.timedelta64 is an
# np.signedinteger: not numbers, _Call refuses them); complex ones are refused by _scalar_value
_SCALARS = (bool, int, float, np.bool_) + tuple(sorted(
    {np.dtype(c).type for c in np.typecodes["AllFloat"] + np.typecodes["AllInteger"]}, key=lambda t: t.__name__))
_SCALAR_TYPE: dict = {}   # type -> whether its instances are _SCALARS (asked once a type)


def _is_scalar(o) -> bool:
    """isinstance(o, _SCALARS), decided once a type: against those 21 types isinstance cost about
    1 us a torch tensor (each type's check asks the tensor's __class__); csrc/rtc.c's warm path
    decides alike (rtc_is_scalar)."""
    t = type(o)
    r = _SCALAR_TYPE.get(t)
    if r is None:
        r = _SCALAR_TYPE[t] = issubclass(t, _SCALARS)
    return r


_STORAGE_NP = {"bool": np.bool_, "float16": np.uint16, "bfloat16": np.uint16}
_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool, "signed char": ctypes.c_byte,
           "short": ctypes.c_short, "int": ctypes.c_int, "long long": ctypes.c_longlong,
           "unsigned char": ctypes.c_ubyte, "unsigned short": ctypes.c_ushort, "unsigned int": ctypes.c_uint,
           "unsigned long long": ctypes.c_ulonglong}
GIL_FREE_WORK = 1 << 16
# elementwise CPU kernels: every core from this many elements, as ewkern's own cheap ops
# (EW_PAR_MIN_CHEAP in csrc/cpu/elementwise.c); 2 cores here, z = x + y / exp(x) at 2^15 elements:
# 3.7 / 6.1 us on two threads against 4.2 / 9.1 on one (csrc/cpu/CPU_NOTES.md)
CPU_PAR_MIN_ELEMENTWISE = 1 << 15
FALLBACK_BLOCK = 256
_AUTO_BLOCK = 256   # the default path's block (kAutoBlock in csrc/cuda/elementwise_launch.cuh)


def _C() -> Any:
    global _C_mod
    from .. import _C as c
    _C_mod = c
    return c


_C_mod: Any = None


# ---- operands ---------------------------------------------------------------------------------

class _Arr:
    """An array argument: logical dtype, shape, byte strides, data pointer, and for the CPU a
    NumPy view of its storage (16-bit floats as uint16)."""
    __slots__ = ("obj", "dtype", "shape", "strides", "ptr", "np", "device")

    def __init__(self, obj: Any, dtype: str, shape: Any, strides: Any, ptr: int, npv: Any, device: str) -> None:
        self.obj, self.dtype, self.shape, self.strides, self.ptr, self.np, self.device = \
            obj, dtype, tuple(shape), tuple(strides), ptr, npv, device

    def contiguous(self) -> bool:
        expect = DTYPES[self.dtype][2]
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True


_NP_NAMES: dict = {}


def _np_dtype_name(dt: np.dtype) -> str | None:
    name = _NP_NAMES.get(dt)
    if name is None:
        name = dt.name if dt.name in DTYPES and dt.isnative else ""
        _NP_NAMES[dt] = name
    return name or None


def _device_of(obj, kernel: str, what: str) -> str:
    if isinstance(obj, np.ndarray):
        return "cpu"
    try:
        t, i = obj.__dlpack_device__()
    except AttributeError:
        raise TypeError(f"{kernel}: {what} must be an array (a DLPack producer: numpy, torch, CuPy, ewkern) or a "
                        f"scalar, got {type(obj).__name__}") from None
    t = int(t)
    if t in (1, 3):   # kDLCPU, kDLCUDAHost
        return "cpu"
    if t in (2, 13):  # kDLCUDA, kDLCUDAManaged
        return f"cuda:{int(i)}"
    raise ValueError(f"{kernel}: {what} is on DLPack device type {t}; ewkern runs kernels on cpu and cuda arrays")


def _c_strides(shape, item):
    st, acc = [], item
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def _refuse_neg_bit(obj, kernel: str, what: str) -> None:
    """A torch tensor with the negative bit holds -x in memory and torch's DLPack export drops the
    bit: it would be read, or written, with the wrong sign. Refused by the kernel's and the
    parameter's name on either device (ewkern's C import refuses it alike, naming the parameter
    alone, so the CUDA path asks here first)."""
    is_neg = getattr(obj, "is_neg", None)
    if is_neg is not None and callable(is_neg) and is_neg():
        raise ValueError(f"{kernel}: {what} is a torch tensor with the negative bit (torch._neg_view, the "
                         "imaginary part of a real tensor's conj()), which holds -x in memory and whose DLPack "
                         f"export drops the bit; pass {what}.resolve_neg()")


def _cpu_arr(obj, kernel: str, what: str) -> _Arr:
    arr = None
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        if getattr(obj, "requires_grad", False):   # torch exports no tensor that requires grad
            obj = obj.detach()
        _refuse_neg_bit(obj, kernel, what)
        try:
            arr = np.from_dlpack(obj)
        except (BufferError, TypeError, ValueError, RuntimeError, AttributeError):
            arr = None
    if arr is not None:
        dt = _np_dtype_name(arr.dtype)
        if dt is None:
            raise TypeError(f"{kernel}: {what} has dtype {arr.dtype}, which run-time kernels do not take "
                            f"(expected one of {', '.join(DTYPES)})")
        npv = arr.view(_STORAGE_NP.get(dt, arr.dtype)) if dt in _STORAGE_NP else arr
        ptr = arr.__array_interface__["data"][0]
        return _Arr(obj, dt, arr.shape, arr.strides, ptr, npv, "cpu")
    if type(obj).__module__.split(".")[0] == "torch" and str(getattr(obj, "dtype", "")) == "torch.bfloat16":
        # NumPy does not take bfloat16: its bits as int16, any strides
        bits = np.from_dlpack(obj.view(sys.modules["torch"].int16)).view(np.uint16)
        return _Arr(obj, "bfloat16", bits.shape, bits.strides, bits.__array_interface__["data"][0], bits, "cpu")
    # NumPy does not take it (bfloat16): ewkern's own DLPack import, C-contiguous
    (view,), _ = _C()._rtc_views((obj,), (what,))
    ptr, dt, _dev, shape, _ro = view
    item = DTYPES[dt][2]
    n = math.prod(shape)
    npt = _STORAGE_NP.get(dt, np.dtype(DTYPES[dt][4]))
    if n:
        buf = (ctypes.c_char * (n * item)).from_address(ptr)
        npv = np.frombuffer(buf, dtype=npt).reshape(shape)
    else:
        npv = np.empty(shape, dtype=npt)
    return _Arr(obj, dt, shape, _c_strides(shape, item), ptr, npv, "cpu")


def _cpu_copy(a: _Arr) -> _Arr:
    c = np.ascontiguousarray(a.np).copy() if a.np.flags.c_contiguous else np.ascontiguousarray(a.np)
    return _Arr(c, a.dtype, c.shape, c.strides, c.__array_interface__["data"][0], c, "cpu")


def _cuda_arrs(objs, names, readonly: list | None = None) -> tuple[list[_Arr], int]:
    """C-contiguous views of objs and the stream to launch on; readonly, when given, receives
    each view's read-only flag."""
    views, stream = _C()._rtc_views(tuple(objs), tuple(names))
    out = []
    for obj, (ptr, dt, dev, shape, ro) in zip(objs, views):
        out.append(_Arr(obj, dt, shape, _c_strides(shape, DTYPES[dt][2]), ptr, None, dev))
        if readonly is not None:
            readonly.append(ro)
    return out, stream


def _round_bf16(x: float) -> float:
    try:
        (u,) = struct.unpack("<I", struct.pack("<f", x))
    except OverflowError:   # past float32's range, so past bfloat16's: its infinity, as float16's and
        return math.copysign(math.inf, x)   # float32's parameters take it (not an OverflowError)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return x
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def _scalar_value(x, dt: str, kernel: str, name: str):
    """x converted to parameter type dt (CuPy converts scalars to their parameter's type), as the
    compute-type value the kernel receives; OverflowError or ValueError naming the kernel and the
    parameter where it does not fit an integer type."""
    if isinstance(x, (complex, np.complexfloating)):
        raise TypeError(f"{kernel}: {name} is complex; run-time kernels take real scalars")
    info = DTYPES[dt]
    try:
        if dt == "bfloat16":
            return _round_bf16(float(x))
        if info[3] in "iu":
            # NumPy's assignment, as CuPy's CScalar (PyArray_Pack; NEP 50): a value out of the
            # type's range (an int, or a float after truncation) or a NaN or infinity raises rather
            # than wrapping as a cast would
            v = np.empty((), info[4])
            v[()] = x
            return v.item()
        with np.errstate(all="ignore"):
            v = np.array(x).astype(info[4])
    except (OverflowError, ValueError) as e:
        r = repr(x)
        r = r if len(r) <= 40 else r[:37] + "..."
        raise type(e)(f"{kernel}: scalar {name} = {r} does not fit the parameter's type {dt} ({e})") from None
    if dt == "float16":
        return float(v.astype(np.float32))
    return v.item()


def _wrap_like(like, arr):
    """A NumPy (or ewkern) result handed over in like's framework where that is torch."""
    if like is not None and type(like).__module__.split(".")[0] == "torch":
        return sys.modules["torch"].from_dlpack(arr)
    return arr


def _alloc_cpu(like, dt: str, shape):
    if dt in EWKERN_DTYPES:
        if like is not None:
            try:
                return _C()._rtc_result(like, dt, tuple(shape))
            except (ValueError, TypeError):   # like is not C-contiguous, or of a dtype ewkern cannot hold
                pass                          # (an integer input): allocate apart, hand over in its framework
        if like is None or isinstance(like, np.ndarray):
            return _C()._rtc_result(np.empty(0, np.float32), dt, tuple(shape))
        from .. import empty
        return _wrap_like(like, empty(tuple(shape), dt, device="cpu"))
    return _wrap_like(like, np.empty(shape, dtype=DTYPES[dt][4]))


def _overlaps(a: _Arr, b: _Arr) -> bool:
    if a.np is not None and b.np is not None:
        return np.may_share_memory(a.np, b.np)
    return False


def _ranges_overlap(a: _Arr, b: _Arr) -> bool:
    """Whether two C-contiguous views' byte ranges intersect."""
    na, nb = math.prod(a.shape) * DTYPES[a.dtype][2], math.prod(b.shape) * DTYPES[b.dtype][2]
    return bool(na and nb) and a.ptr < b.ptr + nb and b.ptr < a.ptr + na


def _same_view(a: _Arr, b: _Arr) -> bool:
    return a.ptr == b.ptr and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype


def _copy_overlapping_inputs(call, in_params, out_params) -> None:
    """Inputs that overlap an output are read from a copy, as NumPy's ufuncs read them. The very
    same view of a non-raw input as a non-raw output is not copied (element i reads element i
    before it is written: in place); a raw input, or a raw output, may be indexed anywhere, so
    even the same view is copied. CUDA views are C-contiguous, so there overlap is a byte-range
    test and the copy ewkern.copy's."""
    overlap = _overlaps if call.device == "cpu" else _ranges_overlap
    for k, v in enumerate(call.ins):
        if not isinstance(v, _Arr):
            continue
        raw = in_params[k].raw
        if not any(overlap(v, o) and (raw or p.raw or not _same_view(v, o)) for o, p in zip(call.outs, out_params)):
            continue
        if call.device == "cpu":
            call.ins[k] = _cpu_copy(v)
        else:
            from .. import copy as _ewcopy
            (call.ins[k],), _ = _cuda_arrs([_ewcopy(v.obj)], [in_params[k].name])


def _copy_back_raw(call, in_params, given_ins, operation: str) -> None:
    """Raw inputs the call ran on a copy of (not C-contiguous on the CPU, or overlapping an
    output) copied back into the caller's arrays, where the operation may write them: a raw
    parameter is writable (CuPy's are), and its writes must not be lost with the copy."""
    for k, (p, given) in enumerate(zip(in_params, given_ins)):
        used = call.ins[k]
        if not p.raw or used is given or not _codegen.may_write_raw(operation, p.name):
            continue
        if call.device == "cpu":
            if given.np.flags.writeable:   # a read-only array is not written (its copy was)
                np.copyto(given.np, used.np)
        else:
            from ._rowkernel import _broadcast_copy
            _broadcast_copy()(used.obj, given.obj)


def _broadcast_strides(a: _Arr, shape) -> tuple[int, ...]:
    nd = len(shape)
    pad = nd - len(a.shape)
    st = []
    for d in range(nd):
        if d < pad:
            st.append(0)
        else:
            n, s = a.shape[d - pad], a.strides[d - pad]
            st.append(0 if (n == 1 and shape[d] != 1) else s)
    return tuple(st)


# ---- the argument struct ----------------------------------------------------------------------

_struct_cache: dict[Any, type] = {}


def _ctypes_struct(layout: _codegen.Layout):
    key = layout.key()
    cls = _struct_cache.get(key)
    if cls is None:
        fields = []
        for ctype, name, code, count in layout.fields():
            t: Any
            if code == "q":
                t = ctypes.c_longlong
            elif code == "P":
                t = ctypes.c_void_p
            else:
                t = _CTYPES[ctype]
            fields.append((name, t * count if count else t))
        cls = type("ewrtc_params", (ctypes.Structure,), {"_fields_": fields})
        _struct_cache[key] = cls
    return cls


def _fill(layout: _codegen.Layout, size: int, shape, values: dict, head: int = 0):
    """values: name -> _Arr (strides already for `shape`), scalar value, or _Arr for raw; head:
    for a 'vector' layout, the element the array pointers start at."""
    S = _ctypes_struct(layout)()
    S.size = size
    if layout.mode == "vector":
        S.head, S.nfast = head, size - head
    shp = tuple(shape) if shape else (1,)
    for d, n in enumerate(shp):
        S.shape[d] = n
    for p, dt, kind, rnd in layout.args:
        v = values[p.name]
        if kind == "scalar":
            setattr(S, "s_" + p.name, v)
        elif kind in ("array", "bcol", "brow", "bone", "colsum"):
            a, strides = v
            setattr(S, "p_" + p.name, a.ptr + (head * DTYPES[dt][2] if kind == "array" else 0))
            if layout.mode == "strided":
                st = getattr(S, "st_" + p.name)
                for d, s in enumerate(strides if strides else (0,)):
                    st[d] = s
        else:
            setattr(S, "p_" + p.name, v.ptr)
            setattr(S, "n_" + p.name, math.prod(v.shape))
            shp_f = getattr(S, "shp_" + p.name)
            for d, n in enumerate(v.shape):
                shp_f[d] = n
    return S


def _threads(work: int, floor: int | None = None) -> int:
    """Threads of a CPU call: every core from floor work items (default: past GIL_FREE_WORK)."""
    return (os.cpu_count() or 1) if work >= (GIL_FREE_WORK + 1 if floor is None else floor) else 1


# ---- device facts and loaded GPU kernels ------------------------------------------------------

_dev_lock = threading.Lock()
_dev_facts: dict[str, tuple[tuple[int, int], int]] = {}
_gpu_kernels: dict[tuple[int, str, int], int] = {}


_sm_facts: dict[str, tuple[int, float]] = {}


def _device_facts(device: str) -> tuple[tuple[int, int], int]:
    with _dev_lock:
        f = _dev_facts.get(device)
        if f is None:
            from .. import device_info
            info = device_info(device)
            f = (tuple(info["compute_capability"]), int(info["sm_count"]))
            _dev_facts[device] = f
        return f


def _sm_bandwidth(device: str) -> tuple[int, float]:
    """(threads an SM holds at most, GB/s of memory an SM by the formula) of a CUDA device."""
    with _dev_lock:
        f = _sm_facts.get(device)
        if f is None:
            from .. import device_info
            info = device_info(device)
            f = (int(info["max_threads_per_sm"]), float(info["peak_bandwidth_gbs"] or 0) / int(info["sm_count"]))
            _sm_facts[device] = f
        return f


def _gpu_kernel(kernel: str, source: str, entry: str, device: str, parts, options) -> int:
    cc, _ = _device_facts(device)
    image, kind, _ = _build.compile_cuda(kernel, source, cc, parts=parts, options=options)
    dev = int(device.split(":")[1])
    key = (id(image), entry, dev)
    with _dev_lock:
        h = _gpu_kernels.get(key)
        if h is None:
            h = _C()._rtc_load(image, entry, dev)
            _gpu_kernels[key] = h
        return h


# The built-in ops' `wide` case of the launch rule (a programmatic launch at 2-4 waves: 4 vectors a
# thread, no L2 prefetch; H200 16 MiB single launch, add/mul 0.98 -> 1.00, copy/neg/exp 0.98-1.00 ->
# 1.03-1.04) for run-time kernels too, on devices whose memory moves >= WIDE_SM_GBS an SM (the
# H200): off. Measured on the H200 (93b887f, scripts/speed_probe.py rtc, which compares both in one
# run): at 16 MiB it gained about 1% single launch in float32 and lost 5-8% back-to-back, and
# bfloat16 lost 1.3-2.4x (its 4-vector forms spilled then, held as 16-bit values); at 64 MiB within
# 0.006. Again with bfloat16 held as 32-bit words (_codegen's ewrtc::Held; 1386ee4, H200): bfloat16
# as float32, 5% slower back-to-back and 0.6-1.3% faster single launch at 16 MiB. The rule's other
# half on such a device, no first-wave prefetch past half a wave, applies to run-time kernels
# whatever RTC_WIDE (the C plan asks the device; float64 math keeps the prefetch).
RTC_WIDE = False
WIDE_SM_GBS = 30.0


class _VectorKernel:
    """The four forms of a vector_source kernel loaded on one device (VECTOR_FORMS order) and
    the waves its launch rule needs, asked once per block size; max_vpt: the most vectors a
    thread of the forms that do not spill (their resource report's local memory), which the launch
    rule may not exceed. ptxas had spilled bfloat16's 4-vector forms even under __maxnreg__(64)
    (`o = a * b + c`: 404 bytes; 788 under __launch_bounds__(1024)), and the H200 ran that form
    2.3-2.4x slower than the 1-vector one where the plan took it (the `wide` case). Since bfloat16
    vectors are held as 32-bit words (_codegen's ewrtc::Held) those forms do not spill; the cap stays
    for a user's expression that does."""
    __slots__ = ("handles", "device", "dev", "sms", "waves", "heavy", "max_vpt")

    def __init__(self, handles, device: str, heavy: bool, local):
        """local: each form's local memory bytes a thread (its resource report)."""
        self.handles, self.device, self.heavy = handles, device, heavy
        self.dev = int(device.split(":")[1])
        self.sms = _device_facts(device)[1]
        self.waves: dict[int, tuple[int, int]] = {}
        self.max_vpt = 4 if not local[2] else 2 if not local[1] else 1   # forms 1, 2, 4 vectors a thread

    def launch_plan(self, n: int, head: int, E: int, block: int, pdl: bool) -> tuple[int, int, int]:
        """(kernel handle, grid, prefetch) of a launch over n elements from head, by the default
        path's launch rule (a function of these and the device: a plan keeps it)."""
        C = _C()
        w = self.waves.get(block)
        if w is None:
            w1 = self.sms * C._rtc_occupancy(self.handles[0], block, self.dev) * block
            w4 = self.sms * C._rtc_occupancy(self.handles[2], block, self.dev) * block * 4
            w = self.waves[block] = (w1, w4)
        nfast = n - head
        nvec = nfast // E
        nedge = head + nfast - nvec * E
        # every index formed fits in 32 bits (as auto's: n + nvec + 8 blocks of elements)
        i32 = n + nvec + 8 * block * E < 2**31 - 1
        wide = pdl and RTC_WIDE and _sm_bandwidth(self.device)[1] >= WIDE_SM_GBS
        vpt, grid, prefetch = C._rtc_plan(self.dev, nvec, nedge, block, w[0], w[1], i32, self.heavy, E, pdl, wide,
                                          self.max_vpt)
        h = self.handles[{1: 0, 2: 1, 4: 2}[vpt]] if i32 else self.handles[3]
        return h, grid, prefetch

    def runner(self, n: int, head: int, E: int, block: int, prefetch_offset: int,
               nbytes: int, out_bytes: int) -> Callable[[bytearray, int], None]:
        """run(buf, stream): launch over n elements from head with the argument struct's bytes,
        its prefetch field (at prefetch_offset) set for the launch and the wb field after it (the
        vector layout's fields, _codegen.Layout) by the default path's store rule for a launch that
        moves nbytes and writes out_bytes of them; the launch plan of either PDL setting is made
        once. run.prog: the same launch as data (_PROG_LAUNCH)."""
        from .. import pdl_enabled
        C = _C()
        dev, launch = self.dev, C._rtc_launch
        wb = int(C._rtc_store_wb(dev, nbytes, out_bytes))
        plans = {pdl: self.launch_plan(n, head, E, block, pdl) for pdl in (False, True)}

        def run(buf: bytearray, stream: int) -> None:
            pdl = bool(pdl_enabled())
            lp = plans[pdl]
            _pack_into("qq", buf, prefetch_offset, lp[2], wb)
            launch(lp[0], lp[1], block, buf, dev, stream, pdl)
        off, on = plans[False], plans[True]
        run.prog = (_PROG_LAUNCH, dev, block, off[1], off[2], off[0], on[1], on[2], on[0],  # type: ignore[attr-defined]
                    prefetch_offset, prefetch_offset + 8, wb)
        return run


def _vector_kernel(kernel: str, source: str, entries, device: str, parts, options, heavy: bool,
                   twin: Callable[[], str] | None = None) -> _VectorKernel:
    """The forms of a vector_source kernel loaded on device. twin() gives the same source under
    __maxnreg__(64): under __launch_bounds__(1024) ptxas fits some forms into 32 registers by
    spilling (sm_90, float64: `o = exp(a)` at 1 and 2 vectors a thread 12-16 bytes, `o = 1.0 /
    (1.0 + exp(-a))` at 2 24 bytes; under __maxnreg__(64) 26-31 registers, none), as it did the
    built-in ops (ew_fast_r, 5cd9c75: float64 exp and sigmoid at 1 vector a thread single launch
    0.93-0.99 -> 0.98-1.06 of torch). A form that reports local memory takes the twin's where that
    reports less (a NVRTC without __maxnreg__, before CUDA 12.4, keeps the first)."""
    cc, _ = _device_facts(device)
    dev = int(device.split(":")[1])
    C = _C()

    def load(src: str) -> list[int]:
        image, _, _ = _build.compile_cuda(kernel, src, cc, parts=parts, options=options)
        hs = []
        with _dev_lock:
            for entry in entries:
                key = (id(image), entry, dev)
                h = _gpu_kernels.get(key)
                if h is None:
                    h = _gpu_kernels[key] = C._rtc_load(image, entry, dev)
                hs.append(h)
        return hs
    handles = load(source)
    local = [C._rtc_attrs(h, dev)[1] for h in handles]
    if twin is not None and any(local):
        try:
            bounded = load(twin())
        except RuntimeError:
            bounded = []
        for k, h in enumerate(bounded):
            if local[k]:
                twin_local = C._rtc_attrs(h, dev)[1]
                if twin_local < local[k]:
                    handles[k], local[k] = h, twin_local
    return _VectorKernel(tuple(handles), device, heavy, local)


def _broadcast_kind(a: _Arr, strides, shape) -> str | None:
    """How input a covers a loop of rows of shape[-1] elements: 'array' (dense over the loop),
    'bcol' (one row, repeated), 'brow' (one element per row), 'bone' (one element), or None."""
    item = DTYPES[a.dtype][2]
    lead = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    if _dense(strides, shape, item):
        return "array"
    if all(s == 0 for _, s in lead):
        if strides[-1] == item:
            return "bcol"
        if strides[-1] == 0:
            return "bone"
        return None
    if strides[-1] == 0 and _dense(strides[:-1], shape[:-1], item):
        return "brow"
    return None


def _broadcast_layout(largs, values, shape, cpu: bool = False):
    """largs with the broadcast inputs given their kind, when the default path's body can run the
    loop as rows of shape[-1] elements: every output and every non-broadcast input dense, every
    dense or 'bcol' array 16-byte aligned at its start, and a row a whole number of vectors; else
    None (the strided kernel). cpu: for the CPU's rows form, which has no vectors (no alignment
    or row-length condition) and no raw parameters."""
    if len(shape) < 2 or shape[-1] < 2:
        return None
    out, vec = [], []
    for p, dt, kind, rnd in largs:
        if kind != "array":
            out.append((p, dt, kind, rnd))
            continue
        a, strides = values[p.name]
        k = _broadcast_kind(a, strides, shape)
        if k is None or (p.is_output and k != "array"):
            return None
        if k in ("array", "bcol"):
            vec.append(a)
        out.append((p, dt, k, rnd))
    if not any(k == "array" for _, _, k, _ in out) or all(k == "array" for _, _, k, _ in out if k != "scalar"):
        return None
    if cpu:
        return None if any(k == "raw" for _, _, k, _ in out) else out
    E = 16 // max(DTYPES[a.dtype][2] for a in vec)
    if shape[-1] % E or _vector_head(vec, E) != 0:
        return None
    return out


def _vector_head(arrs, E: int) -> int | None:
    """The first element index h < E at which every array's vector of E elements is aligned to
    its own size (E x itemsize bytes), or None."""
    for h in range(E):
        if all((a.ptr + h * DTYPES[a.dtype][2]) % (E * DTYPES[a.dtype][2]) == 0 for a in arrs):
            return h
    return None


def _gpu_runner(handle: int, grid: int, block: int, device: str) -> Callable[[bytearray, int], None]:
    """run(buf, stream) of one launch of a loaded kernel (the grid-stride kernels); what a warm
    call repeats is bound once. run.prog: the same launch as data (_PROG_LAUNCH)."""
    from .. import pdl_enabled
    launch, dev = _C()._rtc_launch, int(device.split(":")[1])

    def run(buf: bytearray, stream: int) -> None:
        launch(handle, grid, block, buf, dev, stream, pdl_enabled())
    run.prog = (_PROG_LAUNCH, dev, block, grid, 0, handle, grid, 0, handle, -1, -1, 0)  # type: ignore[attr-defined]
    return run


def _partial_rows(device: str | None, like: Any, dt: str, shape) -> tuple[Any, int]:
    """(array, address) of a column sum's partial rows: in like's framework on CUDA; zeroed on the
    CPU (a thread OpenMP does not start leaves its row)."""
    if device == "cpu":
        z = np.zeros(shape, DTYPES[dt][4])
        return z, z.__array_interface__["data"][0]
    C = _C_mod or _C()
    res = C._rtc_result(like, dt, tuple(shape))
    return res, C._rtc_views((res,), ("partial",))[0][0][0]


# ---- shared argument handling ----------------------------------------------------------------

class _Call:
    """One call's arguments sorted out: device, operands, types."""

    def __init__(self, kernel: str, in_params, out_params, args, outs):
        self.kernel = kernel
        objs = list(args) + list(outs)
        params = list(in_params) + list(out_params)[:len(outs)]
        self.device = None
        for p, o in zip(params, objs):
            if _is_scalar(o) or o is None:
                if p.is_output or p.raw:
                    raise TypeError(f"{kernel}: {p.name} is {'an output' if p.is_output else 'a raw parameter'} "
                                    f"and must be an array, got {type(o).__name__}")
                if o is None:
                    raise TypeError(f"{kernel}: {p.name} is None; expected an array or a number")
                continue
            if isinstance(o, (list, tuple, complex, str, bytes, np.generic)):
                # np.generic here: a NumPy scalar that is not a number (np.str_, np.bytes_,
                # np.datetime64, np.timedelta64), which no kernel parameter type holds
                raise TypeError(f"{kernel}: {p.name} must be an array or a scalar (a number: bool, int, float or a "
                                f"NumPy number), got {type(o).__name__}")
            if type(o).__module__.split(".")[0] == "torch" and str(getattr(o, "layout", "torch.strided")) != \
                    "torch.strided":
                raise TypeError(f"{kernel}: {p.name} is a torch tensor of layout {o.layout}; run-time kernels take "
                                "strided (dense) tensors (convert it with .to_dense())")
            dev = _device_of(o, kernel, p.name)
            if self.device is None:
                self.device = dev
            elif dev != self.device:
                raise ValueError(f"{kernel}: arrays on different devices ({self.device} and {dev} for {p.name})")
        if self.device is None:
            self.device = "cpu"
        self.stream = 0
        vals: list = []
        if self.device == "cpu":
            for p, o in zip(params, objs):
                vals.append(o if _is_scalar(o) else _cpu_arr(o, kernel, p.name))
        else:
            idx = [k for k, o in enumerate(objs) if not _is_scalar(o)]
            for k in idx:
                _refuse_neg_bit(objs[k], kernel, params[k].name)
            ro: list[bool] = []
            arrs, self.stream = _cuda_arrs([objs[k] for k in idx], [params[k].name for k in idx], ro)
            vals = list(objs)
            for k, a, r in zip(idx, arrs, ro):
                vals[k] = a
                if r and params[k].is_output:
                    raise ValueError(f"{kernel}: output {params[k].name} is read-only")
        nin = len(in_params)
        if self.device == "cpu":
            for p, v in zip(params[nin:], vals[nin:]):
                if not v.np.flags.writeable:
                    raise ValueError(f"{kernel}: output {p.name} is read-only")
        self.ins, self.outs = vals[:nin], vals[nin:]
        in_dt = tuple(v.dtype if isinstance(v, _Arr) else None for v in self.ins)
        out_dt = tuple(v.dtype for v in self.outs) + (None,) * (len(out_params) - len(self.outs))
        self.in_types, self.out_types, self.type_map = _decide_types_cached(kernel, in_params, out_params, in_dt,
                                                                            out_dt)
        # results are made like the first input array ewkern can hold (a float one), else the first
        arrays = [(o, v.dtype) for o, v in zip(args, self.ins) if isinstance(v, _Arr)]
        self.like: Any
        self.like_dtype: str | None
        self.like, self.like_dtype = next((a for a in arrays if a[1] in EWKERN_DTYPES), None) or \
            (arrays[0] if arrays else (None, None))

    def alloc(self, dt: str, shape, name: str) -> tuple[Any, _Arr]:
        if len(shape) > _MAX_NDIM:   # named here: ewkern's allocation would name only itself
            raise ValueError(f"{self.kernel}: output {name} would have {len(shape)} dimensions (ewkern supports up "
                             f"to {_MAX_NDIM})")
        if self.device == "cpu":
            res = _alloc_cpu(self.like, dt, shape)
            return res, _cpu_arr(res, self.kernel, name)
        if dt not in EWKERN_DTYPES:
            raise TypeError(f"{self.kernel}: output {name} would be {dt}; on CUDA ewkern allocates "
                            f"{', '.join(EWKERN_DTYPES)} only (pass an output array)")
        if self.like_dtype not in EWKERN_DTYPES:
            raise TypeError(f"{self.kernel}: output {name}: on CUDA ewkern allocates a result like an input array "
                            f"of {', '.join(EWKERN_DTYPES)}, and every input array here is {self.like_dtype} "
                            "(pass an output array)")
        res = _C()._rtc_result(self.like, dt, tuple(shape))
        (a,), _ = _cuda_arrs([res], [name])
        return res, a


_MAX_NDIM = 16   # ewkern's arrays (EW_MAXDIM in csrc/state.h)

_types_cache: dict[Any, tuple] = {}


def _decide_types_cached(kernel: str, in_params, out_params, in_dt, out_dt):
    """decide_types, remembered per (parameters, argument dtypes): the rule is a pure function of
    them; an error is not remembered (it is raised again each call)."""
    key = (kernel, in_params, out_params, in_dt, out_dt)
    r = _types_cache.get(key)
    if r is None:
        r = decide_types(kernel, in_params, out_params, in_dt, out_dt)
        if len(_types_cache) > 4096:
            _types_cache.clear()
        _types_cache[key] = r
    return r


def _typedefs(call: _Call, in_params, out_params) -> str:
    return _codegen.typedefs(call.type_map, in_params, call.in_types, out_params, call.out_types)


# ---- warm calls: a plan per argument signature ------------------------------------------------
#
# A call whose arrays are all C-contiguous records what it decided: the bytes of the kernel's
# argument struct, where in them each data pointer and scalar goes, the shapes and dtypes of the
# results it allocates, and its launch. A later call with the same signature (per array: dtype,
# shape, device and the data pointer's offset within 16 bytes, which decides the vector head; per
# scalar its position; the kernel's keyword arguments) views its arrays in one C call, writes the
# pointers and scalars into a copy of those bytes and launches: everything else the first call
# derived (broadcasting, layout, types, the compiled kernel, grid and block) is a function of the
# signature. An input whose bytes overlap an output other than as the very same view, a
# read-only output or an array that cannot be viewed C-contiguous take the full path.

_MISS = object()
_PLANS_MAX = 64   # plans a kernel keeps (a new one past this clears them)


class _Plan:
    """colsum: a RowKernel's column-sum outputs, ((offset of the partial rows' pointer, their
    dtype, their shape, the output's index among the results, finish), ...): each call allocates
    partial rows for the kernel, and finish(partials, their address, output, stream) sums them
    into the output after it (_rowkernel._cpu_column_sum, _CudaColumnSum)."""
    __slots__ = ("device", "template", "ptrs", "scalars", "outs", "run", "ret", "colsum")

    def __init__(self, device, template, ptrs, scalars, outs, run, ret, colsum=()) -> None:
        self.device, self.template, self.ptrs, self.scalars = device, template, ptrs, scalars
        self.outs, self.run, self.ret, self.colsum = outs, run, ret, colsum


def _fast_call(kern, plans: dict, args: tuple, nin: int, extra=None, c_tried: bool = False):
    """Run a call by a recorded plan, or return _MISS (the caller takes the full path). The C
    module's _rtc_fast does the same for the plans it can run (kern._cplans, see _record_plan);
    what it misses comes here (c_tried: the caller asked it already)."""
    C = _C_mod or _C()
    if kern._cplans and not c_tried:
        r = C._rtc_fast(kern._cplans, args, nin, extra, _SCALARS)
        if r is not NotImplemented:
            return r
    is_arr = tuple([not _is_scalar(o) for o in args])
    objs = tuple([o for o, a in zip(args, is_arr) if a]) if False in is_arr else args
    if not objs:
        return _MISS
    try:
        views, stream = C._rtc_views(objs, _VIEW_NAMES[:len(objs)])
    except Exception:
        return _MISS
    plan = plans.get((len(args), is_arr, tuple([(v[1], v[3], v[2], v[0] & 15) for v in views]), extra))
    if plan is None:
        return _MISS
    if len(objs) == len(args):
        ptrs = [v[0] for v in views]
    else:
        it = iter(views)
        ptrs = [next(it)[0] if a else 0 for a in is_arr]
    if len(args) > nin:   # given outputs: none read-only, none overlapping an input other than as itself
        nvin = sum(is_arr[:nin])
        # raw parameters are indexed anywhere: for them even the same view is an overlap
        # (_copy_overlapping_inputs)
        raws = [p.raw for p, a in zip(kern.in_params + kern.out_params, is_arr) if a]
        for j, o in enumerate(views[nvin:], nvin):
            if o[4]:
                return _MISS
            ob = o[0]
            oe = ob + math.prod(o[3]) * DTYPES[o[1]][2]
            for q, v in enumerate(views[:nvin]):
                if v[0] < oe and ob < v[0] + math.prod(v[3]) * DTYPES[v[1]][2] and (raws[q] or raws[j] or not (
                        v[0] == ob and v[1] == o[1] and v[3] == o[3])):
                    return _MISS
    if plan.outs:
        like = objs[0]
        if plan.device == "cpu":
            new = [_alloc_cpu(like, dt, shape) for dt, shape in plan.outs]
        else:
            new = [C._rtc_result(like, dt, shape) for dt, shape in plan.outs]
        if plan.device == "cpu" and any(dt not in EWKERN_DTYPES for dt, _ in plan.outs):
            # a bool or integer result (a NumPy array, or torch's) is not ewkern's: _rtc_views
            # refuses its dtype
            ptrs += [_cpu_arr(r, kern.name, "result").ptr for r in new]
        else:
            nviews, _ = C._rtc_views(tuple(new), _VIEW_NAMES[:len(new)])
            ptrs += [v[0] for v in nviews]
        results: Any = list(args[nin:]) + new
    else:
        results = args[nin:]
    buf = bytearray(plan.template)
    for off, k, add in plan.ptrs:
        _pack_into("Q", buf, off, ptrs[k] + add)
    for off, fmt, k, dt, pname in plan.scalars:
        _pack_into(fmt, buf, off, _scalar_value(args[k], dt, kern.name, pname))
    parts = []
    for off, pdt, shape, k, finish in plan.colsum:
        part, ptr = _partial_rows(plan.device, objs[0], pdt, shape)
        _pack_into("Q", buf, off, ptr)
        parts.append((part, ptr, k, finish))
    plan.run(buf, stream)
    for part, ptr, k, finish in parts:
        finish(part, ptr, results[k], stream)
    if plan.ret == "one":
        return results[0]
    return None if plan.ret == "none" else tuple(results)


def _plan_slots(cls, base: int, layout: _codegen.Layout, pos: dict, head: int = 0):
    """(pointer slots, scalar slots) of a layout's argument struct of type cls at byte offset
    base: (offset, argument position, bytes added) and (offset, struct format, argument position,
    dtype, name)."""
    ptrs, scalars = [], []
    types = dict(cls._fields_)
    for p, dt, kind, _ in layout.args:
        if kind == "colsum":   # partial rows the plan allocates itself (_Plan.colsum)
            continue
        if kind == "scalar":
            f = "s_" + p.name
            scalars.append((base + getattr(cls, f).offset, types[f]._type_, pos[p.name], dt, p.name))
        else:
            add = head * DTYPES[dt][2] if kind == "array" else 0
            ptrs.append((base + getattr(cls, "p_" + p.name).offset, pos[p.name], add))
    return ptrs, scalars


def _record_plan(kern, args: tuple, call, struct_obj, slots, run, ret: str, out_shapes, extra=None,
                 colsum=()) -> None:
    """Remember how a call ran (see the notes above _MISS) in kern._plans, keyed by its signature:
    slots from _plan_slots, struct_obj the argument struct it launched with, out_shapes the
    shapes of the outputs it allocated. Calls with an array that was not C-contiguous are not
    recorded (a view of the same signature would have other strides)."""
    nin = len(kern.in_params)
    ngiven = len(args) - nin
    given = call.ins + call.outs[:ngiven]
    if not all(v.contiguous() for v in call.ins + call.outs if isinstance(v, _Arr)):
        return
    if len(kern.out_params) > ngiven and call.like is not next((a for a in args[:nin] if not _is_scalar(a)), None):
        return   # results made like a later input (the first holds integers): the plans' allocation takes the first
    is_arr = tuple(not _is_scalar(o) for o in args)
    sig = tuple((v.dtype, tuple(v.shape), call.device, v.ptr & 15) for v, a in zip(given, is_arr) if a)
    outs = tuple((dt, tuple(shape)) for dt, shape in zip(call.out_types[ngiven:], out_shapes))
    plans = kern._plans
    if len(plans) >= _PLANS_MAX:
        plans.clear()
        kern._cplans.clear()
    ptrs, scalars = slots
    template = bytes(struct_obj)
    plans[(len(args), is_arr, sig, extra)] = _Plan(call.device, template, tuple(ptrs), tuple(scalars),
                                                   outs, run, ret, tuple(colsum))
    _record_cplan(kern, args, template, ptrs, scalars, outs, run, ret, extra, colsum)


# the scalar parameters the C fast path converts itself (a Python float, int or bool to float32 or
# float64 by C's rounding, which is NumPy's); a plan with others stays with _fast_call
_CPLAN_SCALARS = {("float32", "f"): 0, ("float64", "d"): 1}

# A C plan's launches as data, the program csrc/rtc.c's ew_rtc_run runs (rtc.h says the words of
# each record): a runner's .prog
_PROG_LAUNCH, _PROG_COLSUM, _PROG_CPU, _PROG_LAUNCH_CAP = 1, 2, 3, 4


def _record_cplan(kern, args: tuple, template: bytes, ptrs, scalars, outs, run, ret: str, extra,
                  colsum=()) -> None:
    """The plan in the form the C module's _rtc_fast runs, in kern._cplans under the C signature
    of args, where it can: float32/float64 scalars and results of ewkern's dtypes. Column sums
    (CUDA: finishers with a .launch by addresses) ride along as hidden outputs: C allocates the
    partial rows after the results and writes their address into the kernel's slot and, with the
    output's, into 16 bytes per column sum after the argument struct (which the launch does not
    read), where the plan's run finds them for the column-sum launches (_colsum_runner)."""
    C = _C_mod or _C()
    if not hasattr(C, "_rtc_fast") or any(dt not in EWKERN_DTYPES for dt, _ in outs):
        return
    kinds = [_CPLAN_SCALARS.get((dt, fmt)) for _, fmt, _, dt, _ in scalars]
    if None in kinds:
        return
    hidden: tuple[int, ...] = ()
    if colsum:
        fins = [fin for *_, fin in colsum]
        if not all(hasattr(fin, "launch") for fin in fins):
            return   # the CPU's column sums take arrays: Python's plan runs them
        nin, tail = len(kern.in_params), len(template)
        template += bytes(16 * len(colsum))
        ptrs = list(ptrs)
        # C numbers the arguments, then the new results, then the hidden outputs: result k (given
        # or new) is number nin + k either way
        for j, (off, pdt, shape, k, _) in enumerate(colsum):
            part = len(args) + len(outs) + j
            ptrs += [(off, part, 0), (tail + 16 * j, part, 0), (tail + 16 * j + 8, nin + k, 0)]
        outs = tuple(outs) + tuple((pdt, tuple(shape)) for _, pdt, shape, _, _ in colsum)
        run = _colsum_runner(run, tail, fins)
        hidden = (len(colsum),)
    sig = C._rtc_sig(args, _SCALARS)
    if sig is None:
        return
    prog = getattr(run, "prog", None)
    if prog is not None:   # C runs the launches itself (csrc/rtc.c's ew_rtc_run), no Python call
        run = struct.pack(f"<{len(prog)}q", *prog)
    pslots = struct.pack(f"<{3 * len(ptrs)}q", *[x for off, k, add in ptrs for x in (off, k, add)])
    sslots = struct.pack(f"<{3 * len(scalars)}q", *[x for (off, _, k, _, _), kind in zip(scalars, kinds)
                                                    for x in (off, kind, k)])
    plan = (template, pslots, sslots, outs, run, {"none": 0, "one": 1}.get(ret, 2)) + hidden
    if any(p.raw for p in kern.in_params + kern.out_params):
        # raw parameters index anywhere: _rtc_fast then runs no given output that overlaps an input,
        # the very same view included (rtc_fast_overlap's strict test; Python's path copies it)
        plan = plan + (0,) * (not hidden) + (True,)
    kern._cplans[(sig, extra)] = plan


def native_plan(kern, args: tuple, extra=None) -> tuple | None:
    """The C plan that a call kern(*args) (with extra, its keyword arguments) ran by, where it runs
    without Python (its launches as data) and allocates its results: for native code that repeats
    the call without the GIL (ewkern.torch's C++ node of a user op's derived backward). None where
    there is none."""
    C = _C_mod or _C()
    sig = C._rtc_sig(args, _SCALARS)
    plan = kern._cplans.get((sig, extra)) if sig is not None else None
    if plan is None or not isinstance(plan[4], bytes) or plan[5] == 0:
        return None
    return plan


def _colsum_runner(run: Callable[[bytearray, int], None], tail: int, fins) -> Callable[[bytearray, int], None]:
    """run(buf, stream) of a C plan with column sums: the kernel, then each column sum's launch
    with the addresses C wrote after the argument struct (at tail, 16 bytes each); prog (where
    run has one) the same as data."""
    launches = [fin.launch for fin in fins]

    def run_all(buf: bytearray, stream: int) -> None:
        run(buf, stream)
        for j, launch in enumerate(launches):
            part, out = _unpack_from("<QQ", buf, tail + 16 * j)
            launch(part, out, stream)
    prog = getattr(run, "prog", None)
    if prog is not None:
        run_all.prog = prog + tuple(w for j, fin in enumerate(fins)  # type: ignore[attr-defined]
                                    for w in fin.prog(tail + 16 * j))
    return run_all


class _CpuRun:
    """run(buf, stream) of a CPU kernel `void entry(const params *, int threads)` that takes the
    address of its argument struct. A C plan (_record_cplan) calls the function's address itself
    (prog: _PROG_CPU, the address, the threads), without ctypes' foreign call (about 1.5 us of a
    warm call)."""
    __slots__ = ("compiled", "threads", "cls", "prog")

    def __init__(self, compiled: Any, threads: int, cls: Any) -> None:
        self.compiled, self.threads, self.cls = compiled, threads, cls
        self.prog = (_PROG_CPU, ctypes.cast(compiled, ctypes.c_void_p).value, int(threads))

    def __call__(self, buf: bytearray, stream: int) -> None:
        self.compiled(ctypes.addressof(self.cls.from_buffer(buf)), self.threads)


def _cpu_runner(compiled: Any, threads: int, cls: Any) -> Callable[[bytearray, int], None]:
    """run(buf, stream) of a CPU kernel that takes the address of its argument struct."""
    return _CpuRun(compiled, threads, cls)


def _prefetch_runner(h: int, grid: int, block: int, dev: int, prefetch_offset: int,
                     wave: int, capped: tuple[int, int] | None = None) -> Callable[[bytearray, int], None]:
    """run(buf, stream) of one launch whose argument struct has a prefetch field (at
    prefetch_offset): the first wave's blocks prefetch when PDL is on, none when it is off;
    capped: (kernel handle, dynamic shared memory) of the PDL launch (_rows_cap), which then runs
    that handle with that memory. run.prog: the same launch as data (_PROG_LAUNCH, or
    _PROG_LAUNCH_CAP when capped)."""
    from .. import pdl_enabled

    launch = _C()._rtc_launch
    hp, smem = capped or (h, 0)

    def run(buf: bytearray, stream: int) -> None:
        pdl = pdl_enabled()
        _pack_into("q", buf, prefetch_offset, wave if pdl else 0)
        if pdl and smem:
            launch(hp, grid, block, buf, dev, stream, pdl, smem)
        else:
            launch(h, grid, block, buf, dev, stream, pdl)
    run.prog = (_PROG_LAUNCH_CAP if smem else _PROG_LAUNCH, dev, block, grid, 0, h,  # type: ignore[attr-defined]
                grid, wave, hp, prefetch_offset, -1, 0) + ((0, smem) if smem else ())
    return run


# EWKERN_RTC_ROWS_CAP (read once; on unless "0"): a programmatic launch of the rows engine whose
# grid needs fewer blocks an SM than the kernel's occupancy holds keeps to that many (ceil(grid /
# SMs)) by dynamic shared memory (_rows_cap). Why (H200, scripts/rows_graph_probe.py, mse over
# rows of 4096, float32 4 MiB, 256 blocks): in a back-to-back graph each kernel's early-launched
# blocks land on the SMs the running one leaves idle, up to the occupancy, so that successive
# kernels took turns on halves of the GPU: 68-71 of 132 SMs at 4 blocks each, 4.39 us a call
# (0.84 of torch.compile); capped at 2, every SM held 2 and it took 3.21 us (1.14). In `fused`
# (9419f11, one handle), float32 4 / 8 MiB back-to-back 0.94 / 0.92 -> 1.22 / 1.09 of torch.compile,
# float16 2 / 4 MiB 1.06 / 1.08 -> 1.34 / 1.19, float16 8 MiB 1.07 -> 1.02; single launches within
# 0.02 either way. Within a 64 KiB carveout (0d16fbd, on by default) the same back-to-back gains
# and single launches -0.024 to +0.012 (mean -0.003) of the uncapped ones; with the largest
# carveout capped single launches had moved -0.065 to +0.014, mean -0.019 (ewcuda_kernel_cap).
# The capped launches run a second handle of the same image: the attributes the cap sets (the
# largest shared-memory carveout) slowed the kernel's uncapped launches where they shared one
# handle (H200, 9419f11: mse rows float32 16 / 256 MiB, grids past the cap's range, 1.06 / 1.00 ->
# 0.95 / 0.97 of torch.compile back-to-back once a small call had capped the handle).
_ROWS_CAP = os.environ.get("EWKERN_RTC_ROWS_CAP", "1") != "0"
_caps: dict = {}   # (image, entry, device, blocks an SM) -> (capped handle, dynamic shared memory)


def _rows_cap(image: bytes, entry: str, dev: int, grid: int, sms: int, occupancy: int) -> tuple[int, int] | None:
    """(kernel handle, dynamic shared memory) of a programmatic rows-engine launch of grid blocks
    (_ROWS_CAP): a handle of image's entry of its own, and enough memory that an SM holds at most
    ceil(grid / sms) of the blocks, where that is below occupancy; else None. Asked once per
    kernel and cap (C's _rtc_cap sets that handle's attributes); the cap is a speed rule, so a
    kernel whose attributes CUDA refuses runs uncapped rather than failing the user's call."""
    blocks = -(-grid // sms)
    if not _ROWS_CAP or blocks >= occupancy:
        return None
    key = (image, entry, dev, blocks)   # the image itself, not its id: a handle must never outlive its kernel
    got = _caps.get(key)
    if got is None:
        h = next((v[0] for k, v in _caps.items() if k[:3] == key[:3]), None) or _C()._rtc_load(image, entry, dev)
        try:
            smem = int(_C()._rtc_cap(h, _codegen.ROWS_BLOCK, dev, blocks))
        except RuntimeError:   # a CUDA error from the attribute calls (cleared there): no cap
            smem = 0
        got = _caps[key] = (h, smem)
    return got if got[1] else None


def _elementwise_runner(compiled, device, mode: str, layout, n: int, head: int, block_size, cls):
    """run(buf, stream): the launch an ElementwiseKernel call decided (a plan keeps it)."""
    if device == "cpu":
        return _cpu_runner(compiled, _threads(n, CPU_PAR_MIN_ELEMENTWISE), cls)
    if mode == "vector":
        E = _codegen.vector_units(layout)
        vblock = max(int(block_size), 2 * E) if block_size else _AUTO_BLOCK
        # the bytes the launch moves: its dense arrays, read or written (broadcast rows are small)
        nbytes = n * sum(DTYPES[dt][2] for _, dt, kind, _ in layout.args if kind == "array")
        out_bytes = n * sum(DTYPES[dt][2] for p, dt, kind, _ in layout.args if kind == "array" and p.is_output)
        assert cls.wb.offset == cls.prefetch.offset + 8   # one pack sets both (runner)
        return compiled.runner(n, head, E, vblock, cls.prefetch.offset, nbytes, out_bytes)
    block = int(block_size) if block_size else FALLBACK_BLOCK
    return _gpu_runner(compiled, max(1, min(-(-n // block), 32 * _device_facts(device)[1])), block, device)


_VIEW_NAMES = tuple(f"argument {k}" for k in range(64))
_reduction_structs: dict[Any, type] = {}


def _reduction_struct(in_cls: type, out_cls: type, rows: bool) -> type:
    """The argument struct of a reduction kernel around its inputs' and outputs' structs: the
    rows engine's (with its plan fields) or the block-per-output kernel's (made once per pair)."""
    key = (in_cls, out_cls, rows)
    cls = _reduction_structs.get(key)
    if cls is None:
        fields: list[tuple[str, Any]] = [("in_", in_cls), ("out", out_cls)]
        if rows:
            fields += [(f, ctypes.c_longlong) for f in ("R", "nout", "head0", "nchunks", "chunk_vecs", "G", "prefetch")]
            fields.append(("partial", ctypes.c_void_p))
        else:
            fields.append(("red_size", ctypes.c_longlong))
        cls = _reduction_structs[key] = type("ewrtc_reduce_params", (ctypes.Structure,), {"_fields_": fields})
    return cls


# Float division in kernels whose every output is float16 or bfloat16 (computed in float, rounded
# to 11 or 8 significant bits): div.full.f32 (at most 2 ulp of float) instead of IEEE division, whose
# per-element slow-path calls and branches (sm_90 SASS of `o = a / (1 + exp(-b))` in float16, the
# 1-vector form: 440 -> 280 instructions, 9 CALL and 28 BRA -> 0 and 3) held a 1 MiB single launch
# at 0.86-0.87 of torch.compile on the H200, whose Triton kernel divides approximately too (with
# --use_fast_math, approximate exp as well: 0.98-1.00; back-to-back 2.14 -> 1.73 us). A 16-bit
# result differs from IEEE division's only where the exact value lies within about 2^-21 (relative)
# of a 16-bit rounding boundary, by one unit in its last place. As built (H200, 9c9c91f): 0.94-0.96
# of torch.compile at 1 MiB single, back-to-back 2.15 -> 1.75 us. ReductionKernel and RowKernel take
# the same rule: an rmsnorm RowKernel written with divisions, float16 rows of 4096, 1 MiB 1.05 ->
# 1.25 of torch.compile back-to-back, 0.88 -> 0.95 single. The user's options come after these
# (NVRTC takes the last of a repeated option): options=("--prec-div=true",) keeps IEEE division.
HALF_OUT_OPTIONS = ("--prec-div=false",)


def _nvrtc_options(out_types, options: tuple[str, ...]) -> tuple[str, ...]:
    """ewkern's NVRTC options for a user kernel (elementwise, reduction or row) with these output
    dtypes, then the user's."""
    half = bool(out_types) and all(t in ("float16", "bfloat16") for t in out_types)
    return (HALF_OUT_OPTIONS if half else ()) + tuple(options)


class ElementwiseKernel:
    """A user-defined elementwise kernel, with CuPy's signature and semantics
    (``cupy.ElementwiseKernel``), for any DLPack arrays: NumPy, torch, CuPy, ewkern.

    Args:
        in_params: input parameters, ``'T x, raw T y, float32 alpha'``: ``[raw] TYPE NAME`` with
            TYPE a one-letter placeholder or a dtype name as NumPy spells it (``float32``,
            ``float16``, ``float64``, ``int32``, ``bool``..., and ``bfloat16``); NAME not ``i``
            (the loop index: a ValueError, as CuPy).
        out_params: output parameters, the same syntax.
        operation: the body, C++ (CUDA C++ on the GPU) run once per element index ``i``. Each
            non-raw parameter is a local of its element's compute type (``float`` for float16 and
            bfloat16, rounded back to nearest even on the store); raw parameters are indexed by a
            flat row-major index (``y[_ind.size() - i - 1]``) and have ``size()``/``shape()``;
            ``_ind.size()`` is the loop size; ``T`` and ``in0_type``/``out0_type`` name the types.
            The math functions of CUDA (``exp``, ``log``, ``sqrt``, ``erf``, ``tanh``, ``max``,
            ``min``...) are there on both backends.
        name: the kernel's name (in compile errors and the generated symbol).
        reduce_dims: accepted for CuPy compatibility (contiguous arrays already run as one
            dimension).
        preamble, loop_prep, after_loop: code before the kernel, before and after the loop.
        no_return: return None. return_tuple: always return a tuple.
        options: extra NVRTC options, after ewkern's own (so they win where they conflict).
            Where every output is float16 or bfloat16, float division compiles approximate
            (``--prec-div=false``: ``div.full.f32``, 2 ulp of float before the rounding to 16
            bits); ``options=("--prec-div=true",)`` keeps IEEE division.

    Calling it: ``kernel(*inputs, *outputs, size=None, block_size=None)``. Inputs are arrays or
    scalars; outputs are optional (allocated otherwise, in the framework and on the device of the
    first array input of a float dtype, else of the first array input: NumPy in, NumPy out; torch
    in, torch out). Non-raw arrays broadcast as NumPy
    broadcasts; a placeholder is bound by the arrays passed for it (scalars are converted to it,
    as NumPy 2 assigns them: an integer out of the type's range, or a NaN or infinity for an
    integer type, raises OverflowError or ValueError);
    ``size`` sets the loop size when every array is raw. Returns the output, or a tuple of them.

    Where it runs: CUDA arrays run a kernel compiled by NVRTC for the device's architecture
    (found at run time; ``pip install ewkern[nvrtc]``) on the caller's stream (torch's current
    stream for torch inputs, ewkern's current stream otherwise); CPU arrays run the same body
    compiled by the system C++ compiler (with OpenMP where it has it). Both are cached in memory
    and on disk (``$EWKERN_CACHE_DIR``, default ``~/.cache/ewkern/kernels``). A call whose arrays
    are all C-contiguous records a plan for its signature (dtypes, shapes, device, each pointer's
    offset within 16 bytes, which arguments are scalars); later calls of that signature only
    write their pointers and scalars into it and launch (a few microseconds of host time).
    """

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 reduce_dims: bool = True, preamble: str = "", no_return: bool = False,
                 return_tuple: bool = False, loop_prep: str = "", after_loop: str = "",
                 options: tuple[str, ...] = (), **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"ElementwiseKernel: unexpected keyword arguments {sorted(kwargs)}")
        if not isinstance(name, str) or not _IDENT_OK(name):
            raise ValueError(f"ElementwiseKernel: name must be a C identifier, got {name!r}")
        if not isinstance(operation, str):
            raise TypeError(f"{name}: operation must be a str of C++ code, got {type(operation).__name__}")
        self.name = name
        self.in_params = parse_params(in_params, False, name)
        self.out_params = parse_params(out_params, True, name)
        names = [p.name for p in self.in_params + self.out_params]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"{name}: parameter name(s) {sorted(dup)} appear among both inputs and outputs")
        if "i" in names:   # CuPy's one reserved name: it would hide the loop index
            raise ValueError(f"{name}: can not use 'i' as a parameter name (it is the loop index)")
        self.nin, self.nout = len(self.in_params), len(self.out_params)
        self.nargs = self.nin + self.nout
        self.operation = operation
        self.preamble, self.loop_prep, self.after_loop = preamble, loop_prep, after_loop
        self.reduce_dims, self.no_return, self.return_tuple = reduce_dims, no_return, return_tuple
        self.options = tuple(options)
        self._compiled: dict = {}   # (device, layout, types) -> compiled function / kernel handle
        self._last_path = ""
        self._plans: dict = {}      # warm calls: signature -> _Plan
        self._cplans: dict = {}     # the same plans for the C module's _rtc_fast (_record_cplan)

    def __repr__(self) -> str:
        return f"<ewkern.ElementwiseKernel {self.name!r}>"

    def _parts(self):
        return {"operation": self.operation, "preamble": self.preamble, "loop_prep": self.loop_prep,
                "after_loop": self.after_loop}

    def __call__(self, *args: Any, size: int | None = None, block_size: int | None = None) -> Any:
        if self._plans and size is None and block_size is None:
            # the C plans first, without _fast_call's frame (a warm CPU call of 1024 float32
            # elements, CI host: 0.85 -> 0.73 us)
            if self._cplans:
                r = (_C_mod or _C())._rtc_fast(self._cplans, args, self.nin, None, _SCALARS)
                if r is not NotImplemented:
                    return r
            r = _fast_call(self, self._plans, args, self.nin, c_tried=True)
            if r is not _MISS:
                return r
        name = self.name
        if block_size is not None:   # checked on the CPU too, which has no blocks: a call fails alike on both
            if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
                raise TypeError(f"{name}: block_size must be an int or None, got {type(block_size).__name__}")
            if not 1 <= block_size <= 1024:
                raise ValueError(f"{name}: block_size must be 1 to 1024 (threads a CUDA block), got {block_size}")
        if len(args) not in (self.nin, self.nargs):
            raise TypeError(f"{name}: wrong number of arguments: expected {self.nin} inputs"
                            f"{f' or {self.nargs} with the outputs' if self.nout else ''}, got {len(args)}")
        ins, outs = args[:self.nin], args[self.nin:]
        call = _Call(name, self.in_params, self.out_params, ins, outs)
        # the loop's shape: broadcast of the non-raw arrays, inputs and given outputs
        shapes = [v.shape for v, p in zip(call.ins + call.outs, self.in_params + self.out_params)
                  if isinstance(v, _Arr) and not p.raw]
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)):   # as CuPy's Py_ssize_t size
                raise TypeError(f"{name}: size must be an int or None, got {type(size).__name__}")
            if shapes:
                raise ValueError(f"{name}: size= can be given only when every array argument is raw")
            if int(size) < 0:
                raise ValueError(f"{name}: size must be >= 0, got {size}")
            shape = (int(size),)
        elif not shapes:
            raise ValueError(f"{name}: the loop size is undecided: no non-raw array argument (pass size=)")
        else:
            if all(s == shapes[0] for s in shapes):   # the common case, without NumPy's general rule
                shape = tuple(shapes[0])
            else:
                try:
                    shape = np.broadcast_shapes(*shapes)
                except ValueError:
                    raise ValueError(f"{name}: shapes {', '.join(map(str, shapes))} do not broadcast together") from None
        for p, v in zip(self.out_params, call.outs):
            if not p.raw and v.shape != tuple(shape):
                raise ValueError(f"{name}: output {p.name} has shape {v.shape}; the arguments broadcast to {tuple(shape)}")
        results = list(outs)
        for k in range(len(outs), self.nout):
            p = self.out_params[k]
            if p.raw and size is None:
                raise ValueError(f"{name}: the size of raw output {p.name} is undecided: pass it")
            res, a = call.alloc(call.out_types[k], shape, p.name)
            results.append(res)
            call.outs.append(a)
        ret = None if self.no_return else (results[0] if self.nout == 1 and not self.return_tuple else tuple(results))
        n = math.prod(shape)
        if n == 0:
            return ret
        given_ins = list(call.ins)
        _copy_overlapping_inputs(call, self.in_params, self.out_params)
        if call.device == "cpu":
            for k, v in enumerate(call.ins):
                if isinstance(v, _Arr) and self.in_params[k].raw and not v.contiguous():
                    call.ins[k] = _cpu_copy(v)
            for p, o in zip(self.out_params, call.outs):
                if p.raw and not o.contiguous():
                    raise ValueError(f"{name}: raw output {p.name} must be C-contiguous")
        # layout: one dimension when every non-raw array is C-contiguous over the loop's shape
        allp = self.in_params + self.out_params
        allv = call.ins + call.outs
        allt = call.in_types + call.out_types
        contig = all(v.shape == tuple(shape) and v.contiguous()
                     for v, p in zip(allv, allp) if isinstance(v, _Arr) and not p.raw)
        mode = "contig" if contig else "strided"
        largs, values = [], {}
        for p, v, dt in zip(allp, allv, allt):
            if not isinstance(v, _Arr):
                largs.append((p, dt, "scalar", 0))
                values[p.name] = _scalar_value(v, dt, name, p.name)
            elif p.raw:
                largs.append((p, dt, "raw", len(v.shape)))
                values[p.name] = v
            else:
                largs.append((p, dt, "array", 0))
                values[p.name] = (v, None if contig else _broadcast_strides(v, shape))
        head = 0
        ccols = 0
        if not contig and call.device != "cpu" and n > 0:
            bl = _broadcast_layout(largs, values, tuple(shape))
            if bl is not None:
                largs, ccols, contig, mode = bl, shape[-1], True, "vector"
        elif not contig and n > 0:
            bl = _broadcast_layout(largs, values, tuple(shape), cpu=True)
            if bl is not None:
                largs, mode = bl, "rows"
        if mode == "vector":
            pass
        elif contig and call.device != "cpu" and any(kind == "array" for _, _, kind, _ in largs):
            E = 16 // max(DTYPES[dt][2] for _, dt, kind, _ in largs if kind == "array")
            vh = _vector_head([values[p.name][0] for p, _, kind, _ in largs if kind == "array"], E)
            if vh is not None and vh <= n:
                mode, head = "vector", vh
        self._last_path = mode   # which kernel form ran last (the tests read it)
        lshape = (n,) if contig else ((n // shape[-1], shape[-1]) if mode == "rows" else tuple(shape))
        layout = _codegen.Layout(mode, len(lshape), largs)
        params = _fill(layout, n, lshape, values, head)
        if mode == "vector":
            params.ccols = ccols
        key = (call.device, layout.key(), call.type_map, call.in_types, call.out_types)
        compiled: Any = self._compiled.get(key)
        if compiled is None:
            tdefs = _typedefs(call, self.in_params, self.out_params)
            backend = "cpu" if call.device == "cpu" else "cuda"
            if mode == "vector":
                assert call.device is not None
                reads = {p.name for p in self.out_params if not p.raw
                         and not _codegen.writes_only(self.operation, p.name)}
                vargs = (name, layout, self.operation, self.preamble, self.loop_prep, self.after_loop, tdefs, reads)
                vsrc, entries = _codegen.vector_source(*vargs)
                heavy = bool(_codegen.identifiers(self.operation) & _codegen.HEAVY_MATH)
                compiled = _vector_kernel(name, vsrc, entries, call.device, self._parts(),
                                          _nvrtc_options(call.out_types, self.options), heavy,
                                          lambda: _codegen.vector_source(*vargs, regs64=True)[0])
                self._compiled[key] = compiled
        if compiled is None:
            tdefs = _typedefs(call, self.in_params, self.out_params)
            src, entry = _codegen.elementwise_source(backend, name, layout, self.operation, self.preamble,
                                                     self.loop_prep, self.after_loop, tdefs)
            if backend == "cpu":
                compiled = _build.build_cpu(name, src, entry, self._parts())
            else:
                assert call.device is not None
                compiled = _gpu_kernel(name, src, entry, call.device, self._parts(),
                                       _nvrtc_options(call.out_types, self.options))
            self._compiled[key] = compiled
        buf = bytearray(bytes(params))
        run = _elementwise_runner(compiled, call.device, mode, layout, n, head, block_size, type(params))
        run(buf, call.stream)
        _copy_back_raw(call, self.in_params, given_ins, self.operation + "\n" + self.loop_prep + "\n" + self.after_loop)
        if size is None and block_size is None and all(a is b for a, b in zip(given_ins, call.ins)):
            ret_form = "none" if self.no_return else ("one" if self.nout == 1 and not self.return_tuple else "tuple")
            pos = {p.name: k for k, p in enumerate(allp)}
            _record_plan(self, args, call, params, _plan_slots(type(params), 0, layout, pos, head), run, ret_form,
                         [tuple(shape)] * (self.nargs - len(args)))
        return ret


# EWKERN_RTC_ROWS_WAVES_X8 (read once): 8 x the waves of threads (2048 per SM) below which the rows
# engine cuts rows into chunks (default 4: half a wave); a knob for measuring the rule, not for users
_ROWS_WAVES_X8 = int(os.environ.get("EWKERN_RTC_ROWS_WAVES_X8", "0") or 0) or 4
# the most vectors a lane takes of a row before the rows engine gives the row more lanes (a probe's
# knob: scripts/speed_probe.py rows, variant v8)
_ROWS_LANE_VECTORS = 4
_REDUCE_SIZES = {"float": 4, "double": 8, "int": 4, "long long": 8, "unsigned int": 4, "unsigned long long": 8,
                 "short": 2, "unsigned short": 2, "signed char": 1, "unsigned char": 1, "bool": 1}


def _pow2ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _dense(strides, shape, item: int) -> bool:
    """Whether byte strides are C-contiguous for shape (dimensions of size 1 may have any)."""
    expect = item
    for n, st in zip(reversed(shape), reversed(strides)):
        if n != 1 and st != expect:
            return False
        expect *= n
    return True


def _IDENT_OK(s: str) -> bool:
    return s.isidentifier() and s.isascii()


class ReductionKernel:
    """A user-defined reduction, with CuPy's signature and semantics (``cupy.ReductionKernel``),
    for any DLPack arrays.

    Args:
        in_params, out_params: as for ElementwiseKernel (no raw parameters).
        map_expr: an expression of the inputs, mapped over every element (``'x * x'``).
        reduce_expr: combines two mapped values ``a`` and ``b`` (``'a + b'``, ``'max(a, b)'``).
        post_map_expr: a statement from the reduced value ``a`` to the outputs (``'y = sqrt(a)'``);
            ``_in_ind.size()`` and ``_out_ind.size()`` are the input and output sizes.
        identity: the reduction's start value as C++ code (``'0'``), or None (the first element;
            CPU only, and an empty reduction is then an error).
        name: the kernel's name. reduce_type: the C++ type of ``a`` and ``b``
            (``type_reduce``; default the first output's compute type). preamble, options: as for
            ElementwiseKernel. reduce_dims: accepted for CuPy compatibility.

    Calling it: ``kernel(*inputs, *outputs, out=None, axis=None, keepdims=False, stream=None)``.
    Inputs broadcast together; ``axis`` (None: all) is reduced; the outputs have the remaining
    shape. ``stream``: an ``ewkern.Stream`` runs the call as inside ``with ewkern.stream(stream):``
    (torch inputs still launch on torch's current stream); None, ewkern's current stream; a CuPy
    stream or anything else is a TypeError.
    The order of combination is fixed: on the CPU each output reduces its elements in row-major
    order; on CUDA, when the inputs are dense with the reduced axes last, a group of lanes per
    row (and per chunk of a long row, then a combine launch) takes 16-byte vectors in turn and
    combines in a fixed tree (ewkern/rtc/_codegen.py, reduction_rows_source); other layouts give
    each output one block that combines 256 strided partial results in a fixed tree. A result
    does not change from call to call (CPU and GPU may differ in rounding).
    """

    def __init__(self, in_params: str, out_params: str, map_expr: str, reduce_expr: str, post_map_expr: str,
                 identity: str | None, name: str = "reduce_kernel", reduce_type: str | None = None,
                 reduce_dims: bool = True, preamble: str = "", options: tuple[str, ...] = ()) -> None:
        if not isinstance(name, str) or not _IDENT_OK(name):
            raise ValueError(f"ReductionKernel: name must be a C identifier, got {name!r}")
        for what, v in (("map_expr", map_expr), ("reduce_expr", reduce_expr), ("post_map_expr", post_map_expr)):
            if not isinstance(v, str):
                raise TypeError(f"{name}: {what} must be a str of C++ code, got {type(v).__name__}")
        self.name = name
        self.in_params = parse_params(in_params, False, name)
        self.out_params = parse_params(out_params, True, name)
        for p in self.in_params + self.out_params:
            if p.raw:
                raise ValueError(f"{name}: raw parameters ({p.name}) are not supported by ReductionKernel")
        if not self.out_params:
            raise ValueError(f"{name}: a ReductionKernel needs at least one output parameter")
        self.nin, self.nout = len(self.in_params), len(self.out_params)
        self.nargs = self.nin + self.nout
        self.map_expr, self.reduce_expr, self.post_map_expr = map_expr, reduce_expr, post_map_expr
        self.identity = None if identity is None else str(identity)
        self.reduce_type = reduce_type
        self.reduce_dims = reduce_dims
        self.preamble = preamble
        self.options = tuple(options)
        self._compiled: dict = {}
        self._last_path = ""
        self._plans: dict = {}      # warm calls: signature -> _Plan
        self._cplans: dict = {}     # the same plans for the C module's _rtc_fast (_record_cplan)

    def __repr__(self) -> str:
        return f"<ewkern.ReductionKernel {self.name!r}>"

    def _out_struct(self, call: _Call, kept, keepdims: bool, out_size: int):
        """The outputs' layout and argument struct: their strides over the kept axes."""
        oargs, ovalues = [], {}
        oshape = tuple(call.outs[0].shape[d] for d in kept) if keepdims else call.outs[0].shape
        oshape = oshape or (1,)
        for p, v, dt in zip(self.out_params, call.outs, call.out_types):
            st = tuple(v.strides[d] for d in kept) if keepdims else v.strides
            oargs.append((p, dt, "array", 0))
            ovalues[p.name] = (v, st or (0,))
        out_layout = _codegen.Layout("strided", len(oshape), oargs)
        return out_layout, _fill(out_layout, out_size, oshape, ovalues)

    def _rows(self, call: _Call, largs, values, kept, keepdims: bool, nout: int, R: int, rtype: str, plan) -> None:
        """CUDA, every array input dense with the reduced axes last: the two-step rows engine
        (_codegen.reduction_rows_source). Plan: E elements per vector (16 bytes of the widest
        input, 1 when their starts cannot be aligned together); each row a group of the fewest
        lanes (a power of two up to a block of 256) that take at most 4 vectors each, one chunk,
        while the groups hold at least half a wave of threads; else (few long rows: axis=None)
        256 lanes per chunk of 2048 vectors, and a second launch combines the chunks."""
        name = self.name
        assert call.device is not None
        arrays = [values[p.name][0] for p, _, kind, _ in largs if kind == "array"]
        E = 16 // max(DTYPES[a.dtype][2] for a in arrays)
        head0 = _vector_head(arrays, E)
        if head0 is None:
            E, head0 = 1, 0
        in_layout = _codegen.Layout("contig", 1, largs)
        in_struct = _fill(in_layout, nout * R, (nout * R,), {k: v for k, v in values.items()})
        out_layout, out_struct = self._out_struct(call, kept, keepdims, nout)
        sms = _device_facts(call.device)[1]
        nv = max((R - E + 1) // E, 0) if E > 1 else R   # whole vectors in the shortest row
        G = min(_codegen.ROWS_BLOCK, _pow2ceil(max(1, -(-nv // _ROWS_LANE_VECTORS))))
        if nout * G >= sms * 2048 * _ROWS_WAVES_X8 // 8:
            chunk_vecs = R // E + 1   # one chunk a row
        else:
            G, chunk_vecs = _codegen.ROWS_BLOCK, _codegen.ROWS_BLOCK * 8
        full = G == _codegen.ROWS_BLOCK     # the rows entry with G fixed (fewer registers)
        nchunks = max(1, -(-(R // E + 1) // chunk_vecs))
        # one chunk a row, every row starting at a whole vector: the rows entry's short form
        aligned = nchunks == 1 and head0 == 0 and R % E == 0 and R // E + 4 * _codegen.ROWS_BLOCK < 2 ** 31
        key = (call.device, "rows", E, full, aligned, in_layout.key(), out_layout.key(), call.type_map,
               call.in_types, call.out_types, rtype)
        kern = self._compiled.get(key)
        if kern is None:
            tdefs = _typedefs(call, self.in_params, self.out_params)
            parts = {"map_expr": self.map_expr, "reduce_expr": self.reduce_expr,
                     "post_map_expr": self.post_map_expr, "identity": self.identity or "", "preamble": self.preamble}
            dev = int(call.device.split(":")[1])
            # The rows entry asks ptxas for 4 resident blocks of 256 (64 registers a thread at most):
            # without that bound it fitted 16-bit (a - b)^2 into 32 registers by issuing only 4 of
            # the 4-vector step's 8 loads before the first conversion; with it all 8 go first (54
            # registers). mse over rows of 4096 (scripts/speed_probe.py rows, ewkern / torch.compile
            # without -> with): H200 16 MiB float16 back-to-back 0.97 -> 1.07, single launch 0.89 ->
            # 0.96; H100 0.99 -> 1.10 and 0.95 -> 0.96; float32 and 256 MiB alike or better. Where
            # the bound makes ptxas spill (local memory: 3+ inputs, libm-class or float64 maps) the
            # entry is built without it.
            for blocks in (4, 0):
                src, entries = _codegen.reduction_rows_source(name, in_layout, out_layout, E, self.map_expr,
                                                              self.reduce_expr, self.post_map_expr,
                                                              str(self.identity), rtype, self.preamble, tdefs, full,
                                                              aligned, blocks)
                image, _, _ = _build.compile_cuda(name, src, _device_facts(call.device)[0], parts=parts,
                                                  options=_nvrtc_options(call.out_types, self.options))
                hs = tuple(_C()._rtc_load(image, e, dev) for e in entries)
                if blocks == 0 or _C()._rtc_attrs(hs[0], dev)[1] == 0:
                    break
            wave = sms * _C()._rtc_occupancy(hs[0], _codegen.ROWS_BLOCK, dev)
            kern = self._compiled[key] = (hs, wave, blocks, (image, entries[0]))
        (h_rows, h_comb), wave, blocks, (image, entry) = kern
        from .. import pdl_enabled
        pdl = pdl_enabled()
        Params: Any = _reduction_struct(type(in_struct), type(out_struct), True)
        P = Params(in_struct, out_struct, R, nout, head0, nchunks, chunk_vecs, G, wave if pdl else 0, None)
        per = _codegen.ROWS_BLOCK // G
        grid_rows = -(-(nout * nchunks) // per)
        capped = _rows_cap(image, entry, int(call.device[5:]), grid_rows, sms, wave // sms)
        smem = capped[1] if capped else 0
        # the rows launch; with one chunk (nothing allocated) a warm call of this signature runs by
        # a plan that keeps it
        run = _prefetch_runner(h_rows, grid_rows, _codegen.ROWS_BLOCK, int(call.device[5:]), Params.prefetch.offset,
                               wave, capped)
        keep = None
        if nchunks > 1:
            nbytes = nout * nchunks * _REDUCE_SIZES[rtype]
            keep = _C()._rtc_result(call.like, "float64", (-(-nbytes // 8),))
            (pa,), _ = _cuda_arrs([keep], ["partial"])
            P.partial = pa.ptr
        run(bytearray(bytes(P)), call.stream)
        if nchunks > 1:
            P.G = G2 = min(_codegen.ROWS_BLOCK, _pow2ceil(-(-nchunks // 4)))
            P.prefetch = 0
            _C()._rtc_launch(h_comb, -(-nout // (_codegen.ROWS_BLOCK // G2)), _codegen.ROWS_BLOCK, bytes(P),
                             int(call.device[5:]), call.stream, pdl)
        del keep   # the partials' memory goes back to its allocator in stream order
        if nchunks == 1:
            plan(P, in_layout, out_layout, run)
        self._last_path = (f"rows G={G} chunks={nchunks} E={E} blocks={blocks}{f' smem={smem}' if pdl and smem else ''}"
                           f"{' aligned' if aligned else ''}")

    def __call__(self, *args: Any, out: Any = None, axis: Any = None, keepdims: bool = False,
                 stream: Any = None) -> Any:
        if stream is not None:
            from .. import Stream, stream as _stream_block
            if not isinstance(stream, Stream):
                raise TypeError(f"{self.name}: stream= takes an ewkern.Stream or None, got {type(stream).__name__} "
                                "(CuPy streams are not supported)")
            with _stream_block(stream):
                return self(*args, out=out, axis=axis, keepdims=keepdims)
        fargs = args if out is None else args + (out,)   # out= as the positional output
        extra = None
        if not isinstance(axis, bool) and (out is None or len(args) == self.nin):
            extra = (tuple(axis) if isinstance(axis, list) else axis, bool(keepdims))
            try:
                hash(extra)
            except TypeError:
                extra = None
        if self._plans and extra is not None:
            if self._cplans:   # as ElementwiseKernel.__call__
                r = (_C_mod or _C())._rtc_fast(self._cplans, fargs, self.nin, extra, _SCALARS)
                if r is not NotImplemented:
                    return r
            r = _fast_call(self, self._plans, fargs, self.nin, extra, c_tried=True)
            if r is not _MISS:
                return r
        name = self.name
        if len(args) not in (self.nin, self.nargs):
            raise TypeError(f"{name}: wrong number of arguments: expected {self.nin} inputs or {self.nargs} "
                            f"with the outputs, got {len(args)}")
        ins, outs = args[:self.nin], list(args[self.nin:])
        if out is not None:
            if outs:
                raise ValueError(f"{name}: cannot give the output both as a positional argument and as out=")
            if self.nout != 1:
                raise ValueError(f"{name}: out= takes one array; this kernel has {self.nout} outputs (pass them "
                                 "positionally)")
            outs = [out]
        call = _Call(name, self.in_params, self.out_params, ins, outs)

        def plan(struct_obj, in_layout, out_layout, run) -> None:
            """Record the plan of a call that ran in one launch with nothing allocated on the side
            (and no input read from a copy: a plan's pointers are the arguments')."""
            if extra is None or any(a is not b for a, b in zip(given_ins, call.ins)):
                return
            pos = {p.name: k for k, p in enumerate(self.in_params + self.out_params)}
            cls = type(struct_obj)
            ptrs, scalars = _plan_slots(_ctypes_struct(in_layout), cls.in_.offset, in_layout, pos)
            optrs, _ = _plan_slots(_ctypes_struct(out_layout), cls.out.offset, out_layout, pos)
            _record_plan(self, fargs, call, struct_obj, (ptrs + optrs, scalars), run,
                         "one" if self.nout == 1 else "tuple", [out_shape] * (self.nargs - len(fargs)), extra)
        shapes = [v.shape for v in call.ins if isinstance(v, _Arr)]
        try:
            shape = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
        except ValueError:
            raise ValueError(f"{name}: shapes {', '.join(map(str, shapes))} do not broadcast together") from None
        nd = len(shape)
        if axis is None:
            axes = tuple(range(nd))
        else:
            seq = axis if isinstance(axis, (tuple, list)) else (axis,)
            picked: list[int] = []
            for a in seq:
                if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
                    raise TypeError(f"{name}: axis must be an int or a tuple of ints, got {a!r}")
                if not -nd <= a < nd:   # a 0-d input has no axis (NumPy's AxisError, a ValueError)
                    raise ValueError(f"{name}: axis {a} is out of bounds for the inputs' {nd} dimensions")
                a = int(a) % nd if nd else 0
                if a in picked:
                    raise ValueError(f"{name}: axis {a} is repeated")
                picked.append(a)
            axes = tuple(sorted(picked)) if nd else ()
        kept = [d for d in range(nd) if d not in axes]
        out_shape = tuple(1 if (keepdims and d in axes) else shape[d] for d in range(nd) if keepdims or d not in axes)
        kept_shape = tuple(shape[d] for d in kept)
        red_size = math.prod(shape[d] for d in axes)
        out_size = math.prod(kept_shape)
        for p, v in zip(self.out_params, call.outs):
            if v.shape != out_shape:
                raise ValueError(f"{name}: output {p.name} has shape {v.shape}; the reduction gives {out_shape}")
        results = list(outs)
        for k in range(len(outs), self.nout):
            res, a = call.alloc(call.out_types[k], out_shape, self.out_params[k].name)
            results.append(res)
            call.outs.append(a)
        ret = results[0] if self.nout == 1 else tuple(results)
        if out_size == 0:
            return ret
        if red_size == 0 and self.identity is None:
            raise ValueError(f"{name}: reduction over zero elements and the kernel has no identity")
        # an input that overlaps a given output is read from a copy (NumPy's ufuncs copy such inputs):
        # the outputs written first would otherwise be read as inputs by the later ones
        given_ins = list(call.ins)
        _copy_overlapping_inputs(call, self.in_params, self.out_params)
        # inputs: the broadcast shape with the reduced axes last
        perm = kept + list(axes)
        pshape = tuple(shape[d] for d in perm) or (1,)
        largs, values = [], {}
        for p, v, dt in zip(self.in_params, call.ins, call.in_types):
            if not isinstance(v, _Arr):
                largs.append((p, dt, "scalar", 0))
                values[p.name] = _scalar_value(v, dt, name, p.name)
            else:
                st = _broadcast_strides(v, shape)
                largs.append((p, dt, "array", 0))
                values[p.name] = (v, tuple(st[d] for d in perm) or (0,))
        rtype = self.reduce_type or DTYPES[call.out_types[0]][1]
        if call.device != "cpu" and self.identity is not None and _REDUCE_SIZES.get(rtype) and any(
                kind == "array" for _, _, kind, _ in largs) and all(
                kind != "array" or _dense(values[p.name][1], pshape, DTYPES[dt][2]) for p, dt, kind, _ in largs):
            self._rows(call, largs, values, kept, keepdims, out_size, red_size, rtype, plan)
            return ret
        if all(kind != "array" or _dense(values[p.name][1], pshape, DTYPES[dt][2]) for p, dt, kind, _ in largs):
            # dense with the reduced axes last: element (o, r) of every input at o * red_size + r,
            # no index decomposition per element (the CPU's loop; CUDA without an identity)
            self._last_path = "contig"
            in_layout = _codegen.Layout("contig", 1, largs)
            in_struct = _fill(in_layout, out_size * red_size, (out_size * red_size,), values)
        else:
            self._last_path = "strided"
            in_layout = _codegen.Layout("strided", len(pshape), largs)
            in_struct = _fill(in_layout, out_size * red_size, pshape, values)
        out_layout, out_struct = self._out_struct(call, kept, keepdims, out_size)

        params = _reduction_struct(type(in_struct), type(out_struct), False)(in_struct, out_struct, red_size)
        backend = "cpu" if call.device == "cpu" else "cuda"
        key = (call.device, in_layout.key(), out_layout.key(), call.type_map, call.in_types, call.out_types)
        compiled: Any = self._compiled.get(key)
        if compiled is None:
            tdefs = _typedefs(call, self.in_params, self.out_params)
            parts = {"map_expr": self.map_expr, "reduce_expr": self.reduce_expr,
                     "post_map_expr": self.post_map_expr, "identity": self.identity or "", "preamble": self.preamble}
            src, entry = _codegen.reduction_source(backend, name, in_layout, out_layout, True, self.map_expr,
                                                   self.reduce_expr, self.post_map_expr, self.identity, rtype,
                                                   self.preamble, tdefs)
            if backend == "cpu":
                compiled = _build.build_cpu(name, src, entry, parts)
            else:
                assert call.device is not None
                compiled = _gpu_kernel(name, src, entry, call.device, parts,
                                       _nvrtc_options(call.out_types, self.options))
            self._compiled[key] = compiled
        if backend == "cpu":
            run = _cpu_runner(compiled, _threads(out_size * red_size) if out_size > 1 else 1, type(params))
        else:
            assert call.device is not None
            run = _gpu_runner(compiled, max(1, min(out_size, 32 * _device_facts(call.device)[1])), 256, call.device)
        run(bytearray(bytes(params)), call.stream)
        plan(params, in_layout, out_layout, run)
        return ret
