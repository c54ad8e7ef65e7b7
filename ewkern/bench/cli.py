"""``python -m ewkern.bench``: the command line.

    python -m ewkern.bench list
    python -m ewkern.bench [EXPERIMENT ...] [--all] [--quick] [--device cuda:0|cpu] [--out DIR]
                           [--cache hot|rotate|flush] [each experiment's own options]

Exit codes: 0 done; 1 done, but a measurement or experiment failed; 2 bad input (nothing run);
130 interrupted (partial results written and marked partial).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
from pathlib import Path

from . import registry
from .common import bytes_arg
from .timing import CACHE_MODES, BenchError

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # exit 2 with the message, as argparse does, plus a hint
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        print(f"run '{self.prog} list' to see the experiments", file=sys.stderr)
        raise SystemExit(2)


def _ms_arg(text):
    """argparse type: milliseconds, 0 or more (a negative or non-finite target has no meaning)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r} (expected e.g. 0.5)") from None
    if not (0 <= v < float("inf")):
        raise argparse.ArgumentTypeError(f"must be 0 or more milliseconds: {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ewkern.bench",
                description="Reproduce the papers' GPU memory-bandwidth experiments with ewkern. "
                            "'list' shows the experiments.",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="Sizes take binary units (4MiB, 1GiB) or powers (2^20); shapes are like 1024x3072.\n"
                       "Exit codes: 0 ok, 1 some measurement failed, 2 bad input, 130 interrupted.")
    p.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                   help="experiments to run (see 'list'), or 'list'")
    p.add_argument("--all", action="store_true", help="run every experiment")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--quick", action="store_true",
                   help="a subset: --all under 10 min on an H100, under 5 min on a 2-core CPU")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: cuda:0 when ewkern sees a GPU, else cpu)")
    p.add_argument("--out", default=None, type=Path,
                   help="output folder (default: ./bench-out/<timestamp>)")
    p.add_argument("--cache", default="rotate", choices=CACHE_MODES,
                   help="cache mode of the timings (default rotate; E2 and E3 also measure hot, E4 compares offsets); "
                        "where an experiment's methods fix their own (peers' methods on a GPU; train's and "
                        "fused's single launches, flushed, and their back-to-back, which takes hot and else "
                        "rotates) its records and notes say which ran")
    p.add_argument("--cache-bytes", type=bytes_arg(), default=None, metavar="BYTES",
                   help="the cache size that rotate/flush defeat (default: the GPU's L2, the CPU's last-level cache)")
    p.add_argument("--samples", type=int, default=None, help="samples per measurement")
    p.add_argument("--flush-rounds", action="store_true",
                   help="single launches of ways timed in turns: sample in rounds until each median is known "
                        "to +-0.25%% (at most 4000 samples or about 1.5 s a cell) instead of a fixed 50; the "
                        "medians moved more between processes that way on the H200 (BENCHMARKS.md, 2026-11-27); "
                        "no effect with --quick or --samples")
    p.add_argument("--flush-factor", type=int, default=None, metavar="N",
                   help="single launches: read N x the cache before each sample (default 2)")
    p.add_argument("--flush-kind", choices=("sum", "rmse"), default=None,
                   help="single launches timed on torch's stream: flush the cache with torch's sum of the "
                        "flush buffer (default) or with one ewkern.rmse reading it (no allocation, no memset; "
                        "behind torch's sum a series repeats a pattern of four samples up to 1.07 us apart: "
                        "BENCHMARKS.md, 2026-11-27)")
    p.add_argument("--single-between", choices=("none", "mul"), default=None,
                   help="single launches timed on torch's stream: queue nothing (default) or an untimed "
                        "torch.mul of 1 MiB after each sample, before the next sample's spin and flush (in "
                        "the speed probe a torch.mul after each sample removed the pattern of four on both "
                        "GPUs: BENCHMARKS.md, 2026-11-27, twenty-ninth session); CuPy's path and ewkern's own "
                        "time_plans (rmse's 'ewkern' rows) are unchanged")
    p.add_argument("--min-sample-ms", type=_ms_arg, default=None, metavar="MS",
                   help="launches per sample are chosen so a sample lasts this long (default 0.5; 0: the "
                        "fewest launches a sample can take)")
    p.add_argument("--no-pdl", action="store_true",
                   help="turn off programmatic dependent launch of the auto kernels for the whole run "
                        "(ewkern.set_pdl(False); recorded in the results)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="run the experiments N times, each in a process of its own (into OUT/process-1 ...), "
                        "and read every cell across them (python -m ewkern.bench.merge --pool) into OUT: a "
                        "single launch's level moves by process (train, peers, fused, rmse_grid)")
    for spec in registry.specs().values():
        if spec.args:
            g = p.add_argument_group(f"{spec.name}: {spec.title}")
            for flags, kwargs in spec.args:
                g.add_argument(*([flags] if isinstance(flags, str) else flags), **kwargs)
    return p


def list_text() -> str:
    rows = []
    for spec in registry.specs().values():
        where = "" if spec.cpu_ok else "  [GPU only]"
        rows.append(f"  {spec.name:<9} {spec.description}{where}")
    return "experiments (python -m ewkern.bench NAME ... | --all):\n" + "\n".join(rows)


def _fail(message: str) -> int:
    print(f"python -m ewkern.bench: error: {message}", file=sys.stderr)
    return 2


def _resolve_device(text: str | None):
    """(device string, device_info dict); raises BenchError for a device that cannot be used."""
    try:
        import ewkern
    except Exception as exc:
        raise BenchError(f"cannot import ewkern ({type(exc).__name__}: {exc}); build it first "
                         "(make build, or pip install -e .)") from None
    try:
        has_cuda = bool(ewkern.cuda_available())
    except Exception:
        has_cuda = False
    if text is None:
        text = "cuda:0" if has_cuda else "cpu"
    t = text.strip().lower()
    if t == "cpu":
        return "cpu", dict(ewkern.device_info("cpu"))
    m = re.fullmatch(r"(?:cuda|gpu)(?::(\d+))?", t)
    if not m:
        raise BenchError(f"--device {text!r}: expected cpu, cuda or cuda:N")
    if not has_cuda:
        raise BenchError(f"--device {text}: CUDA is not available here (ewkern.cuda_available() is False: "
                         "no GPU or driver, or a CPU-only build); use --device cpu")
    index = int(m.group(1) or 0)
    count = int(ewkern.device_count())
    if index >= count:
        have = ", ".join(f"cuda:{i}" for i in range(count)) or "none"
        raise BenchError(f"--device {text}: no such CUDA device ({count} present: {have})")
    device = f"cuda:{index}"
    return device, dict(ewkern.device_info(device))


def _prepare_out(out: Path | None) -> Path:
    if out is None:
        out = Path("bench-out") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".ewkern-bench-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise BenchError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    wanted = [e.strip().lower() for e in args.experiments]
    if args.list or wanted == ["list"]:
        print(list_text())
        return 0
    valid = registry.names()
    if "list" in wanted:
        return _fail("'list' takes no other arguments")
    unknown = [e for e in wanted if e not in valid]
    if unknown:
        return _fail(f"unknown experiment{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}; "
                     f"valid: {', '.join(valid)}")
    if args.all:
        names = valid
    elif wanted:
        names = list(dict.fromkeys(wanted))
    else:
        return _fail(f"name experiments to run or give --all; valid: {', '.join(valid)}")
    if args.samples is not None and args.samples < 1:
        return _fail("--samples must be at least 1")
    if args.flush_factor is not None and args.flush_factor < 1:
        return _fail("--flush-factor must be at least 1")
    if args.processes < 1:
        return _fail("--processes must be at least 1")
    if args.processes > 1:
        from .merge import check_poolable
        try:
            check_poolable(names, "--processes")
        except ValueError as exc:
            return _fail(str(exc))
    from . import runner
    if args.no_pdl:
        import ewkern
        ewkern.set_pdl(False)
    created = None
    try:
        device, info = _resolve_device(args.device)
        existed = args.out is not None and Path(args.out).exists()
        out = _prepare_out(args.out)
        created = None if existed else out
        ctx = runner.make_context(args, device, info, out, args.quick, args.cache)
        runner.precheck(ctx, names)
    except BenchError as exc:
        if created is not None:
            try:
                created.rmdir()
            except OSError:
                pass
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    print(f"ewkern.bench: {', '.join(names)} on {device} ({info.get('name')}), cache {args.cache}"
          f"{', quick' if args.quick else ''} -> {out}", file=sys.stderr, flush=True)
    if args.processes > 1:
        return _in_processes(argv, names, out, args.processes, plots=not args.no_plots)
    return runner.run(ctx, names, argv)


def _without(argv, flag: str) -> list:
    """argv without flag and its value (either '--flag V' or '--flag=V')."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def _in_processes(argv, names, out: Path, n: int, *, plots: bool) -> int:
    """--processes N: the same command N times, each in a fresh Python process writing
    out/process-<i> (with --processes 1, whatever abbreviation argv used), then every experiment's
    cells read across the runs (merge --pool) into out. Exit code: 2 or 130 where a run stopped so
    (nothing merged); otherwise 1 if any run failed a measurement or ended another way (a signal:
    its folder is merged only if it wrote its results), else 0."""
    import subprocess
    from . import merge, results, runner
    base = _without(_without(argv, "--processes"), "--out")
    worst, folders = 0, []
    for i in range(1, n + 1):
        folder = out / f"process-{i}"
        print(f"ewkern.bench: process {i} of {n} -> {folder}", file=sys.stderr, flush=True)
        code = subprocess.run([sys.executable, "-m", "ewkern.bench", *base, "--processes", "1",
                               "--out", str(folder)]).returncode
        if code in (2, 130):
            return code
        if code != 0:
            worst = 1
        if results.results_file(folder) is not None:
            folders.append(folder)
        else:
            print(f"ewkern.bench: process {i} wrote no results (exit code {code}); left out", file=sys.stderr)
    if not folders:
        return 1
    res = merge.merge([results.load(f) for f in folders], pool=names)
    res["argv"] = list(argv)
    runner.finish_outputs(res, out, plots=plots)
    print(f"\nresults of {len(folders)} processes read together: {out}", file=sys.stderr)
    return worst


if __name__ == "__main__":   # pragma: no cover
    sys.exit(main())
