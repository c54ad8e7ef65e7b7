"""Where the host time of an eager training step goes (ewkern.torch against torch), on one device.

    python3 scripts/host_step_probe.py [cuda|cpu] [MiB]

For each step: the mean host time a step in a loop of 200 (perf_counter, no synchronize inside),
and the median of "synchronize, then one step, then synchronize" (what t1_train's host method sees,
by the host clock). Then the parts: forward alone (with and without grad), a bare
torch.autograd.Function whose forward and backward are torch ops, ewkern's C entry alone, and a
cProfile of ewkern.torch's gelu step."""
import cProfile
import pstats
import statistics
import sys
import time

import torch

import ewkern
import ewkern.torch as ewt

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
mib = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
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
}
name = torch.cuda.get_device_name() if dev != "cpu" else "cpu"
print(f"device {dev} {name}, {mib} MiB float32, torch {torch.__version__}")
for name, f in steps.items():
    for _ in range(300):
        f()
    sync()
    loop = []
    for _ in range(11):
        t0 = time.perf_counter()
        for _ in range(200):
            f()
        t1 = time.perf_counter()
        sync()
        loop.append((t1 - t0) / 200 * 1e6)
    one = []
    for _ in range(300):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        one.append((time.perf_counter() - t0) * 1e6)
    print(f"{name:26s} loop {statistics.median(loop):8.2f} us   sync+1+sync {statistics.median(one):8.2f} us "
          f"(p10 {sorted(one)[30]:.1f}, p90 {sorted(one)[270]:.1f})", flush=True)

f = steps["ewt gelu step"]
pr = cProfile.Profile()
pr.enable()
for _ in range(3000):
    f()
pr.disable()
sync()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
