"""E8: instructions per loop iteration of the copy kernels, read from their SASS.

``cuobjdump -sass`` on the built extension, for the GPU's architecture (or the newest one in the
binary when there is no GPU). In each copy kernel the innermost loop that both loads (LDG) and
stores (STG) is found from its backward branch; its instruction count, the widths of its loads
and stores and the bytes moved per iteration are reported. The paper: 9 instructions for the
32-bit-index loop (vec1 and vec4 alike, so vec4 amortises the address arithmetic over 16 bytes)
against 14 for the 64-bit one. Needs cuobjdump and a CUDA build, not a GPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from .catalog import copy_features
from .common import bars_figure, md_table
from .timing import Skip, variants

NAME = "e8"
TITLE = "Instructions per copy loop iteration from the SASS"
DESCRIPTION = "cuobjdump SASS of the copy kernels: instructions per loop iteration, 32- vs 64-bit index, vec1 vs vec4"
PAPER = "elementwise-ops-on-gpus.md"
NEEDS_REFERENCE = False
ARGS = [("--e8-arch", dict(metavar="SM", help="SASS architecture to read, e.g. sm_90 (default: the GPU's)")),
        ("--e8-filter", dict(metavar="REGEX", help="kernels to read (default: copy kernels)"))]

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.+?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_[\w]+):")
_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")


def _cuobjdump():
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    for base in ("/usr/local/cuda/bin", "/opt/cuda/bin"):
        p = Path(base) / "cuobjdump"
        if p.exists():
            return str(p)
    return None


def _so_path() -> Path:
    from ewkern import _C
    f = getattr(_C, "__file__", None)
    if not f:
        raise Skip("ewkern._C has no file to disassemble")
    return Path(f)


def archs_in(exe, so) -> list[str]:
    r = subprocess.run([exe, "-lelf", str(so)], capture_output=True, text=True, timeout=120)
    return sorted(set(re.findall(r"\b(sm_\d+a?)\b", r.stdout)), key=lambda a: int(re.sub(r"\D", "", a)))


def demangle(names: list[str]) -> dict:
    exe = shutil.which("cu++filt") or shutil.which("c++filt")
    if exe and names:
        try:
            r = subprocess.run([exe], input="\n".join(names), capture_output=True, text=True, timeout=60)
            out = r.stdout.splitlines()
            if len(out) == len(names):
                return dict(zip(names, out))
        except (OSError, subprocess.SubprocessError):
            pass
    return {n: n for n in names}


def parse_functions(sass: str) -> dict:
    """{mangled name: [(address, instruction text, label or None)]}."""
    funcs, cur, pending = {}, None, []
    for line in sass.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            pending = []
            continue
        if cur is None:
            continue
        lm = _LABEL.match(line)
        if lm:
            pending.append(lm.group(1))
            continue
        im = _INSN.search(line)
        if im:
            funcs[cur].append((int(im.group(1), 16), im.group(2).strip(), list(pending)))
            pending = []
    return funcs


def _width(opcode: str) -> int:
    """Bytes moved by a LDG/STG opcode: .U8/.S8 1, .U16/.S16 2, .64 8, .128 16, .256 32, else 4."""
    parts = opcode.upper().split(".")
    for p_ in parts[1:]:
        if p_ in ("U8", "S8"):
            return 1
        if p_ in ("U16", "S16"):
            return 2
        if p_ in ("64", "128", "256"):
            return int(p_) // 8
    return 4


def _opcode(insn: str) -> str:
    parts = insn.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0] if parts else ""


def loop_stats(insns) -> dict | None:
    """The innermost backward-branch loop holding both a global load and a global store."""
    addr_of_label = {}
    for addr, _text, labels in insns:
        for lab in labels:
            addr_of_label[lab] = addr
    loops = []
    for addr, text, _ in insns:
        op = _opcode(text)
        if not op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", text)
        target = int(m.group(1), 16) if m else None
        if target is None:
            lm = re.search(r"(\.L_[\w]+)", text)
            target = addr_of_label.get(lm.group(1)) if lm else None
        if target is not None and target <= addr:
            body = [(a, t) for a, t, _ in insns if target <= a <= addr]
            ops = [_opcode(t) for _, t in body]
            if any(o.startswith("LDG") for o in ops) and any(o.startswith("STG") for o in ops):
                loops.append(body)
    if not loops:
        return None
    body = min(loops, key=len)
    loads = [t for _, t in body if _opcode(t).startswith("LDG")]
    stores = [t for _, t in body if _opcode(t).startswith("STG")]
    return {"instructions": len(body), "loads": len(loads), "stores": len(stores),
            "load_bytes": sum(_width(_opcode(t)) for t in loads),
            "store_bytes": sum(_width(_opcode(t)) for t in stores),
            "load_ops": sorted(set(_opcode(t) for t in loads)),
            "store_ops": sorted(set(_opcode(t) for t in stores)),
            "sass": [f"/*{a:04x}*/ {t}" for a, t in body]}


def _features_from_symbol(name: str) -> dict:
    """vec and index width guessed from a demangled kernel name (template arguments)."""
    f = copy_features(name)
    low = name.lower()
    if f["vec"] is None:
        m = re.search(r"(?:float|int|uint)([24])\b", low)
        if m:
            f["vec"] = int(m.group(1))
    if f["index_bits"] is None:
        if re.search(r"unsigned long|long long|\blong\b|size_t|int64|uint64", low):
            f["index_bits"] = 64
        elif re.search(r"\bunsigned int\b|\bint\b|int32|uint32", low):
            f["index_bits"] = 32
    return f


def run(ctx, xr):
    exe = _cuobjdump()
    if exe is None:
        raise Skip("cuobjdump is not installed (it comes with the CUDA toolkit)")
    so = _so_path()
    archs = archs_in(exe, so)
    if not archs:
        raise Skip(f"{so.name} holds no CUDA machine code (a CPU-only build?)")
    arch = ctx.opt("e8_arch")
    if arch is None:
        cc = ctx.info.get("compute_capability") if ctx.is_gpu else None
        want = f"sm_{cc[0]}{cc[1]}" if cc else None
        arch = want if want in archs else (want + "a" if want and want + "a" in archs else archs[-1])
    if arch not in archs:
        raise Skip(f"no {arch} code in {so.name} (it holds {', '.join(archs)})")
    r = subprocess.run([exe, "-arch", arch, "-sass", str(so)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise Skip(f"cuobjdump failed: {r.stderr.strip()[:300]}")
    funcs = parse_functions(r.stdout)
    names = demangle(list(funcs))
    pattern = ctx.opt("e8_filter")
    if pattern is None:   # the copy study's kernels; any copy kernel when there are none
        pattern = r"copy_vec" if any(re.search(r"copy_vec", names.get(m, m)) for m in funcs) else r"copy"
    pattern = re.compile(pattern, re.I)
    copy_variants = [v for v in variants("copy", "float32", ctx.device if ctx.is_gpu else "cuda:0") if v != "auto"]
    xr.param(arch=arch, archs=archs, binary=so.name, filter=pattern.pattern, copy_variants=copy_variants)
    rows = []
    for mangled, insns in funcs.items():
        pretty = names.get(mangled, mangled)
        if not pattern.search(pretty) and not pattern.search(mangled):
            continue
        st = loop_stats(insns)
        feats = _features_from_symbol(pretty)
        row = {"kernel": pretty, "symbol": mangled, "total_instructions": len(insns),
               "vec": feats["vec"], "index_bits": feats["index_bits"]}
        if st is None:
            row.update({"instructions": None, "note": "no loop with both LDG and STG"})
        else:
            moved = st["load_bytes"] + st["store_bytes"]
            row.update({k: v for k, v in st.items() if k != "sass"})
            row["bytes_per_iteration"] = moved
            row["instructions_per_16B_moved"] = round(16 * st["instructions"] / moved, 3) if moved else None
            row["loop_sass"] = "\n".join(st["sass"])
        rows.append(row)
    if not rows:
        raise Skip(f"no kernel matching /{pattern.pattern}/ in the {arch} SASS")
    rows.sort(key=lambda r: (r["index_bits"] or 0, r["vec"] or 0, r["kernel"]))
    xr.table("loops", rows)
    xr.note("instructions = the innermost loop (target of a backward BRA up to the branch) that holds "
            "both LDG and STG; bytes per iteration = widths of its loads + stores")


def figures(results, exp):
    rows = [r for r in (exp.get("tables") or {}).get("loops", []) if r.get("instructions")]
    if not rows:
        return []
    cats = [f"{r['index_bits'] or '?'}-bit vec{r['vec'] or '?'}\n{r['kernel'][:28]}" for r in rows]
    vals = {(c, "instructions per iteration"): r["instructions"] for c, r in zip(cats, rows)}
    fig = bars_figure(results, cats, ["instructions per iteration"], vals, kind="", lines=False,
                      ylabel="SASS instructions per loop iteration",
                      subtitle=f"copy loop instructions ({exp['params'].get('arch')})")
    return [("e8_sass", fig)]


def summary(results, exp):
    rows = (exp.get("tables") or {}).get("loops", [])
    out = md_table(["kernel", "index bits", "vec", "loop instructions", "LDG", "STG", "bytes/iteration",
                    "instructions per 16 B"],
                   [[r["kernel"][:70], r.get("index_bits"), r.get("vec"), r.get("instructions"),
                     ",".join(r.get("load_ops") or []), ",".join(r.get("store_ops") or []),
                     r.get("bytes_per_iteration"), r.get("instructions_per_16B_moved")] for r in rows])
    return out + f"\n\nSASS architecture: {exp['params'].get('arch')}"
