"""An eager training step's host time through ewkern.torch's C++ autograd nodes, its Python
Functions and torch's own ops, in turns (scripts/host_step_probe.py takes one step apart).

    python3 scripts/native_step_probe.py [cuda|cpu] [KiB ...]

A step is `torch.autograd.grad(op(x[, y]), inputs, g)`, float32. Per op and size, three ways in
turns over 5 rounds: "loop", the mean host time a step in a loop of 200 (no synchronize inside;
where the GPU keeps up this is the host's cost); "visible", the median of CUDA events around one
step started after a synchronize (the `train` experiment's host method: what the GPU waits for),
or of the host clock on the cpu. Medians over the rounds; ratios torch / way (above 1: faster).
PROBE_FORWARD=1: a forward call on tensors that need no gradient instead of a step (the Python
faces' eager path: c++ the native module's checks and launch, python the checks in Python).
"""
import os
import statistics
import sys
import time

import torch

import ewkern.torch as ewt

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
sizes = [float(s) for s in sys.argv[2:]] or [4.0, 1024.0]
OPS = {   # name -> (ewkern.torch call, torch's call, inputs)
    "gelu": (lambda a: ewt.gelu(a), lambda a: torch.nn.functional.gelu(a), 1),
    "silu": (lambda a: ewt.silu(a), lambda a: torch.nn.functional.silu(a), 1),
    "tanh": (lambda a: ewt.tanh(a), torch.tanh, 1),
    "exp": (lambda a: ewt.exp(a), torch.exp, 1),
    "add_const": (lambda a: ewt.add_const(a, 1.0), lambda a: a + 1.0, 1),
    "add": (lambda a, b: ewt.add(a, b), torch.add, 2),
    "mul": (lambda a, b: ewt.mul(a, b), torch.mul, 2),
    "div": (lambda a, b: ewt.div(a, b), torch.div, 2),
    "maximum": (lambda a, b: ewt.maximum(a, b), torch.maximum, 2),
    "axpby": (lambda a, b: ewt.axpby(a, b, 0.5, 2.0), lambda a, b: 0.5 * a + 2.0 * b, 2),
    "rmse": (lambda a, b: ewt.rmse(a, b), lambda a, b: torch.sqrt(((a - b) ** 2).mean()), 2),   # one batch
}
print(f"device {dev} {torch.cuda.get_device_name() if dev != 'cpu' else 'cpu'}, torch {torch.__version__}, "
      f"ewkern.torch autograd: {ewt.autograd_path()}")
NATIVE, PYTHON = dict(ewt._APPLY), dict(ewt._PY_APPLY)
NATIVE_EAGER, PYTHON_EAGER = dict(ewt._EAGER), dict(ewt._PY_EAGER)
FORWARD = os.environ.get("PROBE_FORWARD") == "1"


def sync():
    if dev != "cpu":
        torch.cuda.synchronize()


def loop(f, n=200):
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t = (time.perf_counter() - t0) / n * 1e6
    sync()
    return t


def visible(f, n=30):
    out = []
    for _ in range(n):
        sync()
        if dev == "cpu":
            t0 = time.perf_counter()
            f()
            out.append((time.perf_counter() - t0) * 1e6)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


print(f"{'op':10s} {'KiB':>6s} | loop us: c++ python torch | visible us: c++ python torch | "
      f"torch/c++ loop, visible | torch/python loop, visible")
for kib in sizes:
    n = max(1, int(kib * 1024) // 4)
    x = (torch.rand(n, device=dev) + 0.5).requires_grad_(not FORWARD)
    y = (torch.rand(n, device=dev) + 0.5).requires_grad_(not FORWARD)
    g = torch.rand(n, device=dev)
    for name, (ours, theirs, nin) in OPS.items():
        ins = (x, y)[:nin]
        gg = g if name != "rmse" else g[0]      # rmse's result: one value
        if FORWARD:
            ways = {"c++": lambda: ours(*ins), "python": lambda: ours(*ins), "torch": lambda: theirs(*ins)}
        else:
            ways = {"c++": lambda: torch.autograd.grad(ours(*ins), ins, gg),
                    "python": lambda: torch.autograd.grad(ours(*ins), ins, gg),
                    "torch": lambda: torch.autograd.grad(theirs(*ins), ins, gg)}
        res = {w: ([], []) for w in ways}
        for r in range(5):
            for w in list(ways)[r % 3:] + list(ways)[:r % 3]:
                ewt._APPLY = PYTHON if w == "python" else NATIVE
                ewt._EAGER = PYTHON_EAGER if w == "python" else NATIVE_EAGER
                for _ in range(50):
                    ways[w]()
                sync()
                res[w][0].append(loop(ways[w]))
                res[w][1].append(visible(ways[w]))
        ewt._APPLY, ewt._EAGER = NATIVE, NATIVE_EAGER
        m = {w: (statistics.median(a), statistics.median(b)) for w, (a, b) in res.items()}
        print(f"{name:10s} {kib:6g} | {m['c++'][0]:6.1f} {m['python'][0]:6.1f} {m['torch'][0]:6.1f} | "
              f"{m['c++'][1]:6.1f} {m['python'][1]:6.1f} {m['torch'][1]:6.1f} | "
              f"{m['torch'][0] / m['c++'][0]:.2f} {m['torch'][1] / m['c++'][1]:.2f} | "
              f"{m['torch'][0] / m['python'][0]:.2f} {m['torch'][1] / m['python'][1]:.2f}", flush=True)
