"""Compare the SASS of every CUDA kernel between two builds of ewkern (no GPU needed).

    python scripts/sass_compare.py BASE NEW [--arch sm_90] [--show 3]

BASE and NEW are each a built extension (ewkern/_C*.so), an nvcc object (.o), or a folder, which
stands for every .o under it (a build tree's build/temp*/cuda). The machine code of each kernel
(cuobjdump --dump-sass --gpu-architecture ARCH) is compared function by function after dropping what
moves when code moves between files: the instruction addresses, the encodings, and the file part of
anonymous-namespace names (_GLOBAL__N__<hash>_<len>_<file>_cu_<hash>, which nvcc derives from the
source file's name). Branch targets are offsets inside the function, so they are kept.

Prints the counts (identical, different, only in BASE, only in NEW, compiled in more than one file)
and the first differing lines of each difference; exits 1 when any kernel differs, is missing on
either side or is compiled in more than one file of a side, 2 when the tools or inputs are missing.
Used to check that splitting a .cu file left every kernel byte for byte as it was.

cuobjdump (and the nvdisasm it calls) is found as tests/test_sass.py finds it: PATH, CUDA_HOME,
/usr/local/cuda, or the pip wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys


def find_tool(name):
    found = shutil.which(name)
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", name), os.X_OK):
            return os.path.join(root, "bin", name)
    try:  # pip wheels: nvidia/cu13/bin/NAME, nvidia/cuda_cuobjdump/bin/NAME, ...
        import nvidia  # type: ignore

        for base in list(getattr(nvidia, "__path__", [])):
            for cand in glob.glob(os.path.join(base, "*", "bin", name)):
                if os.access(cand, os.X_OK):
                    return cand
    except ImportError:
        pass
    return None


_ANON = re.compile(r"(\d+)_GLOBAL__N__")


def normalize_name(text):
    """Replace each anonymous-namespace source name (<len>_GLOBAL__N__..., len characters long) by
    one placeholder, so that the same kernel compiled from another file has the same name."""
    out, pos = [], 0
    for m in _ANON.finditer(text):
        if m.start() < pos:
            continue
        length = int(m.group(1))
        start = m.start(1) + len(m.group(1))
        if not text.startswith("_GLOBAL__N__", start) or start + length > len(text):
            continue
        out.append(text[pos:m.start()])
        out.append("(anon)")
        pos = start + length
    out.append(text[pos:])
    return "".join(out)


_FUNC = re.compile(r"^\s*Function : (\S+)")
_ARCH = re.compile(r"^\s*arch = (sm_\w+)")
_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def parse_sass(text, arch):
    """[(normalized function name, [instruction text, ...]), ...] of the given architecture."""
    funcs, cur, cur_arch = [], None, None
    for line in text.splitlines():
        m = _ARCH.match(line)
        if m:
            cur_arch, cur = m.group(1), None
            continue
        m = _FUNC.match(line)
        if m:
            cur = None
            if cur_arch in (None, arch):
                cur = (normalize_name(m.group(1)), [])
                funcs.append(cur)
            continue
        if cur is None:
            continue
        m = _INSN.search(line)
        if m:
            cur[1].append(normalize_name(re.sub(r"\s+", " ", m.group(1))))
    return funcs


def inputs(path):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "**", "*.o"), recursive=True))
        if not files:
            sys.exit("sass_compare: no .o files under %s" % path)
        return files
    if not os.path.exists(path):
        sys.exit("sass_compare: %s does not exist" % path)
    return [path]


def dump(cuobjdump, env, files, arch):
    """{name: [(file, instructions), ...]} over all files of one side."""
    kernels = {}
    for f in files:
        proc = subprocess.run([cuobjdump, "--dump-sass", "--gpu-architecture", arch, f],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            if "does not contain" in proc.stderr or "no device code" in proc.stderr.lower():
                continue  # a host-only object
            sys.exit("sass_compare: cuobjdump failed on %s (%d): %s" % (f, proc.returncode, proc.stderr.strip()))
        for name, insns in parse_sass(proc.stdout, arch):
            kernels.setdefault(name, []).append((f, insns))
    return kernels


def first_difference(a, b, context=2):
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    lo = max(0, i - context)
    lines = ["      instruction %d of %d / %d:" % (i, len(a), len(b))]
    lines += ["      - %s" % s for s in a[lo:i + context + 1]]
    lines += ["      + %s" % s for s in b[lo:i + context + 1]]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="built extension, .o, or folder of .o files (the reference)")
    ap.add_argument("new", help="built extension, .o, or folder of .o files (the one checked)")
    ap.add_argument("--arch", default="sm_90", help="SASS architecture to compare (default sm_90)")
    ap.add_argument("--show", type=int, default=5, help="differences to print in full (default 5)")
    args = ap.parse_args(argv)

    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None:
        print("sass_compare: cuobjdump not found (PATH, CUDA_HOME, /usr/local/cuda, pip nvidia-cuda-cuobjdump)",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm is not None:
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")

    base = dump(cuobjdump, env, inputs(args.base), args.arch)
    new = dump(cuobjdump, env, inputs(args.new), args.arch)
    if not base or not new:
        print("sass_compare: no %s kernels in %s" % (args.arch, args.base if not base else args.new), file=sys.stderr)
        return 2

    identical, different = [], []
    for name in sorted(set(base) & set(new)):
        (a, b) = (base[name][0][1], new[name][0][1])
        (identical if a == b else different).append(name)
    only_base = sorted(set(base) - set(new))
    only_new = sorted(set(new) - set(base))
    dup = [(side, name, [os.path.basename(f) for f, _ in found])
           for side, ks in (("base", base), ("new", new)) for name, found in sorted(ks.items()) if len(found) > 1]

    print("sass_compare (%s): %d kernels in base, %d in new" % (args.arch, len(base), len(new)))
    print("  identical:                 %d" % len(identical))
    print("  different:                 %d" % len(different))
    print("  only in base:              %d" % len(only_base))
    print("  only in new:               %d" % len(only_new))
    print("  compiled in several files: %d" % len(dup))
    for name in different[:args.show]:
        print("  DIFFERENT %s" % name)
        print(first_difference(base[name][0][1], new[name][0][1]))
    if len(different) > args.show:
        print("  ... and %d more different" % (len(different) - args.show))
    for name in only_base[:args.show]:
        print("  ONLY IN BASE %s" % name)
    for name in only_new[:args.show]:
        print("  ONLY IN NEW %s" % name)
    for side, name, files in dup[:args.show]:
        print("  SEVERAL FILES (%s) %s: %s" % (side, name, ", ".join(files)))
    return 1 if (different or only_base or only_new or dup) else 0


if __name__ == "__main__":
    sys.exit(main())
