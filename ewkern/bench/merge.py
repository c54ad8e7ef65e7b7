"""python -m ewkern.bench.merge OUT RUN [RUN ...]: one results folder from runs in parts on one GPU.

Every experiment at full size can outlast a job's time limit (the GPU machines here allow 10
minutes a command). Run the experiments in parts, each into its own folder, then merge:

    python -m ewkern.bench --out part1 e1 e2 e3 e4 e5 e6 e7 e8 e9 v1 r1 a1 peers overhead c1
    python -m ewkern.bench --out part2 rmse_grid
    python -m ewkern.bench.merge results/<gpu> part1 part2

The merged results.json holds every part's experiments (a later part's experiment replaces an
earlier one's of the same name, and says so; with --combine NAMES those experiments' measurements
are joined instead, for one experiment run in parts, such as rmse_grid's dtypes; a cell measured
in both keeps the later part's), the first part's run metadata, and under "parts"
each part's own: folder, command line, start and finish, git commit, ewkern and torch versions,
and the experiments it still gives (a merged folder given as a part brings its own parts; a part
whose experiments all were replaced is left out).
Claims, CSVs, figures and summary.md are then made from the merged measurements exactly as a
single run makes them. Parts measured on different GPUs are refused; parts built from different
commits are merged with a warning on stderr and in the results ("notes").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .results import load

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
# that are strings, integers or None (ratios to other ways "vs_*", the reference check's "check_*",
# summary statistics "t_*"; no experiment names a cell by a float, and floats such as after_torch's
# pair_time_s, a1's total_error or overhead's us_per_call are measured)
_MEASURED = frozenset(("samples_s", "stats_s", "time_s", "gbs", "pct_peak", "notes", "launches", "sets",
                       "working_set_bytes", "bytes", "bytes_read", "bytes_written", "best_way"))
_DERIVED = ("vs_", "check_", "t_")


def _cell(m: dict) -> tuple:
    """The cell a measurement belongs to (experiment, series, impl, op, dtype, size, method...)."""
    return tuple(sorted((k, v) for k, v in m.items()
                        if k not in _MEASURED and not k.startswith(_DERIVED)
                        and isinstance(v, (str, int, bool, type(None)))))


def _combine(a: dict, b: dict) -> dict:
    """One experiment measured in two parts (for example rmse_grid's dtypes in two runs): the
    measurements of both (a cell measured in both parts keeps the later part's, so a re-run of some
    cells replaces them), their notes, skips and errors, the union of their parameters."""
    out = dict(a)
    later = list(b.get("measurements") or [])
    again = {_cell(m) for m in later}
    out["measurements"] = [m for m in (a.get("measurements") or []) if _cell(m) not in again] + later
    for k in ("notes", "skipped", "errors"):
        out[k] = _union(list(a.get(k) or []), list(b.get(k) or []))
    out["params"] = _union(a.get("params") or {}, b.get("params") or {})
    out["tables"] = {**(a.get("tables") or {}), **(b.get("tables") or {})}
    out["elapsed_s"] = round((a.get("elapsed_s") or 0.0) + (b.get("elapsed_s") or 0.0), 3)
    statuses = [a.get("status"), b.get("status")]
    out["status"] = "ok" if statuses == ["ok", "ok"] else next(s for s in statuses if s != "ok")
    out["reason"] = a.get("reason") or b.get("reason")
    return out


def merge(parts: list, combine=()) -> dict:
    """The merged results dict of results dicts (as ``results.load`` returns them), in order.
    Experiments named in combine that appear in several parts are combined (_combine); any
    other experiment of a later part replaces the earlier one's."""
    if not parts:
        raise ValueError("merge needs at least one run")
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
            if name in res["experiments"] and name in combine:
                notes.append(f"{name}: the run in {p.get('_path')} is combined with the earlier part's")
                exp = _combine(res["experiments"][name], exp)
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
    ap.add_argument("out", help="the folder to write (made if absent; its results.json is replaced)")
    ap.add_argument("runs", nargs="+", help="run folders (each holding results.json), in order")
    ap.add_argument("--combine", default="", metavar="NAMES",
                    help="experiments measured in parts (e.g. rmse_grid's dtypes in two runs) whose "
                         "measurements are joined instead of the later replacing the earlier")
    ap.add_argument("--no-plots", action="store_true", help="write no PNG files")
    args = ap.parse_args(argv)
    try:
        parts = [load(r) for r in args.runs]
        res = merge(parts, combine=[n for n in args.combine.split(",") if n])
    except (OSError, ValueError) as exc:
        print(f"ewkern.bench.merge: {exc}", file=sys.stderr)
        return 2
    for note in res["notes"]:
        print(f"note: {note}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from .runner import finish_outputs
    finish_outputs(res, out, plots=not args.no_plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
