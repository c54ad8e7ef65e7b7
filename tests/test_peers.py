"""peers' timing methods on the CPU: frameworks.time_calls' CUDA-graph paths (back-to-back, single,
after_torch) run against a stand-in for torch.cuda (tests/fake_torch_cuda.py) whose kernels advance a
virtual clock, and a whole peers run on that fake GPU: its records, CSV, figures and summary.

The real CUDA graphs run on the GPU machine (python -m ewkern.bench peers --peers-methods ...).
"""

import argparse
import csv
import math
import sys

import numpy as np
import pytest

import ewkern
from ewkern import bench
from ewkern.bench import cli, frameworks, peers, runner
from ewkern.bench.timing import BenchError, Skip, TimingConfig, median_interval, sample_rounds, samples_wanted
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


def cfg(samples=5, flush_target=0.0):
    return TimingConfig(device="cuda:0", cache_bytes=1 << 20, samples=samples, flush_samples=samples,
                        min_sample_s=0.2e-3, flush_target=flush_target)


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


@pytest.mark.parametrize("cache", ["flush", "rotate"])
def test_a_sample_queued_after_the_spin_ended_is_taken_again(fake, cache):
    """The host queues 3 samples' work only after their spin kernel ended (each would time 50 us of
    host delay): they are taken again, the median is the kernel's, and the notes count them."""
    n = 1 << 14
    make = lambda: fake.kernel("ewkern", ewkern_cost(True))
    fake.late_left = 3
    t = frameworks.time_calls(cfg(samples=5), "torch", make, 3 * n * 4, cache)
    rec = t.record()
    assert fake.late_left == 0 and len(rec["samples_s"]) == 5
    assert max(rec["samples_s"]) < 2 * US
    assert "3 samples taken again: the host queued them after the spin kernel had ended" in rec["notes"]
    assert "still queued late" not in rec["notes"]


def test_a_sample_late_in_every_try_is_kept_and_said(fake):
    n = 1 << 14
    make = lambda: fake.kernel("ewkern", ewkern_cost(True))
    fake.late_left = frameworks.LATE_TRIES + 1       # the first sample's every try, then one of the second's
    rec = frameworks.time_calls(cfg(samples=5), "torch", make, 3 * n * 4, "flush").record()
    assert sorted(rec["samples_s"])[-1] == pytest.approx(1.05 * US + fake.host_delay)
    assert sorted(rec["samples_s"])[-2] == pytest.approx(1.05 * US)
    assert f"{frameworks.LATE_TRIES} samples taken again" in rec["notes"]
    assert f"1 samples still queued late after {frameworks.LATE_TRIES} tries" in rec["notes"]
    fake.late_left = 0
    clean = frameworks.time_calls(cfg(samples=5), "torch", make, 3 * n * 4, "flush").record()
    assert "taken again" not in clean["notes"] and "late" not in clean["notes"]


def _drifting(fake, tag, base_us, rate):
    """a fake kernel whose cost grows by `rate` (a fraction a second of the virtual clock): a GPU
    whose clocks sag over the time a cell takes"""
    return lambda: fake.kernel(tag, lambda prev: base_us * US * (1 + rate * fake.clock))


@pytest.mark.parametrize("cache", ["flush", "rotate"])
def test_ways_timed_in_turns_share_the_drift(fake, cache):
    """Two ways of equal cost on a GPU that slows as it runs (about 10% over a whole measurement):
    timed one after the other the second reads several % slower; in turns (graphs: each sample
    taking both, the first rotating; single launches: runs of RUN_LENGTH, the first way of each
    block of runs rotating) within 1%."""
    n = 1 << 14
    # single launches: whole blocks of runs (a b, b a), as a steep drift needs (one block cut
    # short leaves one way up to a run's drift behind)
    nsamp = 4 * frameworks.RUN_LENGTH if cache == "flush" else 21
    c = cfg(samples=nsamp)
    rate = 2000.0 if cache == "flush" else 10.0      # the run: ~50 us of kernels, or ~10 ms
    a = frameworks.time_calls(c, "torch", _drifting(fake, "a", 1.0, rate), 3 * n * 4, cache).record()["time_s"]
    b = frameworks.time_calls(c, "torch", _drifting(fake, "b", 1.0, rate), 3 * n * 4, cache).record()["time_s"]
    assert b / a > 1.03
    fake.clock = 0.0
    fake.ran.clear()
    ta, tb = frameworks.time_calls_in_turns(c, [(_drifting(fake, "a", 1.0, rate), 3 * n * 4),
                                                (_drifting(fake, "b", 1.0, rate), 3 * n * 4)], cache)
    ra, rb = ta.record(), tb.record()
    assert rb["time_s"] / ra["time_s"] == pytest.approx(1.0, abs=0.01)
    assert len(ra["samples_s"]) == len(rb["samples_s"]) == nsamp
    assert "2 ways in turns" in ta.method and ta.method == tb.method
    if cache == "flush":
        assert ta.launches == tb.launches == 1 and "flush" in ta.method and "eager" in ta.method
        # runs of RUN_LENGTH, a then b, then b then a, ...
        timed = [t for t in fake.ran if t in ("a", "b")][-2 * nsamp:]
        r = frameworks.RUN_LENGTH
        assert timed[:4 * r] == ["a"] * r + ["b"] * r + ["b"] * r + ["a"] * r
    else:
        assert "CUDA graphs" in ta.method and ta.sets == math.ceil(4 * (1 << 20) / (3 * n * 4))
        assert ta.launches % ta.sets == 0 and ta.launches * ra["time_s"] >= 0.2e-3


def test_shared_sets_give_every_way_its_kth_set_and_count_the_memory_once(fake):
    """frameworks.SharedSets: each way's k-th call gets the k-th set, made once; time_calls_in_turns
    with shared=True counts one way's sets against the memory budget, where ways of their own count
    every way's."""
    made = []

    def make_set():
        made.append(object())
        return made[-1]
    sets = frameworks.SharedSets(make_set)
    a, b = sets.maker(lambda s: ("a", s)), sets.maker(lambda s: ("b", s))
    a0, a1, b0, b1, b2 = a(), a(), b(), b(), b()
    assert (a0, a1, b0, b1, b2) == (("a", made[0]), ("a", made[1]), ("b", made[0]), ("b", made[1]), ("b", made[2]))
    assert len(made) == 3
    n = 1 << 14
    c = cfg()
    c.memory_budget = 6 * n * 4              # one way's single set (flush: one set) fits, two do not
    ways = [(sets.maker(lambda s: fake.kernel("a", 1.0 * US)), 4 * n * 4),
            (sets.maker(lambda s: fake.kernel("b", 1.0 * US)), 4 * n * 4)]
    with pytest.raises(frameworks.TogetherTooBig):
        frameworks.time_calls_in_turns(c, ways, "flush")
    ta, tb = frameworks.time_calls_in_turns(c, ways, "flush", shared=True)
    assert ta.record()["time_s"] == pytest.approx(1.0 * US, rel=0.01)
    assert tb.record()["time_s"] == pytest.approx(1.0 * US, rel=0.01)


def test_chain_sets_read_the_set_befores_output():
    """frameworks.ChainSets: set k's first input is set k - 1's output (its other inputs and its
    output its own); the first set keeps the inputs it was made with; every way shares them."""
    made = []

    def make_set():
        made.append(((object(), object()), object()))
        return made[-1]
    sets = frameworks.ChainSets(make_set)
    a, b = sets.maker(lambda s: s), sets.maker(lambda s: s)
    s0, s1, s2 = a(), a(), a()
    assert s0 == made[0]
    for k, s in ((1, s1), (2, s2)):
        (first, second), out = s
        assert first is made[k - 1][1] and second is made[k][0][1] and out is made[k][1]
    assert (b(), b(), b()) == (s0, s1, s2) and len(made) == 3


def test_chain_method_takes_its_ops_and_is_asked_for():
    """chain runs only when --peers-methods names it, on CHAIN_OPS (ops whose repeated application
    stays finite), and compares with torch alone."""
    assert "chain" not in peers._method_names(_ctx())
    assert peers._method_names(_ctx(peers_methods=["chain"])) == ["chain"]
    assert set(peers.CHAIN_OPS) <= set(peers._all_ops()) and "exp" not in peers.CHAIN_OPS
    assert "chain" in peers.TORCH_ONLY


@pytest.mark.parametrize("order", frameworks.ORDERS)
def test_ways_in_turns_in_each_order(fake, order):
    """time_calls_in_turns' orders (rotate: a b, b a, ...; alternate: a b, a b, ...; runs: RUN_LENGTH
    of a, then of b) and a call between samples, single launches: the timed kernels run in that
    order, the other kernel after each, every way's samples its own cost; a wrong order is refused."""
    n = 1 << 14
    ways = [(lambda: fake.kernel("a", 1.0 * US), 3 * n * 4), (lambda: fake.kernel("b", 2.0 * US), 3 * n * 4)]
    ta, tb = frameworks.time_calls_in_turns(cfg(samples=16), ways, "flush", order=order,
                                            between=fake.kernel("x", 0.5 * US))
    ran = [t for t in fake.ran if t in ("a", "b", "x")][-64:]
    assert ran[1::2] == ["x"] * 32
    r = frameworks.RUN_LENGTH
    want = {"rotate": ["a", "b", "b", "a"] * 8, "alternate": ["a", "b"] * 16,
            "runs": ["a"] * r + ["b"] * r + ["b"] * r + ["a"] * r}[order]
    assert ran[0::2] == want
    assert len(ta.samples_s) == len(tb.samples_s) == 16
    assert ta.record()["time_s"] == pytest.approx(1.0 * US, rel=0.01)
    assert tb.record()["time_s"] == pytest.approx(2.0 * US, rel=0.01)
    assert "another kernel after each sample" in ta.method
    with pytest.raises(ValueError, match="order must be one of"):
        frameworks.time_calls_in_turns(cfg(), ways, "flush", order="shuffle")
    # any number of samples: each way exactly that many, in the order's pattern
    for n, nways in ((50, 2), (21, 3), (1, 2)):
        plan = frameworks._schedule(order, 7, n, nways)
        assert [plan.count(w) for w in range(nways)] == [n] * nways


def test_ways_in_turns_keep_their_own_costs_and_fall_back_to_eager(fake):
    n = 1 << 14
    ways = [(lambda: fake.kernel("fast", 1.0 * US), 3 * n * 4), (lambda: fake.kernel("slow", 2.5 * US), 2 * n * 4)]
    fast, slow = frameworks.time_calls_in_turns(cfg(), ways, "rotate")
    assert fast.record()["time_s"] == pytest.approx(1.0 * US) and slow.record()["time_s"] == pytest.approx(2.5 * US)
    assert slow.sets == math.ceil(4 * (1 << 20) / (2 * n * 4)) != fast.sets
    fake.refuse_capture = True
    fast, slow = frameworks.time_calls_in_turns(cfg(), ways, "rotate")
    assert "eager launches" in fast.method and "capture refused" in fast.method
    assert slow.record()["time_s"] == pytest.approx(2.5 * US)


def test_measure_peers_in_turns_records_each_way_and_survives_a_failing_one(fake, tmp_path):
    import types
    ctx = runner.Context(device="cuda:0", info={}, quick=True, cache="rotate", out=tmp_path, args=None,
                         cfg=cfg(), results={}, progress=False)
    xr = runner.ExperimentRun(ctx, types.SimpleNamespace(name="t", title="", description="", paper=""))
    n = 1 << 14
    ok = lambda tag, us: (lambda: (lambda: fake.kernel(tag, us * US), 3 * n * 4, 2 * n * 4, n * 4))

    def broken():
        def make_call():
            def call():
                raise RuntimeError("this way's kernel failed")
            return call
        return make_call, 3 * n * 4, 2 * n * 4, n * 4

    def no_build():
        raise Skip("not on this device")
    recs = xr.measure_peers_in_turns(entries=[("a", ok("a", 1.0), {"series": "a"}), ("b", ok("b", 2.0), {"series": "b"}),
                                              ("c", no_build, {"series": "c"})], cache="flush", step_method="single")
    assert [r["series"] for r in recs] == ["a", "b"] and [r["step_method"] for r in recs] == ["single"] * 2
    assert recs[0]["time_s"] == pytest.approx(1.0 * US) and recs[1]["time_s"] == pytest.approx(2.0 * US)
    assert "in turns" in recs[0]["method"] and recs[0]["bytes"] == 3 * n * 4 and recs[0]["impl"] == "torch"
    assert xr.data["skipped"] == [{"what": "c", "reason": "not on this device"}]
    # a way whose call fails: the others are measured alone, the failing one skipped with its reason
    recs = xr.measure_peers_in_turns(entries=[("a", ok("a", 1.0), {"series": "a"}), ("x", broken, {"series": "x"})],
                                     cache="flush", step_method="single")
    assert recs[0]["series"] == "a" and recs[0]["time_s"] == pytest.approx(1.0 * US) and recs[1] is None
    assert "in turns" not in recs[0]["method"]
    assert xr.data["skipped"][-1]["what"] == "x" and "this way's kernel failed" in xr.data["skipped"][-1]["reason"]
    # ways that fit the memory budget alone but not together: each timed alone, the run goes on
    ctx.cfg.memory_budget = 5 * n * 4
    with pytest.raises(frameworks.TogetherTooBig, match="together"):
        frameworks.time_calls_in_turns(ctx.cfg, [ok("a", 1.0)()[:2], ok("b", 2.0)()[:2]], "flush")
    recs = xr.measure_peers_in_turns(entries=[("a", ok("a", 1.0), {"series": "a"}), ("b", ok("b", 2.0), {"series": "b"})],
                                     cache="flush", step_method="single")
    assert [r["time_s"] for r in recs] == pytest.approx([1.0 * US, 2.0 * US]) and "in turns" not in recs[1]["method"]


def _noisy(fake, tag, base_us, spread, seed):
    """a fake kernel whose cost is base_us +- spread (uniform, a seeded generator)"""
    import random
    rng = random.Random(seed)
    return lambda: fake.kernel(tag, lambda prev: base_us * US * (1 + spread * (2 * rng.random() - 1)))


def test_ways_in_turns_sample_until_the_median_is_known(fake, monkeypatch):
    """Single launches spread +-10% (as a 1 MiB one reads): the ways in turns take more rounds until
    each median's 90% interval is within +-0.25% of it or the cap, with a spin after the first round
    sized by the host's queueing; a noiseless kernel, samples= given, flush_target 0, or ways timed
    one after another (where a longer run would only widen the drift between them) keep the first
    round's count."""
    n = 1 << 14
    c = cfg(samples=50, flush_target=0.0025)
    c.flush_cap = 3000
    # the spin after the first round: the floor, unless this host took 40 ms to queue a sample
    monkeypatch.setattr(frameworks, "SPIN_HOST_FACTOR", 1e-3)

    def in_turns(make, **kw):
        return frameworks.time_calls_in_turns(c, [(make, 3 * n * 4), (make, 3 * n * 4)], "flush", **kw)

    ta, tb = in_turns(_noisy(fake, "a", 1.0, 0.10, 1))
    assert 1000 < len(ta.samples_s) == len(tb.samples_s) <= 3000
    lo, hi = median_interval(ta.samples_s)
    assert (hi - lo) / 2 / np.median(ta.samples_s) <= 0.0025 * 1.2 or len(ta.samples_s) == 3000
    assert f"{len(ta.samples_s)} samples, in rounds" in ta.record()["notes"]
    first = int(frameworks.SPIN_US * 2000)
    assert fake.sleeps[:100] == [first] * 100                 # the first round: 50 samples of 2 ways
    assert set(fake.sleeps[100:]) == {int(frameworks.SPIN_FLOOR_US * 2000)}
    # the host waits for the sample LAG_SAMPLES back before queueing one: one wait a sample past the
    # first LAG_SAMPLES of each round (a round ends in a synchronize; at most 6 rounds from 50 to 3000)
    n2 = 2 * len(ta.samples_s)
    assert n2 - 6 * frameworks.LAG_SAMPLES <= fake.event_waits <= n2 - 2 * frameworks.LAG_SAMPLES
    assert len(in_turns(lambda: fake.kernel("b", 1.0 * US))[0].samples_s) == 50
    assert len(in_turns(_noisy(fake, "c", 1.0, 0.10, 2), samples=50)[0].samples_s) == 50
    assert len(frameworks.time_calls(c, "torch", _noisy(fake, "e", 1.0, 0.10, 4), 3 * n * 4, "flush").samples_s) == 50
    c.flush_target = 0.0
    assert len(in_turns(_noisy(fake, "d", 1.0, 0.10, 3))[0].samples_s) == 50


def test_samples_wanted_reads_the_median_interval():
    rng = np.random.default_rng(0)
    xs = list(1.0 + 0.1 * rng.standard_normal(400))
    lo, hi = median_interval(xs)
    assert lo < np.median(xs) < hi
    # about 2.06 sigma / sqrt(n) either side at 90% (1.645 x 1.2533 for normal samples)
    assert (hi - lo) / 2 == pytest.approx(1.645 * 1.2533 * 0.1 / math.sqrt(400), rel=0.35)
    want = samples_wanted(xs, 0.0025)
    assert want == pytest.approx(400 * (((hi - lo) / 2 / np.median(xs)) / 0.0025) ** 2, rel=0.01) and want > 400
    assert samples_wanted(xs, 0.5) == 400
    # times in steps of the timer's resolution, as CUDA events give them (float32 milliseconds, 32 ns
    # steps, whose float gaps differ by an ulp): an interval spanning one step is as narrow as it
    # gets; one spanning two is not
    a, b, c = (float(np.float32(k * 0.032e-3)) * 1e3 for k in (147, 148, 149))
    one = [a] * 200 + [b] * 200 + [c] * 3         # b - a is an ulp wider than c - b
    assert b - a > c - b
    assert median_interval(one) == (a, b) and samples_wanted(one, 0.0001) == 403
    two = [a] * 190 + [b] * 20 + [c] * 190
    assert median_interval(two) == (a, c) and samples_wanted(two, 0.0001) > 400
    assert median_interval([2.0, 1.0]) == (1.5, 1.5) and samples_wanted([1.0, 2.0], 0.001) == 2


def test_sample_rounds_keep_to_the_time_budget():
    """A round is cut to what the budget has left at the rate so far: 1 ms a sample, 0.1 s."""
    import time as _time
    c = TimingConfig(device="cuda:0", flush_target=0.0001, flush_cap=100000, flush_budget_s=0.1)
    rng = np.random.default_rng(2)

    def take(m):
        _time.sleep(m * 1e-3)
        return [list(1.0 + 0.1 * rng.standard_normal(m))]
    t0 = _time.perf_counter()
    per = sample_rounds(c, take, 20, fixed=False)
    assert 20 < len(per[0]) <= 110 and _time.perf_counter() - t0 < 0.25


def test_sample_rounds_stop_at_the_cap_and_the_budget():
    c = TimingConfig(device="cuda:0", flush_target=0.0001, flush_cap=700)
    rng = np.random.default_rng(1)
    taken = []

    def take(m):
        taken.append(m)
        return [list(1.0 + 0.1 * rng.standard_normal(m)), list(1.0 + 0.01 * rng.standard_normal(m))]
    per = sample_rounds(c, take, 50, fixed=False)
    assert len(per[0]) == len(per[1]) == 700 and taken[:2] == [50, 150]   # at most 4x a round
    taken.clear()
    assert len(sample_rounds(c, take, 50, fixed=True)[0]) == 50 and taken == [50]
    c.flush_budget_s = 0.0
    taken.clear()
    assert len(sample_rounds(c, take, 50, fixed=False)[0]) == 50 and taken == [50]


def test_ways_in_turns_count_their_own_late_samples(fake):
    n = 1 << 14
    fake.late_left = 1        # the first sample's first way (a) is queued after its spin kernel ended
    ta, tb = frameworks.time_calls_in_turns(cfg(samples=5), [(lambda: fake.kernel("a", 1.0 * US), 3 * n * 4),
                                                             (lambda: fake.kernel("b", 1.0 * US), 3 * n * 4)], "flush")
    assert "1 samples taken again" in ta.record()["notes"] and "taken again" not in tb.record()["notes"]


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


# --- which ops after_torch times ------------------------------------------------------------------

def _ctx(**opts):
    return argparse.Namespace(opt=lambda name, default=None: opts.get(name, default))


def test_after_torch_ops_default_to_a_subset_unless_ops_are_named():
    every = ["copy", "fill", "add", "mul", "exp", "log", "gelu", "silu"]
    assert peers._after_torch_ops(_ctx(), every) == ["copy", "add", "mul", "exp", "gelu"]
    assert peers._after_torch_ops(_ctx(peers_ops=["log", "add"]), ["log", "add"]) == ["log", "add"]
    assert peers._after_torch_ops(_ctx(peers_after_torch_ops=["all"]), every) == every
    assert peers._after_torch_ops(_ctx(peers_after_torch_ops=["silu", "copy"]), every) == ["copy", "silu"]
    with pytest.raises(BenchError, match="nope"):
        peers._after_torch_ops(_ctx(peers_after_torch_ops=["nope"]), every)


@pytest.mark.parametrize("args, message", [
    (["--peers-ops", "add", "--peers-after-torch-ops", "gelu"], "--peers-after-torch-ops: gelu not among the ops"),
    (["--peers-methods", "back-to-back,after-torch"], "--peers-methods takes back-to-back, single, after_torch, "
                                                      "chain; got after-torch"),
    (["--peers-dtypes", "float32,int8"], "--peers-dtypes: int8 not known; it takes float32, float16, bfloat16, float64"),
    (["--peers-ops", "add,gelu_backward,nope"], "--peers-ops: gelu_backward, nope not known; it takes copy")])
def test_bad_peers_options_are_refused_before_running(args, message, tmp_path, capsys):
    code = bench.main(["peers", "--device", "cpu", *args, "--out", str(tmp_path / "o")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# --- a whole peers run on the fake GPU --------------------------------------------------------------

def _fake_gpu_run(fake, monkeypatch, tmp_path, extra=()):
    """peers on 'cuda:0' with the fake torch: ewkern's kernels cost ewkern_cost, torch's TORCH_US,
    torch.mul FOREIGN_US."""
    def maker(sets, way, make_call):
        """make_call, or with shared sets one that records which set each of way's calls took"""
        if sets is None:
            return make_call
        return sets.maker(lambda s: (fake.set_users.setdefault(s, []).append(way), make_call())[1])

    def ewkern_call(op, dtype, shape, device, sets=None, **kw):
        n, s, nin = math.prod(shape), ITEMSIZE[dtype], frameworks._nin(op)

        def make_call():
            # PDL as a launch attribute: fixed when the kernel is launched (or captured)
            return lambda: fake.kernel("ewkern", ewkern_cost(ewkern.pdl_enabled()))()
        return maker(sets, "ewkern", make_call), (nin + 1) * n * s, nin * n * s, n * s

    def peer_call(impl, op, dtype, shape, device, sets=None):
        n, s, nin = math.prod(shape), ITEMSIZE[dtype], frameworks._nin(op)
        return (maker(sets, impl, lambda: fake.kernel("torch", TORCH_US * US)), (nin + 1) * n * s, nin * n * s,
                n * s)

    class Set:   # a buffer set: its identity is what the test compares
        pass
    fake.set_users = {}
    monkeypatch.setattr(peers, "torch_sets", lambda op, dtype, shape, device, chain=False: (
        frameworks.ChainSets(lambda: ((Set(), Set()), Set())) if chain else frameworks.SharedSets(Set)))

    def foreign(dtype, shape, device):
        return (lambda: fake.kernel("mul", FOREIGN_US * US)), 3 * math.prod(shape) * ITEMSIZE[dtype]

    # ewkern's PDL switch as on an sm_90 build (a CPU-only build reports it off whatever is set)
    pdl = {"on": True}

    def set_pdl(on):
        prev, pdl["on"] = pdl["on"], bool(on)
        return prev
    monkeypatch.setattr(ewkern, "pdl_enabled", lambda: pdl["on"])
    monkeypatch.setattr(ewkern, "set_pdl", set_pdl)
    monkeypatch.setattr(peers, "available", lambda impl, device: None if impl == "torch" else "not here")
    monkeypatch.setattr(peers, "pdl_active", lambda info: True)
    monkeypatch.setattr(peers, "ewkern_in_torch_call", ewkern_call)
    monkeypatch.setattr(peers, "elementwise_call", peer_call)
    monkeypatch.setattr(peers, "foreign_call", foreign)
    monkeypatch.setattr(peers, "_dot_call", lambda impl, n, device: peer_call(impl, "add", "float32", (n,), device))

    def reference(ctx):
        ctx.results["reference"] = {"copy_gbs": 100.0, "cache": "rotate"}
        return 100.0
    monkeypatch.setattr(runner, "_reference_copy", reference)
    argv = ["peers", "--quick", "--samples", "3", "--min-sample-ms", "0.05", "--cache-bytes", "1MiB", "--no-progress",
            "--peers-sizes", "64KiB,256KiB", "--peers-dtypes", "float32,bfloat16", "--peers-rmse-shapes", "",
            "--peers-ref-size", "1MiB", *extra]
    args = cli.build_parser().parse_args(argv)
    info = {"name": "Fake GPU", "compute_capability": (9, 0), "l2_bytes": 1 << 20, "total_memory_bytes": 8 << 30}
    out = tmp_path / "out"
    out.mkdir()
    ctx = runner.make_context(args, "cuda:0", info, out, True, "rotate")
    runner.precheck(ctx, ["peers"])
    code = runner.run(ctx, ["peers"], argv)
    return code, out, bench.load(out)


def test_peers_chain_on_a_fake_gpu(fake, monkeypatch, tmp_path):
    """--peers-methods chain: the chain ops only, ewkern (PDL on and off) and torch, every way's
    calls on the cell's chained sets (each set's first input the output of the set before)."""
    code, out, res = _fake_gpu_run(fake, monkeypatch, tmp_path, ["--peers-ops", "copy,add,exp",
                                                                  "--peers-methods", "chain"])
    exp = res["experiments"]["peers"]
    assert code == 0 and exp["status"] == "ok" and not exp["errors"], exp["errors"]
    ms = [m for m in exp["measurements"] if not m.get("reference")]
    assert {m["timing_method"] for m in ms} == {"chain"}
    assert {m["op"] for m in ms} == {"copy", "add"}            # exp is not a chain op
    assert {m["impl"] for m in ms} == {"ewkern", "ewkern (PDL off)", "torch"}
    assert len(ms) == 2 * 2 * 2 * 3                             # ops x sizes x dtypes x ways
    users = fake.set_users
    assert users and all(set(w) == {"ewkern", "torch"} for w in users.values())
    outs = {id(out) for _, out in users}
    chained = sum(id(ins[0]) in outs for ins, _ in users)
    assert chained >= len(users) - 2 * 2 * 2                    # all but each cell's first set
    per, peer = peers.method_cells(exp)
    assert peer == "torch" and list(per) == ["chain"]
    assert "chain (graph of K calls" in (out / "summary.md").read_text()


def test_peers_after_torch_on_a_fake_gpu(fake, monkeypatch, tmp_path):
    code, out, res = _fake_gpu_run(fake, monkeypatch, tmp_path, ["--peers-ops", "copy,add,gelu,sub",
                                                                  "--peers-after-torch-ops", "copy,add,gelu"])
    exp = res["experiments"]["peers"]
    assert code == 0 and exp["status"] == "ok" and not exp["errors"], exp["errors"]
    assert exp["params"]["methods"] == ["back-to-back", "single", "after_torch"]
    assert exp["params"]["after_torch_ops"] == ["copy", "add", "gelu"] and exp["params"]["foreign"] == "torch.mul"
    assert any(n.startswith("after_torch: one CUDA graph") for n in exp["notes"])
    ms = [m for m in exp["measurements"] if not m.get("reference")]
    after = [m for m in ms if m["timing_method"] == "after_torch"]
    # sub is not among the after_torch ops; ewkern, ewkern with PDL off and torch for each other cell
    assert {m["op"] for m in after} == {"copy", "add", "gelu"}
    assert len(after) == 3 * 2 * 2 * 3
    assert {m["impl"] for m in after} == {"ewkern", "ewkern (PDL off)", "torch"}
    for m in after:
        want = {"ewkern": 1.05, "ewkern (PDL off)": 1.0, "torch": TORCH_US}[m["impl"]]
        assert m["time_s"] == pytest.approx(want * US)
        assert m["pair_time_s"] == pytest.approx((FOREIGN_US + want) * US)
        assert m["foreign_time_s"] == pytest.approx(FOREIGN_US * US)
        assert m["cache"] == "rotate" and m["bytes"] == m["bytes_read"] + m["bytes_written"]
        assert m["gbs"] == pytest.approx(m["bytes"] / m["time_s"] / 1e9)
    b2b = [m["time_s"] for m in ms if m["timing_method"] == "back-to-back" and m["impl"] == "ewkern"]
    assert b2b and all(t == pytest.approx(0.8 * US) for t in b2b)   # ewkern after ewkern there

    # ratios per method, PDL on and off
    per, peer = peers.method_cells(exp)
    assert peer == "torch" and list(per) == ["back-to-back", "single", "after_torch"]
    at = per["after_torch"]
    assert set(at["worst"]) == {"copy", "add", "gelu"}
    assert all(v == pytest.approx(1.0 / 1.05) for v in at["ratios"].values())
    assert len(at["below"]) == len(at["ratios"]) == 3 * 2 * 2
    off, _ = peers.method_cells(exp, "ewkern (PDL off)")
    assert all(v == pytest.approx(1.0) for v in off["after_torch"]["ratios"].values())
    pairs, _ = peers.pair_ratios(exp)
    assert all(v == pytest.approx((FOREIGN_US + TORCH_US) / (FOREIGN_US + 1.05)) for v in pairs.values())

    # outputs: the CSV labels the method, the figures and the summary have a part for it
    rows = list(csv.DictReader((out / "peers.csv").open()))
    assert {r["timing_method"] for r in rows if r["op"] != "d2d copy" and r["op"] != "dot"} == \
        {"back-to-back", "single", "after_torch"}
    assert "pair_time_s" in rows[0] and "foreign_time_s" in rows[0] and "pair_samples_s" not in rows[0]
    for stem in ("peers_back_to_back", "peers_single", "peers_after_torch", "peers_after_torch_pdl_off"):
        assert (out / f"{stem}.png").exists(), stem
    fig = dict(bench.plots.figures(res, "peers"))["peers_after_torch"]
    assert "after a torch kernel" in fig.axes[0].get_title()
    assert len(fig.axes[0].get_yticklabels()) == 3 * 2      # op x dtype rows: copy, add, gelu only
    text = (out / "summary.md").read_text()
    assert "**ewkern / torch, after a torch kernel (torch.mul + op, minus torch.mul alone)**" in text
    assert "Cells below 1.00 (ewkern, after_torch): 12 of 12" in text
    assert "Cells below 1.00 (ewkern (PDL off), after_torch): 0 of 12" in text
    assert "Worst cell per op (ewkern, after_torch): add 0.952" in text
    assert "Whole pairs (torch.mul + op), torch / ewkern time, what a program of such pairs sees " \
           "(ewkern, after_torch): median 0.984" in text


def test_peers_in_turns_on_a_fake_gpu(fake, monkeypatch, tmp_path):
    """--peers-in-turns: ewkern, ewkern with PDL off (each of its launches) and torch timed in turns
    in back-to-back and single launch, each keeping its own cost and impl; after_torch as before."""
    code, out, res = _fake_gpu_run(fake, monkeypatch, tmp_path, ["--peers-ops", "copy,add", "--peers-in-turns",
                                                                  "--peers-after-torch-ops", "copy"])
    exp = res["experiments"]["peers"]
    assert code == 0 and exp["status"] == "ok" and not exp["errors"] and not exp["skipped"], exp
    assert exp["params"]["in_turns"] is True
    ms = [m for m in exp["measurements"] if not m.get("reference")]
    want = {("back-to-back", "ewkern"): 0.8, ("back-to-back", "ewkern (PDL off)"): 1.0,
            ("back-to-back", "torch"): TORCH_US, ("single", "ewkern"): 1.05, ("single", "ewkern (PDL off)"): 1.0,
            ("single", "torch"): TORCH_US, ("after_torch", "ewkern"): 1.05, ("after_torch", "ewkern (PDL off)"): 1.0,
            ("after_torch", "torch"): TORCH_US}
    got = {}
    for m in ms:
        got.setdefault((m["timing_method"], m["impl"]), []).append(m)
    assert set(got) == set(want)
    for (method, impl), recs in got.items():
        cells = 2 * 2 * 2 if method != "after_torch" else 2 * 2    # op (after_torch: copy) x dtype x size
        assert len(recs) == cells, (method, impl)
        # (back-to-back: a graph's first kernel follows another way's, 1 of K launches)
        assert all(r["time_s"] == pytest.approx(want[method, impl] * US, rel=0.01) for r in recs), (method, impl)
        assert all(("3 ways in turns" in r["method"]) == (method != "after_torch") for r in recs), (method, impl)
        assert all(r["variant"] == ("torch" if impl == "torch" else "auto") for r in recs)
    per, _ = peers.method_cells(exp)
    assert all(v == pytest.approx(TORCH_US / 1.05) for v in per["single"]["ratios"].values())
    # every set made was taken by each of the three ways alike (the PDL-off way's calls are made by
    # ewkern's build; a cell timed twice, its first series thrown away, takes its sets twice): their
    # k-th calls on the same buffers
    assert fake.set_users and all(u.count("torch") >= 1 and u.count("ewkern") == 2 * u.count("torch")
                                  and len(u) == 3 * u.count("torch") for u in fake.set_users.values())
    assert "ewkern, its PDL-off series and torch (back-to-back and single launch) were timed in turns" in \
        (out / "summary.md").read_text()
    (tmp_path / "plain").mkdir()
    code, _, plain = _fake_gpu_run(fake, monkeypatch, tmp_path / "plain", ["--peers-ops", "copy"])
    assert plain["experiments"]["peers"]["params"]["in_turns"] is False
    assert not any("ways in turns" in m["method"] for m in plain["experiments"]["peers"]["measurements"]
                   if not m.get("reference"))


def test_peers_methods_pick_after_torch_alone(fake, monkeypatch, tmp_path):
    """--peers-methods after_torch --peers-no-pdl-off: that method only, ewkern and torch only, and the
    default ops of after_torch are every op --peers-ops names."""
    code, out, res = _fake_gpu_run(fake, monkeypatch, tmp_path, ["--peers-ops", "add,sub", "--peers-methods",
                                                                  "after_torch", "--peers-no-pdl-off"])
    exp = res["experiments"]["peers"]
    assert code == 0 and exp["status"] == "ok"
    ms = [m for m in exp["measurements"] if not m.get("reference")]
    assert {m["timing_method"] for m in ms} == {"after_torch"}
    assert {m["impl"] for m in ms} == {"ewkern", "torch"} and {m["op"] for m in ms} == {"add", "sub"}
    assert sorted(p.name for p in out.glob("peers_*.png")) == ["peers_after_torch.png"]


def test_ratio_intervals_tell_a_real_gap_from_the_samples_spread():
    """ratio_intervals bootstraps both series' medians: a cell 10% slower with tight samples has
    its interval wholly below 0.99; a cell at 0.98 whose samples spread 15% has one that reaches
    past 1; the summary counts only the first as below for sure; the same interval every time."""
    rng = np.random.default_rng(5)

    def rows(op, impl, centre, spread):
        return {"op": op, "dtype": "float32", "size_bytes": 1 << 20, "timing_method": "single",
                "impl": impl, "samples_s": list(centre * (1 + spread * rng.standard_normal(50))),
                "gbs": 1.0 / centre}
    exp = {"measurements": [rows("copy", "torch", 5e-6, 0.002), rows("copy", "ewkern", 5.5e-6, 0.002),
                            rows("add", "torch", 5e-6, 0.15), rows("add", "ewkern", 5.1e-6, 0.15)]}
    ci = peers.ratio_intervals(exp)
    lo, hi = ci[("single", "copy", "float32", 1 << 20)]
    assert 0.88 < lo < hi < 0.93
    lo, hi = ci[("single", "add", "float32", 1 << 20)]
    assert lo < 0.99 < hi
    assert peers.ratio_intervals(exp) == ci
    text = peers.elementwise_summary(exp)
    line = next(l for l in text.splitlines() if l.startswith("Cells below 0.99 (ewkern, single)"))
    assert line.startswith("Cells below 0.99 (ewkern, single): 2, 1 of them with the 90% bootstrap interval")
    assert "copy float32 1 MiB" in line and "add float32" not in line


def test_flush_factor_sizes_every_flush_buffer(fake, tmp_path):
    """--flush-factor N: the config's flush reads N x the cache (the torch flush buffer, ewkern's
    own), the method says so; below 1 is refused with the flag's name."""
    info = {"name": "Fake GPU", "compute_capability": (9, 0), "l2_bytes": 1 << 20, "total_memory_bytes": 8 << 30}

    def context(*argv):
        args = cli.build_parser().parse_args(["peers", "--cache-bytes", "1MiB", *argv])
        return runner.make_context(args, "cuda:0", info, tmp_path, False, "rotate").cfg
    assert context().flush_factor == 2
    c = context("--flush-factor", "4")
    c.flush_samples = 5
    assert c.flush_factor == 4
    assert frameworks._torch_flush(c, fake).numel() == 4 * (1 << 20) // 4
    t = frameworks.time_calls(c, "torch", lambda: fake.kernel("a", 1.0 * US), 1 << 12, "flush")
    assert "flush 4x cache before each sample" in t.method
    code = bench.main(["e2", "--device", "cpu", "--flush-factor", "0", "--out", str(tmp_path / "x")])
    assert code == 2


def test_flush_kind_rmse_reads_the_buffer_with_one_ewkern_rmse(tmp_path):
    """--flush-kind rmse: the torch methods' flush is one ewkern.rmse over the flush buffer's two
    halves into a preallocated result (on CPU torch tensors here), and the method says so."""
    torch = pytest.importorskip("torch")
    args = cli.build_parser().parse_args(["peers", "--flush-kind", "rmse"])
    info = {"name": "Fake GPU", "compute_capability": (9, 0), "l2_bytes": 1 << 20, "total_memory_bytes": 8 << 30}
    c = runner.make_context(args, "cuda:0", info, tmp_path, False, "rotate").cfg
    assert c.flush_kind == "rmse" and TimingConfig().flush_kind == "sum"
    buf = torch.randn(2 * 3 * 4096 + 5, dtype=torch.float32)
    f = frameworks._RmseFlush(torch, buf)
    out = f.out
    f.sum()
    assert f.out is out and f.a.shape == f.b.shape == (3, 4096)
    half = buf.numel() // 2
    want = ((buf[:3 * 4096] - buf[half:half + 3 * 4096]).view(3, 4096).double() ** 2).mean(1).sqrt()
    assert torch.allclose(f.out.double(), want, rtol=1e-5)
    assert "(one ewkern.rmse read)" in frameworks._flush_words(c, torch_path=True)
    assert "rmse" not in frameworks._flush_words(c, torch_path=False)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["peers", "--flush-kind", "memset"])


def test_flush_rounds_is_opt_in(tmp_path):
    """Single launches in turns take a fixed flush_samples unless --flush-rounds asks for rounds;
    --quick and --samples keep them fixed either way."""
    from ewkern.bench.timing import ROUNDS_TARGET
    info = {"name": "Fake GPU", "compute_capability": (9, 0), "l2_bytes": 1 << 20, "total_memory_bytes": 8 << 30}

    def target(*argv, quick=False):
        args = cli.build_parser().parse_args(["peers", *argv])
        return runner.make_context(args, "cuda:0", info, tmp_path, quick, "rotate").cfg.flush_target
    assert target() == 0.0 and TimingConfig().flush_target == 0.0
    assert target("--flush-rounds") == ROUNDS_TARGET > 0
    assert target("--flush-rounds", "--samples", "9") == 0.0
    assert target("--flush-rounds", quick=True) == 0.0


def test_single_between_mul_queues_a_torch_mul_after_each_single_launch(fake, tmp_path):
    """--single-between mul: after every single-launch sample on torch's stream (one way after
    another and in turns), one untimed torch.mul, before the next sample's flush; its buffers are
    allocated once a run; graphs (cache rotate) and the default queue nothing between samples."""
    info = {"name": "Fake GPU", "compute_capability": (9, 0), "l2_bytes": 1 << 20, "total_memory_bytes": 8 << 30}
    args = cli.build_parser().parse_args(["peers", "--cache-bytes", "1MiB", "--single-between", "mul"])
    c = runner.make_context(args, "cuda:0", info, tmp_path, False, "rotate").cfg
    assert c.single_between == "mul" and TimingConfig().single_between == "none"
    c.flush_samples = 6

    def samples_after(start):
        """the tags of the kernels run since start, cut into samples at each flush"""
        runs, cur = [], None
        for tag in fake.ran[start:]:
            if tag == "flush":
                cur = []
                runs.append(cur)
            elif cur is not None:
                cur.append(tag)
        return runs
    start = len(fake.ran)
    t = frameworks.time_calls(c, "torch", lambda: fake.kernel("a", 1.0 * US), 1 << 12, "flush")
    assert samples_after(start) == [["a", "mul"]] * 6
    assert "an untimed torch.mul of 262144 float32 after each sample" in t.method
    assert max(t.samples_s) == pytest.approx(1.0 * US)   # the fake mul (5 us) is not in the timed region
    bufs = c._flush["between"]
    start = len(fake.ran)
    tt = frameworks.time_calls_in_turns(c, [(lambda: fake.kernel("a", 1.0 * US), 1 << 12),
                                            (lambda: fake.kernel("b", 2.0 * US), 1 << 12)], "flush")
    runs = samples_after(start)
    assert len(runs) == 12 and all(len(r) == 2 and r[1] == "mul" for r in runs)
    assert sorted(r[0] for r in runs) == ["a"] * 6 + ["b"] * 6
    assert c._flush["between"] is bufs
    assert all("torch.mul" in x.method for x in tt)
    # an explicit between (the speed probe's) replaces it
    start = len(fake.ran)
    frameworks.time_calls_in_turns(c, [(lambda: fake.kernel("a", 1.0 * US), 1 << 12)], "flush",
                                   between=fake.kernel("ev", 0.0))
    assert samples_after(start) == [["a", "ev"]] * 6
    # graphs and the default: nothing between samples
    start = len(fake.ran)
    frameworks.time_calls(c, "torch", lambda: fake.kernel("a", 1.0 * US), 1 << 12, "rotate")
    assert "mul" not in fake.ran[start:]
    d = cfg(samples=4)
    start = len(fake.ran)
    t = frameworks.time_calls(d, "torch", lambda: fake.kernel("a", 1.0 * US), 1 << 12, "flush")
    assert samples_after(start) == [["a"]] * 4 and "torch.mul" not in t.method
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["peers", "--single-between", "event"])
