#!/usr/bin/env bash
# Nsight Compute on the fused expressions' cold launches, ewkern's kernel against torch.compile's
# (scripts/fused_cold_probe.py), summarised by NVTX range (scripts/ncu_by_range.py):
#     bash scripts/fused_ncu.sh LABEL EXPR[,EXPR...] DTYPE SIZE     (EWKERN_PDL=0 in the environment
#                                                                   for the launches without PDL;
#                                                                   FUSED_BLOCKS=128,512: block_size= ways)
# Writes $OUT/ncu-LABEL.{ncu-rep,csv,txt}. Clocks are left alone; ncu flushes the caches before
# each kernel (--cache-control all).
set -euo pipefail
cd "$(dirname "$0")/.."
label=$1 exprs=$2 dtype=$3 size=$4
out=${OUT:-ncu-out}
mkdir -p "$out"
rep="$out/ncu-$label"
metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread
inc=()
for e in ${exprs//,/ }; do
    for w in ewkern torch.compile ${FUSED_BLOCKS:+$(printf 'ewkern_b%s ' ${FUSED_BLOCKS//,/ })}; do
        inc+=(--nvtx-include "$e $dtype $size ${w/_/ }/")
    done
done
ncu --clock-control none --cache-control all --nvtx "${inc[@]}" --metrics "$metrics" -f -o "$rep" \
    python3 scripts/fused_cold_probe.py "$exprs" "$dtype" "$size" >"$rep.log" 2>&1 || { tail -30 "$rep.log"; exit 1; }
ncu -i "$rep.ncu-rep" --csv --page raw --metrics "$metrics" >"$rep.csv" 2>/dev/null
python3 scripts/ncu_by_range.py "$rep.csv" | tee "$rep.txt"
