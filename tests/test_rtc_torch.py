"""ewkern.torch.kernel_op (issue 21 item 4): a user's ElementwiseKernel as a torch custom op with a
fake kernel (torch.compile fullgraph, opcheck) and, where the operation is `out = <expression>`,
a backward derived symbolically and run as one more kernel (ewkern/rtc/_autodiff.py); RowKernels
and ReductionKernels (axis=, keepdims=; a sum's backward derived) the same way."""
import re

import pytest

torch = pytest.importorskip("torch")

import ewkern  # noqa: E402
import ewkern.torch as ewt  # noqa: E402
from ewkern.rtc._autodiff import derive  # noqa: E402
from ewkern.rtc._params import parse_params  # noqa: E402
from conftest import HAS_CUDA, dispatch_recorder, vmap_rules_only  # noqa: E402


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EWKERN_CACHE_DIR", str(tmp_path / "kernels"))


_n = iter(range(10**6))


def _op(ins, operation, scalars=()):
    k = ewkern.ElementwiseKernel(ins, "T o", operation, f"uk{next(_n)}")
    return ewt.kernel_op(k, scalars=scalars)


DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ins,operation,torch_fn", [
    ("T a, T b, T c", "o = a * b + c", lambda a, b, c: a * b + c),
    ("T a, T b", "o = 0.5*a*(1.0+erf(a*0.7071067811865476))*b", lambda a, b: torch.nn.functional.gelu(a) * b),
    ("T a, T b", "o = a / (1 + exp(-b))", lambda a, b: a * torch.sigmoid(b)),
    ("T a", "o = sqrt(a * a + 1) + tanh(a) - log(fabs(a) + 2) * rsqrt(a * a + 3)",
     lambda a: torch.sqrt(a * a + 1) + torch.tanh(a) - torch.log(a.abs() + 2) * torch.rsqrt(a * a + 3)),
])
def test_derived_backward_matches_torch_autograd(device, ins, operation, torch_fn):
    op = _op(ins, operation)
    n = len(ins.split(","))
    xs = [torch.randn(37, 41, dtype=torch.float64, device=device, requires_grad=True) for _ in range(n)]
    y = op(*xs)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, xs, g)
    ref_x = [x.detach().clone().requires_grad_() for x in xs]
    want = torch.autograd.grad(torch_fn(*ref_x), ref_x, g)
    torch.testing.assert_close(y, torch_fn(*ref_x), rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(op, [x.detach()[:3, :4].clone().requires_grad_() for x in xs])


def test_broadcast_scalar_compile_and_opcheck():
    op = _op("T x, T w", "o = x * w")
    x = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    gx, gw = torch.autograd.grad(op(x, w).sum(), (x, w))
    torch.testing.assert_close(gx, w.detach().expand(8, 5))
    torch.testing.assert_close(gw, x.detach().sum(0))   # summed to the broadcast input's shape
    rn = _op("T x, T eps", "o = x * rsqrt(x * x + eps)", scalars=("eps",))
    assert torch.autograd.gradcheck(lambda t: rn(t, 1e-2), (x[:2],))
    f = torch.compile(lambda a, b: op(a, b).sum(), fullgraph=True)
    y = f(x, w)
    y.backward()
    torch.testing.assert_close(w.grad, x.detach().sum(0))
    torch.library.opcheck(op, (x.detach().requires_grad_(), w.detach().requires_grad_()))
    # float32 in, float32 out, through the compute type (literals stay float)
    x32 = torch.randn(1000, requires_grad=True)
    y32 = _op("T a", "o = 0.5f * a * a")(x32)
    assert y32.dtype == torch.float32
    (g,) = torch.autograd.grad(y32.sum(), x32)
    torch.testing.assert_close(g, x32.detach())


def test_no_derivable_backward_raises_on_backward_only():
    op = _op("T a", "o = a > 0 ? a : 0")
    a = torch.randn(10, requires_grad=True)
    y = op(a)   # the forward runs
    torch.testing.assert_close(y, a.detach().clamp_min(0))
    with pytest.raises(RuntimeError, match="no backward: .*conditionals"):
        y.sum().backward()


def _row_op(ins, map_expr, operation, scalars=(), reduce_expr="a + b", identity="0"):
    k = ewkern.RowKernel(ins, "T y", map_expr, reduce_expr, operation, identity, f"uk{next(_n)}")
    return ewt.kernel_op(k, scalars=scalars)


@pytest.mark.parametrize("device", DEVICES)
def test_row_kernel_op_eager_compile_opcheck_and_derived_backward(device):
    """A RowKernel (rmsnorm with a weight row and eps) as a custom op: the eager result, its
    derived backward against torch autograd of the same expression, torch.compile fullgraph
    through forward and backward, opcheck."""
    op = _row_op("T x, T w, float32 eps", "x * x", "y = x * rsqrt(a / _row_size + eps) * w", ("eps",))

    def ref(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w

    x = torch.randn(6, 256, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(256, dtype=torch.float64, device=device, requires_grad=True)
    g = torch.randn(6, 256, dtype=torch.float64, device=device)
    y = op(x, w, 1e-5)
    torch.testing.assert_close(y, ref(x, w).detach())
    gx, gw = torch.autograd.grad(y, (x, w), g)
    rx, rw = torch.autograd.grad(ref(x, w), (x, w), g)
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)   # summed over the rows to the weight's shape
    assert torch.autograd.gradcheck(lambda a, b: op(a, b, 1e-5), (x[:2, :16].detach().requires_grad_(),
                                                                     w[:16].detach().requires_grad_()))
    f = torch.compile(lambda a, b: (op(a, b, 1e-5) * g).sum(), fullgraph=True)
    gx2, gw2 = torch.autograd.grad(f(x, w), (x, w))
    torch.testing.assert_close(gx2, rx)
    torch.testing.assert_close(gw2, rw)
    torch.library.opcheck(op, (x, w, 1e-5))
    # float32 and a 16-bit dtype: the gradient in the compute type, rounded once
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        xs = x.detach().to(dt).requires_grad_()
        ws = w.detach().to(dt).requires_grad_()
        gxs, gws = torch.autograd.grad(op(xs, ws, 1e-5), (xs, ws), g.to(dt))
        rx2, rw2 = torch.autograd.grad(ref(xs.double(), ws.double()), (xs, ws), g.to(dt).double())
        assert gxs.dtype == dt and gws.dtype == dt
        torch.testing.assert_close(gxs.double(), rx2.double(), rtol=tol, atol=tol * float(rx2.abs().max()))
        torch.testing.assert_close(gws.double(), rw2.double(), rtol=tol, atol=tol * 6 * float(rw2.abs().max()))


@pytest.mark.parametrize("ins,map_expr,operation,torch_fn", [
    ("T x", "x * x", "y = x * rsqrt(a)", lambda x, z: x / x.norm(dim=-1, keepdim=True)),
    ("T x", "x", "y = x - a / _row_size", lambda x, z: x - x.mean(-1, keepdim=True)),
    ("T x, T z", "(x - z) * (x - z)", "y = exp(-a / _row_size) * z + x",
     lambda x, z: torch.exp(-((x - z) ** 2).mean(-1, keepdim=True)) * z + x),
])
def test_row_kernel_derived_backward_matches_torch(ins, map_expr, operation, torch_fn):
    op = _row_op(ins, map_expr, operation)
    x = torch.randn(5, 33, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 33, dtype=torch.float64, requires_grad=True)
    args = (x, z) if "z" in ins else (x,)
    g = torch.randn(5, 33, dtype=torch.float64)
    want = torch.autograd.grad(torch_fn(x, z), args, g, allow_unused=True)
    got = torch.autograd.grad(op(*args), args, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def _rmsnorm_backward_layout(dtype, colsum):
    """(layout, typedefs, stage2, operation) of rmsnorm's derived backward (with a weight row) for
    CUDA in dtype, the outputs named in colsum as column sums; skips where NVRTC is missing."""
    from ewkern.rtc import _build, _codegen
    from ewkern.rtc._autodiff import row_backward_source
    try:
        _build.nvrtc()
    except RuntimeError as e:
        pytest.skip(str(e))
    ins, outs = parse_params("T x, T w, float32 eps", False, "k"), parse_params("T y", True, "k")
    bw_in, bw_out, stage2, body, consts = row_backward_source("k", "x * x", "a + b", "0",
                                                              "y = x * rsqrt(a / _row_size + eps) * w", ins, outs,
                                                              ("eps",))
    bi, bo = parse_params(bw_in, False, "kb"), parse_params(bw_out, True, "kb")
    kinds = {"_g": "array", "x": "array", "w": "bcol", "eps": "scalar"}
    in_dts = [{"eps": "float32"}.get(p.name, dtype) for p in bi]
    lay = _codegen.Layout("contig", 1, [(p, dt, kinds[p.name], 0) for p, dt in zip(bi, in_dts)] +
                          [(p, dtype, "colsum" if p.name in colsum else "array", 0) for p in bo])
    return lay, _codegen.typedefs((("T", dtype),), bi, in_dts, bo, [dtype] * len(bo)), stage2, body, consts


def test_row_backward_second_sum_free_of_a_is_folded_into_the_first_pass():
    """Where S's terms are a row constant times a factor free of a (rmsnorm: d y / d a = -x w
    rsqrt(a / n + eps)^3 / 2n), the derived second map reads neither a nor a row constant, the
    operation scales S by the constant once (C * S, one product ptxas hoists), and row_source maps
    it beside the first map: CUDA's two-pass form reads the row twice, not three times, and the CPU
    makes two passes; a layer norm's variance (its map needs a) keeps the separate pass."""
    from ewkern.rtc import _codegen
    from ewkern.rtc._autodiff import row_backward_source
    ins, outs = parse_params("T x, T w, float32 eps", False, "k"), parse_params("T y", True, "k")
    _, _, stage2, body, consts = row_backward_source("k", "x * x", "a + b", "0",
                                                     "y = x * rsqrt(a / _row_size + eps) * w", ins, outs, ("eps",))
    names = set(re.findall(r"\w+", stage2[0]))
    assert not names & ({"a", "_ewk_s"} | {n for n, _ in consts}), stage2
    assert re.search(r"\* \(\([^;]*_ewk_c\d\) \* _ewk_s\)", body), body
    lay, tdefs, stage2, body, consts = _rmsnorm_backward_layout("float32", ())
    for backend in ("cuda", "cpu"):
        for map2, fused in ((stage2[0], True), (stage2[0] + " * a", False)):
            src, _ = _codegen.row_source(backend, "rowkf", lay, 4 if backend == "cuda" else 1, "x * x", "a + b", body,
                                         "0", "float", "", tdefs, set(), (map2,) + stage2[1:], None, consts)
            # passes over the row: CUDA's two-pass form's loops; the CPU's column loops (its entry has
            # a threaded and a one-thread copy of the row loop)
            passes = src.count("for (int _v0 = _lane;") if backend == "cuda" else src.count("for (long long _ew_c = ")
            assert ("const type_reduce _m2 =" in src) == fused and passes == (2 if fused else 3) * (1 if backend == "cuda" else 2), \
                (backend, map2, passes)
    x1 = parse_params("T x, float32 eps", False, "k")
    _, _, st2, _, c2 = row_backward_source("k", "x", "a + b", "0", "y = (x - a / _row_size) * (x - a / _row_size)",
                                           x1, outs, ("eps",))
    assert set(re.findall(r"\w+", st2[0])) & {n for n, _ in c2}, st2
    # an operation that does not read a: its derivative 0 stays whole (no 0 x a sum that may overflow)
    _, _, st3, body3, _ = row_backward_source("k", "x * x", "a + b", "0", "y = x * w", ins, outs, ("eps",))
    assert st3[0] == "_g * (0)" and "_ewk_s" in body3 and "((" not in body3, (st3, body3)
    # and the gradients stay right through the fused pass (CPU; float64 against torch's autograd)
    op = ewt.kernel_op(ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                                        "y = x * rsqrt(a / _row_size + eps) * w", "0", "rms_fused2"), scalars=("eps",))
    x = (torch.rand(5, 37, dtype=torch.float64) * 4 - 2).requires_grad_()
    w = (torch.rand(37, dtype=torch.float64) + 0.5).requires_grad_()
    torch.autograd.gradcheck(lambda x, w: op(x, w, 1e-5), (x, w))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_row_kernel_derived_backward_compiles_for_cuda(dtype):
    """The derived backward row kernel (rmsnorm with a weight row: two reductions over the row,
    then both gradients) compiles with NVRTC to PTX in every form, and holds x and the gradient in
    registers through both reductions, the weight row not at all (no GPU needed)."""
    from ewkern.rtc import _build, _codegen
    lay, tdefs, stage2, body, consts = _rmsnorm_backward_layout(dtype, ())
    rt = "double" if dtype == "float64" else "float"
    E = 16 // {"float64": 8, "float32": 4}.get(dtype, 2)
    src, entries = _codegen.row_source("cuda", "rowkb", lay, E, "x * x", "a + b", body, "0", rt, "", tdefs, set(),
                                       stage2, None, consts)
    assert "_r_x[_ewrtc_VPL" in src and "_r__g[_ewrtc_VPL" in src and "_r_w[" not in src   # w read where used (L1/L2)
    ptx, _, _ = _build.compile_cuda("rowkb", src, (9, 0), ptx_only=True)
    assert [e for e in entries if f".entry {e}" not in ptx.decode(errors="replace")] == []


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_row_backward_with_a_column_sum_fits_its_plan_without_spills(tmp_path, dtype):
    """The derived rmsnorm backward with the weight's gradient as a column sum (held in registers
    across the tiles), sm_90 by ptxas: no spills (the row entries are bounded by the largest block
    they launch with, COLSUM_BLOCK, not 1024), the block's groups combining their sums in shared
    memory, and the lanes an SM holds for rows of 4096 against _COLSUM_MIN_THREADS: row_plan's G
    with 4 vectors a lane where that fills it, else twice the lanes with 2 vectors, which
    _cuda_run then takes (float16/bfloat16: G 128 at 99-104 registers holds 512 lanes; float32: G
    256 at 80-81 registers, 768 or 512 lanes: the partial row's vector stores took the 81st);
    16-bit in blocks of 512 lanes (two groups, half the partial rows) because as many of those are
    resident."""
    from conftest import blocks_per_sm, ptxas_registers
    from ewkern.rtc import _build, _codegen, _rowkernel
    from ewkern.rtc._autodiff import GRAD_PREFIX
    lay, tdefs, stage2, body, consts = _rmsnorm_backward_layout(dtype, (GRAD_PREFIX + "w",))
    E = 16 // (4 if dtype == "float32" else 2)
    G, vpl = _rowkernel.row_plan(4096 // E)
    lanes, wide = {}, {}
    for g, v in ((G, vpl), (2 * G, vpl // 2)):
        src, entries = _codegen.row_source("cuda", "rowkc", lay, E, "x * x", "a + b", body, "0", "float", "", tdefs,
                                           set(), stage2, g, consts)
        assert f"__launch_bounds__({max(256, g, _codegen.COLSUM_BLOCK)})" in src
        assert "_ca_" + GRAD_PREFIX + "w[_q][_k] +=" in src and "__shared__ float _cb_" + GRAD_PREFIX + "w" in src
        assert _codegen.colsum_combines(g, v, E, [4])
        ptx, _, _ = _build.compile_cuda("rowkc", src, (9, 0), ptx_only=True)
        regs = ptxas_registers(ptx, tmp_path)   # fails on any spill
        block = max(256, g)
        r = regs[entries[_codegen.ROW_FORMS.index(v)]]
        lanes[g] = blocks_per_sm(r, block) * block
        wide[g] = blocks_per_sm(r, 2 * block) * 2 * block
    assert (G, vpl) == ((256, 4) if dtype == "float32" else (128, 4))
    taken = G if lanes[G] >= _rowkernel._COLSUM_MIN_THREADS or lanes[2 * G] <= lanes[G] else 2 * G
    assert lanes[taken] >= _rowkernel._COLSUM_MIN_THREADS, lanes
    if dtype != "float32":
        assert taken == 2 * G and wide[2 * G] >= lanes[2 * G], (lanes, wide)


def test_row_kernel_without_a_derivable_backward_raises_on_backward_only():
    op = _row_op("T x", "x", "y = x / a", reduce_expr="max(a, b)", identity="-INFINITY")
    x = torch.rand(4, 8, dtype=torch.float64, requires_grad=True) + 0.5
    y = op(x)
    torch.testing.assert_close(y, (x / x.amax(-1, keepdim=True)).detach())
    with pytest.raises(RuntimeError, match="no backward: .*sum reduction"):
        y.sum().backward()


def test_forward_mode_ad_is_refused_not_dropped():
    """A user kernel's op has no jvp: a dual tensor in a forward_ad.dual_level raises
    NotImplementedError naming the op (torch's custom op alone would return the result without a
    tangent); plain tensors there still run."""
    import torch.autograd.forward_ad as fwad
    op = _op("T a, T b", "o = a * b + a")
    red = ewt.kernel_op(ewkern.ReductionKernel("T a", "T o", "a * a", "a + b", "o = a", "0", f"uk{next(_n)}"))
    x = torch.rand(5, dtype=torch.float64)
    with fwad.dual_level():
        d = fwad.make_dual(x, torch.ones_like(x))
        with pytest.raises(NotImplementedError, match=rf"ewkern_user.{op._name}: forward-mode AD"):
            op(d, x)
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            red(d, axis=0)
        torch.testing.assert_close(op(x, x), x * x + x)


def test_torch_func_grad_is_refused_by_name_and_vmap_runs():
    """torch.func's grad and jvp over a user kernel's op raise NotImplementedError naming it
    (torch's own error speaks of an autograd.Function's setup_context), also under vmap or
    through one; the op on tensors the transform does not track, and vmap alone, run."""
    op = _op("T a, T b", "o = a * b + a")
    x, c = torch.rand(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    refused = [lambda: torch.func.grad(lambda t: op(t, c).sum())(x),
               lambda: torch.func.vmap(torch.func.grad(lambda t: op(t, c).sum()))(x[None]),
               lambda: torch.func.grad(lambda t: torch.func.vmap(lambda u: op(u, c))(t[None]).sum())(x),
               lambda: torch.func.jvp(lambda t: op(t, c), (x,), (c,))]
    for call in refused:
        with pytest.raises(NotImplementedError, match=rf"ewkern_user.{op._name}: "):
            call()
    torch.testing.assert_close(torch.func.grad(lambda t: (op(c, c) * t).sum())(x), c * c + c)
    torch.testing.assert_close(torch.func.vmap(op)(x[None], c[None]), (x * c + x)[None])


def _per_sample(f, args, dims):
    """What vmap means: f on each sample, stacked."""
    n = next(t.shape[d] for t, d in zip(args, dims) if d is not None)
    outs = [f(*[t.select(d, b) if d is not None else t for t, d in zip(args, dims)]) for b in range(n)]
    return tuple(torch.stack(o) for o in zip(*outs)) if isinstance(outs[0], tuple) else torch.stack(outs)


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_batching_rules_of_user_ops(device):
    """Each kind of user op has a batching rule (torch's per-sample fallback disabled): the batch
    as a leading axis against broadcast inputs (ElementwiseKernel with one and two outputs,
    RowKernel with a repeated weight row batched or not), a ReductionKernel's axes shifted past it
    (None, an int, a negative one, two, keepdims), raw inputs one call a sample; the results equal
    the op on each sample."""
    f64 = dict(dtype=torch.float64, device=device)
    fma = _op("T x, T y", "o = x * y + x")
    two = ewt.kernel_op(ewkern.ElementwiseKernel("T x, T y", "T z, T w", "z = x + y; w = x * y", f"uk{next(_n)}"))
    row = ewt.kernel_op(ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                                         "y = x * rsqrt(a / _row_size + eps) * w", "0", f"uk{next(_n)}"),
                        scalars=("eps",))
    red = ewt.kernel_op(ewkern.ReductionKernel("T a, T b", "T o", "(a - b) * (a - b)", "a + b", "o = sqrt(a)", "0",
                                               f"uk{next(_n)}"))
    raw = ewt.kernel_op(ewkern.ElementwiseKernel("raw T x, T y", "T z", "z = x[i] + y", f"uk{next(_n)}"))
    X, Y, W = torch.randn(3, 4, 8, **f64), torch.randn(4, 8, **f64), torch.rand(8, **f64) + 0.5
    cases = [(fma, (X, Y), (0, None)), (fma, (Y, X.transpose(0, 1)), (None, 1)), (fma, (X, W), (0, None)),
             (fma, (torch.randn(3, 8, **f64), X[0]), (0, None)), (two, (X, Y), (0, None)),
             (lambda x, w: row(x, w, 1e-6), (X, W), (0, None)),
             (lambda x, w: row(x, w, 1e-6), (X[0], torch.rand(3, 8, **f64)), (None, 0)),
             (raw, (torch.randn(3, 8, **f64), torch.randn(3, 8, **f64)), (0, 0))]
    for axis in (None, 0, -1, (0, 1)):
        for keepdims in (False, True):
            cases.append((lambda a, b, axis=axis, keepdims=keepdims: red(a, b, axis=axis, keepdims=keepdims),
                          (X, Y), (0, None)))
    with vmap_rules_only():
        for f, args, dims in cases:
            got, want = torch.func.vmap(f, in_dims=dims)(*args), _per_sample(f, args, dims)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_kernel_op_bad_arguments():
    k = ewkern.ElementwiseKernel("T a", "T o", "o = a", "kop_bad")
    with pytest.raises(TypeError, match="ElementwiseKernel, RowKernel or ReductionKernel"):
        ewt.kernel_op(lambda a: a)
    with pytest.raises(ValueError, match="scalars .*'zz'"):
        ewt.kernel_op(k, scalars=("zz",), name="kop_bad2")


@pytest.mark.parametrize("operation,match", [
    ("o = (float)a", "casts"), ("o = foo(a)", "foo"), ("y = a", "assigns 'y'"), ("o = a; o += 1", "form"),
    ("o = 1/2*a", "integer division"), ("o = a * q", "'q' is not an input"), ("o = a[0]", "indexing")])
def test_derive_refuses_what_it_cannot_differentiate(operation, match):
    with pytest.raises(ValueError, match=match):
        derive("k", operation, parse_params("T a", False, "k"), parse_params("T o", True, "k"))


def test_derived_code_keeps_float_literals_in_the_compute_type():
    (code,) = derive("k", "o = 0.5f * exp(2.5f * a)", parse_params("T a", False, "k"),
                     parse_params("T o", True, "k")).values()
    assert code.count("decltype(_g)(") == 2 and "exp(" in code
    assert not re.search(r"\d[fF]\b", code)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_calls_skip_the_dispatcher_and_modes_see_the_custom_op(device, monkeypatch):
    """Plain tensors outside torch.compile run the kernels under an autograd node of their own
    (the C++ module's, or an autograd.Function; the custom op's dispatch costs host time in every
    eager step); the same values and gradients as
    through torch.ops; under a dispatch mode the mode sees torch.ops.ewkern_user.<name>; a
    strided input and double backward behave as documented; without a tensor that needs a
    gradient the kernel runs by itself."""
    k = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w", "0", f"eager_rms{next(_n)}")
    op = ewt.kernel_op(k, scalars=("eps",))
    assert isinstance(op, torch._library.custom_ops.CustomOpDef)
    x = torch.randn(6, 40, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(40, dtype=torch.float64, device=device, requires_grad=True)
    g = torch.randn(6, 40, dtype=torch.float64, device=device)
    y = op(x, w, 1e-5)
    if ewt.autograd_path() == "c++":   # the native module's node (test_torch_native.py tests it)
        assert y.grad_fn.name() == f"ewkern_user::{k.name}Backward"
    else:
        assert type(y.grad_fn).__name__ == f"{k.name}_functionBackward"
    via = getattr(torch.ops.ewkern_user, k.name)(x, w, 1e-5)
    assert type(via.grad_fn).__name__ != type(y.grad_fn).__name__
    torch.testing.assert_close(y, via)
    for a, b in zip(torch.autograd.grad(y, (x, w), g), torch.autograd.grad(via, (x, w), g)):
        torch.testing.assert_close(a, b)
    with dispatch_recorder() as mode:
        op(x.detach(), w.detach(), 1e-5)
    assert any(f"ewkern_user.{k.name}" in o for o in mode.ops), mode.ops
    xt = torch.randn(40, 6, dtype=torch.float64, device=device).t().requires_grad_()
    torch.testing.assert_close(op(xt, w, 1e-5), via.new_tensor(
        (xt * torch.rsqrt((xt * xt).mean(-1, keepdim=True) + 1e-5) * w).detach()))
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(op(x, w, 1e-5), x, g, create_graph=True)
    # no tensor that needs a gradient: no autograd node, the same values; the kernel itself, or
    # where the native module runs the op, the plan the kernel's earlier calls of this signature
    # ran by, from C++ (the kernel object is not called)
    calls = []
    k_call = type(k).__call__
    monkeypatch.setattr(type(k), "__call__", lambda self, *a: calls.append(a) or k_call(self, *a))
    native = ewt.autograd_path() == "c++"
    before = ewt._native.user_forward_runs() if native else 0
    with torch.no_grad():
        y0 = op(x, w, 1e-5)
        y1 = op(x.detach(), w.detach(), 1e-5)
    monkeypatch.undo()
    assert y0.grad_fn is None and not y0.requires_grad
    assert (len(calls), ewt._native.user_forward_runs() - before) == (0, 2) if native else len(calls) == 2
    torch.testing.assert_close(y0, via.detach())
    torch.testing.assert_close(y1, via.detach())
    assert op(x.detach(), w.detach(), 1e-5).grad_fn is None
    assert op(x.detach(), w, 1e-5).grad_fn is not None   # one input that needs it: the Function


@pytest.mark.parametrize("colsum_on_cpu", [False, True])
def test_row_backward_sums_a_repeated_row_in_the_kernel(colsum_on_cpu, monkeypatch):
    """The derived RowKernel backward sums the gradient of a weight given as [cols] or [1, cols]
    over the rows itself (a column-sum output; on CUDA, and here on the CPU too when asked), and
    of a full-size input per element: each against torch's autograd, shaped like its input, in
    eager and under torch.compile (the fake kernel's shapes)."""
    if colsum_on_cpu:
        monkeypatch.setattr(ewt, "_COLSUM_DEVICES", ("cuda", "cpu"))
    op = _row_op("T x, T w, float32 eps", "x * x", "y = x * rsqrt(a / _row_size + eps) * w", ("eps",))

    def ref(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w

    x = torch.randn(3, 5, 24, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 5, 24, dtype=torch.float64)
    for wshape in ((24,), (1, 24), (1, 1, 24), (3, 5, 24), (5, 24)):
        w = torch.randn(wshape, dtype=torch.float64, requires_grad=True)
        got = torch.autograd.grad(op(x, w, 1e-5), (x, w), g)
        want = torch.autograd.grad(ref(x, w), (x, w), g)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b)
    f = torch.compile(lambda a, b: (op(a, b, 1e-5) * g).sum(), fullgraph=True)
    w = torch.randn(24, dtype=torch.float64, requires_grad=True)
    for a, b in zip(torch.autograd.grad(f(x, w), (x, w)), torch.autograd.grad((ref(x, w) * g).sum(), (x, w))):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wanted", ["x", "w"])
def test_backward_writes_only_the_gradients_autograd_wants(device, wanted, monkeypatch):
    """An input that needs no gradient (a frozen weight, a constant input) gets none computed: the
    backward kernel is derived for the wanted gradients only (a RowKernel's weight gradient is
    then no column sum at all), and what it returns matches torch's autograd."""
    from ewkern.rtc._autodiff import row_backward_source
    ins = parse_params("T x, T w, float32 eps", False, "k")
    outs = parse_params("T y", True, "k")
    full = row_backward_source("k", "x * x", "a + b", "0", "y = x * rsqrt(a / _row_size + eps) * w", ins, outs,
                               ("eps",))
    part = row_backward_source("k", "x * x", "a + b", "0", "y = x * rsqrt(a / _row_size + eps) * w", ins, outs,
                               ("eps",), frozenset({wanted}))
    assert full[1].count(",") == 1 and "," not in part[1] and part[1].endswith("_" + wanted)
    # rsqrt(eps + a / n) once a row, not once an element; S's factor too (x's gradient only)
    assert [n for n, _ in full[4]] == ["_ewk_c0", "_ewk_c1"] and "rsqrt" not in full[3] + full[2][0]
    assert len(part[4]) == (1 if wanted == "w" else 2)
    assert full[2] is not None and (part[2] is None) == (wanted == "w")   # only x's gradient reads S
    calls = []
    real = ewkern.RowKernel.__call__
    monkeypatch.setattr(ewkern.RowKernel, "__call__",
                        lambda self, *a, **k: calls.append(len(self.out_params)) or real(self, *a, **k))
    rms = _row_op("T x, T w, float32 eps", "x * x", "y = x * rsqrt(a / _row_size + eps) * w", ("eps",))
    ew = _op("T a, T b", "o = a / (1 + exp(-b))")
    x = torch.randn(6, 256, dtype=torch.float64, device=device, requires_grad=wanted == "x")
    w = (torch.rand(256, dtype=torch.float64, device=device) + 0.5).requires_grad_(wanted == "w")
    g = torch.randn(6, 256, dtype=torch.float64, device=device)
    (got,) = torch.autograd.grad(rms(x, w, 1e-5), (x if wanted == "x" else w,), g)
    assert calls == [1, 1]   # the forward, then a backward with one output
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    want = torch.autograd.grad(xr * torch.rsqrt((xr * xr).mean(-1, keepdim=True) + 1e-5) * wr, (xr, wr), g)
    torch.testing.assert_close(got, want[0 if wanted == "x" else 1])
    b = w.expand(6, 256).detach().clone().requires_grad_(wanted == "w")
    ecalls = []
    ereal = ewkern.ElementwiseKernel.__call__
    monkeypatch.setattr(ewkern.ElementwiseKernel, "__call__",
                        lambda self, *a, **k: ecalls.append(len(self.out_params)) or ereal(self, *a, **k))
    (got,) = torch.autograd.grad(ew(x, b), (x if wanted == "x" else b,), g)
    assert ecalls == [1, 1]
    want = torch.autograd.grad(xr * torch.sigmoid(b.detach().requires_grad_()), (xr,), g) if wanted == "x" else \
        (g * x * torch.sigmoid(b) * (1 - torch.sigmoid(b))).detach()
    torch.testing.assert_close(got, want[0] if wanted == "x" else want)


RMSE_K = ("T x, T y", "T z", "(x - y) * (x - y)", "a + b", "z = sqrt(a / (_in_ind.size() / _out_ind.size()))", "0")


def _rmse_ref(x, y, axis, keepdims=False):
    d = (x - y).double() ** 2
    dims = tuple(range(d.dim())) if axis is None else axis
    return torch.sqrt(d.mean(dims, keepdim=keepdims))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("axis,keepdims", [(1, False), (None, False), ((0,), True), (-1, True), ((0, 1), False)],
                         ids=str)
def test_reduction_kernel_op_values_and_derived_backward(device, dtype, axis, keepdims):
    """A ReductionKernel made a custom op: called like the kernel (axis=, keepdims=), the values of
    the kernel, and a sum's backward derived (the reduction again, then one elementwise kernel for
    both gradients, y broadcast against x) against torch's autograd of the same expression in
    float64; float64 inputs pass gradcheck."""
    op = ewt.kernel_op(ewkern.ReductionKernel(*RMSE_K, f"rk{next(_n)}"))
    gen = torch.Generator().manual_seed(7)
    x0 = torch.rand(5, 12, generator=gen, dtype=torch.float64) * 3 - 1
    y0 = torch.rand(12, generator=gen, dtype=torch.float64) * 3 - 1
    x = x0.to(device=device, dtype=dtype).requires_grad_()
    y = y0.to(device=device, dtype=dtype).requires_grad_()
    r = op(x, y, axis=axis, keepdims=keepdims)
    dims = None if axis is None else ((axis,) if isinstance(axis, int) else axis)
    xr, yr = x0.to(dtype).double().requires_grad_(), y0.to(dtype).double().requires_grad_()
    ref = _rmse_ref(xr, yr, None if dims is None else tuple(d % 2 for d in dims), keepdims)
    assert r.shape == ref.shape and r.dtype == dtype
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-5 if dtype == torch.float32 else 1e-12)
    torch.testing.assert_close(r.double().cpu(), ref.detach(), rtol=tol, atol=tol)
    g = (torch.rand(ref.shape, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    got = torch.autograd.grad(r, (x, y), g.to(device))
    want = torch.autograd.grad(ref, (xr, yr), g.double())
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == dtype
        torch.testing.assert_close(a.double().cpu(), b, rtol=4 * tol, atol=4 * tol)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda a, b: op(a, b, axis=axis, keepdims=keepdims), (x, y))


def test_reduction_kernel_op_compiles_opchecks_and_runs_eagerly_without_grad(monkeypatch):
    """torch.compile(fullgraph=True) through the op and its backward (fake kernels give the reduced
    shape and the gradients' shapes), torch.library.opcheck, axis and keepdims by position, and the
    kernel itself (no dispatcher, no node) when no gradient is wanted; a scalar parameter."""
    k = ewkern.ReductionKernel("T x, float32 s", "T z", "x * s", "a + b", "z = a * a", "0", f"rk{next(_n)}")
    op = ewt.kernel_op(k, scalars=("s",))
    x = torch.rand(3, 8, dtype=torch.float64, requires_grad=True)
    f = torch.compile(lambda t: op(t, 1.5, axis=1).sum(), fullgraph=True, backend="aot_eager")
    want = ((x.detach() * 1.5).sum(1) ** 2).sum()
    torch.testing.assert_close(f(x), want)
    (gx,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(gx, (2 * (x.detach() * 1.5).sum(1, keepdim=True) * 1.5).expand(3, 8))
    torch.library.opcheck(op, (x.detach(), 1.5, [1], True))
    assert op(x, 1.5, 0, True).shape == (1, 8)
    calls = []
    k_call = type(k).__call__
    monkeypatch.setattr(type(k), "__call__", lambda self, *a, **kw: calls.append(a) or k_call(self, *a, **kw))
    with torch.no_grad():
        r = op(x, 1.5, axis=1)
    assert r.grad_fn is None and len(calls) == 1
    with pytest.raises(TypeError, match="inputs, then axis and keepdims"):
        op(x, 1.5, 1, False, 0)
    for t in (x.detach(), x):   # the kernel's own check, and the custom op's (its fake kernel's)
        with pytest.raises(ValueError, match="axis 2 is out of bounds for the inputs' 2 dimensions"):
            op(t, 1.5, axis=2)


@pytest.mark.parametrize("device", DEVICES)
def test_reduction_backward_writes_only_the_gradients_autograd_wants(device, monkeypatch):
    """With y frozen the backward's elementwise kernel has x's gradient as its only output (and
    the other way round), with the values of the full backward."""
    op = ewt.kernel_op(ewkern.ReductionKernel(*RMSE_K, f"rk{next(_n)}"))
    x = (torch.rand(4, 9, dtype=torch.float64) + 0.1).to(device)
    y = torch.rand(9, dtype=torch.float64).to(device)
    g = torch.rand(4, dtype=torch.float64).to(device)
    full = torch.autograd.grad(op(x.requires_grad_(), y.requires_grad_(), axis=1), (x, y), g)
    outs = []
    ew_call = ewkern.ElementwiseKernel.__call__
    monkeypatch.setattr(ewkern.ElementwiseKernel, "__call__",
                        lambda self, *a, **kw: outs.append(self.out_params) or ew_call(self, *a, **kw))
    for k, (a, b) in enumerate(((x, y.detach()), (x.detach(), y))):
        (got,) = torch.autograd.grad(op(a, b, axis=1), (a if k == 0 else b,), g)
        torch.testing.assert_close(got, full[k], rtol=1e-12, atol=1e-12)
        assert [p.name for p in outs[-1]] == ["_ewk_grad_" + "xy"[k]]


def test_reduction_kernel_op_without_a_derivable_backward():
    """A max reduction: the op runs (eager and through torch.ops); its backward raises, naming why."""
    op = ewt.kernel_op(ewkern.ReductionKernel("T x", "T z", "x", "max(a, b)", "z = a", "-1e30", f"rk{next(_n)}"))
    x = torch.rand(4, 6, requires_grad=True)
    r = op(x, axis=1)
    torch.testing.assert_close(r, x.detach().amax(1))
    with pytest.raises(RuntimeError, match="no backward: .*sum reduction"):
        r.sum().backward()


@pytest.mark.parametrize("map_expr,reduce_expr,identity,post,match", [
    ("x", "max(a, b)", "0", "z = a", "sum reduction"), ("x", "a + b", "1", "z = a", "sum from 0"),
    ("x * i", "a + b", "0", "z = a", "index i"), ("x", "a + b", "0", "z = a * _in_ind.size() + i", "index"),
    ("x", "a + b", None, "z = a", "sum from 0")])
def test_reduction_backward_source_refuses_what_it_cannot_derive(map_expr, reduce_expr, identity, post, match):
    from ewkern.rtc._autodiff import reduction_backward_source
    with pytest.raises(ValueError, match=match):
        reduction_backward_source("k", map_expr, reduce_expr, identity, post, parse_params("T x", False, "k"),
                                  parse_params("T z", True, "k"))


def test_kernel_ops_of_one_name_stay_apart():
    """torch.library replaces an op registered again under its name, so two kernels of one name made
    ops by kernel_op ran the second's code in the first's compiled graphs. Now the second takes
    the name with a digest of its code, kernel_op of the same kernel returns the op it made, and an
    explicit name= that another kernel's op holds is a ValueError."""
    k2 = ewkern.ElementwiseKernel("T x", "T y", "y = x * 2", "kop_same_name")
    k3 = ewkern.ElementwiseKernel("T x", "T y", "y = x * 3", "kop_same_name")
    op2, op3 = ewt.kernel_op(k2), ewt.kernel_op(k3)
    assert op2 is not op3 and op2._name == "kop_same_name" and op3._name.startswith("kop_same_name_")
    assert ewt.kernel_op(k2) is op2
    assert ewt.kernel_op(ewkern.ElementwiseKernel("T x", "T y", "y = x * 3", "kop_same_name")) is op3
    x = torch.arange(1.0, 4.0)
    for op, m in ((op2, 2), (op3, 3)):
        torch.testing.assert_close(op(x), x * m)
        torch.testing.assert_close(torch.compile(op, fullgraph=True, backend="aot_eager")(x), x * m)
    torch.testing.assert_close(torch.ops.ewkern_user.kop_same_name(x), x * 2)
    with pytest.raises(ValueError, match="kop_same_name already runs another kernel"):
        ewt.kernel_op(k3, name="kop_same_name")
    with pytest.raises(ValueError, match="not an identifier"):
        ewt.kernel_op(k3, name="bad name")
    assert ewt.kernel_op(k3, name="kop_same_name_3")._name == "kop_same_name_3"


@pytest.mark.parametrize("device", DEVICES)
def test_user_kernels_refuse_tensors_with_the_negative_bit(device):
    """A torch tensor with the negative bit holds -x in memory and torch's DLPack export drops the
    bit: a user kernel refuses it as an input or an output (it read x and wrote -z), cold and warm,
    and runs on the resolved tensor."""
    k = ewkern.ElementwiseKernel("T x", "T z", "z = x * 2", "twice_negbit")
    s = ewkern.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_negbit")
    t = torch.tensor([1.0, 2.0, 3.0], device=device)
    n = torch._neg_view(t)
    for _ in range(2):   # the second call of a signature takes the warm path
        torch.testing.assert_close(k(t), t * 2)
        with pytest.raises(ValueError, match=r"twice_negbit: x is a torch tensor with the negative bit"):
            k(n)
        target = torch.zeros(3, device=device)
        with pytest.raises(ValueError, match="negative bit"):
            k(t, torch._neg_view(target))
        assert not target.any()
        with pytest.raises(ValueError, match="negative bit"):
            s(n)
    torch.testing.assert_close(k(n.resolve_neg()), -t * 2)
