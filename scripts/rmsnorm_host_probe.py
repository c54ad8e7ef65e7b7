"""The host time of a user kernel's training step taken apart (t1_train's rmsnorm: an
ewkern.RowKernel made a custom op by ewkern.torch.kernel_op, its backward derived), against torch's
rms_norm. Each part is timed as a loop of 200 calls without a synchronize inside (the host's cost
where the GPU keeps up), median of 9 rounds.

    python3 scripts/rmsnorm_host_probe.py [cuda|cpu] [MiB]"""
import statistics
import sys

import torch
from host_loop import loop_us

import ewkern
import ewkern.torch as ewt
from ewkern.bench import t1_train

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
mib = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
ROW = t1_train.ROW
rows = max(int(mib * (1 << 20)) // 4 // ROW, 1)
x = (torch.rand(rows, ROW, device=dev) + 0.5).requires_grad_()
w = (torch.rand(ROW, device=dev) + 0.5).requires_grad_()
g = torch.rand(rows, ROW, device=dev)
xd, wd = x.detach(), w.detach()
op = t1_train.rmsnorm_op()
k = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                     "y = x * rsqrt(a / _row_size + eps) * w", "0", "bench_rmsnorm")
bk = ewt._row_backward(k, k.in_params, k.out_params, ("eps",))
F = torch.nn.functional
y_e = op(x, w, 1e-6)
y_t = F.rms_norm(x, (ROW,), w, 1e-6)


class Bare(torch.autograd.Function):
    """A Python Function of the same inputs whose backward is free (two views of g): the engine's
    and the Python node's own cost; BareBk's backward runs the derived kernel bk."""
    @staticmethod
    def forward(ctx, a, b, eps):
        ctx.save_for_backward(a, b)
        return a.view_as(a)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad[0], None


class BareBk(Bare):
    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga, gb = bk(grad, a, b, 1e-6)
        return ga, gb, None


y_b, y_bk = Bare.apply(x, w, 1e-6), BareBk.apply(x, w, 1e-6)


def single_thread(f):
    """f with the autograd engine's device threads off (the backward on the calling thread)."""
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return f()
    return run


def sync():
    if dev != "cpu":
        torch.cuda.synchronize()


parts = {
    "torch rms_norm step": lambda: torch.autograd.grad(F.rms_norm(x, (ROW,), w, 1e-6), (x, w), g),
    "ewt rmsnorm step": lambda: torch.autograd.grad(op(x, w, 1e-6), (x, w), g),
    "torch rms_norm fwd (grad)": lambda: F.rms_norm(x, (ROW,), w, 1e-6),
    "ewt rmsnorm fwd (grad)": lambda: op(x, w, 1e-6),
    "torch backward alone": lambda: torch.autograd.grad(y_t, (x, w), g, retain_graph=True),
    "ewt backward alone": lambda: torch.autograd.grad(y_e, (x, w), g, retain_graph=True),
    "bare Function backward": lambda: torch.autograd.grad(y_b, (x, w), g, retain_graph=True),
    "bare Function backward, bk": lambda: torch.autograd.grad(y_bk, (x, w), g, retain_graph=True),
    "torch backward, one thread": single_thread(lambda: torch.autograd.grad(y_t, (x, w), g, retain_graph=True)),
    "ewt backward, one thread": single_thread(lambda: torch.autograd.grad(y_e, (x, w), g, retain_graph=True)),
    "bare backward, one thread": single_thread(lambda: torch.autograd.grad(y_b, (x, w), g, retain_graph=True)),
    "RowKernel forward call": lambda: k(xd, wd, 1e-6),
    "derived backward kernel (bk)": lambda: bk(g, xd, wd, 1e-6),
    "torch.empty_like": lambda: torch.empty_like(xd),
}
print(f"device {dev} {torch.cuda.get_device_name() if dev != 'cpu' else 'cpu'}, {rows} x {ROW} float32, "
      f"torch {torch.__version__}")
for name, f in parts.items():
    loop = loop_us(f, sync)
    print(f"{name:30s} {statistics.median(loop):8.2f} us  (min {min(loop):.2f}, max {max(loop):.2f})", flush=True)
