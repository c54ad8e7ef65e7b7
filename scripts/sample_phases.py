"""Is there a repeating pattern in a run's single-launch samples? (not part of the package)

    python scripts/sample_phases.py RESULTS_DIR_OR_JSON [PERIOD]

For every measurement of a results.json or results.json.gz (`python -m ewkern.bench` output) taken
with the flush cache mode and at least 8 x PERIOD samples, the median of each phase of PERIOD (default 4)
consecutive samples (samples 0, P, 2P, ...; 1, P + 1, ...), sorted and given relative to the
fastest phase; then, per experiment, impl and size, the median of those offsets over its series,
beside the same statistic for a split of each series into its first and second half (a series
without a pattern gives offsets of the halves' size, up to about 0.3 us from ranking four noisy
medians). On 2026-11-27 the series of one kernel timed on torch's stream showed 0 / +0.3 / +0.38 /
+1.07 us at period 4 on both GPUs, CuPy's series and those of several kernels at most 0.34 at 1
MiB (BENCHMARKS.md, twenty-eighth session).
"""
import gzip
import json
import statistics
import sys
from pathlib import Path


def series(node):
    """every measurement dict with flush-mode samples, anywhere in the results"""
    if isinstance(node, dict):
        if node.get("cache") == "flush" and isinstance(node.get("samples_s"), list):
            yield node
        for v in node.values():
            yield from series(v)
    elif isinstance(node, list):
        for v in node:
            yield from series(v)


def main(path, period=4):
    p = Path(path)
    if p.is_dir():   # results.json, or the committed folders' results.json.gz
        p = next((p / n for n in ("results.json", "results.json.gz") if (p / n).is_file()), p / "results.json")
    data = json.loads(gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_text())
    groups = {}
    for m in series(data):
        s = m["samples_s"]
        if len(s) < 8 * period:
            continue
        phases = sorted(statistics.median(s[k::period]) for k in range(period))
        half = sorted([statistics.median(s[:len(s) // 2]), statistics.median(s[len(s) // 2:])])
        key = (m.get("experiment"), m.get("impl"), m.get("size_bytes"))
        groups.setdefault(key, []).append(([(x - phases[0]) * 1e6 for x in phases], (half[1] - half[0]) * 1e6))
    print(f"experiment | impl | size | series | phase offsets (us, sorted, period {period}) | halves (us)")
    for (exp, impl, size), rows in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        offsets = " / ".join(f"{statistics.median(r[0][k] for r in rows):.2f}" for k in range(period))
        halves = statistics.median(r[1] for r in rows)
        mib = f"{size / 2 ** 20:g} MiB" if size else "-"
        print(f"{exp} | {impl} | {mib} | {len(rows)} | {offsets} | {halves:.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
