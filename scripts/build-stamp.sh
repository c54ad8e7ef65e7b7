#!/usr/bin/env bash
# The stamp gpu-check.sh keeps beside an in-place build (ewkern/.gpu-check-stamp): a hash of the
# sources (not the notes beside them), the archs and the commit label, so a later call on the same
# tree skips the build.
# Usage, from anywhere: bash scripts/build-stamp.sh ARCHS COMMIT
cd "$(dirname "$0")/.." || exit 1
shopt -s nullglob
(cat setup.py csrc/*.[ch] ewkern/_torch_native/ewkern_native.h csrc/*.def csrc/cpu/*.[ch] csrc/cuda/*.cu csrc/cuda/*.cuh; echo "$1 $2") | sha1sum | cut -c1-16
