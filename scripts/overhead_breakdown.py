"""Where the microseconds of one tiny ewkern call go, on the GPU machine.

Times ewkern.add(a, b, out=c) on 4-element float32 arrays through several paths, each as the
median over repeats of 20000 back-to-back calls (host wall clock, the device synchronised after
each repeat):
  plan            a prepared Plan called again: only the launch (ew_device_enter + cudaLaunchKernel)
  array legacy    ewkern arrays, ewkern's default (legacy) stream
  array stream    the same inside `with ewkern.stream(ewkern.Stream())` (a non-blocking stream)
  array per-thread  the same on the per-thread default stream (handle 2)
  torch           torch tensors (exchange API, torch's current stream)
  torch.add       torch.add(out=) for reference
"""
import statistics
import time

import ewkern

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


def per_call_us(fn, calls=20000, repeats=7):
    fn()
    ewkern.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ewkern.synchronize()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out), min(out)


def main():
    a = ewkern.full((4,), 1.0, device="cuda:0")
    b = ewkern.full((4,), 2.0, device="cuda:0")
    c = ewkern.empty((4,), device="cuda:0")
    rows = []
    p = ewkern._C.prepare(ewkern.add, a, b, out=c)
    rows.append(("plan (launch only)", per_call_us(p)))
    rows.append(("array, legacy stream", per_call_us(lambda: ewkern.add(a, b, out=c))))
    with ewkern.stream(ewkern.Stream()):
        rows.append(("array, non-blocking stream", per_call_us(lambda: ewkern.add(a, b, out=c))))
    with ewkern.stream(ewkern.Stream(handle=2)):
        rows.append(("array, per-thread default stream", per_call_us(lambda: ewkern.add(a, b, out=c))))
    rows.append(("array, new result", per_call_us(lambda: ewkern.add(a, b))))
    if torch is not None:
        ta, tb, tc = (torch.ones(4, device="cuda") for _ in range(3))
        rows.append(("torch tensors", per_call_us(lambda: ewkern.add(ta, tb, out=tc))))
        rows.append(("torch.add(out=)", per_call_us(lambda: torch.add(ta, tb, out=tc))))
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            rows.append(("torch tensors, torch side stream", per_call_us(lambda: ewkern.add(ta, tb, out=tc))))
    print("| path | us per call (median) | min |\n| --- | --- | --- |")
    for name, (med, lo) in rows:
        print(f"| {name} | {med:.2f} | {lo:.2f} |")


if __name__ == "__main__":
    main()
