"""Host time of the pieces of a user kernel's warm call on torch tensors, against torch's and
ewkern's own ops (where t1_train's rmsnorm step spends its host time: two RowKernel calls, three
launches, the views and results of each).

    python3 scripts/user_call_probe.py [cuda|cpu] [rows] [cols]

Each piece: the mean host time a call in a loop of 2000 (no synchronize inside), the median of 5
rounds taken in turns. `_rtc_result` allocates one result in the first array's framework (torch's
allocator through the DLPack exchange API, and the torch tensor object), `_rtc_sig` views the
arguments (the exchange API's DLTensor of each, the current stream) and builds the plan key. The
steps: torch.autograd.grad of one forward (ewkern.torch's user rmsnorm and mul, torch's; the user
rmsnorm's also with its backward in Python every step, the node's path before it learned the
kernel's plan), and the user op's backward custom op called on this thread (the step runs it on
autograd's device thread)."""
import statistics
import sys
import time

import torch

import ewkern
from ewkern import _C

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 256
cols = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
x = torch.rand(rows, cols, device=dev) + 0.5
w = torch.rand(cols, device=dev) + 0.5
k = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                     "y = x * rsqrt(a / _row_size + eps) * w", "0", "probe_rmsnorm")
e = ewkern.ElementwiseKernel("T x, T w", "T y", "y = x * w", "probe_mul")
k(x, w, 1e-6)
e(x, x)
# a training step of the user kernel rmsnorm (t1_train's op: C++ node, derived backward) and of mul
import ewkern.torch as ewt  # noqa: E402
from ewkern.bench import t1_train  # noqa: E402
op = t1_train.rmsnorm_op()
# the same op whose C++ node never learns its backward's plan (the Python backward every step, as
# before 1088ee0): the two steps timed in turns
_plan = ewt._node_plan
ewt._node_plan = lambda *a: None
op_py = ewt.kernel_op(ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                                       "y = x * rsqrt(a / _row_size + eps) * w", "0", "probe_rmsnorm_py"),
                      scalars=("eps",))
ewt._node_plan = _plan
xg, wg, yg = x.clone().requires_grad_(), w.clone().requires_grad_(), x.clone().requires_grad_()
g = torch.rand_like(x)
bw = getattr(torch.ops.ewkern_user, "bench_rmsnorm_backward").default
F = torch.nn.functional
ewt.autograd_path()
PIECES = {
    "ewt rmsnorm step": lambda: torch.autograd.grad(op(xg, wg, 1e-6), (xg, wg), g),
    "ewt rmsnorm step, Python backward": lambda: torch.autograd.grad(op_py(xg, wg, 1e-6), (xg, wg), g),
    "torch rmsnorm step": lambda: torch.autograd.grad(F.rms_norm(xg, (cols,), wg, 1e-6), (xg, wg), g),
    "ewt rmsnorm forward (grad)": lambda: op(xg, wg, 1e-6),
    "its backward op, this thread": lambda: bw(g, x, w, 1e-6),
    "ewt mul step": lambda: torch.autograd.grad(ewt.mul(xg, yg), (xg, yg), g),
    "torch mul step": lambda: torch.autograd.grad(torch.mul(xg, yg), (xg, yg), g),
    "torch.empty_like": lambda: torch.empty_like(x),
    "_rtc_result (one torch result)": lambda: _C._rtc_result(x, "float32", (rows, cols)),
    "_rtc_sig (views of x, w; key)": lambda: _C._rtc_sig((x, w, 1e-6), (float,)),
    "torch.mul": lambda: torch.mul(x, x),
    "ewkern.mul": lambda: ewkern.mul(x, x),
    "ElementwiseKernel x * w": lambda: e(x, x),
    "RowKernel rmsnorm": lambda: k(x, w, 1e-6),
}


def loop(f, n=2000):
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t = (time.perf_counter() - t0) / n * 1e6
    if dev != "cpu":
        torch.cuda.synchronize()
    return t


res = {p: [] for p in PIECES}
for r in range(5):
    names = list(PIECES)
    for p in names[r % len(names):] + names[:r % len(names)]:
        loop(PIECES[p], 200)
        res[p].append(loop(PIECES[p]))
print(f"device {dev} {torch.cuda.get_device_name() if dev != 'cpu' else 'cpu'}, [{rows}, {cols}] float32, "
      f"torch {torch.__version__}")
for p, v in res.items():
    print(f"{p:34s} {statistics.median(v):7.2f} us a call (rounds {min(v):.2f}-{max(v):.2f})")
