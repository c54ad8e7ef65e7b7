"""The backward of an elementwise kernel, derived from its operation (for ewkern.torch.kernel_op).

An operation of the form ``out = <expression>`` over its non-raw inputs, built from arithmetic
(``+ - * /``, unary minus, parentheses, float literals with or without ``f``) and the math
functions ewkern's ops use (exp, log, sqrt, rsqrt, erf, erfc, tanh, fabs/abs, sin, cos, pow and
their ``f`` forms), is differentiated symbolically (sympy, which torch depends on) and printed as C++.
The backward is one more ElementwiseKernel: it reads the incoming gradient and the inputs once and
writes every input's gradient in the same pass, ``grad_x = g * d out / d x``, in the compute type
(float for float32/float16/bfloat16, double for float64). Anything else (statements, conditionals,
casts, integer division, several outputs, raw parameters) gets a ValueError naming what is not
supported.
"""
from __future__ import annotations

import re

from ._params import Param

_SUPPORTED = ("exp", "log", "sqrt", "rsqrt", "erf", "erfc", "tanh", "fabs", "abs", "sin", "cos", "pow")
_FLOAT_SUFFIX = re.compile(r"((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[fF]\b")
_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)(?![\w.])")
GRAD_PREFIX = "_ewk_grad_"


def _sympy():
    try:
        import sympy
    except ImportError:   # pragma: no cover - torch depends on sympy
        raise ImportError("deriving a kernel's backward needs sympy (pip install sympy; torch installs it)") from None
    return sympy


def _expression(kernel: str, operation: str, out: Param) -> str:
    m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*=(?!=)(.*?);?\s*", operation, re.S)
    if not m or ";" in m.group(2):
        raise ValueError(f"{kernel}: a backward is derived only for an operation of the form "
                         f"'{out.name} = <expression>', got {operation!r}")
    if m.group(1) != out.name:
        raise ValueError(f"{kernel}: the operation assigns {m.group(1)!r}, not the output {out.name!r}")
    expr = m.group(2)
    for bad, what in (("?", "conditionals"), ("(float)", "casts"), ("(double)", "casts"), ("(T)", "casts"),
                      ("[", "indexing"), ("&", "bit operations"), ("|", "bit operations"), ("^", "'^'"),
                      ("%", "'%'"), ("<", "comparisons"), (">", "comparisons"), ("!", "'!'")):
        if bad in expr:
            raise ValueError(f"{kernel}: cannot derive a backward of {expr.strip()!r}: {what} are not supported")
    return _FLOAT_SUFFIX.sub(r"\1", expr)


def _hoist(sp, e, inv, table):
    """e with its largest subexpressions over the symbols inv alone (and the factors or terms of a
    product or sum that are, together) replaced by symbols _ewk_c0, _ewk_c1, ...: table maps each
    such subexpression to its symbol (shared between calls)."""
    if e.is_Atom:
        return e
    if e.free_symbols and e.free_symbols <= inv:
        return table.setdefault(e, sp.Symbol(f"_ewk_c{len(table)}", real=True))
    if isinstance(e, (sp.Mul, sp.Add)):
        fixed = [x for x in e.args if x.free_symbols and x.free_symbols <= inv]
        if len(fixed) >= 2:
            c = table.setdefault(e.func(*fixed), sp.Symbol(f"_ewk_c{len(table)}", real=True))
            return e.func(c, *[_hoist(sp, x, inv, table) for x in e.args if x not in fixed])
    return e.func(*[_hoist(sp, x, inv, table) for x in e.args])


def derive(kernel: str, operation: str, in_params, out_params, scalars=(), invariant=None,
           consts=None, split=None) -> dict[str, str]:
    """name -> C++ expression of d out / d name for every non-scalar input (in the inputs' names).
    scalars: input names that are scalars (not differentiated). invariant, consts: the names of
    inputs that are the same for every element (a row's reduction, its length, the scalars) and a
    dict: each derivative's largest subexpressions over those alone become symbols _ewk_c0, ...,
    and consts gets {symbol name: its C++ expression} (literals and casts in ``in0_type``, the
    compute type of the kernel's first input), to compute once (a row kernel's row constants).
    split (with consts: a dict): for each input named in it whose hoisted derivative is a product
    of row constants and a factor over the other inputs alone, split[name] becomes (C++ of the
    constant factor, C++ of the rest); the others are dropped from it."""
    sp = _sympy()
    if len(out_params) != 1 or out_params[0].raw:
        raise ValueError(f"{kernel}: a backward is derived only for one non-raw output")
    for p in in_params:
        if p.raw:
            raise ValueError(f"{kernel}: a backward is not derived for raw parameters ({p.name})")
    expr_src = _expression(kernel, operation, out_params[0])
    syms = {p.name: sp.Symbol(p.name, real=True) for p in in_params}
    rs = lambda x: 1 / sp.sqrt(x)
    funcs = {"exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt, "rsqrt": rs, "erf": sp.erf, "erfc": sp.erfc,
             "tanh": sp.tanh, "fabs": sp.Abs, "abs": sp.Abs, "sin": sp.sin, "cos": sp.cos, "pow": sp.Pow}
    funcs.update({k + "f": v for k, v in list(funcs.items()) if k != "abs"})
    for name in set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", expr_src)):
        if name not in funcs:
            raise ValueError(f"{kernel}: cannot derive a backward through {name}() (supported: "
                             f"{', '.join(_SUPPORTED)} and their f forms)")
    for name in set(re.findall(r"\b([A-Za-z_]\w*)\b", expr_src)) - set(funcs):
        if name not in syms and not re.fullmatch(r"[eE]\d*", name):
            raise ValueError(f"{kernel}: cannot derive a backward: {name!r} is not an input of the kernel")
    if re.search(r"(?<![\w.])\d+\s*/\s*\d+(?![\w.])", expr_src):
        raise ValueError(f"{kernel}: cannot derive a backward of {expr_src.strip()!r}: integer division "
                         "(write 1.0f / 2)")
    try:
        expr = sp.parse_expr(expr_src, local_dict={**syms, **funcs}, evaluate=True)
    except Exception as e:
        raise ValueError(f"{kernel}: cannot derive a backward of {expr_src.strip()!r}: {e}") from None

    def square(b, e):
        return f"(({b}) * ({b}))"

    def is_(v):
        return lambda b, e: bool(e.is_Number) and float(e) == v

    user = {"Pow": [(is_(2), square), (is_(-1), lambda b, e: f"(1 / ({b}))"),
                    (is_(-2), lambda b, e: f"(1 / {square(b, e)})"), (is_(0.5), lambda b, e: f"sqrt({b})"),
                    (is_(-0.5), lambda b, e: f"rsqrt({b})"), (lambda b, e: True, "pow")],
            "Abs": "fabs"}
    def c_code(d, what, cast="decltype(_g)"):
        try:
            code = sp.ccode(d, user_functions=user)
        except Exception as e:   # pragma: no cover - a function sympy cannot print
            raise ValueError(f"{kernel}: cannot print the derivative by {what} as C: {e}") from None
        if "Heaviside" in code or "Derivative" in code or "M_" in code:
            raise ValueError(f"{kernel}: the derivative by {what} ({d}) has no C form here")
        # literals in the compute type (float kernels stay in float)
        return _NUMBER.sub(cast + r"(\1)", code)

    inv = {syms[n] for n in (invariant or ()) if n in syms}
    table: dict = {}
    grads = {}
    for p in in_params:
        if p.name in scalars:
            continue
        # not simplified: sympy's simpler forms can overflow where the plain derivative does not
        # (d/db a / (1 + e^-b) becomes e^b / (e^b + 1))
        d = sp.diff(expr, syms[p.name])
        d = d.xreplace({c: sp.Float(c.evalf(17), 17) for c in d.atoms(sp.NumberSymbol)})
        d = d.xreplace({c: sp.Float(c, 17) for c in d.atoms(sp.Rational) if not c.is_Integer})
        if consts is not None and inv:
            d = _hoist(sp, d, inv, table)
        grads[p.name] = c_code(d, p.name)
        if split is not None and p.name in split:
            fixed = inv | set(table.values())
            args = d.args if isinstance(d, sp.Mul) else (d,)
            const = [x for x in args if x.free_symbols <= fixed]
            rest = [x for x in args if not x.free_symbols <= fixed]
            split[p.name] = None
            # (a derivative that is a number, 0 where out does not read a, stays whole: C = 0
            # times a sum that may overflow would be NaN)
            if d.free_symbols and not any(x.free_symbols & fixed for x in rest):
                split[p.name] = (c_code(sp.Mul(*const), p.name), c_code(sp.Mul(*rest), p.name))
    if split is not None:
        for n in [n for n, v in split.items() if v is None]:
            del split[n]
    if consts is not None:
        for e, c in table.items():
            consts[c.name] = c_code(e, c.name, "in0_type")
    return grads


def backward_source(kernel: str, operation: str, in_params, out_params, scalars=(), need=None) -> tuple[str, str, str]:
    """(in_params, out_params, operation) of the backward ElementwiseKernel: inputs the incoming
    gradient ``_g`` (the output's type) then the forward's inputs, outputs one gradient per
    non-scalar input (its type; need: only those of the inputs named there), written in one pass."""
    grads = derive(kernel, operation, in_params, out_params, scalars)
    if need is not None:
        grads = {n: c for n, c in grads.items() if n in need}
    out = out_params[0]
    ins = [f"{out.ctype} _g"] + [f"{p.ctype} {p.name}" for p in in_params]
    outs = [f"{p.ctype} {GRAD_PREFIX}{p.name}" for p in in_params if p.name in grads]
    body = "; ".join(f"{GRAD_PREFIX}{n} = _g * ({c})" for n, c in grads.items())
    return ", ".join(ins), ", ".join(outs), body


def _word_sub(code: str, name: str, new: str) -> str:
    return re.sub(rf"(?<![\w.]){re.escape(name)}(?!\w)", new, code)


def row_backward_source(kernel: str, map_expr: str, reduce_expr: str, identity: str, operation: str, in_params,
                        out_params, scalars=(), need=None
                        ) -> tuple[str, str, tuple[str, str, str] | None, str, tuple[tuple[str, str], ...]]:
    """The backward of a RowKernel whose reduction is a sum: for each row, a = sum_j m(x_j) and
    y_i = f(x_i, a), so with g the incoming gradient

        d L / d x_k = g_k f_x(x_k, a) + m'(x_k) S,    S = sum_i g_i f_a(x_i, a).

    Returns (in_params, out_params, stage2, operation, row constants) of the backward RowKernel, one kernel: its
    first reduction is the forward's (map_expr, a sum from 0: a again), its second (stage2, with a
    in scope) reduces S into _ewk_s, and its operation writes every non-scalar input's gradient
    (its type) in the same pass over the row; inputs the incoming gradient ``_g`` then the
    forward's inputs. The row constants ((name, C++ expression), ...: the derivatives' parts over a,
    the row's length and the scalars alone, such as rsqrt(eps + a / n)) are computed once a row
    after the first reduction (RowKernel's _consts) instead of once an element, where a float
    division's slow path kept the compiler from hoisting them (sm_90 SASS, rmsnorm's float16
    backward: 16 division calls and 23 MUFU in the 16 elements of a lane). need: the gradients of
    only the inputs named there (then stage2 is None when none of them reads S). ValueError for
    what it cannot derive (a reduction other than a sum from 0, several outputs, what derive()
    refuses)."""
    from ._codegen import ROW_STAGE2
    if re.sub(r"\s", "", reduce_expr) not in ("a+b", "b+a"):
        raise ValueError(f"{kernel}: a backward is derived only for a sum reduction ('a + b'), got {reduce_expr!r}")
    if re.sub(r"[\s.fF]", "", str(identity)) not in ("0", "00"):
        raise ValueError(f"{kernel}: a backward is derived only for a sum from 0, got identity {identity!r}")
    if len(out_params) != 1:
        raise ValueError(f"{kernel}: a backward is derived only for one output")
    taken = {p.name for p in in_params} & {"a", "b", "_g", ROW_STAGE2, "_row_size"}
    if taken:
        raise ValueError(f"{kernel}: a backward is not derived when an input is named {sorted(taken)}")
    if "_row_size" in map_expr or re.search(r"(?<!\w)i(?!\w)", map_expr + operation):
        raise ValueError(f"{kernel}: a backward is not derived when map_expr reads _row_size or an expression "
                         "reads the index i")
    from ._params import parse_params
    extra = parse_params("float64 a, float64 _row_size", False, kernel)
    consts: dict[str, str] = {}
    # S's terms as a row constant times a factor free of a (rmsnorm: -x w rsqrt(a / n + eps)^3 / n):
    # then S = C sum_i g_i h(x_i), and that sum needs no a, so the kernel reduces it in the same
    # pass over the row as a (RowKernel's codegen fuses an a-free second map into the first)
    split: dict = {"a": None}
    f_grads = derive(kernel, operation, tuple(in_params) + extra, out_params, tuple(scalars) + ("_row_size",),
                     invariant=("a", "_row_size") + tuple(scalars), consts=consts, split=split)
    s_const, s_term = split.get("a") or ("1", f_grads["a"])
    # C S as one product of row values (ptxas hoists it out of the element loop; dm * C * S
    # would cost a multiply an element)
    s_value = ROW_STAGE2 if s_const.strip() in ("1", "decltype(_g)(1)") else f"(({s_const}) * {ROW_STAGE2})"
    (m_out,) = parse_params("float64 _ewk_m", True, kernel)
    m_grads = derive(kernel, f"_ewk_m = {map_expr}", in_params, (m_out,), scalars)
    out = out_params[0]
    ins = [f"{out.ctype} _g"] + [f"{p.ctype} {p.name}" for p in in_params]
    outs, body = [], []
    for p in in_params:
        if p.name in scalars or (need is not None and p.name not in need):
            continue
        outs.append(f"{p.ctype} {GRAD_PREFIX}{p.name}")
        term = f"_g * ({f_grads[p.name]})"
        dm = m_grads.get(p.name, "0")
        if dm.strip() not in ("0", "decltype(_g)(0)"):
            term += f" + ({dm}) * {s_value}"
        body.append(f"{GRAD_PREFIX}{p.name} = {term}")
    # the row's length as a value of the compute type: a derivative such as -1/_row_size is not integer division
    fix = (lambda c: _word_sub(c, "_row_size", "decltype(_g)(_row_size)"))
    stage2 = (fix(f"_g * ({s_term})"), "a + b", "0") if any(ROW_STAGE2 in b for b in body) else None
    operation = fix("; ".join(body))
    used = operation + " " + (stage2[0] if stage2 else "")
    row = tuple((n, _word_sub(c, "_row_size", "in0_type(_row_size)")) for n, c in consts.items()
                if re.search(r"\b%s\b" % n, used))
    return ", ".join(ins), ", ".join(outs), stage2, operation, row


# a ReductionKernel's backward: the recomputed reduction and the sizes of CuPy's post_map_expr
RED_A, RED_NIN, RED_NOUT = "_ewk_a", "_ewk_nin", "_ewk_nout"


def reduction_backward_source(kernel: str, map_expr: str, reduce_expr: str, identity: str | None,
                              post_map_expr: str, in_params, out_params, scalars=(), need=None,
                              a_type: str = "float32") -> tuple[str, str, str]:
    """The backward of a ReductionKernel whose reduction is a sum: for each output, a = sum_j
    m(x_j) over its reduced elements and y = f(a), so with g the output's incoming gradient

        d L / d x_k = g f'(a) m'(x_k).

    Returns (in_params, out_params, operation) of one backward ElementwiseKernel, which broadcasts
    g and a (both kept-dims shaped, a recomputed by the forward's reduction) against the inputs and
    writes every non-scalar input's gradient (its type; need: only those named there) in one pass.
    Its inputs: ``_g`` (the output's type), ``_ewk_a`` (a_type: the reduction recomputed), the
    forward's inputs, then ``_ewk_nin`` and ``_ewk_nout`` (a_type scalars: post_map_expr's
    ``_in_ind.size()`` and ``_out_ind.size()``). ValueError for what it cannot derive (a reduction
    other than a sum from 0, several outputs, a map_expr that reads the sizes or the index, what
    derive() refuses)."""
    from ._params import parse_params
    if re.sub(r"\s", "", reduce_expr) not in ("a+b", "b+a"):
        raise ValueError(f"{kernel}: a backward is derived only for a sum reduction ('a + b'), got {reduce_expr!r}")
    if identity is None or re.sub(r"[\s.fF]", "", str(identity)) not in ("0", "00"):
        raise ValueError(f"{kernel}: a backward is derived only for a sum from 0, got identity {identity!r}")
    if len(out_params) != 1:
        raise ValueError(f"{kernel}: a backward is derived only for one output")
    taken = {p.name for p in in_params} & {"_g", RED_A, RED_NIN, RED_NOUT}
    if taken:
        raise ValueError(f"{kernel}: a backward is not derived when an input is named {sorted(taken)}")
    if "_ind" in map_expr or re.search(r"(?<!\w)i(?!\w)", map_expr):
        raise ValueError(f"{kernel}: a backward is not derived when map_expr reads the sizes or the index i")
    # post_map_expr's a (the reduced value; an input may be named a too) and sizes, by our names
    post = _word_sub(post_map_expr, "a", RED_A)
    post = re.sub(r"_in_ind\s*\.\s*size\s*\(\s*\)", RED_NIN, post)
    post = re.sub(r"_out_ind\s*\.\s*size\s*\(\s*\)", RED_NOUT, post)
    if "_ind" in post or re.search(r"(?<!\w)i(?!\w)", post):
        raise ValueError(f"{kernel}: a backward is not derived when post_map_expr reads the index")
    sizes = parse_params(f"float64 {RED_A}, float64 {RED_NIN}, float64 {RED_NOUT}", False, kernel)
    f_grads = derive(kernel, post, tuple(p for p in in_params if p.name in scalars) + sizes, out_params,
                     tuple(scalars) + (RED_NIN, RED_NOUT))
    (m_out,) = parse_params("float64 _ewk_m", True, kernel)
    m_grads = derive(kernel, f"_ewk_m = {map_expr}", in_params, (m_out,), scalars)
    fa = f_grads[RED_A]
    out = out_params[0]
    ins = [f"{out.ctype} _g", f"{a_type} {RED_A}"] + [f"{p.ctype} {p.name}" for p in in_params] + \
        [f"{a_type} {RED_NIN}", f"{a_type} {RED_NOUT}"]
    outs, body = [], []
    for p in in_params:
        if p.name in scalars or (need is not None and p.name not in need):
            continue
        outs.append(f"{p.ctype} {GRAD_PREFIX}{p.name}")
        body.append(f"{GRAD_PREFIX}{p.name} = _g * ({fa}) * ({m_grads.get(p.name, '0')})")
    if not outs:
        raise ValueError(f"{kernel}: no input to take a gradient of")
    return ", ".join(ins), ", ".join(outs), "; ".join(body)
