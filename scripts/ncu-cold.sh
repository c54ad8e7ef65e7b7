#!/usr/bin/env bash
# Nsight Compute on queued cold launches (the single-launch method's conditions: L2 flushed, the
# stream held by a sleep kernel) of one ewkern op and torch's, on the GPU machine after a build:
#     bash scripts/ncu-cold.sh OP DTYPE SIZE[,SIZE...] [extra ncu arguments]
# e.g. bash scripts/ncu-cold.sh copy float32 1MiB,16MiB. Writes $OUT/ncu-OP-DTYPE.ncu-rep (or
# ./ncu-out) and prints, per launch, the duration, grid, registers, achieved occupancy, DRAM
# throughput and bytes of every kernel (the probe's flush and sleep kernels included; the NVTX
# range names the timed ones). The clocks are left alone (--clock-control none: ncu would otherwise
# lock them to base); ncu flushes the caches before each replay pass (its default), so every pass
# sees the launch cold. Not run on a GPU yet.
set -euo pipefail
cd "$(dirname "$0")/.."
op=$1 dtype=$2 sizes=$3
shift 3
out=${OUT:-ncu-out}
mkdir -p "$out"
rep="$out/ncu-$op-$dtype"
metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread
metrics=$metrics,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max
ncu --clock-control none --cache-control all --nvtx \
    --metrics "$metrics" "$@" -f -o "$rep" python3 scripts/speed_probe.py cold "$op" "$dtype" "$sizes" >"$rep.log" 2>&1 \
    || { tail -20 "$rep.log"; exit 1; }
ncu -i "$rep.ncu-rep" --csv --page raw \
    --metrics "$metrics" >"$rep.csv" 2>/dev/null || ncu -i "$rep.ncu-rep" --csv --page raw >"$rep.csv"
python3 - "$rep.csv" <<'P'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units, data = rows[0], rows[1], rows[2:]
want = ["gpu__time_duration.sum", "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes_read.sum", "dram__bytes_write.sum"]
name = head.index("Kernel Name")
nvtx = next((i for i, h in enumerate(head) if h.startswith("thread_domain") or "NVTX" in h), None)
cols = [head.index(w) for w in want if w in head]
print(" | ".join(["range", "kernel"] + [f"{head[c]} ({units[c]})" for c in cols]))
for r in data:
    print(" | ".join([r[nvtx] if nvtx is not None else "-", r[name][:40]] + [r[c] for c in cols]))
P
