"""Malformed DLPack capsules never crash the interpreter (dlpack_fuzz.py makes them).

Each batch of cases runs in its own process, so a crash fails only its batch and names the case
that was running. Every case must end in the exception of the expected kind whose message names
the problem, call the producer's deleter exactly once (never, for a capsule that arrived
already consumed or without a deleter), and write nothing: not the capsule's memory, not the
other inputs, not out=.
"""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import ewkern
from dlpack_fuzz import cases

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ewkern.__file__)))
BATCH = 200


def run_batch(start, stop):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    p = subprocess.run([sys.executable, os.path.join(HERE, "dlpack_fuzz.py"), str(start), str(stop)],
                       capture_output=True, text=True, env=env, cwd=HERE, timeout=600)
    return start, stop, p


def describe(c):
    return "%s capsule, %s, as %s" % (c["kind"], c["what"], c["pos"])


def test_malformed_capsules_fuzz():
    all_cases = cases()
    malformed = [c for c in all_cases if c["exc"]]
    assert len(malformed) >= 1000
    assert {c["kind"] for c in malformed} == {"legacy", "versioned"}
    assert any(c["pos"] == "out" for c in malformed)
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda s: run_batch(s, min(s + BATCH, len(all_cases))),
                             range(0, len(all_cases), BATCH)))
    problems = []
    seen = 0
    for start, stop, p in runs:
        results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        seen += len(results)
        if p.returncode != 0:
            crashed = all_cases[start + len(results)] if start + len(results) < stop else None
            problems.append("batch %d-%d exited with %d during %s\n%s" % (
                start, stop, p.returncode, describe(crashed) if crashed else "shutdown", p.stderr[-2000:]))
        for r in results:
            c = all_cases[r["i"]]
            if r["exc"] != c["exc"] or (c["match"] and not re.search(c["match"], r["msg"])):
                problems.append("%s: expected %s matching %r, got %s: %s" % (
                    describe(c), c["exc"], c["match"], r["exc"], r["msg"]))
            if r["deleted"] != c["deleted"] or r["good_deleted"] != 1:
                problems.append("%s: deleter called %d times (expected %d); the valid first input's %d times" % (
                    describe(c), r["deleted"], c["deleted"], r["good_deleted"]))
            if not r["intact"]:
                problems.append("%s: memory was written" % describe(c))
            if c["exc"] is None and r["got"] != r["ref"]:
                problems.append("%s: result %s, expected %s" % (describe(c), r["got"], r["ref"]))
    assert not problems, "%d problems in %d cases:\n" % (len(problems), len(all_cases)) + "\n".join(problems[:30])
    assert seen == len(all_cases)
