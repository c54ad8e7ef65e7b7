"""The common runner: one Context per run, one ExperimentRun per experiment, outputs on disk.

A run's results are one plain dict (what ``results.json`` holds, what ``ewkern.bench.load``
returns), so notebooks can plot and evaluate committed results without running anything.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import os
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import frameworks, registry, results as _results
from .timing import (ROUNDS_TARGET, BenchError, Skip, Timing, TimingConfig, available_memory, cache_bytes,
                     plan_elementwise, time_ewkern, ew)

__all__ = ["Context", "ExperimentRun", "run", "CONVENTIONS"]

SCHEMA = 1

CONVENTIONS = {
    "bandwidth": "GB/s = (bytes read + bytes written) / median time per launch / 1e9 "
                 "(copy 2*n*s, binary ops 3*n*s, unary ops and op-with-constant 2*n*s, rmse 2*n*s "
                 "+ 4 bytes per batch result); s = bytes per element",
    "time": "seconds per launch; each sample = K back-to-back launches / K; statistics over samples; "
            "the median is reported",
    "gpu_timing": "CUDA events on one stream; ewkern through ewkern._C.time_plans (K launches "
                  "captured in one CUDA graph and replayed between events behind a spin kernel; one "
                  "eager launch per sample in flush mode); torch/CuPy: the same, through their graph "
                  "capture",
    "cpu_timing": "host clock (perf_counter) around K launches",
    "cache_modes": {"hot": "the same buffers every launch",
                    "rotate": "distinct buffer sets cycled so the working set is >= 4x the L2 "
                              "(the last-level cache on a CPU)",
                    "flush": "a buffer of 2x the L2 is read (GPU; written on a CPU) before each sample, "
                             "outside the timed region; one launch per sample"},
    "peak": "theoretical peak = bus width (bytes) x transfers per cycle x memory clock (GHz) "
            "(elementwise-ops-on-gpus.md), from ewkern.device_info",
    "sizes": "MiB/GiB are binary (2^20/2^30 bytes); GB/s is decimal (1e9 bytes/s)",
    "a1": "A1 effective bandwidth = 3*n*4 bytes / t (reads of x and y, write of the result), the "
          "convention its tables match",
}


@dataclass
class Context:
    """Everything an experiment needs to know about the run it is part of."""
    device: str
    info: dict
    quick: bool
    cache: str
    out: Path
    args: object
    cfg: TimingConfig
    results: dict
    progress: bool = True
    _current: "ExperimentRun | None" = field(default=None, repr=False)

    @property
    def is_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def cold_cache(self) -> str:
        """The cache-busting mode for experiments that compare hot with cold."""
        return self.cache if self.cache != "hot" else "rotate"

    @property
    def peak_gbs(self):
        return self.results.get("peak_gbs")

    def opt(self, name: str, default=None):
        """A command-line option's value (None when not given)."""
        value = getattr(self.args, name, None)
        return default if value is None else value

    def pick(self, name: str, *, gpu_full, gpu_quick, cpu_full, cpu_quick):
        """An option's value, or the default for this device and mode."""
        value = getattr(self.args, name, None)
        if value is not None:
            return value
        if self.is_gpu:
            return gpu_quick if self.quick else gpu_full
        return cpu_quick if self.quick else cpu_full


class _Progress:
    """tqdm when importable and stderr is a terminal, otherwise one plain line per step."""

    def __init__(self, enabled: bool, total: int, desc: str):
        self.bar = None
        self.enabled = enabled
        self.total = total
        self.desc = desc
        self.n = 0
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def step(self, text: str = ""):
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text[:60], refresh=False)
            self.bar.update(1)
        elif self.enabled:
            print(f"  [{self.desc} {self.n}/{self.total}] {text}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class ExperimentRun:
    """Collects one experiment's parameters, notes, measurements and tables."""

    def __init__(self, ctx: Context, spec):
        self.ctx = ctx
        self.spec = spec
        self.data = {"name": spec.name, "title": spec.title, "description": spec.description,
                     "paper": spec.paper, "status": "running", "reason": None, "params": {},
                     "notes": [], "measurements": [], "skipped": [], "errors": [], "tables": {},
                     "elapsed_s": None}
        self._bar = None
        self._discard = 0   # > 0 inside discarding(): measurements are timed and not kept

    # --- bookkeeping ---
    def param(self, **kw):
        self.data["params"].update({k: _jsonable(v) for k, v in kw.items()})

    def note(self, text: str):
        if text not in self.data["notes"]:
            self.data["notes"].append(text)

    def table(self, name: str, rows: list):
        self.data["tables"][name] = [_jsonable(r) for r in rows]

    def progress(self, total: int):
        self._bar = _Progress(self.ctx.progress, total, self.spec.name)
        return self._bar

    def _step(self, text):
        if self._bar is not None:
            self._bar.step(text)

    def add(self, record: dict) -> dict:
        rec = {"experiment": self.spec.name, **{k: _jsonable(v) for k, v in record.items()}}
        if not self._discard:
            self.data["measurements"].append(rec)
        return rec

    def skip(self, what: str, reason: str):
        if not self._discard:
            self.data["skipped"].append({"what": what, "reason": str(reason)})
            self._step(f"{what}: skipped ({reason})")

    def error(self, what: str, exc: BaseException):
        if not self._discard:
            self.data["errors"].append({"what": what, "error": f"{type(exc).__name__}: {exc}",
                                        "traceback": traceback.format_exc(limit=6)})
            self._step(f"{what}: ERROR {type(exc).__name__}: {exc}")

    @contextmanager
    def discarding(self):
        """Inside, measure / measure_peer time as usual but keep nothing (no measurement, skip or
        error recorded, no progress step): a warm-up that takes what only a first run meets."""
        self._discard += 1
        try:
            yield
        finally:
            self._discard -= 1

    # --- measuring ---
    def _finish(self, timing: Timing, base: dict, bytes_read: int, bytes_written: int) -> dict:
        rec = {**base, **timing.record()}
        rec.setdefault("bytes_read", bytes_read)
        rec.setdefault("bytes_written", bytes_written)
        rec["bytes"] = int(rec["bytes_read"]) + int(rec["bytes_written"])
        t = rec["time_s"]
        rec["gbs"] = rec["bytes"] / t / 1e9 if t else None
        peak = self.ctx.peak_gbs
        rec["pct_peak"] = 100.0 * rec["gbs"] / peak if (peak and rec["gbs"]) else None
        return self.add(rec)

    def measure(self, *, what: str, make_plan, set_bytes: int, cache: str, bytes_read: int = 0,
                bytes_written: int = 0, samples: int | None = None, **fields) -> dict | None:
        """Time an ewkern workload (make_plan from timing.plan_*) and record it; None if skipped."""
        try:
            timing = time_ewkern(self.ctx.cfg, make_plan, set_bytes, cache, samples=samples)
        except (Skip, BenchError) as exc:
            if isinstance(exc, BenchError):
                raise
            self.skip(what, str(exc))
            return None
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            self.error(what, exc)
            return None
        rec = self._finish(timing, {"impl": "ewkern", **fields}, bytes_read, bytes_written)
        if not self._discard:
            self._step(f"{what}: {_fmt_rate(rec)}")
        return rec

    def measure_peer(self, *, what: str, impl: str, build, cache: str, samples: int | None = None,
                     before=None, spin_us: float = frameworks.SPIN_US, **fields) -> dict | None:
        """Time a peer; build() returns (make_call, set_bytes, bytes_read, bytes_written); before(),
        when given, a foreign call to time each call after (frameworks.foreign_call); spin_us: how
        long the sleep kernel holds the stream in flush mode (it must outlast the host's queueing of
        the whole call)."""
        try:
            make_call, set_bytes, br, bw = build()
            timing = frameworks.time_calls(self.ctx.cfg, impl, make_call, set_bytes, cache,
                                           samples=samples, before=before() if before else None,
                                           spin_us=spin_us)
        except Skip as exc:
            self.skip(what, str(exc))
            return None
        except BenchError:
            raise
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            # a peer failing is that peer's problem, not ewkern's: keep the reason, go on
            self.skip(what, _failure(exc))
            return None
        rec = self._finish(timing, {"impl": fields.pop("impl_label", impl), **fields}, br, bw)
        if not self._discard:
            self._step(f"{what}: {_fmt_rate(rec)}")
        return rec

    def measure_peers_in_turns(self, *, entries, cache: str, samples: int | None = None,
                               spin_us: float = frameworks.SPIN_US, shared: bool = False, **common) -> list:
        """measure_peer for several ways of one workload launched on torch's stream, timed in turns
        (frameworks.time_calls_in_turns): entries [(what, build, fields)], common: the fields they
        share (a field impl_label names the record's impl, as measure_peer's does; default torch). A
        way whose build fails is skipped with its reason; if timing them together fails, each is
        measured alone (measure_peer), so that one way's failure loses no other. shared: the ways
        share their buffer sets (frameworks.SharedSets), as time_calls_in_turns takes it."""
        built = []   # (what, build(), fields, build)
        for what, build, fields in entries:
            try:
                built.append((what, build(), fields, build))
            except Skip as exc:
                self.skip(what, str(exc))
            except (BenchError, KeyboardInterrupt):
                raise
            except Exception as exc:
                self.skip(what, _failure(exc))
        if not built:
            return []
        timings = None
        try:
            timings = frameworks.time_calls_in_turns(self.ctx.cfg, [(b[0], b[1]) for _, b, _, _ in built], cache,
                                                     samples=samples, spin_us=spin_us, shared=shared)
        except (BenchError, KeyboardInterrupt):
            raise
        except Exception:
            pass   # timed alone below, outside this block: its traceback would keep the ways' buffers alive
        if timings is None:
            # each way built again: shared sets' makers start again at the first set
            built = [(what, build, fields) for what, _, fields, build in built]
            return [self.measure_peer(what=what, impl="torch", build=build, cache=cache, samples=samples,
                                      spin_us=spin_us, **{**common, **fields}) for what, build, fields in built]
        recs = []
        for (what, (_, _, br, bw), fields, _), timing in zip(built, timings):
            own = dict(fields)
            rec = self._finish(timing, {"impl": own.pop("impl_label", "torch"), **common, **own}, br, bw)
            if not self._discard:
                self._step(f"{what}: {_fmt_rate(rec)}")
            recs.append(rec)
        return recs


def _failure(exc) -> str:
    """A peer's failure as a skip reason: its type and first line"""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _fmt_rate(rec):
    if rec.get("gbs") is None:
        return "-"
    pct = f" ({rec['pct_peak']:.0f}% of peak)" if rec.get("pct_peak") else ""
    return f"{rec['gbs']:.1f} GB/s{pct}, {rec['time_s'] * 1e6:.1f} us"


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    try:
        import numpy
        if isinstance(v, numpy.generic):
            return _jsonable(v.item())
    except ImportError:
        pass
    return str(v)


def _git_commit() -> dict:
    """The checkout's commit; EWKERN_GIT_COMMIT names it where the tree travelled without .git
    (scripts/gpu-check.sh on the GPU machine)."""
    if os.environ.get("EWKERN_GIT_COMMIT"):
        return {"commit": os.environ["EWKERN_GIT_COMMIT"], "dirty": None}
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=5)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _meta(ctx_device: str, info: dict, cache: str, quick: bool, argv) -> dict:
    vers = frameworks.versions()
    try:
        vers["ewkern"] = getattr(ew(), "__version__", None)
    except Exception:
        vers["ewkern"] = None
    vers["python"] = platform.python_version()
    try:   # what applies on the device (pdl_enabled alone said true on a CPU): the auto kernels' PDL, on from 9.0
        pdl = frameworks.pdl_active(info)
    except Exception:
        pdl = None
    vers["driver"] = info.get("driver_version")
    vers["cuda_runtime"] = info.get("runtime_version")
    return {"schema": SCHEMA, "tool": "ewkern.bench", "partial": False, "interrupted": False,
            "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "finished": None, "argv": list(argv), "device": ctx_device, "device_info": info,
            "device_name": info.get("name"), "host": platform.node(), "platform": platform.platform(),
            "versions": vers, "git": _git_commit(), "cache": cache, "quick": quick,
            "conventions": CONVENTIONS, "peak_gbs": info.get("peak_bandwidth_gbs"), "pdl": pdl,
            "cache_bytes": None, "reference": {}, "experiments": {}, "claims": []}


def _reference_copy(ctx: Context):
    """The run's measured copy bandwidth, drawn on every bandwidth plot."""
    if ctx.is_gpu:
        size = max(256 << 20, 4 * ctx.cfg.cache_bytes) if ctx.quick else max(1 << 30, 8 * ctx.cfg.cache_bytes)
    else:
        size = max(16 << 20, 2 * ctx.cfg.cache_bytes) if ctx.quick else max(64 << 20, 4 * ctx.cfg.cache_bytes)
    if ctx.cfg.memory_budget:
        while size > 16 << 20 and 2 * size > ctx.cfg.memory_budget * 0.5:
            size //= 2
    n = size // 4
    make_plan, set_bytes = plan_elementwise("copy", "float32", (n,), ctx.device)
    timing = time_ewkern(ctx.cfg, make_plan, set_bytes, ctx.cold_cache)
    rec = timing.record()
    nbytes = int(rec.get("bytes_read", 4 * n)) + int(rec.get("bytes_written", 4 * n))
    gbs = nbytes / rec["time_s"] / 1e9
    ctx.results["reference"] = {"what": "ewkern.copy float32, variant auto", "size_bytes": size,
                                "bytes": nbytes, "cache": ctx.cold_cache, "copy_gbs": gbs,
                                "time_s": rec["time_s"], "stats_s": rec["stats_s"],
                                "samples_s": rec["samples_s"], "launches": rec["launches"],
                                "peak_gbs": ctx.peak_gbs,
                                "pct_peak": 100 * gbs / ctx.peak_gbs if ctx.peak_gbs else None}
    return gbs


def quick_cpu_note(names) -> str:
    """What --quick runs of the named experiments on a CPU, against the full set, and how to run the
    full CPU set (said at the start). Each line says what runs: a heading "leaves out:" over them read
    as the opposite."""
    from . import e3_elementwise, peers
    out = ["quick mode on the CPU runs a subset (minutes on 2 cores):"]
    if "peers" in names:
        out.append("  " + peers.CPU_QUICK)
    if "e3" in names:
        out.append(f"  e3: ops {', '.join(e3_elementwise.QUICK_OPS)} only (full: {len(e3_elementwise.FULL_OPS)} ops)")
    if "train" in names:
        out.append("  train: gelu, mul and rmse in float32 at 1 MiB, and the MLP step (full: every differentiable "
                   "op in float32, float16, bfloat16)")
    if "fused" in names:
        out.append("  fused: float32 at 1 MiB (full: float32, float16, bfloat16 at 1 and 16 MiB)")
    smaller = [n for n in ("e2", "e6", "r1", "a1", "c1", "overhead") if n in names]
    if smaller:
        out.append(f"  {', '.join(smaller)}: fewer or smaller sizes, shapes and calls than the full set")
    out.append("  the full CPU set (tens of minutes on 2 cores): python -m ewkern.bench --all --device cpu "
               "(make bench BENCH_ARGS='--all --device cpu')")
    return "\n".join(out)


def precheck(ctx: Context, names: list[str]):
    """Each experiment's size checks, before anything is allocated (raises BenchError)."""
    for name in names:
        spec = registry.get(name)
        if spec.check is not None and spec.runs_on(ctx.device) is None:
            spec.check(ctx)


def run(ctx: Context, names: list[str], argv) -> int:
    """Run the named experiments, writing outputs as it goes. Returns the process exit code."""
    res = ctx.results
    res.update(_meta(ctx.device, ctx.info, ctx.cache, ctx.quick, argv))
    res["cache_bytes"] = ctx.cfg.cache_bytes
    res["cache_level"] = "L2" if ctx.is_gpu else "last-level cache"
    specs = [registry.get(n) for n in names]
    # what the folder's results file says an earlier run wrote there, read before this run's first
    # results.json replaces it (finish_outputs removes what this run does not write again)
    before = _results.outputs_of(ctx.out)
    code = 0
    t_start = time.perf_counter()
    if ctx.quick and not ctx.is_gpu:
        print(quick_cpu_note(names), file=sys.stderr, flush=True)
    try:
        if any(spec.needs_reference and spec.runs_on(ctx.device) is None for spec in specs):
            print(f"measuring the reference copy bandwidth on {ctx.device} ...", file=sys.stderr, flush=True)
            try:
                gbs = _reference_copy(ctx)
                print(f"  copy: {gbs:.1f} GB/s ({ctx.results['reference']['cache']})", file=sys.stderr,
                      flush=True)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                ctx.results["reference"] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  reference copy failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                code = 1
        for spec in specs:
            xr = ExperimentRun(ctx, spec)
            res["experiments"][spec.name] = xr.data
            why = spec.runs_on(ctx.device)
            if why:
                xr.data["status"] = "skipped"
                xr.data["reason"] = why
                print(f"{spec.name}: skipped: {why}", file=sys.stderr, flush=True)
                continue
            print(f"{spec.name}: {spec.title} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                spec.run(ctx, xr)
                xr.data["status"] = "ok"
            except Skip as exc:
                xr.data["status"] = "skipped"
                xr.data["reason"] = str(exc)
                print(f"{spec.name}: skipped: {exc}", file=sys.stderr, flush=True)
            except BenchError as exc:
                xr.data["status"] = "error"
                xr.data["reason"] = str(exc)
                xr.data["errors"].append({"what": spec.name, "error": str(exc), "traceback": None})
                print(f"{spec.name}: ERROR {exc}", file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                xr.data["status"] = "interrupted"
                raise
            except Exception as exc:
                xr.data["status"] = "error"
                xr.data["reason"] = f"{type(exc).__name__}: {exc}"
                xr.data["errors"].append({"what": spec.name, "error": xr.data["reason"],
                                          "traceback": traceback.format_exc()})
                print(f"{spec.name}: ERROR {xr.data['reason']}", file=sys.stderr, flush=True)
            finally:
                if xr._bar is not None:
                    xr._bar.close()
                xr.data["elapsed_s"] = round(time.perf_counter() - t0, 3)
            if xr.data["errors"]:
                code = 1
            _results.write_json(res, ctx.out)   # keep what is done so far
    except KeyboardInterrupt:
        res["partial"] = True
        res["interrupted"] = True
        code = 130
        print("\ninterrupted: writing partial results", file=sys.stderr, flush=True)
    finally:
        res["finished"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        res["elapsed_s"] = round(time.perf_counter() - t_start, 3)
        ran = [n for n in names if n in res["experiments"]]
        if len(ran) < len(names) or any(res["experiments"][n]["status"] in ("running", "interrupted")
                                        for n in ran):
            res["partial"] = True
    try:
        _finish_outputs(ctx, before)
    except KeyboardInterrupt:   # a second interrupt while writing: results.json already holds the runs
        res["interrupted"] = True
    return 130 if res.get("interrupted") else code


def _finish_outputs(ctx: Context, before=None):
    finish_outputs(ctx.results, ctx.out, plots=not getattr(ctx.args, "no_plots", False), before=before)


def finish_outputs(res: dict, out: Path, *, plots: bool = True, before=None):
    """Claims, results.json, the CSVs, the figures and summary.md of a results dict, into out.

    The CSVs and figures of an earlier run or merge in out that these results do not write again are
    removed, so that the folder's files are its results.json's: those its results file names (before,
    when given: what it named before this run replaced it; else read from out now) and every
    experiment's own CSV (<name>.csv); but where these results make no figures (plots off, or
    plotting failed) the earlier figures stay. No other file is touched."""
    from . import claims, summary
    from . import plots as _plots
    out = Path(out)
    if before is None:
        before = _results.outputs_of(out)
    try:
        res["claims"] = claims.evaluate(res)
    except Exception as exc:   # never lose the measurements over the claims table
        res["claims"] = [{"claim": "claims evaluation failed", "status": "not measured",
                          "evidence": f"{type(exc).__name__}: {exc}"}]
    _results.write_json(res, out)
    csvs = _results.write_csvs(res, out)
    figures = []
    if plots:
        try:
            figures = _plots.save_all(res, out)
        except KeyboardInterrupt:
            # the figures take seconds (matplotlib's import alone): an interrupt here, after the last
            # experiment, keeps the tables and the summary and leaves the figures out
            res["interrupted"] = True
            print("\ninterrupted: writing the results without figures", file=sys.stderr, flush=True)
        except Exception as exc:
            print(f"plotting failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    res["figures"] = figures
    _results.write_json(res, out)
    stale = (set(before) | {f"{name}.csv" for name in registry.names()}) - set(csvs) - set(figures)
    if not figures:
        # no figures made (--no-plots, or plotting failed): an earlier run's stay as they were rather
        # than leave the folder with none (a merge --no-plots into a committed folder removed them all)
        stale = {n for n in stale if not n.endswith(".png")}
    removed = _results.remove_outputs(out, stale)
    if removed:
        print(f"removed {len(removed)} output{'s' if len(removed) > 1 else ''} of an earlier run in {out} that "
              f"these results do not hold: {', '.join(removed)}", file=sys.stderr)
    text = summary.markdown(res)
    (out / "summary.md").write_text(text)
    print(text)
    print(f"\nresults: {out}{' (PARTIAL)' if res.get('partial') else ''}", file=sys.stderr)


def make_context(args, device: str, info: dict, out: Path, quick: bool, cache: str) -> Context:
    cfg = TimingConfig(device=device, cache_bytes=getattr(args, "cache_bytes", None) or cache_bytes(device, info))
    if getattr(args, "flush_kind", None):
        cfg.flush_kind = args.flush_kind
    if getattr(args, "single_between", None):
        cfg.single_between = args.single_between
    if getattr(args, "flush_factor", None):
        cfg.flush_factor = int(args.flush_factor)
    if getattr(args, "flush_rounds", False):
        cfg.flush_target = ROUNDS_TARGET
    if quick:
        cfg.samples, cfg.flush_samples, cfg.flush_target = 7, 15, 0.0
    if getattr(args, "samples", None):
        cfg.samples = cfg.flush_samples = int(args.samples)
        cfg.flush_target = 0.0
    if getattr(args, "min_sample_ms", None) is not None:   # 0 is a target too (the fewest launches)
        cfg.min_sample_s = float(args.min_sample_ms) * 1e-3
    avail = available_memory(device, info)
    cfg.memory_budget = int(avail * 0.8) if avail else None
    return Context(device=device, info=info, quick=quick, cache=cache, out=out, args=args, cfg=cfg,
                   results={}, progress=not getattr(args, "no_progress", False))
