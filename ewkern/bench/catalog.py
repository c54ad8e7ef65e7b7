"""Reading kernel variant names: which variant is vec4, 64-bit indexed, grid_dim2, f16x8pack, ...

The variant names come from ewkern's registry (``ewkern.variants(op)``); the papers' naming is
followed there (A1: ``ThreadBlockIV4U4MRgs``; V1: ``f16x8pack``; copy: vector width, index
width and grid choice in the name). This module turns a name (and, where the name is silent,
the kernel's ``about`` line) into features, so experiments pick variants by what they are.
"""

from __future__ import annotations

import re

from .timing import kernel_info, variants

__all__ = ["a1_parse", "copy_features", "find", "pick_variants", "V1_NAMES"]

_A1 = re.compile(r"^(?:add_?)?(naive|threadblock)_?([IS])V([124])U([124])([NTM])([CR])_?(gs|mo)?$", re.I)

V1_NAMES = ["f32", "f32x4", "f16", "f16x2", "f16x8", "f16x8pack", "bf16", "bf16x2", "bf16x8", "bf16x8pack"]


def a1_parse(name: str) -> dict | None:
    """Features of an add-kernel-experiments name, or None for other names."""
    m = _A1.match(name)
    if not m:
        return None
    fam, idx, v, u, style, ptr, trav = m.groups()
    return {"family": "naive" if fam.lower() == "naive" else "threadblock", "index": idx.upper(),
            "vec": int(v), "unroll": int(u), "style": style.upper(), "pointers": ptr.upper(),
            "traversal": (trav or "").lower() or None}


def _num(pattern, text):
    m = re.search(pattern, text, re.I)
    return int(m.group(1)) if m else None


def copy_features(name: str, about: str = "") -> dict:
    """vec width (1/2/4/8), index bits (32/64) and grid choice (1/2) read from a variant's name.

    Understood spellings: vec4 / v4 / x4; i32 / i64 / idx64 / int32 / int64 / size_t / "32-bit";
    grid1 / grid_dim1 / gs1 / gd1 (and 2). Missing features are None.
    """
    text = name.lower()
    vec = _num(r"(?:vec|^v|_v|x)([1248])(?![0-9])", text)
    bits = _num(r"(?:^|_|[^a-z])(?:i|idx|index|int|u)(32|64)(?![0-9])", text)
    if bits is None:
        if "size_t" in text or "sizet" in text:
            bits = 64
        elif re.search(r"(?:^|_)int(?:_|$)", text):
            bits = 32
    grid = _num(r"(?:grid_?dim|grid|gs|gd)_?([12])(?![0-9])", text)
    if about and (vec is None or bits is None or grid is None):
        a = about.lower()
        vec = vec if vec is not None else _num(r"(?:vec|width)\s*([1248])\b", a)
        bits = bits if bits is not None else _num(r"(32|64)-bit ind", a)
        grid = grid if grid is not None else _num(r"grid_dim([12])", a)
    return {"vec": vec, "index_bits": bits, "grid": grid}


def find(op: str, dtype: str, device: str, **want) -> list[str]:
    """Variants of op whose copy_features match want (e.g. vec=4, grid=1)."""
    out = []
    for v in variants(op, dtype, device):
        if v == "auto":
            continue
        f = copy_features(v, kernel_info(op, v, dtype).get("about", "") if want else "")
        if all(f.get(k) == val for k, val in want.items()):
            out.append(v)
    return out


def pick_variants(op: str, dtype: str, device: str, feature: str, values, **fixed) -> dict:
    """{value: variant} with one variant per feature value, the others held as in fixed (or simplest)."""
    names = [v for v in variants(op, dtype, device) if v != "auto"]
    feats = {v: copy_features(v, kernel_info(op, v, dtype).get("about", "")) for v in names}
    chosen = {}
    for val in values:
        cands = [v for v in names if feats[v].get(feature) == val
                 and all(feats[v].get(k) in (want, None) for k, want in fixed.items())]
        if cands:
            # prefer the name with the fewest other features spelled out (the plainest)
            cands.sort(key=lambda v: (sum(1 for k, x in feats[v].items() if x is not None), len(v)))
            chosen[val] = cands[0]
    return chosen
