"""scripts/speed_probe.py's source variants of the run-time kernels still find their anchors in
the generated source (a probe whose variant silently equals the base would waste a GPU run), and
each variant compiles to PTX that ptxas accepts where the toolkit is here."""
import os
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ewkern.rtc import _codegen  # noqa: E402
from test_rtc import _layout, _nvrtc  # noqa: E402


@pytest.fixture
def rows_variants(monkeypatch):
    import speed_probe
    monkeypatch.setattr(_codegen, "reduction_rows_source", _codegen.reduction_rows_source)
    speed_probe._rows_source_variants()
    return _codegen.reduction_rows_source


def _mse_rows(gen, variant, dtype="float16", blocks=0):
    lay = _layout("contig", 1, [("T a", dtype, "array", 0), ("T b", dtype, "array", 0)])
    out = _layout("strided", 1, [("T y_out", dtype, "array", 0)])
    return gen("probe_mse_" + variant, lay, out, 8, "((float)a - (float)b) * ((float)a - (float)b)", "a + b",
               "y_out = a", "0", "float", "", _codegen.typedefs((("T", dtype),), [], [], [], []), False, True,
               blocks)


def test_rows_variants_change_the_rows_entry_only(rows_variants):
    base, entries = _mse_rows(rows_variants, "base")
    lb4, _ = _mse_rows(rows_variants, "lb4")
    lb0, _ = _mse_rows(rows_variants, "lb0", blocks=4)
    bulk, _ = _mse_rows(rows_variants, "bulk")
    assert "__launch_bounds__(256) ewrtc_probe_mse_base_rows" in base
    assert "__launch_bounds__(256, 4) ewrtc_probe_mse_lb4_rows" in lb4
    assert "__launch_bounds__(256) ewrtc_probe_mse_lb0_rows" in lb0      # the host's bound taken off
    assert "__launch_bounds__(256) ewrtc_probe_mse_lb4_comb" in lb4        # the combine entry as it was
    assert "cp.async.bulk.prefetch" not in base
    assert bulk.count("cp.async.bulk.prefetch.L2.global") == 2             # one per input array
    rows_part = bulk[bulk.index("ewrtc_probe_mse_bulk_rows"):bulk.index("ewrtc_probe_mse_bulk_comb")]
    assert rows_part.index("cp.async.bulk") < rows_part.index("pdl_wait();")
    cv, _ = _mse_rows(rows_variants, "cv100")   # a launch attribute only: base's source
    assert cv.replace("probe_mse_cv100", "probe_mse_base") == base
    with pytest.raises(ValueError, match="rows variant"):
        _mse_rows(rows_variants, "nope")


def test_rows_variants_compile(rows_variants):
    _nvrtc()
    from ewkern.rtc import _build
    for v in ("base", "lb4", "bulk"):
        src, entries = _mse_rows(rows_variants, v)
        ptx, _, _ = _build.compile_cuda("probe_mse_" + v, src, (9, 0), ptx_only=True)
        assert all((".entry " + e).encode() in ptx for e in entries)


def test_layout_probe_kernels_compile():
    """scripts/layout_probe.py's kernels (CuPy compiles them on the GPU machine) pass NVRTC for sm_90."""
    _nvrtc()
    import layout_probe
    from ewkern.rtc import _build
    ptx, _, _ = _build.compile_cuda("layout_probe", layout_probe.SOURCE, (9, 0), ptx_only=True)
    assert all((".entry " + name).encode() in ptx for name, _, _ in layout_probe.WAYS.values())


def test_ab_peers_prepare_lays_out_the_base_files(tmp_path):
    """scripts/ab-peers.sh prepare BASE writes, under ab-base/, each file of csrc/ and setup.py that
    differs from BASE as BASE has it (and names the files BASE lacks), which the device's copy of
    the tree (no .git) needs to build the base; run refuses clearly without it."""
    import shutil
    import subprocess
    if not shutil.which("git"):
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "csrc" / "cuda").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "ab-peers.sh"), repo / "scripts" / "ab-peers.sh")
    (repo / "csrc" / "cuda" / "k.cuh").write_text("old kernel\n")
    (repo / "setup.py").write_text("# setup\n")
    (repo / "README.md").write_text("docs\n")

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    (repo / "csrc" / "cuda" / "k.cuh").write_text("new kernel\n")
    (repo / "csrc" / "cuda" / "added.cuh").write_text("only in the change\n")
    (repo / "README.md").write_text("changed docs\n")
    git("add", "-A")
    run = subprocess.run(["bash", "scripts/ab-peers.sh", "run"], cwd=repo, capture_output=True, text=True)
    assert run.returncode == 2 and "ab-base/ is missing" in run.stdout
    prep = subprocess.run(["bash", "scripts/ab-peers.sh", "prepare", "HEAD"], cwd=repo, capture_output=True,
                          text=True)
    assert prep.returncode == 0, prep.stderr
    base = repo / "ab-base"
    assert (base / "csrc" / "cuda" / "k.cuh").read_text() == "old kernel\n"
    assert not (base / "csrc" / "cuda" / "added.cuh").exists()
    assert (base / ".absent").read_text().split() == ["csrc/cuda/added.cuh"]
    assert not (base / "README.md").exists() and not (base / "setup.py").exists()
    assert len((base / ".commit").read_text().strip()) >= 7


def test_prebuilt_unpack_writes_the_extension_and_the_stamp_gpu_check_reads(tmp_path):
    """scripts/prebuilt.sh unpack COMMIT (on the GPU machine) writes the carried extension and the
    stamp scripts/build-stamp.sh gives this tree for COMMIT, the stamp gpu-check.sh compares before
    it builds; a different commit label gives another stamp; no arguments print the usage and fail."""
    import lzma
    import shutil
    import subprocess
    if not (shutil.which("sha1sum") and shutil.which("python3")):
        pytest.skip("needs sha1sum and python3")
    repo = tmp_path / "repo"
    for d in ("scripts", "csrc/cpu", "csrc/cuda", "ewkern", "probe-out"):
        (repo / d).mkdir(parents=True)
    for name in ("prebuilt.sh", "build-stamp.sh"):
        shutil.copy(os.path.join(ROOT, "scripts", name), repo / "scripts" / name)
    (repo / "setup.py").write_text("# setup\n")
    (repo / "csrc" / "a.c").write_text("int a;\n")
    (repo / "csrc" / "a.h").write_text("int a;\n")
    (repo / "csrc" / "x.def").write_text("X\n")
    (repo / "csrc" / "cpu" / "b.c").write_text("int b;\n")
    (repo / "csrc" / "cuda" / "k.cu").write_text("// kernel\n")
    with lzma.open(repo / "probe-out" / "c312.so.xz", "wb") as f:
        f.write(b"\x7fELF built elsewhere")
    usage = subprocess.run(["bash", "scripts/prebuilt.sh"], cwd=repo, capture_output=True, text=True)
    assert usage.returncode == 2 and "prepare" in usage.stdout and "unpack COMMIT" in usage.stdout
    r = subprocess.run(["bash", "scripts/prebuilt.sh", "unpack", "abc1234"], cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (repo / "ewkern" / "_C.cpython-312-x86_64-linux-gnu.so").read_bytes() == b"\x7fELF built elsewhere"

    def stamp(commit):
        return subprocess.run(["bash", "scripts/build-stamp.sh", "90", commit], cwd=repo, capture_output=True,
                              text=True, check=True).stdout.strip()
    got = (repo / "ewkern" / ".gpu-check-stamp").read_text().strip()
    assert len(got) == 16 and got == stamp("abc1234") and got != stamp("abc1235")
    (repo / "csrc" / "cuda" / "NOTES.md").write_text("measured\n")     # notes beside the sources: no rebuild
    assert stamp("abc1234") == got
    (repo / "csrc" / "cuda" / "k.cu").write_text("// another kernel\n")
    assert stamp("abc1234") != got


def test_gpu_check_unpacks_a_carried_extension_of_this_tree_instead_of_building(tmp_path):
    """On a GPU machine without this tree's build (a fresh one: a warm machine is given back after
    30 s idle), gpu-check.sh unpacks probe-out/c312.so.xz when probe-out/c312.stamp (written by
    prebuilt.sh prepare) is the stamp of these sources, and builds when it is not."""
    import lzma
    import shutil
    import subprocess
    if not shutil.which("sha1sum"):
        pytest.skip("needs sha1sum")
    repo = tmp_path / "repo"
    for d in ("scripts", "csrc/cpu", "csrc/cuda", "ewkern", "probe-out", "bin"):
        (repo / d).mkdir(parents=True)
    for name in ("gpu-check.sh", "prebuilt.sh", "build-stamp.sh"):
        shutil.copy(os.path.join(ROOT, "scripts", name), repo / "scripts" / name)
    (repo / "setup.py").write_text("import sys\nprint('setup.py ran')\nsys.exit(1)\n")
    (repo / "csrc" / "a.c").write_text("int a;\n")
    (repo / "csrc" / "cuda" / "k.cu").write_text("// kernel\n")
    with lzma.open(repo / "probe-out" / "c312.so.xz", "wb") as f:
        f.write(b"\x7fELF built elsewhere")
    # python3 here answers the version test as 3.12 (the GPU machine's) and runs the rest
    fake = repo / "bin" / "python3"
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *version_info*) exit 0;; esac\nexec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{repo / 'bin'}:{os.environ['PATH']}", GPU_CHECK_TESTS="none",
               EWKERN_GIT_COMMIT="abc1234", EWKERN_CUDA_ARCHS="90", OUT=str(tmp_path / "out"))
    env.pop("GPU_CHECK_REBUILD", None)

    def check():
        return subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=repo, capture_output=True, text=True, env=env)
    stamp = subprocess.run(["bash", "scripts/build-stamp.sh", "90", "prebuilt"], cwd=repo, capture_output=True,
                           text=True, check=True).stdout
    (repo / "probe-out" / "c312.stamp").write_text(stamp)
    r = check()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "carried extension of this tree, unpacked" in r.stdout and "already here" in r.stdout
    assert (repo / "ewkern" / "_C.cpython-312-x86_64-linux-gnu.so").read_bytes() == b"\x7fELF built elsewhere"
    # the sources changed since prepare: no unpack, a build (this setup.py fails, and so the check)
    (repo / "ewkern" / ".gpu-check-stamp").unlink()
    (repo / "csrc" / "cuda" / "k.cu").write_text("// another kernel\n")
    r = check()
    assert "unpacked" not in r.stdout and "== build (archs 90)" in r.stdout and r.returncode != 0


@pytest.fixture
def ts_variants(monkeypatch):
    """scripts/rows_graph_probe.py's ts<N> variants over speed_probe.py's (as its harness mode
    installs them), recording into a CPU buffer (only the address goes into the source)."""
    import rows_graph_probe
    import speed_probe
    import torch
    monkeypatch.setattr(_codegen, "reduction_rows_source", _codegen.reduction_rows_source)
    original = _codegen.reduction_rows_source
    speed_probe._rows_source_variants()
    rows_graph_probe._ts_variants(original)
    buf = torch.zeros(16, dtype=torch.int64)
    monkeypatch.setitem(rows_graph_probe._REC, "t", buf)
    return _codegen.reduction_rows_source, buf


def test_rows_graph_probe_ts_variant_times_each_block(ts_variants):
    """ts5: the rows entry under __launch_bounds__(256, 5) with the globaltimer read at entry, right
    after pdl_wait and at every exit (a destructor), written to the buffer's address; the combine
    entry unchanged; other names still go to speed_probe.py's variants; the source compiles."""
    gen, buf = ts_variants
    src, entries = _mse_rows(gen, "ts5", dtype="float32")
    rows = src[src.index("ewrtc_probe_mse_ts5_rows("):src.index("ewrtc_probe_mse_ts5_comb")]
    assert "__launch_bounds__(256, 5) ewrtc_probe_mse_ts5_rows" in src
    assert rows.count("%%globaltimer") == 3 and f"{buf.data_ptr()}ULL" in rows
    assert rows.index("pdl_wait();") < rows.index("=l\"(_ewrec.tw)") < rows.index("pdl_launch_dependents();")
    assert "globaltimer" not in src[src.index("ewrtc_probe_mse_ts5_comb"):]
    lb5, _ = _mse_rows(gen, "lb5", dtype="float32")
    assert "__launch_bounds__(256, 5) ewrtc_probe_mse_lb5_rows" in lb5 and "globaltimer" not in lb5
    with pytest.raises(ValueError, match="rows variant"):
        _mse_rows(gen, "nope")
    _nvrtc()
    from ewkern.rtc import _build
    ptx, _, _ = _build.compile_cuda("probe_mse_ts5", src, (9, 0), ptx_only=True)
    assert all((".entry " + e).encode() in ptx for e in entries) and b"%globaltimer" in ptx


def test_rows_graph_probe_timeline_reads_back_to_back_kernels(capsys):
    """The timeline of recorded blocks: kernels grouped by input address and time, each set against
    the one before it; a kernel launched long after the previous one (a single launch) left out."""
    import rows_graph_probe
    import torch
    recs = []
    for j in range(4):               # four kernels back to back, 8 blocks each on 2 SMs
        for b in range(8):
            recs.append([3000 * j + 10 * b, 3000 * j + 800 + 10 * b, 3000 * j + 2800 + 20 * b, ((b // 4) << 32) | b,
                         100 + j, 0, 0, 0])
    for b in range(8):               # then one far later
        recs.append([100000 + b, 100500, 102000, b << 32, 100, 0, 0, 0])
    rec = torch.zeros(8 + 8 * len(recs), dtype=torch.int64)
    rec[0] = len(recs)
    rec[8:] = torch.tensor(recs, dtype=torch.int64).flatten()
    rows_graph_probe._timeline(rec)
    out = capsys.readouterr().out
    assert "timeline (3 kernels, ns)" in out
    for part in ("entry after previous entry 3000", "release after previous exit 860", "release to last exit 2140",
                 "last exit after previous last exit 3000", "block from release median 2035 max 2070",
                 "busiest SM 4 blocks on 2 SMs", "last release after first 70"):
        assert part in out, (part, out)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_variants_hint_every_register_load_and_compile(monkeypatch, dtype):
    """speed_probe's rownorm variants ldcs / ldnc / ldlu rewrite every load of the row's register
    forms (ewrtc::hold, a plain read where the vector is held as loaded) to the hinted load, and
    tpc4 / nocs still change the source; each compiles to PTX with its hint."""
    _nvrtc()
    import speed_probe
    from ewkern.rtc import _build
    from ewkern.rtc._params import parse_params
    monkeypatch.setattr(_codegen, "row_source", _codegen.row_source)
    speed_probe._row_source_variants()
    ps = parse_params("T x, float32 eps", False, "k") + parse_params("T y", True, "k")
    lay = _codegen.Layout("contig", 1, [(ps[0], dtype, "array", 0), (ps[1], "float32", "scalar", 0),
                                        (ps[2], dtype, "array", 0)])
    tdefs = _codegen.typedefs((("T", dtype),), ps[:2], [dtype, "float32"], ps[2:], [dtype])

    def gen(variant):
        return _codegen.row_source("cuda", f"probe_rmsnorm_{variant}", lay, 16 // (4 if dtype == "float32" else 2),
                                   "(float)x * (float)x", "a + b", "y = x * rsqrt(a * 0.001f + eps)", "0", "float", "",
                                   tdefs, set())
    base, _ = gen("base")
    loads = base.count("ewrtc::hold(_u_")
    assert loads > 0
    for v in ("tpc4", "nocs"):
        assert gen(v)[0].replace(f"probe_rmsnorm_{v}", "probe_rmsnorm_base") != base, v
    for hint in ("cs", "nc", "lu"):
        src, entries = gen("ld" + hint)
        assert "ewrtc::hold(_u_" not in src and src.count("ewrtc::holdh(_u_") == loads, hint
        ptx, _, _ = _build.compile_cuda("probe_rmsnorm_ld" + hint, src, (9, 0), ptx_only=True)
        text = ptx.decode(errors="replace")
        assert all(f".entry {e}" in text for e in entries)
        assert f"ld.global.{hint}.v4.u32" in text, hint
