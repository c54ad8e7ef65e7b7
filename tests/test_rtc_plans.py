"""Warm calls of run-time kernels by plan (ewkern/rtc/_kernel.py, _fast_call): on CUDA the plan's
launch must be the full path's launch with the new pointers, and nothing else. Checked here without
a GPU against a stand-in for ewkern's C module that records every launch (the GPU tests run the
same calls for real)."""
import os
import re
import struct
import subprocess
import sys

import pytest

import ewkern
from ewkern.rtc import _build, _kernel, _rowkernel


class FakeArray:
    """A C-contiguous 'CUDA' array: a data pointer, a dtype name and a shape."""

    def __init__(self, ptr, dtype, shape):
        self.ptr, self.dtype, self.shape = ptr, dtype, tuple(shape)

    def __dlpack_device__(self):
        return (2, 0)


class FakeC:
    """The parts of ewkern._C that run-time kernels use on CUDA, recording launches."""

    def __init__(self):
        self.store_asks = []
        self.launches, self.plans, self.next_ptr = [], 0, 1 << 32
        self.images, self.bounded_local = {}, 0   # handle -> image; local bytes of a bounded build
        self.caps = []

    def _rtc_views(self, objs, names):
        return tuple((o.ptr, o.dtype, "cuda:0", o.shape, False) for o in objs), 77

    def _rtc_result(self, like, dt, shape):
        self.next_ptr += 1 << 20
        return FakeArray(self.next_ptr, dt, shape)

    def _rtc_load(self, image, entry, dev):
        # each load its own handle, as each cudaLibraryLoadData is (a second load of a kernel's
        # image: the rows engine's capped launches)
        h = (hash((entry, image)) & 0xFFFFFFF) + (sum(1 for k in self.images if k & 0xFFFFFFF == hash((entry, image))
                                                     & 0xFFFFFFF) << 28)
        self.images[h] = image
        return h

    def _rtc_attrs(self, h, dev):
        # (a handle loaded by an earlier test's stand-in, from _kernel's cache: no local memory)
        return 64, (self.bounded_local if b"bounded" in self.images.get(h, b"") else 0)

    def _rtc_occupancy(self, h, block, dev):
        return max(1, 2048 // block)   # lanes an SM, as registers would allow

    def _rtc_plan(self, dev, nvec, nedge, block, w1, w4, i32, heavy, E, pdl, wide=False, max_vpt=4):
        self.plans += 1
        self.wide, self.max_vpt = wide, max_vpt
        return (2 if nvec > 4096 else 1), max(1, nvec // (block * 2)), (132 if pdl else 0)

    def _rtc_store_wb(self, dev, nbytes, out_bytes=0):
        self.store_asks.append((nbytes, out_bytes))
        return nbytes > (60 << 20) or out_bytes * 32 >= (60 << 20)   # an H200's L2

    def _rtc_launch(self, h, grid, block, params, dev, stream, pdl, smem=0):
        self.launches.append((h, grid, block, bytes(params), dev, stream, bool(pdl), smem))

    def _rtc_cap(self, h, block, dev, blocks):
        self.caps.append((h, block, blocks))
        return 1024 * (100 // blocks)   # some bytes that fall with the blocks an SM may hold

    def run_prog(self, prog: bytes, buf: bytearray, stream: int, pdl: bool) -> None:
        """A C plan's launches (csrc/rtc.h's program words) made the way csrc/rtc.c's ew_rtc_run
        makes them, into _rtc_launch."""
        w = struct.unpack(f"<{len(prog) // 8}q", prog)
        i = 0
        while i < len(w):
            if w[i] in (_kernel._PROG_LAUNCH, _kernel._PROG_LAUNCH_CAP):
                n = 12 if w[i] == _kernel._PROG_LAUNCH else 14
                dev, block, *r = w[i + 1:i + n]
                grid, prefetch, h = r[3:6] if pdl else r[0:3]
                poff, wboff, wb = r[6:9]
                smem = 0 if n == 12 else r[10 if pdl else 9]
                if poff >= 0:
                    struct.pack_into("<q", buf, poff, prefetch)
                if wboff >= 0:
                    struct.pack_into("<q", buf, wboff, wb)
                self._rtc_launch(h, grid, block, buf, dev, stream, pdl, smem)
                i += n
            else:
                assert w[i] == _kernel._PROG_COLSUM
                h, dev, block, grid, nparts, cols, off = w[i + 1:i + 8]
                part, out = struct.unpack_from("<QQ", buf, off)
                self._rtc_launch(h, grid, block, struct.pack("<QQqq", part, out, nparts, cols), dev, stream, pdl)
                i += 8

    # the C fast path misses every call here: the Python plan path (_fast_call) is what is tested
    def _rtc_sig(self, args, scalars):
        return None

    def _rtc_fast(self, plans, args, nin, extra, scalars):
        return NotImplemented


@pytest.fixture
def fake(monkeypatch):
    c = FakeC()
    monkeypatch.setattr(_kernel, "_C_mod", c)
    monkeypatch.setattr(_kernel, "_C", lambda: c)
    monkeypatch.setattr(_rowkernel, "_C", lambda: c)
    monkeypatch.setitem(_kernel._dev_facts, "cuda:0", ((9, 0), 132))
    monkeypatch.setitem(_kernel._sm_facts, "cuda:0", (2048, 36.5))   # an H200's
    # the image says whether its source asked __launch_bounds__ for a minimum of blocks
    monkeypatch.setattr(_build, "compile_cuda", lambda name, src, *a, **k: (
        b"image" + (b" bounded" if re.search(r"__launch_bounds__\(\d+, \d+\)", str(src)) else b""), "cubin", {}))
    return c


def _ptr_offsets(b1: bytes, b2: bytes):
    """The 8-byte slots where two argument structs differ."""
    assert len(b1) == len(b2)
    return sorted({k - k % 8 for k in range(len(b1)) if b1[k] != b2[k]})


def _check_same_launch(first, second, moved):
    """second is first with the data pointers moved by `moved` bytes, nothing else."""
    assert first[:3] == second[:3] and first[4:] == second[4:]
    for off in _ptr_offsets(first[3], second[3]):
        (p1,) = struct.unpack_from("<Q", first[3], off)
        (p2,) = struct.unpack_from("<Q", second[3], off)
        assert p2 - p1 == moved, (off, p1, p2)


@pytest.mark.parametrize("pdl", [True, False])
def test_elementwise_plan_launch_is_the_full_paths(fake, pdl):
    saved = ewkern.pdl_enabled()
    ewkern.set_pdl(pdl)
    if ewkern.pdl_enabled() != pdl:   # a build without CUDA keeps PDL off
        ewkern.set_pdl(saved)
        pytest.skip("PDL cannot be switched on in this build (no CUDA)")
    try:
        k = ewkern.ElementwiseKernel("T x, T y, float32 s", "T z", "z = x * s + y", "fake_fma")
        for n, start in ((100003, 0), (1 << 20, 4), (7, 0)):
            base = 1 << 36
            args = lambda b: (FakeArray(b + start, "float32", (n,)), FakeArray(b + (1 << 30) + start, "float32", (n,)),
                              2.5, FakeArray(b + (2 << 30) + start, "float32", (n,)))
            k(*args(base))
            full = fake.launches[-1]
            plans = fake.plans
            k(*args(base + (16 << 24)))          # the same signature, 16-byte aligned elsewhere
            _check_same_launch(full, fake.launches[-1], 16 << 24)
            assert fake.plans == plans            # the launch plan was kept
            assert full[6] == pdl
            # the scalar is written into the plan's bytes
            k(*args(base)[:2], -1.0, args(base)[3])
            diff = _ptr_offsets(full[3], fake.launches[-1][3])
            assert len(diff) == 1
    finally:
        ewkern.set_pdl(saved)


def test_elementwise_launch_carries_the_store_rule(fake):
    """A vector kernel's launch asks the store rule for the bytes its dense arrays move (inputs read
    + outputs written) and the bytes of them it writes, and writes the answer into the argument
    struct's wb field (1-D: size, shape[1], head, nfast, prefetch, wb: byte 40), once per plan."""
    k = ewkern.ElementwiseKernel("T x, T y", "T z", "z = x + y", "fake_add_wb")
    for n, want in ((100003, 0), (1 << 19, 1), (6 << 20, 1)):
        base = 1 << 36
        arrs = (FakeArray(base, "float32", (n,)), FakeArray(base + (1 << 30), "float32", (n,)),
                FakeArray(base + (2 << 30), "float32", (n,)))
        asked = len(fake.store_asks)
        k(*arrs)
        assert fake.store_asks[asked:] == [(n * 12, n * 4)]
        assert struct.unpack_from("<q", fake.launches[-1][3], 40)[0] == want
        k(*arrs)                                   # the plan keeps the answer
        assert len(fake.store_asks) == asked + 1
        assert struct.unpack_from("<q", fake.launches[-1][3], 40)[0] == want


def test_row_kernel_launch_carries_the_store_rule(fake):
    """A RowKernel's launch asks the store rule for the bytes its rows move (x read, y written, the
    weight row w) and the bytes it writes, and puts the answer in the argument struct's wb field
    (the last, after rows, cols, G, prefetch, tiles), once per plan: rmsnorm's output of 1 MiB streams, of
    2 MiB (at least 1/32 of the stand-in's 60 MiB L2) writes back."""
    rms = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                           "y = x * rsqrt(a / _row_size + eps) * w", "0", "fake_rms_wb")
    for rows, want in ((64, 0), (128, 1), (1024, 1)):
        base = 1 << 36
        args = (FakeArray(base, "float32", (rows, 4096)), FakeArray(base + (1 << 30), "float32", (4096,)), 1e-6)
        asked = len(fake.store_asks)
        rms(*args)
        assert fake.store_asks[asked:] == [(rows * 4096 * 8 + 4096 * 4, rows * 4096 * 4)]
        assert struct.unpack_from("<q", fake.launches[-1][3], len(fake.launches[-1][3]) - 8)[0] == want
        rms(*args)                                 # the plan keeps the answer
        assert len(fake.store_asks) == asked + 1
        assert struct.unpack_from("<q", fake.launches[-1][3], len(fake.launches[-1][3]) - 8)[0] == want


@pytest.mark.parametrize("twin_local, compiles, want", [(0, 2, "maxnreg"), (16, 2, "image"), (None, 1, "image")])
def test_vector_forms_that_spill_take_the_maxnreg_twin(fake, monkeypatch, twin_local, compiles, want):
    """An ElementwiseKernel whose forms report local memory (ptxas spilled them under
    __launch_bounds__(1024): here the stand-in's 1- and 2-vector forms, 16 bytes) is compiled a
    second time under __maxnreg__(64), and each spilling form takes the twin's entry where that
    reports less local memory; the other forms keep the first image's. twin_local None: no form
    spills, one compile."""
    sources = []

    def compile_cuda(name, src, *a, **k):
        sources.append(src)
        return (b"maxnreg" if "__maxnreg__(64)" in src else b"image"), "cubin", {}
    loaded = []
    monkeypatch.setattr(_build, "compile_cuda", compile_cuda)
    monkeypatch.setattr(fake, "_rtc_load", lambda image, entry, dev: loaded.append((image, entry)) or len(loaded) - 1)

    def attrs(h, dev):
        image, entry = loaded[h]
        if twin_local is None or entry.endswith(("_v4", "_v1l")):
            return 40, 0
        return 32, (16 if image == b"image" else twin_local)
    monkeypatch.setattr(fake, "_rtc_attrs", attrs)
    k = ewkern.ElementwiseKernel("T a", "T o", "o = exp(a)", f"fake_spill_{twin_local}")
    for n in (1000, 1 << 20):     # the stand-in's plan: 1 vector a thread, then 2
        k(FakeArray(1 << 36, "float64", (n,)), FakeArray(1 << 37, "float64", (n,)))
        image, entry = loaded[fake.launches[-1][0]]
        assert entry.endswith("_v1" if n == 1000 else "_v2") and image == want.encode()
    assert len(sources) == compiles
    assert all(s.count("__launch_bounds__(1024)") == 4 for s in sources[:1])
    assert all(s.count("__maxnreg__(64)") == 4 and "__launch_bounds__" not in s for s in sources[1:])


@pytest.mark.parametrize("spill, want", [((), 4), (("_v4",), 2), (("_v4", "_v2"), 1), (("_v2",), 4)])
def test_vector_plan_keeps_to_the_forms_that_do_not_spill(fake, monkeypatch, spill, want):
    """The launch rule is asked for no more vectors a thread than the largest form whose resource
    report (after the __maxnreg__(64) twin) has no local memory: ptxas spilled a bfloat16
    `o = a * b + c` at 4 vectors a thread under either bound, and the H200 ran that form 2.3-2.4x
    slower than at 1. The cap: 4 where the 4-vector form does not spill, else 2 where the
    2-vector form does not, else 1."""
    loaded = []
    monkeypatch.setattr(fake, "_rtc_load", lambda image, entry, dev: loaded.append(entry) or len(loaded) - 1)
    monkeypatch.setattr(fake, "_rtc_attrs", lambda h, dev: (64, 16 if loaded[h].endswith(spill) else 0))
    k = ewkern.ElementwiseKernel("T a, T b, T c", "T o", "o = a * b + c", f"fake_cap_{'_'.join(spill) or 'none'}")
    n = 1 << 22
    k(*(FakeArray((q + 1) << 36, "bfloat16", (n,)) for q in range(4)))
    assert fake.max_vpt == want


@pytest.mark.skipif(not ewkern.build_info().get("cuda"), reason="ewkern built without CUDA")
def test_rtc_plan_max_vpt_caps_the_rule():
    """_rtc_plan's max_vpt (the C rule, no GPU needed without PDL): at 2-4 waves, where a plain
    launch takes 4 vectors a thread, a cap of 2 or 1 takes that many over a grid sized for it; 3
    is refused."""
    block, w1, w4 = 256, 132 * 2048, 132 * 2048 * 4
    nvec = 3 * w1 + 1000                      # 3 waves of the 1-vector form, 0.75 of the 4-vector one
    w4 = nvec + nvec // 10                    # the 4-vector wave 91% full: the rule's 4
    assert ewkern._C._rtc_plan(0, nvec, 0, block, w1, w4, True, False, 8, False)[0] == 4
    for cap in (4, 2, 1):
        vpt, grid, prefetch = ewkern._C._rtc_plan(0, nvec, 0, block, w1, w4, True, False, 8, False, False, cap)
        want = -(-nvec // (cap * block))
        if (want - 1) * cap * block + block <= nvec - 1:   # the last block's spare threads own no vector
            want += 1
        assert vpt == cap and grid == want and prefetch == 0
    with pytest.raises(ValueError, match="max_vpt"):
        ewkern._C._rtc_plan(0, nvec, 0, block, w1, w4, True, False, 8, False, False, 3)


@pytest.mark.parametrize("rtc_wide, sm_gbs, pdl, want", [(True, 36.5, True, True), (True, 25.4, True, False),
                                                       (True, 36.5, False, False), (False, 36.5, True, False)])
def test_vector_plan_asks_the_wide_case_only_when_switched_on(fake, monkeypatch, rtc_wide, sm_gbs, pdl, want):
    """A user kernel's launch plan asks the rule's `wide` case (RTC_WIDE, off: it lost on the H200) only
    under PDL on a device whose memory moves >= WIDE_SM_GBS an SM."""
    monkeypatch.setattr(_kernel, "RTC_WIDE", rtc_wide)
    monkeypatch.setitem(_kernel._sm_facts, "cuda:0", (2048, sm_gbs))
    vk = _kernel._VectorKernel((1, 2, 3, 4), "cuda:0", False, (0, 0, 0, 0))
    vk.launch_plan(1 << 22, 0, 4, 256, pdl)
    assert fake.wide is want


def test_row_and_reduction_plan_launches_are_the_full_paths(fake):
    rms = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps) * w",
                           "0", "fake_rms")
    msq = ewkern.ReductionKernel("T x", "float32 y", "x * x", "a + b", "y = a", "0", "fake_msq")
    for kern, call in ((rms, lambda b: kern_args_rms(b)), (msq, lambda b: (FakeArray(b, "bfloat16", (64, 4096)),))):
        for kw in ({}, ) if kern is rms else ({"axis": 1}, {"axis": -1, "keepdims": True}):
            base = 1 << 36
            r1 = kern(*call(base), **kw)
            full = fake.launches[-1]
            r2 = kern(*call(base + (1 << 28)), **kw)
            second = fake.launches[-1]
            # new results are allocated each call: the output pointer moved by the allocator's step
            assert r1.ptr != r2.ptr and r1.shape == r2.shape
            assert full[:3] == second[:3] and full[4:] == second[4:]
            moved = {struct.unpack_from("<Q", second[3], o)[0] - struct.unpack_from("<Q", full[3], o)[0]
                     for o in _ptr_offsets(full[3], second[3])}
            assert 1 << 28 in moved and moved <= {1 << 28, r2.ptr - r1.ptr}


@pytest.mark.parametrize("local", [0, 48])
def test_reduction_rows_entry_bound_kept_unless_it_spills(fake, local):
    """The rows entry is built first with __launch_bounds__(256, 4); where the loaded kernel has
    local memory (ptxas spilled under the bound) it is built again without, and that one runs."""
    fake.bounded_local = local
    msq = ewkern.ReductionKernel("T x", "float32 y", "x * x", "a + b", "y = a", "0", f"fake_bound{local}")
    msq(FakeArray(1 << 36, "bfloat16", (64, 4096)), axis=1)
    assert f" blocks={4 if not local else 0}" in msq._last_path, msq._last_path
    launched = fake.images[fake.launches[-1][0]]
    assert (b"bounded" in launched) == (not local)


@pytest.mark.parametrize("env, want", [(None, True), ("0", False), ("1", True)])
def test_rows_cap_is_on_unless_turned_off(env, want):
    """EWKERN_RTC_ROWS_CAP, read at import: the cap is on unless it is "0"."""
    environ = {k: v for k, v in os.environ.items() if k != "EWKERN_RTC_ROWS_CAP"}
    if env is not None:
        environ["EWKERN_RTC_ROWS_CAP"] = env
    got = subprocess.run([sys.executable, "-c", "from ewkern.rtc import _kernel; print(_kernel._ROWS_CAP)"],
                         env=environ, capture_output=True, text=True, check=True).stdout.strip()
    assert got == str(want)


def test_rows_cap_refused_by_cuda_runs_uncapped(fake, monkeypatch):
    """A CUDA error from the cap's attribute calls leaves the launch uncapped (the cap is a speed
    rule), asked once for that kernel and cap; the result's launch is the plain one."""
    monkeypatch.setattr(ewkern, "pdl_enabled", lambda: True)
    monkeypatch.setattr(_kernel, "_ROWS_CAP", True)
    monkeypatch.setattr(fake, "_rtc_sig", lambda args, scalars: b"sig")
    monkeypatch.setattr(_kernel, "_caps", {})
    asked = []

    def refuse(h, block, dev, blocks):
        asked.append(blocks)
        raise RuntimeError("a run-time kernel's residency cap: CUDA error cudaErrorInvalidValue (1)")
    monkeypatch.setattr(fake, "_rtc_cap", refuse)
    mse = ewkern.ReductionKernel("T a, T b", "T y", "(a - b) * (a - b)", "a + b", "y = a / _in_ind.size()", "0",
                                 "fake_cap_refused")
    small = (FakeArray(1 << 36, "float32", (256, 4096)), FakeArray(1 << 37, "float32", (256, 4096)))
    for _ in range(2):
        mse(*small, axis=1)
        launch = fake.launches[-1]
        assert launch[1] == 256 and launch[7] == 0 and launch[6]
    assert asked == [2] and " smem" not in mse._last_path, mse._last_path


@pytest.mark.parametrize("pdl", [True, False])
def test_rows_engine_caps_the_blocks_an_sm_holds_for_small_grids(fake, monkeypatch, pdl):
    """A programmatic rows-engine launch whose grid needs fewer blocks an SM than the kernel's
    occupancy (here 8 of 256) asks C for the dynamic shared memory that keeps it to ceil(grid /
    SMs) (256 rows: 2), launches with it and records it in its plan's program (both settings:
    none for PDL off), where the cap is on (the default; EWKERN_RTC_ROWS_CAP=0 turns it off); a grid
    that fills the occupancy, a launch without PDL and the setting off take none."""
    monkeypatch.setattr(ewkern, "pdl_enabled", lambda: pdl)
    monkeypatch.setattr(_kernel, "_ROWS_CAP", True)
    monkeypatch.setattr(fake, "_rtc_sig", lambda args, scalars: b"sig")
    monkeypatch.setattr(_kernel, "_caps", {})
    mse = ewkern.ReductionKernel("T a, T b", "T y", "(a - b) * (a - b)", "a + b", "y = a / _in_ind.size()", "0",
                                 f"fake_cap{pdl}")
    small = (FakeArray(1 << 36, "float32", (256, 4096)), FakeArray(1 << 37, "float32", (256, 4096)))
    mse(*small, axis=1)
    launch = fake.launches[-1]
    want = 1024 * 50 if pdl else 0
    assert launch[1] == 256 and launch[7] == want and launch[6] == pdl
    # the capped launch runs a second handle of the image, which alone takes the cap's attributes
    (h_capped, _, cap_blocks), = fake.caps
    assert cap_blocks == 2 and (launch[0] == h_capped) == pdl
    assert h_capped != next(v[0][0] for v in mse._compiled.values())
    assert mse._last_path.endswith(f" smem={want} aligned" if pdl else " blocks=4 aligned"), mse._last_path
    (_, _, _, _, run, _), = mse._cplans.values()
    words = struct.unpack(f"<{len(run) // 8}q", run)
    assert words[0] == _kernel._PROG_LAUNCH_CAP and words[12:] == (0, 1024 * 50) and words[8] == h_capped
    # the program made into a launch is the full path's (its smem included)
    fake.run_prog(run, bytearray(launch[3]), launch[5], pdl)
    assert fake.launches[-1] == launch
    big = (FakeArray(1 << 38, "float32", (2048, 4096)), FakeArray(1 << 39, "float32", (2048, 4096)))
    mse(*big, axis=1)   # 2048 blocks: 16 an SM, past the occupancy
    assert fake.launches[-1][1] == 2048 and fake.launches[-1][7] == 0 and len(fake.caps) == 1
    monkeypatch.setattr(_kernel, "_ROWS_CAP", False)
    mse2 = ewkern.ReductionKernel("T a, T b", "T y", "(a - b) * (a - b)", "a + b", "y = a / _in_ind.size()", "0",
                                  f"fake_nocap{pdl}")
    mse2(*small, axis=1)
    assert fake.launches[-1][7] == 0 and len(fake.caps) == 1 and " smem" not in mse2._last_path


def kern_args_rms(b):
    return FakeArray(b, "float32", (300, 4096)), FakeArray(b + (1 << 30), "float32", (4096,)), 1e-6


@pytest.mark.parametrize("rows", [300, 5000])
def test_column_sum_plan_launches_are_the_full_paths(fake, rows):
    """A RowKernel with a column-sum output on CUDA: a wave of blocks (the occupancy the stand-in
    reports) over tiles of rows, in blocks of 512 lanes (two groups of 256, as many resident as
    in blocks of 256) whose groups combine their sums into one partial row a block, partial rows
    allocated per call, then the column sum's launch; a warm call launches the same kernels with
    only the pointers moved."""
    k = ewkern.RowKernel("T x, T w, float32 eps", "T y, T gw", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w; gw = x * rsqrt(a / _row_size + eps)", "0",
                         "fake_cs", _colsum=("gw",))
    base = 1 << 36
    args = lambda b: (FakeArray(b, "float32", (rows, 4096)), FakeArray(b + (1 << 30), "float32", (4096,)), 1e-6)
    y, gw = k(*args(base))
    assert gw.shape == (4096,) and y.shape == (rows, 4096)
    first = fake.launches[-2:]
    assert "tiles=" in k._last_path
    rows_launch = first[0]
    grid, block = rows_launch[1], rows_launch[2]
    assert grid <= 132 * 4 and block == 512     # at most a wave of the stand-in's 4 blocks of 512 an SM
    (tiles,) = struct.unpack_from("<q", rows_launch[3], len(rows_launch[3]) - 16)   # tiles, then wb
    pairs = -(-rows // 2)                        # two rows a block a tile
    assert tiles * grid >= pairs > (tiles - 1) * grid and tiles == -(-pairs // (132 * 4))
    sum_launch = first[1]
    part, out, P, cols = struct.unpack("<QQqq", sum_launch[3])
    assert sum_launch[1:3] == (4096 // 32, 1024) and (P, cols) == (grid, 4096)
    assert out == gw.ptr and part not in (gw.ptr, y.ptr)
    (p_gw,) = [struct.unpack_from("<Q", rows_launch[3], o)[0] for o in range(0, len(rows_launch[3]) - 40, 8)
               if struct.unpack_from("<Q", rows_launch[3], o)[0] == part]
    y2, gw2 = k(*args(base + (1 << 28)))
    second = fake.launches[-2:]
    for f, s in zip(first, second):
        assert f[:3] == s[:3] and f[4:] == s[4:]
        assert len(f[3]) == len(s[3])
    assert gw2.ptr != gw.ptr


@pytest.mark.parametrize("occupancy_g128, want_g", [(2, 256), (3, 128)])
def test_column_sum_takes_more_lanes_when_few_are_resident(fake, monkeypatch, occupancy_g128, want_g):
    """A column-sum RowKernel whose plan (G = 128, 4 vectors a lane for rows of 4096 float16)
    leaves fewer than _COLSUM_MIN_THREADS lanes resident an SM takes twice the lanes with half
    the vectors each when more of those fit (the stand-in reports the occupancy by the compiled
    G, for registers: lanes an SM / block); a plan that fills enough, and a kernel without column
    sums, keep row_plan's. Its groups then combine their column sums in blocks of up to
    COLSUM_BLOCK lanes where as many lanes stay resident (G 256: 2 blocks of 512 as 4 of 256;
    G 128 at 3 blocks of 256 would fit 1 of 512, so not), one partial row a block."""
    monkeypatch.setattr(_build, "compile_cuda", lambda name, src, *a, **k: (
        re.search(r"const int _G = (\d+)", src).group(1).encode(), "cubin", {}))
    monkeypatch.setattr(fake, "_rtc_load", lambda image, entry, dev: (int(image), entry))
    monkeypatch.setattr(fake, "_rtc_occupancy",
                        lambda h, block, dev: (occupancy_g128 if h[0] == 128 else 4) * 256 // block)
    args = (FakeArray(1 << 36, "float16", (2048, 4096)), FakeArray(1 << 37, "float16", (4096,)), 1e-6)
    k = ewkern.RowKernel("T x, T w, float32 eps", "T y, T gw", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w; gw = x * rsqrt(a / _row_size + eps)", "0",
                         f"fake_wide_{occupancy_g128}", _colsum=("gw",))
    k(*args)
    (h, grid, block), colsum = fake.launches[-2][:3], fake.launches[-1]
    assert h == (want_g, f"ewrtc_fake_wide_{occupancy_g128}_r{512 // want_g}")
    assert k._last_path.startswith(f"rows G={want_g} VPL={512 // want_g} E=8")
    assert block == 2 * want_g and k._last_path.endswith(f"block={block}")
    tiles = -(-2048 // (grid * (block // want_g)))
    assert grid * (block // want_g) * tiles >= 2048 and grid <= 132 * (occupancy_g128 if want_g == 128 else 2)
    assert struct.unpack("<QQqq", colsum[3])[2] == grid   # one partial row a block
    plain = ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b",
                             "y = x * rsqrt(a / _row_size + eps) * w", "0", f"fake_narrow_{occupancy_g128}")
    plain(*args)
    assert fake.launches[-1][0] == (128, f"ewrtc_fake_narrow_{occupancy_g128}_r4")


@pytest.mark.parametrize("rows, block", [(2048, 512), (8192, 512), (32768, 256)])
def test_column_sum_widens_its_blocks_where_the_partials_weigh(fake, monkeypatch, rows, block):
    """float16 rows of 4096 at G 256 (4 blocks of 256 an SM or 2 of 512 in the stand-in): blocks
    of 512 where one partial row a group (528 of 4096 float32) would add at least
    _COLSUM_WIDEN_SHARE to the bytes of x, g and the gradient (6 bytes an element): 2048 rows
    34%, 8192 rows 8.6%; at 32768 rows (2.1%) blocks of 256, one group each, without the combine."""
    monkeypatch.setattr(_build, "compile_cuda", lambda name, src, *a, **k: (
        re.search(r"const int _G = (\d+)", src).group(1).encode(), "cubin", {}))
    monkeypatch.setattr(fake, "_rtc_load", lambda image, entry, dev: (int(image), entry))
    # G 128 x 4 vectors holds 512 lanes an SM (the plan then takes G 256 x 2), G 256 1024
    monkeypatch.setattr(fake, "_rtc_occupancy", lambda h, block, dev: (512 if h[0] == 128 else 1024) // block)
    k = ewkern.RowKernel("T x, T g, T w", "T gx, T gw", "x * g", "a + b",
                         "gx = g * w - x * a; gw = g * x", "0", f"fake_widen_{rows}", _colsum=("gw",))
    k(FakeArray(1 << 36, "float16", (rows, 4096)), FakeArray(1 << 37, "float16", (rows, 4096)),
      FakeArray(1 << 38, "float16", (4096,)))
    (h, grid, got), colsum = fake.launches[-2][:3], fake.launches[-1]
    assert h[0] == 256 and got == block, k._last_path
    assert struct.unpack("<QQqq", colsum[3])[2] == grid   # one partial row a block either way
    share = 2 * 528 * 4 / (rows * 6)
    assert (share >= _rowkernel._COLSUM_WIDEN_SHARE) == (block == 512)


_LEAN_ROWS = _rowkernel._LEAN_WAVES * 132 * 2048 // 512     # float32 rows of 4096 that fill them


@pytest.mark.parametrize("dtype, rows, cols, lanes, gbs, kind, want", [
    ("float32", _LEAN_ROWS, 4096, 2048, 36.5, "", (512, -2)),          # _LEAN_WAVES waves of 512 lanes a row
    ("float32", _LEAN_ROWS - 1, 4096, 2048, 36.5, "", (256, 4)),       # just under
    ("float32", 1 << 17, 4096, 1536, 36.5, "", (256, 4)),              # the lean form would leave lanes unused
    ("bfloat16", 2 * _LEAN_ROWS, 4096, 2048, 36.5, "", (256, -2)),     # 128 x 4 -> 256 x 2
    ("float32", 1 << 17, 4096, 2048, 36.5, "colsum", (256, 4)),        # with a column sum: never
    ("float32", 1 << 17, 4096, 2048, 36.5, "stage2", (256, 4)),        # with a second reduction: never
    ("float16", 1 << 17, 4096, 2048, 25.4, "", (128, 4)),              # 25 GB/s an SM (an H100's): never
    ("float32", 1 << 17, 1022, 2048, 36.5, "", (256, 4)),              # one element a vector: never
    ("float32", 1 << 23, 64, 2048, 36.5, "", (4, 4))])                 # 8 lanes a row: below _LEAN_MIN_G
def test_many_rows_take_the_lean_two_pass_form(fake, monkeypatch, dtype, rows, cols, lanes, gbs, kind, want):
    """A RowKernel whose register plan is 4 vectors a lane at 64 <= G <= 256 runs the lean
    two-pass form (2G lanes, 2 vectors each, the row read again from L2: entry t2, blocks of 2G)
    where its rows fill at least _LEAN_WAVES waves of it, it keeps every lane of the SM resident
    (the stand-in reports `lanes` an SM for it), the memory moves >= _LEAN_SM_GBS an SM and the
    rows take 16-byte vectors; otherwise, and for kernels with column sums or a second reduction,
    the register form (rows of 1022 float32: row_plan's G 256 x 4 of single elements)."""
    monkeypatch.setitem(_kernel._sm_facts, "cuda:0", (2048, gbs))
    entries = []
    monkeypatch.setattr(fake, "_rtc_load", lambda image, entry, dev: entries.append(entry) or len(entries) - 1)
    monkeypatch.setattr(fake, "_rtc_occupancy", lambda h, block, dev: (
        lanes if entries[h].endswith("_t2") else 2048) // block)
    colsum = kind == "colsum"
    k = ewkern.RowKernel("T x, float32 eps", "T y, T gw" if colsum else "T y", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps)" + ("; gw = x" if colsum else ""), "0",
                         f"fake_lean_{dtype}_{rows}_{cols}_{lanes}_{kind}", _colsum=("gw",) if colsum else (),
                         _stage2=("x", "a + b", "0") if kind == "stage2" else None)
    k(FakeArray(1 << 36, dtype, (rows, cols)), 1e-6)
    h, grid, block = fake.launches[-2 if colsum else -1][:3]
    G, vpl = want
    assert entries[h].endswith("_t2" if vpl < 0 else "_r4")
    assert k._last_path.startswith(f"rows G={G} VPL={vpl} ")
    # the store rule (the stand-in's: write-back past its 60 MiB L2) for the register forms; the
    # lean form streams (it reads its rows again from the L2)
    rows_launch = fake.launches[-2 if colsum else -1]
    assert struct.unpack_from("<q", rows_launch[3], len(rows_launch[3]) - 8)[0] == (0 if vpl < 0 else 1)
    if not colsum:
        assert block == max(256, G) and grid == -(-rows // (block // G))


@pytest.mark.parametrize("dtype, rows, cols, block, grid, plan", [
    ("bfloat16", 128, 4096, 256, 128, "G=256 VPL=2"),   # a row an SM: 256 lanes of 2 vectors, not 128 of 4
    ("bfloat16", 131, 2048, 128, 131, "G=128 VPL=2"),   # G 64 x 4 -> 128 x 2, not 256 x 1: one group a block
    ("bfloat16", 131, 1024, 256, 17, "G=32 VPL=4"),     # G 32: eight rows a block, not a row an SM: kept
    ("bfloat16", 300, 4096, 256, 150, "G=128 VPL=4"),   # 150 blocks of two rows: as many as SMs, kept
    ("float16", 132, 4096, 128, 132, "G=128 VPL=4"),    # rows as many as SMs: kept
    ("float32", 64, 4096, 256, 64, "G=256 VPL=4"),      # G 256: a group is a block already
    ("float32", 100, 64, 256, 2, "G=4 VPL=4")])         # G 4: short rows stay 64 to a block
def test_few_rows_take_a_block_a_group(fake, dtype, rows, cols, block, grid, plan):
    """A RowKernel with fewer rows than the device has SMs (the stand-in: 132) gives a row at
    least _FEW_ROWS_G lanes while a lane keeps 2 vectors or more; one whose grid of
    ROW_MIN_BLOCK-lane blocks would hold fewer blocks than SMs launches one group a block (G
    lanes, G >= _SPLIT_MIN_G)."""
    k = ewkern.RowKernel("T x, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps)", "0",
                         f"fake_split_{dtype}_{rows}_{cols}")
    k(FakeArray(1 << 36, dtype, (rows, cols)), 1e-6)
    assert fake.launches[-1][1:3] == (grid, block), k._last_path
    assert k._last_path.startswith(f"rows {plan} "), k._last_path


def test_column_sum_with_one_group_a_block_compiles_without_the_combine(fake, monkeypatch):
    """A column-sum plan whose block holds one group (float32 rows of 4096: G 256) and whose
    blocks of 512 would leave fewer lanes resident (the stand-in: 3 blocks of 256 an SM, 1 of
    512) runs the form compiled without the combine: bound 256, no shared memory for the sums,
    one partial row a group."""
    sources = []

    def compile_cuda(name, src, *a, **k):
        sources.append(src)
        g = re.search(r"const int _G = (\d+)", src).group(1).encode()
        return g + (b"c" if "_cb_" in src else b""), "cubin", {}
    monkeypatch.setattr(_build, "compile_cuda", compile_cuda)
    monkeypatch.setattr(fake, "_rtc_load", lambda image, entry, dev: (image, entry))
    monkeypatch.setattr(fake, "_rtc_occupancy", lambda h, block, dev: 3 if block == 256 else 1)
    k = ewkern.RowKernel("T x, T w, float32 eps", "T y, T gw", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w; gw = x * rsqrt(a / _row_size + eps)", "0",
                         "fake_one_group", _colsum=("gw",))
    k(FakeArray(1 << 36, "float32", (3000, 4096)), FakeArray(1 << 37, "float32", (4096,)), 1e-6)
    (h, grid, block), colsum = fake.launches[-2][:3], fake.launches[-1]
    assert h == (b"256", "ewrtc_fake_one_group_r4") and block == 256
    bounds = [re.findall(r"__launch_bounds__\((\d+)\)", x)[:4] for x in sources]
    assert len(sources) == 2 and bounds == [["512"] * 4, ["256"] * 4], bounds
    assert "_cb_" in sources[0] and "_cb_" not in sources[1]
    assert struct.unpack("<QQqq", colsum[3])[2] == grid and grid <= 132 * 3


def test_column_sum_c_plan_carries_the_partial_rows_as_hidden_outputs(fake, monkeypatch):
    """On CUDA a column-sum RowKernel records a plan for the C path too: its partial rows are
    hidden outputs after the results, their address goes into the kernel's slot and, with the
    output's, after the argument struct, where the plan's run reads them for the column sum's
    launch. Its launches are data, run here the way csrc/rtc.c runs them (the stand-in's C path
    only records)."""
    monkeypatch.setattr(fake, "_rtc_sig", lambda args, scalars: b"sig")
    k = ewkern.RowKernel("T x, T w, float32 eps", "T y, T gw", "x * x", "a + b",
                         "y = x * rsqrt(a / _row_size + eps) * w; gw = x * rsqrt(a / _row_size + eps)", "0",
                         "fake_cs_c", _colsum=("gw",))
    args = (FakeArray(1 << 36, "float32", (3000, 4096)), FakeArray(1 << 37, "float32", (4096,)), 1e-6)
    y, gw = k(*args)
    full_rows, full_sum = fake.launches[-2:]
    (tmpl, pslots, sslots, outs, run, ret, hidden), = k._cplans.values()
    assert ret == 2 and hidden == 1
    nparts = struct.unpack("<QQqq", full_sum[3])[2]
    assert outs == (("float32", (3000, 4096)), ("float32", (4096,)), ("float32", (nparts, 4096)))
    # what C does: the arguments' and new outputs' addresses into the slots, then run
    addr = [1 << 40, 1 << 41, 0, 1 << 42, 1 << 43, 1 << 44]   # x, w, eps, y, gw, the partial rows
    buf = bytearray(tmpl)
    for off, a, add in struct.iter_unpack("<3q", pslots):
        struct.pack_into("<Q", buf, off, addr[a] + add)
    for off, kind, a in struct.iter_unpack("<3q", sslots):
        struct.pack_into("<f" if kind == 0 else "<d", buf, off, args[a])
    assert isinstance(run, bytes)   # the launches as data: csrc/rtc.c runs them without Python
    fake.run_prog(run, buf, 5, bool(ewkern.pdl_enabled()))
    rows_launch, sum_launch = fake.launches[-2:]
    assert rows_launch[:3] == full_rows[:3] and rows_launch[5] == 5 and len(rows_launch[3]) == len(tmpl)
    assert sum_launch[:3] == full_sum[:3] and sum_launch[5] == 5
    assert struct.unpack("<QQqq", sum_launch[3]) == (1 << 44, 1 << 43, nparts, 4096)
    # the kernel's own partial-rows slot holds the hidden output's address
    part_slot = struct.unpack("<QQqq", full_sum[3])[0]
    offs = [o for o in range(0, len(full_rows[3]), 8) if struct.unpack_from("<Q", full_rows[3], o)[0] == part_slot]
    assert [struct.unpack_from("<Q", rows_launch[3], o)[0] for o in offs] == [1 << 44]


@pytest.mark.parametrize("pdl", [False, True])
def test_c_plan_programs_are_the_full_paths_launches(fake, monkeypatch, pdl):
    """A C plan's launches are data (csrc/rtc.h's program words, which csrc/rtc.c runs without
    Python, and ewkern.torch's C++ node of a user op's backward too): for a vector
    ElementwiseKernel (odd size, misaligned start), a ReductionKernel's block-per-output kernel
    (over columns) and its rows engine, a RowKernel and one with a column sum, the program made into
    launches with the call's own addresses is the full path's launches, byte for byte, with PDL
    off and on (each record holds both settings' grid, prefetch and kernel)."""
    monkeypatch.setattr(ewkern, "pdl_enabled", lambda: pdl)
    monkeypatch.setattr(fake, "_rtc_sig", lambda args, scalars: b"sig")
    b = 1 << 36
    f32 = lambda off, shape: FakeArray(b + off, "float32", shape)   # noqa: E731
    cases = [
        (ewkern.ElementwiseKernel("T x, T y, float32 s", "T z", "z = x * s + y", f"prog_fma{pdl}"),
         (f32(4, (100003,)), f32((1 << 30) + 4, (100003,)), 2.5), {}, 1),
        (ewkern.ReductionKernel("T x", "float32 y", "x * x", "a + b", "y = a", "0", f"prog_cols{pdl}"),
         (f32(0, (64, 4096)),), {"axis": 0}, 1),
        (ewkern.ReductionKernel("T x", "float32 y", "x * x", "a + b", "y = a", "0", f"prog_msq{pdl}"),
         (FakeArray(b, "bfloat16", (64, 4096)),), {"axis": 1}, 1),
        (ewkern.RowKernel("T x, T w, float32 eps", "T y", "x * x", "a + b", "y = x * rsqrt(a / _row_size + eps) * w",
                          "0", f"prog_rms{pdl}"), kern_args_rms(b), {}, 1),
        (ewkern.RowKernel("T x, T w, float32 eps", "T y, T gw", "x * x", "a + b",
                          "y = x * rsqrt(a / _row_size + eps) * w; gw = x * rsqrt(a / _row_size + eps)", "0",
                          f"prog_cs{pdl}", _colsum=("gw",)), kern_args_rms(b), {}, 2),
    ]
    for kern, args, kw, nl in cases:
        res = kern(*args, **kw)
        full = fake.launches[-nl:]
        assert all(launch[6] == pdl for launch in full)
        (tmpl, pslots, sslots, outs, run, ret, *hidden), = kern._cplans.values()
        assert isinstance(run, bytes), kern.name
        addr = [a.ptr if isinstance(a, FakeArray) else 0 for a in args]
        addr += [r.ptr for r in (res if isinstance(res, tuple) else (res,))]
        if hidden:   # the column sum's partial rows, which the full path allocated itself
            addr.append(struct.unpack("<QQqq", full[-1][3])[0])
        buf = bytearray(tmpl)
        for off, a, add in struct.iter_unpack("<3q", pslots):
            struct.pack_into("<Q", buf, off, addr[a] + add)
        for off, kind, a in struct.iter_unpack("<3q", sslots):
            struct.pack_into("<f" if kind == 0 else "<d", buf, off, args[a])
        fake.run_prog(run, buf, 77, pdl)
        again = fake.launches[-nl:]
        assert [launch[:3] + launch[4:] for launch in again] == [launch[:3] + launch[4:] for launch in full], kern.name
        # the kernel's own argument struct byte for byte (a column sum's plan carries the two
        # addresses after it, where the launch does not read)
        assert again[0][3][:len(full[0][3])] == full[0][3] and all(
            x[3] == y[3] for x, y in zip(again[1:], full[1:])), kern.name
