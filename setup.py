"""Build ewkern._C: C11 host code with the C compiler, CUDA kernels with nvcc.

Environment:
  CUDA_HOME / PATH        where nvcc is found; without nvcc the build is CPU-only (said once).
  EWKERN_CPU_ONLY=1       build without CUDA even when nvcc exists.
  EWKERN_CUDA_ARCHS       semicolon list of SM versions, default "80;86;89;90" (PTX for the
                          highest is embedded too, for newer GPUs). "90" alone builds fastest.
  EWKERN_DLPACK_INCLUDE   a folder holding dlpack/dlpack.h (1.2 or newer); by default the
                          header of the apache-tvm-ffi package is used.
  EWKERN_NVCC_THREADS     nvcc --threads value (default 2).
  EWKERN_NVCC_FLAGS       extra nvcc arguments, split on spaces (e.g. "-DNAME=1 -lineinfo"); a change
                          of them does not rebuild existing objects (remove build/ for that).
  EWKERN_NO_LIBMVEC=1     build the CPU math ops without glibc's libmvec (scalar libm loops),
                          as on machines that lack it; ewkern.build_info()["cpu_math"] says which.
"""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCHS = "80;86;89;90"


def find_nvcc():
    if os.environ.get("EWKERN_CPU_ONLY") == "1":
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def find_dlpack_include():
    env = os.environ.get("EWKERN_DLPACK_INCLUDE")
    if env:
        if not os.path.exists(os.path.join(env, "dlpack", "dlpack.h")):
            sys.exit(f"EWKERN_DLPACK_INCLUDE={env} holds no dlpack/dlpack.h")
        return env
    spec = importlib.util.find_spec("tvm_ffi")
    if spec and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for cand in (os.path.join(root, "include"), os.path.join(root, "3rdparty", "dlpack", "include")):
                if os.path.exists(os.path.join(cand, "dlpack", "dlpack.h")):
                    return cand
    sys.exit("ewkern needs dlpack/dlpack.h (1.2 or newer): pip install apache-tvm-ffi, "
             "or set EWKERN_DLPACK_INCLUDE to a folder that holds dlpack/dlpack.h")


def cuda_lib_dir(nvcc):
    home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    for cand in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
        if os.path.exists(os.path.join(home, cand, "libcudart_static.a")):
            return os.path.join(home, cand)
    sys.exit(f"libcudart_static.a not found under {home}")


def libmvec_flags(compiler):
    """(define_macros, libraries) for the CPU kernels' vector math: glibc's libmvec on x86_64
    Linux when a test program that calls one of its vector functions links, else nothing (the
    kernels then call scalar libm, and build_info says so)."""
    if os.environ.get("EWKERN_NO_LIBMVEC") == "1":
        print("ewkern: EWKERN_NO_LIBMVEC=1: CPU math ops use scalar libm", flush=True)
        return [], []
    import platform
    import tempfile
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        print("ewkern: libmvec is glibc's x86_64 library: CPU math ops use scalar libm", flush=True)
        return [], []
    src = ("#include <emmintrin.h>\n__m128 _ZGVbN4v_expf(__m128);\n"
           "int main(void) { volatile float r = _mm_cvtss_f32(_ZGVbN4v_expf(_mm_set1_ps(1.0f)));"
           " return r > 2.0f ? 0 : 1; }\n")
    with tempfile.TemporaryDirectory() as tmp:
        c = os.path.join(tmp, "mvec.c")
        with open(c, "w") as f:
            f.write(src)
        try:
            objs = compiler.compile([c], output_dir=tmp)
            compiler.link_executable(objs, "mvec", output_dir=tmp, libraries=["mvec", "m"])
        except Exception:
            print("ewkern: libmvec not found (no -lmvec): CPU math ops use scalar libm", flush=True)
            return [], []
    return [("EW_CPU_LIBMVEC", "1")], ["mvec", "m"]


class BuildExt(build_ext):
    """Compiles csrc/cuda/*.cu with nvcc (in parallel, skipping up-to-date objects) and links
    them into the extension with the static CUDA runtime."""

    def build_extension(self, ext):
        nvcc = find_nvcc()
        dlpack = find_dlpack_include()
        import numpy

        # ewkern/_torch_native: ewkern_native.h, the capsule's layout, shared with the C++ module built at run time
        ext.include_dirs += [os.path.join(HERE, "csrc"), os.path.join(HERE, "ewkern", "_torch_native"), dlpack,
                             numpy.get_include()]
        mvec_macros, mvec_libs = libmvec_flags(self.compiler)
        ext.define_macros += mvec_macros
        ext.libraries += mvec_libs
        if nvcc:
            archs = [a.strip() for a in os.environ.get("EWKERN_CUDA_ARCHS", DEFAULT_ARCHS).split(";") if a.strip()]
            ext.define_macros += [("EWKERN_WITH_CUDA", "1"), ("EWKERN_CUDA_ARCHS", '"%s"' % ";".join(archs))]
            objects = self.compile_cuda(nvcc, archs, dlpack)
            ext.extra_objects += objects
            ext.depends += objects   # relink when only a .cu changed (setuptools ignores extra_objects)
            ext.library_dirs.append(cuda_lib_dir(nvcc))
            ext.libraries += ["cudart_static", "rt", "pthread", "dl", "stdc++"]
        else:
            print("ewkern: nvcc not found (or EWKERN_CPU_ONLY=1): building the CPU backend only", flush=True)
            ext.define_macros.append(("EWKERN_WITH_CUDA", "0"))
        super().build_extension(ext)

    def compile_cuda(self, nvcc, archs, dlpack):
        sources = sorted(glob.glob(os.path.join(HERE, "csrc", "cuda", "*.cu")))
        headers = glob.glob(os.path.join(HERE, "csrc", "*.h")) + glob.glob(os.path.join(HERE, "csrc", "*.def")) + \
            glob.glob(os.path.join(HERE, "csrc", "cuda", "*.cuh"))
        newest_header = max((os.path.getmtime(h) for h in headers), default=0)
        outdir = os.path.join(self.build_temp, "cuda")
        os.makedirs(outdir, exist_ok=True)
        gencode = []
        for a in archs:
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        top = max(archs, key=int)
        gencode += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
        if int(top) < 90:
            # also PTX with PDL's wait (pdl_device.cuh compiles it for compute 9.0 and up): ewkern
            # launches programmatically on any device of compute capability 9 or more, which would
            # otherwise JIT compute_<top>'s kernels, built without the wait
            gencode += ["-gencode", "arch=compute_90,code=compute_90"]
        threads = os.environ.get("EWKERN_NVCC_THREADS", "2")
        extra = os.environ.get("EWKERN_NVCC_FLAGS", "").split()

        def one(src):
            obj = os.path.join(outdir, os.path.basename(src) + "." + "-".join(archs) + ".o")
            if os.path.exists(obj) and os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_header):
                return obj
            cmd = [nvcc, "-c", src, "-o", obj, "-O3", "-std=c++17", "--threads", threads, "-Xcompiler", "-fPIC",
                   "-I", os.path.join(HERE, "csrc"), "-I", dlpack] + gencode + extra
            print("nvcc", os.path.relpath(src, HERE), flush=True)
            subprocess.run(cmd, check=True)
            return obj

        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(one, sources))


c_sources = sorted(glob.glob("csrc/*.c")) + sorted(glob.glob("csrc/cpu/*.c"))

setup(
    ext_modules=[
        Extension(
            "ewkern._C",
            sources=c_sources,
            # -fno-math-errno: sqrt vectorises; -fno-trapping-math: a ?: between float values
            # becomes a vector select on AVX2/SSE too (under the default, gcc sinks each arm's
            # arithmetic into a branch it will not if-convert; AVX-512's masks hid that). Neither
            # changes a result: no C code here reads errno after math or the FP exception flags.
            extra_compile_args=["-std=c11", "-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-Wall",
                                "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
