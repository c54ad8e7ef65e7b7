"""Summarise an Nsight Compute raw CSV (ncu -i REP --csv --page raw) by NVTX range and kernel: the
launches, the median and range of gpu__time_duration.sum, grid, block and registers.

    python3 scripts/ncu_by_range.py REP.csv"""
import csv
import statistics
import sys
from collections import defaultdict

rows = list(csv.reader(open(sys.argv[1])))
head, units, data = rows[0], rows[1], rows[2:]
col = {h: i for i, h in enumerate(head)}
nvtx = next((i for i, h in enumerate(head) if h.startswith("thread_domain") or "nvtx" in h.lower()
             or "push/pop" in h.lower()), None)
block = col.get("launch__block_size")
groups = defaultdict(list)
for r in data:
    # the range's field reads '484  "<default domain>:NAME:none:...': NAME
    rng = r[nvtx].split(":")[1] if nvtx is not None and r[nvtx].count(":") > 1 else "-"
    # the block size too: without an NVTX column, launches of one kernel in other blocks stay apart
    key = (rng, r[col["Kernel Name"]][:60], r[block] if block is not None else "")
    groups[key].append(r)
dur = "gpu__time_duration.sum"
print(f"duration unit: {units[col[dur]]}")
for (rng, kern, _), rs in groups.items():
    d = sorted(float(r[col[dur]].replace(",", "")) for r in rs)
    extra = " ".join(f"{m.split('__')[1]}={rs[0][col[m]]}" for m in
                     ("launch__grid_size", "launch__block_size", "launch__registers_per_thread") if m in col)
    print(f"{rng[-40:]:40s} | {kern:60s} | n {len(d)} median {statistics.median(d):.3f} "
          f"[{d[0]:.3f}, {d[-1]:.3f}] {extra}")
