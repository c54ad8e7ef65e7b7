"""The layout of the CUDA kernel files (csrc/cuda): one file per reference study, the default path apart.

Checked from the sources (no build needed):
  * each kernel file includes only its family's headers: the studies never reach the default path's op
    math or kernel templates (elementwise_ops.cuh, elementwise_kernel.cuh), the elementwise and rmse
    families never include each other's headers, and no file includes a .cu;
  * elementwise_kernel.cuh, elementwise_ops.cuh and elementwise_types.cuh hold device code only (no
    host-only header, no getenv, std::atomic or stream), so another file or a run-time compiler can use them;
  * each kernel file exports one table, ew_cuda_<file>_table, declared once in ewkern_kernels.h and
    joined once in registry.c (the studies before the default paths), and no other CUDA table is named.
With a CUDA build (no GPU needed): the extension exports exactly those tables, the registry holds every
row of every table, and the version map at the top of each file names that file's variants.
"""
import ctypes
import glob
import itertools
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
CUDA = os.path.join(CSRC, "cuda")

# kernel file -> (headers of the project it may include, its family, a reference study or the default)
FILES = {
    "add_kernel_experiments.cu": ({"ewkern_kernels.h", "elementwise_common.cuh"}, "elementwise", "study"),
    "cuda_vectorization_f16x8.cu": ({"ewkern_kernels.h", "elementwise_common.cuh"}, "elementwise", "study"),
    "elementwise_ops_on_gpus.cu": ({"ewkern_kernels.h", "elementwise_common.cuh", "elementwise_auto.cuh"},
                                   "elementwise", "study"),
    "elementwise_auto.cu": ({"ewkern_kernels.h", "device_cache.cuh", "pdl.cuh", "ops.def", "elementwise_common.cuh", "elementwise_launch.cuh",
                             "elementwise_ops.cuh", "elementwise_kernel.cuh", "elementwise_auto.cuh", "elementwise_run.cuh"},
                            "elementwise", "default"),
    "batched_rmse_kernel_analysis.cu": ({"ewkern_kernels.h", "device_cache.cuh", "rmse_common.cuh"}, "rmse", "study"),
    "rmse_auto.cu": ({"ewkern_kernels.h", "device_cache.cuh", "pdl.cuh", "rmse_common.cuh"}, "rmse", "default"),
    "elementwise_backward.cu": ({"ewkern_kernels.h", "device_cache.cuh", "pdl.cuh", "grads.def", "elementwise_common.cuh",
                                 "elementwise_grads.cuh", "elementwise_kernel.cuh", "elementwise_launch.cuh",
                                 "elementwise_grad_run.cuh", "elementwise_auto.cuh"},
                                "elementwise", "default"),
}
NOT_KERNEL_FILES = {"runtime.cu"}  # the CUDA runtime calls of the host code: no table
# kernel files without a table of their own, whose kernels are rows of another file's table:
# file -> (headers, family, kind, the file whose table holds the rows). float64 gelu's __constant__
# coefficients would cost every kernel of a shared module a launch-time toll (elementwise_auto.cuh);
# its gelu_backward row sits in elementwise_backward.cu's table.
PART_FILES = {
    "elementwise_gelu64.cu": ({"ewkern_kernels.h", "elementwise_run.cuh", "elementwise_grad_run.cuh"}, "elementwise",
                              "default", "elementwise_auto.cu"),
}
DEFAULT_PATH_MATH = {"elementwise_ops.cuh", "elementwise_kernel.cuh"}
DEVICE_ONLY = ("elementwise_kernel.cuh", "elementwise_ops.cuh", "elementwise_types.cuh", "elementwise_grads.cuh")
HOST_ONLY_HEADERS = {"atomic", "cstdlib", "stdlib.h", "device_cache.cuh", "elementwise_common.cuh",
                     "elementwise_auto.cuh", "elementwise_run.cuh", "elementwise_grad_run.cuh", "rmse_common.cuh"}

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _code(text):
    """text without its comments (so that a comment naming a file or function is not code)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _includes(name):
    return [os.path.basename(i) for i in _INCLUDE.findall(_code(_read(_locate(name))))]


def _locate(name):
    for folder in (CUDA, CSRC):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def _reach(name, seen=None):
    """The project headers that name includes, directly or through other project headers."""
    seen = set() if seen is None else seen
    for inc in _includes(name):
        if inc not in seen:
            seen.add(inc)
            if _locate(inc):
                _reach(inc, seen)
    return seen


def _table_name(cu):
    return "ew_cuda_%s_table" % cu[:-3]


def test_every_cu_file_is_known():
    found = {os.path.basename(p) for p in glob.glob(os.path.join(CUDA, "*.cu"))}
    assert found - NOT_KERNEL_FILES == set(FILES) | set(PART_FILES), \
        "kernel files changed: add them to FILES (or PART_FILES) with their headers"
    assert all(owner in FILES for *_, owner in PART_FILES.values())


@pytest.mark.parametrize("cu", sorted(FILES) + sorted(PART_FILES))
def test_includes_only_its_family(cu):
    allowed, family, kind = FILES[cu] if cu in FILES else PART_FILES[cu][:3]
    incs = _includes(cu)
    assert not [i for i in incs if i.endswith(".cu")], "%s includes a .cu file" % cu
    project = {i for i in incs if _locate(i)}
    assert project <= allowed, "%s includes %s, not among its family's headers" % (cu, sorted(project - allowed))
    reached = _reach(cu)
    other = "rmse_" if family == "elementwise" else "elementwise_"
    assert not [h for h in reached if h.startswith(other)], "%s reaches the other family: %s" % (cu, sorted(reached))
    if kind == "study":
        assert not reached & DEFAULT_PATH_MATH, "study %s reaches the default path's %s" % (
            cu, sorted(reached & DEFAULT_PATH_MATH))


def test_constant_memory_only_where_gelu64_is_made():
    """__constant__ data costs every kernel of its module time at each launch (elementwise_auto.cuh):
    outside the EWK_GELU64_HERE blocks, which only elementwise_gelu64.cu opens, no source has any."""
    for p in glob.glob(os.path.join(CUDA, "*.cu")) + glob.glob(os.path.join(CUDA, "*.cuh")):
        code = _code(_read(p))
        outside = re.sub(r"#\s*ifdef\s+EWK_GELU64_HERE\b.*?#\s*endif", " ", code, flags=re.S)
        assert "__constant__" not in outside, "%s has __constant__ data" % os.path.basename(p)
        if re.search(r"#\s*define\s+EWK_GELU64_HERE\b", code):
            assert os.path.basename(p) == "elementwise_gelu64.cu", "%s defines EWK_GELU64_HERE" % p


def test_no_cu_includes_a_cu():
    for p in glob.glob(os.path.join(CUDA, "*.cu")) + glob.glob(os.path.join(CUDA, "*.cuh")):
        bad = [i for i in _includes(os.path.basename(p)) if i.endswith(".cu")]
        assert not bad, "%s includes %s" % (os.path.basename(p), bad)


@pytest.mark.parametrize("header", DEVICE_ONLY)
def test_device_headers_hold_no_host_code(header):
    reached = _reach(header)
    assert not reached & HOST_ONLY_HEADERS, "%s reaches host-only %s" % (header, sorted(reached & HOST_ONLY_HEADERS))
    code = _code(_read(_locate(header)))
    for word in ("getenv", "std::atomic", "cudaStream_t", "cudaLaunch", "<<<"):
        assert word not in code, "%s uses %s (host code)" % (header, word)


def test_each_file_exports_its_table_once():
    for cu in FILES:
        code = _code(_read(os.path.join(CUDA, cu)))
        defs = re.findall(r'extern\s+"C"\s+const\s+ew_kernel\s*\*\s*(ew_cuda_\w+_table)\s*\(', code)
        assert defs == [_table_name(cu)], "%s defines %s, expected one %s" % (cu, defs, _table_name(cu))
    for cu in PART_FILES:
        code = _code(_read(os.path.join(CUDA, cu)))
        assert not re.search(r"\bew_cuda_\w+_table\b", code), "%s names a table; its rows are %s's" % (
            cu, PART_FILES[cu][3])
    header = _code(_read(os.path.join(CSRC, "ewkern_kernels.h")))
    declared = re.findall(r"\b(ew_cuda_\w+_table)\s*\(", header)
    assert sorted(declared) == sorted(_table_name(cu) for cu in FILES), "ewkern_kernels.h declares %s" % declared


def test_registry_joins_every_table_once_studies_first():
    code = _code(_read(os.path.join(CSRC, "registry.c")))
    named = re.findall(r"\b(ew_cuda_\w+_table)\b", code)
    assert sorted(named) == sorted(_table_name(cu) for cu in FILES), "registry.c names %s" % named
    kinds = [FILES[n[len("ew_cuda_"):-len("_table")] + ".cu"][2] for n in named]
    assert kinds == sorted(kinds, key=lambda k: k != "study"), "registry.c joins a default before a study: %s" % named


# --- with a CUDA build ----------------------------------------------------------------------------

class _Row(ctypes.Structure):
    _fields_ = [("op", ctypes.c_char_p), ("variant", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("launch", ctypes.c_void_p), ("kernel", ctypes.c_void_p), ("flags", ctypes.c_uint),
                ("about", ctypes.c_char_p)]


@pytest.fixture(scope="module")
def tables():
    """{file: [(op, variant, dtype index), ...]} read from the built extension's table functions."""
    try:
        import ewkern
        import ewkern._C as C
    except Exception as exc:
        pytest.skip("ewkern is not importable: %s" % exc)
    if not ewkern._C.build_info()["cuda"]:
        pytest.skip("ewkern was built without CUDA")
    lib = ctypes.CDLL(C.__file__)
    out = {}
    for cu in FILES:
        fn = getattr(lib, _table_name(cu))
        fn.restype = ctypes.POINTER(_Row)
        fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
        n = ctypes.c_int(0)
        rows = fn(ctypes.byref(n))
        out[cu] = [(rows[i].op.decode(), rows[i].variant.decode(), rows[i].dtype) for i in range(n.value)]
        assert out[cu], "%s's table is empty" % cu
    for old in ("ew_cuda_elementwise_table", "ew_cuda_rmse_table"):
        assert not hasattr(lib, old), "the extension still exports %s" % old
    return out


def test_registry_holds_every_row(tables):
    import ewkern

    dtypes = ["float32", "float16", "bfloat16", "float64"]
    ops = [o["name"] for o in ewkern.ops()]
    registered = set()
    for op in ops:
        for d, dt in enumerate(dtypes):
            registered |= {(op, v, d) for v in ewkern.variants(op, dtype=dt, device="cuda")}
    rows = [r for rs in tables.values() for r in rs]
    assert len(rows) == len(set(rows)), "a (op, variant, dtype) row is in two tables"
    assert registered == set(rows), "registry and tables differ: %d rows only in the tables" % len(
        set(rows) - registered)


def _expand(name):
    """"vec{1,2,4}_i{32,64}" -> every combination."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _version_map(cu):
    """The quoted names of the file's opening comment: (names, ranges "A" ... "B")."""
    text = _read(os.path.join(CUDA, cu))
    head = text[text.index("/*"):text.index("*/")]
    head = re.sub(r"\n\s*\*", " ", head)
    ranges = re.findall(r'"([^"]+)"\s*\.\.\.\s*"([^"]+)"', head)
    names = [n for q in re.findall(r'"([^"]+)"', head) for n in _expand(q)]
    return names, ranges


@pytest.mark.parametrize("cu", sorted(FILES))
def test_version_map_names_the_files_variants(cu, tables):
    order = list(dict.fromkeys(v for _, v, _ in tables[cu]))
    names, ranges = _version_map(cu)
    unknown = sorted(set(names) - set(order))
    assert not unknown, "%s's version map names %s, which its table lacks" % (cu, unknown)
    covered = set(names)
    for lo, hi in ranges:
        covered |= set(order[order.index(lo):order.index(hi) + 1])
    missing = [v for v in order if v not in covered]
    assert not missing, "%s's version map does not name %s" % (cu, missing)
