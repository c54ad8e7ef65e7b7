#!/usr/bin/env bash
# The launch knobs over cells, one `speed_probe.py variants` process a (cell, knob set): the knobs
# (EWKERN_AUTO_VPT, EWKERN_AUTO_BLOCK, EWKERN_PDL, EWKERN_PDL_PREFETCH) are read once a process.
#     CELLS="copy float32 auto 16MiB/add float32 auto 4MiB" \
#     KNOBS="default:X=1,nopref:EWKERN_PDL_PREFETCH=none,vpt4:EWKERN_AUTO_VPT=4" \
#     PROBE_METHODS=b2b,single REPS=2 bash scripts/knob-sweep.sh
# Cells are separated by '/', knob sets by ',' (label:ENV=V ENV=V); prints one line a run,
# "label | the probe's lines". Inside scripts/probe-run.sh's RUNS, keep ';' out of CELLS.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
IFS='/' read -ra cells <<< "${CELLS:?CELLS is empty}"
IFS=',' read -ra knobs <<< "${KNOBS:-default:X=1}"
for _ in $(seq "${REPS:-1}"); do
    for c in "${cells[@]}"; do
        for k in "${knobs[@]}"; do
            # shellcheck disable=SC2086
            line=$(env ${k#*:} python3 scripts/speed_probe.py variants $c 2>&1 | grep -E "MiB|Error" | tr '\n' ' ')
            echo "${k%%:*} | $line"
        done
    done
done
