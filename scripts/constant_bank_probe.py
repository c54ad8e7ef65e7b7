"""Does a module's __constant__ data slow every launch of its kernels? (ELEMENTWISE_NOTES.md, "The
fixed 0.2 us after a torch kernel".) On a GPU machine with torch and CuPy, no ewkern build needed:

    python3 scripts/constant_bank_probe.py

One float4 add kernel, compiled by CuPy's NVRTC into four modules: alone, beside an unused
`static __constant__ double[30]`, beside one that another kernel reads, and beside `__device__`
data. Each is timed against torch.add in CUDA graphs of K launches (no PDL): back-to-back, and
after a torch.mul (the pair's graph minus the torch.mul graph's), inputs kept in L2 ("hot") or
rotated through 256 MiB; median of 3 rounds of 15 samples, us per launch. Measured 2026-11-26 with
the session's probe that this script tidies (the same kernels, modules and method; this file itself
has not run on a GPU yet): the modules with a constant bank cost 0.11-0.13 us a launch more on both
the H100 and the H200, `__device__` data nothing.
"""
import statistics

import cupy
import torch

DEV = "cuda:0"
K, SAMPLES, ROUNDS = 48, 15, 3
KERNEL = r'''
extern "C" __global__ void add4(const float* a, const float* b, float* o, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (n >> 2)) {
    const float4 x = ((const float4*)a)[i], y = ((const float4*)b)[i];
    ((float4*)o)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}
'''
COEF = ",".join(f"{1.0 / (i + 3):.17g}" for i in range(30))
READER = "extern \"C\" __global__ void reader(double* o) { double s = 0; for (int i = 0; i < 30; ++i) s = s * o[0] + %s[i]; o[1] = s; }\n"
MODULES = {
    "no module data": KERNEL,
    "unused __constant__": KERNEL + "static __constant__ double kc[30] = {" + COEF + "};\n",
    "read __constant__": KERNEL + "static __constant__ double kc[30] = {" + COEF + "};\n" + READER % "kc",
    "__device__ data": KERNEL + "__device__ double kg[30] = {" + COEF + "};\n" + READER % "kg",
}


def graph_us(fns, k=K):
    """Median us per call of a CUDA graph of k calls cycling through fns, queued behind a sleep."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(k):
            fns[j % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(SAMPLES):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100000)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / k)
    return statistics.median(out)


def main():
    kernels = {m: cupy.RawModule(code=src, options=("-std=c++17",)).get_function("add4") for m, src in MODULES.items()}
    print(torch.cuda.get_device_name(DEV))
    for mode, mib in (("hot", 1), ("hot", 4), ("rotated", 1), ("rotated", 4)):
        n = (mib << 20) // 4
        grid = (n // 4 + 255) // 256
        nset = max(2, (256 << 20) // (3 * n * 4)) if mode == "rotated" else 2
        A = [torch.rand(n, device=DEV) + 0.5 for _ in range(nset)]
        B = [torch.rand(n, device=DEV) + 0.5 for _ in range(nset)]
        O = [torch.empty(n, device=DEV) for _ in range(nset)]
        F = [torch.empty(n, device=DEV) for _ in range(nset)]
        CA, CB, CO = ([cupy.asarray(x) for x in xs] for xs in (A, B, O))

        def raw(kernel, i):
            def call():
                with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                    kernel((grid,), (256,), (CA[i], CB[i], CO[i], cupy.int32(n)))
            return call
        foreign = [lambda i=i: torch.mul(A[(i + 1) % nset], B[(i + 1) % nset], out=F[i]) for i in range(nset)]
        cases = {"torch.add": [lambda i=i: torch.add(A[i], B[i], out=O[i]) for i in range(nset)]}
        cases.update({m: [raw(k, i) for i in range(nset)] for m, k in kernels.items()})
        res = {c: [] for c in cases}
        for _ in range(ROUNDS):
            alone = graph_us(foreign)
            for c, fns in cases.items():
                pairs = [f for i, call in enumerate(fns) for f in (foreign[i], call)]
                res[c].append((graph_us(fns), graph_us(pairs, 2 * K) * 2 - alone))
        for c, v in res.items():
            print(f"{mode:7s} {mib} MiB  {c:20s} back-to-back {statistics.median(x[0] for x in v):6.3f} us"
                  f"   after torch.mul {statistics.median(x[1] for x in v):6.3f} us", flush=True)
        del A, B, O, F, CA, CB, CO
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
