"""Compiling generated sources, and the caches in memory and on disk.

Disk cache: ``$EWKERN_CACHE_DIR`` or ``~/.cache/ewkern/kernels``. An entry's name is the sha256 of
everything that changes the code (the source, which holds the dtypes and the layout; the
backend; the compiler and its version or NVRTC's version and the architecture; ewkern's
version). Each file starts with a header line holding the sha256 of its payload; it is written
to a temporary file in the same folder and renamed into place (atomic), and an entry whose
header does not match its payload (truncated, damaged) is compiled again and overwritten, never
used. CPU entries are shared libraries, loaded with ctypes from a private copy of the payload.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

from ._codegen import MVEC_DECLS

_MAGIC = b"EWRTC1 "
_lock = threading.Lock()


def cache_dir() -> str:
    d = os.environ.get("EWKERN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ewkern", "kernels")
    return d


def cache_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def disk_get(key: str, ext: str) -> bytes | None:
    """The payload of a valid entry, or None (missing or damaged)."""
    path = os.path.join(cache_dir(), key + ext)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    nl = data.find(b"\n")
    if not data.startswith(_MAGIC) or nl < 0:
        return None
    digest, payload = data[len(_MAGIC):nl].decode("ascii", "replace"), data[nl + 1:]
    if hashlib.sha256(payload).hexdigest() != digest:
        return None
    return payload


def disk_put(key: str, ext: str, payload: bytes) -> None:
    """Write an entry atomically; a cache folder that cannot be written is skipped silently
    (the kernel still runs from memory)."""
    d = cache_dir()
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=ext)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            os.replace(tmp, os.path.join(d, key + ext))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError:
        pass


class CompileError(RuntimeError):
    """A run-time kernel failed to compile; the message names the kernel, shows the compiler's
    messages and the line of the user's code they point at."""


def unbalanced(code: str) -> tuple[str, int] | None:
    """The first bracket of C++ code closed without its opening, else the last left open, as
    (bracket, line), outside comments and string and character literals; None when they pair."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[tuple[str, int]] = []
    line, i, n = 1, 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            i = code.find("\n", i)
            i = n if i < 0 else i
            continue
        if code.startswith("/*", i):
            j = code.find("*/", i + 2)
            j = n if j < 0 else j + 2
            line += code.count("\n", i, j)
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and code[j] not in (c, "\n"):
                j += 2 if code[j] == "\\" else 1
            i = j + 1 if j < n and code[j] == c else j
            continue
        if c == "\n":
            line += 1
        elif c in "([{":
            stack.append((c, line))
        elif c in ")]}":
            if not stack or stack[-1][0] != pairs[c]:
                return c, line
            stack.pop()
        i += 1
    return stack[-1] if stack else None


def explain(kernel: str, log: str, parts: dict[str, str], backend: str) -> str:
    """The compile error message: the log, and each user line it points at (line count + 1 of a
    part: the line that closes an expression, Source.user's close, shown as its last line). Where
    no diagnostic points into the user's code (an unclosed '{' is reported at the end of the
    generated function), a part whose brackets do not pair is named instead."""
    shown = []
    for m in re.finditer(r'(\S+): (\w+)"?[:(](\d+)', log):
        what, line = m.group(2), int(m.group(3))
        code = parts[what].split("\n") if what in parts else []
        if line == len(code) + 1:
            line -= 1
        if 1 <= line <= len(code):
            entry = f"  {what}, line {line}: {code[line - 1].strip()}"
            if entry not in shown:
                shown.append(entry)
    msg = f"kernel {kernel!r} failed to compile ({backend})"
    if shown:
        msg += "; the error is in:\n" + "\n".join(shown)
    else:
        for what, src in parts.items():
            bad = unbalanced(src or "")
            if bad is not None:
                text = src.split("\n")[bad[1] - 1].strip()
                how = "an unclosed" if bad[0] in "([{" else "an unmatched"
                shown.append(f"  {what}, line {bad[1]}: {text}  ({how} {bad[0]!r})")
        if shown:
            msg += "; the brackets do not pair in:\n" + "\n".join(shown)
    log = log.strip()
    if len(log) > 4000:
        log = log[:4000] + "\n..."
    return msg + "\ncompiler output:\n" + log


# ---- the CPU backend: the system C++ compiler -------------------------------------------------

_cxx_info: tuple[str, str, bool] | None = None


def cxx() -> tuple[str, str, bool]:
    """(compiler path, its version line, whether -fopenmp works), found once: $CXX, c++, g++,
    clang++. RuntimeError when there is none."""
    global _cxx_info
    if _cxx_info is not None:
        return _cxx_info
    cands = [os.environ.get("CXX"), "c++", "g++", "clang++"]
    for c in cands:
        if not c:
            continue
        path = shutil.which(c)
        if not path:
            continue
        try:
            ver = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        ver = ver.split("\n")[0].strip()
        with tempfile.TemporaryDirectory() as td:
            src = os.path.join(td, "t.cpp")
            with open(src, "w") as f:
                f.write("#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n")
            omp = subprocess.run([path, "-fopenmp", "-fPIC", "-shared", "-o", os.path.join(td, "t.so"), src],
                                 capture_output=True).returncode == 0
        _cxx_info = (path, ver, omp)
        return _cxx_info
    raise RuntimeError("ewkern's CPU backend for run-time kernels needs a C++ compiler (set CXX, or install "
                       "g++ or clang++)")


# x86 vector ISAs a CPU build targets, widest first: (the /proc/cpuinfo flags it needs, gcc flags).
# The flags go into the disk cache's key, so a library is only loaded by CPUs that have them.
_CPU_ISAS = ((("avx512f", "avx512dq", "avx512vl", "avx512bw", "avx2", "fma"),
              ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx2", "-mfma"], "AVX-512"),
             (("avx2", "fma"), ["-mavx2", "-mfma"], "AVX2 + FMA"))
# glibc's libmvec vector functions by version (2.22: exp log sin cos pow; 2.35 the rest), the
# PRELUDE's EWRTC_MVEC tiers: declared to the compiler only where a test program links
_MVEC_PROBE = {2: "erff(x[i]) + tanhf(x[i]) + expm1f(x[i])", 1: "expf(x[i]) + logf(x[i])"}
_cpu_target_info: tuple[list[str], list[str], str] | None = None


def _cpu_isa() -> tuple[list[str], str]:
    """(gcc flags, name) of the widest vector ISA this CPU has (Linux x86_64; else the baseline:
    no flags); EWKERN_CPU_ISA=baseline keeps the baseline, =avx2 goes no wider than AVX2 + FMA
    (the built-in CPU kernels read the same variable: cpu_math.h)."""
    base: tuple[list[str], str] = ([], "the baseline ISA")
    cap = os.environ.get("EWKERN_CPU_ISA")
    if cap == "baseline" or not sys.platform.startswith("linux"):
        return base
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return base
    have = set(line.split(":", 1)[-1].split())
    isas = [isa for isa in _CPU_ISAS if cap != "avx2" or "avx512f" not in isa[0]]
    flags, name = next(((flags, name) for need, flags, name in isas if have.issuperset(need)), base)
    if flags and "f16c" in have:   # float16 tiles widen and round by F16C (the PRELUDE's h2f_n, f2h_n)
        flags, name = flags + ["-mf16c"], name + " + F16C"
    return flags, name


def cpu_target() -> tuple[list[str], list[str], str]:
    """(compile flags, link flags, a description) of the CPU builds, found once: the widest
    vector ISA this CPU has (_cpu_isa), and glibc's libmvec (x86_64, gcc or clang with
    OpenMP) when a program that calls its vector functions links; then the PRELUDE declares
    them (EWRTC_MVEC) and an `omp simd` loop that calls expf, erff... calls the vector versions
    of the ISA (glibc documents at most 4 ulp for them), as ewkern's own CPU ops do (cpu_math.h).
    FMA contraction stays off, as in the baseline build (no FMA is formed from a * b + c).
    EWKERN_NO_LIBMVEC=1: scalar libm."""
    global _cpu_target_info
    if _cpu_target_info is not None:
        return _cpu_target_info
    path, ver, omp = cxx()
    isa, what = _cpu_isa()
    flags, link = isa + (["-ffp-contract=off"] if isa else []), []
    if omp and os.environ.get("EWKERN_NO_LIBMVEC") != "1" and sys.platform.startswith("linux") and (
            os.uname().machine in ("x86_64", "AMD64")):
        for tier, expr in _MVEC_PROBE.items():
            prog = (f"#define EWRTC_MVEC {tier}\n#include <cmath>\n" + MVEC_DECLS +
                    "float x[64], y[64];\nint main() {\n#pragma omp simd\n"
                    f"for (int i = 0; i < 64; ++i) y[i] = {expr};\nreturn y[3] > 1e30f; }}\n")
            with tempfile.TemporaryDirectory() as td:
                src = os.path.join(td, "t.cpp")
                with open(src, "w") as f:
                    f.write(prog)
                ok = subprocess.run([path, "-O3", "-fno-math-errno", "-fopenmp", "-std=c++17"] + flags +
                                    ["-o", os.path.join(td, "t"), src, "-lmvec"], capture_output=True).returncode == 0
            if ok:
                flags, link = flags + [f"-DEWRTC_MVEC={tier}"], ["-lmvec"]
                what += f", glibc libmvec (tier {tier})"
                break
    _cpu_target_info = (flags, link, what)
    return _cpu_target_info


_loaded: dict[str, ctypes.CDLL] = {}


def _demangle(symbol: str) -> str:
    """A C++ symbol as c++filt spells it (`_Z3fooi` -> `foo(int)`), or as it is."""
    if not symbol.startswith("_Z") or not shutil.which("c++filt"):
        return symbol
    try:
        out = subprocess.run(["c++filt", symbol], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return symbol
    return out or symbol


def _load_error(kernel: str, err: str, so: str, backend: str) -> str:
    """The message of a CPU kernel that compiled but does not load: the undefined symbol named
    (the loader's message names the private temporary file, which is gone)."""
    m = re.search(r"undefined symbol: (\S+)", err)
    if m:
        sym = _demangle(m.group(1))
        return (f"kernel {kernel!r} failed to link ({backend}): undefined symbol {sym!r}; the code calls a function "
                "that is declared but defined nowhere (a CUDA-only intrinsic or function on the CPU, or a "
                "preamble's declaration without a body)")
    return f"kernel {kernel!r} failed to load ({backend}): {err.replace(so, '<kernel library>')}"


def build_cpu(kernel: str, source: str, entry: str, parts: dict[str, str]):
    """The ctypes function `entry` of source compiled for the CPU (memory, then disk cache)."""
    from .. import __version__
    path, ver, omp = cxx()
    # -O3 -fno-math-errno: the loops vectorise (for the ISA of cpu_target: its flags are in the
    # key), sqrt without its errno branch
    isa, link, _ = cpu_target()
    flags = ["-O3", "-fno-math-errno", "-fPIC", "-shared", "-std=c++17", "-w"] + (["-fopenmp"] if omp else []) + isa
    key = cache_key("cpu", source, ver, " ".join(flags + link), __version__, sys.platform)
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            payload = disk_get(key, ".so")
            fresh = payload is None
            if payload is None:
                with tempfile.TemporaryDirectory(prefix="ewkern-rtc-") as td:
                    src, out = os.path.join(td, kernel + ".cpp"), os.path.join(td, kernel + ".so")
                    with open(src, "w") as f:
                        f.write(source)
                    r = subprocess.run([path] + flags + ["-o", out, src] + link, capture_output=True, text=True)
                    if r.returncode != 0:
                        raise CompileError(explain(kernel, r.stderr + r.stdout, parts, "cpu, " + ver))
                    with open(out, "rb") as f:
                        payload = f.read()
            # a private file per process: the cache entry may be replaced while it is mapped
            fd, so = tempfile.mkstemp(prefix="ewkern-rtc-", suffix=".so")
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            try:
                lib = ctypes.CDLL(so)
            except OSError as e:
                # it compiled but does not load: a function it calls that nothing defines (a CUDA
                # intrinsic the CPU has no shim of, a preamble's declaration without a body)
                raise CompileError(_load_error(kernel, str(e), so, "cpu, " + ver)) from None
            finally:
                os.unlink(so)
            if fresh:   # only a library that loads is kept (a broken one would fail every later run)
                disk_put(key, ".so", payload)
            # its integer division: x / 0, x % 0 and MIN / -1 give NumPy's results (0; MIN) where the
            # div instruction's fault would end the process (_rtc_fpe_guard, csrc/rtc.c)
            from .. import _C
            addr = ctypes.cast(getattr(lib, entry), ctypes.c_void_p).value
            if addr:
                _C._rtc_fpe_guard(addr)
            _loaded[key] = lib
    fn = getattr(lib, entry)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return fn


# ---- NVRTC --------------------------------------------------------------------------------------

NVRTC_HINT = ("install it with `pip install ewkern[nvrtc]` (the nvidia-cuda-nvrtc package), or a CUDA "
              "toolkit and set CUDA_PATH")


def _nvrtc_candidates() -> list[str]:
    names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    dirs = []
    env = os.environ.get("EWKERN_NVRTC")
    if env:
        return [env]
    for sp in sys.path:
        for sub in ("nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"):
            d = os.path.join(sp, sub)
            if os.path.isdir(d):
                dirs.append(d)
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "lib64"))
    dirs.append("/usr/local/cuda/lib64")
    out = [os.path.join(d, n) for d in dirs for n in names]
    return out + names   # last: the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig)


class NVRTC:
    """libnvrtc through ctypes, found the way CuPy finds it (the nvidia-cuda-nvrtc wheel's lib
    folder, CUDA_PATH / CUDA_HOME, /usr/local/cuda, then the loader's search path)."""

    def __init__(self):
        self.lib = None
        tried = []
        for c in _nvrtc_candidates():
            if os.sep in c and not os.path.exists(c):
                continue
            try:
                self.lib = ctypes.CDLL(c)
                self.path = c
                break
            except OSError as e:
                tried.append(f"{c}: {e}")
        if self.lib is None:
            raise RuntimeError("run-time CUDA kernels need NVRTC (libnvrtc.so.13 or .12), which was not found: "
                               + NVRTC_HINT)
        L = self.lib
        L.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        L.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)
        self.has_cubin = hasattr(L, "nvrtcGetCUBIN")
        self.archs = None
        if hasattr(L, "nvrtcGetSupportedArchs"):
            n = ctypes.c_int()
            if L.nvrtcGetNumSupportedArchs(ctypes.byref(n)) == 0:
                arr = (ctypes.c_int * n.value)()
                if L.nvrtcGetSupportedArchs(arr) == 0:
                    self.archs = list(arr)

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"NVRTC {what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, kernel: str, source: str, options: list[str], name_exprs=(), parts=None,
                cubin: bool = False) -> tuple[bytes, dict[str, str]]:
        """(PTX, or CUBIN when cubin, and the lowered names of name_exprs). CompileError with the
        log and the user's line on failure."""
        L = self.lib
        prog = ctypes.c_void_p()
        self._check(L.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{kernel}.cu".encode(), 0, None,
                                         None), "nvrtcCreateProgram")
        try:
            for e in name_exprs:
                self._check(L.nvrtcAddNameExpression(prog, e.encode()), "nvrtcAddNameExpression")
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = L.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            L.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value + 1)
            L.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            if rc != 0:
                raise CompileError(explain(kernel, log, parts or {}, f"NVRTC {self.version[0]}.{self.version[1]}"))
            if cubin:
                L.nvrtcGetCUBINSize(prog, ctypes.byref(size))
                out = ctypes.create_string_buffer(size.value)
                self._check(L.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
            else:
                L.nvrtcGetPTXSize(prog, ctypes.byref(size))
                out = ctypes.create_string_buffer(size.value)
                self._check(L.nvrtcGetPTX(prog, out), "nvrtcGetPTX")
            lowered = {}
            for e in name_exprs:
                p = ctypes.c_char_p()
                self._check(L.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(p)), "nvrtcGetLoweredName")
                lowered[e] = (p.value or b"").decode()
            return out.raw, lowered
        finally:
            L.nvrtcDestroyProgram(ctypes.byref(prog))


_nvrtc: NVRTC | None = None


def nvrtc() -> NVRTC:
    """The process's NVRTC (loaded on first use); RuntimeError saying what to install without it."""
    global _nvrtc
    if _nvrtc is None:
        _nvrtc = NVRTC()
    return _nvrtc


def include_dirs() -> list[str]:
    """Where csrc/cuda's device headers are: the package's include folder (an installed
    ewkern) or the source tree's csrc/cuda and csrc (a build in place)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cands = [os.path.join(here, "include"), os.path.join(os.path.dirname(here), "csrc", "cuda"),
             os.path.join(os.path.dirname(here), "csrc")]
    # the toolkit's headers (cuda_fp16.h, cuda_bf16.h), which NVRTC does not carry itself
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            cands.append(os.path.join(os.environ[var], "include"))
    cands.append("/usr/local/cuda/include")
    try:   # the nvidia-cuda-runtime wheel, beside the nvrtc one (imported by name: it has no type hints)
        _rt = importlib.import_module("nvidia.cuda_runtime")
        cands += [os.path.join(p, "include") for p in _rt.__path__]
    except ImportError:
        pass
    seen = []
    for d in cands:
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
    return seen


def compile_cuda(kernel: str, source: str, cc: tuple[int, int], name_exprs=(), parts=None, options=(),
                 ptx_only: bool = False) -> tuple[bytes, str, dict[str, str]]:
    """(image, 'cubin' | 'ptx', lowered names) of source for compute capability cc, from memory,
    the disk cache or NVRTC: a CUBIN for sm_<cc> where NVRTC can make one (and supports that
    architecture), else PTX for compute_<cc> (the driver finishes it)."""
    from .. import __version__
    nv = nvrtc()
    arch = cc[0] * 10 + cc[1]
    if nv.archs and arch not in nv.archs:
        arch = max(a for a in nv.archs if a <= arch) if any(a <= arch for a in nv.archs) else min(nv.archs)
    cubin = nv.has_cubin and not ptx_only
    opts = [f"-arch={'sm' if cubin else 'compute'}_{arch}", "-std=c++17", "-default-device"]
    opts += [f"--include-path={d}" for d in include_dirs()] + list(options)
    kind = "cubin" if cubin else "ptx"
    key = cache_key("cuda", source, kind, " ".join(opts), "\n".join(name_exprs), f"nvrtc{nv.version}", __version__)
    with _lock:
        hit = _images.get(key)
        if hit is not None:
            return hit
        payload = disk_get(key, "." + kind)
        lowered = {}
        if payload is not None and name_exprs:
            names = disk_get(key, ".names")
            if names is None:
                payload = None
            else:
                lowered = dict(line.split("\t", 1) for line in names.decode().split("\n") if line)
        if payload is None:
            payload, lowered = nv.compile(kernel, source, opts, name_exprs, parts, cubin)
            disk_put(key, "." + kind, payload)
            if name_exprs:
                disk_put(key, ".names", "\n".join(f"{k}\t{v}" for k, v in lowered.items()).encode())
        _images[key] = (payload, kind, lowered)
        return _images[key]


_images: dict[str, tuple[bytes, str, dict[str, str]]] = {}
