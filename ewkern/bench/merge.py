"""python -m ewkern.bench.merge OUT RUN [RUN ...]: one results folder from runs in parts on one GPU.

Every experiment at full size can outlast a job's time limit (the GPU machines here allow 10
minutes a command). Run the experiments in parts, each into its own folder, then merge:

    python -m ewkern.bench --out part1 e1 e2 e3 e4 e5 e6 e7 e8 e9 v1 r1 a1 peers overhead c1
    python -m ewkern.bench --out part2 rmse_grid
    python -m ewkern.bench.merge results/<gpu> part1 part2

The merged results.json holds every part's experiments (a later part's experiment replaces an
earlier one's of the same name, and says so), the first part's run metadata, and under "parts"
each part's own: folder, command line, start and finish, git commit, ewkern and torch versions.
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

_PART_KEYS = ("argv", "started", "finished", "git", "versions", "pdl", "cache", "quick", "partial", "elapsed_s")


def merge(parts: list) -> dict:
    """The merged results dict of results dicts (as ``results.load`` returns them), in order."""
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
        res["parts"].append({"folder": p.get("_path"), **{k: p.get(k) for k in _PART_KEYS},
                             "experiments": list(p.get("experiments", {}))})
        for name, exp in p.get("experiments", {}).items():
            if name in res["experiments"]:
                notes.append(f"{name}: the run in {p.get('_path')} replaces the earlier part's")
            res["experiments"][name] = exp
    commits = {(p.get("git") or {}).get("commit") for p in parts}
    if len(commits) > 1:
        notes.append("the parts were built from different commits: "
                     + ", ".join(str(c) for c in commits))
    res["started"] = min((p["started"] for p in parts if p.get("started")), default=None)
    finished = [p["finished"] for p in parts if p.get("finished")]
    res["finished"] = max(finished) if len(finished) == len(parts) else None
    res["elapsed_s"] = round(sum(p.get("elapsed_s") or 0.0 for p in parts), 3)
    res["partial"] = any(p.get("partial") for p in parts)
    res["interrupted"] = any(p.get("interrupted") for p in parts)
    res["notes"] = list(res.get("notes") or []) + notes
    res.pop("claims", None)
    res.pop("figures", None)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ewkern.bench.merge",
                                 description="Merge ewkern.bench runs made in parts on one GPU into one folder.")
    ap.add_argument("out", help="the folder to write (made if absent; its results.json is replaced)")
    ap.add_argument("runs", nargs="+", help="run folders (each holding results.json), in order")
    ap.add_argument("--no-plots", action="store_true", help="write no PNG files")
    args = ap.parse_args(argv)
    try:
        parts = [load(r) for r in args.runs]
        res = merge(parts)
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
