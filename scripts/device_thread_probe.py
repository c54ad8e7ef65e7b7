"""Does a kernel call cost more on autograd's device thread than on the calling thread? A CUDA
backward runs on a thread of torch's autograd engine; a Python backward there holds the GIL for
its calls. This times eager steps `torch.autograd.grad(F.apply(x), x, g)` of Python
torch.autograd.Functions whose forward is `x * 1` and whose backward is one call, and the same
calls on this thread.

    python3 scripts/device_thread_probe.py [rows] [cols]

Backward calls: none (returns g), torch.mul, ewkern.mul (the C op through the DLPack exchange
API), an ElementwiseKernel and a RowKernel (the run-time kernels' warm path: _rtc_fast, then the
plan's Python run). Host time a step (or a call) in a loop of 1000, median of 5 rounds in turns."""
import statistics
import sys
import time

import torch

import ewkern

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 64
cols = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
x = (torch.rand(rows, cols, device="cuda") + 0.5).requires_grad_()
g = torch.rand(rows, cols, device="cuda")
w = torch.rand(cols, device="cuda") + 0.5
ek = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x * y", "dtp_mul")
rk = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                      "y = x * rsqrt(a / _row_size + eps) * w", "0", "dtp_rms")
CALLS = {
    "none": lambda t: t,
    "torch.mul": lambda t: torch.mul(t, t),
    "ewkern.mul": lambda t: ewkern.mul(t, t),
    "ElementwiseKernel": lambda t: ek(t, t),
    "RowKernel": lambda t: rk(t, w, 1e-6),
}


def function(call):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 1

        @staticmethod
        def backward(ctx, grad):
            return call(grad)
    return F


STEPS = {f"step, backward {n}": (lambda F=function(c): torch.autograd.grad(F.apply(x), x, g)) for n, c in CALLS.items()}
STEPS.update({f"call {n} on this thread": (lambda c=c: c(g)) for n, c in CALLS.items() if n != "none"})
for f in STEPS.values():
    f()


def loop(f, n=1000):
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


res = {k: [] for k in STEPS}
names = list(STEPS)
for r in range(5):
    for k in names[r % len(names):] + names[:r % len(names)]:
        loop(STEPS[k], 100)
        res[k].append(loop(STEPS[k]))
print(f"{torch.cuda.get_device_name()}, [{rows}, {cols}] float32, torch {torch.__version__}")
for k, v in res.items():
    print(f"{k:40s} {statistics.median(v):8.2f} us (rounds {min(v):.2f}-{max(v):.2f})")
