#!/usr/bin/env bash
# The GPU machine's check, in one call: build in place with that machine's python3 (torch,
# CuPy, NumPy preinstalled, no network), run the whole test suite with the GPU tests, then a
# quick benchmark. Usage (from the repo root, with the tvm-ffi wheel carried in .whl/ for the
# DLPack header, see README "GPU machine"):
#     bash scripts/gpu-check.sh [ewkern.bench arguments, e.g. peers --quick]
# Output is kept short; full logs go to $OUT (or ./gpu-check-out) when set. The whole suite takes
# about 10 minutes on an H100 or an H200 (16 cores, 2026-11-26), more than one device call's 600 s:
# run it in two calls, GPU_CHECK_TESTS="tests --ignore=tests/test_torch.py" then
# GPU_CHECK_TESTS=tests/test_torch.py (about 8.5 and 2 minutes). GPU_CHECK_TESTS names any files
# (one call each part; on a machine still warm from the last call the same tree is not built again);
# GPU_CHECK_TESTS=none skips the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-gpu-check-out}
mkdir -p "$OUTDIR"
if ls .whl/apache_tvm_ffi-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ewkern-site .whl/apache_tvm_ffi-*.whl \
        >/dev/null && export PYTHONPATH=/tmp/ewkern-site${PYTHONPATH:+:$PYTHONPATH}
fi
export EWKERN_CUDA_ARCHS=${EWKERN_CUDA_ARCHS:-90}
# the tree travels without .git: name the commit for the results (set by the caller)
export EWKERN_GIT_COMMIT=${EWKERN_GIT_COMMIT:-}
export EWKERN_NVCC_THREADS=${EWKERN_NVCC_THREADS:-4}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# A warm machine keeps the in-place build between calls: a stamp of the sources, the archs and the
# commit lets the next call of the same tree skip the build (GPU_CHECK_REBUILD=1 forces it).
stamp=$( (cat setup.py csrc/*.[ch] csrc/*.def csrc/cpu/* csrc/cuda/*; echo "$EWKERN_CUDA_ARCHS $EWKERN_GIT_COMMIT") \
        | sha1sum | cut -c1-16)
if [ "${GPU_CHECK_REBUILD:-0}" = 0 ] && [ "$(cat ewkern/.gpu-check-stamp 2>/dev/null)" = "$stamp" ] \
        && ls ewkern/_C*.so >/dev/null 2>&1; then
    echo "== build: this tree's build is already here (stamp $stamp)"
else
    echo "== build (archs $EWKERN_CUDA_ARCHS)"
    t0=$(date +%s)
    rm -f ewkern/.gpu-check-stamp
    python3 setup.py -q build_ext --inplace >"$OUTDIR/build.log" 2>&1 || { tail -40 "$OUTDIR/build.log"; exit 1; }
    echo "$stamp" > ewkern/.gpu-check-stamp
    echo "built in $(( $(date +%s) - t0 )) s (stamp $stamp)"
fi
rc=0
if [ "${GPU_CHECK_TESTS:-tests}" != none ]; then
    echo "== tests ${GPU_CHECK_TESTS:-tests}"
    # shellcheck disable=SC2086
    python3 -m pytest -q -p no:cacheprovider ${GPU_CHECK_TESTS:-tests} -x -rs --timeout=600 >"$OUTDIR/pytest.log" 2>&1
    rc=$?
    grep -E "passed|failed|error" "$OUTDIR/pytest.log" | tail -3
    [ $rc -ne 0 ] && { grep -E "^(FAILED|ERROR)|Error|assert" "$OUTDIR/pytest.log" | head -40; }
fi
if [ $# -gt 0 ]; then
    # arguments go to the harness as they are, e.g. "peers --quick" or "--all"
    echo "== bench $*"
    PYTHONUNBUFFERED=1 python3 -m ewkern.bench "$@" --no-progress --out "$OUTDIR/bench" >"$OUTDIR/bench.log" 2>&1
    brc=$?
    tail -60 "$OUTDIR/bench.log"
    (cd "$OUTDIR" && tar czf bench.tgz bench && rm -rf bench)
    [ $brc -ne 0 ] && rc=$brc
fi
exit $rc
