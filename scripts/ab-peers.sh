#!/usr/bin/env bash
# A kernel change against its base in one device call: two builds of the tree, then the same
# `ewkern.bench peers` cells timed with each build in alternation (A B A B ...), so that both builds
# meet the same machine state. The device's copy of the tree has no .git, so the base's files
# travel beside it:
#   here:   bash scripts/ab-peers.sh prepare BASE      # writes ab-base/ (git-ignored): the files that
#                                                      # differ from BASE, as BASE has them (a new
#                                                      # file counts once staged: git add)
#   device: (run tool, carry [".whl", "ab-base"])
#           bash scripts/ab-peers.sh run [REPS] -- PEERS ARGUMENTS
#           e.g. bash scripts/ab-peers.sh run 2 -- --peers-ops tanh --peers-dtypes float64
# run: builds the base (a copy of the tree with ab-base/ laid over it, in /tmp/ab-base-tree) and
# the tree itself in parallel, then REPS (default 2) rounds of peers with --no-plots, writing
# $OUT/ab/A1, B1, A2, B2, ... and $OUT/ab.tgz; prints, per cell, ewkern / torch of A and of B (the
# mean over the rounds) and B's time over A's. First used (as a one-off) for the float64 math-first
# change, 2026-11-27 (ELEMENTWISE_NOTES.md, the thirty-first session's section).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
cmd=${1:-}
shift || true
if [ "$cmd" = prepare ]; then
    base=${1:?usage: ab-peers.sh prepare BASE}
    rm -rf ab-base && mkdir ab-base
    git diff --name-only "$base" -- csrc setup.py | while read -r f; do
        mkdir -p "ab-base/$(dirname "$f")"
        # a file the base lacks is recorded as absent
        git show "$base:$f" >"ab-base/$f" 2>/dev/null || { rm -f "ab-base/$f"; echo "$f" >>ab-base/.absent; }
    done
    git rev-parse --short "$base" >ab-base/.commit
    echo "ab-base/: $(find ab-base -type f ! -name '.*' | wc -l) files as $base has them"
    exit 0
fi
[ "$cmd" = run ] || { sed -n 2,16p "$0"; exit 2; }
reps=2
if [ "${1:-}" != "--" ] && [ -n "${1:-}" ]; then reps=$1; shift; fi
[ "${1:-}" = "--" ] && shift
[ -f ab-base/.commit ] || { echo "ab-base/ is missing: run 'ab-peers.sh prepare BASE' here and carry it"; exit 2; }
mkdir -p "${OUT:-ab-out}/ab"
out=$(cd "${OUT:-ab-out}" && pwd)
if ls .whl/apache_tvm_ffi-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ewkern-site .whl/apache_tvm_ffi-*.whl \
        >/dev/null 2>&1 && export PYTHONPATH=/tmp/ewkern-site${PYTHONPATH:+:$PYTHONPATH}
fi
export EWKERN_CUDA_ARCHS=${EWKERN_CUDA_ARCHS:-90} EWKERN_NVCC_THREADS=${EWKERN_NVCC_THREADS:-8}
tree_a=/tmp/ab-base-tree
rm -rf "$tree_a" && mkdir "$tree_a"
tar cf - --exclude=./build --exclude=./results --exclude=./notebooks --exclude=./ab-base --exclude=./.git \
    --exclude=./.venv . | tar xf - -C "$tree_a"
find "$tree_a/ewkern" -name "_C*.so" -delete
(cd ab-base && find . -type f ! -name '.*' -exec cp --parents {} "$tree_a/" \;)
[ -f ab-base/.absent ] && while read -r f; do rm -f "$tree_a/$f"; done <ab-base/.absent
t0=$(date +%s)
base_commit=$(cat ab-base/.commit)
(cd "$tree_a" && EWKERN_GIT_COMMIT=$base_commit python3 setup.py -q build_ext --inplace >"$out/ab/build-A.log" 2>&1) &
pid_a=$!
EWKERN_GIT_COMMIT=${EWKERN_GIT_COMMIT:-ab-B} python3 setup.py -q build_ext --inplace >"$out/ab/build-B.log" 2>&1
rc_b=$?
wait $pid_a
rc_a=$?
echo "built in $(( $(date +%s) - t0 )) s: A (base $base_commit) rc $rc_a, B (this tree) rc $rc_b"
if [ $rc_a -ne 0 ] || [ $rc_b -ne 0 ]; then
    tail -n 20 "$out/ab/build-A.log" "$out/ab/build-B.log"
    exit 1
fi
for r in $(seq "$reps"); do
    for side in A B; do
        tree=$PWD; [ $side = A ] && tree=$tree_a
        (cd "$tree" && PYTHONPATH=$tree${PYTHONPATH:+:$PYTHONPATH} python3 -m ewkern.bench peers "$@" --no-plots --no-progress \
            --out "$out/ab/$side$r" >"$out/ab/$side$r.log" 2>&1)
        echo "$side$r rc $?"
    done
done
python3 - "$out/ab" "$reps" <<'P'
import collections, csv, os, statistics, sys
root, reps = sys.argv[1], int(sys.argv[2])
def method(m):
    return ("single" if "spin" in m else "after" if "torch.mul" in m else "b2b" if "CUDAGraph" in m
            else "host" if "host clock" in m else None)
def load(d):
    t = collections.defaultdict(dict)
    path = os.path.join(root, d, "peers.csv")
    if not os.path.exists(path):
        return t
    for r in csv.DictReader(open(path)):
        if r["experiment"] == "peers" and r["time_s"] and r["size_bytes"] and method(r["method"]):
            t[(r["op"], r["dtype"], int(r["size_bytes"]) >> 20, method(r["method"]))][r["impl"]] = float(r["time_s"])
    return t
runs = {s: [load(f"{s}{i}") for i in range(1, reps + 1)] for s in "AB"}
print("op dtype MiB method | ewkern / peer (torch; NumPy on a CPU) A -> B | B time / A time")
for k in sorted(runs["A"][0]):
    peer = "torch" if "torch" in runs["A"][0][k] else "numpy"
    rs = {s: [x[k] for x in runs[s] if "ewkern" in x.get(k, {}) and peer in x.get(k, {})] for s in "AB"}
    if not rs["A"] or not rs["B"]:
        continue
    ratio = {s: statistics.mean(c[peer] / c["ewkern"] for c in rs[s]) for s in "AB"}
    t = {s: statistics.mean(c["ewkern"] for c in rs[s]) for s in "AB"}
    print(f"{k[0]} {k[1]} {k[2]} {k[3]} | {ratio['A']:.3f} -> {ratio['B']:.3f} | {t['B'] / t['A']:.3f}")
P
(cd "$out" && tar czf ab.tgz ab && rm -rf ab)
