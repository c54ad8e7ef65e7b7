#!/usr/bin/env bash
# One device call for probes: build in place (skipped when this tree's build is already there; see
# gpu-check.sh), then run each of RUNS="label|command;label|command" with a time limit of BT seconds
# (default 300), its output in $OUT/b/label.log, and tar $OUT/b into $OUT/b.tgz (the device tool
# brings back a limited number of files). Prints each command's lines starting with "==" or
# naming an error. Usage, from the repo root on the GPU machine:
#     RUNS="copy|python3 scripts/speed_probe.py placement copy float32 16MiB" bash scripts/probe-run.sh COMMIT
# COMMIT (default "probe") labels the build; a knob sweep: scripts/knob-sweep.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export EWKERN_GIT_COMMIT=${1:-probe} EWKERN_NVCC_THREADS=${EWKERN_NVCC_THREADS:-16}
out=${OUT:-probe-out}
GPU_CHECK_TESTS=none bash scripts/gpu-check.sh >/tmp/probe-build.log 2>&1 || { cat /tmp/probe-build.log; exit 1; }
grep -v WARNING /tmp/probe-build.log | head -3
export PYTHONPATH=/tmp/ewkern-site:$PWD
mkdir -p "$out/b"
IFS=';' read -ra runs <<< "${RUNS:-}"
for r in "${runs[@]}"; do
    label=${r%%|*} cmd=${r#*|}
    echo "== $label: $cmd"
    t0=$(date +%s)
    timeout "${BT:-300}" bash -c "$cmd" >"$out/b/$label.log" 2>&1
    rc=$?
    grep -E "^==|Error|error" "$out/b/$label.log" | head -40
    echo "   rc $rc, $(( $(date +%s) - t0 )) s"
done
(cd "$out" && tar czf b.tgz b && rm -rf b)
