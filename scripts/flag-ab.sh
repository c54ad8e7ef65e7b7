#!/usr/bin/env bash
# Builds of one tree that differ in nvcc flags, timed by the same command, in one GPU call: the tree
# is built in place (gpu-check.sh, tests skipped), then copied once a variant into /tmp/flag-ab/LABEL
# with the objects of SOURCES removed and rebuilt with EWKERN_NVCC_FLAGS=FLAGS; CMD then runs in each
# copy in turn, REPS rounds (variants interleaved, so that drift between runs falls on all alike),
# its lines prefixed with the label. For kernel experiments a -D selects (see the #ifdef it reads).
#     VARIANTS="base:;r32:-DEW_CAP64_REGS=32" SOURCES="csrc/cuda/elementwise_auto.cu" \
#     CMD="python3 scripts/speed_probe.py variants exp float64 auto 16MiB" REPS=2 \
#     bash scripts/flag-ab.sh COMMIT
# VARIANTS: "label:flags" separated by ';' (flags empty: the in-place build as it is).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export EWKERN_GIT_COMMIT=${1:-probe} EWKERN_NVCC_THREADS=${EWKERN_NVCC_THREADS:-16} EWKERN_CUDA_ARCHS=${EWKERN_CUDA_ARCHS:-90}
GPU_CHECK_TESTS=none bash scripts/gpu-check.sh >/tmp/flag-ab-build.log 2>&1 || { cat /tmp/flag-ab-build.log; exit 1; }
export PYTHONPATH=/tmp/ewkern-site
IFS=';' read -ra variants <<< "${VARIANTS:?VARIANTS is empty}"
root=/tmp/flag-ab
rm -rf "$root" && mkdir -p "$root"
for v in "${variants[@]}"; do
    label=${v%%:*} flags=${v#*:}
    dir=$root/$label
    if [ -z "$flags" ]; then
        ln -s "$PWD" "$dir"
        continue
    fi
    mkdir -p "$dir"
    cp -r setup.py csrc ewkern scripts build "$dir"/
    for src in ${SOURCES:?SOURCES is empty}; do
        rm -f "$dir"/build/temp*/cuda/"$(basename "$src")".*.o
    done
    t0=$(date +%s)
    (cd "$dir" && EWKERN_NVCC_FLAGS="$flags" python3 setup.py -q build_ext --inplace >build.log 2>&1) \
        || { tail -30 "$dir/build.log"; exit 1; }
    echo "== $label ($flags): built in $(( $(date +%s) - t0 )) s"
done
for _ in $(seq "${REPS:-1}"); do
    for v in "${variants[@]}"; do
        label=${v%%:*}
        (cd "$root/$label" && bash -c "${CMD:?CMD is empty}" 2>&1) | sed "s/^/$label | /"
    done
done
