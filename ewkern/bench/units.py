"""Sizes and shapes as people write them on a command line, and back."""

from __future__ import annotations

import math
import re

__all__ = ["parse_bytes", "parse_count", "parse_list", "parse_shape", "fmt_bytes", "fmt_count",
           "fmt_shape", "fmt_time", "ITEMSIZE"]

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}


def parse_count(text: str | int) -> int:
    """An element count: "134217728", "2^27", "2**27", "3*2^20", "16M" (binary suffixes)."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace("**", "^").replace("·", "*").replace("x", "*")
    total = 1
    for factor in s.split("*"):
        factor = factor.strip()
        m = re.fullmatch(r"(\d+)\^(\d+)", factor)
        if m:
            total *= int(m.group(1)) ** int(m.group(2))
            continue
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)", factor)
        if not m:
            raise ValueError(f"not a count: {text!r} (expected e.g. 1048576, 2^20, 3*2^20 or 16M)")
        total *= float(m.group(1)) * _UNITS[m.group(2)]
    if total != int(total) or total < 0:
        raise ValueError(f"not a whole non-negative count: {text!r}")
    return int(total)


def parse_bytes(text: str | int) -> int:
    """A byte size: "4MiB", "1 GiB", "512KiB", "2^20" (bytes), "1.5G" (binary)."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", s)
    if m and m.group(2) in _UNITS:
        value = float(m.group(1)) * _UNITS[m.group(2)]
        if value != int(value):
            raise ValueError(f"not a whole number of bytes: {text!r}")
        return int(value)
    try:
        return parse_count(s)
    except ValueError:
        raise ValueError(f"not a byte size: {text!r} (expected e.g. 4MiB, 1GiB, 512KiB or 2^20)") from None


def parse_list(text: str, item=str) -> list:
    """Comma-separated values, each converted by item."""
    return [item(part.strip()) for part in str(text).split(",") if part.strip()]


def parse_shape(text: str) -> tuple[int, ...]:
    """A shape: "1024x3072", "16x1024x1024", "16x2^20"."""
    parts = re.split(r"[x×,]", str(text).strip().lower())
    try:
        shape = tuple(parse_count(p) for p in parts if p.strip())
    except ValueError:
        raise ValueError(f"not a shape: {text!r} (expected e.g. 1024x3072 or 16x2^20)") from None
    if not shape:
        raise ValueError(f"not a shape: {text!r}")
    return shape


def fmt_bytes(n: float | None) -> str:
    """1048576 -> "1 MiB", 1610612736 -> "1.5 GiB"."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.005 else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: int) -> str:
    """134217728 -> "2^27", 3145728 -> "3*2^20", 1000 -> "1000"."""
    if n > 0:
        k = (n & -n).bit_length() - 1
        rest = n >> k
        if k >= 10:
            return f"2^{k}" if rest == 1 else f"{rest}*2^{k}"
    return str(n)


def fmt_shape(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def fmt_time(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"
