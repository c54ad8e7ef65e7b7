"""Parameter strings of run-time kernels, parsed and typed by CuPy's rules.

CuPy's rules (cupy/_core/_kernel.pyx, ParameterInfo and _decide_params_type_core):
- a parameter is ``[raw] TYPE NAME``; parameters are separated by commas;
- TYPE is a one-letter placeholder (``T``, ``X``...) or a NumPy dtype name spelled exactly as
  NumPy's ``dtype.name`` (``float32``, ``float16``, ``int64``, ``bool``...): ``float`` or ``half``
  is an error, as in CuPy. ewkern also takes ``bfloat16``;
- a placeholder is bound by the arrays (not the scalars) passed for it, and by given outputs;
  every array bound to one placeholder, or passed for a parameter of a fixed type, must have
  exactly that dtype (no casting): a ``TypeError`` otherwise;
- scalars (Python or NumPy) are converted to their parameter's type.
"""
from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

# name: (C++ storage type, C++ compute type, itemsize, kind, NumPy dtype name or None)
# 16-bit floats are stored as bits (ewrtc::half_bits / bf16_bits) and computed in float, as every
# ewkern op computes them (round to nearest even on the store).
DTYPES = {
    "bool": ("bool", "bool", 1, "b", "bool"),
    "int8": ("signed char", "signed char", 1, "i", "int8"),
    "int16": ("short", "short", 2, "i", "int16"),
    "int32": ("int", "int", 4, "i", "int32"),
    "int64": ("long long", "long long", 8, "i", "int64"),
    "uint8": ("unsigned char", "unsigned char", 1, "u", "uint8"),
    "uint16": ("unsigned short", "unsigned short", 2, "u", "uint16"),
    "uint32": ("unsigned int", "unsigned int", 4, "u", "uint32"),
    "uint64": ("unsigned long long", "unsigned long long", 8, "u", "uint64"),
    "float16": ("ewrtc::half_bits", "float", 2, "f", "float16"),
    "bfloat16": ("ewrtc::bf16_bits", "float", 2, "f", None),
    "float32": ("float", "float", 4, "f", "float32"),
    "float64": ("double", "double", 8, "f", "float64"),
}
# what ewkern's own arrays (and so the GPU path's results) can hold
EWKERN_DTYPES = ("float32", "float16", "bfloat16", "float64")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Names the generated code (ewkern/rtc/_codegen.py) gives its own locals and loop indices in the
# scope where a kernel's parameters are declared: a parameter of the same name would hide one the
# code reads after it (a compile error, or for a reduction's scalar in post_map an index read as
# the scalar). The struct, its offsets, a reduction's indices and the CUDA forms' template
# parameters and constants (_ewrtc_Idx, _ewrtc_VPT, _ewrtc_VPL, _ewrtc_E, _ewrtc_TPC) are
# _ewrtc_-prefixed (P, off_x, o, r, E, Idx, VPT, VPL and TPC are ordinary names); these
# underscore-led locals keep their short names.
_RESERVED = frozenset({
    "_CB", "_G", "_R", "_TR", "_TC", "_acc", "_base", "_c", "_cn", "_cvec", "_d", "_e", "_ew_c", "_ew_r",
    "_fin", "_first", "_groups", "_group", "_gs", "_i0", "_ia", "_j", "_j0", "_k", "_live", "_m", "_m2", "_n",
    "_nr", "_nc", "_nv", "_o", "_plan", "_q", "_r", "_r0", "_s", "_sh", "_stride", "_t", "_tail0", "_task",
    "_threads", "_tid", "_tiled", "_tiles", "_tn", "_v", "_v0", "_v1", "_w", "_w0", "_head", "_nvec", "_nedge",
    "_end", "_ta", "_rc", "_lane", "_cs", "_ca", "_pa", "_C", "_c0", "_c1", "_r1", "_t0", "_acc2", "_sh2"})
# per-array locals of the generated code: _u_<name>, _r_<name>, ...
_RESERVED_PREFIX = re.compile(r"(?:_ewrtc_|ewrtc_|_(?:U|u|r|h|f|s|w|o|H|c|cb|cs|ca|pa)_)")


@dataclass(frozen=True)
class Param:
    """One parsed parameter: name, ctype (the placeholder letter or the dtype name as written),
    dtype (the dtype name, or None for a placeholder), raw, is_output."""
    name: str
    ctype: str
    dtype: str | None
    raw: bool
    is_output: bool


def parse_params(spec: str, is_output: bool, kernel: str) -> tuple[Param, ...]:
    """Parse CuPy's ``'T x, raw float32 y'`` into Params; ValueError naming the kernel and the
    offending parameter when it is not ``[raw] TYPE NAME``."""
    if not isinstance(spec, str):
        raise TypeError(f"{kernel}: parameters must be a str like 'T x, float32 y', got {type(spec).__name__}")
    spec = spec.strip()
    if not spec:
        return ()
    out = []
    for item in spec.split(","):
        words = item.split()
        if len(words) < 2:
            raise ValueError(f"{kernel}: syntax error in parameter {item.strip()!r}: expected '[raw] TYPE NAME'")
        t, name = words[-2], words[-1]
        raw = False
        for w in words[:-2]:
            if w == "raw":
                raw = True
            else:
                raise ValueError(f"{kernel}: unknown keyword {w!r} in parameter {item.strip()!r} "
                                 "(expected 'raw')")
        if not _IDENT.match(name) or keyword.iskeyword(name):
            raise ValueError(f"{kernel}: invalid parameter name {name!r} in {item.strip()!r}")
        if name in _RESERVED or _RESERVED_PREFIX.match(name):
            raise ValueError(f"{kernel}: parameter name {name!r} is reserved for the generated code's own "
                             "variables; rename it")
        if len(t) == 1:
            if not t.isalpha():
                raise ValueError(f"{kernel}: invalid type placeholder {t!r} in {item.strip()!r}")
            dtype = None
        elif t in DTYPES:
            dtype = t
        else:
            raise ValueError(f"{kernel}: wrong type {t!r} in parameter {item.strip()!r}: expected a one-letter "
                             f"placeholder or one of {', '.join(DTYPES)} (NumPy's spelling: 'float32', not "
                             "'float'; 'float16', not 'half')")
        out.append(Param(name, t, dtype, raw, is_output))
    names = [p.name for p in out]
    for n in names:
        if names.count(n) > 1:
            raise ValueError(f"{kernel}: parameter name {n!r} is used twice")
    return tuple(out)


def decide_types(kernel: str, in_params, out_params, in_dtypes, out_dtypes):
    """CuPy's _decide_params_type_core: in_dtypes/out_dtypes hold a dtype name for each array
    argument and None for scalars (or outputs not given). Returns (in_types, out_types,
    type_map) with type_map sorted (placeholder, dtype name) pairs. TypeError on a mismatch or a
    placeholder no array determines."""
    type_dict: dict[str, str] = {}

    def bind(p: Param, a: str) -> None:
        if p.dtype is not None:
            if a != p.dtype:
                raise TypeError(f"{kernel}: type is mismatched: {p.name} is {p.dtype} in the kernel's "
                                f"parameters but the array passed is {a}")
        elif p.ctype in type_dict:
            if type_dict[p.ctype] != a:
                raise TypeError(f"{kernel}: type is mismatched: {p.name} is {a} but {p.ctype} is already "
                                f"{type_dict[p.ctype]} from an earlier argument")
        else:
            type_dict[p.ctype] = a

    for p, a in zip(out_params, out_dtypes):
        if a is not None:
            bind(p, a)
    for p, a in zip(in_params, in_dtypes):
        if a is not None:
            bind(p, a)

    def resolve(p: Param) -> str:
        if p.dtype is not None:
            return p.dtype
        if p.ctype not in type_dict:
            raise TypeError(f"{kernel}: cannot determine the type {p.ctype} of {p.name}: no array argument "
                            f"has type {p.ctype} (scalars do not bind a type placeholder); pass an array or "
                            "an output array")
        return type_dict[p.ctype]

    in_types = tuple(resolve(p) for p in in_params)
    out_types = tuple(resolve(p) for p in out_params)
    return in_types, out_types, tuple(sorted(type_dict.items()))
