"""The suite's own rule for running beside itself: scripts/gpu-check.sh runs the tests in several
processes that share one GPU, then the tests marked `serial` alone. A test that sizes itself by
the device's free memory (torch.cuda.mem_get_info: 2^31-element arrays, the leak check) would
skip, fail or run out of memory beside the others, so it must carry the mark."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.abspath(__file__))


def _marks(fn: ast.FunctionDef) -> set:
    """The names of the pytest.mark.NAME decorators of a test function."""
    names = set()
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "mark":
            names.add(node.attr)
    return names


def unmarked_memory_tests(source: str) -> list:
    """The test functions of a module's source that call mem_get_info without the serial mark."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            calls = any(isinstance(n, ast.Attribute) and n.attr == "mem_get_info" for n in ast.walk(node))
            if calls and "serial" not in _marks(node):
                out.append(node.name)
    return out


def test_tests_that_size_themselves_by_free_memory_are_serial():
    files = sorted(glob.glob(os.path.join(ROOT, "test_*.py")))
    assert len(files) > 20
    found = {os.path.basename(f): unmarked_memory_tests(open(f).read()) for f in files}
    assert not {f: names for f, names in found.items() if names}


def test_the_rule_sees_a_missing_mark():
    src = ("import pytest, torch\n"
           "@pytest.mark.gpu\n"
           "def test_big():\n"
           "    free = torch.cuda.mem_get_info()[0]\n"
           "@pytest.mark.serial\n"
           "@pytest.mark.skipif(True, reason='x')\n"
           "def test_big_marked():\n"
           "    free = torch.cuda.mem_get_info()[0]\n"
           "def test_small():\n"
           "    pass\n")
    assert unmarked_memory_tests(src) == ["test_big"]
