"""Every ISA form of the CPU kernels on one machine. The math ops, the 16-bit converters and the
backward loops are compiled for AVX-512, AVX2 + FMA and the baseline and picked per call by what
the CPU has (csrc/cpu/cpu_math.h); EWKERN_CPU_ISA=avx2 or =baseline caps the pick (read once per
process), so the forms this CPU would not pick run here too: the CPU accuracy tests of the forward
math ops and of the backward ops in a process under each cap, and bit equality with the widest
form wherever no libmvec function is called (libmvec's ISA variants may differ in the last bits,
within the stated bounds that the accuracy tests assert)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ewkern
from reference import np_dtype

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CAPS = ["avx2", "baseline"]

# backward ops whose CPU loop calls no libmvec function (gelu, silu and erf call exp / erfc)
EXACT_OPS = ["mul_backward", "div_backward", "maximum_backward", "minimum_backward", "relu_backward",
             "abs_backward", "sigmoid_backward", "tanh_backward", "exp_backward", "log_backward",
             "sqrt_backward", "rsqrt_backward", "axpby_backward"]
DTYPES = ["float32", "float16", "bfloat16", "float64"]

_GRADS = """
import sys, numpy as np, ewkern
sys.path.insert(0, %r)
from reference import np_dtype
rng = np.random.default_rng(7)
out = {}
for op in %r:
    for dt in %r:
        n = 3 * 1024 + 5
        g, a, b = ((rng.standard_normal(n) + 1.5).astype(np_dtype(dt)) for _ in range(3))
        a = np.abs(a) + np.asarray(0.25, dtype=a.dtype)   # in every op's domain (log, sqrt, rsqrt)
        args = {"axpby_backward": (g, 0.5, -2.0)}.get(op) or ((g, a, b) if op in (
            "mul_backward", "div_backward", "maximum_backward", "minimum_backward") else (g, a))
        r = getattr(ewkern, op)(*args)
        for k, x in enumerate(r if isinstance(r, tuple) else (r,)):
            out[f"{op} {dt} {k}"] = np.asarray(x).view(np.uint8)
        if dt in ("float16", "bfloat16") and op in ("relu_backward", "abs_backward", "sigmoid_backward",
                                                    "tanh_backward", "exp_backward", "log_backward",
                                                    "sqrt_backward", "rsqrt_backward"):
            # (g, a) gradients at every 16-bit pattern of a: where a float result rounds to 16 bits
            # near a tie, one float ulp of a different evaluation changes the bits. A NaN result is
            # compared as NaN: its sign is the NaN operand an instruction returns (tanh's fma in
            # hardware keeps a's, the baseline's libm fmaf returns -a's)
            every = np.arange(1 << 16, dtype=np.uint16).view(np_dtype(dt))
            ge = (rng.standard_normal(1 << 16) + 1.5).astype(np_dtype(dt))
            r = np.asarray(getattr(ewkern, op)(ge, every))
            bits = r.view(np.uint16).copy()
            bits[np.isnan(r.astype(np.float32))] = 0x7fff
            out[f"{op} {dt} every"] = bits.view(np.uint8)
np.savez(sys.argv[1], **out)
"""


# forward ops with a loop per ISA: in float16/bfloat16 a one-pass form (add ... axpby; the baseline
# cap runs them on float tiles) or a select on the bits (relu, abs, neg), in float32/float64 the
# plain loop of each (the baseline cap: SSE2 on x86-64); copy moves bits, and fill (below) stores one
FORWARD_OPS = ["add", "sub", "mul", "div", "maximum", "minimum", "add_const", "mul_const", "axpby", "relu", "abs",
               "neg", "copy", "sqrt", "rsqrt"]
FORWARD_SIZES = (1, 7, 15, 17, 1029, 3 * 1024 + 5, 70001)

_FORWARD = """
import sys, numpy as np, ewkern
sys.path.insert(0, %r)
from reference import np_dtype
rng = np.random.default_rng(11)
out = {}
for dt in ("float16", "bfloat16", "float32", "float64"):
    t = np_dtype(dt)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-7, -1e-7, 6e-8, 65504.0, -65504.0,
                        3.0e38, -3.0e38, 1e-40, -1e-40, 1.0, -1.0], dtype=np.float32).astype(t)
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[special.itemsize]
    # (not NaN against NaN: which NaN an add or mul returns then is the hardware's operand order)
    pa = np.array([0.0, -0.0, np.nan, 2.0, -np.nan, -3.0, -0.0, 5.0], dtype=np.float32).astype(t)
    pb = np.array([-0.0, 0.0, 2.0, np.nan, -3.0, -np.nan, -0.0, 5.0], dtype=np.float32).astype(t)
    for n in %r:
        a = (rng.standard_normal(n + 1) * 300).astype(t)
        b = (rng.standard_normal(n + 1) * 300).astype(t)
        a[1:1 + min(n, special.size)] = special[:n]
        b[1:1 + min(n, special.size)] = special[::-1][:n]
        # and pairs where maximum/minimum choose by a tie or a NaN: +-0 both ways, NaN on either side
        k0 = 1 + special.size
        if n + 1 >= k0 + pa.size:
            a[k0:k0 + pa.size], b[k0:k0 + pa.size] = pa, pb
        a, b = a[1:], b[1:]                      # a start 2 bytes past the allocation's
        for op in %r:
            args = {"add_const": (a, 0.1), "mul_const": (a, -3.7), "axpby": (a, b, 0.5, -2.25)}.get(op)
            if args is None:
                args = (a, b) if op in ("add", "sub", "mul", "div", "maximum", "minimum") else (a,)
            out[f"{op} {dt} {n}"] = np.asarray(getattr(ewkern, op)(*args)).view(view)
        x = a.copy()
        ewkern.add(x, b, out=x)                  # the output is an input
        out[f"add inplace {dt} {n}"] = x.view(view)
        x = a.copy()
        ewkern.fill(x[1:], -0.1)                 # from a misaligned start
        out[f"fill {dt} {n}"] = x.view(view)
    if special.itemsize == 2:                    # sqrt and rsqrt of every 16-bit pattern (the table's)
        every = np.arange(1 << 16, dtype=np.uint16).view(t)
        for op in ("sqrt", "rsqrt"):
            out[f"{op} every {dt}"] = np.asarray(getattr(ewkern, op)(every)).view(view)
np.savez(sys.argv[1], **out)
"""


def _env(cap):
    """this process's environment with ewkern importable and EWKERN_CPU_ISA set to cap (None: unset)"""
    env = {k: v for k, v in os.environ.items() if k != "EWKERN_CPU_ISA"}
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    if cap:
        env["EWKERN_CPU_ISA"] = cap
    return env


def _grads(cap, path):
    subprocess.run([sys.executable, "-c", _GRADS % (HERE, EXACT_OPS, DTYPES), str(path)], env=_env(cap),
                   check=True, cwd=ROOT)
    return dict(np.load(path))


@pytest.mark.parametrize("cap", CAPS)
def test_accuracy_tests_pass_under_each_isa_cap(cap):
    """The CPU parts of test_backward.py and test_cpu_math.py, in a process capped at `cap`."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", "not cuda",
                           os.path.join(HERE, "test_backward.py"), os.path.join(HERE, "test_cpu_math.py")],
                          env=_env(cap), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


@pytest.mark.parametrize("cap", CAPS)
def test_backward_bits_match_across_isa_forms(cap, tmp_path):
    widest = _grads(None, tmp_path / "widest.npz")
    capped = _grads(cap, tmp_path / f"{cap}.npz")
    assert widest.keys() == capped.keys() and len(widest) >= len(EXACT_OPS) * len(DTYPES)
    differ = [k for k in widest if not np.array_equal(widest[k], capped[k])]
    assert not differ, differ


@pytest.mark.parametrize("cap", CAPS)
def test_build_info_names_the_capped_isa(cap):
    code = "import ewkern; print(ewkern.build_info()['cpu_math'])"
    what = subprocess.run([sys.executable, "-c", code], env=_env(cap), cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    lib = ewkern.build_info()["cpu_math"]
    if not lib.startswith("glibc libmvec"):
        pytest.skip(f"no libmvec in this build: {lib}")
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if cap == "baseline":
        assert what == "glibc libmvec, SSE variants (EWKERN_CPU_ISA=baseline)", what
    elif " avx2" in flags and " fma" in flags:
        assert what == "glibc libmvec, AVX2 variants (EWKERN_CPU_ISA=avx2)", what


@pytest.mark.parametrize("cap", CAPS)
def test_forward_bits_match_across_isa_forms(cap, tmp_path):
    """float16/bfloat16 add ... axpby, maximum, minimum, sqrt and rsqrt run in one pass per ISA
    (AVX-512: 16 lanes, AVX2: 8) and on float tiles (sqrt, rsqrt: a table of every pattern made by
    them) at the baseline; relu, abs, neg as selects on the bits; float32/float64 arithmetic,
    relu, abs and neg, and fill in every dtype, as one loop per ISA: the same bits in every form,
    NaN, infinities, -0, subnormals and overflow included, at sizes around the vector widths and
    past the threads' floor (70001 elements: blocks on the OpenMP team, a short last one), from a
    misaligned start, and with the output an input."""
    def run(c, name):
        subprocess.run([sys.executable, "-c", _FORWARD % (HERE, FORWARD_SIZES, FORWARD_OPS), str(tmp_path / name)],
                       env=_env(c), check=True, cwd=ROOT)
        return dict(np.load(tmp_path / name))
    widest, capped = run(None, "widest.npz"), run(cap, f"{cap}.npz")
    assert widest.keys() == capped.keys() and len(widest) == 4 * len(FORWARD_SIZES) * (len(FORWARD_OPS) + 2) + 4
    differ = [k for k in widest if not np.array_equal(widest[k], capped[k])]
    assert not differ, differ


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_relu_abs_neg_16bit_bits_against_numpy(dt):
    """relu, abs, neg and relu_backward of float16/bfloat16 are selects on the bits (the same in
    every ISA form): against NumPy's maximum(a, 0), abs and negative in float32, rounded back, on
    every 16-bit pattern but the NaNs (which stay NaNs, payload kept) and relu's -0 (which stays -0,
    the scalar rule a >= 0 ? a : 0 of elementwise.c; NumPy's SIMD maximum gives +0), both asserted
    apart; relu_backward(g, y) with y every pattern against where(y <= 0, 0, g)."""
    t = np_dtype(dt)
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    a = bits.view(t)
    nan = np.isnan(a.astype(np.float32))
    f = a.astype(np.float32)
    for op, ref in (("relu", np.maximum(f, np.float32(0))), ("abs", np.abs(f)), ("neg", -f)):
        got = np.asarray(getattr(ewkern, op)(a)).view(np.uint16)
        want = ref.astype(t).view(np.uint16)
        bad = np.flatnonzero((got != want) & ~nan & ((bits != 0x8000) | (op != "relu")))
        assert bad.size == 0, (op, [hex(int(bits[i])) for i in bad[:8]], [hex(int(got[i])) for i in bad[:8]])
        assert np.isnan(np.asarray(getattr(ewkern, op)(a)).astype(np.float32)[nan]).all(), op
    r = np.asarray(ewkern.relu(a)).view(np.uint16)
    assert (r[nan] == bits[nan]).all()           # relu keeps a NaN's bits, sign and payload
    assert r[0x8000] == 0x8000 and r[0xfc00 if dt == "float16" else 0xff80] == 0
    # relu_backward(g, y), y every pattern (a select on the bits too): +0 where y <= 0, else g
    g = (np.random.default_rng(3).standard_normal(65536) * 100).astype(t)
    g[::7] = np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32).astype(t)[np.arange(g[::7].size) % 4]
    got = np.asarray(ewkern.relu_backward(g, a)).view(np.uint16)
    want = np.where(f <= 0, np.float32(0), g.astype(np.float32)).astype(t).view(np.uint16)
    gnan = np.isnan(g.astype(np.float32))
    assert np.array_equal(got[~gnan | (f <= 0)], want[~gnan | (f <= 0)])
    assert np.isnan(np.asarray(ewkern.relu_backward(g, a)).astype(np.float32)[gnan & ~(f <= 0)]).all()


_TABLE = """
import sys, numpy as np, ewkern
sys.path.insert(0, %r)
from reference import np_dtype
rng = np.random.default_rng(5)
out = {}
for op in ("gelu_backward", "silu_backward", "erf_backward"):
    for dt in ("float16", "bfloat16"):
        a = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np_dtype(dt))   # every pattern
        g = (rng.standard_normal(65536) * 4).astype(np_dtype(dt))
        g[::97] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32).astype(g.dtype)[
            np.arange(g[::97].size) %% 5]
        # below EW_BW_LUT_MIN elements a call runs the float tiles, until a table exists: first the
        # tiles (pieces of 8191), then one call of 65536 that makes the table and reads it
        tiles = np.concatenate([np.asarray(getattr(ewkern, op)(g[i:i + 8191], a[i:i + 8191]))
                                for i in range(0, 65536, 8191)])
        table = np.asarray(getattr(ewkern, op)(g, a))
        again = np.asarray(getattr(ewkern, op)(g[:100], a[:100]))   # a small call reads the table too
        out[op + " " + dt] = np.stack([tiles.view(np.uint16), table.view(np.uint16)])
        out[op + " " + dt + " small"] = np.stack([tiles[:100].view(np.uint16), again.view(np.uint16)])
np.savez(sys.argv[1], **out)
"""


@pytest.mark.parametrize("cap", [None] + CAPS)
def test_16bit_gradient_tables_give_the_tiles_bits(cap, tmp_path):
    """float16/bfloat16 gelu, silu and erf gradients read a table of d(a) for every 16-bit pattern
    (made on a call of >= 2^14 elements by the tile loop with grad 1): the same bits as the float
    tiles over every pattern of a, with NaN, infinities and zeros in grad, under each ISA cap. A NaN
    result only as a NaN: the tiles' own payload depends on where an element falls (libmvec's vector
    exp in full vectors, the scalar epilogue's expf in a tile's last few: silu float16 of a = 0x7ff6
    at the end of a tile of 1023)."""
    path = tmp_path / "t.npz"
    subprocess.run([sys.executable, "-c", _TABLE % HERE, str(path)], env=_env(cap), check=True, cwd=ROOT)
    res = dict(np.load(path))
    assert len(res) == 12
    def same(k, tiles, table):
        exp_mask, mant = (0x7c00, 0x3ff) if k.split()[1] == "float16" else (0x7f80, 0x7f)
        nan = ((tiles & exp_mask) == exp_mask) & ((tiles & mant) != 0)
        nan_too = ((table & exp_mask) == exp_mask) & ((table & mant) != 0)
        return np.array_equal(nan, nan_too) and np.array_equal(tiles[~nan], table[~nan])
    differ = [k for k, v in res.items() if not same(k, v[0], v[1])]
    assert not differ, differ


# sizes at and past the threads' floor (2^15 elements for the cheap ops, 2^14 for the math ops),
# where a launch splits into blocks on the OpenMP team: uneven splits and short last blocks
BLOCK_SIZES = (2**14 - 1, 2**14 + 1, 2**15 - 1, 2**15, 2**15 + 1, 40007, 3 * 2**13 + 5, 70001, 2**17 + 63)
BLOCK_OPS = FORWARD_OPS + ["exp", "sqrt", "gelu", "fill"]


@pytest.mark.parametrize("dt", DTYPES)
def test_blocks_on_the_team_cover_every_element(dt):
    """A call on the OpenMP team (blocks of at most 2^13 elements, the same count a thread) gives,
    element for element, the bits of the same op run in pieces of 1000 elements on the calling
    thread, and writes every element of out= (prefilled with a NaN pattern)."""
    rng = np.random.default_rng(17)
    t = np_dtype(dt)
    for n in BLOCK_SIZES:
        a = (np.abs(rng.standard_normal(n + 1)) * 3 + 0.1).astype(t)[1:]    # misaligned, positive
        b = (rng.standard_normal(n + 1) * 3).astype(t)[1:]
        for op in BLOCK_OPS:
            def call(x, y, out):
                if op == "fill":
                    return ewkern.fill(out, -0.1)
                extra = {"add_const": (0.1,), "mul_const": (-3.7,), "axpby": (0.5, -2.25)}.get(op, ())
                ins = (x, y) if op in ("add", "sub", "mul", "div", "maximum", "minimum", "axpby") else (x,)
                return getattr(ewkern, op)(*ins, *extra, out=out)
            whole = np.full(n, np.nan, dtype=t)
            call(a, b, whole)
            pieces = np.full(n, np.nan, dtype=t)
            for i in range(0, n, 1000):
                call(a[i:i + 1000], b[i:i + 1000], pieces[i:i + 1000])
            assert not np.isnan(whole.astype(np.float64)).any(), (op, dt, n)
            assert np.array_equal(whole.view(np.uint8), pieces.view(np.uint8)), (op, dt, n)
