import atexit
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# torch.compile's on-disk caches key a graph by its custom ops' names, not their fake kernels: a
# run of another ewkern tree could hand this one its compiled code. Each test session gets its own.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ewkern-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

import ewkern  # noqa: E402

HAS_CUDA = ewkern.cuda_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine (GPU tests run on the GPU machine)")


@pytest.fixture
def full_calls(monkeypatch):
    """How many run-time kernel calls took the full path (building a _Call) rather than a
    recorded plan (tests/test_rtc.py, test_rtc_fast.py)."""
    from ewkern.rtc import _kernel, _rowkernel
    count = [0]
    real = _kernel._Call

    def counting(*a, **kw):
        count[0] += 1
        return real(*a, **kw)
    monkeypatch.setattr(_kernel, "_Call", counting)
    monkeypatch.setattr(_rowkernel, "_Call", counting)
    return count


def device_params():
    """'cpu' always; 'cuda:0' marked gpu (skipped with a reason where there is no GPU)."""
    return ["cpu", pytest.param("cuda:0", marks=[pytest.mark.gpu, gpu])]



def ptxas_registers(ptx: bytes, tmp_path) -> dict:
    """{entry: registers} of PTX assembled by ptxas for sm_90 (skips where ptxas is not found:
    CUDA_HOME, /usr/local/cuda, PATH); fails on any spill."""
    ptxas = next((os.path.join(d, "bin", "ptxas") for d in (os.environ.get("CUDA_HOME"), "/usr/local/cuda")
                  if d and os.path.exists(os.path.join(d, "bin", "ptxas"))), None) or shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not found (CUDA_HOME, /usr/local/cuda, PATH)")
    f = tmp_path / "kernel.ptx"
    f.write_bytes(ptx.rstrip(b"\0"))
    rep = subprocess.run([ptxas, "-arch=sm_90", "-v", str(f), "-o", os.devnull], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    regs, entry = {}, None
    for line in rep.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        entry = m.group(1) if m else entry
        m = re.search(r"Used (\d+) registers", line)
        if m and entry:
            regs[entry] = int(m.group(1))
        assert "spill" not in line or " 0 bytes spill stores, 0 bytes spill loads" in line, line
    return regs


def dispatch_recorder():
    """A torch TorchDispatchMode whose .ops lists the name of every op it saw (torch on use)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    return Record()


def blocks_per_sm(registers: int, block: int) -> int:
    """Blocks of `block` threads an SM holds by registers alone (64K registers, allocated per warp
    in units of 256: a thread's count rounded up to 8)."""
    return 65536 // (-(-registers // 8) * 8 * block)


@contextlib.contextmanager
def vmap_rules_only():
    """torch.func.vmap without torch's per-sample fallback loop: an op without a batching rule
    raises instead of running once a sample (that fallback's warning is not a Python warning)."""
    import torch
    ft = torch._C._functorch
    was = ft._is_vmap_fallback_enabled()
    ft._set_vmap_fallback_enabled(False)
    try:
        yield
    finally:
        ft._set_vmap_fallback_enabled(was)


def pytest_collection_modifyitems(config, items):
    """EWKERN_TEST_SHARD=k/n keeps the tests whose id falls in shard k of n (a CRC of the test id,
    the same in every pytest-xdist worker): scripts/gpu-check.sh's GPU_CHECK_SHARD, for a suite
    that one device call of 600 s no longer holds (the H200 ran 99% of it in 560 s on 2026-11-29)."""
    shard = os.environ.get("EWKERN_TEST_SHARD")
    if not shard:
        return
    m = re.fullmatch(r"(\d+)/(\d+)", shard)
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise pytest.UsageError(f"EWKERN_TEST_SHARD={shard!r}: expected k/n with 0 <= k < n")
    import zlib
    k, n = int(m.group(1)), int(m.group(2))
    mine = [zlib.crc32(it.nodeid.encode()) % n == k for it in items]
    config.hook.pytest_deselected(items=[it for it, keep in zip(items, mine) if not keep])
    items[:] = [it for it, keep in zip(items, mine) if keep]
