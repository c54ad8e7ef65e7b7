"""Is the float64 binary ops' 4 MiB single-launch gap the layout of a thread's loads? (BENCHMARKS.md,
open leads: "float64 binary ops at 4 MiB, single launch".) On a GPU machine with torch and CuPy, no
ewkern build needed:

    python3 scripts/layout_probe.py [SIZES, default 4MiB,16MiB] [ROUNDS, default 3]

ewkern's default path gives a thread one 16-byte vector of each input at about one wave (4 MiB of
float64: 262144 vectors, 0.97 waves of 2048 threads an SM on 132 SMs) and, with more vectors a
thread, takes them block-strided (t, t + blockDim, ...). torch's vectorized kernel gives a thread
32 contiguous bytes (two adjacent vectors; blocks of 128). Nsight Compute put ewkern's kernel 2-5%
behind torch's there with equal DRAM bytes. Four float64 add kernels, compiled by CuPy's NVRTC
(streaming stores as ewkern's), against torch.add, every way timed in turns by the single-launch
method of the harness: L2 flushed by reading 2x its size, the stream held by a sleep kernel, events
around one call; inputs rotated through 8 sets. Prints the median of each way's samples (us) and
torch / way; a way that closes the gap shows torch / way >= 1.00 where ewkern's own plan (v1) shows
0.93-0.97. Written 2026-11-27; it has not run on a GPU yet.
"""
import statistics
import sys

import torch

DEV = "cuda:0"
SAMPLES = 60
SETS = 8
SOURCE = r'''
extern "C" __global__ void v1(const double2* a, const double2* b, double2* o, long long nv) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;   // one vector a thread
  if (i < nv) { const double2 x = a[i], y = b[i]; __stcs(o + i, make_double2(x.x + y.x, x.y + y.y)); }
}
extern "C" __global__ void v2_strided(const double2* a, const double2* b, double2* o, long long nv) {
  const long long i = (long long)blockIdx.x * blockDim.x * 2 + threadIdx.x;  // i, i + blockDim
  const long long j = i + blockDim.x;
  double2 x0 = make_double2(0, 0), y0 = x0, x1 = x0, y1 = x0;
  if (i < nv) { x0 = a[i]; y0 = b[i]; }
  if (j < nv) { x1 = a[j]; y1 = b[j]; }
  if (i < nv) __stcs(o + i, make_double2(x0.x + y0.x, x0.y + y0.y));
  if (j < nv) __stcs(o + j, make_double2(x1.x + y1.x, x1.y + y1.y));
}
extern "C" __global__ void v2_adjacent(const double2* a, const double2* b, double2* o, long long nv) {
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 2;  // i, i + 1
  double2 x0 = make_double2(0, 0), y0 = x0, x1 = x0, y1 = x0;
  if (i < nv) { x0 = a[i]; y0 = b[i]; }
  if (i + 1 < nv) { x1 = a[i + 1]; y1 = b[i + 1]; }
  if (i < nv) __stcs(o + i, make_double2(x0.x + y0.x, x0.y + y0.y));
  if (i + 1 < nv) __stcs(o + i + 1, make_double2(x1.x + y1.x, x1.y + y1.y));
}
'''
# (kernel, threads a block, vectors a thread)
WAYS = {"v1 (ewkern's plan), 256": ("v1", 256, 1), "v1, 128": ("v1", 128, 1),
        "v2 strided, 128": ("v2_strided", 128, 2), "v2 adjacent, 128 (torch's shape)": ("v2_adjacent", 128, 2)}


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, f in units.items():
        if text.endswith(u):
            return int(text[:-len(u)]) * f
    return int(text)


def main():
    sizes = [parse_size(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "4MiB,16MiB").split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    import cupy    # here, so that the source above can be compiled (tests) where CuPy is absent
    torch.cuda.set_device(DEV)
    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device=DEV)
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for size in sizes:
        n = size // 8
        nv = n // 2
        sets = [[torch.rand(n, dtype=torch.float64, device=DEV) for _ in range(3)] for _ in range(SETS)]
        views = {id(s): [cupy.asarray(t) for t in s] for s in sets}   # the same memory, no copy
        calls = {"torch.add": lambda s: torch.add(s[0], s[1], out=s[2])}
        for label, (name, block, vpt) in WAYS.items():
            k = mod.get_function(name)
            grid = (nv + block * vpt - 1) // (block * vpt)

            def call(s, k=k, grid=grid, block=block):
                with stream:
                    ca, cb, co = views[id(s)]
                    k((grid,), (block,), (ca, cb, co, cupy.int64(nv)))
            calls[label] = call
        for s in sets[:1]:                      # each way checked once against torch before timing
            want = s[0] + s[1]
            for label, f in calls.items():
                s[2].zero_()
                f(s)
                torch.cuda.synchronize()
                assert torch.equal(s[2], want), label
        samples = {label: [] for label in calls}
        for r in range(rounds):
            for i in range(SAMPLES):
                order = list(calls)[i % len(calls):] + list(calls)[:i % len(calls)]   # in turns, rotating
                for label in order:
                    s = sets[(i + r) % SETS]
                    flush.sum()                 # a read of 2x the L2
                    torch.cuda._sleep(20000)    # the launch is queued behind it
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    calls[label](s)
                    b.record()
                    b.synchronize()
                    samples[label].append(a.elapsed_time(b) * 1e3)
        base = statistics.median(samples["torch.add"])
        print(f"== float64 add, {size >> 20} MiB a tensor ({nv} vectors), single launch, {rounds} x {SAMPLES} samples")
        for label, xs in samples.items():
            med = statistics.median(xs)
            q = statistics.quantiles(xs, n=10)
            print(f"   {label:36s} {med:7.2f} us (10-90%: {q[0]:.2f}-{q[-1]:.2f})  torch / way {base / med:.3f}")


if __name__ == "__main__":
    main()
