"""The typing surface: py.typed and _C.pyi ship with the package, the stubs name every function
and type of the module, and ewkern.__all__ lists every op. (.ci/stubtest checks the signatures
with mypy's stubtest.)"""
import ast
import os

import ewkern
import ewkern._C

HERE = os.path.dirname(os.path.abspath(ewkern.__file__))


def stub_names():
    tree = ast.parse(open(os.path.join(HERE, "_C.pyi")).read())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    # module attributes declared with a type (`_native_api: object`)
    return names | {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_stub_files_ship():
    assert os.path.exists(os.path.join(HERE, "py.typed"))
    assert os.path.exists(os.path.join(HERE, "_C.pyi"))


def test_stubs_name_everything_in_the_module():
    public = {n for n in dir(ewkern._C) if not n.startswith("__")}
    assert public - stub_names() == set()


def test_all_lists_every_op():
    ops = {d["name"] for d in ewkern.ops()}
    assert ops <= set(ewkern.__all__)
    assert all(hasattr(ewkern, n) for n in ewkern.__all__)
