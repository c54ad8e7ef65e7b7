"""SASS checks of the built extension's elementwise kernels (no GPU needed).

Reads the machine code that nvcc put into ewkern._C with `cuobjdump --dump-sass` and checks what
the papers' experiments rely on:
  * the 128-bit variants (ThreadBlock*V4*, Naive*V4*, f32x4, f16x8pack, bf16x8pack, copy vec4,
    auto) really issue 128-bit global loads and stores (LDG.E.128 / STG.E.128);
  * __restrict__ turns the loads into non-coherent ones (LDG.E...CONSTANT), plain pointers do not;
  * the copy loop with a 32-bit index has fewer instructions per iteration than with a 64-bit
    index (elementwise-ops-on-gpus.md, "Instructions per iteration").

Skipped, with the reason, when ewkern is not importable, was built without CUDA, or cuobjdump
(with nvdisasm, which it calls) is not on PATH, in $CUDA_HOME/bin, /usr/local/cuda/bin or a
pip-installed NVIDIA package (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm).
Kernel names are matched as substrings of the mangled names (namespace ewk), e.g.
_ZN3ewk13copy_vec1_i32IfEEvPKT_PS1_jj for copy_vec1_i32<float>.
"""
import importlib.util
import os
import re
import subprocess

import pytest

PREFERRED_ARCH = "sm_90"


def _find_tool(name):
    """cuobjdump / nvdisasm, found as scripts/sass_compare.py finds them (PATH, CUDA_HOME, the wheels)."""
    spec = importlib.util.spec_from_file_location(
        "sass_compare", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                                     "sass_compare.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.find_tool(name)


def _extension_path():
    try:
        import ewkern  # noqa: F401
        import ewkern._C as C
    except Exception as exc:  # not built / not importable
        pytest.skip("ewkern is not importable: %s" % exc)
    check = getattr(ewkern, "cuda_available_build", None)
    if callable(check) and not check():
        pytest.skip("ewkern was built without CUDA")
    return C.__file__


def _parse_sass(text):
    """{arch: {mangled function name: [(address, instruction text), ...]}}"""
    out = {}
    arch = None
    func = None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (sm_\d+\w*)", line)
        if m:
            arch = m.group(1)
            out.setdefault(arch, {})
            func = None
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m and arch is not None:
            func = m.group(1)
            out[arch][func] = []
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and func is not None:
            out[arch][func].append((int(m.group(1), 16), m.group(2)))
    return out


@pytest.fixture(scope="module")
def sass():
    path = _extension_path()
    cuobjdump = _find_tool("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (PATH, CUDA_HOME, /usr/local/cuda, pip nvidia-cuda-cuobjdump)")
    env = dict(os.environ)
    nvdisasm = _find_tool("nvdisasm")
    if nvdisasm is not None:
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    # the preferred architecture alone is much quicker to disassemble; all of them if it is absent
    proc = subprocess.run([cuobjdump, "--dump-sass", "--gpu-architecture", PREFERRED_ARCH, path],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0 or "Function :" not in proc.stdout:
        proc = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        if "nvdisasm" in proc.stderr:
            pytest.skip("cuobjdump needs nvdisasm, which was not found: %s" % proc.stderr.strip())
        if "does not contain" in proc.stderr or "no device code" in proc.stderr.lower():
            pytest.skip("the extension holds no device code: %s" % proc.stderr.strip())
        pytest.fail("cuobjdump failed (%d): %s" % (proc.returncode, proc.stderr.strip()))
    parsed = _parse_sass(proc.stdout)
    parsed = {a: f for a, f in parsed.items() if f}
    if not any("ewk" in name for funcs in parsed.values() for name in funcs):
        pytest.skip("no ewkern CUDA kernels in %s (built without CUDA?)" % path)
    arch = PREFERRED_ARCH if PREFERRED_ARCH in parsed else max(parsed, key=lambda a: int(re.sub(r"\D", "", a)))
    return arch, parsed[arch]


def _functions(sass, *substrings):
    arch, funcs = sass
    hits = {n: ins for n, ins in funcs.items() if "ewk" in n and all(s in n for s in substrings)}
    assert hits, "no kernel whose mangled name contains %r in the %s SASS" % (substrings, arch)
    return hits


LDG128 = re.compile(r"\bLDG\.E(?:\.[A-Z0-9_]+)*\.128\b")
STG128 = re.compile(r"\bSTG\.E(?:\.[A-Z0-9_]+)*\.128\b")


@pytest.mark.parametrize(
    "parts",
    [
        ("add_ThreadBlockIV4U4MRgs",),
        ("add_ThreadBlockIV4U4TRgs",),
        ("add_ThreadBlockSV4U4MRmo",),
        ("add_ThreadBlockSV4U1TRmo",),
        ("add_NaiveIV4U4MR",),
        ("add_NaiveSV4U4TC",),
        ("add_f32x4",),
        ("add_f16x8pack",),
        ("add_bf16x8pack",),
        ("copy_vec4_i32IfE",),
        ("copy_vec4_i64IfE",),
        ("ew_fastINS_6Op_addEfiLi1ELb0",),  # auto add, float32, 32-bit index, 1 vector per thread
        ("ew_fastINS_6Op_addE13__nv_bfloat16iLi2ELb0",),
        ("ew_fastINS_7Op_geluE6__halfiLi4ELb0",),
        ("ew_gsINS_6Op_logEfiLb1",),  # grid1/grid2 body
    ],
)
def test_vector_kernels_move_128_bits(sass, parts):
    for name, ins in _functions(sass, *parts).items():
        text = [t for _, t in ins]
        assert any(LDG128.search(t) for t in text), "%s: no 128-bit global load" % name
        assert any(STG128.search(t) for t in text), "%s: no 128-bit global store" % name


PRED = re.compile(r"^@(!?)(U?P\w+)\s")


def _assert_default_path_forms(forms, vpt=None, policy=False, writeback=False):
    """forms: {"1": the PDL form's kernels, "0": the plain form's}. Every 128-bit load of a thread's
    vectors issues before its first store (vpt of each when given), the stores are streaming
    (st.global.cs shows as STG.E.EF) or, with policy (ew_fast's store rule, p.wb), each vector's
    store is a pair: write-back and streaming, each under its own predicate (ptxas forms the two
    of the guard and p.wb), at one address; the dependents are triggered early (griddepcontrol.launch_dependents = PREEXIT);
    the PDL form waits for its primary (griddepcontrol.wait = ACQBULK) before any global load,
    after its L2 prefetch; the plain form (launches without PDL) neither waits nor prefetches."""
    for form, funcs in forms.items():
        for name, ins in funcs.items():
            text = [t for _, t in ins]
            loads = [i for i, t in enumerate(text) if LDG128.search(t)]
            stores = [i for i, t in enumerate(text) if STG128.search(t)]
            assert loads and stores, name
            if vpt is not None:
                assert len(loads) >= vpt and len(stores) == vpt * (2 if policy else 1), name
            assert max(loads) < min(stores), "%s: a 128-bit store before the last vector load" % name
            if policy:
                ef = [text[i] for i in stores if ".EF" in text[i]]
                wb = [text[i] for i in stores if ".EF" not in text[i]]
                assert len(ef) == len(wb), "%s: %d streaming against %d write-back stores" % (name, len(ef), len(wb))
                for e, w in zip(ef, wb):
                    pe, pw = PRED.match(e), PRED.match(w)
                    assert pe and pw and pe.groups() != pw.groups(), "%s: not a predicated pair: %s / %s" % (name, e, w)
                    assert e.split("]")[1] == w.split("]")[1], "%s: the pair's addresses differ: %s / %s" % (name, e, w)
            elif writeback:
                assert not any(".EF" in text[i] for i in stores), "%s: vector stores are not write-back" % name
            else:
                assert all(".EF" in text[i] for i in stores), "%s: vector stores are not streaming" % name
            waits = [i for i, t in enumerate(text) if t.startswith("ACQBULK")]
            triggers = [i for i, t in enumerate(text) if t.startswith("PREEXIT")]
            assert triggers and triggers[0] < min(stores), "%s: no early trigger of the dependents" % name
            if form == "1":
                assert waits and waits[0] < loads[0], "%s: no griddepcontrol.wait before the loads" % name
                _assert_prefetch_before_wait(name, text)
            else:
                assert not waits, "%s: the plain form waits for a PDL primary" % name
                assert not any(PREFETCH_L2.search(t) for t in text), "%s: the plain form prefetches" % name


@pytest.mark.parametrize("vpt", ["1", "2", "4"])
@pytest.mark.parametrize("op", ["6Op_addEf", "7Op_copyE6__half", "6Op_logE13__nv_bfloat16"])
def test_auto_loads_first_then_stores_by_the_policy(sass, op, vpt):
    # auto (ew_fast) in both forms (_assert_default_path_forms: the PDL form's store of each vector
    # a write-back / streaming pair chosen by the launch's store rule, the plain form's streaming);
    # auto_wb keeps write-back stores
    forms = {form: _functions(sass, "ew_fastINS_" + op, "iLi%sELb0ELb%s" % (vpt, form)) for form in "01"}
    _assert_default_path_forms({"1": forms["1"]}, int(vpt), policy=True)
    _assert_default_path_forms({"0": forms["0"]}, int(vpt))
    # the plain form's write-back instance (the store rule's choice behind a foreign kernel): the
    # streaming instance's code with write-back stores, instruction for instruction
    plain_wb = _functions(sass, "ew_fastINS_" + op, "iLi%sELb1ELb0" % vpt)
    _assert_default_path_forms({"0": plain_wb}, int(vpt), writeback=True)
    assert sorted(len(i) for i in plain_wb.values()) == sorted(len(i) for i in forms["0"].values())
    for name, ins in _functions(sass, "ew_fastINS_" + op, "iLi1ELb1").items():
        assert not any(STG128.search(t) and ".EF" in t for _, t in ins), name


@pytest.mark.parametrize("vpt", ["1", "2", "4"])
@pytest.mark.parametrize("op", ["9Grad_geluEf", "8Grad_mulE6__half"])
def test_backward_forms(sass, op, vpt):
    # the backward ops' auto kernel (ew_fast_n) in its two forms, as ew_fast's: the PDL form's
    # stores by the store rule (a predicated pair a vector), the plain form's streaming, and the
    # plain form's write-back instance
    forms = {form: _functions(sass, "9ew_fast_nINS_" + op, "iLi%sELb%sEEEv" % (vpt, form)) for form in "01"}
    _assert_default_path_forms({"1": forms["1"]}, policy=True)
    _assert_default_path_forms({"0": forms["0"]})
    # the plain form's write-back instance (ew_fast_n_wb, the store rule's choice behind a foreign
    # kernel): the streaming instance's code with write-back stores, instruction for instruction
    plain_wb = _functions(sass, "12ew_fast_n_wbINS_" + op, "Li%sEEEv" % vpt)
    assert len(plain_wb) == 1, sorted(plain_wb)
    _assert_default_path_forms({"0": plain_wb}, writeback=True)
    assert sorted(len(i) for i in plain_wb.values()) == sorted(len(i) for i in forms["0"].values())


@pytest.mark.parametrize("op", ["6Op_expEd", "10Op_sigmoidEd", "7Op_siluEd"])
def test_float64_exp_family_keeps_its_registers(sass, op):
    # float64 exp, sigmoid and silu at 1-2 vectors a thread are ew_fast_r (__maxnreg__(64)): under
    # __launch_bounds__(1024) alone ptxas fitted them into 32 registers by spilling to local memory
    # (STL/LDL), which cost sigmoid 4 MiB 0.95 -> 1.02-1.04 of torch's single launch on the H200
    local = re.compile(r"\b(STL|LDL)\b")
    funcs = _functions(sass, "9ew_fast_rINS_" + op)
    # 1 and 2 a thread in three forms (PDL, plain streaming, plain write-back), and the 64-bit index
    assert len(funcs) == 7, sorted(funcs)
    for name, ins in funcs.items():
        assert not any(local.search(t) for _, t in ins), "%s spills to local memory" % name
    assert not [n for n in _functions(sass, "7ew_fastINS_" + op) if re.search(r"[il]Li[12]E", n)]


def test_backward_kernels_at_one_and_two_vectors_keep_their_registers(sass):
    # every backward op x dtype x form at 1-2 vectors a thread (the backward rule's usual plans)
    # keeps its values in registers: float64 erf's gradient at 1 is ew_fast_n_r (__maxnreg__(64);
    # under __launch_bounds__(1024) alone ptxas fitted it into 32 registers with 6 STL/LDL). The
    # 4-vector kernels of div (16-bit, float64) and float64 erf and gelu still spill: an open lead
    local = re.compile(r"\b(STL|LDL)\b")
    funcs = {**_functions(sass, "9ew_fast_nINS_"), **_functions(sass, "11ew_fast_n_rINS_")}
    few = {n: ins for n, ins in funcs.items() if re.search(r"[il]Li[12]E", n)}
    assert len(few) > 200
    # and the plain form's write-back instances (32-bit indices only: no index type in the name)
    wb = {**_functions(sass, "12ew_fast_n_wbINS_"), **_functions(sass, "14ew_fast_n_r_wbINS_")}
    few_wb = {n: ins for n, ins in wb.items() if re.search(r"Li[12]EEEv", n)}
    assert len(wb) > 150 and len(few_wb) == 2 * len(wb) // 3
    spilled = sorted(n for n, ins in {**few, **few_wb}.items() if any(local.search(t) for _, t in ins))
    assert not spilled, spilled[:5]
    freed = sorted(_functions(sass, "11ew_fast_n_rINS_"))
    assert len(freed) == 3 and all("8Grad_erfEd" in n and "Li1E" in n for n in freed), freed
    freed_wb = sorted(_functions(sass, "14ew_fast_n_r_wbINS_"))
    assert len(freed_wb) == 1 and "8Grad_erfEdLi1E" in freed_wb[0], freed_wb


@pytest.mark.parametrize("vpt,most", [("2", 64), ("4", 64)])
def test_float64_gelu_loads_its_coefficients_once_a_batch(sass, vpt, most):
    # float64 gelu's 30 coefficients do not fit the 63 uniform registers, so each evaluation
    # reloads them (ULDC.64): 90 and 146 ULDCs at 2 and 4 vectors a thread. Both forms evaluate a
    # thread's vectors together (Batch<Op_gelu_f64>: every element through each polynomial step
    # before the next step), each coefficient loaded once for the batch and once for the tail's
    # element (about 60), no spill. The PDL form is the plain form's code after the wait: it does
    # not prefetch (batched and prefetching, ptxas moved its loads below the math and it ran 5-10%
    # slower on the H200)
    local = re.compile(r"\b(STL|LDL)\b")
    forms = {form: _functions(sass, "7ew_fastINS_7Op_geluEdiLi%sELb0ELb%sE" % (vpt, form)) for form in "01"}
    assert all(forms.values()), forms
    for form, funcs in forms.items():
        for name, ins in funcs.items():
            text = [t for _, t in ins]
            uldc = sum(1 for t in text if t.startswith("ULDC"))
            assert uldc <= most, "%s: %d ULDC" % (name, uldc)
            assert not any(local.search(t) for t in text), "%s spills to local memory" % name
            assert not any(PREFETCH_L2.search(t) for t in text), "%s prefetches" % name
            waits = [i for i, t in enumerate(text) if t.startswith("ACQBULK")]
            loads = [i for i, t in enumerate(text) if LDG128.search(t)]
            if form == "1":
                assert waits and waits[0] < loads[0], "%s: no griddepcontrol.wait before the loads" % name
            else:
                assert not waits, "%s: the plain form waits for a PDL primary" % name


def test_no_forward_auto_kernel_spills(sass):
    # every op x dtype x vectors a thread x form of the forward default path keeps its values in
    # registers (the backward ops: the test above)
    local = re.compile(r"\b(STL|LDL)\b")
    funcs = {**_functions(sass, "7ew_fastINS_"), **_functions(sass, "9ew_fast_rINS_")}
    assert len(funcs) > 500
    spilled = sorted(n for n, ins in funcs.items() if any(local.search(t) for _, t in ins))
    assert not spilled, spilled[:5]


PREFETCH_L2 = re.compile(r"^(@!?P\w+\s+)?CCTL\.E\.PF2\b")


def _assert_prefetch_before_wait(name, text):
    """The L2 prefetch of the first lines (prefetch.global.L2 = CCTL.E.PF2) comes before the PDL
    wait (griddepcontrol.wait = ACQBULK), and every global load after it."""
    pf = [i for i, t in enumerate(text) if PREFETCH_L2.search(t)]
    waits = [i for i, t in enumerate(text) if t.startswith("ACQBULK")]
    loads = [i for i, t in enumerate(text) if re.match(r"(@!?P\w+\s+)?LDG", t)]
    assert pf and waits and loads, "%s: prefetch %d, waits %d, loads %d" % (name, len(pf), len(waits), len(loads))
    assert max(pf) < waits[0] < loads[0], "%s: prefetch, wait and loads out of order" % name


@pytest.mark.parametrize("kernel", ["rmse_auto_rows_kernelIfLb1", "rmse_auto_small_kernelIfLb1",
                                    "rmse_auto_rows_kernelI6__halfLb0"])
def test_rmse_auto_prefetches_before_the_wait(sass, kernel):
    found = {n: ins for n, ins in sass[1].items() if kernel in n}
    assert found, "no kernel named like %r in the %s SASS" % (kernel, sass[0])
    for name, ins in found.items():
        _assert_prefetch_before_wait(name, [t for _, t in ins])


def test_bf16_copy_vec4_is_64_bit(sass):
    # vecN counts elements: 4 bfloat16 are 8 bytes, as in the study's simd_size
    for name, ins in _functions(sass, "copy_vec4_i32I13__nv_bfloat16E").items():
        text = [t for _, t in ins]
        assert any(re.search(r"\bLDG\.E(?:\.[A-Z0-9_]+)*\.64\b", t) for t in text), name
        assert not any(LDG128.search(t) for t in text), name


def test_restrict_gives_non_coherent_loads(sass):
    for name, ins in _functions(sass, "add_NaiveIV1U1NR").items():
        assert any(t.startswith("LDG") and ".CONSTANT" in t for _, t in ins), name
    for name, ins in _functions(sass, "add_NaiveIV1U1NC").items():
        loads = [t for _, t in ins if re.match(r"(@!?P\w+\s+)?LDG", t)]
        assert loads and not any(".CONSTANT" in t for t in loads), name


def _first_loop(ins):
    """Instructions of the first loop: from the target of the first backward branch to it."""
    for addr, text in ins:
        m = re.search(r"\bBRA(?:\.[A-Z0-9_]+)*\s+(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            return [t for a, t in ins if start <= a <= addr]
    return None


@pytest.mark.parametrize("vec", ["1", "2", "4"])
@pytest.mark.parametrize("dtype", ["IfE", "I13__nv_bfloat16E"])
def test_copy_loop_32_bit_index_is_shorter(sass, vec, dtype):
    # copy_body puts the vector loop first, so the first loop of each kernel is the one the
    # study counts (9 vs 14 instructions on sm_80/86; 7 vs 13 with nvcc 13 on sm_90).
    (n32, i32), = _functions(sass, "copy_vec%s_i32%s" % (vec, dtype)).items()
    (n64, i64), = _functions(sass, "copy_vec%s_i64%s" % (vec, dtype)).items()
    loop32, loop64 = _first_loop(i32), _first_loop(i64)
    assert loop32 and loop64, "no loop found in %s / %s" % (n32, n64)
    assert any(t.startswith("LDG") or " LDG" in t for t in loop32), "%s: first loop has no load" % n32
    assert len(loop32) < len(loop64), "%s: %d instructions per iteration, %s: %d\n%s\n%s" % (
        n32, len(loop32), n64, len(loop64), "\n".join(loop32), "\n".join(loop64))


def test_constant_bank_only_in_float64_gelus_module():
    """A module with __constant__ data (.nv.constant3) costs each launch of every kernel in it about
    0.12 us, read or not (elementwise_auto.cuh): float64 gelu's coefficients are the only such data,
    and its kernels and its gradient's (elementwise_gelu64.cu) the only ones in that module."""
    path = _extension_path()
    cuobjdump = _find_tool("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (PATH, CUDA_HOME, /usr/local/cuda, pip nvidia-cuda-cuobjdump)")
    proc = subprocess.run([cuobjdump, "--dump-elf", "--gpu-architecture", PREFERRED_ARCH, path],
                          capture_output=True, text=True)
    if proc.returncode != 0 or "Fatbin elf code" not in proc.stdout:
        pytest.skip("no %s ELF in the extension: %s" % (PREFERRED_ARCH, proc.stderr.strip()[:200]))
    modules = proc.stdout.split("Fatbin elf code:")[1:]
    with_constants = [m for m in modules if re.search(r"\s\.nv\.constant3\s", m)]
    assert len(with_constants) == 1, "%d modules have __constant__ data" % len(with_constants)
    # the code sections' names (.text.<kernel>): the symbol table's columns differ between
    # cuobjdump versions (the GPU machine's did not match FUNC GLOBAL ... ENTRY), section names do not
    entries = set(re.findall(r"\s\.text\.(_Z\w+)", with_constants[0]))
    assert entries, "no kernels found in the module with __constant__ data"
    assert all("Op_geluEd" in e or "Grad_geluEd" in e for e in entries), \
        sorted(e for e in entries if "Op_geluEd" not in e and "Grad_geluEd" not in e)[:5]
    assert any("Grad_geluEd" in e for e in entries), "float64 gelu_backward's kernels are not in that module"
