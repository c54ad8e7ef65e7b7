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


def _collected(shard=None):
    """(exit code, the test ids pytest collects from test_layering.py with EWKERN_TEST_SHARD=shard)."""
    import subprocess
    import sys
    env = dict(os.environ)
    env.pop("EWKERN_TEST_SHARD", None)
    if shard is not None:
        env["EWKERN_TEST_SHARD"] = shard
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        os.path.join(ROOT, "test_layering.py")], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(ROOT), timeout=300)
    return r.returncode, {line for line in r.stdout.splitlines() if "::" in line}


def test_shards_partition_the_suite():
    """GPU_CHECK_SHARD's shards (EWKERN_TEST_SHARD=k/n): every test in exactly one shard of n, the
    same ids whichever process collects them; a malformed value is a usage error."""
    rc, every = _collected()
    assert rc == 0 and len(every) > 5
    shards = [_collected(f"{k}/3") for k in range(3)]
    assert all(rc == 0 or (rc == 5 and not ids) for rc, ids in shards)
    ids = [s[1] for s in shards]
    assert set().union(*ids) == every and sum(map(len, ids)) == len(every)
    assert _collected("1/3")[1] == ids[1]
    for bad in ("3/3", "1", "a/b"):
        assert _collected(bad)[0] == 4
