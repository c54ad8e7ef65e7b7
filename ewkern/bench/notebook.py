"""What the notebooks in notebooks/ share: their settings, finding or making results, showing them.

Each notebook shows one paper's experiments from a list of results dicts, one per GPU, and ends
with that paper's rows of ``claims.evaluate`` judged on each. The list comes from one of two
places (``MODE``):

  "results"  every GPU's results folder under <repo>/results/ (the committed GPU runs), ordered
             by the GPU's name: for each GPU (its device_name) the run holding more of the
             notebook's experiments, then a complete run before a partial one, then the newest
             (its "started" time). CPU runs only where there is no GPU run. With none, the
             notebook says so and runs instead.
  "run"      ``ewkern.bench.main`` runs the experiments here: on cuda:0 when ewkern sees a GPU,
             else on the CPU with its small sizes (GPU-only experiments are reported as skipped).
             The list holds that one run.

Several runs are shown side by side: each experiment's figure once per GPU in one image (beside
each other while they fit ROW_INCHES, else one above the other), its tables one GPU after the
other, and the claims in one table with a column per GPU.

Environment variables (the parameter cell of each notebook reads the first two):

  EWKERN_NOTEBOOK_MODE   results (default) | run
  EWKERN_NOTEBOOK_QUICK  1 (default): run mode passes --quick; 0: the full sizes
  EWKERN_NOTEBOOK_TINY   1: run mode uses the smallest sizes (the notebook tests)
  EWKERN_NOTEBOOK_DEVICE run mode's device: cuda:N or cpu (default: cuda:0 when ewkern sees a GPU)
  EWKERN_RESULTS_DIR     a results folder (or a folder to search) instead of <repo>/results
  EWKERN_NOTEBOOK_OUT    where run mode writes its results folder (default: a new temporary folder)

Nothing here measures by itself; ``runs_for(paper, mode="run")`` calls the harness.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path

from . import claims as _claims
from . import peers as _peers
from . import plots as _plots
from . import registry
from . import results as _results
from .results import load
from .summary import md_table
from .units import fmt_bytes

__all__ = ["PAPERS", "settings", "find_runs", "run_experiments", "run_arguments", "runs_for", "label", "show",
           "show_figures", "each", "conventions", "claims_rows", "show_claims", "v1_table", "v1_details", "v1_claims",
           "r1_paper_comparison", "peers_rmse", "peers_elementwise", "is_peers_heatmap", "a1_tables",
           "a1_highlights", "markdown", "status_line", "describe", "DPI", "ROW_INCHES", "PEERS_BELOW"]

REPO = Path(__file__).resolve().parents[2]
DPI = 72   # figures are embedded as PNG at this resolution (the notebooks stay small)
ROW_INCHES = 22.0   # one GPU's figure beside the next while the row stays this wide, else below it
PEERS_BELOW = 0.99  # peers: a cell counts as behind its peer below this ratio (the README's count)

PAPERS = {
    "elementwise": {"file": "elementwise-ops-on-gpus.md", "title": "Elementwise operations on GPUs",
                    "experiments": ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9", "peers"],
                    "claim_sources": r"elementwise-ops-on-gpus\.md|\bE[1-9]\b"},
    "f16x8": {"file": "cuda-vectorization-f16x8.md", "title": "CUDA vectorisation (f16x8)",
              "experiments": ["v1"], "claim_sources": r"cuda-vectorization-f16x8\.md|\bV1\b"},
    "rmse": {"file": "batched-rmse-kernel-analysis.txt", "title": "Batched RMSE kernel analysis",
             "experiments": ["r1", "peers", "rmse_grid"], "claim_sources": r"batched-rmse-kernel-analysis\.txt|\bR1\b"},
    "add": {"file": "add-kernel-experiments.md", "title": "Add kernel experiments",
            "experiments": ["a1"], "claim_sources": r"add-kernel-experiments\.md|\bA1\b"},
    # not a paper: ewkern's own targets (issues 20 and 21), judged in the experiments' own tables
    "front": {"file": "(issues 20 and 21)", "title": "Training steps and user kernels",
              "experiments": ["train", "fused"], "claim_sources": r"\(issue 2[01]\)", "claims": False},
}

# Run mode: options that keep what a notebook does not show small (the R1 notebook shows only the
# rmse part of peers and float32 of rmse_grid; the elementwise one only peers' elementwise part, in
# the paper's two dtypes, PDL on), and the smallest sizes for EWKERN_NOTEBOOK_TINY (the tests).
_EXTRA = {"rmse": ["--peers-ops", "copy", "--peers-dtypes", "float32", "--peers-no-compile",
                   "--grid-dtypes", "float32"],
          "elementwise": ["--peers-dtypes", "float32,bfloat16", "--peers-no-pdl-off", "--peers-rmse-shapes", ""]}
_EXTRA_CPU = {"rmse": ["--peers-sizes", "4MiB"]}
_EXTRA_GPU = {"rmse": ["--peers-sizes", "64MiB"]}
_TINY = ["--cache-bytes", "1MiB", "--samples", "3", "--min-sample-ms", "0.05",
         "--e2-sizes", "256KiB,1MiB,4MiB", "--e3-shapes", "256x512", "--e3-ops", "copy,add,log",
         "--e4-size", "1MiB", "--e4-pool", "16MiB", "--e4-iterations", "3", "--e5-sizes", "1MiB,4MiB",
         "--e6-sizes", "1MiB,4MiB", "--e7-size", "1MiB", "--e9-sizes", "1MiB,4MiB", "--e9-ops", "add",
         "--v1-sizes", "256,512", "--r1-shape", "16x64x64",
         "--a1-n", "2^16", "--a1-naive-n", "2^12", "--a1-configs", "256:2048",
         "--peers-sizes", "1MiB", "--peers-ops", "copy,add,gelu", "--peers-dtypes", "float32,bfloat16",
         "--peers-rmse-shapes", "16x2^12,2^12x16:last", "--peers-ref-size", "1MiB",
         "--train-sizes", "64KiB", "--train-ops", "add,gelu,rmse", "--fused-sizes", "64KiB",
         "--fused-exprs", "fma,rmsnorm,add"]


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


# --- finding the results folders --------------------------------------------------------------

def _candidates(root: Path) -> list[Path]:
    if _results.results_file(root) is not None:
        return [root]
    found = set()
    for depth in ("*", "*/*", "*/*/*"):
        for name in _results.JSON_NAMES:
            found.update(p.parent for p in root.glob(f"{depth}/{name}"))
    return sorted(found)


def _describe(folder: Path, wanted, root: Path) -> dict | None:
    try:
        res = _results.load(folder)
    except (OSError, ValueError, EOFError):
        return None
    exps = res.get("experiments") or {}
    have = sum(1 for e in wanted if (exps.get(e) or {}).get("status") == "ok")
    # the GPU: its name as the run recorded it, else the first folder below root (results/<GPU>/...)
    parts = folder.relative_to(root).parts
    name = res.get("device_name") or (parts[0] if parts else folder.name)
    return {"folder": folder, "name": name, "gpu": res.get("device", "cpu") != "cpu", "have": have,
            "complete": not res.get("partial"), "started": res.get("started") or ""}


def find_runs(experiments=(), root=None) -> dict[str, Path]:
    """The results folders to show, one per GPU: {GPU name: folder}, ordered by name.

    root: a results folder itself, or a folder to search three levels deep (default:
    EWKERN_RESULTS_DIR, else <repo>/results). GPU runs only, CPU runs where there is none; for
    each GPU the run holding more of experiments, then a complete one, then the newest. {} if
    there is none.
    """
    env = os.environ.get("EWKERN_RESULTS_DIR")
    root = Path(root or env or REPO / "results")
    if not root.exists():
        return {}
    rows = [d for d in (_describe(p, experiments, root) for p in _candidates(root)) if d]
    rows = [d for d in rows if d["gpu"]] or rows
    best = {}
    for d in rows:
        rank = (d["have"], d["complete"], d["started"], str(d["folder"]))
        if d["name"] not in best or rank > best[d["name"]][0]:
            best[d["name"]] = (rank, d["folder"])
    return {name: best[name][1] for name in sorted(best)}


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


def run_arguments(paper: str, device: str) -> list[str]:
    """The options run mode adds for a paper's notebook on device (besides --quick and the tiny sizes)."""
    return list(_EXTRA.get(paper, [])) + (_EXTRA_CPU if device == "cpu" else _EXTRA_GPU).get(paper, [])


def runs_for(paper: str, mode=None, quick=None, tiny=None) -> list[dict]:
    """The results dicts a notebook shows, one per GPU, each saying where it comes from."""
    spec = PAPERS[paper]
    s = settings()
    mode = (mode or s["MODE"]).lower()
    quick = s["QUICK"] if quick is None else quick
    tiny = s["TINY"] if tiny is None else tiny
    if mode not in ("results", "run"):
        raise ValueError(f"MODE must be 'results' or 'run', not {mode!r}")
    runs = []
    if mode == "results":
        found = find_runs(spec["experiments"])
        if not found:
            where = os.environ.get("EWKERN_RESULTS_DIR") or _rel(REPO / "results")
            print(f"no results folder (results.json or results.json.gz) under {where}: running the experiments here instead")
        for name, folder in found.items():
            res = load(folder)
            res["_source"] = f"results folder {_rel(folder)}"
            res["_label"] = name
            runs.append(res)
    if not runs:
        device = _device()
        res = run_experiments(spec["experiments"], quick=quick, tiny=tiny, extra=run_arguments(paper, device),
                              device=device)
        res["_source"] = f"a run made by this notebook ({res['_path']})"
        runs.append(res)
    if len(runs) > 1:
        print(f"{len(runs)} GPUs, shown in this order (figures left to right, tables one after the other): "
              + ", ".join(label(r) for r in runs) + "\n")
    print("\n\n".join(describe(r) for r in runs))
    return runs


def label(res: dict) -> str:
    """The name a run is shown under: its GPU's (the device's) name."""
    return res.get("_label") or res.get("device_name") or res.get("device") or "device"


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

def _runs(runs) -> list[dict]:
    """A list of results dicts from a list or one results dict."""
    return [runs] if isinstance(runs, dict) else list(runs)


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


def _show_png(data: bytes):
    try:
        from IPython.display import Image
        _display(Image(data=data, format="png"))
    except ImportError:
        print(f"[figure, {len(data)} bytes of PNG]")


def _render(fig, dpi):
    """A figure as an RGB Pillow image."""
    from PIL import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def _compose(panels, gap=12) -> bytes:
    """[(RGB image, width in inches)] -> one PNG: beside each other while a row fits ROW_INCHES,
    rows one below the other; 256 colours (figures hold few), so the notebooks stay small."""
    from PIL import Image
    per_row = max(1, min(len(panels), int(ROW_INCHES // max(w for _, w in panels))))
    rows = [[im for im, _ in panels[i:i + per_row]] for i in range(0, len(panels), per_row)]
    width = max(sum(im.width for im in row) + gap * (len(row) - 1) for row in rows)
    height = sum(max(im.height for im in row) for row in rows) + gap * (len(rows) - 1)
    sheet = Image.new("RGB", (width, height), "white")
    y = 0
    for row in rows:
        x = 0
        for im in row:
            sheet.paste(im, (x, y))
            x += im.width + gap
        y += max(im.height for im in row) + gap
    out = io.BytesIO()
    sheet.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, format="PNG",
                                                                                        optimize=True)
    return out.getvalue()


def _name_figure(fig, name):
    """Put the GPU's name on a figure whose titles do not say it (E8's SASS plot)."""
    from matplotlib.text import Text
    if not any(name in t.get_text() for t in fig.findobj(Text)):
        fig.suptitle(name, fontsize=10)


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


def _status(res: dict, line: str, many: bool):
    print(f"{label(res)}: {line}" if many else line)


def show_figures(runs, name: str, only=None, dpi=DPI):
    """The experiment's figures (plots.figures) for each run, as PNG: each figure once, with the
    runs' versions of it side by side in one image. only: a predicate on the file stem."""
    runs = _runs(runs)
    per_run = []
    for res in runs:
        try:
            figs = [(stem, fig) for stem, fig in _plots.figures(res, name) if only is None or only(stem)]
        except Exception as exc:
            _status(res, f"{name}: plotting failed: {type(exc).__name__}: {exc}", len(runs) > 1)
            continue
        if len(runs) > 1:
            for _, fig in figs:
                _name_figure(fig, label(res))
        per_run.append(dict(figs))
    for stem in dict.fromkeys(s for figs in per_run for s in figs):
        panels = [(_render(figs[stem], dpi), figs[stem].get_size_inches()[0]) for figs in per_run if stem in figs]
        _show_png(_compose(panels))


def _lines(exp) -> list[str]:
    """An experiment's notes, skips (grouped by reason) and errors as markdown list items."""
    reasons = {}
    for s in exp.get("skipped") or []:
        reasons.setdefault(s["reason"], []).append(s["what"])
    return ([f"- {n}" for n in exp.get("notes") or []]
            + [f"- skipped: {', '.join(w[:3])}{' and %d more' % (len(w) - 3) if len(w) > 3 else ''} ({r})"
               for r, w in reasons.items()]
            + [f"- ERROR in {e['what']}: {e['error']}" for e in exp.get("errors") or []])


def show(runs, name: str, *, table=True, figures=True):
    """One experiment on each run: its title and the notes and skips the runs share, then per run
    what is its own (other notes, skips and errors, the harness's summary table), then its figures."""
    runs = _runs(runs)
    many = len(runs) > 1
    live = [res for res in runs if status_line(res, name) is None]
    common = []
    if live:
        per_run = [_lines(res["experiments"][name]) for res in live]
        common = [line for line in per_run[0] if all(line in lines for lines in per_run)]
        markdown("\n".join([f"**{name}: {live[0]['experiments'][name].get('title')}**"] + common))
    for res in runs:
        line = status_line(res, name)
        if line:
            _status(res, line, many)
            continue
        exp = res["experiments"][name]
        lines = [line for line in _lines(exp) if line not in common]
        text = ""
        if table:
            try:
                text = registry.get(name).summary(res, exp)
            except Exception as exc:
                text = f"(summary failed: {type(exc).__name__}: {exc})"
        if many and (lines or text):
            lines.insert(0, f"**{label(res)}**")
        body = "\n".join(lines) + ("\n\n" if lines and text else "") + (text or "")
        if body:
            markdown(body)
    if figures and live:
        show_figures(live, name)


def each(runs, fn, name: str, *, code=False):
    """Show fn(run) for each run (markdown; code: printed as it is), under the GPU's name when
    there are several; the experiment's status line where fn has nothing."""
    runs = _runs(runs)
    many = len(runs) > 1
    for res in runs:
        text = fn(res)
        if not text:
            _status(res, status_line(res, name) or f"{name}: no measurements", many)
        elif code:
            print(f"{label(res)}\n{text}" if many else text)
        else:
            markdown(f"**{label(res)}**\n\n{text}" if many else text)


def conventions(runs, name: str):
    """Print the convention the runs state for an experiment (once where they agree)."""
    seen = {}
    for res in _runs(runs):
        conv = (res.get("conventions") or {}).get(name)
        if conv and ((res.get("experiments") or {}).get(name) or {}).get("measurements"):
            seen.setdefault(conv, []).append(label(res))
    for conv, names in seen.items():
        print(f"convention{'' if len(seen) == 1 else ' (' + ', '.join(names) + ')'}: {conv}")


# --- claims -----------------------------------------------------------------------------------

_MARKS = {"holds": "**holds**", "does not hold": "**does not hold**", "not measured": "not measured"}


def claims_rows(res: dict, paper: str) -> list[dict]:
    """The rows of claims.evaluate whose source names this paper or one of its experiments."""
    pat = re.compile(PAPERS[paper]["claim_sources"])
    return [r for r in _claims.evaluate(res) if pat.search(r.get("source", ""))]


def claims_markdown(rows) -> str:
    return md_table(["claim", "verdict", "evidence (numbers from this run)", "source"],
                    [[r["claim"], _MARKS.get(r["status"], r["status"]), r["evidence"], r["source"]] for r in rows])


def claims_by_gpu_markdown(per_gpu: dict) -> str:
    """{GPU name: rows} -> one table, a column per GPU holding its verdict and evidence."""
    claims = {}
    for rows in per_gpu.values():
        for r in rows:
            claims.setdefault((r["key"], r["claim"]), r["source"])
    index = {name: {(r["key"], r["claim"]): r for r in rows} for name, rows in per_gpu.items()}
    table = []
    for (key, claim), source in claims.items():
        cells = []
        for name in per_gpu:
            r = index[name].get((key, claim))
            cells.append(f"{_MARKS.get(r['status'], r['status'])}: {r['evidence']}" if r else "-")
        table.append([claim] + cells + [source])
    return md_table(["claim"] + [f"{name}: verdict, evidence" for name in per_gpu] + ["source"], table)


def show_claims(runs, paper: str, extra=None) -> dict:
    """The paper's claims judged on each run: one table (a column per GPU when there are several)
    and a count per run. extra: a function of a run giving more rows (V1's). {GPU name: rows}."""
    runs = _runs(runs)
    per_gpu = {label(res): claims_rows(res, paper) + list(extra(res) if extra else []) for res in runs}
    if not any(per_gpu.values()):
        print(f"claims.evaluate has no claim for {PAPERS[paper]['file']}")
        return per_gpu
    rows = next(iter(per_gpu.values()))
    markdown(claims_markdown(rows) if len(per_gpu) == 1 else claims_by_gpu_markdown(per_gpu))
    for res in runs:
        counts = {}
        for r in per_gpu[label(res)]:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        print(", ".join(f"{v} {k}" for k, v in counts.items())
              + f" (device: {res.get('device_name') or res.get('device')})")
    return per_gpu


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


def peers_rmse(runs) -> list[dict]:
    """The runs with the peers experiment cut to its rmse rows, their skips and the copy/dot
    references (a run whose peers timed no rmse shape says so)."""
    out = []
    for res in _runs(runs):
        exp = (res.get("experiments") or {}).get("peers")
        if exp and exp.get("status") == "ok":
            ms = [m for m in exp.get("measurements", []) if m.get("op") == "rmse" or m.get("reference")]
            skipped = [s for s in exp.get("skipped") or [] if " rmse " in s.get("what", "")]
            sub = (dict(exp, measurements=ms, skipped=skipped) if any(m.get("op") == "rmse" for m in ms) else
                   dict(exp, status="not measured", reason="this run's peers timed no rmse shape"))
            res = dict(res, experiments=dict(res.get("experiments") or {}, peers=sub))
        out.append(res)
    return out


# --- peers (elementwise) ----------------------------------------------------------------------

def is_peers_heatmap(stem: str) -> bool:
    """peers' heat maps of ewkern (PDL on) / peer, one per timing method: not the PDL-off ones or rmse."""
    return stem.startswith("peers_") and stem != "peers_rmse" and not stem.endswith("_pdl_off")


def peers_elementwise(runs, below=PEERS_BELOW, impl="ewkern") -> str | None:
    """peers' elementwise cells, impl / peer, per timing method: a table of the worst cell of each
    op with a column per GPU, the count of cells under below per GPU, and those cells (lowest
    first). Displays it as markdown and returns it (None when no run compared any cell)."""
    runs = _runs(runs)
    many = len(runs) > 1
    stats = {}
    for res in runs:
        line = status_line(res, "peers")
        if line:
            _status(res, line, many)
            continue
        per_method, peer = _peers.method_cells(res["experiments"]["peers"], impl, below)
        if not per_method:
            _status(res, f"peers: no elementwise cell timed for both {impl} and a peer", many)
            continue
        stats[label(res)] = (per_method, peer)
    if not stats:
        return None
    names = list(stats)
    peer = " / ".join(dict.fromkeys(p for _, p in stats.values()))
    out = []
    for method in dict.fromkeys(m for per_method, _ in stats.values() for m in per_method):
        got = {n: stats[n][0][method] for n in names if method in stats[n][0]}
        out.append(f"**{impl} / {peer}, {_peers.METHOD_LABEL.get(method, method)}**: the worst cell of each op "
                   f"(GB/s ratio; above 1: {impl} faster)\n")
        rows = []
        for op in sorted({op for mc in got.values() for op in mc["worst"]}):
            row = [op]
            for mc in got.values():
                k = mc["worst"].get(op)
                row.append(f"{mc['ratios'][k]:.3f} ({k[1]} {fmt_bytes(k[2])})" if k else "-")
            rows.append(row)
        out.append(md_table(["op"] + list(got), rows) + "\n")
        rows = []
        for n, mc in got.items():
            by_dtype = {}
            for k in mc["below"]:
                by_dtype[k[1]] = by_dtype.get(k[1], 0) + 1
            rows.append([n, f"{len(mc['below'])} of {len(mc['ratios'])}",
                         ", ".join(f"{d} {c}" for d, c in sorted(by_dtype.items())) or "-"])
        out.append(md_table(["GPU" if many else "device", f"cells below {below:g}", "by dtype"], rows) + "\n")
        for n, mc in got.items():
            if mc["below"]:
                out.append(f"{n}, cells below {below:g} (lowest first): " + "; ".join(
                    f"{k[0]} {k[1]} {fmt_bytes(k[2])} {mc['ratios'][k]:.3f}" for k in mc["below"]) + "\n")
    text = "\n".join(out)
    markdown(text)
    return text


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
