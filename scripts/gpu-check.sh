#!/usr/bin/env bash
# The GPU machine's check, in one call: build in place with that machine's python3 (torch,
# CuPy, NumPy preinstalled, no network), run the whole test suite with the GPU tests, then a
# quick benchmark. Usage (from the repo root, with the tvm-ffi wheel carried in .whl/ for the
# DLPack header, see README "GPU machine"):
#     bash scripts/gpu-check.sh [ewkern.bench arguments, e.g. peers --quick]
# Output is kept short; full logs go to $OUT (or ./gpu-check-out) when set. In one process the
# whole suite took about 11 minutes of tests on the H200 (2026-11-26: 266 + 290 + 96 s in three
# calls), more than one device call's 600 s. Where pytest-xdist imports (the GPU machine's image
# has it) the tests run in GPU_CHECK_JOBS processes (default 8 with 16 cores or more, else 4; 1:
# one process), then the tests marked serial alone. GPU_CHECK_TESTS names the files (default: tests; parts in separate calls
# where one call cannot hold them: on a machine still warm from the last call the same tree is not
# built again); GPU_CHECK_TESTS=none skips the tests. GPU_CHECK_SHARD=k/n runs shard k (0-based) of
# n of the tests (EWKERN_TEST_SHARD, tests/conftest.py: by a hash of each test's id), so that
# `GPU_CHECK_SHARD=0/2` and `1/2` in two calls run the whole suite: on 2026-11-29 one call of 560 s
# held 99% of the parallel part on the H200 and none of the serial tests.
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
# commit lets the next call of the same tree skip the build (GPU_CHECK_REBUILD=1 forces it); so does
# an extension built elsewhere and unpacked with its stamp (scripts/prebuilt.sh).
stamp=$(bash scripts/build-stamp.sh "$EWKERN_CUDA_ARCHS" "$EWKERN_GIT_COMMIT")
# An extension carried from the CPU machine (probe-out/c312.so.xz, scripts/prebuilt.sh prepare) is
# unpacked here when its sources' stamp is this tree's, so that a call on a fresh machine (a warm
# one is given back after 30 s idle) does not build, whether or not the command unpacked it first
# (given the commit label the unpacked build's stamp carries: prebuilt.sh unpack needs one).
if [ "${GPU_CHECK_REBUILD:-0}" = 0 ] && [ -n "$EWKERN_GIT_COMMIT" ] \
        && [ "$(cat ewkern/.gpu-check-stamp 2>/dev/null)" != "$stamp" ] \
        && [ "$EWKERN_CUDA_ARCHS" = 90 ] && [ -f probe-out/c312.so.xz ] \
        && [ "$(cat probe-out/c312.stamp 2>/dev/null)" = "$(bash scripts/build-stamp.sh 90 prebuilt)" ] \
        && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    bash scripts/prebuilt.sh unpack "$EWKERN_GIT_COMMIT" && echo "== build: the carried extension of this tree, unpacked"
fi
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
report() {   # a pytest log's last counts, and its failures when it failed
    grep -E "passed|failed|error|skipped|deselected|no tests ran" "$1" | tail -3
    [ "$2" -ne 0 ] && [ "$2" -ne 5 ] && { grep -E "^(FAILED|ERROR)|Error|assert" "$1" | head -40; }
}
if [ -n "${GPU_CHECK_SHARD:-}" ]; then
    export EWKERN_TEST_SHARD=$GPU_CHECK_SHARD
    echo "== shard $GPU_CHECK_SHARD of the tests"
fi
if [ "${GPU_CHECK_TESTS:-tests}" != none ]; then
    TESTS=${GPU_CHECK_TESTS:-tests}
    # default: 8 processes where the machine has 16 cores or more (the H200's 16: the whole suite
    # in 5:17 on 611a28c, against 6:05-8:22 with 4), else 4
    cores=$(nproc 2>/dev/null || echo 4)
    JOBS=${GPU_CHECK_JOBS:-$([ "$cores" -ge 16 ] && echo 8 || echo 4)}
    if [ "$JOBS" -gt 1 ] && python3 -c "import xdist" 2>/dev/null; then
        # Much of the suite's time should be host work (float64 NumPy references, compiles; not
        # yet timed on a GPU): JOBS test processes share the GPU (pytest-xdist, on the GPU
        # machine's image). The tests marked serial size themselves by the device's free memory
        # (2^31-element arrays, the leak check), so they run afterwards in one process, with the
        # device to themselves.
        echo "== tests $TESTS ($JOBS processes, then the serial ones)"
        # shellcheck disable=SC2086
        # --maxfail, not -x: one failure (on 6f2e01b a timing-sensitive test under the 8
        # processes' load) stopped every process and left the rest of the suite and the serial
        # tests unrun for that call; now a call reports up to 10 failures and runs the serial tests
        # whatever the parallel part gave.
        python3 -m pytest -q -p no:cacheprovider -n "$JOBS" -m "not serial" $TESTS --maxfail=10 -rs --timeout=600 \
            >"$OUTDIR/pytest.log" 2>&1
        rc=$?
        report "$OUTDIR/pytest.log" $rc
        # shellcheck disable=SC2086
        python3 -m pytest -q -p no:cacheprovider -m serial $TESTS --maxfail=10 -rs --timeout=600 \
            >"$OUTDIR/pytest-serial.log" 2>&1
        rc2=$?
        report "$OUTDIR/pytest-serial.log" $rc2
        # 5: nothing collected (files without serial tests, or none at all)
        [ $rc -eq 5 ] && rc=$rc2
        [ $rc2 -ne 5 ] && [ $rc2 -ne 0 ] && rc=$rc2
        [ $rc -eq 5 ] && rc=0
    else
        echo "== tests $TESTS"
        # shellcheck disable=SC2086
        python3 -m pytest -q -p no:cacheprovider $TESTS --maxfail=10 -rs --timeout=600 >"$OUTDIR/pytest.log" 2>&1
        rc=$?
        report "$OUTDIR/pytest.log" $rc
    fi
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
