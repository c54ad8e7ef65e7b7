"""Back-to-back graphs of the rows engine's mse over rows of 4096 (speed_probe.py rows' kernels)
and where their blocks run (not part of the package):

    python scripts/rows_graph_probe.py SIZE DTYPE VARIANT[,VARIANT...] [K]
        per variant one CUDA graph of K (default 24) calls over input sets (PROBE_SETS of them,
        cycled; default one a call, at least 4x the L2), replayed 3 times in an NVTX range "<variant>
        SIZE DTYPE" (events around each replay, the median a call printed; PROBE_SPIN=us: a sleep
        kernel before each; PROBE_DEFAULT_STREAM=1: captured and replayed on torch's default streams
        as the harness does), so that `ncu --graph-profiling graph` measures whole graphs and ncu's
        node mode each kernel (scripts/rows_graph_ncu.sh).
    python scripts/rows_graph_probe.py harness SIZE DTYPE VARIANT[,VARIANT...]
        speed_probe.py rows' own measurement of the variants (the harness's time_calls), then the
        timeline of its back-to-back kernels (run one ts variant a process).

VARIANTs: speed_probe.py's rows variants, and ts<N>[L][c<P>] (_ts_variants): every block's SM and
%globaltimer at entry, after pdl_wait and at exit recorded, so that _timeline prints, over the
kernels of a graph, when each launched and was released against the one before, how long its blocks
ran and on how many SMs. Found with it (H200, 2026-11-29): in speed_probe's measurement successive
kernels took turns on halves of the GPU (BENCHMARKS.md, forty-seventh session)."""
import os
import re
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import speed_probe  # noqa: E402
import ewkern  # noqa: E402
from ewkern.bench import frameworks  # noqa: E402
from ewkern.bench.units import ITEMSIZE, parse_bytes  # noqa: E402


_REC = {}   # the timestamp buffer of the ts variants (a torch tensor), allocated before their compile
_CAP = 1 << 18
_INJECT_HEAD = """
    struct _EwRec {
        unsigned long long t0, tw, id;
        __device__ ~_EwRec() {
            if (threadIdx.x == 0) {
                unsigned long long t1; unsigned int sm;
                asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t1));
                asm("mov.u32 %%0, %%%%smid;" : "=r"(sm));
                unsigned long long *rec = (unsigned long long *)%dULL;
                const unsigned long long i = atomicAdd(rec, 1ULL) %% %dULL;
                unsigned long long *r = rec + 8 + 8 * i;
                r[0] = t0; r[1] = tw; r[2] = t1; r[3] = ((unsigned long long)sm << 32) | blockIdx.x;
                r[4] = id;
            }
        }
    } _ewrec;
    _ewrec.id = (unsigned long long)PTR;
    asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(_ewrec.t0));
"""


def _ts_variants(original):
    """ts<N>[L][c<P>] (N the __launch_bounds__ minimum, 0 none): the rows entry with every block's
    globaltimer at entry, after pdl_wait and at exit, its SM and its first input's address recorded
    in _REC; L: without the early pdl_launch_dependents; c<P>: with 47 KiB of static shared memory
    a block and the kernel's shared-memory carveout set to P% (main: the blocks an SM holds)."""
    from ewkern.rtc import _codegen
    patched = _codegen.reduction_rows_source

    def wrapped(name, in_layout, *a, **kw):
        m = re.search(r"_ts(\d)(L?)(?:c(\d+))?$", name)
        if not m:
            return patched(name, in_layout, *a, **kw)
        src, entries = original(name, in_layout, *a, **kw)
        text = str(src)
        bound = f"256, {m.group(1)}" if m.group(1) != "0" else "256"
        text = re.sub(rf"__launch_bounds__\(256(, \d+)?\) ewrtc_{name}_rows", f"__launch_bounds__({bound}) ewrtc_{name}_rows",
                      text, count=1)
        start = text.index(f"ewrtc_{name}_rows(")
        body = text.index("{", start) + 1
        rec = _REC["t"].data_ptr()
        pad = ""
        if m.group(3):   # c<P>: 48 KiB of static shared memory a block, the carveout set to P% (_carveout_on_load)
            pad = ("    __shared__ volatile char _ewpad[48 * 1024 - 1280];\n"
                   "    if (_ewrtc_PP.nout < 0) _ewpad[threadIdx.x] = 0;\n")
        text = text[:body] + pad + (_INJECT_HEAD % (rec, _CAP)).replace("PTR", "_ewrtc_PP.in.p_a") + text[body:]
        w = text.index("pdl_wait();", body) + len("pdl_wait();")
        text = text[:w] + ' asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(_ewrec.tw));' + text[w:]
        if m.group(2):   # L: no early trigger (the next kernel launches as this one's blocks exit)
            t = text.index("pdl_launch_dependents();", w)
            text = text[:t] + text[t + len("pdl_launch_dependents();"):]
        return text, entries
    _codegen.reduction_rows_source = wrapped


def _timeline(rec):
    """Per kernel of the last replay (records grouped by input address and time): medians of the
    launch (first block's entry after the previous kernel's first), the wait's release after the
    previous kernel's last exit, the run from release to last exit, block times, blocks on the
    busiest SM."""
    n = int(rec[0].item())
    r = rec[8:8 + 8 * min(n, _CAP)].view(-1, 8).cpu().tolist()
    r.sort(key=lambda x: x[0])
    kern = []   # [records] in order of first entry
    open_ = {}
    for x in r:
        k = open_.get(x[4])
        if k is None or x[0] - kern[k][-1][0] > 20000:
            open_[x[4]] = len(kern)
            kern.append([])
        kern[open_[x[4]]].append(x)
    kern = [k for k in kern if len(k) >= 8]
    last = kern[-min(len(kern), 400):]
    rows = []
    for prev, k in zip(last, last[1:]):
        first_in, rel, end = min(x[0] for x in k), min(x[1] for x in k), max(x[2] for x in k)
        if first_in - min(x[0] for x in prev) > 20000:
            continue   # not back-to-back (a single launch, or the first of a replay)
        pend = max(x[2] for x in prev)
        sms = {}
        for x in k:
            sms[x[3] >> 32] = sms.get(x[3] >> 32, 0) + 1
        rows.append((first_in - min(x[0] for x in prev), rel - pend, end - rel, end - max(x[2] for x in prev),
                     statistics.median(x[2] - x[1] for x in k), max(x[2] - x[1] for x in k), max(sms.values()),
                     len(sms), max(x[1] for x in k) - rel))
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"  timeline ({len(rows)} kernels, ns): entry after previous entry {med[0]:.0f}, release after previous "
          f"exit {med[1]:.0f}, release to last exit {med[2]:.0f}, last exit after previous last exit {med[3]:.0f}, "
          f"block from release median {med[4]:.0f} max {med[5]:.0f}, busiest SM {med[6]:.0f} blocks on {med[7]:.0f} SMs, "
          f"last release after first {med[8]:.0f}", flush=True)


def _carveout_on_load():
    """speed_probe's _carveout_on_load for the ts..c<P> variants' rows entries: their preferred
    shared-memory carveout set to P% as they load, before the host asks their occupancy: with
    47 KiB a block that caps the blocks an SM holds."""
    speed_probe._carveout_on_load(r"_ts\d+L?c(\d+)_rows$")


def harness():
    """harness SIZE DTYPE VARIANTS: speed_probe.py rows' own measurement (the harness's time_calls),
    with the ts variants' timelines of its back-to-back graphs printed after it."""
    from ewkern.rtc import _codegen
    original = _codegen.reduction_rows_source
    install = speed_probe._rows_source_variants

    def both():
        install()
        _ts_variants(original)
    speed_probe._rows_source_variants = both
    _carveout_on_load()
    _REC["t"] = torch.zeros(8 + 8 * _CAP, dtype=torch.int64, device="cuda")
    speed_probe.rows([parse_bytes(sys.argv[2])], [sys.argv[3]], sys.argv[4].split(","))
    torch.cuda.synchronize()
    _timeline(_REC["t"])


def main():
    if sys.argv[1] == "harness":
        return harness()
    size, dtype = parse_bytes(sys.argv[1]), sys.argv[2]
    variants = sys.argv[3].split(",")
    K = int(sys.argv[4]) if len(sys.argv) > 4 else 24
    from ewkern.rtc import _codegen
    original = _codegen.reduction_rows_source
    speed_probe._rows_source_variants()
    _ts_variants(original)
    _carveout_on_load()
    _REC["t"] = torch.zeros(8 + 8 * _CAP, dtype=torch.int64, device="cuda")
    cols = 4096
    args = ("T a, T b", "T y", "((float)a - (float)b) * ((float)a - (float)b)", "a + b",
            f"y = (T)(a * {1 / cols!r}f)", "0")
    tdt = frameworks._torch_dtype(dtype)
    rows = max(1, size // ITEMSIZE[dtype] // cols)
    l2 = int(ewkern.device_info("cuda:0")["l2_bytes"])
    # PROBE_SETS: input sets cycled through (default one per call, at least 4x the L2)
    nsets = int(os.environ.get("PROBE_SETS", 0)) or max(K, -(-4 * l2 // (2 * size)))
    sets = [(torch.randn(rows, cols, device="cuda").to(tdt), torch.randn(rows, cols, device="cuda").to(tdt))
            for _ in range(nsets)]
    # PROBE_DEFAULT_STREAM=1: capture and replay as the harness does (torch's default capture stream,
    # replays on the current stream); else a side stream of the probe's own
    own = not os.environ.get("PROBE_DEFAULT_STREAM")
    s = torch.cuda.Stream() if own else torch.cuda.current_stream()
    for v in variants:
        k = ewkern.ReductionKernel(*args, name=f"probe_mse_{v}", reduce_type="float")
        with torch.cuda.stream(s):
            for a, b in sets[:3]:
                k(a, b, axis=1)
            s.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s if own else None):
                outs = [k(*sets[i % nsets], axis=1) for i in range(K)]
            g.replay()
            s.synchronize()
            times = []
            for _ in range(3):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.nvtx.range_push(f"{v} {sys.argv[1]} {dtype}")
                if os.environ.get("PROBE_SPIN"):
                    torch.cuda._sleep(int(float(os.environ["PROBE_SPIN"]) * 2000))
                e0.record()
                g.replay()
                e1.record()
                torch.cuda.nvtx.range_pop()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3 / K)
            print(f"{v} {sys.argv[1]} {dtype}: {statistics.median(times):.2f} us a call ({K} in a graph), "
                  f"path {k._last_path}", flush=True)
            if re.search(r"ts\d(L?)(c\d+)?$", v):
                _timeline(_REC["t"])
                _REC["t"].zero_()
            del outs, g


if __name__ == "__main__":
    main()
