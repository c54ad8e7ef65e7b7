#!/usr/bin/env bash
# Pack a device call's $OUT into one file, so that runs of many folders come back whole (the device
# tool returns at most 8 files, 16 MiB each, no more than 2 folders down: a `--processes 3` run
# is already 8 files, and a second run's files are left out). At the end of a call:
#     bash scripts/pack-out.sh [NAME]          (NAME: the archive, default out)
# keeps every results.json / results.json.gz and summary.md under $OUT (results.json gzipped), drops
# the PNG and CSV files (merge makes them again), and writes $OUT/NAME.tgz in their place; the
# logs at $OUT's top level stay beside it. Unpack here with `tar xzf <files_at>/NAME.tgz -C DIR`.
set -euo pipefail
out=${OUT:?set OUT to the device call output folder}
name=${1:-out}
cd "$out"
find . -mindepth 2 \( -name '*.png' -o -name '*.csv' \) -delete
find . -mindepth 2 -name results.json -exec gzip -f {} \;
dirs=$(find . -mindepth 1 -maxdepth 1 -type d -printf '%P\n')
if [ -z "$dirs" ]; then
    echo "pack-out: no folders under $out" >&2
    exit 0
fi
# shellcheck disable=SC2086
tar czf "$name.tgz" $dirs
# shellcheck disable=SC2086
rm -rf $dirs
ls -la "$name.tgz"
