"""What the notebooks in notebooks/ share: their settings, finding or making results, showing them.

Each notebook shows one paper's experiments from a results dict and ends with that paper's rows
of ``claims.evaluate``. The dict comes from one of two places (``MODE``):

  "results"  the best results folder under <repo>/results/ (the committed GPU run): a GPU run
             before a CPU one, then the one holding more of the notebook's experiments, then a
             complete run before a partial one, then the newest (its "started" time). With none,
             the notebook says so and runs instead.
  "run"      ``ewkern.bench.main`` runs the experiments here: on cuda:0 when ewkern sees a GPU,
             else on the CPU with its small sizes (GPU-only experiments are reported as skipped).

Environment variables (the parameter cell of each notebook reads the first two):

  EWKERN_NOTEBOOK_MODE   results (default) | run
  EWKERN_NOTEBOOK_QUICK  1 (default): run mode passes --quick; 0: the full sizes
  EWKERN_NOTEBOOK_TINY   1: run mode uses the smallest sizes (the notebook tests)
  EWKERN_NOTEBOOK_DEVICE run mode's device: cuda:N or cpu (default: cuda:0 when ewkern sees a GPU)
  EWKERN_RESULTS_DIR     a results folder (or a folder to search) instead of <repo>/results
  EWKERN_NOTEBOOK_OUT    where run mode writes its results folder (default: a new temporary folder)

Nothing here measures by itself; ``results_for(paper, mode="run")`` calls the harness.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from pathlib import Path

from . import claims as _claims
from . import plots as _plots
from . import registry
from .results import load
from .summary import md_table

__all__ = ["PAPERS", "settings", "find_results", "run_experiments", "results_for", "show", "show_figures",
           "claims_rows", "show_claims", "v1_table", "v1_details", "v1_claims", "r1_paper_comparison", "peers_rmse",
           "a1_tables", "a1_highlights", "markdown", "status_line", "describe", "DPI"]

REPO = Path(__file__).resolve().parents[2]
DPI = 72   # figures are embedded as PNG at this resolution (the notebooks stay small)

PAPERS = {
    "elementwise": {"file": "elementwise-ops-on-gpus.md", "title": "Elementwise operations on GPUs",
                    "experiments": ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9"],
                    "claim_sources": r"elementwise-ops-on-gpus\.md|\bE[1-9]\b"},
    "f16x8": {"file": "cuda-vectorization-f16x8.md", "title": "CUDA vectorisation (f16x8)",
              "experiments": ["v1"], "claim_sources": r"cuda-vectorization-f16x8\.md|\bV1\b"},
    "rmse": {"file": "batched-rmse-kernel-analysis.txt", "title": "Batched RMSE kernel analysis",
             "experiments": ["r1", "peers"], "claim_sources": r"batched-rmse-kernel-analysis\.txt|\bR1\b"},
    "add": {"file": "add-kernel-experiments.md", "title": "Add kernel experiments",
            "experiments": ["a1"], "claim_sources": r"add-kernel-experiments\.md|\bA1\b"},
}

# Run mode: options that keep what a notebook does not show small (the R1 notebook shows only the
# rmse part of peers), and the smallest sizes for EWKERN_NOTEBOOK_TINY (the tests).
_EXTRA = {"rmse": ["--peers-ops", "copy", "--peers-dtypes", "float32", "--peers-no-compile"]}
_EXTRA_CPU = {"rmse": ["--peers-sizes", "4MiB"]}
_EXTRA_GPU = {"rmse": ["--peers-sizes", "64MiB"]}
_TINY = ["--cache-bytes", "1MiB", "--samples", "3", "--min-sample-ms", "0.05",
         "--e2-sizes", "256KiB,1MiB,4MiB", "--e3-shapes", "256x512", "--e3-ops", "copy,add,log",
         "--e4-size", "1MiB", "--e4-pool", "16MiB", "--e4-iterations", "3", "--e5-sizes", "1MiB,4MiB",
         "--e6-sizes", "1MiB,4MiB", "--e7-size", "1MiB", "--e9-sizes", "1MiB,4MiB", "--e9-ops", "add",
         "--v1-sizes", "256,512", "--r1-shape", "16x64x64",
         "--a1-n", "2^16", "--a1-naive-n", "2^12", "--a1-configs", "256:2048",
         "--peers-sizes", "1MiB", "--peers-ops", "copy,add,gelu", "--peers-dtypes", "float32,bfloat16",
         "--peers-rmse-shapes", "16x2^12,2^12x16:last", "--peers-ref-size", "1MiB"]


# --- settings ---------------------------------------------------------------------------------

def _flag(name, default):
    v = os.environ.get(name)
    if v is None or not v.strip():
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


def settings() -> dict:
    """MODE, QUICK and TINY from the environment (see the module docstring)."""
    mode = (os.environ.get("EWKERN_NOTEBOOK_MODE") or "results").strip().lower()
    return {"MODE": mode, "QUICK": _flag("EWKERN_NOTEBOOK_QUICK", True),
            "TINY": _flag("EWKERN_NOTEBOOK_TINY", False)}


# --- finding a results folder -----------------------------------------------------------------

def _candidates(root: Path) -> list[Path]:
    if (root / "results.json").is_file():
        return [root]
    found = []
    for depth in ("*", "*/*", "*/*/*"):
        found += [p.parent for p in root.glob(f"{depth}/results.json")]
    return found


def _describe(folder: Path, wanted) -> dict | None:
    try:
        with open(folder / "results.json") as f:
            res = json.load(f)
    except (OSError, ValueError):
        return None
    exps = res.get("experiments") or {}
    have = sum(1 for e in wanted if (exps.get(e) or {}).get("status") == "ok")
    return {"folder": folder, "gpu": res.get("device", "cpu") != "cpu", "have": have,
            "complete": not res.get("partial"), "started": res.get("started") or ""}


def find_results(experiments=(), root=None) -> Path | None:
    """The results folder to show: see the module docstring for the order. None if there is none."""
    env = os.environ.get("EWKERN_RESULTS_DIR")
    root = Path(root or env or REPO / "results")
    if not root.exists():
        return None
    rows = [d for d in (_describe(p, experiments) for p in _candidates(root)) if d]
    if not rows:
        return None
    best = max(rows, key=lambda d: (d["gpu"], d["have"], d["complete"], d["started"]))
    return best["folder"]


def _rel(p: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


# --- running ----------------------------------------------------------------------------------

def _device() -> str:
    env = (os.environ.get("EWKERN_NOTEBOOK_DEVICE") or "").strip().lower()
    if env:
        return env
    try:
        import ewkern
    except Exception as exc:   # not built: say how to fix it
        print(f"cannot import ewkern ({type(exc).__name__}: {exc}); build it first (make build)")
        raise
    try:
        return "cuda:0" if ewkern.cuda_available() else "cpu"
    except Exception:
        return "cpu"


def run_experiments(experiments, *, quick=True, tiny=False, extra=(), out=None, device=None) -> dict:
    """Run experiments with ewkern.bench.main (on cuda:0 when there is a GPU); returns the results dict."""
    from .cli import main
    device = device or _device()
    out = Path(out or os.environ.get("EWKERN_NOTEBOOK_OUT") or tempfile.mkdtemp(prefix="ewkern-notebook-"))
    argv = list(experiments) + ["--device", device, "--out", str(out), "--no-plots", "--no-progress"]
    if quick:
        argv.append("--quick")
    argv += list(extra)
    if tiny:
        argv += _TINY
    print(f"running {', '.join(experiments)} on {device}{' (quick)' if quick else ' (full sizes)'}"
          f"{' with the smallest sizes' if tiny else ''} -> {out}")
    log = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(log):
        code = main(argv)
    if code not in (0, 1):
        print(log.getvalue()[-2000:])
        raise RuntimeError(f"python -m ewkern.bench {' '.join(argv)} exited {code}")
    return load(out)


def results_for(paper: str, mode=None, quick=None, tiny=None) -> dict:
    """The results dict a notebook shows, with a line saying where it comes from."""
    spec = PAPERS[paper]
    s = settings()
    mode = (mode or s["MODE"]).lower()
    quick = s["QUICK"] if quick is None else quick
    tiny = s["TINY"] if tiny is None else tiny
    if mode not in ("results", "run"):
        raise ValueError(f"MODE must be 'results' or 'run', not {mode!r}")
    res = None
    if mode == "results":
        folder = find_results(spec["experiments"])
        if folder is None:
            where = os.environ.get("EWKERN_RESULTS_DIR") or _rel(REPO / "results")
            print(f"no results folder (results.json) under {where}: running the experiments here instead")
        else:
            res = load(folder)
            res["_source"] = f"results folder {_rel(folder)}"
    if res is None:
        device = _device()
        extra = list(_EXTRA.get(paper, [])) + (_EXTRA_CPU if device == "cpu" else _EXTRA_GPU).get(paper, [])
        res = run_experiments(spec["experiments"], quick=quick, tiny=tiny, extra=extra, device=device)
        res["_source"] = f"a run made by this notebook ({res['_path']})"
    print(describe(res))
    return res


def describe(res: dict) -> str:
    info = res.get("device_info") or {}
    git = res.get("git") or {}
    commit = (git.get("commit") or "")[:12]
    lines = [f"showing: {res.get('_source', res.get('_path'))}",
             f"device:  {res.get('device')} ({info.get('name') or res.get('device_name')})"
             + (f", peak {res['peak_gbs']:.0f} GB/s" if res.get("peak_gbs") else
                ", no theoretical peak" + (" (CPU)" if res.get("device") == "cpu" else ""))
             + (f", L2 {info['l2_bytes'] / 2**20:.0f} MiB" if info.get("l2_bytes") else ""),
             f"run:     {'quick' if res.get('quick') else 'full'} sizes, cache mode {res.get('cache')}, "
             f"started {res.get('started')}" + (f", commit {commit}{' (dirty)' if git.get('dirty') else ''}"
                                                 if commit else "")
             + (" [PARTIAL]" if res.get("partial") else "")]
    ref = res.get("reference") or {}
    if ref.get("copy_gbs"):
        lines.append(f"measured copy {ref['copy_gbs']:.0f} GB/s ({ref.get('size_bytes', 0) / 2**20:.0f} MiB float32, "
                     f"{ref.get('cache')})")
    return "\n".join(lines)


# --- showing ----------------------------------------------------------------------------------

def _display(obj):
    try:
        from IPython.display import display
        display(obj)
    except ImportError:   # plain Python: print what can be printed
        print(getattr(obj, "data", obj))


def markdown(text):
    """Display markdown (printed outside IPython)."""
    try:
        from IPython.display import Markdown
        _display(Markdown(text))
    except ImportError:
        print(text)


def _png(fig, dpi=DPI):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    try:
        from IPython.display import Image
        _display(Image(data=buf.getvalue(), format="png"))
    except ImportError:
        print(f"[figure, {len(buf.getvalue())} bytes of PNG]")


def status_line(res: dict, name: str) -> str | None:
    """One line when an experiment has nothing to show (skipped, failed, not in the folder)."""
    exp = (res.get("experiments") or {}).get(name)
    if exp is None:
        return f"{name}: not in this results folder"
    st = exp.get("status")
    if st == "skipped":
        return f"{name}: skipped on {res.get('device')}: {exp.get('reason')}"
    if st != "ok":
        return f"{name}: {st}: {exp.get('reason')}"
    return None


def show_figures(res: dict, name: str, only=None, dpi=DPI):
    """The experiment's figures (plots.figures), as PNG; only: a predicate on the file stem."""
    try:
        figs = _plots.figures(res, name)
    except Exception as exc:
        print(f"{name}: plotting failed: {type(exc).__name__}: {exc}")
        return
    for stem, fig in figs:
        if only is None or only(stem):
            _png(fig, dpi)


def show(res: dict, name: str, *, table=True, figures=True):
    """One experiment: its status, notes, the harness's summary table and its figures."""
    line = status_line(res, name)
    if line:
        print(line)
        return
    exp = res["experiments"][name]
    head = [f"**{name}: {exp.get('title')}**"] + [f"- {n}" for n in exp.get("notes") or []]
    skipped = exp.get("skipped") or []
    if skipped:
        reasons = {}
        for s in skipped:
            reasons.setdefault(s["reason"], []).append(s["what"])
        head += [f"- skipped: {', '.join(w[:3])}{' and %d more' % (len(w) - 3) if len(w) > 3 else ''} ({r})"
                 for r, w in reasons.items()]
    head += [f"- ERROR in {e['what']}: {e['error']}" for e in exp.get("errors") or []]
    markdown("\n".join(head))
    if table:
        try:
            text = registry.get(name).summary(res, exp)
        except Exception as exc:
            text = f"(summary failed: {type(exc).__name__}: {exc})"
        if text:
            markdown(text)
    if figures:
        show_figures(res, name)


# --- claims -----------------------------------------------------------------------------------

def claims_rows(res: dict, paper: str) -> list[dict]:
    """The rows of claims.evaluate whose source names this paper or one of its experiments."""
    pat = re.compile(PAPERS[paper]["claim_sources"])
    return [r for r in _claims.evaluate(res) if pat.search(r.get("source", ""))]


def claims_markdown(rows) -> str:
    marks = {"holds": "**holds**", "does not hold": "**does not hold**", "not measured": "not measured"}
    return md_table(["claim", "verdict", "evidence (numbers from this run)", "source"],
                    [[r["claim"], marks.get(r["status"], r["status"]), r["evidence"], r["source"]] for r in rows])


def show_claims(res: dict, paper: str, extra_rows=()):
    rows = claims_rows(res, paper) + list(extra_rows)
    if not rows:
        print(f"claims.evaluate has no claim for {PAPERS[paper]['file']}")
        return rows
    markdown(claims_markdown(rows))
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(", ".join(f"{v} {k}" for k, v in counts.items()) + f" (device: {res.get('device_name') or res.get('device')})")
    return rows


# --- V1 ---------------------------------------------------------------------------------------

def v1_table(res: dict) -> str | None:
    """The tutorial's layout: per S, K the first two outputs and the median time in ms."""
    exp = (res.get("experiments") or {}).get("v1") or {}
    if not exp.get("measurements"):
        return None
    from .v1_f16x8 import paper_table
    return paper_table(exp)


def v1_details(res: dict) -> str | None:
    """The harness's V1 table without the tutorial-layout block: kernel, variant, GB/s, max abs error."""
    exp = (res.get("experiments") or {}).get("v1") or {}
    if not exp.get("measurements"):
        return None
    text = registry.get("v1").summary(res, exp)
    return text.split("\n```\n\n", 1)[-1]


def _v1_row(claim, status, evidence, numbers=None):
    return {"key": "v1", "claim": claim, "source": "cuda-vectorization-f16x8.md (V1, this notebook)",
            "status": status, "evidence": evidence, "numbers": numbers or {}}


V1_TOLERANCE = 0.02   # times within 2% count as a tie (as claims.py does for E5)


def v1_claims(res: dict) -> list[dict]:
    """The tutorial's table read as claims (claims.evaluate has none for V1), over its S x K cases.

    "A is faster than B": the best median time of A is more than 2% below B's; a claim holds when
    that is so in more than half of the S x K cases ("the fastest": within 2% of the fastest).
    The tutorial's own count, by the same rule, is quoted beside ours.
    """
    ms = (((res.get("experiments") or {}).get("v1") or {}).get("measurements")) or []
    t = {}
    for m in ms:
        if m.get("time_s"):
            t.setdefault((m["S"], m["K"]), {})[m["series"]] = m["time_s"]
    f16 = ("f16", "f16x2", "f16x8", "f16x8pack")
    checks = [   # claim, faster set, slower set, ties count as true, the tutorial's count
        ("f32x4 (128-bit loads) is faster than f32", ("f32x4",), ("f32",), False, "8/9"),
        ("f16x2 (half2) is faster than f16", ("f16x2",), ("f16",), False, "9/9"),
        ("f16x8pack (one 128-bit load per 8 halves) is faster than f16x8 (four half2 loads)",
         ("f16x8pack",), ("f16x8",), False, "9/9"),
        ("f16x8pack is the fastest of the hand-written f16 kernels", ("f16x8pack",), ("f16", "f16x2", "f16x8"),
         True, "7/9"),
        ("f16 add is faster than f32 add (half the bytes; best kernel of each)", f16, ("f32", "f32x4"), False, "9/9"),
    ]
    rows = []
    for claim, fast, slow, ties_ok, paper in checks:
        need = slow + fast
        cases = {k: d for k, d in t.items() if all(n in d for n in need)}
        if not cases:
            rows.append(_v1_row(claim, "not measured", "V1 measured no S x K case with " + ", ".join(need)))
            continue
        verdicts = []
        for d in cases.values():
            r = min(d[n] for n in slow) / min(d[n] for n in fast)
            verdicts.append("faster" if r > 1 + V1_TOLERANCE else ("tie" if r >= 1 - V1_TOLERANCE else "slower"))
        n_fast, n_tie = verdicts.count("faster"), verdicts.count("tie")
        true = n_fast + (n_tie if ties_ok else 0)
        big = max(cases)
        ev = (f"true in {true}/{len(cases)} S x K cases (the tutorial: {paper}); faster in {n_fast}, within "
              f"{V1_TOLERANCE:.0%} in {n_tie}, slower in {verdicts.count('slower')}; at S={big[0]}, K={big[1]}: "
              + ", ".join(f"{n} {cases[big][n] * 1e3:.4f} ms" for n in need))
        rows.append(_v1_row(claim, "holds" if 2 * true > len(cases) else "does not hold", ev,
                            {"cases": len(cases), "true": true, "faster": n_fast, "ties": n_tie,
                             "largest_ms": {n: cases[big][n] * 1e3 for n in need}}))
    return rows


# --- R1 ---------------------------------------------------------------------------------------

# The notebook's BenchmarkTools output for each step (ms): min, median, mean, sd, max; CUDA.registers
PAPER_R1 = [("atomic", "per-element atomics", 19.672, 19.941, 20.038, 0.313, 21.817, None),
            ("block", "one block per batch, block reduction", 3.973, 4.040, 4.081, 0.154, 5.691, None),
            ("multiblock", "many blocks per batch, one atomic per block", 0.8186, 0.8287, 0.8334, 0.1339, 10.566, None),
            ("occupancy", "launch configuration from the occupancy API", 0.8214, 0.8337, 0.8363, 0.0419, 1.937, 98),
            ("int32", "no bounds checks, 32-bit indices, assume(size > 0)", 0.6826, 0.6945, 0.6973, 0.0689, 5.596, 82)]


def r1_paper_comparison(res: dict) -> str | None:
    ms = {m.get("variant"): m for m in (((res.get("experiments") or {}).get("r1") or {}).get("measurements") or [])}
    if not ms:
        return None
    rows = []
    for key, what, lo, med, mean, sd, hi, regs in PAPER_R1:
        m = ms.get(key)
        st = (m or {}).get("stats_s") or {}
        rows.append([key, what, f"{med:.3f} ({lo:.3f} .. {hi:.3f})", regs or "-",
                     f"{st['median'] * 1e3:.3f} ({st['min'] * 1e3:.3f} .. {st['max'] * 1e3:.3f})" if st else "not measured",
                     (m or {}).get("registers") or "-",
                     f"{PAPER_R1[0][3] / med:.1f}x" if med else "-",
                     f"{ms['atomic']['time_s'] / m['time_s']:.1f}x" if (m and "atomic" in ms) else "-"])
    shape = ms[next(iter(ms))].get("shape")
    return (md_table(["version", "step", "paper median ms (min .. max)", "paper registers",
                      f"ewkern median ms (min .. max), {'x'.join(map(str, shape or []))}", "ewkern registers",
                      "paper speed-up over atomic", "ewkern speed-up over atomic"], rows)
            + "\n\nThe paper's registers are CUDA.registers of its Julia kernel after that step (98 with the occupancy "
              "launch; 90, 88, 82 as bounds checks, 64-bit indices and the division check went); ewkern's are "
              "ewkern.kernel_info's num_regs of the CUDA kernel.")


def peers_rmse(res: dict) -> dict | None:
    """A copy of the peers experiment with only its rmse rows and its copy/dot references."""
    exp = (res.get("experiments") or {}).get("peers")
    if not exp or exp.get("status") != "ok":
        return None
    ms = [m for m in exp.get("measurements", []) if m.get("op") == "rmse" or m.get("reference")]
    if not any(m.get("op") == "rmse" for m in ms):
        return None
    sub = dict(exp, measurements=ms)
    return dict(res, experiments=dict(res.get("experiments") or {}, peers=sub))


# --- A1 ---------------------------------------------------------------------------------------

def a1_tables(res: dict) -> str | None:
    exp = (res.get("experiments") or {}).get("a1") or {}
    if not exp.get("measurements"):
        return None
    from .a1_add import paper_tables
    return paper_tables(exp)


def a1_highlights(res: dict) -> str | None:
    """Per launch configuration: the fastest and slowest kernel, against the peak (the paper: 241 of 256 GB/s)."""
    ms = (((res.get("experiments") or {}).get("a1") or {}).get("measurements")) or []
    if not ms:
        return None
    peak = res.get("peak_gbs")
    rows = []
    for series in dict.fromkeys(m["series"] for m in ms):
        sel = [m for m in ms if m["series"] == series and m.get("mean_gbs")]
        if not sel:
            continue
        hi = max(sel, key=lambda m: m["mean_gbs"])
        lo = min(sel, key=lambda m: m["mean_gbs"])
        def pct(m):
            if not peak:
                return ""
            v = 100 * m["mean_gbs"] / peak
            return f" ({v:.0f}% of peak)" if v >= 1 else f" ({v:.2f}% of peak)"
        errs = sum(1 for m in sel if m.get("total_error"))
        rows.append([series, len(sel), f"add{hi['variant']} {hi['mean_gbs']:.1f} GB/s{pct(hi)}",
                     f"add{lo['variant']} {lo['mean_gbs']:.1f} GB/s{pct(lo)}", errs])
    return md_table(["launch configuration", "kernels", "fastest (mean bandwidth)", "slowest", "kernels with a "
                     "non-zero total error"], rows)
