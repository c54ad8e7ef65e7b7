"""ewkern.torch's autograd nodes in C++: autograd.cpp, built at run time against the torch of this
process with the system C++ compiler, cached on disk like the run-time kernels (ewkern.rtc's
cache: ``$EWKERN_CACHE_DIR`` or ``~/.cache/ewkern/kernels``), and loaded by ewkern.torch on the
first eager call that needs a gradient.

Why at run time: the module links against libtorch, whose C++ ABI changes with every torch
release, so it is built for the torch that imports it (the key holds torch's version and git
revision, the Python, the compiler, the sources and ewkern's version). The first build takes
15-40 s; later processes load it from the cache in milliseconds.

``EWKERN_TORCH_NATIVE``: ``0`` keeps the Python autograd.Function path; ``1`` makes a failed
build an error; unset, a failed build warns once and ewkern.torch keeps the Python path.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_module = None


def _sources() -> tuple[str, str]:
    with open(os.path.join(_HERE, "autograd.cpp")) as f, open(os.path.join(_HERE, "ewkern_native.h")) as g:
        return f.read(), g.read()


def _flags(torch) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) of a module against this torch (its headers and libraries, its
    C++ ABI), without CUDA: the module reaches CUDA through c10's device guard and ewkern._C."""
    # torch.utils.cpp_extension's include_paths() and library_paths() for a CPU build, without
    # importing it (it looks for a CUDA toolkit and warns where there is none)
    root = os.path.dirname(os.path.abspath(torch.__file__))
    inc = [os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include"),
           sysconfig.get_paths()["include"]]
    libs = [os.path.join(root, "lib")]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cflags = ["-O2", "-std=c++17", "-fPIC", "-shared", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
              "-DTORCH_EXTENSION_NAME=_ewkern_torch_native", "-I" + _HERE] + ["-I" + d for d in inc]
    lflags = [f"-L{d}" for d in libs] + [f"-Wl,-rpath,{d}" for d in libs] + \
        ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    return cflags, lflags


def _build(torch) -> bytes:
    """The shared library's bytes: from the disk cache, or compiled now and cached."""
    from .. import __version__
    from ..rtc._build import CompileError, cache_dir, cache_key, cxx, disk_get, disk_put
    path, ver, _ = cxx()
    src, hdr = _sources()
    cflags, lflags = _flags(torch)
    key = cache_key("torch-native", src, hdr, torch.__version__, str(getattr(torch.version, "git_version", "")),
                    sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "", ver, " ".join(cflags + lflags),
                    __version__, sys.platform)
    payload = disk_get(key, ".so")
    if payload is None:
        # a first step that stops for half a minute should say why (once per torch and ewkern)
        print(f"ewkern.torch: building the C++ autograd module for torch {torch.__version__} (once, about "
              f"20-40 s; cached in {cache_dir()})", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="ewkern-torch-native-") as td:
            out = os.path.join(td, "m.so")
            r = subprocess.run([path] + cflags + ["-o", out, os.path.join(_HERE, "autograd.cpp")] + lflags,
                               capture_output=True, text=True)
            if r.returncode != 0:
                log = (r.stderr + r.stdout).strip().splitlines()
                raise CompileError("ewkern.torch's C++ autograd module did not build with " + ver + ":\n" +
                                   "\n".join(log[:40]))
            with open(out, "rb") as f:
                payload = f.read()
        disk_put(key, ".so", payload)
    return payload


def load(torch):
    """The built module (_ewkern_torch_native), loaded once per process; raises where it cannot be
    built or loaded (no C++ compiler, torch without its headers, a compile error)."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        payload = _build(torch)
        # a private copy per process: the cache entry may be replaced while it is mapped
        name = "_ewkern_torch_native"
        with tempfile.TemporaryDirectory(prefix="ewkern-torch-native-") as td:
            so = os.path.join(td, name + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
            with open(so, "wb") as f:
                f.write(payload)
            loader = importlib.machinery.ExtensionFileLoader(name, so)
            spec = importlib.util.spec_from_file_location(name, so, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
        _module = mod
        return mod
