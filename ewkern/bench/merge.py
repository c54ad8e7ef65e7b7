"""python -m ewkern.bench.merge OUT RUN [RUN ...]: one results folder from runs in parts on one GPU.

Every experiment at full size can outlast a job's time limit (the GPU machines here allow 10
minutes a command). Run the experiments in parts, each into its own folder, then merge:

    python -m ewkern.bench --out part1 e1 e2 e3 e4 e5 e6 e7 e8 e9 v1 r1 a1 peers overhead c1
    python -m ewkern.bench --out part2 rmse_grid
    python -m ewkern.bench.merge results/<gpu> part1 part2

The merged results.json holds every part's experiments (a later part's experiment replaces an
earlier one's of the same name, and says so; with --combine NAMES those experiments' measurements
are joined instead, for one experiment run in parts, such as rmse_grid's dtypes; a cell measured
in both keeps the later part's; with --pool NAMES a cell measured in several runs is read across
them instead, see _pooled), the first part's run metadata, and under "parts"
each part's own: folder, command line, start and finish, git commit, ewkern and torch versions,
and the experiments it still gives (a merged folder given as a part brings its own parts; a part
whose experiments all were replaced is left out).
Claims, CSVs, figures and summary.md are then made from the merged measurements exactly as a
single run makes them. Parts measured on different GPUs are refused; parts built from different
commits are merged with a warning on stderr and in the results ("notes").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from .results import load
from .timing import summarize

__all__ = ["merge", "main"]

_COMMITS_NOTE = "the parts were built from different commits: "
_PART_KEYS = ("argv", "started", "finished", "git", "versions", "pdl", "cache", "quick", "partial", "elapsed_s")


def _union(a, b):
    """params of two parts of one experiment: dicts merged key by key, lists joined without
    repeats, other values the later part's."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _union(a[k], v) if k in a else v
        return out
    if isinstance(a, list) and isinstance(b, list):
        return a + [x for x in b if x not in a]
    return b


# what a measurement measured or derived, not what it names: a cell is named by its other fields
# that are strings, integers or None, or lists of them such as a shape (ratios to other ways "vs_*",
# the reference check's "check_*", summary statistics "t_*"; no experiment names a cell by a float,
# and floats such as after_torch's pair_time_s, a1's total_error or overhead's us_per_call, and lists
# of floats such as the samples or r1's first results, are measured)
_MEASURED = frozenset(("samples_s", "stats_s", "time_s", "gbs", "pct_peak", "notes", "launches", "sets",
                       "working_set_bytes", "bytes", "bytes_read", "bytes_written", "best_way"))
_DERIVED = ("vs_", "check_", "t_")


# the experiments --pool can read across runs: their records carry nothing derived from a time but
# what _pooled recomputes (fused's ratios: _rederive); others (overhead's us_per_call, a1's means,
# e7's share of the SM ceiling) would keep one run's value beside the pooled time
POOLABLE = ("train", "peers", "fused", "rmse_grid")


def check_poolable(names, flag: str = "--pool"):
    """ValueError naming the experiments among names that cannot be read across runs."""
    cannot = [n for n in names if n not in POOLABLE]
    if cannot:
        raise ValueError(f"{flag} reads {', '.join(POOLABLE)} across runs, not {', '.join(cannot)} (records "
                         f"with values derived from one run's time)")


def _rederive(name: str, measurements: list):
    """What an experiment derives from its measurements as it measures, made again after pooling
    (fused's ratios to the other ways: f1_fused.rederive)."""
    if name == "fused":
        from .f1_fused import rederive
        rederive(measurements)


def _pool_key(m: dict) -> tuple:
    """The cell a measurement belongs to for --pool: _cell without the timing method's description,
    which may differ between processes measuring the same cell (a way that failed in one, a graph
    capture refused in another)."""
    return tuple(kv for kv in _cell(m) if kv[0] != "method")


_UNNAMED = object()   # _name_value of what names no cell


def _name_value(v):
    """v as part of a cell's name: a string, integer, bool or None as itself, a list of them (a shape)
    as a tuple (hashable); _UNNAMED for what names nothing (a float, a dict, a list holding either)."""
    if isinstance(v, (str, int, bool, type(None))):
        return v
    if isinstance(v, (list, tuple)):
        items = tuple(_name_value(x) for x in v)
        if all(x is not _UNNAMED for x in items):
            return items
    return _UNNAMED


def _cell(m: dict) -> tuple:
    """The cell a measurement belongs to (experiment, series, impl, op, dtype, shape, size, method...):
    a shape names a cell too, or e3's 256x1024 and 1024x256 (the same n) would be one cell."""
    named = ((k, _name_value(v)) for k, v in m.items()
             if k not in _MEASURED and not k.startswith(_DERIVED) and not k.endswith("samples_s"))
    return tuple(sorted(kv for kv in named if kv[1] is not _UNNAMED))


_RUNS = "pooled_runs_samples_s"   # a pooled cell's own samples, run by run: {samples key: [list, ...]}


def _quantiles(xs, m: int) -> list:
    """m of xs's values at evenly spaced ranks (the (i + 1/2) / m quantiles): a run's distribution
    in m samples, so that runs of different lengths weigh alike when pooled."""
    xs = sorted(xs)
    return [xs[min(len(xs) - 1, int((i + 0.5) * len(xs) / m))] for i in range(m)]


def _pooled(a: dict, b: dict) -> dict:
    """One cell measured in several runs (processes), read across them: every samples list
    (samples_s, and after a torch kernel pair_samples_s and foreign_samples_s) becomes the runs'
    distributions at equal weight (each run's _quantiles at the shortest run's count), so that its
    median lies between the runs' medians, with the matching time (time_s, pair_time_s...), stats,
    GB/s and % of peak recomputed; each run's own samples are kept under pooled_runs_samples_s and
    the notes keep every run's notes and name the runs' medians. Pooled pair_samples_s and
    foreign_samples_s are each run's distributions, no longer sample-by-sample pairs. A single
    run's level moves by process (0-4% for a short single launch on the H200, BENCHMARKS.md
    2026-11-27); across three the median holds better."""
    runs = {}
    for rec in (a, b):
        own = rec.get(_RUNS) or {k: [v] for k, v in rec.items() if k.endswith("samples_s") and isinstance(v, list)}
        for k, lists in own.items():
            runs.setdefault(k, []).extend(lists)
    out = {k: v for k, v in b.items() if k != _RUNS}
    out[_RUNS] = runs
    for k, lists in runs.items():
        lists = [x for x in lists if x]
        if not lists:
            continue
        m = min(len(x) for x in lists)
        out[k] = [q for x in lists for q in _quantiles(x, m)]
        prefix = k[:-len("samples_s")]
        if prefix and prefix + "time_s" in out:
            out[prefix + "time_s"] = statistics.median(out[k])
    if out.get("samples_s"):
        st = summarize(out["samples_s"])
        out["stats_s"], out["time_s"] = st, st["median"]
        t, nbytes = out["time_s"], out.get("bytes")
        if t and nbytes and b.get("gbs"):
            gbs = nbytes / t / 1e9
            if b.get("pct_peak"):
                out["pct_peak"] = b["pct_peak"] * gbs / b["gbs"]
            out["gbs"] = gbs
    medians = [statistics.median(x) for x in runs.get("samples_s", []) if x]
    note = (f"read across {len(medians)} runs (each run's samples at equal weight, the runs' medians "
            + ", ".join(f"{t * 1e6:.3f}" for t in medians) + " us)")
    kept = []
    for rec in (a, b):      # every run's notes once (a run's late samples are in the pool too)
        for n in str(rec.get("notes") or "").split("; "):
            if n and not n.startswith("read across ") and n not in kept:
                kept.append(n)
    out["notes"] = "; ".join(kept + [note])
    return out


def _combine(a: dict, b: dict, pool: bool = False) -> dict:
    """One experiment measured in two parts (for example rmse_grid's dtypes in two runs): the
    measurements of both (a cell measured in both parts keeps the later part's, so a re-run of some
    cells replaces them; with pool, the two are read together: _pooled), their notes, skips and
    errors, the union of their parameters."""
    out = dict(a)
    later = list(b.get("measurements") or [])
    key = _pool_key if pool else _cell
    if pool:
        earlier = {key(m): m for m in (a.get("measurements") or [])}
        later = [_pooled(earlier[k], m) if (k := key(m)) in earlier else m for m in later]
    again = {key(m) for m in later}
    out["measurements"] = [m for m in (a.get("measurements") or []) if key(m) not in again] + later
    for k in ("notes", "skipped", "errors"):
        out[k] = _union(list(a.get(k) or []), list(b.get(k) or []))
    out["params"] = _union(a.get("params") or {}, b.get("params") or {})
    # how_timed: not every cell was timed the later part's way (a run older than the in_turns
    # parameter timed its ways one after another)
    turns = [(x.get("params") or {}).get("in_turns") for x in (a, b)]
    if "partly" in turns or bool(turns[0]) != bool(turns[1]):
        out["params"]["in_turns"] = "partly"
    out["tables"] = {**(a.get("tables") or {}), **(b.get("tables") or {})}
    out["elapsed_s"] = round((a.get("elapsed_s") or 0.0) + (b.get("elapsed_s") or 0.0), 3)
    statuses = [a.get("status"), b.get("status")]
    out["status"] = "ok" if statuses == ["ok", "ok"] else next(s for s in statuses if s != "ok")
    out["reason"] = a.get("reason") or b.get("reason")
    return out


def merge(parts: list, combine=(), pool=()) -> dict:
    """The merged results dict of results dicts (as ``results.load`` returns them), in order.
    Experiments named in combine that appear in several parts are combined (_combine), those named
    in pool combined with the cells measured in several parts read across them (_pooled); any
    other experiment of a later part replaces the earlier one's."""
    if not parts:
        raise ValueError("merge needs at least one run")
    check_poolable(pool)
    names = {p.get("device_name") for p in parts}
    if len(names) > 1:
        raise ValueError(f"the runs were measured on different devices: {', '.join(sorted(map(str, names)))}")
    res = {k: v for k, v in parts[0].items() if not k.startswith("_")}
    res["experiments"] = {}
    res["parts"] = []
    notes = []
    for p in parts:
        # a folder merged before keeps its own parts (each part lists the experiments it still gives)
        own = p.get("parts") or [{"folder": p.get("_path"), **{k: p.get(k) for k in _PART_KEYS},
                                  "experiments": list(p.get("experiments", {}))}]
        for name, exp in p.get("experiments", {}).items():
            if name in res["experiments"] and (name in combine or name in pool):
                how = "read together with" if name in pool else "combined with"
                notes.append(f"{name}: the run in {p.get('_path')} is {how} the earlier part's")
                exp = _combine(res["experiments"][name], exp, pool=name in pool)
                if name in pool:
                    _rederive(name, exp["measurements"])
            elif name in res["experiments"]:
                notes.append(f"{name}: the run in {p.get('_path')} replaces the earlier part's")
                for q in res["parts"]:
                    q["experiments"] = [e for e in q["experiments"] if e != name]
            res["experiments"][name] = exp
        res["parts"] += [dict(q, experiments=list(q.get("experiments", []))) for q in own]
    res["parts"] = [q for q in res["parts"] if q["experiments"]]
    commits = {(q.get("git") or {}).get("commit") for q in res["parts"]}
    if len(commits) > 1:
        notes.append(_COMMITS_NOTE
                     + ", ".join(sorted(str(c) for c in commits)))
    res["started"] = min((p["started"] for p in parts if p.get("started")), default=None)
    finished = [p["finished"] for p in parts if p.get("finished")]
    res["finished"] = max(finished) if len(finished) == len(parts) else None
    res["elapsed_s"] = round(sum(p.get("elapsed_s") or 0.0 for p in parts), 3)
    res["partial"] = any(p.get("partial") for p in parts)
    res["interrupted"] = any(p.get("interrupted") for p in parts)
    res["notes"] = [n for n in res.get("notes") or [] if not n.startswith(_COMMITS_NOTE)] + notes
    res.pop("claims", None)
    res.pop("figures", None)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ewkern.bench.merge",
                                 description="Merge ewkern.bench runs made in parts on one GPU into one folder.")
    ap.add_argument("out", help="the folder to write (made if absent; its results file is replaced)")
    ap.add_argument("runs", nargs="+", help="run folders (each holding results.json or results.json.gz), in order")
    ap.add_argument("--combine", default="", metavar="NAMES",
                    help="experiments measured in parts (e.g. rmse_grid's dtypes in two runs) whose "
                         "measurements are joined instead of the later replacing the earlier")
    ap.add_argument("--pool", default="", metavar="NAMES",
                    help="experiments run several times (processes) whose cells are read across the runs: "
                         "each run's samples at equal weight, the median between the runs' medians")
    ap.add_argument("--no-plots", action="store_true", help="write no PNG files")
    ap.add_argument("--gzip", action="store_true",
                    help="write results.json.gz (the committed folders' form); also the default when "
                         "any run given is in that form")
    args = ap.parse_args(argv)
    combine = [n for n in args.combine.split(",") if n]
    out = Path(args.out)
    try:
        # checked before anything is read or written: an unknown name was taken silently (and combined
        # nothing), and an out that could not be made ended in a traceback after the merge
        from .registry import names
        unknown = [n for n in combine if n not in names()]
        if unknown:
            raise ValueError(f"--combine: {', '.join(unknown)} not an experiment; the experiments are "
                             f"{', '.join(names())}")
        if out.exists() and not out.is_dir():
            raise ValueError(f"{out}: not a folder (the merged results are written into a folder)")
        parts = [load(r) for r in args.runs]
        res = merge(parts, combine=combine, pool=[n for n in args.pool.split(",") if n])
        out.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        print(f"ewkern.bench.merge: {exc}", file=sys.stderr)
        return 2
    for note in res["notes"]:
        print(f"note: {note}", file=sys.stderr)
    if args.gzip or any(p.get("_gzip") for p in parts):
        res["_gzip"] = True
    from .runner import finish_outputs
    finish_outputs(res, out, plots=not args.no_plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
