"""How ewkern kernels are timed: the one module that talks to ``ewkern._C``'s timing core.

Method (the same for every experiment, and mirrored for torch/CuPy in ``frameworks.py``):

* ``_C.prepare`` resolves one op call once (op, variant, dtype, device, buffers) into a Plan.
* ``_C.time_plans`` warms up, then takes samples; a sample is ``launches`` back-to-back launches
  timed with CUDA events on one stream (a host clock for CPU plans), with the stream held behind
  a spin kernel while they are queued so the host's launch rate is not what is measured.
* Cache modes: ``hot`` reuses one buffer set; ``rotate`` cycles through enough distinct buffer sets
  that the working set is at least 4x the last-level cache (the GPU's L2); ``flush`` makes the
  cache pass a buffer of twice its size before each sample, outside the timed region (the GPU
  reads it, so no dirty lines are written back during the timed kernel; the CPU writes it), and
  times one launch per sample.
* The number of launches per sample is chosen from a first timing so that a sample lasts at
  least ``min_sample_s`` (0.5 ms by default). time_plans cycles through the buffer sets across
  samples (its launch counter runs on from sample to sample), so ``rotate`` never reuses a set
  before all the others were used, whatever the launches per sample.
* Each measurement keeps its raw samples (seconds per launch) and their min/median/mean/std/max/count.
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
import sys
from dataclasses import dataclass, field

__all__ = ["BenchError", "Skip", "TimingConfig", "Timing", "summarize", "median_interval", "samples_wanted",
           "sample_rounds", "time_ewkern",
           "choose_sets", "choose_launches", "available_memory", "cache_bytes", "CACHE_MODES",
           "ew", "core", "new_filled", "ew_op", "plan_elementwise", "plan_rmse", "BufferPool",
           "time_sequence", "kernel_info", "variants"]

CACHE_MODES = ("hot", "rotate", "flush")
ROTATE_FACTOR = 4          # rotate: working set >= 4x the cache
FLUSH_FACTOR = 2           # flush: pass 2x the cache's size through it
MAX_SETS = 1000            # rotate: at most this many buffer sets
MAX_LAUNCHES = 1000        # launches per sample (time_plans queues at most 1000 behind its spin)


class BenchError(Exception):
    """A problem the user can fix (bad size, no device, ...): reported without a traceback."""


class Skip(Exception):
    """An experiment, or one measurement of it, does not apply here; the message says why."""


def ew():
    """The ewkern package, imported on first use (so loading and plotting results needs no build)."""
    import ewkern
    return ewkern


def core():
    """ewkern's C module, with the timing core (prepare, time_plans)."""
    from ewkern import _C
    return _C


def summarize(samples) -> dict:
    """min, median, mean, std (sample standard deviation), max and count of a list of numbers."""
    xs = [float(x) for x in samples]
    if not xs:
        return {"min": None, "median": None, "mean": None, "std": None, "max": None, "count": 0}
    return {"min": min(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs),
            "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "max": max(xs), "count": len(xs)}


def median_interval(samples, level: float = 0.90) -> tuple:
    """The distribution-free interval of the median of samples at level (order statistics, the
    normal approximation of the binomial): (low, high), the sample median's own values for n < 3."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one sample")
    if n < 3:
        m = statistics.median(xs)
        return m, m
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    half = z * math.sqrt(n) / 2
    return xs[max(0, math.floor(n / 2 - half))], xs[min(n - 1, math.ceil(n / 2 + half) - 1)]


def samples_wanted(samples, target: float, level: float = 0.90) -> int:
    """How many samples like these put the median's interval (median_interval) within +-target of
    it, by the interval's 1/sqrt(n) narrowing; len(samples) when it already is, or when it spans no
    more than one step of the timer (its ends are neighbouring values of the samples: a median of
    quantised times moves in such steps, and more samples cannot narrow it below one)."""
    n = len(samples)
    if n < 3 or not target > 0:
        return n
    med = statistics.median(samples)
    lo, hi = median_interval(samples, level)
    if not med > 0:
        return n
    steps = sorted(set(samples))
    width = (hi - lo) / 2 / med
    # one step: no sample value lies strictly between the ends (the steps' float values are not
    # evenly spaced, so a comparison with the smallest gap would miss by an ulp)
    if width <= target or bisect.bisect_left(steps, hi) - bisect.bisect_left(steps, lo) <= 1:
        return n
    return math.ceil(n * (width / target) ** 2)


ROUNDS_TARGET = 0.0025   # TimingConfig.flush_target under --flush-rounds
# elements of the torch.mul that TimingConfig.single_between "mul" queues after each single launch
# (1 MiB of float32 a buffer)
BETWEEN_ELEMENTS = 1 << 18


def sample_rounds(cfg: "TimingConfig", take, n: int, fixed: bool) -> list:
    """Single-launch samples in rounds: take(m) queues and times m more samples of each way (lists,
    one per way). The first round is n; unless fixed (or cfg.flush_target is 0), more rounds follow,
    each bringing the total to at most 4x what it was, until samples_wanted is met for every way,
    cfg.flush_cap samples or cfg.flush_budget_s of sampling (a round is cut to what the budget has
    left at the last round's rate)."""
    import time
    t0 = time.perf_counter()
    per = [list(s) for s in take(n)]
    while not fixed and cfg.flush_target > 0:
        have = len(per[0])
        spent = time.perf_counter() - t0
        left = int((cfg.flush_budget_s - spent) / max(spent / max(have, 1), 1e-9))
        want = min(cfg.flush_cap, 4 * have, have + left, max(samples_wanted(s, cfg.flush_target) for s in per))
        if want <= have:
            break
        for s, more in zip(per, take(want - have)):
            s.extend(more)
    return per


def cache_bytes(device: str, info: dict) -> int:
    """The cache that the cache modes defeat: the GPU's L2, or the CPU's last-level cache."""
    if device != "cpu" and info.get("l2_bytes"):
        return int(info["l2_bytes"])
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        pass
    return best or 32 << 20


def available_memory(device: str, info: dict) -> int | None:
    """Bytes that may be allocated on device now (free device memory, or MemAvailable on the host)."""
    if device == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    index = int(device.split(":")[1]) if ":" in device else 0
    if "torch" in sys.modules:
        try:
            import torch
            return int(torch.cuda.mem_get_info(index)[0])
        except Exception:
            pass
    try:
        import cupy
        with cupy.cuda.Device(index):
            return int(cupy.cuda.runtime.memGetInfo()[0])
    except Exception:
        pass
    total = info.get("total_memory_bytes")
    return int(total * 0.9) if total else None


@dataclass
class TimingConfig:
    """What every measurement of a run shares."""
    device: str = "cpu"
    cache_bytes: int = 32 << 20
    min_sample_s: float = 0.5e-3
    samples: int = 21
    flush_samples: int = 50
    # single launches (cache "flush") of ways timed in turns (frameworks.time_calls_in_turns): with
    # flush_target > 0 (--flush-rounds: ROUNDS_TARGET), after flush_samples more rounds until each
    # median's 90% interval is within +-flush_target of it (or spans one step of the timer), at most
    # flush_cap samples or about flush_budget_s of sampling; 0 (the default): flush_samples only. Off
    # by default: on the H200 (2026-11-27) peers' single launches at 1-64 MiB (copy, add, exp, silu;
    # float32, float16) timed in turns in rounds moved by a median 0.09 between processes (up to 0.25,
    # each way's whole distribution shifted), against 0.016 with 50 samples in turns and 0.011 with 50
    # one way after another. Ways timed one after another (time_calls) take flush_samples.
    flush_target: float = 0.0
    flush_cap: int = 4000
    flush_budget_s: float = 1.5
    warmup: int = 2
    # single launches: a read of flush_factor x cache_bytes before each sample (--flush-factor)
    flush_factor: int = FLUSH_FACTOR
    # the torch methods' flush: "sum" (torch's reduction of the buffer) or "rmse" (one ewkern.rmse
    # read of it; --flush-kind): a series timed on torch's stream behind "sum" repeats a pattern of
    # four samples up to 1.07 us apart on both GPUs (BENCHMARKS.md, 2026-11-27)
    flush_kind: str = "sum"
    # single launches on torch's stream: "mul" queues an untimed torch.mul of BETWEEN_ELEMENTS float32
    # after each sample, before the next sample's spin and flush (--single-between). The speed probe's
    # torch.mul after each sample (of the op's size, ways alternating) removed the pattern of four on
    # both GPUs (phase spread 1.0-1.1 -> 0.07-0.18 us at 1-16 MiB), an event did not (BENCHMARKS.md,
    # 2026-11-27, twenty-ninth session); "none" (the default): nothing between samples.
    single_between: str = "none"
    memory_budget: int | None = None     # bytes a measurement may allocate
    _flush: dict = field(default_factory=dict, repr=False)

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    def check_fits(self, nbytes: int, what: str):
        """Raise BenchError before allocating nbytes that the device cannot hold."""
        if self.memory_budget is not None and nbytes > self.memory_budget:
            from .units import fmt_bytes
            raise BenchError(f"{what} needs {fmt_bytes(nbytes)} but only {fmt_bytes(self.memory_budget)} "
                             f"can be allocated on {self.device}; choose smaller sizes")

    def ewkern_flush_buffer(self):
        """An ewkern array of flush_factor x the cache size, allocated once per run."""
        if "ewkern" not in self._flush:
            n = self.flush_factor * self.cache_bytes // 4
            self._flush["ewkern"] = ew().empty((n,), dtype="float32", device=self.device)
            ew().fill(self._flush["ewkern"], 0.0)
        return self._flush["ewkern"]


@dataclass
class Timing:
    """The outcome of timing one workload: seconds per launch, one per sample, and how."""
    samples_s: list
    launches: int
    sets: int
    working_set_bytes: int
    cache: str
    method: str
    notes: list = field(default_factory=list)
    plan: dict = field(default_factory=dict)     # what the first Plan says: bytes, resolved variant
    extra: dict = field(default_factory=dict)    # what a method adds (after a foreign kernel: both graphs' medians)

    def record(self) -> dict:
        st = summarize(self.samples_s)
        return {**self.plan, "cache": self.cache, "launches": self.launches, "sets": self.sets,
                "working_set_bytes": self.working_set_bytes, "method": self.method,
                "samples_s": list(self.samples_s), "stats_s": st, "time_s": st["median"],
                "notes": "; ".join(self.notes), **self.extra}


def choose_sets(cfg: TimingConfig, cache: str, set_bytes: int) -> tuple[int, list]:
    """How many buffer sets a cache mode needs, within the memory budget; with notes."""
    notes = []
    if cache != "rotate" or set_bytes <= 0:
        return 1, notes
    want = max(1, math.ceil(ROTATE_FACTOR * cfg.cache_bytes / set_bytes))
    n = min(want, MAX_SETS)
    if cfg.memory_budget is not None:
        n = min(n, max(1, int(cfg.memory_budget * 0.5 // set_bytes)))
    if n < want:
        from .units import fmt_bytes
        notes.append(f"rotate working set {fmt_bytes(n * set_bytes)} < {ROTATE_FACTOR}x cache "
                     f"({fmt_bytes(ROTATE_FACTOR * cfg.cache_bytes)})")
    return n, notes


def choose_launches(t_per_launch: float, nsets: int, min_sample_s: float) -> int:
    """Launches per sample: enough for min_sample_s, a multiple of nsets, at most MAX_LAUNCHES.

    (For replayed graphs, which restart at the first set on every replay.)"""
    if not (t_per_launch > 0):
        k = nsets
    else:
        k = max(nsets, math.ceil(min_sample_s / t_per_launch))
    k = math.ceil(k / nsets) * nsets
    cap = max(nsets, (MAX_LAUNCHES // nsets) * nsets)
    return min(k, cap)


def flush_words(cfg: TimingConfig, torch_path: bool = False) -> str:
    """A method's words for the flush before each single launch (and what goes after it); torch_path:
    the single launch is timed on torch's stream (frameworks), where flush_kind and single_between
    apply."""
    kind = " (one ewkern.rmse read)" if torch_path and cfg.flush_kind == "rmse" else ""
    after = ""
    if torch_path and cfg.single_between == "mul":
        after = f", an untimed torch.mul of {BETWEEN_ELEMENTS} float32 after each sample"
    return f", flush {cfg.flush_factor}x cache{kind} before each sample{after}"


def time_ewkern(cfg: TimingConfig, make_plan, set_bytes: int, cache: str, *,
                samples: int | None = None, warmup: int | None = None) -> Timing:
    """Time an ewkern workload. make_plan() allocates one buffer set and returns a prepared Plan."""
    if cache not in CACHE_MODES:
        raise ValueError(f"cache mode must be one of {CACHE_MODES}, got {cache!r}")
    C = core()
    nsets, notes = choose_sets(cfg, cache, set_bytes)
    cfg.check_fits(nsets * set_bytes, "this measurement")
    plans = [make_plan() for _ in range(nsets)]
    plan = {}
    for key in ("nbytes_read", "nbytes_written", "variant", "dtype"):
        value = getattr(plans[0], key, None)
        if value is not None:
            plan[{"nbytes_read": "bytes_read", "nbytes_written": "bytes_written",
                  "variant": "resolved_variant"}.get(key, key)] = value if key != "dtype" else str(value)
    warm = cfg.warmup if warmup is None else warmup
    if cfg.is_cpu and nsets > 1:
        # One untimed launch on every buffer set first. A fresh host buffer has no memory behind
        # it until it is first written, so a sample of few launches through many sets would time
        # the page faults of untouched outputs (1-8 ms per 4 MiB here, 10-50x the kernel) instead
        # of the kernel; NumPy's timing (frameworks._time_host) calls every set once too.
        C.time_plans(plans, launches=nsets, samples=1, warmup=0, blocking=True)
    if cache == "flush":
        n = samples or cfg.flush_samples
        secs = C.time_plans(plans, launches=1, samples=n, warmup=warm,
                            flush=cfg.ewkern_flush_buffer(), blocking=True)
        launches = 1
    else:
        est, warm_first = 1, 1
        for _ in range(3):   # grow the estimate until it covers a quarter of a sample
            t = min(C.time_plans(plans, launches=est, samples=1, warmup=warm_first, blocking=True))
            warm_first = 0
            if t * est >= cfg.min_sample_s / 4 or est >= MAX_LAUNCHES:
                break
            est = min(MAX_LAUNCHES, math.ceil(cfg.min_sample_s / 4 / max(t, 1e-9)))
        if cfg.is_cpu:
            # a sample is whole passes over every buffer set, as NumPy's host timing takes them
            # (frameworks._time_host): one call per sample timed a cold start of the OpenMP team
            # each time (a 4 MiB float16 log cell moved between 0.59 and 0.95 of NumPy run to run)
            launches = choose_launches(t, nsets, cfg.min_sample_s)
        else:
            launches = max(1, min(MAX_LAUNCHES, math.ceil(cfg.min_sample_s / max(t, 1e-12))))
        n = samples or cfg.samples
        secs = C.time_plans(plans, launches=launches, samples=n, warmup=max(0, warm - 1),
                            blocking=True)
    method = ("host clock" if cfg.is_cpu else "CUDA events") + ", ewkern._C.time_plans"
    if cache == "flush":
        method += flush_words(cfg)
    return Timing(list(secs), launches, nsets, nsets * set_bytes, cache, method, notes, plan)


# --- building workloads --------------------------------------------------------------------

_FILL = {"log": 1.5, "sqrt": 1.5, "rsqrt": 1.5, "div": 0.75}


def new_filled(shape, dtype: str, device: str, value: float):
    """An ewkern array of shape filled with value."""
    a = ew().empty(tuple(shape), dtype=dtype, device=device)
    ew().fill(a, float(value))
    return a


def ew_op(name: str):
    """The ewkern op function called name, with its inputs and scalars counts from ewkern.ops()."""
    for row in ew().ops():
        if row["name"] == name:
            return getattr(ew(), name), int(row["inputs"]), int(row["scalars"])
    raise Skip(f"ewkern has no op {name!r}")


class BufferPool:
    """Buffer sets kept across measurements (every variant at one size reuses the same buffers)."""

    def __init__(self):
        self._sets = {}

    def get(self, key, index: int, make):
        k = (key, index)
        if k not in self._sets:
            self._sets[k] = make()
        return self._sets[k]

    def clear(self):
        self._sets.clear()


def time_sequence(plans, flush_first=None) -> list:
    """One launch of each plan in order, each timed alone with no warm-up (E4's per-iteration view).

    flush_first: an array passed to time_plans' flush= for the first launch only (a cold start)."""
    C = core()
    out = []
    for i, p in enumerate(plans):
        kw = {"flush": flush_first} if (i == 0 and flush_first is not None) else {}
        out.append(C.time_plans([p], launches=1, samples=1, warmup=0, blocking=True, **kw)[0])
    return out


def kernel_info(op: str, variant: str, dtype: str) -> dict:
    """ewkern.kernel_info, or {} where the build cannot tell (CPU kernels)."""
    try:
        return dict(ew().kernel_info(op, variant=variant, dtype=dtype))
    except Exception:
        return {}


def variants(op: str, dtype: str | None, device: str) -> list:
    """The variant names ewkern has for op (and dtype) on the device's backend."""
    kind = "cpu" if device == "cpu" else "cuda"
    try:
        return list(ew().variants(op, dtype=dtype, device=kind))
    except TypeError:
        return list(ew().variants(op, dtype))
    except Exception:
        return []


def plan_elementwise(op: str, dtype: str, shape, device: str, *, variant: str = "auto",
                     block: int | None = None, grid: int | None = None, scalars=None,
                     pool: BufferPool | None = None, random_inputs: bool = False):
    """(make_plan, set_bytes) for one elementwise op call; buffers come from pool when given.

    Inputs are constant fills, or with random_inputs (host only) NumPy's peer inputs
    (frameworks.op_inputs: the same random data in the op's domain), so that a data-dependent
    path (a vector math function's fallback for special inputs) is timed as the peer's is."""
    if random_inputs and device != "cpu":
        raise ValueError("random_inputs is for the host (device 'cpu')")
    from .units import ITEMSIZE
    fn, nin, nsc = ew_op(op)
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    n = math.prod(shape)
    if scalars is None:
        scalars = (1.0, 0.5)[:nsc]
    kw = {"variant": variant}
    if block:
        kw["block"] = int(block)
    if grid:
        kw["grid"] = int(grid)
    value = _FILL.get(op, 0.5)

    counter = [0]

    def make_set():
        if random_inputs:
            from .frameworks import op_inputs
            ins = [_host_array(x, dtype) for x in op_inputs("numpy", op, shape, dtype, "cpu")]
        else:
            ins = [new_filled(shape, dtype, device, value + 0.25 * k) for k in range(nin)]
        return ins, ew().empty(shape, dtype=dtype, device=device)

    def make_plan():
        if pool is None:
            ins, out = make_set()
        else:
            key = (nin, shape, dtype, ("random", op) if random_inputs else value)
            ins, out = pool.get(key, counter[0], make_set)
            counter[0] += 1
        if op == "fill":
            return core().prepare(fn, out, *scalars, **kw)
        return core().prepare(fn, *ins, *scalars, out=out, **kw)

    return make_plan, (nin + 1) * n * ITEMSIZE[dtype]


def _host_array(x, dtype: str):
    """An ewkern host array holding the NumPy array x of dtype. bfloat16 (ml_dtypes, which DLPack
    cannot carry) travels as float32, which holds every bfloat16 value exactly."""
    import numpy
    if dtype == "bfloat16":
        return ew().asarray(numpy.asarray(x, dtype=numpy.float32), dtype="bfloat16", device="cpu")
    return ew().asarray(x, device="cpu")


def plan_rmse(shape, dtype: str, device: str, *, axis=None, variant: str = "auto",
              block: int | None = None, grid: int | None = None, pool: BufferPool | None = None):
    """(make_plan, set_bytes) for one ewkern.rmse call on fresh buffers."""
    from .units import ITEMSIZE
    n = math.prod(shape)
    kw = {"variant": variant}
    if block:
        kw["block"] = int(block)
    if grid:
        kw["grid"] = int(grid)
    if axis is not None:
        kw["axis"] = axis

    counter = [0]

    def make_set():
        return new_filled(shape, dtype, device, 0.75), new_filled(shape, dtype, device, 0.25)

    def make_plan():
        if pool is None:
            a, b = make_set()
        else:
            a, b = pool.get(("rmse", tuple(shape), dtype), counter[0], make_set)
            counter[0] += 1
        return core().prepare(ew().rmse, a, b, **kw)

    return make_plan, 2 * n * ITEMSIZE[dtype]
