"""peers' timing methods on the CPU: frameworks.time_calls' CUDA-graph paths (back-to-back, single,
after a foreign kernel) run against a stand-in for torch.cuda (tests/fake_torch_cuda.py) whose
kernels advance a virtual clock.

The real CUDA graphs run on the GPU machine (python -m ewkern.bench peers --peers-methods ...).
"""

import math
import sys

import pytest

from ewkern.bench import frameworks
from ewkern.bench.timing import Skip, TimingConfig
from ewkern.bench.units import ITEMSIZE

from fake_torch_cuda import FakeTorch

US = 1e-6
FOREIGN_US = 2.0          # the fake torch.mul
TORCH_US = 1.0            # the fake torch op, whatever ran before it


def ewkern_cost(pdl):
    """The fake ewkern kernel: with PDL, 0.8 us after another ewkern kernel (its early launch
    overlaps the drain) and 1.05 us after anyone else's; 1.0 us without PDL."""
    return lambda prev: (0.8 if prev == "ewkern" else 1.05) * US if pdl else 1.0 * US


@pytest.fixture
def fake(monkeypatch):
    f = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", f)
    return f


def cfg(samples=5):
    return TimingConfig(device="cuda:0", cache_bytes=1 << 20, samples=samples, flush_samples=samples,
                        min_sample_s=0.2e-3)


# --- frameworks.time_calls on the fake GPU ------------------------------------------------------

def test_after_torch_is_the_pair_graph_minus_the_foreign_graph(fake):
    n = 1 << 14                                      # 64 KiB of float32 per buffer
    made = {"op": 0, "mul": 0}

    def make(tag, cost):
        def make_call():                             # each buffer set: kernels named by its index
            i = made[tag]
            made[tag] += 1
            return fake.kernel(f"{tag}{i}", cost)
        return make_call

    op_cost = lambda prev: (1.05 if prev.startswith("mul") else 0.8) * US
    t = frameworks.time_calls(cfg(), "torch", make("op", op_cost), 2 * n * 4, "rotate",
                              before=(make("mul", FOREIGN_US * US), 3 * n * 4))
    rec = t.record()
    assert rec["time_s"] == pytest.approx(1.05 * US)
    assert rec["pair_time_s"] == pytest.approx((FOREIGN_US + 1.05) * US)
    assert rec["foreign_time_s"] == pytest.approx(FOREIGN_US * US)
    assert rec["foreign"] == "torch.mul"
    assert len(rec["samples_s"]) == len(rec["pair_samples_s"]) == len(rec["foreign_samples_s"]) == 5
    assert rec["samples_s"] == pytest.approx([p - a for p, a in zip(rec["pair_samples_s"], rec["foreign_samples_s"])])
    # enough sets that torch.mul alone passes 4x the cache; both kinds of buffer counted as working set
    assert t.sets == made["op"] == made["mul"] == math.ceil(4 * (1 << 20) / (3 * n * 4))
    assert t.working_set_bytes == t.sets * 5 * n * 4
    assert t.launches % t.sets == 0 and t.launches * rec["pair_time_s"] >= 0.2e-3
    assert "pairs" in t.method and "torch.cuda.CUDAGraph" in t.method
    # each op runs right after the torch.mul of its own set, and the foreign graph holds torch.mul alone
    ran = fake.ran
    assert all(ran[i - 1] == "mul" + tag[2:] for i, tag in enumerate(ran) if tag.startswith("op"))
    assert any(a.startswith("mul") and b.startswith("mul") for a, b in zip(ran, ran[1:]))


def test_after_torch_falls_back_to_eager_pairs_when_capture_fails(fake):
    fake.refuse_capture = True
    n = 1 << 14
    t = frameworks.time_calls(cfg(), "torch", lambda: fake.kernel("op", ewkern_cost(True)), 3 * n * 4, "rotate",
                              before=(lambda: fake.kernel("mul", FOREIGN_US * US), 3 * n * 4))
    assert "eager launches" in t.method and "capture refused" in t.method and "pairs" in t.method
    assert t.record()["time_s"] == pytest.approx(1.05 * US)
    assert t.record()["foreign_time_s"] == pytest.approx(FOREIGN_US * US)


def test_back_to_back_and_single_are_unchanged(fake):
    n = 1 << 14
    make = lambda: fake.kernel("ewkern", ewkern_cost(True))
    b2b = frameworks.time_calls(cfg(), "torch", make, 3 * n * 4, "rotate")
    assert b2b.record()["time_s"] == pytest.approx(0.8 * US)       # every kernel after another of ewkern's
    assert b2b.method == "CUDA events around a replayed CUDA graph (torch.cuda.CUDAGraph)"
    assert "pair_time_s" not in b2b.record() and b2b.sets == math.ceil(4 * (1 << 20) / (3 * n * 4))
    one = frameworks.time_calls(cfg(), "torch", make, 3 * n * 4, "flush")
    assert one.record()["time_s"] == pytest.approx(1.05 * US)       # after the flush, one of torch's
    assert one.launches == 1 and one.sets == 1 and "flush mode" in one.method


def test_after_torch_refuses_what_it_cannot_time(fake):
    before = (lambda: fake.kernel("mul", FOREIGN_US * US), 12)
    with pytest.raises(ValueError, match="rotate"):
        frameworks.time_calls(cfg(), "torch", lambda: fake.kernel("op", 1e-6), 8, "flush", before=before)
    with pytest.raises(ValueError, match="cupy"):
        frameworks.time_calls(cfg(), "cupy", lambda: fake.kernel("op", 1e-6), 8, "rotate", before=before)
    with pytest.raises(Skip, match="no measurable time"):   # an op that costs nothing after torch.mul
        frameworks.time_calls(cfg(), "torch", lambda: fake.kernel("op", 0.0), 8, "rotate", before=before)


def test_foreign_call_is_torch_mul_on_the_ops_shape_and_dtype(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(frameworks, "available", lambda impl, device: None)   # torch on the CPU, here only
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        make_call, set_bytes = frameworks.foreign_call(dtype, (1000,), "cpu")
        assert set_bytes == 3 * 1000 * ITEMSIZE[dtype]
        call = make_call()
        out = call()
        assert out.dtype == getattr(torch, dtype) and out.shape == (1000,)
