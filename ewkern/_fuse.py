"""ewkern.fuse: a Python function of arrays made one kernel, as ``cupy.fuse`` does.

The function is called once per argument signature (each array's dtype, each scalar's type) on
stand-ins that record what is done to them: Python's operators, NumPy ufuncs (``np.exp(x)``,
``np.maximum(x, y)``, SciPy's ``erf``), ``np.where`` and ewkern's own elementwise ops
(``ewkern.gelu(x)``, ``ewkern.axpby(x, y, 2.0, 0.5)``). The record becomes one
``ewkern.ElementwiseKernel``, compiled for the signature and kept, so that every later call is that
kernel's call: one pass over the arrays on ewkern's fast paths (CUDA and the CPU alike), the
inputs broadcast as NumPy does. Types follow NumPy's rules (NEP 50: a Python scalar takes the
array's type), each operation computed in its result type (float16 and bfloat16 in float32,
rounded once where stored, as in every ewkern kernel).

One reduction, ``np.sum``, ``np.mean``, ``np.max`` (``np.amax``), ``np.min`` (``np.amin``) or
``np.prod`` (``axis=``, ``keepdims=``, or the methods ``.sum()`` ... ``.prod()``), makes it a
``ewkern.ReductionKernel`` instead: what is reduced is the map, what the function then does with
the result (and scalars) the post map, so ``np.sqrt(np.mean((a - b) * (a - b), axis=1))`` is one
pass of the rows engine. The result has NumPy's type (the sum or product of int8 is int64), and the
reduction is computed in it (16-bit floats in float32). max and min carry a NaN as NumPy's do (the
reduce expression is np.maximum's: ``(a > b || a != a) ? a : b``) and, as NumPy's, raise ValueError
over an empty axis.

What cannot be fused is refused with a TypeError that names it: branching on a value (``if x > 0``;
write ``np.where``), a second reduction or arrays used after one, arrays that are not arguments,
ops outside the table below.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable

import numpy as np

from .rtc._params import DTYPES

__all__ = ["fuse", "Fusion"]

_Fmt = Callable[..., str]   # C of an operation from its operands' C


def _ctype(dt: str) -> str:
    return DTYPES[dt][1]   # the compute type: float for float16/bfloat16


def _is_float(dt: str) -> bool:
    return DTYPES[dt][3] == "f"


_BF16: Any = None


def _np_dtype(dt: str) -> Any:
    """The NumPy dtype that stands for dt in type inference (bfloat16: ml_dtypes' where present)."""
    global _BF16
    if dt != "bfloat16":
        return np.dtype(dt)
    if _BF16 is None:
        try:
            import ml_dtypes
            _BF16 = np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            _BF16 = False
    if _BF16 is False:
        raise TypeError("ewkern.fuse: typing bfloat16 needs ml_dtypes (pip install ml_dtypes)")
    return _BF16


_DT_NAMES: dict[Any, str] = {}


def _dtype_name(dt: Any) -> str:
    """A dtype's name (NumPy, torch, CuPy, JAX), remembered per dtype: NumPy's dtype.name is Python
    code of about 4 us, which every call's signature would pay for each array."""
    name = _DT_NAMES.get(dt)
    if name is None:
        name = getattr(dt, "name", None) or str(dt)
        name = _DT_NAMES[dt] = name[6:] if name.startswith("torch.") else name
    return name


def _arg_dtype(obj: Any) -> str | None:
    """An array argument's dtype name (NumPy, torch, CuPy, JAX, ewkern.Array), None for others."""
    dt = getattr(obj, "dtype", None)
    if dt is None or isinstance(obj, np.generic):
        return None
    name = _dtype_name(dt)
    return name if name in DTYPES else None


class _Trace:
    """One tracing: the kernel's parameters (the call's arguments, then the constants met in the
    body) and the nodes made."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.params: list[str] = []      # "dtype name" of each input parameter
        self.consts: list[Any] = []      # values of the constant parameters, in order
        self.arrays: set[str] = set()    # the names of the array arguments
        # (argument index, integer dtype): a Python scalar argument cast in C to a narrower integer
        # type it meets, whose value each call checks against that type's range (NumPy's
        # OverflowError, NEP 50) rather than let the cast wrap it
        self.narrowed: set[tuple[int, str]] = set()
        # the one reduction: (its kind, its input, axis, keepdims, its result's stand-in), or None
        self.reduction: tuple[str, Any, Any, bool, "_Var"] | None = None

    def reduce(self, kind: str, x: Any, *args: Any, **kwargs: Any) -> "_Var":
        """np.<kind> (a key of _REDUCE) of a traced value, args and kwargs as NumPy's after the
        array: the kernel becomes a ReductionKernel whose map is x's expression and whose post map
        is what the function does with the result (that and scalars only)."""
        extra = sorted(set(kwargs) - {"axis", "keepdims"}) + ["arguments after axis"] * (len(args) > 1)
        if extra:
            raise TypeError(f"{self.name}: ewkern.fuse does not fuse numpy.{kind} with {', '.join(extra)} "
                            f"({_REDUCTIONS_HELP})")
        if self.reduction is not None:
            raise TypeError(f"{self.name}: ewkern.fuse fuses one reduction a function ({_REDUCTIONS_HELP})")
        axis, keepdims = kwargs.get("axis", args[0] if args else None), bool(kwargs.get("keepdims", False))
        v = _operand(self, x)
        if v.dtype == "":
            raise TypeError(f"{self.name}: ewkern.fuse reduces arrays (np.{kind} of a Python "
                            f"{type(v.sample_value).__name__})")
        if axis is not None and not isinstance(axis, int) and not (
                isinstance(axis, tuple) and all(isinstance(k, int) for k in axis)):
            raise TypeError(f"{self.name}: np.{kind}'s axis must be None, an int or a tuple of ints")
        res = _dtype_name(getattr(np, kind)(v.sample()).dtype)
        # a: the reduced value in the result's compute type; the mean divides by the elements an output
        name = "(a / (_in_ind.size() / _out_ind.size()))" if kind == "mean" else "a"
        red = _Var(self, res, name=name)
        self.reduction = (kind, v, axis, keepdims, red)
        return red

    def const(self, value: Any, dt: str) -> "_Var":
        """A constant of the body: a scalar parameter of the kernel in its compute type (its value
        passed at each call: no literal to spell, and NumPy's rule for a Python scalar, the value
        converted to the operation's type, is the parameter's own conversion)."""
        name = f"_ewf_c{len(self.consts)}"   # not a name the generated code keeps (_params._RESERVED)
        self.consts.append(value)
        self.params.append(f"{dt} {name}")
        return _Var(self, dt, name=name)


class _Var:
    """A traced value: its dtype and how it is computed (an input's name, or an operation on
    other values). Stands in for an array inside the traced function."""

    __slots__ = ("trace", "dtype", "name", "fmt", "args", "sample_value")
    __array_priority__ = 1000

    def __init__(self, trace: _Trace, dtype: str, name: str | None = None,
                 fmt: _Fmt | None = None, args: tuple[Any, ...] = (), sample_value: Any = None) -> None:
        self.trace, self.dtype, self.name, self.fmt, self.args = trace, dtype, name, fmt, args
        self.sample_value = sample_value   # a weak Python scalar argument: its Python value's type

    def sample(self) -> Any:
        if self.sample_value is not None:
            return self.sample_value
        return np.ones((), _np_dtype(self.dtype))

    # -- what cannot be traced ----------------------------------------------------------------
    def __bool__(self) -> bool:
        raise TypeError(f"{self.trace.name}: ewkern.fuse cannot branch on an array's values (a traced "
                        "value has no truth value); write np.where(cond, a, b)")

    def __iter__(self) -> Any:
        raise TypeError(f"{self.trace.name}: ewkern.fuse cannot iterate over an array inside the function")

    def __index__(self) -> int:
        raise TypeError(f"{self.trace.name}: ewkern.fuse cannot use an array's value as an index or size")

    __int__ = __float__ = __index__

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):   # protocols probed with hasattr: not an array
            raise AttributeError(attr)
        raise TypeError(f"{self.trace.name}: ewkern.fuse does not trace the attribute {attr!r} of an array "
                        "(operators, NumPy ufuncs, np.where and ewkern's elementwise ops only)")

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, o: Any) -> "_Var": return _apply(self.trace, "add", self, o)
    def __radd__(self, o: Any) -> "_Var": return _apply(self.trace, "add", o, self)
    def __sub__(self, o: Any) -> "_Var": return _apply(self.trace, "subtract", self, o)
    def __rsub__(self, o: Any) -> "_Var": return _apply(self.trace, "subtract", o, self)
    def __mul__(self, o: Any) -> "_Var": return _apply(self.trace, "multiply", self, o)
    def __rmul__(self, o: Any) -> "_Var": return _apply(self.trace, "multiply", o, self)
    def __truediv__(self, o: Any) -> "_Var": return _apply(self.trace, "divide", self, o)
    def __rtruediv__(self, o: Any) -> "_Var": return _apply(self.trace, "divide", o, self)
    def __pow__(self, o: Any) -> "_Var": return _apply(self.trace, "power", self, o)
    def __rpow__(self, o: Any) -> "_Var": return _apply(self.trace, "power", o, self)
    def __neg__(self) -> "_Var": return _apply(self.trace, "negative", self)
    def __pos__(self) -> "_Var": return _apply(self.trace, "positive", self)
    def __abs__(self) -> "_Var": return _apply(self.trace, "absolute", self)
    def __invert__(self) -> "_Var": return _apply(self.trace, "invert", self)
    def __and__(self, o: Any) -> "_Var": return _apply(self.trace, "bitwise_and", self, o)
    def __rand__(self, o: Any) -> "_Var": return _apply(self.trace, "bitwise_and", o, self)
    def __or__(self, o: Any) -> "_Var": return _apply(self.trace, "bitwise_or", self, o)
    def __ror__(self, o: Any) -> "_Var": return _apply(self.trace, "bitwise_or", o, self)
    def __xor__(self, o: Any) -> "_Var": return _apply(self.trace, "bitwise_xor", self, o)
    def __rxor__(self, o: Any) -> "_Var": return _apply(self.trace, "bitwise_xor", o, self)
    def __lt__(self, o: Any) -> "_Var": return _apply(self.trace, "less", self, o)
    def __le__(self, o: Any) -> "_Var": return _apply(self.trace, "less_equal", self, o)
    def __gt__(self, o: Any) -> "_Var": return _apply(self.trace, "greater", self, o)
    def __ge__(self, o: Any) -> "_Var": return _apply(self.trace, "greater_equal", self, o)
    def __eq__(self, o: Any) -> "_Var": return _apply(self.trace, "equal", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> "_Var": return _apply(self.trace, "not_equal", self, o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __floordiv__(self, o: Any) -> "_Var":
        raise TypeError(f"{self.trace.name}: ewkern.fuse does not fuse '//' (floor_divide)")
    __rfloordiv__ = __mod__ = __rmod__ = __floordiv__

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method != "__call__" or kwargs:
            what = f"{ufunc.__name__}.{method}" if method != "__call__" else f"{ufunc.__name__} with {sorted(kwargs)}"
            raise TypeError(f"{self.trace.name}: ewkern.fuse does not fuse {what} (elementwise calls without "
                            "keywords only; reductions and out= are not fused)")
        return _apply(self.trace, ufunc.__name__, *inputs, ufunc=ufunc)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func is np.where and not kwargs and len(args) == 3:
            return _apply(self.trace, "where", *args)
        if func in _NP_REDUCTIONS:
            return self.trace.reduce(_NP_REDUCTIONS[func], *args, **kwargs)
        raise TypeError(f"{self.trace.name}: ewkern.fuse does not fuse numpy.{func.__name__}"
                        f"{' with ' + ', '.join(sorted(kwargs)) if kwargs else ''} "
                        f"(elementwise ops, np.where(cond, a, b), and {_REDUCTIONS_HELP})")

    # the methods: NumPy's arguments after the array (axis=, keepdims=: what reduce takes)
    def sum(self, *args: Any, **kwargs: Any) -> "_Var": return self.trace.reduce("sum", self, *args, **kwargs)
    def mean(self, *args: Any, **kwargs: Any) -> "_Var": return self.trace.reduce("mean", self, *args, **kwargs)
    def max(self, *args: Any, **kwargs: Any) -> "_Var": return self.trace.reduce("max", self, *args, **kwargs)
    def min(self, *args: Any, **kwargs: Any) -> "_Var": return self.trace.reduce("min", self, *args, **kwargs)
    def prod(self, *args: Any, **kwargs: Any) -> "_Var": return self.trace.reduce("prod", self, *args, **kwargs)

    @staticmethod
    def __ewkern_fuse__(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An ewkern op called on a traced value (csrc/ops.c hands the call here)."""
        trace = next(a.trace for a in list(args) + list(kwargs.values()) if isinstance(a, _Var))
        if kwargs:
            raise TypeError(f"{trace.name}: ewkern.fuse does not fuse ewkern.{op} with keyword arguments "
                            f"({', '.join(sorted(kwargs))})")
        if op not in _EWKERN_OPS:
            raise TypeError(f"{trace.name}: ewkern.fuse does not fuse ewkern.{op} (it fuses "
                            f"{', '.join(sorted(_EWKERN_OPS))})")
        return _EWKERN_OPS[op](trace, *args)


# ---- the operations: NumPy ufunc name -> how its C is written ----------------------------------

def _bin(op: str) -> Callable[[str, str], str]:
    return lambda a, b: f"({a} {op} {b})"


def _call(fn: str) -> Callable[..., str]:
    return lambda *xs: f"{fn}({', '.join(xs)})"


_ARITH: dict[str, _Fmt] = {"add": _bin("+"), "subtract": _bin("-"), "multiply": _bin("*"),
          "negative": lambda a: f"(-{a})", "positive": lambda a: f"(+{a})", "square": lambda a: f"({a} * {a})"}
_FLOAT_ONLY: dict[str, _Fmt] = {"divide": _bin("/"), "true_divide": _bin("/"), "power": _call("pow"),
               "reciprocal": lambda a: f"(1 / {a})", "absolute": _call("fabs"), "fabs": _call("fabs"),
               "maximum": lambda a, b: f"(({a} > {b} || {a} != {a}) ? {a} : {b})",
               "minimum": lambda a, b: f"(({a} < {b} || {a} != {a}) ? {a} : {b})",
               "fmax": _call("fmax"), "fmin": _call("fmin"), "copysign": _call("copysign"),
               "arctan2": _call("atan2"), "hypot": _call("hypot"),
               "rsqrt": _call("rsqrt"), "sigmoid": lambda a: f"(1 / (1 + exp(-{a})))",
               "silu": lambda a: f"({a} / (1 + exp(-{a})))",
                  "relu": lambda a: f"(({a} > 0 || {a} != {a}) ? {a} : 0)"}
for _fn in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "sin", "cos", "tan",
            "sinh", "cosh", "tanh", "floor", "ceil", "trunc", "rint", "erf", "erfc"):
    _FLOAT_ONLY[_fn] = _call(_fn)
for _np_name, _c_name in (("arcsin", "asin"), ("arccos", "acos"), ("arctan", "atan"), ("arcsinh", "asinh"),
                          ("arccosh", "acosh"), ("arctanh", "atanh")):
    _FLOAT_ONLY[_np_name] = _call(_c_name)
# x (1 + erf(x / sqrt 2)) / 2 as x erfc(-x / sqrt 2) / 2: no cancellation for x << 0; its
# literals in the compute type (a double literal would take float math to double)
_TYPED: dict[str, Callable[[str], _Fmt]] = {"gelu": lambda t: lambda a: (f"(0.5f * {a} * erfc(-0.70710678118654752f * {a}))" if t == "float"
                                       else f"(0.5 * {a} * erfc(-0.70710678118654752440 * {a}))")}


def _int_fmt(name: str, dt: str) -> _Fmt:
    """The C of integer operation `name` with result dtype dt, wrapped to dt as NumPy's is: C
    computes a narrow integer in int (uint8 200 * 2 is 400 there, 144 in NumPy), so the result is
    cast back to its own type; add, subtract, multiply, negative and abs are computed in the
    unsigned type of at least int's width, where they wrap (in a signed type an overflow, int32's
    or int64's, is undefined behaviour; uint16 * uint16 overflows int), and converted back."""
    T = _ctype(dt)
    U = "unsigned long long" if DTYPES[dt][2] == 8 else "unsigned int"

    def wrap(e: str) -> str:
        return f"(({T})({e}))"
    ops = {"add": "+", "subtract": "-", "multiply": "*"}
    if name in ops:
        return lambda a, b: wrap(f"({U}){a} {ops[name]} ({U}){b}")
    if name == "square":
        return lambda a: wrap(f"({U}){a} * ({U}){a}")
    if name == "negative":
        return lambda a: wrap(f"0u - ({U}){a}")
    if name == "absolute":   # NumPy's abs of the lowest value is itself (wraps)
        return lambda a: wrap(f"{a} < 0 ? 0u - ({U}){a} : ({U}){a}")
    fmt = _ARITH.get(name) or _BITS.get(name) or (lambda a: f"(~{a})")
    return lambda *xs: wrap(fmt(*xs))


_ABS_INT = lambda a: f"({a} < 0 ? -{a} : {a})"  # noqa: E731
_COMPARE = {"less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=", "equal": "==", "not_equal": "!="}
# x - x is 0 for a finite x and NaN for an infinity or a NaN (no literal, no library call)
_PREDICATE: dict[str, _Fmt] = {"isnan": lambda a: f"({a} != {a})", "isinf": lambda a: f"({a} == {a} && {a} - {a} != {a} - {a})",
              "isfinite": lambda a: f"({a} - {a} == {a} - {a})", "signbit": _call("signbit")}
_LOGICAL: dict[str, _Fmt] = {"logical_and": _bin("&&"), "logical_or": _bin("||"), "logical_xor": _bin("!="),
            "logical_not": lambda a: f"(!{a})"}
_BITS: dict[str, _Fmt] = {"bitwise_and": _bin("&"), "bitwise_or": _bin("|"), "bitwise_xor": _bin("^")}
# ewkern ops without a NumPy ufunc: their type is the operands' float type
_NO_UFUNC = ("rsqrt", "sigmoid", "silu", "gelu", "relu", "erf", "erfc")


def _extremes(dt: str) -> tuple[str, str]:
    """dt's lowest and highest values in C++ (the identities of max and min): -inf and inf, or the
    integer's own, spelt so that gcc and NVRTC read them (-2^63 as -2^63 + 1 - 1; the kernel casts
    the identity to its type)."""
    if _is_float(dt):
        return "-INFINITY", "INFINITY"
    lo, hi = (0, 1) if dt == "bool" else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
    return f"({lo + 1}LL - 1)" if lo < 0 else f"{lo}ULL", f"{hi}ULL"


# the reductions: kind -> (reduce expression of a and b, identity) for the reduction's dtype; max and
# min are np.maximum's and np.minimum's C (a NaN from either side is kept; for integers and bool
# `a != a` is false)
def _wrapping(op: str) -> Callable[[str], str]:
    """A reduction's a <op> b in dtype dt: an integer's wraps as NumPy's (_int_fmt)."""
    name = {"+": "add", "*": "multiply"}[op]
    return lambda dt: f"a {op} b" if _is_float(dt) or dt == "bool" else _int_fmt(name, dt)("a", "b")


_REDUCE: dict[str, Callable[[str], tuple[str, str]]] = {
    "sum": lambda dt: (_wrapping("+")(dt), "0"), "mean": lambda dt: ("a + b", "0"),
    "prod": lambda dt: (_wrapping("*")(dt), "1"),
    "max": lambda dt: (_FLOAT_ONLY["maximum"]("a", "b"), _extremes(dt)[0]),
    "min": lambda dt: (_FLOAT_ONLY["minimum"]("a", "b"), _extremes(dt)[1])}
_NP_REDUCTIONS = {np.sum: "sum", np.mean: "mean", np.max: "max", np.amax: "max", np.min: "min", np.amin: "min",
                  np.prod: "prod"}
_REDUCTIONS_HELP = ("one reduction: np.sum, np.mean, np.max (amax), np.min (amin) or np.prod, or the method, "
                    "with axis= and keepdims= only")


def _operand(trace: _Trace, x: Any) -> _Var:
    if isinstance(x, _Var):
        if x.trace is not trace:
            raise TypeError(f"{trace.name}: a value traced by another ewkern.fuse function")
        return x
    if isinstance(x, np.generic):   # before float: np.float64 is one; a NumPy scalar is strongly typed
        if x.dtype.name not in DTYPES:
            raise TypeError(f"{trace.name}: a {x.dtype} scalar, which ewkern kernels do not hold")
        return trace.const(x.item(), x.dtype.name)
    if isinstance(x, (bool, int, float)):
        # a constant of the body; its type is decided where it is used (NEP 50: weak)
        return _Var(trace, "", sample_value=x, args=(x,))
    raise TypeError(f"{trace.name}: ewkern.fuse takes arrays only as the function's arguments (got "
                    f"{type(x).__name__} inside it; pass it as an argument)")


def _result_dtype(trace: _Trace, name: str, ufunc: Any, ops: list[_Var]) -> str:
    """NumPy's result type of the operation on these operands (a 0-d sample of each, weak Python
    scalars as themselves)."""
    samples = [v.sample() for v in ops]
    with np.errstate(all="ignore"):
        if name in _NO_UFUNC and ufunc is None:
            res = _dtype_name(np.result_type(*samples))
            if res not in DTYPES or not _is_float(res):
                raise TypeError(f"{trace.name}: ewkern.{name} takes floating-point values, got {res}")
            return res
        fn = ufunc if ufunc is not None else (np.where if name == "where" else getattr(np, name))
        try:
            r = fn(*samples)
        except TypeError as e:
            raise TypeError(f"{trace.name}: {name} of {', '.join(v.dtype or type(v.sample_value).__name__ for v in ops)}: "
                            f"{e}") from None
    res = _dtype_name(np.asarray(r).dtype)
    if res not in DTYPES:
        raise TypeError(f"{trace.name}: {name} gives {res}, which ewkern kernels do not hold")
    return res


def _apply(trace: _Trace, name: str, *xs: Any, ufunc: Any = None) -> _Var:
    ops = [_operand(trace, x) for x in xs]
    if ufunc is not None and ufunc.nin != len(xs):   # pragma: no cover - NumPy checks the count first
        raise TypeError(f"{trace.name}: {name} takes {ufunc.nin} arguments")
    res = _result_dtype(trace, name, ufunc, ops)
    if name in _COMPARE or name in _PREDICATE or name in _LOGICAL:
        # the operands' common type, a weak constant typed by its Python type alone (NumPy's add of
        # int8 and 300 raises; its comparison does not)
        typing = [_Var(trace, "", sample_value=type(v.sample_value)(1)) if v.dtype == "" else v for v in ops]
        compute = _result_dtype(trace, "add", None, typing) if name in _COMPARE or name in _LOGICAL \
            else ops[0].dtype or _dtype_name(np.result_type(ops[0].sample()))
        if name in _LOGICAL:
            compute = "bool"
        if name in _COMPARE and DTYPES[compute][3] in "iu" and DTYPES[compute][2] < 8 and any(
                v.sample_value is not None for v in ops):
            # NumPy 2 compares a Python int with integers of any width exactly (int8 < 300 is True,
            # not an OverflowError nor 300 wrapped to 44): in int64, which holds both
            compute = "int64"
        fmt: _Fmt = (lambda a, b, o=_COMPARE[name]: f"({a} {o} {b})") if name in _COMPARE \
            else _PREDICATE.get(name) or _LOGICAL[name]
        if name in _PREDICATE and not _is_float(compute):
            fmt = {"isnan": lambda a: "false", "isinf": lambda a: "false", "isfinite": lambda a: "true",
                   "signbit": lambda a: f"({a} < 0)"}[name]
        return _node(trace, res, fmt, ops, [compute] * len(ops))
    if name == "where":
        return _node(trace, res, lambda c, x, y: f"({c} ? {x} : {y})", ops, ["bool", res, res])
    if name in _BITS or name == "invert":
        if _is_float(res):
            raise TypeError(f"{trace.name}: {name} of floating-point values")
        bits: _Fmt = _BITS.get(name) or ((lambda a: f"(!{a})") if res == "bool" else (lambda a: f"(~{a})"))
        if res != "bool":   # C computes ~ and the others in int: back to the type
            bits = _int_fmt(name, res)
        return _node(trace, res, bits, ops, [res] * len(ops))
    if name in _ARITH:
        if res == "bool":
            raise TypeError(f"{trace.name}: ewkern.fuse does not fuse {name} of booleans")
        return _node(trace, res, _ARITH[name] if _is_float(res) else _int_fmt(name, res), ops, [res] * len(ops))
    if name == "absolute" and not _is_float(res):
        return _node(trace, res, _int_fmt(name, res) if res != "bool" else _ABS_INT, ops, [res])
    if name in _FLOAT_ONLY or name in _TYPED:
        if not _is_float(res):
            raise TypeError(f"{trace.name}: ewkern.fuse fuses {name} of floating-point values only (here {res})")
        math = _TYPED[name](_ctype(res)) if name in _TYPED else _FLOAT_ONLY[name]
        return _node(trace, res, math, ops, [res] * len(ops))
    raise TypeError(f"{trace.name}: ewkern.fuse does not fuse {name}")


def _node(trace: _Trace, dtype: str, fmt: _Fmt, ops: list[_Var], computes: list[str]) -> _Var:
    """The operation fmt on ops, each taken in its compute dtype: a weak constant becomes a
    parameter of that type; a value of another compute type is cast."""
    args = []
    for v, c in zip(ops, computes):
        if v.dtype == "":                       # a weak constant: a parameter in the type it meets
            v = trace.const(v.args[0], c)
        elif v.sample_value is not None and v.name and c != v.dtype and DTYPES[c][3] in "iu":
            trace.narrowed.add((int(v.name[2:]), c))   # a weak scalar argument (in<k>) met in an integer type
        args.append((v, _ctype(c)))
    return _Var(trace, dtype, fmt=fmt, args=tuple(args))


def _ewk(np_name: str) -> Callable[..., _Var]:
    """an ewkern op that is the NumPy ufunc np_name (or an op of _NO_UFUNC) on its arrays"""
    return lambda trace, *xs: _apply(trace, np_name, *xs)


def _ewk_const(np_name: str) -> Callable[..., _Var]:
    def op(trace: _Trace, a: Any, c: Any) -> _Var:
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            raise TypeError(f"{trace.name}: the scalar of ewkern.add_const / mul_const must be a number")
        return _apply(trace, np_name, a, float(c))
    return op


def _ewk_axpby(trace: _Trace, a: Any, b: Any, alpha: Any, beta: Any) -> _Var:
    return _apply(trace, "add", _apply(trace, "multiply", float(alpha), a), _apply(trace, "multiply", float(beta), b))


_EWKERN_OPS: dict[str, Callable[..., _Var]] = {
    "copy": _ewk("positive"),
    "add": _ewk("add"), "sub": _ewk("subtract"), "mul": _ewk("multiply"),
    "div": _ewk("divide"), "maximum": _ewk("maximum"), "minimum": _ewk("minimum"),
    "add_const": _ewk_const("add"), "mul_const": _ewk_const("multiply"), "axpby": _ewk_axpby,
    "neg": _ewk("negative"), "abs": _ewk("absolute"),
    **{k: _ewk(k) for k in ("exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "relu", "gelu",
                                  "silu")},
}


# ---- the kernel's source ----------------------------------------------------------------------

def _source(outs: list[_Var]) -> str:
    """The body: `out0 = <expression>;` for each output where no operation's value is used twice
    (the form ewkern.torch derives a backward of), else one `const` statement an operation, so
    that a value used twice is computed once (and an expression that reuses its values does not
    grow with each reuse)."""
    uses: dict[int, int] = {}

    def count(v: _Var) -> None:
        if v.name is None:
            uses[id(v)] = uses.get(id(v), 0) + 1
            if uses[id(v)] == 1:
                for a, _ in v.args:
                    count(a)
    for v in outs:
        count(v)
    if max(uses.values(), default=0) <= 1:
        return " ".join(f"out{k} = {_inline(v)};" for k, v in enumerate(outs))
    lines: list[str] = []
    names: dict[int, str] = {}

    def emit(v: _Var) -> str:
        if v.name is not None:
            return v.name
        if id(v) not in names:
            code = _format(v, emit)
            names[id(v)] = f"_ewf_t{len(names)}"
            lines.append(f"const {_ctype(v.dtype)} {names[id(v)]} = {code};")
        return names[id(v)]
    for k, v in enumerate(outs):
        lines.append(f"out{k} = {emit(v)};")
    return "\n".join(lines)


def _format(v: _Var, code: Callable[[_Var], str]) -> str:
    """The operation v in C, its operands written by code and cast to their compute types."""
    assert v.fmt is not None   # a value without a name is an operation
    return v.fmt(*[_cast(code(a), a, c) for a, c in v.args])


def _inline(v: _Var) -> str:
    """v's C as one expression (a value used twice written twice)."""
    return v.name if v.name is not None else _format(v, _inline)


def _leaves(v: _Var) -> list[_Var]:
    """The named values (arguments, constants, a reduction's result) v is computed from, each
    operation visited once."""
    seen: set[int] = set()
    out: list[_Var] = []

    def walk(x: _Var) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if x.name is not None:
            out.append(x)
        for a, _ in x.args:
            walk(a)
    walk(v)
    return out


def _cast(code: str, v: _Var, ctype: str) -> str:
    return code if _ctype(v.dtype) == ctype else f"(({ctype}){code})"


# ---- the decorator ----------------------------------------------------------------------------

# a signature's kernel, the body's constants, the kernel's keywords (axis, keepdims), for max and
# min the reduction's name (NumPy's ValueError over an empty axis is checked before the call), and
# the scalar arguments each call checks against the integer types they meet (_Trace.narrowed)
_Entry = tuple[Any, tuple[Any, ...], dict[str, Any], str, tuple[tuple[int, str], ...]]


class Fusion:
    """A function fused into one kernel per argument signature (``ewkern.fuse``). Call it as the
    function; ``kernel(*args)`` gives the ``ewkern.ElementwiseKernel`` those arguments run (for
    ``ewkern.torch.kernel_op``, whose derived backward needs a body of one expression)."""

    def __init__(self, func: Callable[..., Any], kernel_name: str | None = None) -> None:
        self.func = func
        base = str(kernel_name or getattr(func, "__name__", "fused"))
        self.name = re.sub(r"\W", "_", base) or "fused"
        if self.name[0].isdigit():
            self.name = "_" + self.name
        self._kernels: dict[tuple[Any, ...], _Entry] = {}
        # the same entries by each argument's (type, dtype): what a signature is a function of, found
        # without _signature's checks on every call after the first of a signature
        self._by_types: dict[tuple[Any, ...], _Entry] = {}
        functools.update_wrapper(self, func)

    def _signature(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        sig: list[tuple[str, Any]] = []
        for k, a in enumerate(args):
            if isinstance(a, np.generic):   # before float: np.float64 is one
                if a.dtype.name not in DTYPES:
                    raise TypeError(f"{self.name}: argument {k} is a {a.dtype} scalar, which ewkern kernels do not hold")
                sig.append(("n", a.dtype.name))
            elif isinstance(a, bool):
                sig.append(("s", bool))
            elif isinstance(a, (int, float)):
                sig.append(("s", float if isinstance(a, float) else int))
            else:
                dt = _arg_dtype(a)
                if dt is None:
                    raise TypeError(f"{self.name}: argument {k} must be an array (NumPy, torch, CuPy, JAX, "
                                    f"ewkern.Array) or a scalar, got {type(a).__name__}"
                                    + (f" of dtype {getattr(a, 'dtype')}" if hasattr(a, "dtype") else ""))
                sig.append(("a", dt))
        return tuple(sig)

    def _build(self, sig: tuple[Any, ...]) -> _Entry:
        from .rtc import ElementwiseKernel
        if not any(kind == "a" for kind, _ in sig):
            raise TypeError(f"{self.name}: ewkern.fuse needs at least one array argument")
        trace = _Trace(self.name)
        stand_ins = []
        for k, (kind, what) in enumerate(sig):
            name = f"in{k}"
            if kind == "s":   # a Python scalar argument: typed where used (NEP 50), passed as float64/int64/bool
                dt = {bool: "bool", int: "int64", float: "float64"}[what]
                trace.params.append(f"{dt} {name}")
                stand_ins.append(_Var(trace, dt, name=name, sample_value=what(1)))
            else:
                trace.params.append(f"{what} {name}")
                stand_ins.append(_Var(trace, what, name=name))
                if kind == "a":
                    trace.arrays.add(name)
        got = self.func(*stand_ins)
        outs = list(got) if isinstance(got, tuple) else [got]
        if not outs or not all(isinstance(v, _Var) for v in outs):
            raise TypeError(f"{self.name}: an ewkern.fuse function must return a traced value or a tuple of "
                            f"them, got {type(got).__name__}"
                            + (f" holding {', '.join(type(v).__name__ for v in outs)}" if isinstance(got, tuple) else ""))
        out_params = ", ".join(f"{v.dtype} out{k}" for k, v in enumerate(outs))
        if trace.reduction is None:
            return (ElementwiseKernel(", ".join(trace.params), out_params, _source(outs), f"fuse_{self.name}"),
                    tuple(trace.consts), {}, "", tuple(sorted(trace.narrowed)))
        from .rtc import ReductionKernel
        kind, x, axis, keepdims, red = trace.reduction
        if len(outs) != 1:
            raise TypeError(f"{self.name}: an ewkern.fuse function with a reduction returns one value")
        after = _leaves(outs[0])
        if not any(v is red for v in after):   # by identity: == on a traced value traces
            raise TypeError(f"{self.name}: the reduction's result must be what the function returns (or what it "
                            "computes from it)")
        late = sorted(v.name for v in after if v.name in trace.arrays)
        if late:
            raise TypeError(f"{self.name}: after the reduction only its result and scalars can be used (not the "
                            f"array{'s' if len(late) > 1 else ''} {', '.join(late)})")
        # the map in the reduction's type (its result's compute type); the post map assigns the output
        reduce_expr, identity = _REDUCE[kind](red.dtype)
        return (ReductionKernel(", ".join(trace.params), out_params, _inline(x), reduce_expr,
                                f"out0 = {_inline(outs[0])}", identity, f"fuse_{self.name}",
                                reduce_type=_ctype(red.dtype)),
                tuple(trace.consts), {"axis": axis, "keepdims": keepdims}, kind if kind in ("max", "min") else "",
                tuple(sorted(trace.narrowed)))

    def kernel(self, *args: Any) -> Any:
        """The ewkern.ElementwiseKernel (ReductionKernel, for a function with a reduction) that
        these arguments run (compiled on first use; its inputs are the arguments, then the body's
        constants, which ``__call__`` passes itself; called itself, a max or min over an empty axis
        gives its identity, -inf or the type's lowest value for max, where ``__call__`` raises
        NumPy's ValueError)."""
        return self._entry(args)[0]

    def _entry(self, args: tuple[Any, ...]) -> _Entry:
        key = tuple([(type(a), getattr(a, "dtype", None)) for a in args])
        try:
            got = self._by_types.get(key)
        except TypeError:   # a dtype that does not hash
            key, got = (), None
        if got is None:
            sig = self._signature(args)
            got = self._kernels.get(sig)
            if got is None:
                got = self._kernels[sig] = self._build(sig)
            if key:
                self._by_types[key] = got
        return got

    def __call__(self, *args: Any) -> Any:
        kernel, consts, kw, no_identity, narrowed = self._entry(args)
        for k, dt in narrowed:
            # a Python int out of the integer type it meets: NumPy's OverflowError (NEP 50), where
            # the kernel's cast would wrap it (int8 array + 300 gave 45)
            try:
                np.empty((), dt)[()] = args[k]
            except OverflowError as e:
                raise OverflowError(f"{self.name}: argument {k}: {e}") from None
        if no_identity and any(0 in getattr(a, "shape", ()) for a in args):
            # max or min over an empty axis: NumPy's ValueError (the kernel would give its identity,
            # -inf or the lowest integer for max: it cannot raise), decided by NumPy on a zero-size array
            try:
                getattr(np, no_identity)(np.empty(np.broadcast_shapes(*(tuple(getattr(a, "shape", ())) for a in args)),
                                                  bool), axis=kw["axis"])
            except ValueError as e:
                raise ValueError(f"{self.name}: {e}") from None
        return kernel(*args, *consts, **kw)

    def __repr__(self) -> str:
        return f"<ewkern.fuse of {getattr(self.func, '__qualname__', self.name)}>"


def fuse(*args: Any, kernel_name: str | None = None) -> Any:
    """Fuse a function of arrays into one kernel, as ``cupy.fuse`` does: ``@ewkern.fuse`` or
    ``@ewkern.fuse(kernel_name="name")``.

    ::

        @ewkern.fuse
        def swish_gate(a, b):
            return a * ewkern.sigmoid(b)        # or a / (1 + np.exp(-b))

        y = swish_gate(x, g)   # one kernel; NumPy in, NumPy out; torch in, torch out

    Inside, arrays (the arguments) take Python's arithmetic and comparison operators, NumPy ufuncs
    (``np.exp``, ``np.maximum``, ...; SciPy's ``erf``/``erfc``), ``np.where`` and ewkern's
    elementwise ops, and one ``np.sum`` / ``np.mean`` / ``np.max`` / ``np.min`` / ``np.prod`` (or
    the method, with ``axis=`` and ``keepdims=``; then the kernel is a ReductionKernel);
    Python scalars take NumPy's weak typing. Each argument signature (array dtypes, scalar types)
    is traced once and compiled; arrays broadcast as NumPy's do. See ``Fusion.kernel`` for the
    kernel itself."""
    if args and callable(args[0]) and len(args) == 1:
        return Fusion(args[0], kernel_name)
    if args:
        raise TypeError("ewkern.fuse: use @ewkern.fuse or @ewkern.fuse(kernel_name=...)")
    return lambda func: Fusion(func, kernel_name)
