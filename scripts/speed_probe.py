"""Probes for choosing the default path's rules on a GPU machine (not part of the package).

    python scripts/speed_probe.py variants OP DTYPE VARIANT[,VARIANT...] SIZE[,SIZE...]
        ewkern's variants against torch's op, both timing methods of `ewkern.bench peers`
        (back-to-back graph replay over rotated inputs; single launch after an L2 flush and a
        sleep kernel), through the same frameworks.time_calls code. Environment knobs
        (EWKERN_AUTO_VPT, EWKERN_PDL, EWKERN_PDL_PREFETCH) apply as set.
    python scripts/speed_probe.py gelu-accuracy [N]
        ewkern.gelu in float32 on N (default 2^24) inputs spread over [-15, 6] plus random bit
        patterns, against a float64 reference (torch.special.erfc on the GPU): the largest error
        in units of eps(float32) x |ref|, against the stated bound 4 + 2 a^2, and where it is.
"""
import math
import sys

import os
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ewkern
from ewkern.bench import frameworks
from ewkern.bench.timing import TimingConfig
from ewkern.bench.units import ITEMSIZE, parse_bytes


def variants(op, dtype, names, sizes):
    info = ewkern.device_info("cuda:0")
    cfg = TimingConfig(device="cuda:0", cache_bytes=int(info["l2_bytes"]))
    fn = getattr(ewkern, op)
    nsc = {"fill": 1, "add_const": 1, "mul_const": 1, "axpby": 2}.get(op, 0)
    scalars = (1.0, 0.5)[:nsc]
    for size in sizes:
        n = size // ITEMSIZE[dtype]
        for method, cache in (("b2b", "rotate"), ("single", "flush")):
            row = []
            make_t, set_b, _, _ = frameworks.elementwise_call("torch", op, dtype, (n,), "cuda:0")
            t_torch = frameworks.time_calls(cfg, "torch", make_t, set_b, cache)
            med_torch = sorted(t_torch.samples_s)[len(t_torch.samples_s) // 2]
            for v in names:
                def make_call(v=v):
                    ins = frameworks.op_inputs("torch", op, (n,), dtype, "cuda:0")
                    out = torch.empty((n,), dtype=frameworks._torch_dtype(dtype), device="cuda:0")
                    if op == "fill":
                        return lambda: fn(out, *scalars, variant=v)
                    return lambda: fn(*ins, *scalars, out=out, variant=v)
                t = frameworks.time_calls(cfg, "torch", make_call, set_b, cache)
                med = sorted(t.samples_s)[len(t.samples_s) // 2]
                row.append(f"{v} {med_torch / med:.3f}")
            print(f"{op} {dtype} {size >> 20} MiB {method}: torch {med_torch * 1e6:.2f} us | " + " | ".join(row),
                  flush=True)
            frameworks.release_peer_memory()


def gelu_accuracy(n):
    g = torch.Generator(device="cuda").manual_seed(0)
    lin = torch.linspace(-15.0, 6.0, n // 2, device="cuda", dtype=torch.float64).float()
    bits = torch.randint(-2**31, 2**31 - 1, (n // 2,), device="cuda", generator=g, dtype=torch.int32).view(torch.float32)
    bits = bits[torch.isfinite(bits)]
    x = torch.cat([lin, bits])
    y = torch.from_dlpack(ewkern.gelu(x)).double()
    xd = x.double()
    ref = 0.5 * xd * torch.special.erfc(-xd / math.sqrt(2.0))
    fin = torch.isfinite(ref) & (ref.abs() >= 2.0 ** -126)
    err = (y - ref).abs()[fin] / (ref.abs()[fin] * 2.0 ** -23)
    bound = 4 + 2 * xd[fin] ** 2
    ratio = err / bound
    i = int(torch.argmax(ratio))
    small = xd[fin].abs() < 2
    print(f"gelu float32: {int(fin.sum())} inputs with |ref| >= 2^-126; max err {float(err.max()):.2f} eps|ref| "
          f"(|x| < 2: {float(err[small].max()):.2f}); max err / (4 + 2 a^2) = {float(ratio.max()):.3f} "
          f"at x = {float(xd[fin][i]):.6g}")
    tiny = torch.isfinite(ref) & (ref.abs() < 2.0 ** -126)
    print(f"  results below 2^-126: {int(tiny.sum())}, max abs err {float((y - ref).abs()[tiny].max()) / 2.0 ** -126:.3f} x 2^-126")
    nonfin = ~torch.isfinite(ref)
    same = torch.equal(torch.isnan(y[nonfin]), torch.isnan(ref[nonfin]))
    print(f"  non-finite references: {int(nonfin.sum())}, NaN positions equal: {same}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "variants":
        variants(sys.argv[2], sys.argv[3], sys.argv[4].split(","), [parse_bytes(s) for s in sys.argv[5].split(",")])
    elif cmd == "gelu-accuracy":
        gelu_accuracy(int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 24)
    else:
        sys.exit(__doc__)
