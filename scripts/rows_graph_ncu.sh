#!/usr/bin/env bash
# Nsight Compute over scripts/rows_graph_probe.py's graphs (whole graphs, then each kernel alone):
#     bash scripts/rows_graph_ncu.sh SIZE DTYPE VARIANTS [K]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-ncu-out}; mkdir -p "$out"
m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
m=$m,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,sm__cycles_active.avg
tag="$1-$2"
python3 scripts/rows_graph_probe.py "$@" 2>&1 | grep -v Warn
ncu --clock-control none --graph-profiling graph --nvtx --metrics "$m" -f -o "$out/graph-$tag" \
    python3 scripts/rows_graph_probe.py "$@" > "$out/graph-$tag.log" 2>&1 || tail -5 "$out/graph-$tag.log"
ncu -i "$out/graph-$tag.ncu-rep" --csv --page raw --metrics "$m" > "$out/graph-$tag.csv" 2>/dev/null
ncu --clock-control none --nvtx -k regex:probe_mse --launch-skip 0 --launch-count 400 --metrics "$m" -f -o "$out/node-$tag" \
    python3 scripts/rows_graph_probe.py "$@" > "$out/node-$tag.log" 2>&1 || tail -5 "$out/node-$tag.log"
ncu -i "$out/node-$tag.ncu-rep" --csv --page raw --metrics "$m" > "$out/node-$tag.csv" 2>/dev/null
python3 - "$out/graph-$tag.csv" "$out/node-$tag.csv" <<'P'
import csv, sys, statistics, collections
for f in sys.argv[1:]:
    rows = list(csv.reader(open(f)))
    if len(rows) < 3:
        print(f, "empty"); continue
    head, units, data = rows[0], rows[1], rows[2:]
    nv = next((i for i, h in enumerate(head) if h.startswith("thread_domain") or "NVTX" in h), None)
    name = head.index("Kernel Name") if "Kernel Name" in head else None
    cols = [i for i, h in enumerate(head) if h.split(".")[0] in ("gpu__time_duration", "dram__bytes_read", "dram__bytes_write",
            "lts__t_sector_hit_rate", "lts__t_sectors_srcunit_tex_op_read", "lts__t_sectors_srcunit_tex_op_read_lookup_hit",
            "sm__cycles_active") or h.startswith("lts__t_sectors_srcunit")]
    groups = collections.defaultdict(list)
    for r in data:
        key = (r[nv] if nv is not None else "-")[:60] + " | " + (r[name][:30] if name is not None else "")
        groups[key].append(r)
    print("==", f)
    for key, rs in groups.items():
        vals = []
        for c in cols:
            try:
                xs = [float(r[c].replace(",", "")) for r in rs]
                vals.append(f"{head[c]}={statistics.median(xs):.4g}{units[c]}")
            except ValueError:
                pass
        print(f"{key} n={len(rs)}: " + " ".join(vals))
P
