"""Cold launches of the `fused` experiment's expressions, ewkern's kernel against torch.compile's,
for Nsight Compute (run under ncu with --cache-control all: every kernel timed cold).

    python3 scripts/fused_cold_probe.py EXPR[,EXPR...] DTYPE SIZE [REPS]
    ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum,... \\
        python3 scripts/fused_cold_probe.py rmsnorm,swish_gate float16 1MiB

Each way's call runs REPS times (default 5) after a warm-up of 3; the PDL setting is ewkern's
default unless EWKERN_PDL=0. FUSED_BLOCKS=128,512 adds ewkern ways that pass block_size= (the
elementwise expressions). The NVTX range of each way is "EXPR DTYPE SIZE WAY"."""
import os
import sys

import torch

import ewkern
from ewkern.bench import f1_fused as F

exprs, dtype, size = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
nbytes = int(size[:-3]) << (20 if size.endswith("MiB") else 30)
tdt = getattr(torch, dtype)
for name in exprs:
    e = F.EXPRS[name]
    item = torch.empty((), dtype=tdt).element_size()
    n = nbytes // item
    rows = n // F.COLS if e.rows else None
    shape = (rows, F.COLS) if rows else (n,)
    ins = [(torch.rand(shape, device="cuda") + 0.5).to(tdt if t in ("T", "B") else getattr(torch, t))
           for t in e.ins]
    spec = e.own[0] if name == "rmsnorm" else e.kernels[0]
    kind, args, kw = spec
    args = tuple(a.replace("{B}", dtype) if isinstance(a, str) else a for a in args)
    k = getattr(ewkern, kind)(*args, **kw)
    tfn = torch.compile(F._torch_fn(torch, name), dynamic=False)
    out_dt = tdt if e.out == "T" else getattr(torch, e.out)
    out = torch.empty((rows,) if e.reduce else shape, dtype=out_dt, device="cuda")
    if name == "rmsnorm":
        ecall = lambda: k(ins[0], F.RMS_EPS, out)
    elif name == "mse_rows":
        ecall = lambda: k(*ins, out=out, axis=1)
    else:
        ecall = lambda: k(*ins, out)
    tcall = lambda: tfn(*ins)
    ways = [("ewkern", ecall), ("torch.compile", tcall)]
    if not e.rows:
        for b in filter(None, os.environ.get("FUSED_BLOCKS", "").split(",")):
            ways.append((f"ewkern b{b}", lambda b=int(b): k(*ins, out, block_size=b)))
    for way, call in ways:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"{name} {dtype} {size} {way}")
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
print("done")
