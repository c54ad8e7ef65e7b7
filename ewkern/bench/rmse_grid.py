"""rmse_grid: batched RMSE over a grid of row lengths x batch counts, both layouts, three dtypes.

Every (n, batches) cell with 1 MiB - 2 GiB of input (both inputs; n from 1 to 2^24, batches from
1 to 2^22), batch-first ([batches, n], reduced over the last axis) and batch-last ([n, batches],
reduced over axis 0), float32, float16 and bfloat16, back-to-back (K calls replayed as one CUDA
graph, inputs rotated through >= 4x the L2). ewkern's auto is called on torch tensors and timed
by the code that times torch; the peers are torch eager sqrt(((a-b)**2).mean(dim)),
torch.linalg.vector_norm(a-b, dim)/sqrt(n) and torch.compile of the eager expression (one
compiled function per dtype and layout, so after the first shape Dynamo recompiles it with dynamic
shapes, as it does for a user who calls it on many shapes), and torch.dot over the same elements
as the read-rate reference. Bandwidth counts what each one moves: both inputs read plus its
result written (one value per batch: for n <= 8 that is a visible share).
"""

from __future__ import annotations

import math

from .common import bytes_arg, check_bytes, list_arg, md_table
from .frameworks import available, ewkern_in_torch_call, release_peer_memory, rmse_call
from .timing import Skip
from .units import ITEMSIZE, fmt_bytes, fmt_count

NAME = "rmse_grid"
TITLE = "Batched RMSE over row length x batch count"
DESCRIPTION = "rmse auto vs torch eager / vector_norm / torch.compile / torch.dot over n x batches, 2 layouts, 3 dtypes"
PAPER = "batched-rmse-kernel-analysis.txt"
CPU = False
CPU_SKIP = "the grid compares against torch on a CUDA device"

NS = [1, 2, 3, 4, 8, 16, 32, 64, 256, 1024, 4096, 1 << 16, 1 << 20, 1 << 24]
BATCHES = [1, 16, 256, 4096, 1 << 16, 1 << 18, 1 << 20, 1 << 22]
QUICK_NS = [1, 8, 64, 4096, 1 << 20]
QUICK_BATCHES = [16, 4096, 1 << 20]
PEERS = ["torch eager", "torch vector_norm", "torch.compile"]
JUDGED_BYTES = 32 << 20      # cells with at least this much input are held to the read-rate bar

ARGS = [("--grid-dtypes", dict(type=list_arg, metavar="DTYPES", help="dtypes (default float32,float16,bfloat16)")),
        ("--grid-layouts", dict(type=list_arg, metavar="LAYOUTS", help="first,last (default both)")),
        ("--grid-max-bytes", dict(type=bytes_arg(), metavar="BYTES", help="largest input (both arrays; default 2GiB)")),
        ("--grid-min-bytes", dict(type=bytes_arg(least=0), metavar="BYTES",
                                  help="smallest input (both arrays; default 1MiB; 0: every cell up to the largest)")),
        ("--grid-no-peers", dict(action="store_true", help="time ewkern and torch.dot only"))]


def _cells(ctx, dtype):
    lo = ctx.opt("grid_min_bytes", 1 << 20)
    hi = ctx.opt("grid_max_bytes", 2 << 30)
    ns, bs = (QUICK_NS, QUICK_BATCHES) if ctx.quick else (NS, BATCHES)
    s = ITEMSIZE[dtype]
    return [(n, b) for n in ns for b in bs if lo <= 2 * n * b * s <= hi]


def check(ctx):
    lo, hi = ctx.opt("grid_min_bytes", 1 << 20), ctx.opt("grid_max_bytes", 2 << 30)
    if lo > hi:   # no cell between them: the run passed with nothing measured
        from .timing import BenchError
        raise BenchError(f"--grid-min-bytes ({lo}) is larger than --grid-max-bytes ({hi}): no cell lies between")
    check_bytes(ctx, hi, "rmse_grid's largest cell")


def _dot_build(dtype, numel, device):
    import torch
    from .frameworks import _torch_dtype

    def make_call():
        a = torch.rand((numel,), device=device, dtype=torch.float32).to(_torch_dtype(dtype))
        b = torch.rand((numel,), device=device, dtype=torch.float32).to(_torch_dtype(dtype))
        return lambda: torch.dot(a, b)
    s = ITEMSIZE[dtype]
    return make_call, 2 * numel * s, 2 * numel * s, s


def run(ctx, xr):
    why = available("torch", ctx.device)
    if why:
        raise Skip(why)
    import torch
    dynamo = getattr(torch, "_dynamo", None)
    if dynamo is not None:   # one compiled function meets every shape of its dtype and layout
        for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(dynamo.config, knob):
                setattr(dynamo.config, knob, max(getattr(dynamo.config, knob), 4096))
    dtypes = ctx.opt("grid_dtypes") or ["float32", "float16", "bfloat16"]
    layouts = ctx.opt("grid_layouts") or ["first", "last"]
    peers = [] if ctx.opt("grid_no_peers", False) else PEERS
    cells = {d: _cells(ctx, d) for d in dtypes}
    xr.param(dtypes=dtypes, layouts=layouts, peers=peers, cells={d: [list(c) for c in cs] for d, cs in cells.items()},
             judged_bytes=JUDGED_BYTES)
    xr.note("bytes moved = both inputs read + the result written (ewkern: float32 per batch for 16-bit inputs, "
            "torch: the input dtype); torch.dot reads the same elements")
    bar = xr.progress(sum(len(cs) for cs in cells.values()) * len(layouts) * (2 + len(peers)))
    for dtype in dtypes:
        for layout in layouts:
            for n, b in cells[dtype]:
                shape = (b, n) if layout == "first" else (n, b)
                axis = 1 if layout == "first" else 0
                common = dict(op="rmse", dtype=dtype, n_red=n, batches=b, layout=layout, shape=list(shape),
                              size_bytes=2 * n * b * ITEMSIZE[dtype])
                label = f"{dtype} {layout} {fmt_count(b)}x{fmt_count(n)}"
                xr.measure_peer(what=f"ewkern {label}", impl="torch", impl_label="ewkern", cache="rotate",
                                build=lambda shape=shape, dtype=dtype, axis=axis: ewkern_in_torch_call(
                                    "rmse", dtype, shape, ctx.device, axis=0 if axis == 0 else None),
                                series="ewkern", variant="auto", **common)
                for p in peers:
                    xr.measure_peer(what=f"{p} {label}", impl="torch", impl_label=p, cache="rotate",
                                    build=lambda p=p, shape=shape, dtype=dtype, axis=axis: rmse_call(
                                        p, shape, dtype, ctx.device, axis, out_itemsize=ITEMSIZE[dtype], shared_compile=True),
                                    series=p, variant=p, **common)
                xr.measure_peer(what=f"torch.dot {label}", impl="torch", impl_label="torch.dot", cache="rotate",
                                build=lambda n=n, b=b, dtype=dtype: _dot_build(dtype, n * b, ctx.device),
                                series="torch.dot", variant="torch.dot", **common)
                release_peer_memory()
    bar.close()


def _grid(exp):
    """{(dtype, layout): {(n, batches): {impl: measurement}}}"""
    out = {}
    for m in exp.get("measurements", []):
        out.setdefault((m["dtype"], m["layout"]), {}).setdefault((m["n_red"], m["batches"]), {})[m["impl"]] = m
    return out


def cell_ratios(exp):
    """{(dtype, layout, n, batches): (ewkern / dot, ewkern / best peer, input bytes)}."""
    out = {}
    for (dtype, layout), cells in _grid(exp).items():
        for (n, b), c in cells.items():
            e = c.get("ewkern")
            if not e or not e.get("gbs"):
                continue
            dot = c.get("torch.dot")
            peers = [c[p]["gbs"] for p in PEERS if p in c and c[p].get("gbs")]
            out[(dtype, layout, n, b)] = (e["gbs"] / dot["gbs"] if dot and dot.get("gbs") else None,
                                          e["gbs"] / max(peers) if peers else None, 2 * n * b * ITEMSIZE[dtype])
    return out


def figures(results, exp):
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from .plots import new_figure
    r = cell_ratios(exp)
    keys = list(dict.fromkeys((k[0], k[1]) for k in r))
    figs = []
    for idx, (what, center, lo, hi) in enumerate((("torch.dot (read rate)", 0.9, 0.5, 1.1),
                                                  ("best torch peer", 1.0, 0.5, 4.0))):
        if not keys:
            break
        ncols = min(3, len(keys))
        nrows = math.ceil(len(keys) / ncols)
        fig, axes = new_figure(4.6 * ncols, 4.2 * nrows, ncols=ncols, nrows=nrows)
        for i, key in enumerate(keys):
            ax = axes[i // ncols][i % ncols]
            ns = sorted({k[2] for k in r if k[:2] == key})
            bs = sorted({k[3] for k in r if k[:2] == key})
            grid = np.full((len(bs), len(ns)), np.nan)
            for k, v in r.items():
                if k[:2] == key and v[idx] is not None:
                    grid[bs.index(k[3]), ns.index(k[2])] = v[idx]
            im = ax.imshow(grid, origin="lower", aspect="auto", cmap="RdBu",
                           norm=TwoSlopeNorm(vmin=lo, vcenter=center, vmax=hi))
            for yi in range(len(bs)):
                for xi in range(len(ns)):
                    if np.isfinite(grid[yi, xi]):
                        ax.text(xi, yi, f"{grid[yi, xi]:.2f}", ha="center", va="center", fontsize=6)
            ax.set_xticks(range(len(ns)))
            ax.set_xticklabels([fmt_count(x) for x in ns], rotation=60, fontsize=7)
            ax.set_yticks(range(len(bs)))
            ax.set_yticklabels([fmt_count(x) for x in bs], fontsize=7)
            ax.set_xlabel("n (elements per batch)")
            ax.set_ylabel("batches")
            ax.set_title(f"{key[0]}, batch-{key[1]}", fontsize=9)
            fig.colorbar(im, ax=ax, shrink=0.7)
        for j in range(len(keys), ncols * nrows):
            axes[j // ncols][j % ncols].axis("off")
        name = results.get("device_name") or results.get("device") or "device"
        fig.suptitle(f"{name}: ewkern rmse / {what}, bytes moved per second, back-to-back", fontsize=10)
        figs.append((f"rmse_grid_{'dot' if idx == 0 else 'peers'}", fig))
    return figs


def summary(results, exp):
    r = cell_ratios(exp)
    if not r:
        return ""
    rows = []
    for key in dict.fromkeys((k[0], k[1]) for k in r):
        judged = [(k, v) for k, v in r.items() if k[:2] == key and v[2] >= JUDGED_BYTES and v[0] is not None]
        allp = [(k, v) for k, v in r.items() if k[:2] == key and v[1] is not None]
        wd = min(judged, key=lambda kv: kv[1][0]) if judged else None
        wp = min(allp, key=lambda kv: kv[1][1]) if allp else None
        below = sum(1 for _, v in judged if v[0] < 0.9)
        rows.append([key[0], key[1], len(judged),
                     f"{wd[1][0]:.2f} ({fmt_count(wd[0][3])}x{fmt_count(wd[0][2])})" if wd else "-",
                     f"{below}", f"{wp[1][1]:.2f} ({fmt_count(wp[0][3])}x{fmt_count(wp[0][2])})" if wp else "-"])
    out = [md_table(["dtype", "layout", f"cells >= {fmt_bytes(JUDGED_BYTES)}", "worst ewkern / dot there",
                     "cells < 0.90", "worst ewkern / best peer (all cells)"], rows), ""]
    low = sorted(((k, v) for k, v in r.items() if v[2] >= JUDGED_BYTES and v[0] is not None and v[0] < 0.9),
                 key=lambda kv: kv[1][0])
    if low:
        out.append("Cells >= 32 MiB below 0.90 of torch.dot: " + "; ".join(
            f"{k[0]} {k[1]} {fmt_count(k[3])}x{fmt_count(k[2])} {v[0]:.2f}" for k, v in low))
    return "\n".join(out)
