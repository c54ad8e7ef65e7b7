"""What PDL does to EAGER launches: ewkern with PDL on, with it off (the plain form), and torch, in
three patterns of K eager calls queued behind a sleep kernel (so the GPU runs them as queued work
and the host's pace does not show), CUDA events around the K calls, median of `trials`:

  loop    K calls of the op on rotating buffer sets (no call reads what the one before wrote)
  chain   K calls, each reading the output of the one before (x -> op -> op -> ...)
  after   K pairs (torch.mul of 1 MiB, the op) minus K torch.mul alone: every call behind a
          foreign kernel that never triggers early

OPS: add, mul, exp, copy, neg (ewkern's ops), gelu_backward (a backward kernel: in the chain each
call's gradient is the one before's result), rmsnorm (a RowKernel over rows of 1024; torch's
reference there and for gelu_backward includes a copy, as neither has out=: set two ewkern runs side
by side, e.g. the store rule against EWKERN_AUTO_STORES=cs).

Usage (GPU machine): python3 scripts/eager_probe.py OPS DTYPES SIZES [K] [trials]
    python3 scripts/eager_probe.py add,exp float32,bfloat16 1MiB,4MiB,16MiB,64MiB
Prints one line per cell: us a call for ewkern PDL on / off / torch, and ewkern's ratios to torch.
"""

from __future__ import annotations

import statistics
import sys

import torch

import ewkern

MiB = 1 << 20
ROW = 1024      # rmsnorm's rows (a RowKernel)


def size_arg(s: str) -> int:
    s = s.strip()
    for unit, f in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * f)
    return int(s)


def main(argv):
    ops = argv[1].split(",")
    dtypes = [getattr(torch, d) for d in argv[2].split(",")]
    sizes = [size_arg(s) for s in argv[3].split(",")]
    K = int(argv[4]) if len(argv) > 4 else 32
    trials = int(argv[5]) if len(argv) > 5 else 15
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = props.L2_cache_size
    spin = int(3e-3 * props.clock_rate * 1e3)      # cycles for about 3 ms: K queued calls fit behind it
    print(f"== {props.name}, L2 {l2 >> 20} MiB, K {K}, trials {trials}, torch {torch.__version__}")
    fx = torch.rand(MiB // 4, device=dev)
    fy = torch.rand(MiB // 4, device=dev)
    fz = torch.empty_like(fx)

    def foreign():
        torch.mul(fx, fy, out=fz)

    rms = ewkern.RowKernel("T x, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps)", "0",
                           "probe_rmsnorm")
    for op in ops:
        tfn = {"add": lambda a, b, out: torch.add(a, b, out=out), "mul": lambda a, b, out: torch.mul(a, b, out=out),
               "exp": lambda a, out: torch.exp(a, out=out), "copy": lambda a, out: out.copy_(a),
               "neg": lambda a, out: torch.neg(a, out=out),
               # torch has no out= for these: its time includes a copy (compare ewkern's runs)
               "gelu_backward": lambda g, a, out: out.copy_(torch.ops.aten.gelu_backward(g, a)),
               "rmsnorm": lambda a, out: out.copy_(torch.nn.functional.rms_norm(a.view(-1, ROW), (ROW,), eps=1e-6)
                                                   .view(-1))}[op]
        efn = ((lambda a, out: rms(a.view(-1, ROW), 1e-6, out.view(-1, ROW))) if op == "rmsnorm"
               else getattr(ewkern, op))
        nin = 2 if op in ("add", "mul", "gelu_backward") else 1
        for dt in dtypes:
            for size in sizes:
                n = size // torch.tensor([], dtype=dt).element_size()
                # loop: K + 1 rotating sets (every call its own buffers), at least 4 x L2 in all
                sets = max(K + 1, -(-4 * l2 // ((nin + 1) * size)))
                sets = min(sets, max(K + 1, (40 << 30) // ((nin + 1) * size)))
                bufs = [[torch.rand(n, device=dev, dtype=dt) + 0.5 for _ in range(nin + 1)] for _ in range(sets)]
                chain = [torch.rand(n, device=dev, dtype=dt) + 0.5 for _ in range(K + 1)]
                other = [torch.rand(n, device=dev, dtype=dt) + 0.5 for _ in range(K + 1)]
                res = {}
                for way in ("on", "off", "torch"):
                    f = tfn if way == "torch" else efn

                    def call(ins, out, f=f):
                        f(*ins, out=out)

                    def loop(t):
                        for k in range(K):
                            b = bufs[(t * K + k) % sets]
                            call(b[:nin], b[nin])

                    def chained(t):
                        for k in range(K):
                            call([chain[k], other[k]][:nin], chain[k + 1])

                    def after(t, with_op=True):
                        for k in range(K):
                            foreign()
                            if with_op:
                                b = bufs[(t * K + k) % sets]
                                call(b[:nin], b[nin])

                    pats = {"loop": loop, "chain": chained, "after": after,
                            "foreign": lambda t: after(t, False)}
                    if way != "torch":
                        ewkern.set_pdl(way == "on")
                    for name, pat in pats.items():
                        times = []
                        for t in range(trials + 2):
                            torch.cuda.synchronize()
                            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            torch.cuda._sleep(spin)
                            e0.record()
                            pat(t)
                            e1.record()
                            e1.synchronize()
                            if t >= 2:
                                times.append(e0.elapsed_time(e1) * 1e3 / K)
                        res[(way, name)] = statistics.median(times)
                ewkern.set_pdl(True)
                for way in ("on", "off", "torch"):
                    res[(way, "after")] -= res[(way, "foreign")]
                line = []
                for name in ("loop", "chain", "after"):
                    on, off, tt = (res[(w, name)] for w in ("on", "off", "torch"))
                    line.append(f"{name} {on:.2f}/{off:.2f}/{tt:.2f} us ({tt / on:.3f} {tt / off:.3f})")
                print(f"== {op} {str(dt)[6:]} {size >> 20} MiB: " + "  ".join(line), flush=True)
                del bufs, chain, other
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv)
