"""A1: the add-kernel experiments: z = x + y over the paper's matrix of coding choices.

Every add variant named like the paper's kernels (Naive/ThreadBlock, I/S index, V1/V2/V4,
U1/U2/U4, N/T/M vectorisation style, C/R restrict, gs/mo traversal), float32, n = 2^27, r = 4
runs each (the samples), for the launch configurations (block 256, grid-stride blocks 2048),
(256, 768) and (384, 768). The naive kernels (one thread does everything) run for seconds at
2^27, so they run once, at a smaller n (2^20 by default). Tables: Name | Mean duration | Mean
bandwidth | Total error (sum of |z - (x + y)| over all elements, on random x, y in [0, 1)).
Convention: effective bandwidth = 3 x n x 4 bytes / t (the paper's text says 2n x s / t, its
tables match 3n x s / t). The result goes to a third array (z = x + y) so ``__restrict__`` is legal.
"""

from __future__ import annotations


from .catalog import a1_parse
from .common import bars_figure, check_bytes, count_arg
from .timing import Skip, core, ew, new_filled, variants
from .units import fmt_count

NAME = "a1"
TITLE = "Add kernel experiments: the coding-choice matrix"
DESCRIPTION = "y = x + y kernels (naive/thread-block, I/S, V1-4, U1-4, N/T/M, C/R, gs/mo): the paper's tables"
PAPER = "add-kernel-experiments.md"


def _configs(text):
    """argparse type: block:grid-stride-blocks pairs, each number at least 1."""
    import argparse
    out = []
    for part in str(text).split(","):
        if part.strip():
            try:
                b, g = (int(x) for x in part.split(":"))
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected block:grid pairs such as 256:2048,384:768, got "
                                                 f"{text!r}") from None
            if b < 1 or g < 1:
                raise argparse.ArgumentTypeError(f"block and grid must be at least 1: {part.strip()!r}")
            out.append((b, g))
    if not out:
        raise argparse.ArgumentTypeError(f"expected block:grid pairs such as 256:2048,384:768, got {text!r}")
    return out


ARGS = [("--a1-n", dict(type=count_arg(), metavar="N", help="elements (default 2^27; CPU 2^22, quick 2^20)")),
        ("--a1-naive-n", dict(type=count_arg(), metavar="N",
                              help="elements for the naive kernels (default 2^20, quick 2^16)")),
        ("--a1-runs", dict(type=count_arg(), metavar="R", help="runs per kernel (default 4)")),
        ("--a1-configs", dict(type=_configs, metavar="B:G,...",
                              help="block:grid-stride-blocks configurations (default 256:2048,256:768,384:768; quick 256:2048)"))]


def _params(ctx):
    n = ctx.pick("a1_n", gpu_full=1 << 27, gpu_quick=1 << 27, cpu_full=1 << 22, cpu_quick=1 << 20)
    naive_n = ctx.pick("a1_naive_n", gpu_full=1 << 20, gpu_quick=1 << 16, cpu_full=1 << 20, cpu_quick=1 << 16)
    runs = ctx.opt("a1_runs", 4)
    configs = ctx.opt("a1_configs") or ([(256, 2048)] if ctx.quick else [(256, 2048), (256, 768), (384, 768)])
    return n, naive_n, runs, configs


def check(ctx):
    n, naive_n, runs, configs = _params(ctx)
    check_bytes(ctx, 4 * 4 * max(n, naive_n), "a1's x, y, z and reference")


class _Data:
    """x, y random in [0, 1), the float32 reference x + y, and an output z, on the device."""

    def __init__(self, ctx, n, seed):
        import numpy
        rng = numpy.random.default_rng(seed)
        x = rng.random(n, dtype=numpy.float32)
        y = rng.random(n, dtype=numpy.float32)
        self.ref_host = x + y
        self.x = ew().asarray(x, device=ctx.device)
        self.y = ew().asarray(y, device=ctx.device)
        self.z = ew().empty((n,), dtype="float32", device=ctx.device)
        self.n = n
        self.device = ctx.device
        self._ref_dev = None

    def total_error(self) -> float:
        import numpy
        if self.device != "cpu":
            try:
                import torch
                if self._ref_dev is None:
                    self._ref_dev = torch.from_numpy(self.ref_host).to(self.device)
                z = torch.from_dlpack(self.z)
                return float((z.double() - self._ref_dev.double()).abs().sum())
            except Exception:
                pass
        z = numpy.asarray(self.z.numpy(), dtype=numpy.float64)
        return float(numpy.abs(z - self.ref_host.astype(numpy.float64)).sum())


def _measure(ctx, xr, data, v, feats, block, grid, runs, config_label):
    n = data.n
    kw = {"variant": v}
    if block:
        kw["block"] = block
    if grid:
        kw["grid"] = grid
    sets = []

    def make_plan():
        if not sets:
            sets.append((data.x, data.y, data.z))
        else:   # more sets for rotate at small n: constant data, the error is read from set 0
            sets.append((new_filled((n,), "float32", ctx.device, 0.5), new_filled((n,), "float32", ctx.device, 0.25),
                         ew().empty((n,), dtype="float32", device=ctx.device)))
        x, y, z = sets[-1]
        return core().prepare(ew().add, x, y, out=z, **kw)

    ew().fill(data.z, 0.0)
    rec = xr.measure(what=f"{v} {config_label}", make_plan=make_plan, set_bytes=3 * n * 4, cache=ctx.cache,
                     samples=runs, series=config_label, op="add", variant=v, dtype="float32", n=n,
                     block=block, grid=grid, **{f"a1_{k}": val for k, val in feats.items()})
    if rec is not None:
        try:
            rec["total_error"] = data.total_error()
        except Exception as exc:
            rec["total_error"] = None
            xr.note(f"total error not computed: {type(exc).__name__}: {exc}")
        st = rec["stats_s"]
        rec["mean_time_s"] = st["mean"]
        rec["mean_gbs"] = rec["bytes"] / st["mean"] / 1e9
    return rec


def run(ctx, xr):
    n, naive_n, runs, configs = _params(ctx)
    parsed = {}
    for v in variants("add", "float32", ctx.device):
        f = a1_parse(v)
        if f:
            parsed[v] = f
    if not parsed:
        raise Skip(f"ewkern has no add-kernel-experiments variants (NaiveIV1U1NC, ThreadBlockIV4U4MRgs, ...) "
                   f"on {ctx.device}: they are CUDA kernels")
    naive = [v for v, f in parsed.items() if f["family"] == "naive"]
    tb = [v for v, f in parsed.items() if f["family"] == "threadblock"]
    xr.param(n=n, naive_n=naive_n, runs=runs, configs=[list(c) for c in configs], naive=len(naive),
             threadblock=len(tb), convention="bandwidth = 3 * n * 4 B / t")
    xr.note(f"thread-block kernels at n = {fmt_count(n)}; naive kernels (one thread) at n = {fmt_count(naive_n)}, "
            f"not the paper's 2^27 (they would run for seconds each)")
    xr.note("effective bandwidth = 3 x n x 4 bytes / t (reads of x and y + write of z)")
    bar = xr.progress(len(naive) + len(tb) * len(configs))
    if naive:
        data = _Data(ctx, naive_n, 2)
        for v in naive:
            _measure(ctx, xr, data, v, parsed[v], None, None, runs, f"naive, n={fmt_count(naive_n)}")
        del data
    if tb:
        data = _Data(ctx, n, 3)
        for block, grid in configs:
            label = f"blockSize={block}, gridStrideBlocks={grid}"
            for v in tb:
                g = grid if parsed[v]["traversal"] == "gs" else None
                _measure(ctx, xr, data, v, parsed[v], block, g, runs, label)
    bar.close()


def paper_tables(exp) -> str:
    ms = exp["measurements"]
    out = []
    for series in dict.fromkeys(m["series"] for m in ms):
        out.append(f"#### {series}\n")
        out.append("```text")
        out.append(f"{'Name':<42} {'Mean duration':>13} |  {'Mean bandwidth':>14}  |  {'Total error':>13}")
        out.append("=" * 92)
        for m in (x for x in ms if x["series"] == series):
            name = f"add{m['variant']} (FP32)"
            err = m.get("total_error")
            out.append(f"{name:<42} {m['mean_time_s'] * 1e3:>10.3f} ms  |  {m['mean_gbs']:>9.2f} GB/s  |  "
                       f"{(f'{err:.3e}' if err is not None else '-'):>13}")
        out.append("```\n")
    return "\n".join(out)


def figures(results, exp):
    ms = exp["measurements"]
    figs = []
    i = 0
    for series in dict.fromkeys(m["series"] for m in ms):
        sel = [m for m in ms if m["series"] == series]
        cats = [m["variant"].replace("ThreadBlock", "TB").replace("Naive", "N:") for m in sel]
        vals = {(c, "median GB/s"): m["gbs"] for c, m in zip(cats, sel)}
        naive = "naive" in series
        fig = bars_figure(results, cats, ["median GB/s"], vals, kind="" if naive else "element-wise",
                          lines=not naive, subtitle=f"add float32: {series}, cache: {sel[0]['cache']}" if not naive else
                          f"{results.get('device_name')}: naive add kernels (one thread), {series}, "
                          f"cache: {sel[0]['cache']}")
        fig.set_size_inches(max(8, 0.28 * len(cats) + 2), 5)
        for t in fig.axes[0].get_xticklabels():
            t.set_rotation(90)
            t.set_fontsize(7)
        if not naive:
            i += 1
        figs.append((f"a1_{'naive' if naive else 'config%d' % i}", fig))
    return figs


def summary(results, exp):
    return paper_tables(exp)
