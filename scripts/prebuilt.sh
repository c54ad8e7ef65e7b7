#!/usr/bin/env bash
# Carry the extension built on the CPU machine instead of building it on the GPU machine (60-85 s
# of device time a call).
#     bash scripts/prebuilt.sh prepare          # here: ewkern._C for CPython 3.12 (the GPU machine's
#                                               # python3), sm_90, into probe-out/c312.so.xz (git-ignored)
#     bash scripts/prebuilt.sh unpack COMMIT    # there, first in the command, with carry ["probe-out"]
# unpack writes ewkern/_C.cpython-312-x86_64-linux-gnu.so and the build stamp of this tree for COMMIT
# (scripts/build-stamp.sh), so gpu-check.sh and probe-run.sh given the same COMMIT skip the build;
# gpu-check.sh (and so probe-run.sh) also unpacks it by itself where the carried extension's sources
# (probe-out/c312.stamp, written by prepare) are the tree's and the machine has no build of it.
# The tree that travels must be the tree built here (commit or leave untracked-not-ignored what it
# needs). PY312 names a Python 3.12 (default: python3.12 on PATH, else pyenv's); prepare makes
# .deps/py312 with numpy and apache-tvm-ffi (the DLPack header) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
SO=ewkern/_C.cpython-312-x86_64-linux-gnu.so
case "${1:-}" in
prepare)
    py=
    for c in ${PY312:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
        if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then py=$c; break; fi
    done
    [ -n "$py" ] || { echo "prebuilt.sh: no Python 3.12 found (set PY312)"; exit 2; }
    venv=.deps/py312
    if [ ! -x "$venv/bin/python" ]; then
        "$py" -m venv "$venv"
        "$venv/bin/python" -m pip install -q numpy setuptools apache-tvm-ffi
    fi
    EWKERN_CUDA_ARCHS=90 EWKERN_NVCC_THREADS=${EWKERN_NVCC_THREADS:-2} "$venv/bin/python" setup.py -q build_ext --inplace
    mkdir -p probe-out
    xz -9 -T2 -c "$SO" > probe-out/c312.so.xz
    # the sources' stamp, by which gpu-check.sh unpacks it by itself on a machine without this build
    bash scripts/build-stamp.sh 90 prebuilt > probe-out/c312.stamp
    ls -l probe-out/c312.so.xz
    ;;
unpack)
    [ -n "${2:-}" ] || { echo "usage: bash scripts/prebuilt.sh unpack COMMIT"; exit 2; }
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open('probe-out/c312.so.xz'), open(sys.argv[1], 'wb'))" "$SO"
    bash scripts/build-stamp.sh 90 "$2" > ewkern/.gpu-check-stamp
    ;;
*)
    sed -n 2,12p "$0"
    exit 2
    ;;
esac
