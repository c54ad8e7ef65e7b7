"""No run-time kernel touches global memory before PDL's wait.

ewkern's kernels allow their dependents right after their own `griddepcontrol.wait`, so a
programmatic launch may start while the kernel before it still runs: before its wait a kernel may
read its parameters and issue L2 prefetches, nothing else. The run-time vector kernels once loaded
their one-element broadcast inputs before the wait (f797d1b), and a ReductionKernel op's backward,
repeated from C++ right behind the reduction, read that result unwritten now and then. Here every
CUDA form ewkern/rtc/_codegen.py emits (the vector forms with every broadcast kind, the grid-stride
elementwise and reduction kernels, the rows reduction and its combine, the row kernels with a
second reduction, row constants and column sums, the column sum itself) goes through NVRTC to PTX,
and each entry's paths from its start to its wait are walked: no global load, store, atomic or
generic access on them. No GPU needed (NVRTC compiles for sm_90)."""
import re

import pytest

from ewkern.rtc import _build, _codegen
from ewkern.rtc._params import DTYPES, parse_params

LABEL = re.compile(r"^\$?[\w$]+:$")
BRANCH = re.compile(r"^(@!?%\w+\s+)?bra(\.uni)?\s+(\S+);")
MEMORY = re.compile(r"^(@!?%\w+\s+)?(ld|ldu|st|atom|red|cp\.async|prefetchu?)\b([.\w:]*)")
ALLOWED = ("ld.param", "ld.shared", "st.shared", "ld.local", "st.local", "ld.const", "prefetch.global.L2")


def _entries(ptx):
    """(name, body lines) of every .entry of a PTX text"""
    for m in re.finditer(r"\.entry\s+(\S+?)\s*\(", ptx):
        i = ptx.index("{", ptx.index(")", m.end()))
        depth, j = 0, i
        while True:
            depth += {"{": 1, "}": -1}.get(ptx[j], 0)
            if depth == 0:
                break
            j += 1
        lines = [ln.split("//")[0].strip() for ln in ptx[i + 1:j].split("\n")]
        yield m.group(1), [ln for ln in lines if ln]


def _before_wait(lines):
    """the memory instructions on some path from the entry to its first griddepcontrol.wait, or
    None where no path has a wait (the kernel would not wait at all)"""
    blocks, cur = [], []
    for ln in lines:
        if LABEL.match(ln):
            if cur:
                blocks.append(cur)
            cur = [ln]
            continue
        cur.append(ln)
        if BRANCH.match(ln) or re.match(r"^(@!?%\w+\s+)?(ret|exit);", ln):
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    labels = {b[0][:-1]: k for k, b in enumerate(blocks) if LABEL.match(b[0])}
    if not any("griddepcontrol.wait" in ln for ln in lines):
        return None
    bad, seen, todo = [], set(), [0]
    while todo:
        k = todo.pop()
        if k in seen or k >= len(blocks):
            continue
        seen.add(k)
        falls = True
        for ln in blocks[k]:
            if "griddepcontrol.wait" in ln:
                falls = False
                break
            m = MEMORY.match(ln)
            if m and not (m.group(2) + m.group(3)).startswith(ALLOWED):
                bad.append(ln)
            b = BRANCH.match(ln)
            if b:
                todo.append(labels[b.group(3)])
                falls = falls and bool(b.group(1))
            elif re.match(r"^(ret|exit);", ln):
                falls = False
        if falls:
            todo.append(k + 1)
    return bad


def test_the_scan_sees_a_read_before_the_wait():
    """The walk itself: a load before the wait on a branch is found; after it, or a parameter's,
    is not."""
    ptx = """.visible .entry k(.param .u64 p) {
    ld.param.u64 %rd1, [p];
    @%p1 bra $L1;
    ld.global.f32 %f1, [%rd1];
$L1:
    griddepcontrol.wait;
    ld.global.f32 %f2, [%rd1];
    ret;
}"""
    ((name, lines),) = _entries(ptx)
    assert name == "k" and _before_wait(lines) == ["ld.global.f32 %f1, [%rd1];"]
    assert _before_wait([ln for ln in lines if not ln.startswith("ld.global.f32 %f1")]) == []
    assert _before_wait([ln for ln in lines if "griddepcontrol" not in ln]) is None


def _p(spec, dt, kind, out=False):
    (p,) = parse_params(spec, out, "k")
    return (p, dt, kind, 0)


def _sources():
    """(name, CUDA source) of each generated form, in float32, bfloat16 and float64"""
    for dt in ("float32", "bfloat16", "float64"):
        E = 16 // DTYPES[dt][2]
        x, w, r, s = (_p(f"T {n}", dt, kind) for n, kind in (("x", "array"), ("w", "bcol"), ("r", "brow"),
                                                               ("s", "bone")))
        k, y = _p("float32 k", "float32", "scalar"), _p("T y", dt, "array", True)
        td = f"typedef {DTYPES[dt][1]} T; typedef {DTYPES[dt][1]} in0_type;"
        lay = _codegen.Layout("vector", 1, [x, w, r, s, k, y])
        yield f"vector {dt}", _codegen.vector_source("pv", lay, "y = x * w + r * s + k", "", "", "", td, {"y"})[0]
        yield f"vector regs64 {dt}", _codegen.vector_source("pv", lay, "y = x * w + r * s + k", "", "", "", td, set(),
                                                            regs64=True)[0]
        xs, ss = _p("T x", dt, "array"), _p("T s", dt, "array")
        strided = _codegen.Layout("strided", 2, [xs, ss, k, y])
        yield f"elementwise {dt}", _codegen.elementwise_source("cuda", "pe", strided, "y = x * s + k", "", "", "",
                                                               td)[0]
        red_in = _codegen.Layout("strided", 2, [xs, ss, k])
        red_out = _codegen.Layout("strided", 1, [y])
        yield f"reduction {dt}", _codegen.reduction_source("cuda", "pr", red_in, red_out, True, "x * s", "a + b",
                                                           "y = a", "0", "float", "", td)[0]
        rows_in = _codegen.Layout("contig", 1, [xs, ss, k])
        rows_out = _codegen.Layout("contig", 1, [y])
        for full, aligned in ((False, False), (True, True)):
            yield f"rows {dt} {full}", _codegen.reduction_rows_source("pw", rows_in, rows_out, E, "x * s", "a + b",
                                                                      "y = a", "0", "float", "", td, full,
                                                                      aligned, 4)[0]
        g = _p("float32 g", "float32", "colsum", True)
        row = _codegen.Layout("contig", 1, [x, w, r, s, k, y])
        yield f"row {dt}", _codegen.row_source("cuda", "pk", row, E, "x * x", "a + b", "y = x * w * r * s * a", "0",
                                               "float", "", td, {"y"})[0]
        row_cs = _codegen.Layout("contig", 1, [x, w, r, s, k, y, g])
        yield f"row colsum {dt}", _codegen.row_source("cuda", "pc", row_cs, E, "x * x", "a + b",
                                                      "y = x * w * r * s * a * c1; g = x * a", "0", "float", "", td,
                                                      set(), stage2=("x * w", "a + b", "0"), g=256,
                                                      consts=(("c1", "a * 2"),))[0]


@pytest.mark.parametrize("name, src", list(_sources()), ids=lambda v: v if isinstance(v, str) and len(v) < 40
                         else None)
def test_generated_kernels_touch_memory_only_after_the_wait(name, src):
    try:
        _build.nvrtc()
    except RuntimeError as e:
        pytest.skip(str(e))
    ptx, _, _ = _build.compile_cuda(name.replace(" ", "_"), src, (9, 0), ptx_only=True)
    entries = list(_entries(ptx.decode(errors="replace")))
    assert entries, name
    for entry, lines in entries:
        bad = _before_wait(lines)
        assert bad is not None, f"{name}: {entry} has no griddepcontrol.wait"
        assert not bad, f"{name}: {entry} touches global memory before its wait: {bad[:3]}"
