"""Result files: results.json (everything), one CSV per experiment, and loading them back.

A folder holds results.json, or results.json.gz in its place: the committed folders under results/
keep the gzip form (every raw sample of every merged run; about a sixth of the size, and the tree a
GPU machine's call carries is limited). load() reads either; write_json() keeps the folder's form,
or writes the gzip form when the results dict asks for it (its "_gzip" key, `merge --gzip`)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
from pathlib import Path

__all__ = ["load", "results_file", "write_json", "write_csvs", "outputs_of", "remove_outputs", "measurements",
           "CSV_FIRST", "JSON_NAMES"]

JSON_NAMES = ("results.json", "results.json.gz")

CSV_FIRST = ["experiment", "series", "impl", "op", "variant", "resolved_variant", "dtype", "shape",
             "n", "size_bytes", "cache", "bytes_read", "bytes_written", "bytes", "time_s", "gbs",
             "pct_peak", "launches", "sets", "working_set_bytes"]
_STAT_COLS = ["t_min_s", "t_median_s", "t_mean_s", "t_std_s", "t_max_s", "count"]


def results_file(folder) -> Path | None:
    """A run folder's results file: results.json, else results.json.gz; None if it has neither."""
    for name in JSON_NAMES:
        p = Path(folder) / name
        if p.is_file():
            return p
    return None


def load(results_dir) -> dict:
    """The results dict of a run: a folder holding results.json (or results.json.gz), or the file
    itself. A dict read from the gzip form carries "_gzip" (write_json keeps that form)."""
    p = Path(results_dir)
    if p.is_dir():
        p = results_file(p) or p / "results.json"
    if not p.exists():
        raise FileNotFoundError(f"no results.json at {results_dir}")
    gz = p.name.endswith(".gz")
    try:
        with (gzip.open(p, "rt") if gz else open(p)) as f:
            res = json.load(f)
    except (ValueError, EOFError, gzip.BadGzipFile) as exc:
        # a log or summary.md given for a run: the bare JSON error ("Expecting value: line 1 column 1")
        # did not say which file
        raise ValueError(f"{p}: not a results file (results.json or results.json.gz of a run): "
                         f"{type(exc).__name__}: {exc}") from None
    if not isinstance(res, dict):
        raise ValueError(f"{p}: not a results file (its JSON is a {type(res).__name__}, not a run's object)")
    res.setdefault("experiments", {})
    res["_path"] = str(p.parent)
    if gz:
        res["_gzip"] = True
    return res


def measurements(results: dict, experiment: str, **match) -> list[dict]:
    """The measurements of one experiment whose fields equal the given values."""
    exp = results.get("experiments", {}).get(experiment) or {}
    out = []
    for m in exp.get("measurements", []):
        if all(m.get(k) == v for k, v in match.items()):
            out.append(m)
    return out


def _clean(v):
    """Plain JSON: NaN becomes null, infinities the largest doubles, unknown objects strings."""
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else math.copysign(1.7976931348623157e308, v)
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if hasattr(v, "item"):
        try:
            return _clean(v.item())
        except (TypeError, ValueError):
            pass
    return str(v)


def write_json(results: dict, out: Path):
    """results.json in out, or results.json.gz where results asks for it ("_gzip") or out already
    holds that form; the other form's file, if any, is removed (a folder holds one)."""
    out = Path(out)
    gz = bool(results.get("_gzip")) or (out / JSON_NAMES[1]).is_file()
    name, other = (JSON_NAMES[1], JSON_NAMES[0]) if gz else JSON_NAMES
    tmp = out / (name + ".tmp")
    data = _clean({k: v for k, v in results.items() if not k.startswith("_")})
    if gz:   # mtime 0: the same results give the same bytes
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(json.dumps(data, indent=1, allow_nan=False).encode())
    else:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, allow_nan=False)
    os.replace(tmp, out / name)
    if (out / other).is_file():
        os.remove(out / other)


def _cell(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return "x".join(str(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return "" if v is None else v


def _csv_tables(results: dict):
    """(file name, rows, table name or None for the measurements) of every CSV write_csvs writes."""
    for name, exp in results.get("experiments", {}).items():
        if exp.get("measurements"):
            yield f"{name}.csv", exp["measurements"], None
        for tname, trows in (exp.get("tables") or {}).items():
            if trows:
                yield f"{name}_{tname}.csv", trows, tname


def write_csvs(results: dict, out: Path) -> list[str]:
    """One CSV per experiment with measurements (raw samples, every *samples_s, stay in the JSON),
    one per table."""
    written = []
    for fname, rows, table in _csv_tables(results):
        keys = []
        for r in rows:
            for k in r:
                if k not in keys and (table is not None or (not k.endswith("samples_s")
                                                            and k not in ("stats_s", "experiment_data"))):
                    keys.append(k)
        path = Path(out) / fname
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            if table is not None:
                w.writerow(keys)
                for r in rows:
                    w.writerow([_cell(r.get(k)) for k in keys])
            else:
                cols = [k for k in CSV_FIRST if k in keys] + _STAT_COLS + [k for k in keys if k not in CSV_FIRST]
                w.writerow(cols)
                for r in rows:
                    st = r.get("stats_s") or {}
                    stat = {"t_min_s": st.get("min"), "t_median_s": st.get("median"),
                            "t_mean_s": st.get("mean"), "t_std_s": st.get("std"),
                            "t_max_s": st.get("max"), "count": st.get("count")}
                    w.writerow([_cell(stat[c] if c in stat else r.get(c)) for c in cols])
        written.append(fname)
    return written


def _output_name(name) -> bool:
    """Whether name can be one of the harness's CSV or PNG outputs: a file name in the folder itself
    (a results file's record is data, never a path to follow elsewhere)."""
    return isinstance(name, str) and Path(name).name == name and name.endswith((".csv", ".png"))


def outputs_of(folder) -> set:
    """The CSVs and figures the harness wrote into folder, by the folder's results file: the CSVs its
    experiments give (write_csvs) and the figures it lists. Empty where no results file can be read."""
    try:
        res = load(folder) if results_file(folder) is not None else None
        names = [] if res is None else [fname for fname, _, _ in _csv_tables(res)] + list(res.get("figures") or [])
    except (OSError, ValueError, AttributeError, TypeError):   # a damaged file names nothing to remove
        return set()
    return {n for n in names if _output_name(n)}


def remove_outputs(folder, names) -> list[str]:
    """Remove from folder the files among names that are CSV or PNG files of the folder itself (plain
    files only); the names removed, sorted."""
    removed = []
    for name in sorted(n for n in names if _output_name(n)):
        path = Path(folder) / name
        if path.is_file() or path.is_symlink():
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(name)
    return removed
