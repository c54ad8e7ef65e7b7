"""Where the host time of an eager training step goes (ewkern.torch against torch), on one device.

    python3 scripts/host_step_probe.py [cuda|cpu] [MiB] [the step to profile] [steps to time, comma-separated]

For each step: the mean host time a step in a loop of 200 (perf_counter, no synchronize inside),
and the median of "synchronize, then one step, then synchronize" (what t1_train's host method sees,
by the host clock). Then the parts: forward alone (with and without grad), a bare
torch.autograd.Function whose forward and backward are torch ops, ewkern's C entry alone, the C++
nodes' callables without the Python wrapper, a user kernel's (t1_train's rmsnorm), and a cProfile of
one step (default ewkern.torch's gelu step)."""
import cProfile
import pstats
import statistics
import sys
import time

import torch
from host_loop import loop_us

import ewkern
import ewkern.torch as ewt
from ewkern.bench import t1_train

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
mib = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
PROFILED = sys.argv[3] if len(sys.argv) > 3 else "ewt gelu step"     # the step cProfile takes apart
ONLY = sys.argv[4].split(",") if len(sys.argv) > 4 else None        # the steps to time (default all)
n = int(mib * (1 << 20)) // 4
x = (torch.rand(n, device=dev) + 0.5).requires_grad_()
y = (torch.rand(n, device=dev) + 0.5).requires_grad_()
g = torch.rand(n, device=dev)
xd, yd = x.detach(), y.detach()
out = torch.empty_like(xd)


def sync():
    if dev != "cpu":
        torch.cuda.synchronize()


class Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a + 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad


steps = {
    "torch add_const step": lambda: torch.autograd.grad(torch.add(x, 1.0), (x,), g),
    "ewt add_const step": lambda: torch.autograd.grad(ewt.add_const(x, 1.0), (x,), g),
    "bare Function step": lambda: torch.autograd.grad(Bare.apply(x), (x,), g),
    "torch gelu step": lambda: torch.autograd.grad(torch.nn.functional.gelu(x), (x,), g),
    "ewt gelu step": lambda: torch.autograd.grad(ewt.gelu(x), (x,), g),
    "torch mul step": lambda: torch.autograd.grad(torch.mul(x, y), (x, y), g),
    "ewt mul step": lambda: torch.autograd.grad(ewt.mul(x, y), (x, y), g),
    "torch gelu fwd (grad)": lambda: torch.nn.functional.gelu(x),
    "ewt gelu fwd (grad)": lambda: ewt.gelu(x),
    "torch gelu fwd (no grad)": lambda: torch.nn.functional.gelu(xd),
    "ewt gelu fwd (no grad)": lambda: ewt.gelu(xd),
    "ewkern.gelu (C entry)": lambda: ewkern.gelu(xd),
    "ewkern.gelu out=": lambda: ewkern.gelu(xd, out=out),
    "torch gelu out=": lambda: torch.ops.aten.gelu.out(xd, out=out),
    "ewkern.gelu_backward": lambda: ewkern.gelu_backward(g, xd),
    "torch gelu_backward": lambda: torch.ops.aten.gelu_backward(g, xd),
    "torch.empty_like": lambda: torch.empty_like(xd),
    # the C++ node's callable without the Python wrapper in front (ewkern.torch._APPLY)
    "native gelu fwd (grad)": lambda: NATIVE_GELU(x),
    "native gelu step": lambda: torch.autograd.grad(NATIVE_GELU(x), (x,), g),
    "native add_const step": lambda: torch.autograd.grad(NATIVE_ADD_CONST(x, 1.0), (x,), g),
    # a user kernel in training: t1_train's rmsnorm (a RowKernel custom op, derived backward)
    "torch rmsnorm step": lambda: torch.autograd.grad(F.rms_norm(xr, (ROW,), w, 1e-6), (xr, w), gr),
    "ewt rmsnorm step": lambda: torch.autograd.grad(RMSNORM(xr, w, 1e-6), (xr, w), gr),
    "ewt rmsnorm fwd (grad)": lambda: RMSNORM(xr, w, 1e-6),
    "ewt rmsnorm fwd (no grad)": lambda: RMSNORM(xr.detach(), w.detach(), 1e-6),
    "RowKernel rmsnorm call": lambda: RMSNORM_KERNEL(xr.detach(), w.detach(), 1e-6),
}
print("ewkern.torch autograd:", ewt.autograd_path())
NATIVE_GELU, NATIVE_ADD_CONST = ewt._APPLY["gelu"], ewt._APPLY["add_const"]
F = torch.nn.functional
ROW = t1_train.ROW
xr = (torch.rand(max(n // ROW, 1), ROW, device=dev) + 0.5).requires_grad_()
w = (torch.rand(ROW, device=dev) + 0.5).requires_grad_()
gr = torch.rand_like(xr.detach())
RMSNORM = t1_train.rmsnorm_op()
RMSNORM_KERNEL = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                                  "y = x * rsqrt(a / _row_size + eps) * w", "0", "bench_rmsnorm")
name = torch.cuda.get_device_name() if dev != "cpu" else "cpu"
print(f"device {dev} {name}, {mib} MiB float32, torch {torch.__version__}")
for name, f in steps.items():
    if ONLY is not None and name not in ONLY:
        continue
    loop = loop_us(f, sync, warm=300, rounds=11)
    one = []
    for _ in range(300):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        one.append((time.perf_counter() - t0) * 1e6)
    print(f"{name:26s} loop {statistics.median(loop):8.2f} us   sync+1+sync {statistics.median(one):8.2f} us "
          f"(p10 {sorted(one)[30]:.1f}, p90 {sorted(one)[270]:.1f})", flush=True)

f = steps[PROFILED]
pr = cProfile.Profile()
pr.enable()
for _ in range(3000):
    f()
pr.disable()
sync()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
