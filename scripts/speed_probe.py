"""Probes for choosing the default path's rules on a GPU machine (not part of the package).

    python scripts/speed_probe.py variants OP DTYPE VARIANT[,VARIANT...] SIZE[,SIZE...]
        ewkern's variants against torch's op, both timing methods of `ewkern.bench peers`
        (back-to-back graph replay over rotated inputs; single launch after an L2 flush and a
        sleep kernel), through the same frameworks.time_calls code. Environment knobs
        (EWKERN_AUTO_VPT, EWKERN_AUTO_BLOCK, EWKERN_PDL, EWKERN_PDL_PREFETCH) apply as set.
        PROBE_METHODS=b2b,single,after picks the methods (after: peers' after_torch, the op's
        cost after a torch.mul); default b2b,single.
    python scripts/speed_probe.py gelu-accuracy [N]
        ewkern.gelu in float32 on N (default 2^24) inputs spread over [-15, 6] plus random bit
        patterns, against a float64 reference (torch.special.erfc on the GPU): the largest error
        in units of eps(float32) x |ref|, against the stated bound 4 + 2 a^2, and where it is.
    python scripts/speed_probe.py rmse DTYPE LAYOUT BATCHESxN[,BATCHESxN...]
        ewkern.rmse (auto) against torch.dot over the same elements, back-to-back as
        `ewkern.bench rmse_grid` times them (LAYOUT first: [batches, n]; last: [n, batches]).
        Environment knobs (EWKERN_RMSE_SHORT_N, EWKERN_RMSE_SHORT_COLS_N, EWKERN_PDL) apply as set;
        PROBE_NO_DOT=1 times ewkern only.
    python scripts/speed_probe.py rtc SIZE[,SIZE...] [DTYPE,...]
        user kernels (ewkern.ElementwiseKernel / ReductionKernel) against the same source in CuPy,
        torch eager and ewkern's own ops, both timing methods: o = a * b + c (torch.addcmul too),
        z = x + y (ewkern.add), the per-row mean square of [rows, 4096] and the sum of squares of
        the whole array; "ewkern wide": the elementwise ones planned with the launch rule's `wide`
        case (ewkern.rtc._kernel.RTC_WIDE). SIZE is bytes per input array.
    python scripts/speed_probe.py fastmath SIZE[,SIZE...] DTYPE[,DTYPE...] [ROUNDS]
        user ElementwiseKernels (fused's swish_gate, gelu_mul, fma and add) compiled with IEEE
        division (--prec-div=true), as the package compiles them and with NVRTC's
        --use_fast_math, against torch.compile of the same expression, in turns
        (frameworks.time_calls_in_turns), single launch and back-to-back, ROUNDS (default 2)
        rounds; also the largest difference of each build's results from the IEEE build's in
        units of the output dtype's eps x |result|.
    python scripts/speed_probe.py rownorm SIZE[,SIZE...] DTYPE[,DTYPE...] PLAN[,PLAN...]
        an rmsnorm RowKernel over rows of 4096 (PROBE_ROW_COLS) against torch.compile's, both
        timing methods; PLAN is auto, reg (row_plan's register form), G (lanes per row, vectors
        per lane the fewest that hold the row), Gl (G lanes, the two-pass form), Gt (G lanes,
        the lean two-pass form) or nosplit (auto without a block a group for small grids).
        PROBE_ROW_VARIANTS: source variants (div, ieee and those of _row_source_variants, joined
        by "_": div_ieee).
    python scripts/speed_probe.py backward OP[,OP...] DTYPE SIZE[,SIZE...]
        each OP_backward(grad, x, out=) against ewkern.mul and torch.mul (the same bytes), GB/s,
        back-to-back and single launch.
    python scripts/speed_probe.py rows SIZE[,SIZE...] DTYPE[,DTYPE...] VARIANT[,VARIANT...]
        the mean of (a - b)^2 over rows of 4096 (the `fused` experiment's mse_rows) as an
        ewkern.ReductionKernel built from source variants of the rows engine (_rows_source_variants:
        base (as the host builds it); lbN: __launch_bounds__(256, N), lb0 none; bulk: one
        cp.async.bulk.prefetch.L2 of each input's
        row by lane 0 before the loads; launches of base's source: nopf (PDL without the first
        wave's L2 prefetch), pdloff (without PDL), v8 (up to 8 vectors a lane: half the lanes a
        row); cap: with the rows cap (the package's default), which every other variant runs
        without; cv<P>: base's, the kernel's shared-memory carveout preference set to P%),
        against torch.compile and CuPy's ReductionKernel of the same source, both timing methods.
        SIZE is bytes per input.
    python scripts/speed_probe.py rmse-overhead
        host microseconds per call on tiny torch tensors: rmse with and without out=, its
        versions and axes, against ewkern.add(out=), the same way as `ewkern.bench overhead`.
    python scripts/speed_probe.py cold OP DTYPE SIZE[,SIZE...] [REPEATS]
        for Nsight Compute (scripts/ncu-cold.sh runs it): per size, REPEATS (default 3) rounds of
        [L2 flush, sleep kernel, ewkern's op (PDL as set), L2 flush, sleep kernel, torch's op, and
        with PDL on, the same ewkern launch with PDL off], each launch inside an NVTX range named
        "<impl> OP DTYPE SIZE" that ncu's --nvtx-include can pick, on inputs in the op's domain.
    python scripts/speed_probe.py placement OP DTYPE SIZE[,SIZE...] [ROUNDS]
        does where the buffers lie move a single launch? Per size, ROUNDS (default 4) rounds,
        each on two fresh buffer sets X and Y: single launches (the peers' method) of ewkern on X,
        torch on X, ewkern on Y, torch on Y and ewkern with PDL off on X; prints the same-buffer
        ratios (torch X / ewkern X, torch Y / ewkern Y) and the cross ones (torch Y / ewkern X,
        torch X / ewkern Y), as the harness compares buffers of their own. PROBE_METHODS=single,b2b
        (b2b: each way rotates through the same list of sets). PROBE_TURNS=1: the five ways timed in
        turns (frameworks.time_calls_in_turns), not one after another.
    python scripts/speed_probe.py inherit OP DTYPE SIZE[,SIZE...] [ROUNDS]
        what does a single launch inherit from the kernels before it? Per size, ROUNDS (default 3)
        rounds on one shared buffer set (frameworks.SharedSets): torch / ewkern single-launch
        ratios timed one way after another (ewkern first, then torch first: "seq"), in turns
        rotating (a b, b a: "rotate"), always in one order ("alternate"), in runs of 8 ("runs"),
        alternating with a torch.mul on buffers of its own after each sample ("alt+mul") or an
        event recorded after each (more commands a sample, no kernel: "alt+event"), rotating
        and alternating with the host waiting for each sample before it queues the next ("rotate
        lag1", "alt lag1"; LAG_SAMPLES 1), one after another and rotating with a flush of 4x the
        L2 ("seq flush4x", "rotate flush4x") and with a flush read by one ewkern.rmse instead of
        torch's sum ("seq ewflush", "rotate ewflush"), one after another on a torch stream of its
        own instead of the default stream ("seq side stream"), and ewkern against itself
        alternating ("ew/ew", the control: 1.00). Each form also prints both ways' median microseconds over each phase of
        four of their samples: on the H200 (2026-11-27), one after another with the 2x read
        flush, the four phases sat 0, +0.35, +0.35 and +1.1 us apart at 1 MiB in every series
        (some phase first), and under "rotate" which phases fell to which way changed by process.
"""
import contextlib
import math
import re
import sys

import os
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ewkern
from ewkern.bench import frameworks
from ewkern.bench.rmse_grid import _dot_build
from ewkern.bench.overhead import per_call_seconds
from ewkern.bench.timing import TimingConfig, summarize
from ewkern.bench.units import ITEMSIZE, parse_bytes


def median_s(t):
    """The median seconds per launch of a frameworks.Timing, as the harness reports it."""
    return summarize(t.samples_s)["median"]


def median_or_nan(cfg, label, impl, make_call, nbytes, cache):
    """median_s of one way's timing, or NaN with the error printed (a probe, not a test); the
    peers' cached memory goes back to the driver after it."""
    try:
        return median_s(frameworks.time_calls(cfg, impl, make_call, nbytes, cache))
    except Exception as e:
        print(f"  {label}: {type(e).__name__}: {e}", flush=True)
        return float("nan")
    finally:
        frameworks.release_peer_memory()


def ew_call(op, ins, out, **kw):
    """A zero-argument call of ewkern's op on ins into out (fill writes out), with the scalars the
    peers' torch ops use (1.0, and 0.5 for axpby's beta); kw goes to the op (variant=...)."""
    fn = getattr(ewkern, op)
    scalars = (1.0, 0.5)[:{"fill": 1, "add_const": 1, "mul_const": 1, "axpby": 2}.get(op, 0)]
    if op == "fill":
        return lambda: fn(out, *scalars, **kw)
    return lambda: fn(*ins, *scalars, out=out, **kw)


def variants(op, dtype, names, sizes):
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    for size in sizes:
        n = size // ITEMSIZE[dtype]
        methods = {"b2b": "rotate", "single": "flush", "after": "rotate"}
        for method in os.environ.get("PROBE_METHODS", "b2b,single").split(","):
            cache, row = methods[method], []
            before = frameworks.foreign_call(dtype, (n,), "cuda:0") if method == "after" else None
            make_t, set_b, _, _ = frameworks.elementwise_call("torch", op, dtype, (n,), "cuda:0")
            t_torch = frameworks.time_calls(cfg, "torch", make_t, set_b, cache, before=before)
            med_torch = median_s(t_torch)
            for v in names:
                def make_call(v=v):
                    ins = frameworks.op_inputs("torch", op, (n,), dtype, "cuda:0")
                    out = torch.empty((n,), dtype=frameworks._torch_dtype(dtype), device="cuda:0")
                    return ew_call(op, ins, out, variant=v)
                t = frameworks.time_calls(cfg, "torch", make_call, set_b, cache, before=before)
                med = median_s(t)
                row.append(f"{v} {med_torch / med:.3f}")
            print(f"{op} {dtype} {size >> 20} MiB {method}: torch {med_torch * 1e6:.2f} us | " + " | ".join(row),
                  flush=True)
            frameworks.release_peer_memory()


def backward_ops(ops, dtype, sizes):
    """Each OP_backward(grad, x, out=) against ewkern.mul(a, b, out=) (the same bytes: two reads and
    a write of n elements) and torch.mul, back-to-back and single launch: GB/s."""
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    tdt = frameworks._torch_dtype(dtype)
    for size in sizes:
        n = size // ITEMSIZE[dtype]
        nbytes = 3 * size
        for method, cache in (("b2b", "rotate"), ("single", "flush")):
            def make(fn):
                def make_call():
                    a = torch.randn(n, dtype=tdt, device="cuda:0")
                    b = torch.randn(n, dtype=tdt, device="cuda:0")
                    o = torch.empty_like(a)
                    return lambda: fn(a, b, o)
                return make_call
            ways = [("torch.mul", lambda a, b, o: torch.mul(a, b, out=o)), ("mul", lambda a, b, o: ewkern.mul(a, b, out=o))]
            ways += [(f"{op}_backward", lambda a, b, o, f=getattr(ewkern, f"{op}_backward"): f(a, b, out=o)) for op in ops]
            row = [f"{w} {nbytes / median_s(frameworks.time_calls(cfg, 'torch', make(fn), nbytes, cache)) / 1e9:.0f}"
                   for w, fn in ways]
            print(f"backward {dtype} {size >> 20} MiB {method} GB/s: " + " | ".join(row), flush=True)
            frameworks.release_peer_memory()


def gelu_accuracy(n):
    g = torch.Generator(device="cuda").manual_seed(0)
    lin = torch.linspace(-15.0, 6.0, n // 2, device="cuda", dtype=torch.float64).float()
    bits = torch.randint(-2**31, 2**31 - 1, (n // 2,), device="cuda", generator=g, dtype=torch.int32).view(torch.float32)
    bits = bits[torch.isfinite(bits)]
    x = torch.cat([lin, bits])
    y = torch.from_dlpack(ewkern.gelu(x)).double()
    xd = x.double()
    ref = 0.5 * xd * torch.special.erfc(-xd / math.sqrt(2.0))
    fin = torch.isfinite(ref) & (ref.abs() >= 2.0 ** -126)
    err = (y - ref).abs()[fin] / (ref.abs()[fin] * 2.0 ** -23)
    bound = 4 + 2 * xd[fin] ** 2
    ratio = err / bound
    i = int(torch.argmax(ratio))
    small = xd[fin].abs() < 2
    print(f"gelu float32: {int(fin.sum())} inputs with |ref| >= 2^-126; max err {float(err.max()):.2f} eps|ref| "
          f"(|x| < 2: {float(err[small].max()):.2f}); max err / (4 + 2 a^2) = {float(ratio.max()):.3f} "
          f"at x = {float(xd[fin][i]):.6g}")
    tiny = torch.isfinite(ref) & (ref.abs() < 2.0 ** -126)
    print(f"  results below 2^-126: {int(tiny.sum())}, max abs err {float((y - ref).abs()[tiny].max()) / 2.0 ** -126:.3f} x 2^-126")
    nonfin = ~torch.isfinite(ref)
    same = torch.equal(torch.isnan(y[nonfin]), torch.isnan(ref[nonfin]))
    print(f"  non-finite references: {int(nonfin.sum())}, NaN positions equal: {same}")


def rmse(dtype, layout, shapes):
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    s = ITEMSIZE[dtype]
    for b, n in shapes:
        shape = (b, n) if layout == "first" else (n, b)
        make_e, set_b, rd, wr = frameworks.ewkern_in_torch_call("rmse", dtype, shape, "cuda:0",
                                                                axis=None if layout == "first" else 0)
        t_e = frameworks.time_calls(cfg, "torch", make_e, set_b, "rotate")
        med_e = median_s(t_e)
        frameworks.release_peer_memory()
        ge = (rd + wr) / med_e / 1e9
        if os.environ.get("PROBE_NO_DOT"):
            print(f"rmse {dtype} {layout} {b}x{n} {2 * n * b * s >> 20} MiB: ewkern {med_e * 1e6:.2f} us {ge:.0f} GB/s",
                  flush=True)
            continue
        make_dot, dot_bytes, _, _ = _dot_build(dtype, n * b, "cuda:0")
        t_d = frameworks.time_calls(cfg, "torch", make_dot, dot_bytes, "rotate")
        med_d = median_s(t_d)
        frameworks.release_peer_memory()
        gd = 2 * n * b * s / med_d / 1e9
        print(f"rmse {dtype} {layout} {b}x{n} {2 * n * b * s >> 20} MiB: ewkern {med_e * 1e6:.2f} us {ge:.0f} GB/s, "
              f"dot {gd:.0f} GB/s, ratio {ge / gd:.3f}", flush=True)


_LOAD_HINT = r"""
namespace ewrtc {
template <class P> __device__ __forceinline__ P ldh(const P *p)
{
    static_assert(sizeof(P) == 16, "16-byte vectors");
    uint4 u;
    asm volatile("ld.global.%s.v4.u32 {%%0, %%1, %%2, %%3}, [%%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    P r;
    *reinterpret_cast<uint4 *>(&r) = u;
    return r;
}
/* hold()'s form (a vector as it sits in registers: Held) loaded with the hint */
template <class S, int E> __device__ __forceinline__ typename Held<S, E>::type holdh(const Pack<S, E> *p)
{
    return ldh(held(p));
}
} /* %s */
template <int _ewrtc_VPL>"""


def _row_source_variants():
    """Wrap _codegen.row_source so that a kernel named probe_rmsnorm_<variant> is generated with
    source changes: nocs (plain stores instead of st.global.cs), lb8 (__launch_bounds__(256, 8):
    at most 32 registers, 8 blocks of 256 per SM; plans with G <= 256 only), ldcs/ldnc/ldlu (the
    row's 16-byte loads as ld.global.cs / .nc / .lu), blkN (blocks of at least N lanes: the
    bound N, and rownorm launches blocks of max(N, G), so that blk512 puts two float32 rows of 4096
    in a block, as bfloat16's plan does), nohint (the two-pass form's loads without their L2
    eviction priorities), tpcN (the two-pass form's step, VPL 0: N vectors a lane instead of
    ROW_TWO_PASS_VECTORS over the arrays)."""
    from ewkern.rtc import _codegen
    base = _codegen.row_source

    def wrapped(backend, name, *a, **kw):
        src, entries = base(backend, name, *a, **kw)
        parts = name.split("_")[2:]
        if "nocs" in parts:
            src = src.replace("st.global.cs.", "st.global.")
        if "lb8" in parts:
            src = re.sub(r"__launch_bounds__\(\d+\)", "__launch_bounds__(256, 8)", src)
        for p in parts:
            if re.fullmatch(r"blk\d+", p):
                src = re.sub(r"__launch_bounds__\(\d+\)", "__launch_bounds__(%s)" % p[3:], src)
        if "nohint" in parts:
            src = src.replace("sizeof(P) == 16 && __CUDA_ARCH__ >= 800", "false && sizeof(P) == 16")
        for p in parts:
            if re.fullmatch(r"tpc\d+", p):
                src = re.sub(r"(enum \{ _ewrtc_TPC = _ewrtc_VPL < 0 \? -_ewrtc_VPL : )\d+", r"\g<1>%s" % p[3:], src)
        for hint in ("cs", "nc", "lu"):
            if "ld" + hint in parts:
                src = src.replace("template <int _ewrtc_VPL>", _LOAD_HINT % (hint, hint), 1)
                # the register forms' loads (ewrtc::hold, or a plain read where the vector is held
                # as loaded)
                src = re.sub(r"(_r_\w+\[_q\]) = ewrtc::hold\(", r"\1 = ewrtc::holdh(", src)
                src = re.sub(r"(_r_\w+\[_q\]) = (_u_\w+)\[([^\]]+)\];", r"\1 = ewrtc::ldh(\2 + (\3));", src)
        return src, entries
    _codegen.row_source = wrapped


_ROWS_BULK = """    if (_live && _lane == 0) {   /* probe: the whole row of each input, one bulk L2 prefetch */
%s    }
    pdl_wait();"""


def _carveout_on_load(pattern):
    """Wrap the C module's _rtc_load so that an entry whose name matches `pattern` gets its preferred
    shared-memory carveout set to the match's P% (cudaFuncSetAttribute, attribute 9, through the
    CUDA runtime torch loaded) as it loads. The rows variant cv<P>: base's source and launches with
    the kernel's carveout preference P (0: the most L1, 100: the most shared memory), uncapped.
    Why: the capped launches lost 0.019 of torch.compile on average in single launches with the largest
    carveout and none with 64 KiB (forty-eighth session), so a launch that needs the SM's L1/shared
    split changed after the flush and sleep kernels may pay for it; does the uncapped kernel's
    default (the driver's choice) cost its single launches anything?"""
    import ctypes
    import glob
    from ewkern.rtc import _kernel
    C = _kernel._C()
    load = C._rtc_load
    libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*"))
    rt = ctypes.CDLL(libs[0] if libs else "libcudart.so")

    def wrapped(image, entry, dev):
        h = load(image, entry, dev)
        m = re.search(pattern, entry)
        if m:
            err = rt.cudaFuncSetAttribute(ctypes.c_void_p(h), 9, ctypes.c_int(int(m.group(1))))
            print(f"  {entry}: carveout {m.group(1)}% (cudaFuncSetAttribute -> {err}), "
                  f"{C._rtc_occupancy(h, 256, dev)} blocks of 256 an SM", flush=True)
        return h
    C._rtc_load = wrapped


def _rows_source_variants():
    """Wrap _codegen.reduction_rows_source so that a kernel named probe_mse_<variant> is generated
    with source changes. Why: in the rows entry's 4-vector loop ptxas issues the first two vectors'
    loads, converts and adds the first, and only then issues the third's (sm_90, 16-bit (a - b)^2 over
    rows of 4096, G = 128 read at run time: 32 registers, 4 of the 8 loads before the first
    conversion), although the PTX has all 8 loads first; __launch_bounds__(256, 4) keeps all 8 ahead
    (54 registers, 4 blocks of 256 an SM), (256, 5) 6 (48), (256, 6) 4 (40). bulk asks the TMA unit
    for each input's row instead (no registers). Measured on both GPUs (2026-11-26): lb4 won, bulk
    lost; the host now builds the rows entry with (256, 4) where that does not spill, so base is
    lb4 there and lb0 is the form before."""
    from ewkern.rtc import _codegen
    base = _codegen.reduction_rows_source

    def wrapped(name, in_layout, *a, **kw):
        src, entries = base(name, in_layout, *a, **kw)
        variant = name.split("_")[-1]
        text = str(src)
        m = re.match(r"lb(\d)$", variant)
        if m:   # lb0: no minimum (the rows entry before the host asked for 4 blocks)
            bound = f"{_codegen.ROWS_BLOCK}, {m.group(1)}" if m.group(1) != "0" else f"{_codegen.ROWS_BLOCK}"
            text = re.sub(rf"__launch_bounds__\({_codegen.ROWS_BLOCK}(, \d+)?\) ewrtc_{name}_rows",
                          f"__launch_bounds__({bound}) ewrtc_{name}_rows", text, count=1)
        elif variant == "bulk":
            arrays = [p.name for p, _, kind, _ in in_layout.args if kind == "array"]
            pf = "".join(f'        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(_u_{x}), '
                         f'"r"(unsigned(_ewrtc_PP.R * sizeof(_u_{x}->v[0]))) : "memory");\n' for x in arrays)
            anchor = "    pdl_wait();"
            i = text.index(anchor, text.index(f"ewrtc_{name}_rows"))
            text = text[:i] + _ROWS_BULK % pf + text[i + len(anchor):]
        elif variant not in ("base", "nopf", "pdloff", "v8", "cap") and not re.match(r"cv\d+$", variant):
            raise ValueError(f"rows variant {variant!r}: base, lb0, lb4, lb5, lb6, bulk, nopf, pdloff, v8, cap "
                             f"or cv<P>")
        return text, entries
    _codegen.reduction_rows_source = wrapped


def rows(sizes, dtypes, variants, cols=4096):
    """mse over rows of `cols` (fused's mse_rows) for each rows-engine source variant."""
    import cupy
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    _rows_source_variants()
    args = ("T a, T b", "T y", "((float)a - (float)b) * ((float)a - (float)b)", "a + b",
            f"y = (T)(a * {1 / cols!r}f)", "0")
    kernels = {v: ewkern.ReductionKernel(*args, name=f"probe_mse_{v}", reduce_type="float") for v in variants}
    ck = cupy.ReductionKernel(*args, name="probe_mse", reduce_type="float")
    # launch variants (base's source): nopf, the first wave's L2 prefetch off in a PDL launch (the
    # warm call's runner reads the flag at each launch); pdloff, the launch without PDL
    from ewkern.rtc import _kernel
    nopf = [False]

    def prefetch_runner(h, grid, block, dev, offset, wave, capped=None):
        hp, smem = capped or (h, 0)   # the capped launch's handle and shared memory (_kernel._rows_cap)

        def run(buf, stream):
            pdl = ewkern.pdl_enabled()
            _kernel._pack_into("q", buf, offset, wave if pdl and not nopf[0] else 0)
            if pdl and smem:
                _kernel._C()._rtc_launch(hp, grid, block, buf, dev, stream, pdl, smem)
            else:
                _kernel._C()._rtc_launch(h, grid, block, buf, dev, stream, pdl)
        return run
    _kernel._prefetch_runner = prefetch_runner

    def launch_variant(v, k):
        def call(a, b):
            nopf[0] = v == "nopf"
            if v == "pdloff":
                ewkern.set_pdl(False)
            if v == "v8":
                _kernel._ROWS_LANE_VECTORS = 8
            cap = _kernel._ROWS_CAP
            _kernel._ROWS_CAP = v == "cap"   # the package's default is on: every other variant runs without
            try:
                return k(a, b, axis=1)
            finally:
                nopf[0] = False
                ewkern.set_pdl(True)
                _kernel._ROWS_LANE_VECTORS = 4
                _kernel._ROWS_CAP = cap
        return call
    if any(re.match(r"cv\d+$", v) for v in variants):
        _carveout_on_load(r"probe_mse_cv(\d+)")
    tc = torch.compile(lambda a, b: ((a.float() - b.float()) ** 2).mean(-1).to(a.dtype), dynamic=False)
    for dtype in dtypes:
        tdt = frameworks._torch_dtype(dtype)
        for size in sizes:
            rows_n = max(1, size // ITEMSIZE[dtype] // cols)
            nbytes = 2 * rows_n * cols * ITEMSIZE[dtype] + rows_n * ITEMSIZE[dtype]
            torch._dynamo.reset()
            for method, cache in (("b2b", "rotate"), ("single", "flush")):
                res = {}
                ways = [("torch.compile", "torch", lambda a, b: tc(a, b)),
                        ("cupy", "cupy", lambda a, b: ck(a, b, axis=1))]
                ways += [(v, "torch", launch_variant(v, k)) for v, k in kernels.items()]
                for way, impl, fn in ways:
                    def make_call(fn=fn, impl=impl):
                        a = torch.randn(rows_n, cols, device="cuda:0").to(tdt)
                        b = torch.randn(rows_n, cols, device="cuda:0").to(tdt)
                        if impl == "cupy":
                            a, b = cupy.from_dlpack(a), cupy.from_dlpack(b)
                        return lambda: fn(a, b)
                    res[way] = median_or_nan(cfg, way, impl, make_call, nbytes, cache)
                best = min(res["torch.compile"], res["cupy"])
                print(f"rows {dtype} {size >> 20} MiB {method}: torch.compile {res['torch.compile'] * 1e6:.2f} us, "
                      f"cupy {res['cupy'] * 1e6:.2f} | " + " | ".join(
                          f"{v} {res[v] * 1e6:.2f} us ({best / res[v]:.3f})" for v in variants), flush=True)
                if "cap" in variants and method == "b2b":   # what the cap got (0: none; the launch uncapped)
                    print("  caps (blocks an SM, dynamic shared memory): "
                          f"{sorted((key[3], got[1]) for key, got in _kernel._caps.items())}", flush=True)


def rownorm(sizes, dtypes, plans, cols=4096):
    """rmsnorm over rows of `cols` (PROBE_ROW_COLS) against torch.compile, per plan x source
    variant: auto (the host's), nosplit (auto without the block a group for grids of fewer blocks
    than SMs), reg (row_plan's register form, never the lean one), G (G lanes in registers), Gl
    (the two-pass form), Gt (the lean two-pass form)."""
    cols = int(os.environ.get("PROBE_ROW_COLS", cols))
    from ewkern.rtc import _rowkernel
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    _row_source_variants()
    variants = os.environ.get("PROBE_ROW_VARIANTS", "base").split(",")
    # source variants here: div (the row's scale written as a user might, with divisions:
    # y = x / sqrt(a / _row_size + eps)), ieee (NVRTC's --prec-div=true: IEEE division whatever the
    # output dtype); the rest wrap the generated source (_row_source_variants)
    kernels = {v: ewkern.RowKernel("T x, float32 eps", "T y", "(float)x * (float)x", "a + b",
                                   "y = x / sqrt(a / _row_size + eps)" if "div" in v.split("_") else
                                   f"y = x * rsqrt(a * {1 / cols!r}f + eps)", "0", f"probe_rmsnorm_{v}",
                                   reduce_type="float",
                                   options=("--prec-div=true",) if "ieee" in v.split("_") else ())
               for v in variants}
    auto, min_block, lean_waves = _rowkernel.row_plan, _rowkernel._MIN_BLOCK, _rowkernel._LEAN_WAVES
    split = _rowkernel._SPLIT_MIN_G
    tc = torch.compile(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), dynamic=False)
    for dtype in dtypes:
        tdt = frameworks._torch_dtype(dtype)
        for size in sizes:
            rows = size // ITEMSIZE[dtype] // cols
            nbytes = 2 * rows * cols * ITEMSIZE[dtype]
            torch._dynamo.reset()
            for method, cache in (("b2b", "rotate"), ("single", "flush")):
                def make_tc():
                    x = torch.randn(rows, cols, dtype=tdt, device="cuda")
                    return lambda: tc(x)
                med_tc = median_s(frameworks.time_calls(cfg, "torch.compile", make_tc, nbytes, cache))
                row = []
                for plan, v in [(p, v) for p in plans for v in variants]:
                    k = kernels[v]
                    if "lb8" in v and plan not in ("auto", "256", "256l"):   # its bound: blocks of 256 at most
                        row.append(f"{plan}/{v} n/a")
                        continue
                    blk = re.search(r"blk(\d+)", v)
                    _rowkernel._MIN_BLOCK = int(blk.group(1)) if blk else min_block
                    # auto: the host's plan (the lean form by its rule); reg: row_plan's register form
                    _rowkernel._LEAN_WAVES = lean_waves if plan in ("auto", "nosplit") else float("inf")
                    _rowkernel._SPLIT_MIN_G = float("inf") if plan == "nosplit" else split
                    if plan in ("auto", "nosplit", "reg"):
                        _rowkernel.row_plan = auto
                    elif plan.endswith("l"):     # G lanes, the two-pass form
                        _rowkernel.row_plan = lambda nv, G=int(plan[:-1]): (G, 0)
                    elif plan.endswith("t"):     # G lanes, the lean two-pass form (2 vectors a lane)
                        _rowkernel.row_plan = lambda nv, G=int(plan[:-1]): (G, -2)
                    else:
                        G = int(plan)
                        if G * 4 < cols * ITEMSIZE[dtype] // 16:     # more than 4 vectors a lane: no such form
                            row.append(f"{plan}/{v} n/a")
                            continue
                        _rowkernel.row_plan = lambda nv, G=G: (G, 1 << max(0, -(-nv // G) - 1).bit_length())

                    k._plans.clear()    # the warm-call cache keeps the first call's plan
                    def make_e():
                        x = torch.randn(rows, cols, dtype=tdt, device="cuda")
                        o = torch.empty_like(x)
                        return lambda: k(x, 1e-6, o)
                    med = median_s(frameworks.time_calls(cfg, "torch", make_e, nbytes, cache))
                    row.append(f"{plan}/{v} {med_tc / med:.3f} ({k._last_path})")
                _rowkernel.row_plan, _rowkernel._MIN_BLOCK, _rowkernel._LEAN_WAVES = auto, min_block, lean_waves
                _rowkernel._SPLIT_MIN_G = split
                print(f"rmsnorm {dtype} {size >> 20} MiB {method}: torch.compile {med_tc * 1e6:.2f} us | "
                      + " | ".join(row), flush=True)
                frameworks.release_peer_memory()


def rmse_overhead(calls=20000, repeats=7):
    dev = "cuda:0"
    ta, tb = torch.rand(16, device=dev), torch.rand(16, device=dev)
    t2a, t2b = torch.rand(4, 4, device=dev), torch.rand(4, 4, device=dev)
    out0, out4, tc = torch.empty((), device=dev), torch.empty(4, device=dev), torch.empty(16, device=dev)
    ea, eb = ewkern.asarray(ta), ewkern.asarray(tb)
    eo = ewkern.empty((), dtype="float32", device=dev)
    cases = [("add(out=) torch", lambda: ewkern.add(ta, tb, out=tc)),
             ("add() torch", lambda: ewkern.add(ta, tb)),
             ("rmse(out=) torch 1-D", lambda: ewkern.rmse(ta, tb, out=out0)),
             ("rmse() torch 1-D", lambda: ewkern.rmse(ta, tb)),
             ("rmse(out=) torch 4x4", lambda: ewkern.rmse(t2a, t2b, out=out4)),
             ("rmse(out=) torch 4x4 axis=0", lambda: ewkern.rmse(t2a, t2b, axis=0, out=out4)),
             ("rmse(out=, variant=block) torch 1-D", lambda: ewkern.rmse(ta, tb, out=out0, variant="block")),
             ("rmse(out=) ewkern arrays", lambda: ewkern.rmse(ea, eb, out=eo)),
             ("torch sqrt(mean((a-b)^2))", lambda: torch.sqrt(torch.mean((ta - tb) ** 2)))]
    for label, fn in cases:
        st = summarize(per_call_seconds(fn, torch.cuda.synchronize, calls, repeats))
        print(f"{label}: {st['median'] * 1e6:.2f} us (min {st['min'] * 1e6:.2f}, max {st['max'] * 1e6:.2f})",
              flush=True)


def _widened(kernel):
    """kernel(*args) with ewkern.rtc._kernel.RTC_WIDE on during the call"""
    from ewkern.rtc import _kernel

    def call(*args):
        _kernel.RTC_WIDE = True
        try:
            return kernel(*args)
        finally:
            _kernel.RTC_WIDE = False
    return call


def rtc(sizes, dtypes):
    import cupy
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    src = {"fma": ("T a, T b, T c", "T o", "o = a * b + c"), "add": ("T x, T y", "T z", "z = x + y")}
    red = ("T x", "float32 y", "(float)x * (float)x", "a + b", "y = a", "0")   # CuPy has no _in_ind here
    for dtype in dtypes:
        tdt = frameworks._torch_dtype(dtype)
        ek = {k: ewkern.ElementwiseKernel(*v, name=f"p_{k}") for k, v in src.items()}
        # the same kernels planned with the rule's `wide` case (ewkern.rtc._kernel.RTC_WIDE, read
        # when a call makes its launch plan: set around every call of these)
        ekw = {k: _widened(ewkern.ElementwiseKernel(*v, name=f"p_{k}_w")) for k, v in src.items()}
        ck = {k: cupy.ElementwiseKernel(*v, name=f"p_{k}") for k, v in src.items()}
        er = ewkern.ReductionKernel(*red, name="p_msq", reduce_type="float")
        cr = cupy.ReductionKernel(*red, name="p_msq", reduce_type="float")
        for size in sizes:
            n = size // ITEMSIZE[dtype]
            rows = max(1, n // 4096)
            cases = {
                "fma": (3, 1, {"ewkern": lambda a, b, c, o: ek["fma"](a, b, c, o),
                               "ewkern wide": lambda a, b, c, o: ekw["fma"](a, b, c, o),
                               "cupy": lambda a, b, c, o: ck["fma"](a, b, c, o),
                               "torch eager": lambda a, b, c, o: torch.add(a * b, c, out=o),
                               "torch.addcmul": lambda a, b, c, o: torch.addcmul(c, a, b, out=o)}),
                "add": (2, 1, {"ewkern": lambda a, b, o: ek["add"](a, b, o),
                               "ewkern wide": lambda a, b, o: ekw["add"](a, b, o),
                               "cupy": lambda a, b, o: ck["add"](a, b, o),
                               "ewkern.add": lambda a, b, o: ewkern.add(a, b, out=o)}),
                "rowmsq": (1, 0, {"ewkern": lambda x: er(x.view(rows, -1), axis=1),
                                  "cupy": lambda x: cr(x.reshape(rows, -1), axis=1),
                                  "torch eager": lambda x: x.view(rows, -1).float().pow(2).sum(1)}),
                "allsq": (1, 0, {"ewkern": lambda x: er(x),
                                 "cupy": lambda x: cr(x),
                                 "torch eager": lambda x: x.float().pow(2).sum(),
                                 "torch.dot": lambda x: torch.dot(x, x)}),
            }
            for case, (nin, nout, ways) in cases.items():
                set_b = (nin + nout) * n * ITEMSIZE[dtype]
                for method, cache in (("b2b", "rotate"), ("single", "flush")):
                    res = {}
                    for way, fn in ways.items():
                        impl = "cupy" if way == "cupy" else "torch"

                        def make_call(fn=fn, impl=impl):
                            arrs = [torch.randn(rows * 4096 if case.startswith("row") else n, device="cuda:0").to(tdt)
                                    for _ in range(nin + nout)]
                            if impl == "cupy":
                                arrs = [cupy.from_dlpack(t) for t in arrs]
                            return lambda: fn(*arrs)
                        res[way] = median_or_nan(cfg, f"{case} {way}", impl, make_call, set_b, cache)
                    best = min(v for k, v in res.items() if not k.startswith("ewkern"))
                    print(f"{case} {dtype} {size >> 20} MiB {method}: ewkern {res['ewkern'] * 1e6:.2f} us "
                          f"({set_b / res['ewkern'] / 1e9:.0f} GB/s) | "
                          + " | ".join(f"{k} {res['ewkern'] and v / res['ewkern']:.3f}" for k, v in res.items()
                                       if k != "ewkern") + f" | vs best {best / res['ewkern']:.3f}", flush=True)


def cold(op, dtype, sizes, repeats=3):
    """Queued cold launches of ewkern's op and torch's, each behind an L2 flush and a sleep kernel
    (the single-launch method's conditions), in NVTX ranges for ncu."""
    info = ewkern.device_info("cuda:0")
    flush = torch.empty(2 * int(info["l2_bytes"]) // 4, dtype=torch.float32, device="cuda:0")
    for size in sizes:
        n = size // ITEMSIZE[dtype]
        make_torch, _, _, _ = frameworks.elementwise_call("torch", op, dtype, (n,), "cuda:0")
        ins = frameworks.op_inputs("torch", op, (n,), dtype, "cuda:0")
        out = torch.empty((n,), dtype=frameworks._torch_dtype(dtype), device="cuda:0")
        ew = ew_call(op, ins, out)
        torch_call = make_torch()
        label = f"{op} {dtype} {size >> 20} MiB"
        ways = [("ewkern", ew, None), ("torch", torch_call, None)]
        if ewkern.pdl_enabled():
            ways.append(("ewkern PDL off", ew, False))
        for _ in range(repeats):
            for name, call, pdl in ways:
                prev = ewkern.set_pdl(pdl) if pdl is not None else None
                try:
                    flush.add_(1.0)
                    torch.cuda._sleep(int(200e-6 * 2e9))
                    torch.cuda.nvtx.range_push(f"{name} {label}")
                    call()
                    torch.cuda.nvtx.range_pop()
                finally:
                    if prev is not None:
                        ewkern.set_pdl(prev)
        torch.cuda.synchronize()
        ins = out = torch_call = ew = None
        frameworks.release_peer_memory()
    print("cold launches queued:", op, dtype, ", ".join(f"{s >> 20} MiB" for s in sizes), flush=True)


def placement(op, dtype, sizes, rounds=4):
    """Same buffers against own buffers, single launch (and back-to-back) as peers times them."""
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    torch_fn = frameworks._op_fn("torch", op)
    for size in sizes:
        n = size // ITEMSIZE[dtype]
        _, set_b, _, _ = frameworks.elementwise_call("torch", op, dtype, (n,), "cuda:0")
        for method in os.environ.get("PROBE_METHODS", "single").split(","):
            cache = {"single": "flush", "b2b": "rotate"}[method]
            nsets, _ = frameworks.choose_sets(cfg, cache, set_b)
            same, cross, off = [], [], []
            for r in range(rounds):
                bufs = {k: [(frameworks.op_inputs("torch", op, (n,), dtype, "cuda:0"),
                             torch.empty((n,), dtype=frameworks._torch_dtype(dtype), device="cuda:0"))
                            for _ in range(nsets)] for k in "XY"}

                def maker(k, impl):
                    it = iter(bufs[k])

                    def make_call():
                        ins, out = next(it)
                        if impl == "torch":
                            return lambda: torch_fn(ins, out)
                        return ew_call(op, ins, out)
                    return make_call
                t = {}
                order = [("ew", "X"), ("torch", "X"), ("ew", "Y"), ("torch", "Y"), ("off", "X")]
                if os.environ.get("PROBE_TURNS"):
                    def pdl_off(make):
                        def make_call():
                            call = make()

                            def off():
                                prev = ewkern.set_pdl(False)
                                try:
                                    call()
                                finally:
                                    ewkern.set_pdl(prev)
                            return off
                        return make_call
                    ways = [(maker(k, "torch" if impl == "torch" else "ew"), set_b) for impl, k in order]
                    ways[-1] = (pdl_off(ways[-1][0]), set_b)
                    for (impl, k), tm in zip(order, frameworks.time_calls_in_turns(cfg, ways, cache)):
                        t[impl, k] = median_s(tm)
                    order = []
                order = order[r % 4:4] + order[:r % 4] + order[4:]
                for impl, k in order:
                    prev = ewkern.set_pdl(False) if impl == "off" else None
                    try:
                        t[impl, k] = median_s(frameworks.time_calls(
                            cfg, "torch", maker(k, "torch" if impl == "torch" else "ew"), set_b, cache))
                    finally:
                        if prev is not None:
                            ewkern.set_pdl(prev)
                same += [t["torch", "X"] / t["ew", "X"], t["torch", "Y"] / t["ew", "Y"]]
                cross += [t["torch", "Y"] / t["ew", "X"], t["torch", "X"] / t["ew", "Y"]]
                off.append(t["torch", "X"] / t["off", "X"])
                print(f"{op} {dtype} {size >> 20} MiB {method} round {r}: us ew X {t['ew', 'X'] * 1e6:.2f} "
                      f"Y {t['ew', 'Y'] * 1e6:.2f} torch X {t['torch', 'X'] * 1e6:.2f} Y {t['torch', 'Y'] * 1e6:.2f} "
                      f"off X {t['off', 'X'] * 1e6:.2f}", flush=True)
                bufs = None
                frameworks.release_peer_memory()

            def fmt(v):
                v = sorted(v)
                return f"median {v[len(v) // 2]:.3f} range {v[0]:.3f}-{v[-1]:.3f}"
            print(f"== {op} {dtype} {size >> 20} MiB {method}: same buffers {fmt(same)} | own buffers "
                  f"{fmt(cross)} | PDL off, same {fmt(off)}", flush=True)


def inherit(op, dtype, sizes, rounds=3):
    """Single launches of ewkern's op and torch's in the orders that the docstring lists."""
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    # the same with ewkern's read for a flush (--flush-kind rmse) instead of torch's sum
    cfge = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]), flush_kind="rmse")
    # the same with a read flush of 4x the L2 instead of 2x: do lines that survive a 2x flush (the
    # kernels' code, their parameters) make the pattern?
    cfg4 = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]), flush_factor=4)
    lag = frameworks.LAG_SAMPLES

    def us(v):
        return f"{sorted(v)[len(v) // 2] * 1e6:.2f}"

    def phases(v):
        """a way's median over each phase of four of its samples (0, 4, 8, ...; 1, 5, 9, ...): on
        both GPUs, one after another behind torch's sum as the flush, 0, +0.3, +0.38 and +1.07 us
        apart (some phase first: scripts/sample_phases.py)"""
        return "/".join(us(v[k::4]) for k in range(4))
    for size in sizes:
        n = size // ITEMSIZE[dtype]
        got = {}
        for r in range(rounds):
            sets = frameworks.torch_sets(op, dtype, (n,), "cuda:0")
            set_b = frameworks.ewkern_in_torch_call(op, dtype, (n,), "cuda:0", sets=sets)[1]

            def way(impl):
                """a fresh make_call of impl: its first call takes the round's one set (set 0)"""
                if impl == "ew":
                    return frameworks.ewkern_in_torch_call(op, dtype, (n,), "cuda:0", sets=sets)[0], set_b
                return frameworks.elementwise_call("torch", op, dtype, (n,), "cuda:0", sets=sets)[0], set_b
            mul = frameworks.foreign_call(dtype, (n,), "cuda:0")[0]()
            forms = {}   # form -> (samples of a, samples of b)
            order = ["ew", "torch"] if r % 2 == 0 else ["torch", "ew"]
            side = torch.cuda.Stream()
            for name, c, stream in (("seq", cfg, None), ("seq flush4x", cfg4, None), ("seq ewflush", cfge, None),
                                    ("seq side stream", cfg, side)):
                # "side stream": the whole series on a stream of its own instead of torch's default
                # (the legacy stream, which every launch on a blocking stream synchronizes with)
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    seq = {impl: frameworks.time_calls(c, "torch", way(impl)[0], set_b, "flush").samples_s
                           for impl in order}
                forms[name] = (seq["ew"], seq["torch"])
            for name, a, b, kw, lag_now, c in (
                    [(o, "ew", "torch", dict(order=o), lag, cfg) for o in frameworks.ORDERS]
                    + [("rotate flush4x", "ew", "torch", dict(order="rotate"), lag, cfg4),
                       ("rotate ewflush", "ew", "torch", dict(order="rotate"), lag, cfge),
                       ("alt+mul", "ew", "torch", dict(order="alternate", between=mul), lag, cfg),
                       ("alt+event", "ew", "torch", dict(order="alternate", between=lambda: torch.cuda.Event().record()),
                        lag, cfg),
                       ("rotate lag1", "ew", "torch", dict(order="rotate"), 1, cfg),
                       ("alt lag1", "ew", "torch", dict(order="alternate"), 1, cfg),
                       ("ew/ew", "ew", "ew", dict(order="alternate"), lag, cfg)]):
                frameworks.LAG_SAMPLES = lag_now
                try:
                    ta, tb = frameworks.time_calls_in_turns(c, [way(a), way(b)], "flush", shared=True, **kw)
                finally:
                    frameworks.LAG_SAMPLES = lag
                forms[name] = (ta.samples_s, tb.samples_s)
            line = []
            for name, (a, b) in forms.items():
                ratio = sorted(b)[len(b) // 2] / sorted(a)[len(a) // 2]
                got.setdefault(name, []).append(ratio)
                line.append(f"{name} {ratio:.3f} (us {phases(a)} | {phases(b)})")
            print(f"{op} {dtype} {size >> 20} MiB round {r}: " + "; ".join(line), flush=True)
            sets = mul = None
            frameworks.release_peer_memory()
        print(f"== {op} {dtype} {size >> 20} MiB, torch / ewkern: " + " | ".join(
            f"{k} {sorted(v)[len(v) // 2]:.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in got.items()), flush=True)


def fastmath(sizes, dtypes, rounds=2):
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    exprs = {"swish_gate": ("o = a / (1 + exp(-b))", lambda a, b: a * torch.sigmoid(b)),
             "gelu_mul": ("o = 0.5f * a * (1.0f + erf(a * 0.70710678f)) * b",
                          lambda a, b: torch.nn.functional.gelu(a) * b),
             "fma": ("o = a * b + a", lambda a, b: a * b + a),
             "add": ("o = a + b", lambda a, b: a + b)}
    # the builds: IEEE division (the package's build before e4628a5 for 16-bit outputs), as the
    # package builds it, and --use_fast_math (approximate division and exp, flush to zero)
    builds = {"ieee": ("--prec-div=true",), "built": (), "fast": ("--use_fast_math",)}
    for dtype in dtypes:
        tdt = frameworks._torch_dtype(dtype)
        for name, (body, tfn) in exprs.items():
            ks = {b: ewkern.ElementwiseKernel("T a, T b", "T o", body, name=f"fm_{name}_{b}", options=opts)
                  for b, opts in builds.items()}
            # one code object for every expression and dtype: past dynamo's recompile limit it ran
            # eagerly (two kernels) on the H200 for all but the first dtype; a reset per expression
            torch._dynamo.reset()
            tc = torch.compile(lambda a, b, o, tfn=tfn: o.copy_(tfn(a, b)), dynamic=False)
            for size in sizes:
                n = size // ITEMSIZE[dtype]
                a = (torch.randn(n, device="cuda:0") * 3).to(tdt)
                b = (torch.randn(n, device="cuda:0") * 3).to(tdt)
                outs = {k: kern(a, b) for k, kern in ks.items()}
                ref = outs["ieee"].double()
                scale = (ref.abs() * torch.finfo(tdt).eps).clamp_min(1e-300)
                big = ref.abs() > torch.finfo(tdt).tiny
                err = {k: ((o.double() - ref).abs() / scale)[big].max().item() for k, o in outs.items() if k != "ieee"}
                set_b = 3 * n * ITEMSIZE[dtype]

                def maker(fn):
                    def make_call():
                        x = (torch.randn(n, device="cuda:0") * 3).to(tdt)
                        y = (torch.randn(n, device="cuda:0") * 3).to(tdt)
                        z = torch.empty_like(x)
                        return lambda: fn(x, y, z)
                    return make_call
                ways = [(maker(lambda x, y, z, k=k: k(x, y, z)), set_b) for k in ks.values()] + [(maker(tc), set_b)]
                for method, cache in (("single", "flush"), ("b2b", "rotate")):
                    for r in range(rounds):
                        t = [median_s(tm) for tm in frameworks.time_calls_in_turns(cfg, ways, cache)]
                        frameworks.release_peer_memory()
                        print(f"{name} {dtype} {size >> 20} MiB {method} round {r}: us "
                              + " ".join(f"{k} {v * 1e6:.2f}" for k, v in zip(ks, t))
                              + f" torch.compile {t[-1] * 1e6:.2f} | vs torch.compile "
                              + " ".join(f"{k} {t[-1] / v:.3f}" for k, v in zip(ks, t))
                              + " | against ieee: " + " ".join(f"{k} {v:.2f} eps" for k, v in err.items()),
                              flush=True)

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "variants":
        variants(sys.argv[2], sys.argv[3], sys.argv[4].split(","), [parse_bytes(s) for s in sys.argv[5].split(",")])
    elif cmd == "gelu-accuracy":
        gelu_accuracy(int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 24)
    elif cmd == "rmse":
        rmse(sys.argv[2], sys.argv[3], [tuple(int(v) for v in c.split("x")) for c in sys.argv[4].split(",")])
    elif cmd == "rtc":
        rtc([parse_bytes(x) for x in sys.argv[2].split(",")],
            sys.argv[3].split(",") if len(sys.argv) > 3 else ["float32", "float16", "bfloat16"])
    elif cmd == "backward":
        backward_ops(sys.argv[2].split(","), sys.argv[3], [parse_bytes(x) for x in sys.argv[4].split(",")])
    elif cmd == "rownorm":
        rownorm([parse_bytes(x) for x in sys.argv[2].split(",")], sys.argv[3].split(","), sys.argv[4].split(","))
    elif cmd == "rows":
        rows([parse_bytes(x) for x in sys.argv[2].split(",")], sys.argv[3].split(","), sys.argv[4].split(","))
    elif cmd == "fastmath":
        fastmath([parse_bytes(x) for x in sys.argv[2].split(",")], sys.argv[3].split(","),
                 int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    elif cmd == "rmse-overhead":
        rmse_overhead()
    elif cmd == "cold":
        cold(sys.argv[2], sys.argv[3], [parse_bytes(x) for x in sys.argv[4].split(",")],
             int(sys.argv[5]) if len(sys.argv) > 5 else 3)
    elif cmd == "inherit":
        inherit(sys.argv[2], sys.argv[3], [parse_bytes(x) for x in sys.argv[4].split(",")],
                int(sys.argv[5]) if len(sys.argv) > 5 else 3)
    elif cmd == "placement":
        placement(sys.argv[2], sys.argv[3], [parse_bytes(x) for x in sys.argv[4].split(",")],
                  int(sys.argv[5]) if len(sys.argv) > 5 else 4)
    else:
        sys.exit(__doc__)
