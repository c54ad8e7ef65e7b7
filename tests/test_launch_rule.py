"""The default path's launch rule (auto_plan, csrc/cuda/elementwise_launch.cuh) as the built-in
ops' launchers ask it, checked on the host: vectors per thread by waves for plain, write-only,
16-bit libm-class and float64 ops, and the grid. Runs wherever ewkern is built with CUDA (the rule
is host code; CI builds it without a GPU); a GPU gives each launcher its waves from the device."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ewkern

pytestmark = pytest.mark.skipif(not ewkern.build_info().get("cuda"), reason="ewkern built without CUDA")

BLOCK = 256
WAVE1 = 132 * 2048          # threads of one wave of the 1-vector kernel: 132 SMs x 8 blocks of 256
WAVE4 = 132 * 2048 * 4      # vectors of one wave of the 4-vector kernel at the same occupancy
H64_NONE, H64_EXP, H64_POLY, H64_GELU, H64_SILU = range(5)


def plan(nvec, *, fill=False, heavy16=0, heavy64=H64_NONE, heavy16_from=32, pdl=False, i32=True, nedge=0,
         wave4=WAVE4, wide=False, heavy_math=False):
    return ewkern._C._auto_plan(nvec, nedge, BLOCK, WAVE1, wave4, i32, pdl, fill, heavy16, heavy64, heavy16_from,
                                wide, heavy_math)


@pytest.fixture(autouse=True)
def _no_knob():
    if os.environ.get("EWKERN_AUTO_VPT"):
        pytest.skip("EWKERN_AUTO_VPT fixes the vectors per thread in this process")


def vpt(nvec, **kw):
    return plan(nvec, **kw)[0]


def test_plain_ops_by_waves():
    assert vpt(WAVE1) == 1                       # up to one wave: 1
    assert vpt(WAVE1 + 1) == 2                   # 1-2 waves: 2
    assert vpt(2 * WAVE1) == 2
    n = 7 * WAVE1 // 2                           # 3.5 waves: the 4-vector grid fills 87.5% of a wave
    assert vpt(n) == 4
    assert vpt(n, pdl=True) == 1                 # ... but not under PDL (1 a thread, as the heavy ops'
    assert plan(n, pdl=True, heavy16=1)[2] > 0   # first wave prefetches; a light op's grid past half a
    assert plan(n, pdl=True)[2] == 0             # wave does not)
    assert vpt(n, wide=True) == 4
    # ... unless the memory moves >= 30 GB/s an SM (wide): 4 there too, and no prefetch
    assert (vpt(n, pdl=True, wide=True), plan(n, pdl=True, wide=True)[2]) == (4, 0)
    assert vpt(3 * WAVE1, pdl=True, wide=True) == 1
    assert plan(3 * WAVE1, pdl=True, wide=True)[2] == 0   # 1 a thread past half a wave: no prefetch there
    # where the 4-vector kernel holds half the blocks (a binary op's 54 registers), 3.9 waves of the
    # 1-vector kernel are 1.95 of its waves: 4 on a wide programmatic launch only
    n2 = int(3.9 * WAVE1)
    assert (vpt(n2, wave4=2 * WAVE1, pdl=True, wide=True), plan(n2, wave4=2 * WAVE1, pdl=True, wide=True)[2]) == (4, 0)
    assert vpt(n2, wave4=2 * WAVE1) == 1 and vpt(n2, wave4=2 * WAVE1, pdl=True) == 1
    assert vpt(3 * WAVE1, wave4=2 * WAVE1, pdl=True, wide=True) == 1    # 1.5 waves: the second half empty
    assert vpt(3 * WAVE1) == 1                   # 75% of the 4-vector kernel's wave: 1
    assert vpt(3 * WAVE1, wave4=3 * WAVE1) == 4  # where that kernel holds fewer blocks, a full wave
    assert vpt(5 * WAVE1) == 1                   # many waves: 1
    assert vpt(5 * WAVE1, i32=False) == 1
    assert vpt(WAVE1 + 1, i32=False) == 1        # the 64-bit instance takes 1


def test_fill_takes_two_stores_from_half_a_wave():
    """4 MiB (0.97 waves of 16-byte vectors on 132 SMs) takes 2; 1-2 MiB (0.24, 0.48 waves) keep 1."""
    mib = 1 << 20
    assert vpt(WAVE1 // 2, fill=True) == 1
    assert vpt(WAVE1 // 2 + 1, fill=True) == 2
    assert [vpt(s // 16, fill=True) for s in (mib, 2 * mib, 4 * mib, 64 * mib, 1024 * mib)] == [1, 1, 2, 2, 2]


@pytest.mark.parametrize("waves_from", [32, 6])
def test_16bit_libm_ops_take_two_past_the_devices_threshold(waves_from):
    """heavy16 == 1 (ewkern's ops): 1 a thread up to heavy16_from waves, 2 beyond (heavy16_waves
    gives 6 where the memory moves >= 30 GB/s an SM, else 32); a run-time kernel's (2): 1 always."""
    assert vpt(waves_from * WAVE1, heavy16=1, heavy16_from=waves_from) == 1
    assert vpt(waves_from * WAVE1 + 1, heavy16=1, heavy16_from=waves_from) == 2
    assert vpt(2 * WAVE1, heavy16=1, heavy16_from=waves_from) == 1     # not the plain ops' 2 at 1-2 waves
    assert vpt(64 * WAVE1, heavy16=2, heavy16_from=waves_from) == 1


def test_float64_math_classes():
    assert all(vpt(w * WAVE1 + 1, heavy64=H64_EXP) == 1 for w in (0, 1, 2, 4, 64))
    assert vpt(4 * WAVE1, heavy64=H64_POLY) == 1 and vpt(4 * WAVE1 + 1, heavy64=H64_POLY) == 2
    assert vpt(4 * WAVE1 + 1, heavy64=H64_GELU) == 4 and vpt(64 * WAVE1, heavy64=H64_GELU) == 4
    assert vpt(2 * WAVE1, heavy64=H64_GELU) == 1


def test_float64_gelu_between_two_and_four_waves_asks_the_four_vector_grids_last_wave():
    # 4 when that grid's last wave is at least half full (the 4-vector kernel at 5 blocks of 256 an
    # SM: 16 MiB is 3.9 waves of the 1-vector kernel and 1.55 of its; 12 MiB 2.9 and 1.16)
    w4 = 132 * 5 * 256 * 4
    sixteen, twelve = (16 << 20) // 16, (12 << 20) // 16
    assert vpt(sixteen, heavy64=H64_GELU, wave4=w4) == 4
    assert vpt(twelve, heavy64=H64_GELU, wave4=w4) == 1
    assert vpt(w4 + w4 // 2, heavy64=H64_GELU, wave4=w4) == 4
    assert vpt(w4 + w4 // 2 - 1, heavy64=H64_GELU, wave4=w4) == 1
    assert vpt(8 * WAVE1, heavy64=H64_SILU) == 1 and vpt(8 * WAVE1 + 1, heavy64=H64_SILU) == 4


@pytest.mark.parametrize("nvec,nedge", [(1, 0), (1000, 3), (WAVE1 + 1, 0), (3 * WAVE1 + 7, 5), (40 * WAVE1, 255)])
def test_grid_covers_every_vector_and_leaves_the_edge_threads_free(nvec, nedge):
    """grid x vpt x block threads cover the vectors, and the last block's last nedge threads (which
    take the head and tail elements) own no vector."""
    for kw in ({}, {"fill": True}, {"heavy16": 1}, {"heavy64": H64_EXP}):
        v, grid, prefetch = plan(nvec, nedge=nedge, **kw)
        per_block = v * BLOCK
        assert grid >= 1 and (grid - 1) * per_block < nvec + per_block
        assert (grid - 1) * per_block + (BLOCK - nedge) >= nvec, (kw, v, grid)
        assert prefetch == 0                       # PDL off: nothing to prefetch before a wait


def test_pdl_prefetch_is_the_first_wave():
    assert plan(10 * WAVE1, pdl=True, heavy16=1)[2] == WAVE1 // BLOCK
    assert plan(WAVE1 // 4, pdl=True)[2] == WAVE1 // BLOCK


@pytest.mark.parametrize("nvec", [1, WAVE1 // 4, WAVE1 // 2, WAVE1 // 2 + BLOCK, WAVE1, 10 * WAVE1])
@pytest.mark.parametrize("wide", [False, True])
def test_light_ops_prefetch_only_grids_of_half_a_wave(nvec, wide):
    """A light op's programmatic launch, on any device (wide or not: the H200 and the H100 both
    measured it), prefetches its first vectors only where the whole grid is at most half a wave (a
    cold launch of about a wave or more paid for it there); heavy ops (16-bit libm-class, float64
    math, the backward ops' float64 gradients of libm-class math) prefetch the first wave at any
    size; a launch without PDL never."""
    v, grid, prefetch = plan(nvec, pdl=True, wide=wide)
    assert v == 1
    half = WAVE1 // BLOCK if 2 * grid <= WAVE1 // BLOCK else 0
    assert prefetch == half, (nvec, grid, prefetch)
    assert plan(nvec, pdl=True, wide=wide, heavy16=1)[2] == WAVE1 // BLOCK
    assert plan(nvec, pdl=True, wide=wide, heavy64=H64_POLY)[2] == WAVE1 // BLOCK
    # the backward ops' float64 gradients of gelu, silu and erf: heavy for this rule alone (their
    # vectors a thread by the plain rule)
    assert plan(nvec, pdl=True, wide=wide, heavy_math=True) == (v, grid, WAVE1 // BLOCK)
    assert plan(nvec, wide=wide)[2] == 0
    # the run-time kernels' 16-bit math (heavy16 2) counts as light, their float64 math (heavy64)
    # as heavy
    assert plan(nvec, pdl=True, wide=wide, heavy16=2)[2] == half
    assert plan(nvec, pdl=True, wide=wide, heavy64=H64_EXP)[2] == WAVE1 // BLOCK


def _knob_output(var, value, code):
    """What code prints, split, in a fresh process with var=value in its environment (the knobs
    are read once a process); the process must succeed."""
    env = dict(os.environ, **{var: value})
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


_PREFETCH = """
import ewkern
W = 132 * 2048
print(*(ewkern._C._auto_plan(n, 0, 256, W, 4 * W, True, True, False, 0, 0, 32, True)[2] for n in (W // 4, W)))
"""


@pytest.mark.parametrize("knob,expect", [("wave", "1056 1056"), ("none", "0 0"), ("all", "2147483647 2147483647"),
                                         ("", "1056 0")])
def test_prefetch_knob_replaces_the_rule(knob, expect):
    """EWKERN_PDL_PREFETCH=wave|none|all (read once a process) sets which blocks prefetch on a wide
    programmatic launch at a quarter wave and at one wave; unset (or anything else), the rule."""
    assert _knob_output("EWKERN_PDL_PREFETCH", knob, _PREFETCH) == expect.split()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="out of range"):
        ewkern._C._auto_plan(10, 0, 0, WAVE1, WAVE4, True, False, False, 0, 0, 32)
    with pytest.raises(ValueError, match="out of range"):
        ewkern._C._auto_plan(10, 0, BLOCK, WAVE1, WAVE4, True, False, False, 3, 0, 32)


_STORES = """
import sys, ewkern
print(int(ewkern._C._rtc_store_wb(0, 1)), int(ewkern._C._rtc_store_wb(0, 1 << 40)))
"""


@pytest.mark.parametrize("knob,expect", [("wb", "1 1"), ("cs", "0 0")])
def test_store_rule_knob_forces_one_policy(knob, expect):
    """EWKERN_AUTO_STORES=wb|cs (read once a process) sets the store policy at every size."""
    assert _knob_output("EWKERN_AUTO_STORES", knob, _STORES) == expect.split()


@pytest.mark.parametrize("args", [(-1,), (8, -1), (8, 9)])
def test_store_rule_bad_bytes_raise(args):
    with pytest.raises(ValueError, match="expected 0 <= out_bytes <= bytes"):
        ewkern._C._rtc_store_wb(0, *args)


def _gpu():
    return ewkern.build_info().get("cuda") and ewkern.device_count() > 0


@pytest.mark.skipif(not _gpu(), reason="needs a GPU (the rule reads the device's L2 size)")
def test_store_rule_writes_back_past_the_l2():
    """Write-back stores for outputs of at least 1/32 of the L2 or past the L2's size of bytes
    moved, streaming stores below both."""
    if os.environ.get("EWKERN_AUTO_STORES"):
        pytest.skip("EWKERN_AUTO_STORES fixes the store policy in this process")
    l2 = ewkern.device_info("cuda:0")["l2_bytes"]
    assert l2 > 0
    assert not ewkern._C._rtc_store_wb(0, l2) and ewkern._C._rtc_store_wb(0, l2 + 1)
    assert not ewkern._C._rtc_store_wb(0, 0)
    share = -(-l2 // 32)
    assert ewkern._C._rtc_store_wb(0, 3 * share, share)
    assert not ewkern._C._rtc_store_wb(0, 3 * share - 3, share - 1)


_BOTH = """
import sys, numpy as np, torch, ewkern
n = int(sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(7)
host = lambda t: t.double().cpu().numpy() if isinstance(t, torch.Tensor) else t.numpy().astype(np.float64)
fma = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x * y + x", "store_policy_fma")
rms = ewkern.RowKernel("T x, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps)", "0",
                       "store_policy_rms")
for dt in (torch.float32, torch.float16, torch.float64):
    x = torch.empty(n + 3, device="cuda", dtype=torch.float64).uniform_(0.5, 2.0, generator=g).to(dt)
    y = torch.empty(n + 3, device="cuda", dtype=torch.float64).uniform_(-2.0, 2.0, generator=g).to(dt)
    for off in (0, 1):                          # a start off the 16-byte boundary too
        a, b = x[off:off + n], y[off:off + n]
        a64, b64 = host(a), host(b)
        tol = {torch.float32: 2e-6, torch.float16: 2e-3, torch.float64: 1e-14}[dt]
        for name, args, ref in (("add", (a, b), a64 + b64), ("log", (a,), np.log(a64)), ("copy", (a,), a64)):
            got = host(getattr(ewkern, name)(*args))
            assert np.allclose(got, ref, rtol=tol, atol=tol), (name, dt, off)
            out = torch.full_like(a, 3.0)
            getattr(ewkern, name)(*args, out=out)
            assert np.allclose(host(out), ref, rtol=tol, atol=tol), (name, dt, off, "out=")
        # a backward kernel (both gradients of mul in one pass: its forms, and the plain form's two
        # instances)
        ga, gb = (host(t) for t in ewkern.mul_backward(b, a, b))
        assert np.allclose(ga, b64 * b64, rtol=tol, atol=tol) and np.allclose(gb, b64 * a64, rtol=tol, atol=tol), (
            "mul_backward", dt, off)
        # a user kernel's vector forms read the same knob through the launch's wb field
        got = host(fma(a, b))
        assert np.allclose(got, a64 * b64 + a64, rtol=4 * tol, atol=4 * tol), ("ElementwiseKernel", dt, off)
    # and a RowKernel's stores (rows of 1024: 12 MiB of float32 at the largest n)
    rows = n // 1024
    if rows:
        r = x[:rows * 1024].view(rows, 1024)
        r64 = host(r)
        want = r64 / np.sqrt((r64 * r64).mean(axis=1, keepdims=True) + 1e-6)
        got = host(rms(r, 1e-6))
        assert np.allclose(got, want, rtol=4 * tol, atol=4 * tol), ("RowKernel", dt)
print("ok")
"""


@pytest.mark.skipif(not _gpu(), reason="needs a GPU")
@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("knob", ["wb", "cs"])
@pytest.mark.parametrize("n", [1, 1000003, (3 << 20) + 5])
def test_default_path_results_with_either_store_policy(knob, n, pdl):
    """The default path's kernels (a backward one too), a user kernel's vector forms and a RowKernel
    give the same results with write-back stores as with streaming ones, at sizes where the rule
    would choose the other (a child process a policy), in the PDL form and, with PDL off, in the
    plain form's two instances (streaming, and write-back where the rule says so)."""
    env = dict(os.environ, EWKERN_AUTO_STORES=knob, EWKERN_PDL=pdl)
    r = subprocess.run([sys.executable, "-c", _BOTH, str(n)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ok"
