"""peers: ewkern against torch and CuPy (NumPy on a CPU), timed the same way in the same run.

Elementwise: every op of ewkern (default path, variant auto) x float32, float16, bfloat16, float64
at 1 MiB - 2 GiB per buffer (4 MiB, 64 MiB, 1 GiB in quick mode) against torch's equivalent op (and
CuPy's where it has one), in three timing methods on a GPU:

* back-to-back: K calls captured into one CUDA graph and replayed between two events, inputs
  rotated through buffer sets of at least 4x the L2 (the throughput of a stream of calls);
* single launch: the L2 flushed by reading 2x its size, the stream held by a sleep kernel so the
  launch is queued, events around one call (what one call costs a program);
* after_torch: K pairs (a foreign torch kernel, then the op) in one CUDA graph, and the K foreign
  kernels alone in another of the same K and buffers, replayed in turns; the op's time is (pair
  graph - foreign graph) / K. The foreign kernel is torch.mul on buffers of the op's size and dtype
  (a set of its own); every set holds one of each, rotated as back-to-back's are, and there are
  enough sets that the foreign kernels alone pass 4x the L2. This is what the op costs after a
  kernel that never triggers its early launch (programmatic dependent launch, ewkern's own gain
  back-to-back, has nothing to overlap there). The same graphs are built with torch's op in place
  of ewkern's. The records keep both graphs' medians per step (pair_time_s, foreign_time_s); torch's
  pair_time_s over ewkern's is what a program of such pairs sees, and the summary gives it too. By
  default after_torch times copy, add, mul, exp and gelu (AFTER_TORCH_OPS) in every dtype and size,
  about 40 s of a full run on an H100 where every op would take about 2.5 minutes;
  --peers-after-torch-ops all (or naming ops, or --peers-ops) widens it.
* chain (only when --peers-methods names it): K calls in one CUDA graph as back-to-back's, on
  buffer sets in which each set's first input is the set before's output (frameworks.ChainSets),
  so that every call reads what the call before it wrote, as a program's next op reads the last
  op's result (back-to-back never reads an output again). ewkern and torch on the same sets, for
  CHAIN_OPS (copy, add, tanh, gelu: ops whose repeated application keeps the values finite).

On a GPU with torch, ewkern is called on torch tensors and timed by exactly the code that times
torch (frameworks.time_calls), so the two differ only in the kernel; inputs are random data in
each op's domain for both. ewkern is also timed with programmatic dependent launch off
(ewkern.set_pdl(False)) in every method, after_torch too, to show what PDL adds or costs in each
(--peers-no-pdl-off leaves that series out everywhere). CuPy is timed back-to-back only. The
summary lists the worst ewkern / torch ratio per op and method and every cell below 1.00.
--peers-in-turns times ewkern, ewkern with PDL off and torch in turns in back-to-back and single
launch (frameworks.time_calls_in_turns: graphs each sample taking every way once, the first
rotating; single launches in runs of 8 samples a way, the first way of each block rotating), not
one series after another, every way's k-th call on the same buffers (frameworks.SharedSets: on
buffers of their own, where each set lay moved a 1 MiB single launch by up to 10% within one
process on the H200). after_torch and CuPy are timed as before. On the H200 both forms gave the
same cell within 0.011-0.016 (median) between processes at 50 samples, but differ from each other
by up to 0.1 in some 1-16 MiB cells (BENCHMARKS.md, 2026-11-27); one after another stays the
default, in which the committed matrices were measured.

RMSE (float32) on 16x2^20, 16x3*2^20, 1024x4096, 8x2^24, 65536x64 and the batch-last 2^20x16
(reduced over the leading axis), against torch eager sqrt(((a-b)**2).mean(dim)),
torch.linalg.vector_norm(a-b, dim)/sqrt(n), torch.compile of the eager expression, and a CuPy
ReductionKernel (back-to-back). The same run measures the device-to-device copy bandwidth (torch
copy_ / CuPy copy over 1 GiB) and torch.dot's read bandwidth over 2 x 1 GiB.
"""

from __future__ import annotations

import math
import statistics
from functools import partial

from .common import (below_beyond_spread, bars_figure, bytes_arg, check_bytes, check_names, elementwise_ops,
                     how_timed, list_arg, md_table, median_ratio_interval, sizes_arg, spread_note, fmt_gbs)
from .frameworks import (EWKERN_GRAPH, EWKERN_NOPDL, FOREIGN, PEER_STANDINS, RMSE_PEERS, available,
                         elementwise_call, ewkern_in_torch_call, foreign_call, torch_sets, TURNS_WORDS,
                         pdl_active, pdl_off, release_peer_memory, rmse_call)
from .timing import BufferPool, Skip, plan_elementwise, plan_rmse, variants
from .units import ITEMSIZE, fmt_bytes, fmt_count, parse_shape

NAME = "peers"
TITLE = "ewkern against torch and CuPy"
DESCRIPTION = ("ewkern auto vs torch/CuPy (NumPy on CPU): every op x 4 dtypes x sizes, back-to-back, single "
               "launch and after a torch kernel; rmse shapes, D2D copy, dot")
PAPER = "(all)"


def _rmse_shapes_arg(text):
    import argparse
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        last = part.endswith(":last")
        try:
            shape = parse_shape(part[:-5] if last else part)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if len(shape) != 2:
            raise argparse.ArgumentTypeError(f"rmse shapes are BATCHESxN (or NxBATCHES:last): {part!r}")
        if min(shape) < 1:
            raise argparse.ArgumentTypeError(f"every axis must be at least 1: {part!r}")
        out.append((shape, last))
    return out


ARGS = [("--peers-sizes", dict(type=sizes_arg, metavar="SIZES",
                               help="buffer sizes (default GPU 1MiB-2GiB by powers of 4 and 2GiB, quick "
                                    "4MiB,64MiB,1GiB; CPU 4MiB,64MiB, quick 4MiB)")),
        ("--peers-ops", dict(type=list_arg, metavar="OPS", help="ops (default: every elementwise op)")),
        ("--peers-dtypes", dict(type=list_arg, metavar="DTYPES", help="dtypes (default float32,float16,bfloat16,float64)")),
        ("--peers-methods", dict(type=list_arg, metavar="METHODS",
                                 help="GPU timing methods: back-to-back, single, after_torch (the default "
                                      "three), chain (each call reading the call before's output)")),
        ("--peers-after-torch-ops", dict(type=list_arg, metavar="OPS",
                                         help="ops timed after_torch, or 'all' (default copy,add,mul,exp,gelu; "
                                              "with --peers-ops, those)")),
        ("--peers-no-pdl-off", dict(action="store_true", help="leave out the PDL-off series")),
        ("--peers-rmse-shapes", dict(type=_rmse_shapes_arg, metavar="SHAPES",
                                     help="BxN shapes; NxB:last for batch-last, e.g. 16x2^20,2^20x16:last")),
        ("--peers-ref-size", dict(type=bytes_arg(), metavar="BYTES",
                                  help="D2D copy / dot size per buffer (default GPU 1GiB; CPU 64MiB, quick 16MiB)")),
        ("--peers-no-compile", dict(action="store_true", help="leave out torch.compile")),
        ("--peers-in-turns", dict(action="store_true",
                                  help="time ewkern, ewkern with PDL off and torch in turns (back-to-back and "
                                       "single launch), not one series after another"))]

# method -> cache mode of frameworks.time_calls (after_torch: with frameworks.foreign_call before each call)
METHODS = {"back-to-back": "rotate", "single": "flush", "after_torch": "rotate", "chain": "rotate"}
DEFAULT_METHODS = ("back-to-back", "single", "after_torch")   # chain only when --peers-methods names it
METHOD_LABEL = {"back-to-back": "back-to-back (graph of K calls, inputs rotated)",
                "single": "single launch (L2 flushed, queued behind a sleep kernel)",
                "after_torch": f"after a torch kernel ({FOREIGN} + op, minus {FOREIGN} alone)",
                "chain": "chain (graph of K calls, each reading the call before's output)"}
AFTER_TORCH_OPS = ["copy", "add", "mul", "exp", "gelu"]   # after_torch's default ops: copy, binary, unary, costly
# chain's ops: each reads its own last output, so only ops whose repeated application keeps the
# values finite and in range (no exp, log, mul): copy, binary, bounded unary, costly unary
CHAIN_OPS = ["copy", "add", "tanh", "gelu"]
TORCH_ONLY = ("single", "after_torch", "chain")             # methods whose only peer is torch (CuPy: back-to-back)
IN_TURNS = ("back-to-back", "single")                       # methods --peers-in-turns times in turns
GPU_RMSE = [((16, 1 << 20), False), ((16, 3 << 20), False), ((1024, 4096), False), ((8, 1 << 24), False),
            ((65536, 64), False), ((1 << 20, 16), True)]
CPU_RMSE_QUICK = [((16, 1 << 16), False), ((1024, 256), False), ((1 << 16, 16), True)]
CPU_RMSE_FULL = [((16, 1 << 18), False), ((1024, 4096), False), ((8, 1 << 20), False), ((16384, 64), False),
                 ((1 << 18, 16), True)]


DTYPES = ("float32", "float16", "bfloat16", "float64")


_all_ops = elementwise_ops


def _params(ctx):
    sizes = ctx.pick("peers_sizes", gpu_full=[1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 2 << 30],
                     gpu_quick=[4 << 20, 64 << 20, 1 << 30], cpu_full=[4 << 20, 64 << 20], cpu_quick=[4 << 20])
    ops = ctx.opt("peers_ops") or _all_ops()
    dtypes = ctx.opt("peers_dtypes") or list(DTYPES)
    # named ones checked before anything runs: a name not known failed after the reference copy
    # and the baselines (a dtype) or left every cell out and passed (an op)
    check_names("--peers-ops", ops, _all_ops())
    check_names("--peers-dtypes", dtypes, DTYPES)
    shapes = ctx.pick("peers_rmse_shapes", gpu_full=GPU_RMSE, gpu_quick=GPU_RMSE, cpu_full=CPU_RMSE_FULL,
                      cpu_quick=CPU_RMSE_QUICK)
    ref = ctx.opt("peers_ref_size") or ((1 << 30) if ctx.is_gpu else (64 << 20 if not ctx.quick else 16 << 20))
    return sizes, ops, dtypes, shapes, ref


# what --quick runs of peers on a CPU against the full CPU set, said at the start of a quick CPU run (runner.run)
CPU_QUICK = ("peers: 4 MiB only (the full CPU set adds 64 MiB), 3 rmse shapes (full: 5) without the "
             "rmse ladder versions, copy/dot reference at 16 MiB (full: 64 MiB)")


def plan(ctx) -> dict:
    """The elementwise and rmse cells this run of peers would time, before anything is allocated:
    {"cells": timed cells (ewkern and every peer), "samples": samples per cell, "launches":
    cells x (samples + warm-up) as a bound on the calls made outside the sample loop}."""
    sizes, ops, dtypes, shapes, ref = _params(ctx)
    impls = 2 if not ctx.is_gpu else 3   # ewkern + NumPy on a CPU; ewkern, torch, CuPy on a GPU
    methods = 1 if not ctx.is_gpu else len(_method_names(ctx))
    rmse_versions = 1 if ctx.quick else 1 + len([v for v in variants("rmse", "float32", ctx.device) if v != "auto"])
    cells = len(sizes) * len(ops) * len(dtypes) * impls * methods + len(shapes) * (rmse_versions + 1) + 2
    return {"cells": cells, "samples": ctx.cfg.samples, "sizes": list(sizes), "ops": len(ops),
            "dtypes": len(dtypes), "rmse_shapes": len(shapes), "ref_size": ref}


def _after_torch_ops(ctx, ops):
    """The ops that after_torch times, in the run's order: --peers-after-torch-ops ('all': every op
    of the run), else every op --peers-ops names, else AFTER_TORCH_OPS. BenchError when the option
    names an op the run does not time."""
    named = ctx.opt("peers_after_torch_ops")
    if named is None:
        want = ops if ctx.opt("peers_ops") else AFTER_TORCH_OPS
    elif named == ["all"]:
        want = ops
    else:
        want = named
        bad = [o for o in named if o not in ops]
        if bad:
            from .timing import BenchError
            raise BenchError(f"--peers-after-torch-ops: {', '.join(bad)} not among the ops this run times "
                             f"({', '.join(ops)}); name some of those, or 'all'")
    return [o for o in ops if o in want]


def _method_names(ctx):
    """The --peers-methods (default DEFAULT_METHODS); BenchError for a name that is not one."""
    names = ctx.opt("peers_methods") or list(DEFAULT_METHODS)
    bad = [m for m in names if m not in METHODS]
    if bad:
        from .timing import BenchError
        raise BenchError(f"--peers-methods takes {', '.join(METHODS)}; got {', '.join(bad)}")
    return names


def check(ctx):
    sizes, ops, dtypes, shapes, ref = _params(ctx)
    after_ops = _after_torch_ops(ctx, ops)      # both raise BenchError for a name they do not know
    after = "after_torch" in _method_names(ctx) and after_ops and ctx.is_gpu
    # after_torch holds the op's buffers and torch.mul's three at once
    check_bytes(ctx, (6 if after else 3) * max(sizes), "peers' largest elementwise size")
    check_bytes(ctx, max(2 * 4 * math.prod(s) for s, _ in shapes) if shapes else 0, "peers' largest rmse shape")
    check_bytes(ctx, 2 * ref, "peers' copy/dot reference")


def _without_pdl(call):
    """call, run with programmatic dependent launch switched off."""
    def run():
        with pdl_off():
            call()
    return run


def _build_without_pdl(build):
    """build (-> make_call, set_bytes, bytes_read, bytes_written) whose calls each launch with
    programmatic dependent launch switched off: a way among others timed in turns."""
    def built():
        make_call, set_bytes, br, bw = build()
        return (lambda: _without_pdl(make_call())), set_bytes, br, bw
    return built


def _shape_label(shape, last):
    return f"{fmt_count(shape[0])}x{fmt_count(shape[1])}" + (" (batch-last)" if last else "")


def _methods(ctx, gpu_torch):
    """(method, cache mode) pairs: the --peers-methods (default all) on a GPU with torch, else the
    run's cache mode."""
    if not gpu_torch:
        return [(None, ctx.cache)]
    return [(m, METHODS[m]) for m in _method_names(ctx)]


def run(ctx, xr):
    sizes, ops, dtypes, shapes, ref = _params(ctx)
    gpu = ctx.is_gpu
    peers = ["torch", "cupy"] if gpu else ["numpy"]
    why = {p: available(p, ctx.device) for p in peers}
    for p, w in why.items():
        if w:
            xr.note(f"{p}: not measured ({w})")
    live = [p for p in peers if not why[p]]
    rmse_peers = [p for p in RMSE_PEERS if (p == "numpy") != gpu]
    if ctx.opt("peers_no_compile", False) and "torch.compile" in rmse_peers:
        rmse_peers.remove("torch.compile")
    gpu_torch = gpu and "torch" in live
    methods = _methods(ctx, gpu_torch)
    in_turns = gpu_torch and bool(ctx.opt("peers_in_turns", False))
    xr.param(in_turns=in_turns)
    if gpu_torch:
        xr.note("elementwise: ewkern's auto kernels are called on torch tensors and timed by the code that times "
                "torch (the same CUDA graph replay or eager single launch, the same flush and sleep kernel); "
                "inputs are random data in each op's domain for ewkern and every peer alike")
        for op, what in PEER_STANDINS.items():
            if op in ops:
                xr.note(f"{op}: the torch peer is {what}")
    graph_too = gpu_torch   # rmse: ewkern also timed by torch's method (CUDA graph replay)
    if graph_too and shapes:
        xr.note(f"rmse: '{EWKERN_GRAPH}' rows are ewkern's auto called on torch tensors and timed exactly as the "
                "torch peer; 'ewkern' rows use ewkern._C.time_plans (its own CUDA graph of the K launches)")
    nopdl = gpu and pdl_active(ctx.info) and not ctx.opt("peers_no_pdl_off", False)
    if nopdl:
        xr.note(f"'{EWKERN_NOPDL}': ewkern's auto kernels timed the same way with programmatic dependent "
                "launch switched off (ewkern.set_pdl(False)); 'ewkern' rows use the default")
    if in_turns:
        together = "ewkern, its PDL-off series and torch" if nopdl else "ewkern and torch"
        xr.note(f"elementwise, back-to-back and single launch: {together} are timed in turns ({TURNS_WORDS}) on "
                "the same buffers; CuPy and after_torch's series one after another")
    else:
        series = "ewkern, its PDL-off series, each peer" if nopdl else "ewkern, each peer"
        xr.note(f"elementwise: the series of a cell ({series}) are timed one after another in an order that "
                "rotates by one from cell to cell, so whatever the cells before leave behind does not always fall "
                "on the same one")
    xr.note("elementwise: after each release of the memory (each size and dtype) the first cell's ewkern series "
            "is timed once more before the cell and that timing thrown away: the first series after a release "
            "ran 15% slow at 2 GiB on both GPUs (fill), whichever implementation it was")
    rmse_versions = ["auto"]
    if not ctx.quick:
        rmse_versions += [v for v in variants("rmse", "float32", ctx.device) if v != "auto"]
    xr.param(sizes=sizes, ops=ops, dtypes=dtypes, rmse_shapes=[[list(s), last] for s, last in shapes],
             peers=live, rmse_peers=rmse_peers, ref_size=ref, cache=ctx.cache, rmse_versions=rmse_versions,
             methods=[m for m, _ in methods if m])
    after_ops = _after_torch_ops(ctx, ops)
    method_ops = {m: (after_ops if m == "after_torch" else [o for o in ops if o in CHAIN_OPS] if m == "chain"
                      else ops) for m, _ in methods}
    if "after_torch" in method_ops:
        xr.note(f"after_torch: one CUDA graph of K pairs ({FOREIGN} on buffers of the op's size and dtype, a set "
                f"of its own, then the op) and one of the K {FOREIGN} alone, same K and buffers, replayed in turns; "
                f"a sample is (pair graph - {FOREIGN} graph) / K, for ewkern's op and torch's alike; pair_time_s and "
                f"foreign_time_s are the two graphs' medians per step; ops: {', '.join(after_ops) or 'none'}")
        xr.param(after_torch_ops=after_ops, foreign=FOREIGN)

    def impls(method):   # ewkern, its PDL-off series, the peers this method times
        return 1 + nopdl + len([p for p in live if not (p == "cupy" and method in TORCH_ONLY)])
    total = (sum(len(sizes) * len(dtypes) * len(method_ops[m]) * impls(m) for m, _ in methods)
             + len(shapes) * (len(rmse_versions) + len(rmse_peers) + graph_too + nopdl) + 2)
    bar = xr.progress(total)

    # reference measurements: device-to-device copy and dot read bandwidth
    n_ref = ref // 4
    ref_impl = "torch" if "torch" in live else ("cupy" if "cupy" in live else ("numpy" if "numpy" in live else None))
    if ref_impl:
        xr.measure_peer(what=f"{ref_impl} copy {fmt_bytes(ref)}", impl=ref_impl, cache=ctx.cache,
                        build=lambda: elementwise_call(ref_impl, "copy", "float32", (n_ref,), ctx.device),
                        series="reference", op="d2d copy", variant=f"{ref_impl} copy", dtype="float32", n=n_ref,
                        size_bytes=ref, reference="copy")
        xr.measure_peer(what=f"{ref_impl} dot 2 x {fmt_bytes(ref)}", impl=ref_impl, cache=ctx.cache,
                        build=lambda: _dot_call(ref_impl, n_ref, ctx.device),
                        series="reference", op="dot", variant=f"{ref_impl}.dot", dtype="float32", n=n_ref,
                        size_bytes=ref, reference="dot read")

    cell = 0
    for size in sizes:
        pool = BufferPool()
        for dtype in dtypes:
            n = size // ITEMSIZE[dtype]
            settle = True   # the first cell after a release of the memory: a warm-up series first
            for op in ops:
                for method, cache in methods:
                    if method and op not in method_ops[method]:
                        continue
                    common = dict(op=op, dtype=dtype, n=n, size_bytes=size, series=f"{op} {dtype}")
                    tag = f"{op} {dtype} {fmt_bytes(size)}" + (f" {method}" if method else "")
                    if method:
                        common["timing_method"] = method
                    # after_torch: torch.mul on a set of its own before each call, ewkern's and torch's alike
                    before = ((lambda dtype=dtype, n=n: foreign_call(dtype, (n,), ctx.device))
                              if method == "after_torch" else None)
                    series = []   # one call per timed series, run in an order that rotates by cell
                    # chain: every way on the same chained sets (call k reads call k - 1's output)
                    chained = (torch_sets(op, dtype, (n,), ctx.device, chain=True)
                               if method == "chain" and gpu_torch else None)
                    if in_turns and method in IN_TURNS:
                        # ewkern, ewkern with PDL off and torch: one series of samples taken in
                        # turns, every way's k-th call on the same buffers (SharedSets)
                        sets = torch_sets(op, dtype, (n,), ctx.device)
                        build_ew = partial(ewkern_in_torch_call, op, dtype, (n,), ctx.device, sets=sets)
                        entries = [(f"ewkern {tag}", build_ew, {"impl_label": "ewkern"})]
                        if nopdl:
                            entries.append((f"{EWKERN_NOPDL} {tag}", _build_without_pdl(build_ew),
                                            {"impl_label": EWKERN_NOPDL}))
                        if "torch" in live:
                            entries.append((f"torch {tag}", partial(elementwise_call, "torch", op, dtype, (n,),
                                                                     ctx.device, sets=sets),
                                            {"impl_label": "torch", "variant": "torch"}))
                        series.append(partial(xr.measure_peers_in_turns, entries=entries, cache=cache, shared=True,
                                              **{"variant": "auto", **common}))
                    elif gpu_torch:
                        # ewkern on torch tensors, timed by the torch peer's code
                        ewkern_series = partial(
                            xr.measure_peer, impl="torch", cache=cache, before=before, variant="auto",
                            build=partial(ewkern_in_torch_call, op, dtype, (n,), ctx.device, sets=chained),
                            **common)
                        series.append(partial(ewkern_series, what=f"ewkern {tag}", impl_label="ewkern"))
                        if nopdl:
                            series.append(_without_pdl(partial(ewkern_series, what=f"{EWKERN_NOPDL} {tag}",
                                                               impl_label=EWKERN_NOPDL)))
                    else:
                        def ewkern_plans():   # run in this iteration: the loop's names are this cell's
                            try:
                                make_plan, set_bytes = plan_elementwise(op, dtype, (n,), ctx.device, pool=pool,
                                                                        random_inputs=not gpu)
                                xr.measure(what=f"ewkern {tag}", make_plan=make_plan, set_bytes=set_bytes,
                                           cache=cache, variant="auto", **common)
                                if nopdl:
                                    with pdl_off():
                                        xr.measure(what=f"{EWKERN_NOPDL} {tag}", make_plan=make_plan,
                                                   set_bytes=set_bytes, cache=cache, variant="auto",
                                                   impl=EWKERN_NOPDL, **common)
                            except Skip as exc:
                                xr.skip(f"ewkern {tag}", str(exc))
                        series.append(ewkern_plans)
                    for p in live:
                        if p == "cupy" and method in TORCH_ONLY:
                            continue   # CuPy: back-to-back only (single launch and after_torch compare with torch)
                        if p == "torch" and in_turns and method in IN_TURNS:
                            continue   # timed in turns with ewkern above
                        series.append(partial(xr.measure_peer, what=f"{p} {tag}", impl=p, cache=cache,
                                              build=partial(elementwise_call, p, op, dtype, (n,), ctx.device,
                                                            sets=chained),
                                              before=before, variant=p, **common))
                    if settle:
                        # the first series after a release ran 15% slow at 2 GiB (fill, every series
                        # alike, samples of a series all slow, the next series fast on the memory it
                        # freed): an ewkern series timed and thrown away takes that first use
                        with xr.discarding():
                            series[0]()
                        settle = False
                    # whoever is timed first in a cell meets what the cells before left behind (the
                    # first series after copy's 1-2 GiB cells ran 15% slow now and then): rotate
                    first = cell % len(series)
                    for timed in series[first:] + series[:first]:
                        timed()
                    # the in-turns ways' shared buffers go with the cell (not kept through the next
                    # series, the release below or the RMSE part)
                    series = sets = build_ew = entries = chained = None
                    cell += 1
            pool.clear()
            release_peer_memory()   # per dtype: CUDA graphs' private pools and torch's cache add up at 2 GiB

    for shape, last in shapes:
        label = _shape_label(shape, last)
        arr_shape = shape if not last else shape          # batch-last: (N, B) reduced over axis 0
        axis = 0 if last else 1
        n = math.prod(shape)
        pool = BufferPool()
        common = dict(op="rmse", dtype="float32", shape=list(arr_shape), n=n, batch_last=last, shape_label=label)
        for v in rmse_versions:
            if last and v != "auto":
                xr.skip(f"ewkern rmse {v} {label}", "the ladder versions take contiguous batches only")
                continue
            make_plan, set_bytes = plan_rmse(arr_shape, "float32", ctx.device, axis=0 if last else None,
                                             variant=v, pool=pool)
            xr.measure(what=f"ewkern rmse {v} {label}", make_plan=make_plan, set_bytes=set_bytes,
                       cache=ctx.cache, series=f"ewkern {v}", variant=v, **common)
            if v == "auto" and nopdl:
                with pdl_off():
                    xr.measure(what=f"{EWKERN_NOPDL} rmse auto {label}", make_plan=make_plan, set_bytes=set_bytes,
                               cache=ctx.cache, series=f"{EWKERN_NOPDL} auto", variant=v, impl=EWKERN_NOPDL,
                               **common)
        pool.clear()
        if graph_too:
            xr.measure_peer(what=f"{EWKERN_GRAPH} rmse {label}", impl="torch", impl_label=EWKERN_GRAPH,
                            cache=ctx.cache, series=f"{EWKERN_GRAPH} auto", variant="auto",
                            build=lambda: ewkern_in_torch_call("rmse", "float32", arr_shape, ctx.device,
                                                               axis=0 if last else None), **common)
        for p in rmse_peers:
            impl = {"torch eager": "torch", "torch vector_norm": "torch", "torch.compile": "torch",
                    "cupy ReductionKernel": "cupy", "numpy": "numpy"}[p]
            xr.measure_peer(what=f"{p} rmse {label}", impl=impl, impl_label=impl, cache=ctx.cache,
                            build=lambda p=p: rmse_call(p, arr_shape, "float32", ctx.device, axis),
                            series=p, variant=p, **common)
        release_peer_memory()
    bar.close()


def _dot_call(impl, n, device):
    why = available(impl, device)
    if why:
        raise Skip(why)
    if impl == "torch":
        import torch

        def make_call():
            a = torch.full((n,), 0.5, dtype=torch.float32, device=device)
            b = torch.full((n,), 0.25, dtype=torch.float32, device=device)
            return lambda: torch.dot(a, b)
    elif impl == "cupy":
        import cupy

        def make_call():
            a = cupy.full((n,), 0.5, dtype=cupy.float32)
            b = cupy.full((n,), 0.25, dtype=cupy.float32)
            out = cupy.empty((), dtype=cupy.float32)
            return lambda: cupy.dot(a, b, out=out)
    else:
        import numpy

        def make_call():
            a = numpy.full((n,), 0.5, dtype=numpy.float32)
            b = numpy.full((n,), 0.25, dtype=numpy.float32)
            return lambda: numpy.dot(a, b)
    return make_call, 8 * n, 8 * n, 4


def reference_rates(exp) -> dict:
    out = {}
    for m in exp.get("measurements", []):
        if m.get("reference"):
            out[m["reference"]] = m
    return out


def _ew_cells(exp):
    """{(method, op, dtype, size): {impl: measurement}} of the elementwise rows, and the peer."""
    cells = {}
    for m in exp.get("measurements", []):
        if m.get("reference") or m.get("op") == "rmse":
            continue
        key = (m.get("timing_method") or m.get("cache"), m["op"], m["dtype"], m["size_bytes"])
        cells.setdefault(key, {})[m["impl"]] = m
    impls = {i for c in cells.values() for i in c}
    peer = next((p for p in ("torch", "numpy", "cupy") if p in impls), None)
    return cells, peer


def ratios(exp, impl="ewkern"):
    """{(method, op, dtype, size): impl GB/s / peer GB/s} for every cell where both were measured."""
    cells, peer = _ew_cells(exp)
    out = {}
    for key, c in cells.items():
        if peer and impl in c and peer in c and c[impl].get("gbs") and c[peer].get("gbs"):
            out[key] = c[impl]["gbs"] / c[peer]["gbs"]
    return out, peer


def pair_ratios(exp, impl="ewkern"):
    """{(op, dtype, size): peer / impl median time of one (foreign kernel, op) pair} of the
    after_torch cells: what a program of such pairs sees (above 1: impl faster)."""
    cells, peer = _ew_cells(exp)
    out = {}
    for (method, op, dtype, size), c in cells.items():
        if method != "after_torch" or not peer or impl not in c or peer not in c:
            continue
        mine, theirs = c[impl].get("pair_time_s"), c[peer].get("pair_time_s")
        if mine and theirs:
            out[(op, dtype, size)] = theirs / mine
    return out, peer


def _ratio_figure(results, exp, impl, method, r, peer):
    import numpy as np
    from .plots import new_figure
    keys = [k for k in r if k[0] == method]
    rows = list(dict.fromkeys((k[1], k[2]) for k in sorted(keys, key=lambda k: (k[2], k[1]))))
    cols = sorted({k[3] for k in keys})
    grid = np.full((len(rows), len(cols)), np.nan)
    for k in keys:
        grid[rows.index((k[1], k[2])), cols.index(k[3])] = r[k]
    fig, axes = new_figure(1.0 * len(cols) + 3.5, 0.22 * len(rows) + 1.6)
    ax = axes[0][0]
    from matplotlib.colors import TwoSlopeNorm
    im = ax.imshow(grid, aspect="auto", cmap="RdBu", norm=TwoSlopeNorm(vmin=0.8, vcenter=1.0, vmax=1.3))
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([fmt_bytes(c) for c in cols], fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{o} {d}" for o, d in rows], fontsize=6)
    for i in range(len(rows)):
        for j in range(len(cols)):
            if np.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=5,
                        color="black" if 0.9 < grid[i, j] < 1.2 else "white")
    fig.colorbar(im, ax=ax, shrink=0.6, label=f"{impl} / {peer} (GB/s ratio)")
    name = results.get("device_name") or results.get("device") or "device"
    # two lines: a GPU's name and the method's label outgrow a map of few sizes on one
    ax.set_title(f"{name}: {impl} / {peer}\n{METHOD_LABEL.get(method, method)}", fontsize=9)
    return fig


def figures(results, exp):
    ms = [m for m in exp["measurements"] if not m.get("reference")]
    figs = []
    for impl in ("ewkern", EWKERN_NOPDL):
        r, peer = ratios(exp, impl)
        for method in dict.fromkeys(k[0] for k in r):
            tag = "" if impl == "ewkern" else "_pdl_off"
            figs.append((f"peers_{str(method).replace('-', '_')}{tag}", _ratio_figure(results, exp, impl, method, r, peer)))
    rm = [m for m in ms if m["op"] == "rmse"]
    if rm:
        cats = list(dict.fromkeys(m["shape_label"] for m in rm))
        groups = list(dict.fromkeys(m["series"] for m in rm))
        vals = {(m["shape_label"], m["series"]): m["gbs"] for m in rm}
        fig = bars_figure(results, cats, groups, vals, kind="batched RMSE",
                          subtitle=f"float32, GB/s = 2 x n x 4 B / t, cache: {rm[0]['cache']}")
        fig.set_size_inches(max(9, 1.4 * len(cats) + 2), 5)
        dot = reference_rates(exp).get("dot read")
        if dot:
            fig.axes[0].axhline(dot["gbs"], color="tab:red", linestyle="-.", linewidth=1,
                                label=f"dot read {dot['gbs']:.0f} GB/s")
            fig.axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figs.append(("peers_rmse", fig))
    return figs


def ratio_intervals(exp, impl="ewkern", level=0.90, resamples=200):
    """{(method, op, dtype, size): (low, high)}: the central `level` interval of the impl / peer
    speed ratio (peer median time / impl median time) over bootstrap resamples of both series'
    samples (common.median_ratio_interval). A cell's ratio below a threshold says little when its
    interval straddles it: single launches spread 10-15% from sample to sample, so a median of 50
    moves by about 1.5% (H100, 2026-11-26)."""
    cells, peer = _ew_cells(exp)
    out = {}
    for key, c in cells.items():
        if peer and impl in c and peer in c:
            # seeded by (op, dtype, size), as the summary's count is
            ci = median_ratio_interval(c[peer].get("samples_s"), c[impl].get("samples_s"), key[1:], level, resamples)
            if ci:
                out[key] = ci
    return out


def method_cells(exp, impl="ewkern", below=1.0):
    """Per timing method, the impl / peer ratios of the elementwise cells and what stands out.

    Returns ({method: {"ratios": {(op, dtype, size): ratio}, "worst": {op: (op, dtype, size)},
    "below": [(op, dtype, size), ...]}}, peer): the worst cell of each op (ops in name order) and
    every cell whose ratio is under below, lowest first. ({}, peer) when nothing was compared.
    """
    r, peer = ratios(exp, impl)
    out = {}
    for method in dict.fromkeys(k[0] for k in r):
        cells = {k[1:]: v for k, v in r.items() if k[0] == method}
        worst = {}
        for k, v in cells.items():
            if k[0] not in worst or v < cells[worst[k[0]]]:
                worst[k[0]] = k
        out[method] = {"ratios": cells, "worst": dict(sorted(worst.items())),
                       "below": sorted((k for k in cells if cells[k] < below), key=cells.get)}
    return out, peer


def elementwise_summary(exp) -> str:
    """Per method: the ewkern / peer ratio of every (op, dtype, size) cell, the worst ratio per op,
    and the cells below 1.00 (ewkern slower)."""
    cells, peer = _ew_cells(exp)
    if not cells or not peer:
        return ""
    cells_by_method = {}
    for (method, *rest), c in cells.items():
        cells_by_method.setdefault(method, {})[tuple(rest)] = c
    out = []
    for impl in ("ewkern", EWKERN_NOPDL):
        per_method, _ = method_cells(exp, impl)
        for method, mc in per_method.items():
            r = mc["ratios"]
            sizes = sorted({k[2] for k in r})
            title = METHOD_LABEL.get(method, str(method))
            out.append(f"**{impl} / {peer}, {title}** (GB/s ratio; above 1: {impl} faster)")
            out.append("")
            rows = []
            for op, dtype in dict.fromkeys((k[0], k[1]) for k in sorted(r, key=lambda k: (k[1], k[0]))):
                rows.append([op, dtype] + [f"{r[(op, dtype, sz)]:.3f}" if (op, dtype, sz) in r else "-"
                                           for sz in sizes])
            out.append(md_table(["op", "dtype"] + [fmt_bytes(sz) for sz in sizes], rows))
            out.append("")
            out.append(f"Worst cell per op ({impl}, {method}): " + "; ".join(
                f"{op} {r[k]:.3f} ({k[1]} {fmt_bytes(k[2])})" for op, k in mc["worst"].items()))
            below = mc["below"]
            out.append(f"Cells below 1.00 ({impl}, {method}): {len(below)} of {len(r)}" +
                       (": " + "; ".join(f"{k[0]} {k[1]} {fmt_bytes(k[2])} {r[k]:.3f}" for k in below)
                        if below else ""))
            c = cells_by_method[method]
            below, sure = below_beyond_spread({k: (r[k], c[k][peer].get("samples_s"), c[k][impl].get("samples_s"))
                                               for k in r if impl in c.get(k, {}) and peer in c.get(k, {})})
            if below:
                out.append(f"Cells below 0.99 ({impl}, {method}): {len(below)}" + spread_note(below, sure))
            pr = pair_ratios(exp, impl)[0] if method == "after_torch" else {}
            if pr:
                lo = min(pr, key=pr.get)
                out.append(f"Whole pairs ({FOREIGN} + op), {peer} / {impl} time, what a program of such pairs "
                           f"sees ({impl}, {method}): median {statistics.median(pr.values()):.3f}, lowest "
                           f"{pr[lo]:.3f} ({lo[0]} {lo[1]} {fmt_bytes(lo[2])}), "
                           f"{sum(v < 1.0 for v in pr.values())} of {len(pr)} below 1.00")
            out.append("")
    return "\n".join(out)


def _timed_together(exp, ms) -> str:
    """The elementwise series that --peers-in-turns times together, as the summary names them: ewkern,
    its PDL-off series where the run timed one (a GPU of compute capability 9.0 or later) and the peer
    (torch on a GPU, CuPy being timed one after another either way; NumPy on a CPU, which has no
    PDL-off series nor timing methods)."""
    impls = {m.get("impl") for m in ms if m.get("op") != "rmse"}
    ways = ["ewkern"] + (["its PDL-off series"] if EWKERN_NOPDL in impls else []) + \
        [p for p in ("torch", "numpy") if p in impls]
    words = ", ".join(ways[:-1]) + " and " + ways[-1] if len(ways) > 1 else ways[0]
    if (exp.get("params") or {}).get("methods"):
        words += " (back-to-back and single launch)"
    return words


def summary(results, exp):
    ms = [m for m in exp["measurements"] if not m.get("reference")]
    refs = reference_rates(exp)
    out = []
    if refs:
        out.append("Reference (same run): " + "; ".join(
            f"{k}: {fmt_gbs(m['gbs'])} GB/s ({m['variant']}, {fmt_bytes(m['size_bytes'])})" for k, m in refs.items()))
        out.append("")
    ew = elementwise_summary(exp)
    if ew:
        out.append(how_timed(exp, ms, _timed_together(exp, ms)))
        out.append("")
        out.append(ew)
    rm = [m for m in ms if m["op"] == "rmse"]
    if rm:
        series = list(dict.fromkeys(m["series"] for m in rm))
        dot = refs.get("dot read")
        ratio_series = [k for k in ("ewkern auto", f"{EWKERN_NOPDL} auto") if k in series] or ["ewkern auto"]
        rows = []
        for label in dict.fromkeys(m["shape_label"] for m in rm):
            cell = {m["series"]: m for m in rm if m["shape_label"] == label}
            row = [label] + [fmt_gbs(cell[s]["gbs"]) if s in cell else "-" for s in series]
            for key in ratio_series:
                auto = cell.get(key)
                row.append(f"{100 * auto['gbs'] / dot['gbs']:.0f}%" if (auto and dot) else "-")
            rows.append(row)
        out.append("")
        out.append(md_table(["rmse shape"] + [f"{s} GB/s" for s in series] +
                            [f"{k.replace('ewkern ', '')} / dot read" for k in ratio_series], rows))
    return "\n".join(out)
