"""The `fused` experiment (issue 21 item 5) on the CPU: ewkern's run-time kernels (CPU backend)
against NumPy, every result checked against a float64 reference before it is timed, tiny sizes."""

import csv
import dataclasses
import json

import numpy as np
import pytest

from ewkern import bench
from ewkern.bench import f1_fused, frameworks

FAST = ["--device", "cpu", "--quick", "--samples", "3", "--min-sample-ms", "0.05", "--cache-bytes", "1MiB",
        "--no-progress", "--no-plots"]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EWKERN_CACHE_DIR", str(tmp_path / "kernels"))


def run(tmp_path, *extra, plots=False):
    out = tmp_path / "out"
    args = ["fused"] + FAST + ["--out", str(out), "--fused-sizes", "64KiB"] + list(extra)
    if plots:
        args.remove("--no-plots")
    return bench.main(args), out


def test_fused_cpu_quick_checks_and_times_every_way(tmp_path):
    code, out = run(tmp_path, "--fused-dtypes", "float32,bfloat16", plots=True)
    assert code == 0, (out / "summary.md").read_text()
    exp = bench.load(out)["experiments"]["fused"]
    assert exp["status"] == "ok", exp.get("reason")
    assert not exp["errors"]
    with open(out / "fused.csv") as f:
        rows = list(csv.DictReader(f))
    cols = set(rows[0])
    assert {"series", "impl", "op", "dtype", "in_dtypes", "out_dtype", "shape", "n", "size_bytes", "bytes_read",
            "bytes_written", "bytes", "time_s", "gbs", "launch", "method", "check_elements",
            "check_max_err_over_tol", "vs_best", "best_way", "vs_numpy", "vs_ewkern_add", "vs_ewkern_fuse"} <= cols
    # every expression in both dtypes (mixed: b bfloat16) ran through ewkern, checked first
    ours = {(r["op"], r["dtype"]): r for r in rows if r["series"] == "ewkern"}
    want = {(e, d) for e in f1_fused.EXPRS if e != "mixed" for d in ("float32", "bfloat16")} | {("mixed", "bfloat16")}
    assert set(ours) == want
    for r in rows:
        assert int(r["check_elements"]) > 0 and float(r["check_max_err_over_tol"]) <= 1.0, r
        assert float(r["time_s"]) > 0 and r["launch"] == "back-to-back"
    # NumPy is the CPU peer (gelu_mul needs scipy's erf); ewkern.add only beside add
    numpy_ops = {r["op"] for r in rows if r["series"] == "numpy"}
    assert numpy_ops >= set(f1_fused.EXPRS) - {"gelu_mul"}
    assert {r["op"] for r in rows if r["series"] == "ewkern.add"} == {"add"}
    # ewkern.fuse, checked like the others: every expression but rmsnorm, which it cannot fuse (the
    # array used after its row's reduction) and says so
    assert {r["op"] for r in rows if r["series"] == "ewkern.fuse"} == set(f1_fused.EXPRS) - {"rmsnorm"}
    assert {s["what"] for s in exp["skipped"] if "ewkern.fuse cannot fuse rmsnorm" in s["reason"]} == {
        "rmsnorm float32 64 KiB ewkern.fuse", "rmsnorm bfloat16 64 KiB ewkern.fuse"}
    assert all(r["vs_ewkern_fuse"] for r in rows if r["series"] == "ewkern" and r["op"] != "rmsnorm")
    for r in rows:
        if r["series"] == "ewkern" and r["op"] != "gelu_mul":
            assert r["best_way"] == "numpy" and float(r["vs_best"]) > 0
    # declared bytes: inputs read once, outputs written once
    n = (64 << 10) // 4
    assert int(ours[("fma", "float32")]["bytes"]) == 4 * n * 4
    assert int(ours[("mixed", "bfloat16")]["bytes"]) == n * (4 + 2 + 4) + n * 4
    rows_ = n // f1_fused.COLS
    assert int(ours[("mse_rows", "float32")]["bytes"]) == 2 * n * 4 + rows_ * 4
    assert int(ours[("rmsnorm", "bfloat16")]["bytes"]) == 2 * (64 << 10)
    text = (out / "summary.md").read_text()
    assert "of NumPy" in text and "Control z = x + y" in text
    assert ", 0 outside." in text
    assert (out / "fused_back_to_back_ratio.png").exists() and (out / "fused_back_to_back_gbs.png").exists()


def test_wrong_result_is_an_error_and_not_timed(tmp_path, monkeypatch):
    """A kernel whose result is off (a * b - c for a * b + c) is caught by the float64 check,
    recorded as an error, and not timed; the other ways still run."""
    wrong = dataclasses.replace(
        f1_fused.EXPRS["fma"],
        kernels=(("ElementwiseKernel", ("T a, T b, T c", "T o", "o = a * b - c", "fused_fma_wrong"), {}),))
    monkeypatch.setitem(f1_fused.EXPRS, "fma", wrong)
    code, out = run(tmp_path, "--fused-exprs", "fma")
    assert code == 1
    res = json.loads((out / "results.json").read_text())
    exp = res["experiments"]["fused"]
    assert [e["what"] for e in exp["errors"]] == ["fma float32 64 KiB ewkern"]
    assert exp["errors"][0]["error"].startswith("Mismatch: fma float32 64 KiB")
    assert {m["series"] for m in exp["measurements"]} == {"numpy", "ewkern.fuse"}   # fuse: its own body
    assert "1 outside (not timed): fma float32 64 KiB ewkern" in (out / "summary.md").read_text()


def _cell(name, dtype, size=1 << 14):
    return f1_fused.Cell(f1_fused.EXPRS[name], dtype, size)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_check_result_tolerance_can_fail(dtype):
    """NumPy's own a * b + c in the dtype (two roundings) passes; the same with one element moved by
    16 ulps fails, naming it."""
    cell = _cell("fma", dtype)
    dt = frameworks._numpy_dtype(dtype)
    rng = np.random.default_rng(0)
    ins = [(rng.standard_normal(cell.shape).astype(np.float32) * 2).astype(dt) for _ in range(3)]
    out = ins[0] * ins[1] + ins[2]
    sel = f1_fused._sample(cell)
    n, worst = f1_fused.check_result(cell, "numpy", ins, out, sel)
    assert n == cell.n and 0 < worst <= 1
    k = 1234
    bad = out.copy()
    a, b, c = (float(x[k]) for x in ins)
    bad[k] = np.float64(float(out[k]) + 16 * f1_fused.EPS[dtype] * (abs(a * b) + abs(c) + 1)).astype(dt)
    with pytest.raises(f1_fused.Mismatch, match=r"1 of \d+ checked elements outside the tolerance; first at "
                                                r"checked index \(1234,\)"):
        f1_fused.check_result(cell, "numpy", ins, bad, sel)
    nan = out.copy()
    nan[7] = np.nan
    with pytest.raises(f1_fused.Mismatch):
        f1_fused.check_result(cell, "numpy", ins, nan, sel)


def test_sample_covers_both_ends_and_rows():
    kind, idx = f1_fused._sample(_cell("fma", "float32", 64 << 20))
    n = (64 << 20) // 4
    assert kind == "flat" and idx[0] == 0 and idx[-1] == n - 1 and len(idx) > 2 * f1_fused.CHECK_PART
    kind, idx = f1_fused._sample(_cell("rmsnorm", "float16", 64 << 20))
    rows = (64 << 20) // 2 // f1_fused.COLS
    assert kind == "rows" and idx[0] == 0 and idx[-1] == rows - 1 and len(idx) <= 3 * f1_fused.CHECK_ROWS


@pytest.mark.parametrize("args, message", [
    (["--fused-exprs", "fma,nope"], "--fused-exprs: unknown 'nope'"),
    (["--fused-dtypes", "int8"], "--fused-dtypes: unknown 'int8'"),
    (["--fused-ways", "jax"], "--fused-ways: unknown 'jax'"),
    (["--fused-methods", "hot"], "--fused-methods: unknown 'hot'"),
])
def test_unknown_names_are_refused_before_running(tmp_path, capsys, args, message):
    assert bench.main(["fused", "--device", "cpu", "--out", str(tmp_path / "o")] + args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cells_and_bytes():
    """mixed takes the 16-bit dtypes asked as b's (float16 when none is), n from its float32 arrays;
    row expressions run whole rows of COLS."""
    cells = f1_fused._cells(["mixed", "rmsnorm"], ["float32", "bfloat16"], [1 << 20])
    assert [(c.expr.name, c.dtype) for c in cells] == [("mixed", "bfloat16"), ("rmsnorm", "float32"),
                                                       ("rmsnorm", "bfloat16")]
    m = f1_fused._cells(["mixed"], ["float32"], [1 << 20])[0]
    assert m.in_dtypes == ["float32", "float16", "float32"] and m.n == (1 << 20) // 4
    assert m.bytes_read == m.n * 10 and m.bytes_written == m.n * 4
    r = cells[1]
    assert r.shape == ((1 << 20) // 4 // f1_fused.COLS, f1_fused.COLS) and r.tmp == [((r.rows, 1), "float32")]
    assert r.set_bytes == 2 * (1 << 20) + r.rows * 4


def test_fused_in_turns_on_a_fake_gpu(tmp_path, monkeypatch):
    """--fused-in-turns on a stand-in GPU (tests/fake_torch_cuda.py): the ways on torch's stream are
    timed in turns in both methods, each record keeps its own way's cost, series and check, and
    the ratios to the other ways are made from them; without the option the same records come
    one way after another."""
    import sys
    from fake_torch_cuda import FakeTorch
    from ewkern.bench import cli, runner
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(f1_fused, "_ready", lambda ctx: fake)
    cost_us = {"ewkern": 1.0, "torch eager": 3.0, "torch.compile": 1.25}

    def prepare(ctx, xr, way, cell, kernels, shared=None):
        def make_set():
            return [], fake.kernel(way, cost_us[way] * 1e-6)
        return "torch" if way != "torch.compile" else "torch.compile", make_set, 7, 0.5

    monkeypatch.setattr(f1_fused, "_prepare", prepare)

    def reference(ctx):
        ctx.results["reference"] = {"copy_gbs": 100.0, "cache": "rotate"}
        return 100.0
    monkeypatch.setattr(runner, "_reference_copy", reference)

    def fake_run(sub, *extra):
        argv = ["fused", "--samples", "5", "--min-sample-ms", "0.05", "--cache-bytes", "1MiB", "--no-progress",
                "--no-plots", "--fused-exprs", "fma", "--fused-dtypes", "float32", "--fused-sizes", "64KiB",
                "--fused-ways", "ewkern,torch eager,torch.compile", *extra]
        args = cli.build_parser().parse_args(argv)
        info = {"name": "Fake GPU", "compute_capability": (9, 0), "l2_bytes": 1 << 20, "total_memory_bytes": 8 << 30}
        out = tmp_path / sub
        out.mkdir()
        ctx = runner.make_context(args, "cuda:0", info, out, False, "rotate")
        runner.precheck(ctx, ["fused"])
        assert runner.run(ctx, ["fused"], argv) == 0
        assert ("were timed in turns" if extra else "were timed one after another") in (out / "summary.md").read_text()
        return bench.load(out)["experiments"]["fused"]

    for sub, extra in (("turns", ["--fused-in-turns"]), ("plain", [])):
        exp = fake_run(sub, *extra)
        assert exp["status"] == "ok" and not exp["errors"] and not exp["skipped"], exp
        assert exp["params"]["in_turns"] is (sub == "turns")
        ms = exp["measurements"]
        assert {(m["series"], m["launch"]) for m in ms} == {(w, l) for w in cost_us for l in ("back-to-back", "single")}
        for m in ms:
            assert m["impl"] == m["series"] and m["check_elements"] == 7 and m["op"] == "fma"
            assert m["time_s"] == pytest.approx(cost_us[m["series"]] * 1e-6, rel=0.01)
            assert ("3 ways in turns" in m["method"]) is (sub == "turns")
        mine = [m for m in ms if m["series"] == "ewkern"]
        assert all(m["vs_torch_compile"] == pytest.approx(1.25, rel=0.02) and m["best_way"] == "torch.compile"
                   for m in mine)


def test_ways_in_turns_share_their_buffers(monkeypatch):
    """--fused-in-turns: the ways on torch tensors take their inputs, output and temporaries from
    one shared_sets, each way's k-th set the k-th set (where a set lies moved a short launch by up to
    10%); ways of their own get their own. Run on CPU torch tensors, as if they were the GPU's."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace
    monkeypatch.setattr(frameworks, "available", lambda impl, device: None)
    ctx = SimpleNamespace(device="cpu", is_gpu=True, quick=False)
    cell = f1_fused._cells(["fma"], ["float32"], [1 << 16])[0]
    kernels = f1_fused._Kernels()
    shared = f1_fused.shared_sets(ctx, cell)
    sets = {}
    for way in ("ewkern", "torch eager"):
        _, _, make_set = f1_fused._way(ctx, way, cell, kernels, shared)
        sets[way] = [make_set() for _ in range(2)]
    (e0, c0), (e1, _) = sets["ewkern"]
    (t0, d0), (t1, _) = sets["torch eager"]
    assert all(x is y for x, y in zip(e0 + e1, t0 + t1)) and e0[0] is not e1[0]
    assert torch.allclose(c0(), d0(), rtol=1e-6, atol=1e-6)
    # each measurement's fresh maker starts again at the first set: no more sets are made
    again = f1_fused._way(ctx, "ewkern", cell, kernels, shared)[2].fresh()
    assert all(x is y for x, y in zip(again()[0] + again()[0], e0 + e1)) and len(shared._sets) == 2
    _, _, own = f1_fused._way(ctx, "torch eager", cell, kernels)
    assert not any(x is y for x, y in zip(own()[0], e0))


def test_cache_hot_is_honoured_and_flush_said(tmp_path):
    """--cache hot times back-to-back calls on the same inputs, labelled hot; --cache flush leaves
    them rotating (the single method is the flushed call) and says so."""
    code, out = run(tmp_path, "--fused-exprs", "add", "--fused-ways", "ewkern,numpy", "--cache", "hot")
    assert code == 0
    exp = bench.load(out)["experiments"]["fused"]
    assert [(m["cache"], m["sets"]) for m in exp["measurements"]] == [("hot", 1)] * 2
    assert exp["params"]["caches"] == {"back-to-back": "hot"}
    assert "the same inputs every call: hot" in (out / "summary.md").read_text()
    code, out = run(tmp_path / "flush", "--fused-exprs", "add", "--fused-ways", "ewkern", "--cache", "flush")
    assert code == 0
    exp = bench.load(out)["experiments"]["fused"]
    assert [m["cache"] for m in exp["measurements"]] == ["rotate"]
    assert any(n.startswith("--cache flush: back-to-back calls rotate their inputs") for n in exp["notes"])
