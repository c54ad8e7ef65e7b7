"""Where a training step of rmsnorm spends its GPU time, kernel by kernel (a probe for the GPU
machine, not part of the package).

    python3 scripts/rmsnorm_kernel_probe.py DTYPE SIZE[,SIZE...] [SETS]

For each size (bytes of x, rows of 4096 as `train` makes them, or PROBE_ROW elements), the step of `ewkern.bench train`'s
rmsnorm (ewkern.torch's RowKernel op with its derived backward) and torch eager's
(F.rms_norm) run 30 times each under torch.profiler after a warm-up, rotating through SETS
(default 24) input sets so that the L2 does not hold them; prints each kernel's mean duration
(us) per step, the step's kernel total, and the row plan (RowKernel._last_path) of every
RowKernel the process made.

PROBE_EVENTS=1: no torch.profiler; each way's step timed by CUDA events around 30 steps (median of
7 runs), for the step's time where PDL overlaps its kernels (the profiler's per-kernel durations
then include a kernel's early start, waiting on the one before).

PROBE_NCU=1: no torch.profiler (it and Nsight Compute both need CUPTI); each way runs 3 steps
after the warm-up, for Nsight Compute to pick the kernels, e.g. the derived backward's row kernel
and its column sum at 4 MiB against torch's two backward kernels:

    PROBE_NCU=1 ncu --clock-control none --set full -k regex:"rmsnorm_backward|layer_norm_grad|GammaBeta" \
        -c 8 -f -o $OUT/rmsnorm-bw python3 scripts/rmsnorm_kernel_probe.py float16 4MiB
    ncu -i $OUT/rmsnorm-bw.ncu-rep --page details > $OUT/rmsnorm-bw.txt"""
import gc
import os
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import ewkern
from ewkern.bench import t1_train as T

dtype = getattr(torch, sys.argv[1])
sizes = [int(s[:-3]) << (20 if s.endswith("MiB") else 30) for s in sys.argv[2].split(",")]
nsets = int(sys.argv[3]) if len(sys.argv) > 3 else 24
ROW = int(os.environ.get("PROBE_ROW", T.ROW))
op = T.rmsnorm_op()
ways = {"ewkern.torch": op, "torch eager": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)}
for size in sizes:
    rows = size // dtype.itemsize // ROW
    sets = []
    for _ in range(nsets):
        x = (torch.rand(rows, ROW, device="cuda") * 4 - 2).to(dtype).requires_grad_()
        w = (torch.rand(ROW, device="cuda") + 0.5).to(dtype).requires_grad_()
        g = (torch.rand(rows, ROW, device="cuda") - 0.5).to(dtype)
        sets.append((x, w, g))
    for name, fn in ways.items():
        def step(k):
            x, w, g = sets[k % nsets]
            y = fn(x, w, 1e-6)
            torch.autograd.grad(y, (x, w), g)
        for k in range(2 * nsets):
            step(k)
        torch.cuda.synchronize()
        if os.environ.get("PROBE_NCU") == "1":
            for k in range(3):
                step(k)
            torch.cuda.synchronize()
            continue
        steps = 30
        if os.environ.get("PROBE_EVENTS") == "1":
            # the step's time on the GPU, steps launched one after another (PDL's overlap counted,
            # which the profiler's per-kernel durations count twice): median of 7 runs of 30
            times = []
            for _ in range(7):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                ev[0].record()
                for k in range(steps):
                    step(k)
                ev[1].record()
                torch.cuda.synchronize()
                times.append(ev[0].elapsed_time(ev[1]) * 1e3 / steps)
            times.sort()
            print(f"== {sys.argv[1]} {size >> 20} MiB ({rows} rows) {name}: {times[3]:.2f} us a step "
                  f"(events, {times[0]:.2f}-{times[-1]:.2f})")
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for k in range(steps):
                step(k)
            torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.events():
            if e.device_type.name == "CUDA":
                per[e.name[:90]] += e.device_time / steps if hasattr(e, "device_time") else e.cuda_time / steps
        total = sum(per.values())
        print(f"== {sys.argv[1]} {size >> 20} MiB ({rows} rows) {name}: kernels {total:.2f} us a step")
        for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
            print(f"   {v:8.2f}  {k}")
for obj in gc.get_objects():
    if isinstance(obj, ewkern.RowKernel):
        print("RowKernel", obj.name, getattr(obj, "_last_path", None))
