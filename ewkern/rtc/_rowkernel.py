"""ewkern.RowKernel: a reduction over each row and an elementwise operation over the same row
that reads the row's result, in one kernel (rmsnorm, L2 normalisation, scaling by a row's max):
the row is read from memory once. CuPy has no such kernel (a ReductionKernel and an
ElementwiseKernel that broadcasts its result read the row twice); the parameters follow CuPy's
ReductionKernel and ElementwiseKernel (see their docstrings in _kernel.py)."""
from __future__ import annotations

import ctypes
import math
import os
import struct
from typing import Any, Callable

import numpy as np

from . import _build, _codegen
from . import _kernel as _kernel_mod
from ._kernel import (_C, _IDENT_OK, _MISS, _PROG_COLSUM, _REDUCE_SIZES, _SCALARS, WIDE_SM_GBS, _Arr, _broadcast_kind,
                      _broadcast_strides, _Call, _copy_overlapping_inputs, _cpu_runner, _ctypes_struct, _dense,
                      _device_facts, _fast_call, _fill, _partial_rows, _plan_slots, _pow2ceil, _prefetch_runner,
                      _record_plan, _scalar_value, _sm_bandwidth, _threads, _typedefs, _vector_head)
from ._params import DTYPES, parse_params

_MAX_G = 1024          # lanes per row at most (one block)
# vectors per lane kept in registers at most (ROW_FORMS). EWKERN_RTC_ROW_VECTORS=1|2|4 (read once)
# sets it and turns the few-rows rule (_FEW_ROWS_G) off: a knob for measuring row_plan, not for users
_ROW_VECTORS_KNOB = {"1": 1, "2": 2, "4": 4}.get(os.environ.get("EWKERN_RTC_ROW_VECTORS", ""))
_REG_VECTORS = _ROW_VECTORS_KNOB or 4
_MIN_BLOCK = _codegen.ROW_MIN_BLOCK
# resident lanes an SM that a kernel with column sums should keep (_cuda_run). On the H100 (tree
# 75e0425, rmsnorm's derived backward, rows of 4096): float32 at 80 registers held 768 lanes an SM
# and its forward + backward ran at 0.99-1.17 of torch.compile at 16-256 MiB; float16/bfloat16 at
# 106-108 registers held 512 and ran at 0.82-0.84 (at G = 256 with 2 vectors a lane, ptxas: 62-63
# registers, 1024 lanes). Since the partial row is stored as 16-byte vectors (387c9cb) float32 takes
# 81 registers (512 lanes) and so the wide form too (G 512, 2 vectors a lane, 50 registers)
_COLSUM_MIN_THREADS = 768
# a column-sum plan widens its blocks (fewer partial rows) where one partial row a group would add
# at least this share of the row kernel's bytes (written and read again by the column sum): the
# H200's measurements put the break-even near 7% (halving the partials saves half that share; the
# wider block's barrier cost about 3.5%)
_COLSUM_WIDEN_SHARE = 1 / 12
# EWKERN_RTC_COLSUM_TILES=N (read once): a column-sum kernel's blocks take at least N tiles of rows
# each (fewer blocks, fewer partial rows): a knob for measuring the tiles rule, not for users.
# H200 (b21f29a), rmsnorm's training step, float16 / bfloat16, 4 MiB (512 rows of 4096; the rule
# gives 1 tile, 256 blocks of 512), ewkern.torch / torch eager back-to-back: 1 tile 0.92 / 0.94,
# 2 tiles 0.77 / 0.77, 4 tiles 0.75 / 0.76, 8 tiles 0.51 / 0.51 (single step 1.00 / 1.01 ->
# 0.87 / 0.89 -> 0.79 / 0.82 -> 0.57 / 0.59), though under torch.profiler (kernels one at a time)
# 2 tiles ran the step's kernels in 19.2 us against 22.6
_COLSUM_TILES_KNOB = int(os.environ.get("EWKERN_RTC_COLSUM_TILES", "0") or 0)

# The lean two-pass form (VPL -2: 2 vectors a lane, the row read again from L2) instead of the
# register form at 4 vectors a lane, where the rows fill at least _LEAN_WAVES waves of it, every
# lane of it is resident, and the device's memory moves at least _LEAN_SM_GBS an SM by the formula
# (as the built-in ops' wide_sm: the H200, 37; not the H100, 25). rmsnorm, rows of 4096, against
# torch.compile (whose Triton kernel is such a form), lean / register form, back-to-back and single
# launch (2026-11-26, trees dc08292-920f008): H200 float32 256 MiB 1.008 / 0.988 and 0.991 / 0.970,
# 1 GiB 0.998 / 0.941 and 0.999 / 0.946, 16-bit 256 MiB +0.01-0.02, 1 GiB +0.05; at 128 MiB (16
# waves) 0.01-0.02 below the register form, at 16-64 MiB 0.01-0.07 below. H100 within 0.011 either
# way at 256 MiB-1 GiB (bfloat16 1 GiB 0.986 / 0.995 back-to-back): no rule there.
_LEAN_WAVES = 24
_LEAN_MIN_G, _LEAN_MAX_G = 128, 512      # measured at 128 (rows of 1024 float32), 256 and 512 lanes a row
_LEAN_SM_GBS = WIDE_SM_GBS
# a grid of fewer blocks than SMs runs one group a block where a group is at least this many lanes
_SPLIT_MIN_G = 64
# rows fewer than SMs: lanes a row at least (while a lane keeps 2 vectors or more; _cuda_run)
_FEW_ROWS_G = 256

_params_cache: dict[Any, type] = {}


def _params_struct(layout: _codegen.Layout) -> type:
    """ctypes twin of the generated ewrtc_params: the arguments, rows, cols, G, prefetch, tiles, wb."""
    key = layout.key()
    cls = _params_cache.get(key)
    if cls is None:
        cls = type("ewrtc_row_params", (ctypes.Structure,), {"_fields_": [
            ("a", _ctypes_struct(layout)), ("rows", ctypes.c_longlong), ("cols", ctypes.c_longlong),
            ("G", ctypes.c_longlong), ("prefetch", ctypes.c_longlong), ("tiles", ctypes.c_longlong),
            ("wb", ctypes.c_longlong)]})
        _params_cache[key] = cls
    return cls


# the type a column-sum output's partial rows accumulate in, per output dtype
_ACCUMULATE = {"float32": "float32", "float16": "float32", "bfloat16": "float32", "float64": "float64"}
_column_sums: dict[tuple[str, str], Any] = {}


def _cpu_column_sum(pdt: str, odt: str) -> Callable[[Any, int, Any, int], None]:
    """finish(partials, their address, out, stream) on the CPU: a ReductionKernel sums the partial
    rows (pdt: a row per thread) over axis 0 into out (odt)."""
    red = _column_sums.get((pdt, odt))
    if red is None:
        from ._kernel import ReductionKernel
        red = _column_sums[(pdt, odt)] = ReductionKernel(f"{pdt} p", f"{odt} y", "p", "a + b", "y = a", "0",
                                                         "ewkern_column_sum")
    return lambda part, ptr, out, stream: red(part, out=out, axis=0)


class _CudaColumnSum:
    """finish(partials, their address, out, stream) on CUDA: the row kernel's own column-sum entry
    (h) over nparts partial rows of cols elements into out; .launch(partials' address, out's
    address, stream) the same by addresses (what a warm call run in C has)."""

    def __init__(self, h: int, dev: int, nparts: int, cols: int) -> None:
        from .. import pdl_enabled
        self.h, self.dev, self.nparts, self.cols = h, dev, nparts, cols
        self.grid, self.pdl, self.C = -(-cols // 32), pdl_enabled, _C()

    def launch(self, ptr: int, out_ptr: int, stream: int) -> None:
        self.C._rtc_launch(self.h, self.grid, 32 * _codegen.COLSUM_SLICES,
                           struct.pack("<QQqq", ptr, out_ptr, self.nparts, self.cols), self.dev, stream, self.pdl())

    def __call__(self, part: Any, ptr: int, out: Any, stream: int) -> None:
        (view,), _ = self.C._rtc_views((out,), ("out",))
        self.launch(ptr, view[0], stream)

    def prog(self, offset: int) -> tuple[int, ...]:
        """launch as data (_kernel._PROG_COLSUM) with the two addresses at offset in the params."""
        return (_PROG_COLSUM, self.h, self.dev, 32 * _codegen.COLSUM_SLICES, self.grid, self.nparts, self.cols, offset)


def _cpu_threads(rows: int, n: int) -> int:
    """The threads a CPU row kernel runs on (its rows are split among them)."""
    return _threads(n) if rows > 1 else 1


def row_plan(nv: int) -> tuple[int, int]:
    """(G lanes per row, vectors per lane: 1, 2, 4, or 0 for the two-pass form) for rows of nv
    vectors: the fewest lanes (a power of two) that hold the row in at most 4 vectors each, and
    the fewest vectors per lane that then cover it; rows of more than 4 x 1024 vectors are read
    twice by 1024 lanes. Measured on the H100 (rmsnorm, rows of 4096, float32 and bfloat16, 1-64
    MiB, against torch.compile): more lanes with fewer vectors each never helped, even when the
    groups fill a small part of a wave (1 MiB: 64 rows; 1024 lanes x 1 vector was 0.85 of
    torch.compile in a single launch, 256 x 4 0.93), and 1024 x 1 lost up to half the speed at
    16-64 MiB. With fewer rows than SMs, _cuda_run gives a row at least _FEW_ROWS_G lanes (16-bit
    rows of 4096: 256 x 2, not 128 x 4)."""
    if nv > _REG_VECTORS * _MAX_G:
        return _MAX_G, 0
    G = min(_MAX_G, _pow2ceil(-(-nv // _REG_VECTORS)))
    return G, _pow2ceil(-(-nv // G))


class RowKernel:
    """A per-row reduction and an elementwise operation that uses its result, in one kernel.

    For every row (the last axis) of the inputs' broadcast shape, ``map_expr`` is mapped over the
    row's elements and reduced with ``reduce_expr`` from ``identity`` into ``a``; then
    ``operation`` runs over the same row's elements with ``a`` in scope and assigns the outputs,
    which have the broadcast shape. An RMS norm with a weight::

        rmsnorm = ewkern.RowKernel(
            "T x, T w, float32 eps", "T y",
            map_expr="x * x", reduce_expr="a + b", identity="0",
            operation="y = x * rsqrt(a / _row_size + eps) * w", name="rmsnorm")
        y = rmsnorm(x, w, 1e-6)          # x: [..., n], w: [n]

    Args:
        in_params, out_params: parameters as for ElementwiseKernel (``'T x, float32 eps'``; no
            raw parameters). Inputs broadcast against the rows: an input may be the full shape,
            one row (``[n]``: a weight), one value per row (``[..., 1]``) or a scalar.
        map_expr: an expression of the inputs for one element (``'x * x'``); ``i`` is the
            element's flat index.
        reduce_expr: combines two mapped values ``a`` and ``b`` (``'a + b'``, ``'max(a, b)'``).
        operation: statements for one element assigning the outputs, with the inputs, ``a`` (the
            row's reduced value, of ``reduce_type``), ``i``, ``_row_size`` (the row's length) and
            ``_ind.size()`` (all elements) in scope.
        identity: the reduction's start value as C++ code (``'0'``, ``'-INFINITY'``); required.
        name: the kernel's name. reduce_type: the C++ type of ``a`` and ``b`` (default the first
            output's compute type: ``float`` for 16-bit and float32 outputs). preamble, options:
            as for ElementwiseKernel.

    Calling it: ``kernel(*inputs, *outputs)``; outputs are optional (allocated otherwise, in the
    framework and on the device of the first array input of a float dtype, else of the first
    array input). Returns the output, or a tuple of them.

    Where it runs: on CUDA, one group of lanes per row takes the row's 16-byte vectors and
    keeps them in registers (up to 4096 vectors a row: 64 KiB of the widest array), combines in
    a fixed tree so that every lane has ``a``, then computes and stores the row from registers:
    one read and one write of each element (longer rows are read a second time, mostly from
    L2; so are many rows on GPUs of >= 30 GB/s an SM, in the lean two-pass form: _LEAN_WAVES).
    The lanes a row gets are fixed per row length (and, for the lean form, the number of rows, so
    a row's bits may differ between a few rows and many) when the kernel is compiled (one compile
    for each lane count, a fraction of a second). On the CPU each row is reduced in column order,
    then computed (rows in parallel with OpenMP). Results do not change from call to call (CPU and
    GPU may differ in rounding). An
    output may be the very same array as an input (in place); inputs that otherwise overlap an
    output are read from a copy.
    """

    def __init__(self, in_params: str, out_params: str, map_expr: str, reduce_expr: str, operation: str,
                 identity: str, name: str = "row_kernel", reduce_type: str | None = None, preamble: str = "",
                 options: tuple[str, ...] = (), _stage2: tuple[str, str, str] | None = None,
                 _colsum: tuple[str, ...] = (), _consts: tuple[tuple[str, str], ...] = ()) -> None:
        if not isinstance(name, str) or not _IDENT_OK(name):
            raise ValueError(f"RowKernel: name must be a C identifier, got {name!r}")
        for what, v in (("map_expr", map_expr), ("reduce_expr", reduce_expr), ("operation", operation),
                        ("preamble", preamble)):
            if not isinstance(v, str):
                raise TypeError(f"{name}: {what} must be a str of C++ code, got {type(v).__name__}")
        if identity is None:
            raise ValueError(f"{name}: a RowKernel needs an identity (the reduction's start value, e.g. '0')")
        self.name = name
        self.in_params = parse_params(in_params, False, name)
        self.out_params = parse_params(out_params, True, name)
        for p in self.in_params + self.out_params:
            if p.raw:
                raise ValueError(f"{name}: raw parameters ({p.name}) are not supported by RowKernel")
        if not self.out_params:
            raise ValueError(f"{name}: a RowKernel needs at least one output parameter")
        names = [p.name for p in self.in_params + self.out_params]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{name}: parameter name(s) {dup} appear more than once")
        if "i" in names:   # as ElementwiseKernel (CuPy's rule): the element's index is in scope as i
            raise ValueError(f"{name}: can not use 'i' as a parameter name (it is the element's index)")
        self.nin, self.nout = len(self.in_params), len(self.out_params)
        self.nargs = self.nin + self.nout
        self.map_expr, self.reduce_expr, self.operation = map_expr, reduce_expr, operation
        self.identity = str(identity)
        self.reduce_type = reduce_type
        self.preamble = preamble
        # (map2_expr, reduce2_expr, identity2): a second reduction over the row after the first
        # (ewkern.torch's derived backwards; _codegen.row_source), its result in the operation
        # as _ewk_s
        self._stage2: tuple[str, str, str] | None = None
        if _stage2 is not None:
            m2, r2, i2 = _stage2
            self._stage2 = (str(m2), str(r2), str(i2))
        # outputs that receive the sum over the rows of their values, shape [cols] (a weight row's
        # gradient in ewkern.torch's derived backwards): summed in the kernel into a few partial
        # rows, then over those, instead of written per element and summed afterwards
        self._colsum = tuple(_colsum)
        for c in self._colsum:
            if c not in [p.name for p in self.out_params]:
                raise ValueError(f"{name}: _colsum names {c!r}, which is not an output")
            if not _codegen.writes_only(operation, c):
                raise ValueError(f"{name}: a column-sum output ({c}) must be written only")
        # row constants ((name, expression with `a` in scope), ...): computed once a row after the
        # first reduction, in scope in the second's map and in the operation (the derived
        # backwards' parts over a, the row's length and the scalars)
        self._consts = tuple((str(n), str(c)) for n, c in _consts)
        self.options = tuple(options)
        self._compiled: dict[tuple[Any, ...], Any] = {}
        self._waves: dict[tuple[int, int], int] = {}
        self._last_path = ""
        self._plans: dict[Any, Any] = {}      # warm calls: signature -> plan (see _kernel._fast_call)
        self._cplans: dict[Any, Any] = {}     # the same plans for the C module's _rtc_fast

    def __repr__(self) -> str:
        return f"<ewkern.RowKernel {self.name!r}>"

    def _parts(self) -> dict[str, str]:
        parts = {"map_expr": self.map_expr, "reduce_expr": self.reduce_expr, "operation": self.operation,
                 "identity": self.identity, "preamble": self.preamble}
        if self._stage2:
            parts.update(map2_expr=self._stage2[0], reduce2_expr=self._stage2[1])
        if self._consts:
            parts.update(row_consts="; ".join(f"{n} = {c}" for n, c in self._consts))
        return parts

    def _dense_input(self, call: _Call, k: int, v: _Arr, shape: tuple[int, ...]) -> _Arr:
        """Input k broadcast to shape and made C-contiguous (a broadcast the row kernel cannot
        read in place: [r, 1, n] against [r, m, n], a strided CPU view)."""
        if call.device == "cpu":
            view = np.lib.stride_tricks.as_strided(v.np, shape, _broadcast_strides(v, shape), writeable=False)
            c = np.ascontiguousarray(view)
            return _Arr(c, v.dtype, c.shape, c.strides, c.__array_interface__["data"][0], c, "cpu")
        res, a = call.alloc(v.dtype, shape, self.in_params[k].name)
        _broadcast_copy()(v.obj, res)
        a.obj = res
        return a

    def __call__(self, *args: Any) -> Any:
        if self._plans:
            if self._cplans:   # as ElementwiseKernel.__call__
                r = (_kernel_mod._C_mod or _C())._rtc_fast(self._cplans, args, self.nin, None, _SCALARS)
                if r is not NotImplemented:
                    return r
            r = _fast_call(self, self._plans, args, self.nin, c_tried=True)
            if r is not _MISS:
                return r
        name = self.name
        if len(args) not in (self.nin, self.nargs):
            raise TypeError(f"{name}: wrong number of arguments: expected {self.nin} inputs or {self.nargs} "
                            f"with the outputs, got {len(args)}")
        ins, outs = args[:self.nin], args[self.nin:]
        call = _Call(name, self.in_params, self.out_params, ins, outs)
        shapes = [v.shape for v in call.ins + call.outs if isinstance(v, _Arr)]
        try:
            shape = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
        except ValueError:
            raise ValueError(f"{name}: shapes {', '.join(map(str, shapes))} do not broadcast together") from None
        if not shape:
            raise ValueError(f"{name}: a RowKernel needs an array input of at least one dimension (its rows are "
                             "the last axis)")
        colsum = self._colsum
        for p, v in zip(self.out_params, call.outs):
            want = shape[-1:] if p.name in colsum else shape
            if v.shape != want:
                raise ValueError(f"{name}: output {p.name} has shape {v.shape}; expected {want}"
                                 f"{' (a column sum)' if p.name in colsum else ''}")
        results = list(outs)
        for k in range(len(outs), self.nout):
            p = self.out_params[k]
            res, a = call.alloc(call.out_types[k], shape[-1:] if p.name in colsum else shape, p.name)
            results.append(res)
            call.outs.append(a)
        ret = results[0] if self.nout == 1 else tuple(results)
        cols = shape[-1]
        rows = math.prod(shape[:-1])
        if rows * cols == 0:
            return ret
        given_ins = list(call.ins)
        _copy_overlapping_inputs(call, self.in_params, self.out_params)
        # the outputs: dense over the shape (a strided CPU output is computed apart and copied in;
        # where the operation reads it, `y = y + ...`, it starts as the caller's values)
        back = []
        reads = {p.name for p in self.out_params if not _codegen.writes_only(self.operation, p.name)}
        for k, (p, v) in enumerate(zip(self.out_params, call.outs)):
            if p.name not in colsum and not _dense(v.strides, shape, DTYPES[v.dtype][2]):
                res, a = call.alloc(v.dtype, shape, p.name)
                if p.name in reads:
                    np.copyto(a.np, v.np)
                back.append((v, a))
                call.outs[k] = a
        largs, values = [], {}
        for k, (p, v, dt) in enumerate(zip(self.in_params, call.ins, call.in_types)):
            if not isinstance(v, _Arr):
                largs.append((p, dt, "scalar", 0))
                values[p.name] = _scalar_value(v, dt, name, p.name)
                continue
            kind = _broadcast_kind(v, _broadcast_strides(v, shape), shape)
            if kind is None:
                v = call.ins[k] = self._dense_input(call, k, v, shape)
                kind = "array"
            largs.append((p, dt, kind, 0))
            values[p.name] = (v, None)
        for p, v, dt in zip(self.out_params, call.outs, call.out_types):
            if p.name in colsum:   # the kernel's partial rows (in dt's compute type): allocated below
                largs.append((p, dt, "colsum", 0))
                values[p.name] = (_Arr(None, _ACCUMULATE[dt], (0,), (0,), 0, None, v.device), None)
                continue
            largs.append((p, dt, "array", 0))
            values[p.name] = (v, None)
        layout = _codegen.Layout("contig", 1, largs)
        P = _params_struct(layout)(_fill(layout, rows * cols, (rows * cols,), values), rows, cols, 1, 0, 1)
        rtype = self.reduce_type or DTYPES[call.out_types[0]][1]
        cs_outs = [(k, p) for k, p in enumerate(self.out_params) if p.name in colsum]
        if call.device == "cpu":
            run = self._cpu_run(call, layout, rtype, reads, P, rows * cols)
            nparts = _cpu_threads(rows, rows * cols)
            finish = [_cpu_column_sum(_ACCUMULATE[call.out_types[k]], call.out_types[k]) for k, _ in cs_outs]
        else:
            run, nparts, finish = self._cuda_run(call, layout, values, rtype, reads, P, rows, cols)
        partials = []
        for (k, p), fin in zip(cs_outs, finish):
            obj, ptr = _partial_rows(call.device, call.like, _ACCUMULATE[call.out_types[k]], (nparts, cols))
            setattr(P.a, "p_" + p.name, ptr)
            partials.append((obj, ptr, k, fin))
        run(bytearray(bytes(P)), call.stream)
        for dst, tmp in back:
            np.copyto(dst.np, tmp.np)
        for obj, ptr, k, fin in partials:   # the sum over the partial rows, in a fixed order
            fin(obj, ptr, results[k], call.stream)
        if not back and all(a is b for a, b in zip(given_ins, call.ins)):
            pos = {p.name: k for k, p in enumerate(self.in_params + self.out_params)}
            S = _ctypes_struct(layout)
            slots = _plan_slots(S, type(P).a.offset, layout, pos)
            cs = [(type(P).a.offset + getattr(S, "p_" + p.name).offset, _ACCUMULATE[call.out_types[k]],
                   (nparts, cols), k, fin) for (k, p), fin in zip(cs_outs, finish)]
            _record_plan(self, args, call, P, slots, run, "one" if self.nout == 1 else "tuple",
                         [shape[-1:] if p.name in colsum else shape for p in self.out_params[len(args) - self.nin:]],
                         colsum=cs)
        return ret

    def _source(self, backend: str, call: _Call, layout: _codegen.Layout, E: int, rtype: str,
                reads: set[str], G: int | None = None, combine: bool = True) -> tuple[str, list[str]]:
        tdefs = _typedefs(call, self.in_params, self.out_params)
        return _codegen.row_source(backend, self.name, layout, E, self.map_expr, self.reduce_expr, self.operation,
                                   self.identity, rtype, self.preamble, tdefs, reads, self._stage2, G,
                                   self._consts, combine)

    def _cpu_run(self, call: _Call, layout: _codegen.Layout, rtype: str, reads: set[str], P: Any,
                 n: int) -> Callable[[bytearray, int], None]:
        """run(buf, stream) of the CPU kernel (compiled on first use)."""
        key = ("cpu", layout.key(), call.type_map, call.in_types, call.out_types, rtype)
        fn = self._compiled.get(key)
        if fn is None:
            src, (entry,) = self._source("cpu", call, layout, 1, rtype, reads)
            fn = self._compiled[key] = _build.build_cpu(self.name, src, entry, self._parts())
        self._last_path = "cpu"
        return _cpu_runner(fn, _cpu_threads(P.rows, n), type(P))

    def _cuda_run(self, call: _Call, layout: _codegen.Layout, values: dict[str, Any], rtype: str, reads: set[str],
                  P: Any, rows: int, cols: int) -> tuple[Callable[[bytearray, int], None], int, list[Any]]:
        """(run(buf, stream), partial rows, finish per column-sum output) of the CUDA kernel
        (compiled on first use): the plan of row_plan (or the lean two-pass form, _LEAN_WAVES),
        the first wave's L2 prefetch when PDL is on;
        with column-sum outputs a wave of blocks that take P.tiles tiles of rows each, one partial
        row per group, and each output's sum of them (_CudaColumnSum)."""
        device = call.device
        assert device is not None   # an array argument set it
        vec = [values[p.name][0] for p, _, kind, _ in layout.args if kind in ("array", "bcol")]
        E = 16 // max(DTYPES[a.dtype][2] for a in vec)
        if cols % E or _vector_head(vec, E) != 0:
            E = 1
        dev = int(device.split(":")[1])
        sms = _device_facts(device)[1]

        def form(G: int, vpl: int, combine: bool = True) -> tuple[tuple[Any, ...], Any, int, int]:
            """(the entries compiled for G lanes, the VPL form's entry, its block, resident blocks
            of it a wave holds); combine=False: without the column sums' combine across a block's
            groups (its shared memory and its larger launch bound)"""
            # compiled per G (the lanes' arithmetic in constants): one hidden size, one compile
            key = (device, E, G, combine, layout.key(), call.type_map, call.in_types, call.out_types, rtype)
            hs = self._compiled.get(key)
            if hs is None:
                if rtype not in _REDUCE_SIZES and self.reduce_type is None:
                    raise TypeError(f"{self.name}: cannot reduce in {rtype}")
                src, entries = self._source("cuda", call, layout, E, rtype, reads, G, combine)
                cc, _ = _device_facts(device)
                image, _, _ = _build.compile_cuda(self.name, src, cc, parts=self._parts(),
                                                  options=_kernel_mod._nvrtc_options(call.out_types, self.options))
                hs = self._compiled[key] = tuple(_C()._rtc_load(image, e, dev) for e in entries)
            block = max(_MIN_BLOCK, G)
            h = hs[_codegen.ROW_FORMS.index(vpl)]
            return hs, h, block, wave(h, block)

        def wave(h: int, block: int) -> int:
            """blocks of `block` lanes of entry h resident on the device at once"""
            w = self._waves.get((h, block))
            if w is None:
                w = self._waves[(h, block)] = sms * _C()._rtc_occupancy(h, block, dev)
            return w

        G, vpl = row_plan(cols // E)
        few_rows = rows < sms and G >= _SPLIT_MIN_G and not _ROW_VECTORS_KNOB
        if few_rows and not self._colsum and not self._stage2:
            # a row an SM at most (the grid below is one group a block): that SM's warps are the
            # row's lanes, so the row gets at least _FEW_ROWS_G of them (8 warps) while a lane keeps
            # 2 vectors or more. H200, rmsnorm, rows of 4096, against torch.compile, lanes x vectors
            # a lane (EWKERN_RTC_ROW_VECTORS, two runs each): 16-bit at 1 MiB (128 rows) 128 x 4 /
            # 256 x 2 / 512 x 1 single launch 0.947-0.961 / 0.977-1.012 / 0.947-0.978, back-to-back
            # 1.33-1.35 / 1.45-1.46 / 1.54-1.55; float32 at 1 MiB (64 rows) 256 x 4 / 512 x 2
            # single 0.964-1.010 / 0.968-0.978, back-to-back 1.407 / 1.408 (so 256 lanes suffice);
            # at 16 MiB (rows > SMs, not taken here) 4 vectors a lane was the best or within 0.01
            if G < _FEW_ROWS_G and vpl > 2:     # 4 vectors a lane: twice the lanes with 2 each
                G, vpl = 2 * G, vpl // 2
        lean = None
        vec_bytes = E * max(DTYPES[a.dtype][2] for a in vec)    # 16 unless the rows take one element a vector
        if (not self._colsum and not self._stage2 and vpl == _REG_VECTORS and _LEAN_MIN_G <= 2 * G <= _LEAN_MAX_G
                and vec_bytes == 16):
            mt, sm_gbs = _sm_bandwidth(device)
            if sm_gbs >= _LEAN_SM_GBS and rows * 2 * G >= _LEAN_WAVES * sms * mt:
                lean = form(2 * G, -2)
                if lean[3] * lean[2] < sms * mt:    # not every lane resident: the register form
                    lean = None
        if lean is not None:
            G, vpl = 2 * G, -2
            hs, h, block, w = lean
        else:
            hs, h, block, w = form(G, vpl)
        if self._colsum and vpl > 1 and 2 * G <= _MAX_G and w * block < _COLSUM_MIN_THREADS * sms:
            # a column sum holds its lanes' columns in registers across the tiles: when that leaves
            # few lanes resident, twice the lanes with half the vectors each, if more of them fit
            wide = form(2 * G, vpl // 2)
            if wide[3] * wide[2] > w * block:
                G, vpl = 2 * G, vpl // 2
                hs, h, block, w = wide
        P.G = G
        csizes = _codegen.colsum_bytes([dt for _, dt, kind, _ in layout.args if kind == "colsum"])
        combine = bool(self._colsum) and _codegen.colsum_combines(G, vpl, E, csizes)
        if combine:
            # the block's groups add their column sums together (one partial row a block, written
            # and read again by the column sum). Where one partial row a group would add at least
            # _COLSUM_WIDEN_SHARE to the row kernel's traffic, the most lanes a block, up
            # to COLSUM_BLOCK, that keep as many lanes resident (float16 rmsnorm, G 256 at 64
            # registers: 2 blocks of 512 an SM, as 4 of 256, and half the partial rows). A wider
            # block's barrier between tiles holds more warps: H200, float16 rmsnorm's training
            # step, 16 MiB (partials 34% of the traffic) 1.00 -> 1.12 of torch eager; 256 MiB (2%)
            # 1.46 -> 1.41 with blocks of 512
            resident, b, wider = w * block, 2 * block, block
            groups = -(-rows // (block // G))
            parts = -(-groups // -(-groups // min(groups, w))) * (block // G)
            dense = sum(DTYPES[dt][2] for _, dt, kind, _ in layout.args if kind == "array")
            while b <= _codegen.COLSUM_BLOCK and 2 * parts * sum(csizes) >= _COLSUM_WIDEN_SHARE * rows * dense:
                if wave(h, b) * b >= resident:
                    wider = b
                b *= 2
            if block // G == 1 and wider == block:
                # one group a block: nothing to combine, and the combine's shared memory (up to
                # COLSUM_SMEM a block) would only take L1's share. Its form without (float32
                # rmsnorm, G 256 x 4 at 80 registers: 3 blocks of 256 an SM, 1 of 512)
                combine = False
                hs, h, block, w = form(G, vpl, False)
            else:
                block, w = wider, wave(h, wider)
        grid = -(-rows // (block // G))
        if not self._colsum and _SPLIT_MIN_G <= G < block and grid < sms:
            # fewer blocks than SMs: one group a block, so that more SMs pull rows at once. 16-bit
            # rmsnorm at 1 MiB (128 rows of 4096 at G 128) ran in 64 blocks of two rows at 0.89-0.92
            # of torch.compile's single launch (a row a block there); float32's 64 rows in 64 blocks
            # at 0.97. Measured (93b887f, 1 MiB 16-bit, with / without): single launch +0.00-0.02,
            # back-to-back +0.02-0.06 on both GPUs; the rest of the gap is elsewhere (mse_rows, a
            # row a block already, is at 0.92 too)
            block, w = G, wave(h, G)
            grid = rows
        if self._colsum:   # a wave of blocks, each over P.tiles tiles of rows: few partial rows
            P.tiles = max(-(-grid // min(grid, w)), _COLSUM_TILES_KNOB)
            grid = -(-grid // P.tiles)
        # the default path's store rule for the outputs (write-back where the next kernel may read
        # them from the L2: at least 1/32 of it, or a launch past it), by the bytes of the rows
        elems = {"array": rows * cols, "bcol": cols, "brow": rows}
        moved = out_bytes = 0
        for p, dt, kind, _ in layout.args:
            b = elems.get(kind, 0) * DTYPES[dt][2]
            moved += b
            out_bytes += b if p.is_output else 0
        # the lean form streams its result whatever the rule (EWKERN_AUTO_STORES=wb aside): its
        # second pass reads each row again from the L2, where written-back results would take the
        # room. H200, rmsnorm over rows of 4096 at 1 GiB back-to-back (the lean form's plan the
        # same in both builds, the store the one difference in its source): 6fcfb9d (streaming)
        # 497.6 / 501.3 us float32 / float16, 3cb4b08 (the rule: write-back past the L2) 502.3-505.2
        # / 508.6-511.1, two rounds in turns; this form not yet timed on a GPU. Its answer is the
        # rule's for a launch that moves nothing: streaming unless the knob forces write-back
        P.wb = int(_C()._rtc_store_wb(dev, moved if vpl > 0 else 0, out_bytes if vpl > 0 else 0))
        self._last_path = f"rows G={G} VPL={vpl} E={E}" + (f" tiles={P.tiles} block={block}" if self._colsum else "")
        nparts = grid if combine else grid * (block // G)
        finish = [_CudaColumnSum(hs[len(_codegen.ROW_FORMS) + j], dev, nparts, cols)
                  for j in range(len(self._colsum))]
        return _prefetch_runner(h, grid, block, dev, type(P).prefetch.offset, w), nparts, finish


_copy_kernel: list[Any] = []


def _broadcast_copy() -> Any:
    """An ElementwiseKernel that writes x broadcast into y (made once)."""
    if not _copy_kernel:
        from ._kernel import ElementwiseKernel
        _copy_kernel.append(ElementwiseKernel("T x", "T y", "y = x", "ewkern_broadcast_copy"))
    return _copy_kernel[0]


__all__ = ["RowKernel", "row_plan"]
