"""The benchmark harness (ewkern.bench) on the CPU: CLI, outputs, errors, interrupts, claims.

Quick and small: every run uses tiny sizes, few samples and a 1 MiB "cache", so the whole file
stays well under a minute on two cores. GPU runs of the harness happen on the GPU machine.
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import ewkern
from ewkern import bench
from ewkern.bench import claims, registry
from ewkern.bench import results as bench_results


# tiny, fast settings shared by every run
FAST = ["--device", "cpu", "--quick", "--samples", "3", "--min-sample-ms", "0.05", "--cache-bytes", "1MiB",
        "--no-progress"]
TINY = {
    "e2": ["--e2-sizes", "64KiB,256KiB"],
    "e3": ["--e3-shapes", "64x64", "--e3-ops", "copy,add,log", "--e3-dtypes", "float32,bfloat16"],
    "e6": ["--e6-sizes", "64KiB"],
    "r1": ["--r1-shape", "4x32x32"],
    "a1": ["--a1-n", "2^12", "--a1-naive-n", "2^10", "--a1-configs", "256:64"],
    "v1": ["--v1-sizes", "64"],
    "peers": ["--peers-sizes", "64KiB", "--peers-ops", "copy,add", "--peers-dtypes", "float32,float16",
              "--peers-rmse-shapes", "16x1024,1024x16:last", "--peers-ref-size", "1MiB"],
    "overhead": ["--overhead-calls", "200", "--overhead-repeats", "3"],
    "c1": ["--c1-shapes", "4x256", "--c1-backend", "aot_eager"],
    "train": ["--train-ops", "gelu,mul,rmse,mlp", "--train-dtypes", "float32", "--train-sizes", "64KiB"],
}
CPU_EXPERIMENTS = ["e2", "e3", "e6", "r1", "a1", "v1", "peers", "overhead", "c1"]


def run_main(tmp_path, *names, extra=(), out=None):
    out = out or tmp_path / "out"
    args = list(names) + FAST + ["--out", str(out)] + list(extra)
    for n in names:
        args += TINY.get(n, [])
    code = bench.main(args)
    return code, out


# the folder this test imported ewkern from, first on the child's path
PKG_ROOT = str(Path(ewkern.__file__).resolve().parents[1])


def child_env():
    return dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_cli(*args, timeout=120, cwd=None):
    return subprocess.run([sys.executable, "-m", "ewkern.bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=cwd or PKG_ROOT)


def test_list_names_every_experiment():
    r = run_cli("list")
    assert r.returncode == 0, r.stderr
    names = ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9", "v1", "r1", "a1", "peers", "rmse_grid", "overhead",
             "c1", "train", "fused"]
    for name in names:
        assert f"  {name} " in r.stdout
    assert "[GPU only]" in r.stdout
    assert len(r.stdout.strip().splitlines()) == 1 + len(names)   # header + one line each


def test_unknown_experiment_lists_the_valid_ones(capsys):
    assert bench.main(["e2", "nope", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "unknown experiment: nope" in err
    assert "e1, e2, e3" in err and "overhead" in err


def test_nothing_to_run_is_an_error(capsys):
    assert bench.main(["--device", "cpu"]) == 2
    assert "--all" in capsys.readouterr().err


@pytest.mark.skipif(ewkern.cuda_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_gpu(device, tmp_path, capsys):
    assert bench.main(["e2", "--device", device, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "--device cpu" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not ewkern.cuda_available(), reason="needs a GPU")
def test_cuda_device_that_does_not_exist(tmp_path, capsys):
    assert bench.main(["e2", "--device", f"cuda:{ewkern.device_count()}", "--out", str(tmp_path / "o")]) == 2
    assert "no such CUDA device" in capsys.readouterr().err


def test_bad_device_string(capsys):
    assert bench.main(["e2", "--device", "tpu"]) == 2
    assert "expected cpu, cuda or cuda:N" in capsys.readouterr().err


def test_unwritable_out(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert bench.main(["e2", "--device", "cpu", "--out", str(blocker / "sub")]) == 2
    assert "cannot write there" in capsys.readouterr().err


def test_size_too_large_is_refused_before_allocating(tmp_path, capsys):
    code = bench.main(["e2", "--device", "cpu", "--e2-sizes", "1MiB,64TiB", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "e2's largest copy" in err and "can be allocated on cpu" in err
    assert not (tmp_path / "o").exists()


def test_bad_size_text(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["e2", "--device", "cpu", "--e2-sizes", "lots"])
    assert e.value.code == 2
    assert "not a byte size" in capsys.readouterr().err


@pytest.mark.parametrize("name", CPU_EXPERIMENTS)
def test_cpu_experiment_writes_outputs(name, tmp_path):
    code, out = run_main(tmp_path, name)
    assert code == 0, (out / "summary.md").read_text()
    res = json.loads((out / "results.json").read_text())
    exp = res["experiments"][name]
    assert res["partial"] is False and res["cache"] == "rotate"
    assert res["device"] == "cpu" and res["conventions"]["bandwidth"]
    assert (out / "summary.md").exists()
    if exp["status"] == "skipped":      # e.g. CUDA-only kernel variants on a CPU build
        assert exp["reason"]
        return
    assert exp["status"] == "ok", exp
    assert not exp["errors"], exp["errors"]
    ms = exp["measurements"]
    assert ms
    for m in ms:
        assert m["stats_s"]["count"] == len(m["samples_s"]) >= 3
        assert m["stats_s"]["min"] <= m["stats_s"]["median"] <= m["stats_s"]["max"]
        assert m["time_s"] == m["stats_s"]["median"]
        assert m["cache"]
    assert (out / f"{name}.csv").exists()
    header = (out / f"{name}.csv").read_text().splitlines()[0]
    assert "t_median_s" in header
    assert list(out.glob(f"{name}*.png")) or list(out.glob("overhead.png"))
    assert res["figures"]


def test_c1_compiles_ewkern_rmse_into_the_graph(tmp_path):
    """c1 on the CPU (aot_eager: the same graphs, no code generation): every way of every function
    measured, one graph without breaks that holds ewkern.rmse, results as the float64 reference."""
    pytest.importorskip("torch")
    code, out = run_main(tmp_path, "c1")
    assert code == 0, (out / "summary.md").read_text()
    exp = bench.load(out)["experiments"]["c1"]
    assert exp["status"] == "ok" and exp["params"]["backend"] == "aot_eager"
    ways = {(m["function"], m["series"]) for m in exp["measurements"]}
    assert ways == {(f, w) for f in ("rmse", "scaled rmse") for w in
                    ("torch eager", "torch.compile", "ewkern.torch eager", "compile + ewkern")}
    assert all(m["max_rel_err"] < 1e-5 and m["bytes"] == 2 * 1024 * 4 + 4 * 4 for m in exp["measurements"])
    for row in exp["tables"]["graph_breaks"]:
        assert row["graph_count"] == 1 and row["graph_breaks"] == 0 and row["ewkern_ops"] == ["ewkern.rmse.default"]
    assert "| compile + ewkern GB/s |" in (out / "summary.md").read_text()


@pytest.mark.parametrize("in_turns", [False, True])
def test_train_times_forward_and_backward(tmp_path, in_turns):
    """train on the CPU: every way of every op (torch.compile is GPU only) and the MLP step measured,
    the declared bytes of one forward + backward, and a summary with the ratio to torch eager; with
    ways in turns (the default; on a CPU each way is timed alone: time_calls_in_turns) or not, the
    same records."""
    pytest.importorskip("torch")
    from ewkern.bench import t1_train
    steps = []   # (the way's function, its first input), inputs kept alive so none is a later one's
    step = t1_train._step

    def spy(torch, fn, ins, scalars, g):
        steps.append((fn, ins[0]))
        return step(torch, fn, ins, scalars, g)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(t1_train, "_step", spy)
        code, out = run_main(tmp_path, "train", extra=[] if in_turns else ["--no-train-in-turns"])
    assert code == 0, (out / "summary.md").read_text()
    # in turns both ways' k-th steps take the same inputs (frameworks.SharedSets); else each its own
    users = []
    for fn, x in steps:
        for u in users:
            if u[0] is x:
                u[1].add(fn)
                break
        else:
            users.append((x, {fn}))
    assert users and all(len(fns) == (2 if in_turns else 1) for _, fns in users)
    exp = bench.load(out)["experiments"]["train"]
    assert exp["status"] == "ok", exp.get("reason")
    assert exp["params"]["in_turns"] is in_turns
    got = {(m["op"], m["series"]) for m in exp["measurements"]}
    want = {(op, w) for op in ("gelu", "mul", "rmse", "mlp") for w in ("ewkern.torch", "torch eager")}
    assert got == want
    n = (64 << 10) // 4
    by = {m["op"]: m["bytes"] for m in exp["measurements"] if m["series"] == "ewkern.torch"}
    assert by["gelu"] == (2 + 3) * n * 4 and by["mul"] == (3 + 5) * n * 4 and by["rmse"] == 6 * n * 4
    assert all(m["time_s"] > 0 for m in exp["measurements"])
    assert "below 0.99 of torch eager" in (out / "summary.md").read_text()
    assert ("A cell's ways were timed in turns" if in_turns else "A cell's ways were timed one after another") \
        in (out / "summary.md").read_text()


def test_c1_skips_cleanly_without_torch(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)     # `import torch` raises ImportError
    code, out = run_main(tmp_path, "c1")
    exp = bench.load(out)["experiments"]["c1"]
    assert code == 0 and exp["status"] == "skipped" and "torch is not installed" in exp["reason"]


def test_bandwidth_follows_the_declared_bytes(tmp_path):
    code, out = run_main(tmp_path, "e3")
    assert code == 0
    res = bench.load(out)
    for m in bench.measurements(res, "e3"):
        n, s = m["n"], {"float32": 4, "bfloat16": 2}[m["dtype"]]
        want = {"copy": 2, "add": 3, "log": 2}[m["op"]] * n * s
        assert m["bytes"] == want
        assert m["gbs"] == pytest.approx(want / m["time_s"] / 1e9)
    assert {m["cache"] for m in bench.measurements(res, "e3")} == {"hot", "rotate"}


@pytest.mark.parametrize("cache", ["hot", "flush"])
def test_cache_modes_are_named(cache, tmp_path):
    code, out = run_main(tmp_path, "e2", extra=["--cache", cache])
    assert code == 0
    res = bench.load(out)
    assert res["cache"] == cache
    modes = {m["cache"] for m in bench.measurements(res, "e2")}
    assert modes == ({"hot"} if cache == "hot" else {"hot", "flush"})
    if cache == "flush":
        assert all(m["launches"] == 1 for m in bench.measurements(res, "e2", cache="flush"))
    assert f"| cache mode | {cache} |" in (out / "summary.md").read_text()


def test_rotate_uses_a_working_set_of_four_caches(tmp_path):
    code, out = run_main(tmp_path, "e2")
    res = bench.load(out)
    for m in bench.measurements(res, "e2", cache="rotate"):
        assert m["working_set_bytes"] >= 4 * (1 << 20)
        assert m["sets"] >= 2 and m["sets"] * m["size_bytes"] * 2 == m["working_set_bytes"]


def test_gpu_only_experiments_say_why_on_cpu(tmp_path):
    code, out = run_main(tmp_path, "e1", "e4", "e5", "e7", "e9")
    assert code == 0
    res = bench.load(out)
    for name in ["e1", "e4", "e5", "e7", "e9"]:
        exp = res["experiments"][name]
        assert exp["status"] == "skipped" and exp["reason"], name
    assert "**skipped**" in (out / "summary.md").read_text()


def test_module_entry_point_runs(tmp_path):
    out = tmp_path / "cli"
    r = run_cli("e2", *FAST, "--out", str(out), *TINY["e2"])
    assert r.returncode == 0, r.stderr
    assert "# ewkern.bench" in r.stdout and "| size |" in r.stdout
    assert (out / "results.json").exists() and (out / "e2_copy_size.png").exists()


def test_interrupt_writes_partial_results(tmp_path, monkeypatch):
    spec = registry.get("e3")
    real_run = spec.module.run

    def interrupted(ctx, xr):
        ctx.args.e3_ops = ["copy"]
        real_run(ctx, xr)     # some measurements land, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(spec.module, "run", interrupted)
    code, out = run_main(tmp_path, "e2", "e3", "r1")
    assert code == 130
    res = bench.load(out)
    assert res["partial"] is True and res["interrupted"] is True
    assert res["experiments"]["e2"]["status"] == "ok"
    assert res["experiments"]["e3"]["status"] == "interrupted"
    assert res["experiments"]["e3"]["measurements"]
    assert "r1" not in res["experiments"]
    assert "PARTIAL" in (out / "summary.md").read_text()
    assert (out / "e2.csv").exists() and (out / "e3.csv").exists()


def test_interrupt_from_the_shell_exits_130(tmp_path):
    """A real SIGINT to a running `python -m ewkern.bench` leaves partial results. The experiment
    interrupted is e3 (ewkern's own C calls): overhead, interrupted here before, builds torch
    custom ops in its setup, and a SIGINT inside torch's pybind11 registration aborts the process
    (std::terminate on pybind11::error_already_set, seen once in CI), which no Python code can
    catch."""
    import signal
    import time
    out = tmp_path / "sig"
    env = child_env()
    p = subprocess.Popen([sys.executable, "-m", "ewkern.bench", "e2", "e3", "--device", "cpu",
                          "--no-progress", "--cache-bytes", "1MiB", "--out", str(out), "--e2-sizes", "64KiB",
                          "--samples", "3", "--e3-shapes", "2048x3072,4096x3072,8192x3072",
                          "--e3-ops", "copy,add,log,erf,exp", "--e3-dtypes", "float32,bfloat16"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=PKG_ROOT,
                         # a shell starts background jobs with SIGINT ignored, and Python then never
                         # raises KeyboardInterrupt: give the child the default disposition
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline:   # wait until e2's results are written, then interrupt e3
        try:
            if json.loads((out / "results.json").read_text())["experiments"]["e2"]["status"] == "ok":
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr
    res = bench.load(out)
    assert res["interrupted"] is True
    assert res["experiments"]["e2"]["status"] == "ok"
    # e3 cut short, unless a fast host finished it and the signal came while the figures were drawn
    assert res["partial"] is True or (res["experiments"]["e3"]["status"] == "ok" and res["figures"] == [])


def test_interrupt_while_plotting_keeps_the_tables(tmp_path, monkeypatch):
    """An interrupt that lands after the last experiment, in the seconds the figures take (seen on
    a 16-core GPU host, where e3 finished before the shell test's SIGINT), still exits 130 and
    writes results.json, the CSVs and summary.md, without figures."""
    def interrupted(res, out):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench.plots, "save_all", interrupted)
    code, out = run_main(tmp_path, "e2")
    assert code == 130
    res = bench.load(out)
    assert res["interrupted"] is True and res["figures"] == []
    assert res["experiments"]["e2"]["status"] == "ok"
    assert (out / "e2.csv").stat().st_size > 0 and (out / "summary.md").exists()
    assert not list(out.glob("*.png"))


def test_load_and_plot_committed_results(tmp_path):
    code, out = run_main(tmp_path, "e2", "peers")
    res = bench.load(out)
    assert res["_path"] == str(out)
    assert bench.load(out / "results.json")["device"] == "cpu"
    figs = bench.plots.figures(res, "e2")
    assert figs and figs[0][0] == "e2_copy_size"
    title = figs[0][1].axes[0].get_title()
    assert "bandwidth" in title
    assert figs[0][1].axes[0].get_xscale() == "log"
    labels = [line.get_label() for line in figs[0][1].axes[0].get_lines()]
    assert any(lbl.startswith("measured copy") for lbl in labels)
    (tmp_path / "replot").mkdir()
    written = bench.plots.save_all(res, tmp_path / "replot")
    assert "e2_copy_size.png" in written
    assert bench.summary.markdown(res).startswith("# ewkern.bench")
    with pytest.raises(FileNotFoundError):
        bench.load(tmp_path / "nowhere")


# --- claims on synthetic results ---------------------------------------------------------------

def _m(exp, gbs, **kw):
    t = 1e-3
    return {"experiment": exp, "gbs": gbs, "time_s": kw.pop("time_s", t), "impl": "ewkern", **kw}


def synthetic_results(good=True):
    a1 = []
    for idx in "IS":
        for v in (1, 2, 4):
            for u in (1, 2, 4):
                base = 200 + 5 * v + 3 * u if good else 260 - 5 * v - 3 * u
                bonus = (2 if idx == "I" else 0) if good else (0 if idx == "I" else 2)
                a1.append(_m("a1", base + bonus, series="cfg", variant=f"ThreadBlock{idx}V{v}U{u}MRgs",
                             a1_family="threadblock", a1_index=idx, a1_vec=v, a1_unroll=u, a1_style="M",
                             a1_pointers="R", a1_traversal="gs"))
        for ptr in "CR":
            a1.append(_m("a1", (0.5 if ptr == "R" else 0.2) if good else (0.2 if ptr == "R" else 0.5),
                         series="naive", variant=f"Naive{idx}V1U1N{ptr}", a1_family="naive", a1_index=idx,
                         a1_vec=1, a1_unroll=1, a1_style="N", a1_pointers=ptr, a1_traversal=None))
    e5 = []
    for size in (1 << 22, 1 << 26, 1 << 30):
        e5.append(_m("e5", 3000 if good else 2000, op="copy", size_bytes=size, grid_choice=1))
        e5.append(_m("e5", 2500, op="copy", size_bytes=size, grid_choice=2))
    e2 = [_m("e2", 5000 if good else 2000, cache="hot", op="copy", dtype="float32", size_bytes=4 << 20,
             bytes=8 << 20),
          _m("e2", 2500, cache="rotate", op="copy", dtype="float32", size_bytes=4 << 20, bytes=8 << 20)]
    r1 = [_m("r1", 10, variant="atomic", time_s=20e-3), _m("r1", 100, variant="block", time_s=(1e-3 if good else 4e-3)),
          _m("r1", 500, variant="auto", time_s=0.5e-3)]
    e8 = {"loops": [{"kernel": "copy_vec1_i32", "index_bits": 32, "vec": 1, "instructions": 9},
                    {"kernel": "copy_vec1_i64", "index_bits": 64, "vec": 1, "instructions": 14}]}
    exps = {name: {"measurements": ms, "tables": {}} for name, ms in
            (("a1", a1), ("e5", e5), ("e2", e2), ("r1", r1))}
    exps["e8"] = {"measurements": [], "tables": e8}
    return {"peak_gbs": 3352.0, "device_info": {"l2_bytes": 50 << 20}, "experiments": exps}


def test_claims_hold_on_good_synthetic_results():
    rows = claims.evaluate(synthetic_results(good=True))
    assert [r["key"] for r in rows] == [k for k, _, _ in claims.CLAIMS]
    status = {r["key"]: r["status"] for r in rows}
    assert set(status.values()) == {"holds"}, rows
    by = {r["key"]: r for r in rows}
    assert by["atomic_rmse"]["numbers"]["ratio"] == pytest.approx(20.0)
    assert "9 instructions (32-bit index) vs 14" in by["int_index"]["evidence"]
    assert by["over_peak"]["numbers"]["best_hot_gbs"] == 5000


def test_claims_fail_on_bad_synthetic_results():
    rows = claims.evaluate(synthetic_results(good=False))
    status = {r["key"]: r["status"] for r in rows}
    assert set(status.values()) == {"does not hold"}, rows


def test_claims_not_measured_on_empty_results():
    rows = claims.evaluate({"experiments": {}})
    assert len(rows) == len(claims.CLAIMS)
    assert all(r["status"] == "not measured" and r["evidence"] for r in rows)


def test_claims_survive_malformed_results():
    res = synthetic_results()
    res["experiments"]["r1"]["measurements"] = [{"gbs": 1.0, "variant": "atomic"}, {"gbs": 1.0, "variant": "block"}]
    rows = claims.evaluate(res)
    by = {r["key"]: r for r in rows}
    assert by["atomic_rmse"]["status"] == "not measured"
    assert by["restrict"]["status"] == "holds"


def test_units():
    from ewkern.bench.units import fmt_bytes, fmt_count, parse_bytes, parse_count, parse_shape
    assert parse_bytes("4MiB") == 4 << 20 and parse_bytes("1 GiB") == 1 << 30 and parse_bytes("2^20") == 1 << 20
    assert parse_count("3*2^20") == 3 << 20 and parse_count("2**27") == 1 << 27
    assert parse_shape("16x2^20") == (16, 1 << 20)
    assert fmt_bytes(3 << 29) == "1.5 GiB" and fmt_count(3 << 20) == "3*2^20"
    with pytest.raises(ValueError):
        parse_bytes("12 parsecs")


def test_variant_names_are_read_by_feature():
    from ewkern.bench.catalog import a1_parse, copy_features
    assert a1_parse("ThreadBlockIV4U4MRgs") == {"family": "threadblock", "index": "I", "vec": 4, "unroll": 4,
                                                "style": "M", "pointers": "R", "traversal": "gs"}
    assert a1_parse("NaiveSV2U1TC")["traversal"] is None and a1_parse("auto") is None
    assert copy_features("vec4_i64_grid2") == {"vec": 4, "index_bits": 64, "grid": 2}
    assert copy_features("grid1") == {"vec": None, "index_bits": None, "grid": 1}


SASS = """
        Function : _Z9copy_vec1PKfPfj
        /*0070*/                   HFMA2.MMA R5, -RZ, RZ, 0, 2.3841e-07 ;
        /*0080*/                   IMAD.WIDE R2, R0, R5, c[0x0][0x160] ;
        /*0090*/                   LDG.E R3, [R2.64] ;
        /*00a0*/                   IMAD.WIDE R4, R0, R5, c[0x0][0x168] ;
        /*00b0*/                   MOV R7, c[0x0][0x0] ;
        /*00c0*/                   IMAD R0, R7, c[0x0][0xc], R0 ;
        /*00d0*/                   ISETP.GE.AND P0, PT, R0, c[0x0][0x170], PT ;
        /*00e0*/                   STG.E [R4.64], R3 ;
        /*00f0*/               @!P0 BRA 0x70 ;
        /*0100*/                   EXIT ;
        Function : _Z9copy_vec4PKfPfj
.L_x_0:
        /*0070*/                   LDG.E.128 R4, [R4.64] ;
        /*0080*/                   STG.E.128 [R2.64], R4 ;
        /*0090*/                   IADD3 R0, R0, 0x1, RZ ;
        /*00a0*/               @!P0 BRA `(.L_x_0) ;
"""


def test_sass_loop_counting():
    from ewkern.bench.e8_sass import loop_stats, parse_functions
    funcs = parse_functions(SASS)
    assert list(funcs) == ["_Z9copy_vec1PKfPfj", "_Z9copy_vec4PKfPfj"]
    one = loop_stats(funcs["_Z9copy_vec1PKfPfj"])
    assert one["instructions"] == 9 and one["load_bytes"] == 4 and one["store_bytes"] == 4   # the paper's 9
    four = loop_stats(funcs["_Z9copy_vec4PKfPfj"])
    assert four["instructions"] == 4 and four["load_bytes"] == 16 and four["load_ops"] == ["LDG.E.128"]


def test_merge_runs_made_in_parts(tmp_path, capsys):
    """Two runs on one device merge into one folder with both experiments, each part's metadata,
    and claims, CSVs, figures and summary made again; runs from different devices are refused."""
    from ewkern.bench import merge
    code1, p1 = run_main(tmp_path, "e2", out=tmp_path / "p1")
    code2, p2 = run_main(tmp_path, "overhead", out=tmp_path / "p2")
    assert code1 == 0 and code2 == 0
    assert merge.main([str(tmp_path / "m"), str(p1), str(p2)]) == 0
    m = tmp_path / "m"
    res = json.loads((m / "results.json").read_text())
    assert set(res["experiments"]) == {"e2", "overhead"}
    assert [p["experiments"] for p in res["parts"]] == [["e2"], ["overhead"]]
    assert res["claims"] and res["figures"]
    assert (m / "e2.csv").exists() and (m / "overhead.csv").exists() and (m / "summary.md").exists()
    again = merge.merge([bench_results.load(p1), bench_results.load(p1)])
    assert any("replaces" in n for n in again["notes"])
    other = bench_results.load(p2)
    other["device_name"] = "another GPU"
    with pytest.raises(ValueError, match="different devices"):
        merge.merge([bench_results.load(p1), other])
    # a merged folder merged again keeps its parts; a part whose experiments were all replaced goes
    code3, p3 = run_main(tmp_path, "e2", out=tmp_path / "p3")
    assert code3 == 0 and merge.main([str(tmp_path / "m3"), str(m), str(p3), "--no-plots"]) == 0
    parts = json.loads((tmp_path / "m3" / "results.json").read_text())["parts"]
    assert [(p["folder"], p["experiments"]) for p in parts] == [(str(p2), ["overhead"]), (str(p3), ["e2"])]
    capsys.readouterr()
    assert merge.main([str(tmp_path / "m2"), str(tmp_path / "absent")]) == 2
    assert "no results.json" in capsys.readouterr().err


def test_results_json_gz_is_read_and_kept_and_merge_gzip_writes_it(tmp_path):
    """The committed folders keep results.json.gz: load() reads it (and a folder with results.json
    too), write_json keeps a folder's gzip form and leaves one file, merge --gzip writes that form
    and so does a merge of a gzip folder with a plain run; the notebooks' find_runs finds gzip
    folders; the bytes do not depend on the time written."""
    import gzip
    from ewkern.bench import merge, notebook
    code, p1 = run_main(tmp_path, "e2", out=tmp_path / "p1")
    assert code == 0 and (p1 / "results.json").is_file()
    plain = bench_results.load(p1)
    assert "_gzip" not in plain
    assert merge.main([str(tmp_path / "gpu" / "m"), str(p1), "--gzip", "--no-plots"]) == 0
    m = tmp_path / "gpu" / "m"
    assert (m / "results.json.gz").is_file() and not (m / "results.json").exists()
    res = json.loads(gzip.decompress((m / "results.json.gz").read_bytes()))
    assert res["experiments"]["e2"]["measurements"] == plain["experiments"]["e2"]["measurements"]
    again = bench_results.load(m)
    assert again["_gzip"] and again["experiments"]["e2"] == res["experiments"]["e2"]
    assert bench_results.results_file(m).name == "results.json.gz"
    first = (m / "results.json.gz").read_bytes()
    bench_results.write_json(again, m)           # the same results, written again: the same bytes
    assert (m / "results.json.gz").read_bytes() == first and not (m / "results.json").exists()
    # a gzip folder merged with a plain run stays gzip, without --gzip
    code2, p2 = run_main(tmp_path, "overhead", out=tmp_path / "p2")
    assert code2 == 0 and merge.main([str(tmp_path / "gpu" / "m2"), str(m), str(p2), "--no-plots"]) == 0
    m2 = tmp_path / "gpu" / "m2"
    assert bench_results.results_file(m2).name == "results.json.gz"
    assert set(bench_results.load(m2)["experiments"]) == {"e2", "overhead"}
    # write_json of a plain dict into a gzip folder keeps the gzip form
    bench_results.write_json(plain, m2)
    assert (m2 / "results.json.gz").is_file() and not (m2 / "results.json").exists()
    found = notebook.find_runs(root=tmp_path / "gpu")
    assert set(found.values()) <= {m, m2} and found
    assert bench_results.results_file(tmp_path) is None


def test_merge_combines_an_experiment_run_in_parts(tmp_path):
    """--combine joins one experiment's measurements from two parts instead of the later
    replacing the earlier; a cell measured in both parts keeps the later part's measurement."""
    from ewkern.bench import merge
    code1, p1 = run_main(tmp_path, "e2", out=tmp_path / "p1")
    code2, p2 = run_main(tmp_path, "e2", out=tmp_path / "p2")
    assert code1 == 0 and code2 == 0
    n1, n2 = (len(bench_results.load(p)["experiments"]["e2"]["measurements"]) for p in (p1, p2))
    assert merge.main([str(tmp_path / "m"), str(p1), str(p2), "--combine", "e2", "--no-plots"]) == 0
    res = json.loads((tmp_path / "m" / "results.json").read_text())
    e2 = res["experiments"]["e2"]
    assert len(e2["measurements"]) == n2 == n1 and e2["status"] == "ok"   # the same cells, re-measured
    assert any("combined" in n for n in res["notes"])
    a, b = bench_results.load(p1), bench_results.load(p2)
    first = a["experiments"]["e2"]["measurements"]
    for m in first:
        m["time_s"] = -1.0                        # marks the earlier part's measurements
    kept = b["experiments"]["e2"]["measurements"][1:]
    b["experiments"]["e2"]["measurements"] = kept
    got = merge.merge([a, b], combine=["e2"])["experiments"]["e2"]["measurements"]
    assert len(got) == n1 and got[0] is first[0] and got[1:] == kept   # only the cell not re-run is kept
    d = bench_results.load(p2)
    for m in d["experiments"]["e2"]["measurements"]:
        m["vs_torch"], m["check_max_err"] = 0.5, 0.1   # what a run derives does not name a cell
        m["pair_time_s"], m["foreign_time_s"] = 3e-6, 1e-6   # nor after_torch's graph medians
    assert len(merge.merge([a, d], combine=["e2"])["experiments"]["e2"]["measurements"]) == n1
    c = bench_results.load(p2)
    for m in c["experiments"]["e2"]["measurements"]:
        m["size_bytes"] = m["size_bytes"] + 1      # other cells: joined
    assert len(merge.merge([a, c], combine=["e2"])["experiments"]["e2"]["measurements"]) == n1 + n2


def _one_cell_run(path, samples, **extra):
    """A results dict as results.load gives it: one train cell measured with these samples."""
    t = statistics.median(samples)
    rec = {"experiment": "train", "series": "ewkern.torch", "op": "copy", "dtype": "float32",
           "size_bytes": 1 << 20, "method": f"CUDA events ({path})", "step_method": "single", "bytes": 2 << 20,
           "launches": 1, "samples_s": list(samples), "time_s": t, "gbs": (2 << 20) / t / 1e9, "pct_peak": 50.0,
           "notes": f"from {path}; late", **extra}
    return {"device_name": "GPU", "_path": path, "experiments": {
        "train": {"status": "ok", "measurements": [rec], "params": {}},
        "fused": {"status": "ok", "measurements": [], "params": {}}}}


def test_merge_pools_a_cell_across_runs():
    """--pool reads a cell measured in several runs (processes) across them: each run's samples at
    equal weight whatever its count, so the median lies between the runs' medians; GB/s and % of
    peak follow the new median, after_torch's pair and foreign samples and times too; each run's
    own samples are kept; fused's ratios to the other ways, made as it measures, are made again."""
    from ewkern.bench import merge
    import numpy as np
    rng = np.random.default_rng(3)
    runs = [list(1.00e-6 + 0.02e-6 * rng.standard_normal(100)), list(1.10e-6 + 0.02e-6 * rng.standard_normal(4000)),
            list(1.04e-6 + 0.02e-6 * rng.standard_normal(50))]
    parts = [_one_cell_run(f"p{i}", r) for i, r in enumerate(runs)]
    got = merge.merge(parts, pool=["train"])["experiments"]["train"]["measurements"]
    assert len(got) == 1
    m = got[0]
    assert len(m["samples_s"]) == 3 * 50 and m["time_s"] == statistics.median(m["samples_s"])
    assert m["stats_s"]["count"] == 150 and [len(x) for x in m["pooled_runs_samples_s"]["samples_s"]] == [100, 4000, 50]
    medians = sorted(statistics.median(r) for r in runs)
    assert medians[0] < m["time_s"] < medians[-1] and m["time_s"] == pytest.approx(1.04e-6, rel=0.02)
    pooled_all = statistics.median(runs[0] + runs[1] + runs[2])
    assert pooled_all > 1.09e-6                      # all samples together: the longest run decides
    assert m["gbs"] == pytest.approx((2 << 20) / m["time_s"] / 1e9)
    assert m["pct_peak"] == pytest.approx(50.0 * parts[2]["experiments"]["train"]["measurements"][0]["time_s"]
                                          / m["time_s"])
    # every run's notes once; a method text that differs by process does not split the cell
    assert m["notes"].startswith("from p0; late; from p1; from p2; read across 3 runs")
    # replaced without --pool; --combine keys cells by the method text too
    assert merge.merge(parts)["experiments"]["train"]["measurements"][0]["samples_s"] == runs[2]
    assert len(merge.merge(parts, combine=["train"])["experiments"]["train"]["measurements"]) == 3
    # runs timed in turns and one after another, combined: the summary says both
    from ewkern.bench.common import how_timed
    for i, t in enumerate((False, True, True)):
        parts[i]["experiments"]["train"]["params"] = {"in_turns": t}
    assert merge.merge(parts[1:], combine=["train"])["experiments"]["train"]["params"]["in_turns"] is True
    mixed = merge.merge(parts, combine=["train"])["experiments"]["train"]
    assert mixed["params"]["in_turns"] == "partly"
    assert "in some of the merged runs and one after another in the others" in how_timed(mixed, [], "Ways")
    assert merge.merge(parts[::-1], combine=["train"])["experiments"]["train"]["params"]["in_turns"] == "partly"
    parts[0]["experiments"]["train"]["params"] = {}          # a run older than the parameter
    assert merge.merge(parts, combine=["train"])["experiments"]["train"]["params"]["in_turns"] == "partly"
    assert "in_turns" not in merge.merge(parts[:1] * 2, combine=["train"])["experiments"]["train"]["params"]
    with pytest.raises(ValueError, match="not e2"):
        merge.merge(parts, pool=["e2"])
    # after a torch kernel: the pairs and the foreign calls alone are read across runs alike
    after = [_one_cell_run(f"q{i}", [p - f for p, f in zip(pr, fr)], pair_samples_s=pr, foreign_samples_s=fr,
                           pair_time_s=statistics.median(pr), foreign_time_s=statistics.median(fr))
             for i, (pr, fr) in enumerate([([3.0, 3.2, 3.1], [2.0, 2.0, 2.1]), ([3.5, 3.6, 3.4, 3.5], [2.2, 2.2, 2.3, 2.2])])]
    m = merge.merge(after, pool=["train"])["experiments"]["train"]["measurements"][0]
    assert len(m["pair_samples_s"]) == len(m["foreign_samples_s"]) == len(m["samples_s"]) == 6
    assert m["pair_time_s"] == statistics.median(m["pair_samples_s"]) and 3.1 < m["pair_time_s"] < 3.5
    assert m["foreign_time_s"] == statistics.median(m["foreign_samples_s"])
    # fused: each run's ewkern record carries vs_* from that run; pooled, from the pooled times
    def fused_run(path, mine, theirs):
        def rec(series, xs, **kw):
            return {"experiment": "fused", "series": series, "impl": series, "op": "fma", "dtype": "float32",
                    "in_dtypes": "float32,float32,float32", "size_bytes": 1 << 20, "launch": "single",
                    "samples_s": xs, "time_s": statistics.median(xs), "notes": "", **kw}
        tm, tt = statistics.median(mine), statistics.median(theirs)
        return {"device_name": "GPU", "_path": path, "experiments": {"fused": {"status": "ok", "params": {},
                "measurements": [rec("ewkern", mine, vs_torch_compile=tt / tm, vs_best=tt / tm,
                                     best_way="torch.compile"), rec("torch.compile", theirs)]}}}
    fused = merge.merge([fused_run("f1", [1.0, 1.0, 1.0], [1.1, 1.1, 1.1]), fused_run("f2", [2.0, 2.0], [1.0, 1.0])],
                        pool=["fused"])["experiments"]["fused"]["measurements"]
    mine = next(m for m in fused if m["series"] == "ewkern")
    theirs = next(m for m in fused if m["series"] == "torch.compile")
    assert mine["time_s"] == 1.5 and theirs["time_s"] == pytest.approx(1.05)
    assert mine["vs_torch_compile"] == pytest.approx(1.05 / 1.5) and mine["vs_best"] == pytest.approx(1.05 / 1.5)


def test_processes_run_the_command_in_each_and_read_the_cells_across_them(tmp_path):
    """--processes 2: the experiment runs in two fresh processes (out/process-1, -2) and out holds
    every cell read across both (merge --pool), with both runs among its parts; --processes 0 is
    refused before running."""
    out = tmp_path / "out"
    tiny = ["--peers-sizes", "64KiB", "--peers-ops", "copy", "--peers-dtypes", "float32", "--peers-rmse-shapes", "",
            "--peers-ref-size", "1MiB"]
    # an abbreviation of --processes: the children still run once each (each gets --processes 1)
    r = run_cli("peers", *FAST, *tiny, "--process", "2", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("process")) == ["process-1", "process-2"]
    assert not (out / "process-1" / "process-1").exists()
    one = bench_results.load(out / "process-1")
    res = bench_results.load(out)
    ms = [m for m in res["experiments"]["peers"]["measurements"] if m.get("samples_s")]
    assert len(ms) == len([m for m in one["experiments"]["peers"]["measurements"] if m.get("samples_s")]) > 0
    assert all("read across 2 runs" in m["notes"] and len(m["pooled_runs_samples_s"]["samples_s"]) == 2 for m in ms)
    assert [p["folder"] for p in res["parts"]] == [str(out / "process-1"), str(out / "process-2")]
    assert "--process" in res["argv"] and one["argv"][-4:-1] == ["--processes", "1", "--out"]
    assert (out / "summary.md").exists() and (out / "peers.csv").exists()
    r = run_cli("e2", *FAST, "--processes", "0", "--out", str(tmp_path / "no"))
    assert r.returncode == 2 and "--processes must be at least 1" in r.stderr
    r = run_cli("e2", *FAST, "--processes", "2", "--out", str(tmp_path / "no2"))
    assert r.returncode == 2 and "not e2" in r.stderr


def test_peers_rotates_the_order_of_a_cells_series(tmp_path):
    """The series of an elementwise cell are timed in an order that rotates by one from cell to
    cell, so no implementation is always the first after the cells before (on a GPU the first
    series after 1-2 GiB copies ran 15% slow now and then)."""
    code, out = run_main(tmp_path, "peers")
    assert code == 0
    ms = [m for m in json.loads((out / "results.json").read_text())["experiments"]["peers"]["measurements"]
          if not m.get("reference") and m.get("op") != "rmse"]
    cells = []
    for m in ms:   # consecutive rows of one (op, dtype, size, method) make a cell, in timing order
        key = (m["op"], m["dtype"], m["size_bytes"], m.get("timing_method"))
        if not cells or cells[-1][0] != key:
            cells.append((key, []))
        cells[-1][1].append(m["impl"])
    impls = sorted(set(cells[0][1]))
    assert len(cells) >= 3 and len(impls) >= 2
    firsts = [c[1][0] for c in cells]
    assert set(firsts) == set(impls), firsts                       # each series leads some cell
    assert all(sorted(c[1]) == impls for c in cells)
    assert cells[1][1] == cells[0][1][1:] + cells[0][1][:1]        # the next cell: rotated by one


def test_peers_warm_up_after_a_release_is_not_recorded(tmp_path, monkeypatch):
    """peers times one ewkern series before the first cell after each release of the memory (each
    size and dtype) and keeps nothing of it: the recorded cells are the same, each series once,
    and ewkern is timed once more per (size, dtype)."""
    from ewkern.bench import runner
    calls = []
    real = runner.ExperimentRun.measure

    def counting(self, **kw):
        calls.append((kw.get("what"), self._discard))
        return real(self, **kw)
    monkeypatch.setattr(runner.ExperimentRun, "measure", counting)
    code, out = run_main(tmp_path, "peers")
    assert code == 0
    res = json.loads((out / "results.json").read_text())["experiments"]["peers"]
    ms = [m for m in res["measurements"] if not m.get("reference") and m.get("op") != "rmse"]
    cells = {}
    for m in ms:
        cells.setdefault((m["op"], m["dtype"], m["size_bytes"], m.get("timing_method")), []).append(m["impl"])
    assert all(len(v) == len(set(v)) for v in cells.values()), "a series recorded twice in a cell"
    warm = [w for w, d in calls if d]
    groups = {(k[1], k[2]) for k in cells}
    assert len(warm) == len(groups) and all(w.startswith("ewkern ") for w in warm), warm
    assert any("thrown away" in n for n in res["notes"])


def test_discarding_keeps_nothing(tmp_path):
    """ExperimentRun.discarding(): what is measured, skipped or fails inside is not recorded."""
    from ewkern.bench import runner

    class Spec:
        name, title, description, paper = "x", "x", "x", None
    xr = runner.ExperimentRun(None, Spec())
    with xr.discarding():
        xr.add({"time_s": 1.0})
        xr.skip("a", "b")
        xr.error("c", ValueError("d"))
    assert xr.data["measurements"] == [] and xr.data["skipped"] == [] and xr.data["errors"] == []
    xr.add({"time_s": 1.0})
    xr.skip("a", "b")
    assert len(xr.data["measurements"]) == 1 and len(xr.data["skipped"]) == 1


def test_median_ratio_interval():
    """The bootstrap interval of median(theirs) / median(mine): around the true ratio, narrow for
    tight samples and wide for spread ones, the same for the same key, None without samples."""
    from ewkern.bench.common import median_ratio_interval
    import numpy as np
    rng = np.random.default_rng(3)
    theirs = list(1.0 + 0.001 * rng.standard_normal(60))
    mine = list(1.1 + 0.001 * rng.standard_normal(60))
    lo, hi = median_ratio_interval(theirs, mine, "tight")
    assert lo < 1 / 1.1 < hi and hi - lo < 0.005
    wide = median_ratio_interval(list(1.0 + 0.1 * rng.standard_normal(60)), mine, "wide")
    assert wide[1] - wide[0] > 0.02
    assert median_ratio_interval(theirs, mine, "tight") == (lo, hi)
    assert median_ratio_interval([], mine, "x") is None and median_ratio_interval(theirs, [1.0], "x") is None
