"""The C core's floors (csrc/state.h lists them): every file includes only its own header and
headers of lower floors, and calls only functions defined on lower floors, so neither the include
graph nor the call graph has a cycle.

Read from the sources: quoted #includes; the non-static functions and data each .c defines (a
small C scanner: comments, strings and preprocessor lines removed, top-level statements split at
braces); which identifiers every other file names. Where the built objects are present and newer
than their sources, `nm` gives the same graph from the linker's view (it also sees what macros
make, such as NumPy's shared API table). The last tests feed the checker broken trees in memory
(an upward include, an upward call, a cycle) and assert that it names each break.
"""
import glob
import graphlib
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")

# unit -> floor. A unit is a .c with its header (same stem); ops.def, cuda_api.h,
# ewkern_kernels.h and erfc_fit.h are the contracts with csrc/cpu and csrc/cuda (no calls, floor 0).
FLOORS = {
    "state": 0, "cuda_api": 0, "ewkern_kernels": 0, "ops.def": 0, "grads.def": 0, "erfc_fit": 0,
    "dtype": 1, "device": 1,
    "registry": 2, "stream": 2, "array": 2,
    "dlpack": 3, "listing": 3,
    "ops": 4, "rtc": 4,
    "timing": 5, "native_api": 5,
    "module": 6,
}
# files whose top comment need not name their floor (not owned by the C core's layout)
NO_FLOOR_COMMENT = {"ewkern_kernels.h", "ops.def", "grads.def"}


def unit(name):
    return name if name.endswith(".def") else os.path.splitext(name)[0]


def read_tree():
    files = {}
    for pattern in ("*.c", "*.h", "*.def"):
        for path in glob.glob(os.path.join(CSRC, pattern)):
            with open(path) as f:
                files[os.path.basename(path)] = f.read()
    return files


# ---- a small C scanner --------------------------------------------------------------------------

def strip_c(text):
    """The text without comments, string and character literals, and preprocessor lines."""
    out, i, n = [], 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            at_line_start = False
            continue
        if c == "#" and at_line_start:
            j = i
            while True:   # a directive with its continuation lines
                j = text.find("\n", j)
                if j < 0 or text[j - 1] != "\\":
                    break
                j += 1
            i = n if j < 0 else j
            continue
        if c == "\n":
            at_line_start = True
        elif not c.isspace():
            at_line_start = False
        out.append(c)
        i += 1
    return "".join(out)


def quoted_includes(text):
    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M)


def top_level_statements(code):
    """Top-level statements of stripped C code: function definitions end at their closing
    brace, everything else at a semicolon outside braces."""
    stmts, depth, start = [], 0, 0
    for i, c in enumerate(code):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                head = code[start:code.index("{", start)]
                if re.search(r"\)\s*$", head) and "=" not in head:
                    stmts.append(code[start:i + 1])
                    start = i + 1
        elif c == ";" and depth == 0:
            stmts.append(code[start:i + 1])
            start = i + 1
    return [s.strip() for s in stmts if s.strip()]


def global_definitions(code):
    """Names of the non-static functions and data a .c file defines."""
    names = set()
    for s in top_level_statements(code):
        if re.match(r"(static|typedef|extern)\b", s):
            continue
        head = s.split("{", 1)[0]
        if s.endswith("}") and "=" not in head:          # a function definition
            m = re.search(r"(\w+)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*$", head)
            if m:
                names.add(m.group(1))
            continue
        decl = s.split("=", 1)[0] if "=" in s else s.rstrip(";")
        if "(" in decl or re.match(r"(struct|enum|union)\s+\w*\s*\{", s):
            continue                                     # a prototype or a bare type
        m = re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*$", decl.strip())
        if m:
            names.add(m.group(1))
    return names


def identifiers(code):
    return set(re.findall(r"\b[A-Za-z_]\w*\b", code))


# ---- the checker --------------------------------------------------------------------------------

def include_graph(files):
    """file -> the csrc files it includes (quoted includes that name a file of the tree)."""
    return {name: [inc for inc in quoted_includes(text) if inc in files] for name, text in files.items()}


def call_edges(files):
    """(user unit, definer unit, symbol) for every global symbol of one unit that another names."""
    code = {name: strip_c(text) for name, text in files.items()}
    definer = {}
    for name in files:
        if name.endswith(".c"):
            for sym in global_definitions(code[name]):
                definer[sym] = unit(name)
    edges = set()
    for name in files:
        u = unit(name)
        for sym in identifiers(code[name]) & definer.keys():
            if definer[sym] != u:
                edges.add((u, definer[sym], sym))
    return edges


def find_cycle(graph):
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def layering_errors(files, floors=FLOORS):
    errors = []
    for name in sorted(files):
        if unit(name) not in floors:
            errors.append(f"{name}: not in the floor table (give it a floor in tests/test_layering.py)")
    if errors:
        return errors
    incs = include_graph(files)
    for name, targets in sorted(incs.items()):
        for inc in targets:
            if unit(inc) != unit(name) and floors[unit(inc)] >= floors[unit(name)]:
                errors.append(f"{name} (floor {floors[unit(name)]}) includes {inc} "
                              f"(floor {floors[unit(inc)]}): only lower floors may be included")
    cycle = find_cycle({name: set(t) for name, t in incs.items()})
    if cycle:
        errors.append("include cycle: " + " -> ".join(cycle))
    edges = call_edges(files)
    for user, target, sym in sorted(edges):
        if floors[target] >= floors[user]:
            errors.append(f"{user} (floor {floors[user]}) uses {sym} of {target} (floor {floors[target]}): "
                          "only lower floors may be called")
    graph = {}
    for user, target, _ in edges:
        graph.setdefault(user, set()).add(target)
    cycle = find_cycle(graph)
    if cycle:
        errors.append("call cycle: " + " -> ".join(cycle))
    # a call is visible in the include graph: the user reaches the definer's header
    closure = {}

    def reach(name):
        if name not in closure:
            closure[name] = set()
            for inc in incs.get(name, ()):
                closure[name] |= {inc} | reach(inc)
        return closure[name]

    for user, target, sym in sorted(edges):
        users = [n for n in files if unit(n) == user]
        header = target + ".h"
        if header in files and not any(header in reach(n) or n == header for n in users):
            errors.append(f"{user} uses {sym} of {target} without including {header}")
    return errors


def floor_comment_errors(files, floors=FLOORS):
    errors = []
    for name, text in sorted(files.items()):
        m = re.match(r"\s*/\*(.*?)\*/", text, re.S)
        said = re.search(r"\bfloor (\d+)", m.group(1), re.I) if m else None
        if said is None:
            if name not in NO_FLOOR_COMMENT:
                errors.append(f"{name}: the top comment does not say its floor ('floor N')")
        elif int(said.group(1)) != floors.get(unit(name)):
            errors.append(f"{name}: the top comment says floor {said.group(1)}, the table {floors.get(unit(name))}")
    return errors


# ---- the tree as it is ----------------------------------------------------------------------------

def test_every_file_sits_on_its_floor():
    assert layering_errors(read_tree()) == []


def test_top_comments_name_the_floors():
    assert floor_comment_errors(read_tree()) == []


def test_each_c_file_includes_its_own_header_first():
    files = read_tree()
    for name, text in files.items():
        if name.endswith(".c") and name != "module.c":
            incs = quoted_includes(text)
            assert incs and incs[0] == unit(name) + ".h", f"{name} includes {incs[:1]} first"


def test_every_global_is_declared_in_its_units_header():
    """What a floor offers is its header: a global function of x.c is declared in x.h."""
    files = read_tree()
    for name, text in files.items():
        if not name.endswith(".c") or name == "module.c":
            continue
        header = strip_c(files.get(unit(name) + ".h", ""))
        missing = sorted(s for s in global_definitions(strip_c(text)) if not re.search(rf"\b{s}\b", header))
        assert missing == [], f"{name} defines {missing} without declaring them in {unit(name)}.h"


def test_the_scanner_sees_the_core():
    """The checks above pass on what the scanner found: make sure it found the real graph."""
    files = read_tree()
    defs = {name: global_definitions(strip_c(t)) for name, t in files.items() if name.endswith(".c")}
    assert {"ew_get_state", "ew_state_from_type", "ew_current_stream"} <= defs["state.c"]
    assert {"ew_device_enter", "ew_device_exit", "ew_raise_cuda"} <= defs["device.c"]
    assert {"ew_address_limit", "ew_dtype_name"} <= defs["dtype.c"]
    assert {"ew_ops", "ew_nops", "ew_find_kernel"} <= defs["registry.c"]
    assert {"ew_array_spec", "ew_release_managed"} <= defs["array.c"]
    assert "PyInit__C" in defs["module.c"]
    assert not any(s.startswith(("m_", "stream_", "array_")) for d in defs.values() for s in d)
    edges = {(u, t) for u, t, _ in call_edges(files)}
    assert {("array", "state"), ("dlpack", "array"), ("ops", "dlpack"), ("timing", "ops"),
            ("module", "timing"), ("registry", "dtype")} <= edges
    used = {u for u, _ in edges} | {t for _, t in edges}
    assert used >= {u for u in FLOORS if u not in ("cuda_api", "ewkern_kernels", "ops.def", "grads.def", "erfc_fit")}


def built_objects():
    objs = {}
    for path in glob.glob(os.path.join(ROOT, "build", "temp*", "csrc", "*.o")):
        src = os.path.join(CSRC, os.path.basename(path)[:-2] + ".c")
        if os.path.exists(src):
            objs[unit(os.path.basename(src))] = path
    return objs


def test_linked_symbols_follow_the_floors():
    """The same rule from the objects' symbol tables (nm): what each object leaves undefined
    and another one of csrc/ defines."""
    objs = built_objects()
    sources = {u for u in FLOORS if os.path.exists(os.path.join(CSRC, u + ".c"))}
    if shutil.which("nm") is None or set(objs) != sources:
        pytest.skip("no complete set of built objects under build/temp*/csrc (build in place first)")
    stale = [u for u, o in objs.items() if os.path.getmtime(o) < os.path.getmtime(os.path.join(CSRC, u + ".c"))]
    if stale:
        pytest.skip(f"built objects older than their sources: {sorted(stale)}")
    defined, undefined = {}, {}
    for u, path in objs.items():
        out = subprocess.run(["nm", "-g", path], capture_output=True, text=True, check=True).stdout
        undefined[u] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                undefined[u].add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRCV":
                defined[parts[2]] = u
    errors, graph = [], {}
    for u, syms in undefined.items():
        for sym in syms & defined.keys():
            t = defined[sym]
            graph.setdefault(u, set()).add(t)
            if FLOORS[t] >= FLOORS[u]:
                errors.append(f"{u}.o (floor {FLOORS[u]}) needs {sym} from {t}.o (floor {FLOORS[t]})")
    assert errors == []
    assert find_cycle(graph) is None
    assert "ewkern_ARRAY_API" in {s for syms in undefined.values() for s in syms}   # the scan saw NumPy's table
    assert defined.get("ewkern_ARRAY_API") == "dtype"


# ---- the checker fails on broken trees ------------------------------------------------------------

def with_line(files, name, line, after=None):
    broken = dict(files)
    text = broken[name]
    if after is None:
        broken[name] = line + "\n" + text
    else:
        assert after in text
        broken[name] = text.replace(after, after + "\n" + line, 1)
    return broken


def test_an_upward_include_is_named():
    files = read_tree()
    broken = with_line(files, "state.c", '#include "ops.h"', after='#include "state.h"')
    errors = layering_errors(broken)
    assert any("state.c (floor 0) includes ops.h (floor 4)" in e for e in errors), errors


def test_an_include_between_siblings_is_named():
    files = read_tree()
    broken = with_line(files, "array.h", '#include "registry.h"', after='#include "state.h"')
    errors = layering_errors(broken)
    assert any("array.h (floor 2) includes registry.h (floor 2)" in e for e in errors), errors


def test_an_include_cycle_is_named():
    files = read_tree()
    broken = with_line(files, "state.h", '#include "dtype.h"', after="#define EWKERN_STATE_H")
    errors = layering_errors(broken)
    assert any(e.startswith("include cycle:") and "state.h" in e and "dtype.h" in e for e in errors), errors


def test_an_upward_call_and_its_cycle_are_named():
    files = read_tree()
    # array.c (floor 2) calling the view release of dlpack.c (floor 3), as it once did
    broken = with_line(files, "array.c", "static void reach_up(ew_view *v) { ew_view_release(v); }",
                       after='#include "cuda_api.h"')
    errors = layering_errors(broken)
    assert any("array (floor 2) uses ew_view_release of dlpack (floor 3)" in e for e in errors), errors
    assert any(e.startswith("call cycle:") and "array" in e and "dlpack" in e for e in errors), errors
    assert any("array uses ew_view_release of dlpack without including dlpack.h" in e for e in errors), errors


def test_a_new_file_needs_a_floor():
    files = dict(read_tree())
    files["cache.c"] = '/*\n * cache.c: floor 1.\n */\n#include "state.h"\nint ew_cache_size(void) { return 0; }\n'
    assert layering_errors(files) == ["cache.c: not in the floor table (give it a floor in tests/test_layering.py)"]


def test_a_wrong_floor_comment_is_named():
    files = read_tree()
    broken = dict(files)
    broken["timing.h"] = files["timing.h"].replace("floor 5", "floor 2", 1)
    assert floor_comment_errors(broken) == ["timing.h: the top comment says floor 2, the table 5"]


def test_the_scanner_reads_definitions_and_skips_the_rest():
    code = strip_c(
        '#define X(a) \\\n  int not_me(void) { return a; }\n'
        'static int hidden(void) { return "}{"[0]; }\n'
        'const int table[] = {1, 2};\n'
        'PyType_Spec spec = {.name = "a;b"};\n'
        'typedef struct s { int a; } s;\n'
        'int proto(int);\n'
        '/* int commented(void) { } */\n'
        'PyObject *entry(PyObject *m, int (*cb)(int))\n{\n    if (1) { }\n    return 0;\n}\n'
        'extern int elsewhere;\n')
    assert global_definitions(code) == {"table", "spec", "entry"}
