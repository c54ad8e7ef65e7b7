"""The bench's command line on the CPU, at tiny sizes: names and values that mean nothing are refused
before anything runs, with a message that says what the option takes; merge names the path or the
names it cannot use and keeps cells that differ only in shape; a reused output folder holds only its
results' CSVs and figures; the labels say what applies on the CPU."""

import json

import pytest

import ewkern
from ewkern import bench
from ewkern.bench import cli, merge, peers, registry, rmse_grid, runner
from ewkern.bench import results as bench_results

FAST = ["--device", "cpu", "--quick", "--samples", "3", "--min-sample-ms", "0.05", "--cache-bytes", "1MiB",
        "--no-progress"]


def _code(argv) -> int:
    """bench.main's exit code, whether it returns it or argparse exits."""
    try:
        return bench.main(argv)
    except SystemExit as exc:
        return exc.code


def _run(out, *argv) -> int:
    return bench.main([*argv, *FAST, "--out", str(out)])


@pytest.mark.parametrize("ops", ["foo", "addd,log"])
def test_e3_unknown_op_is_refused_before_anything_runs(ops, tmp_path, capsys):
    out = tmp_path / "o"
    assert _run(out, "e3", "--no-plots", "--e3-ops", ops, "--e3-shapes", "16x16", "--e3-dtypes", "float32") == 2
    err = capsys.readouterr().err
    assert f"--e3-ops: {ops.split(',')[0]} not known" in err
    assert "copy, fill, add" in err and "gelu" in err          # what it takes
    assert not out.exists()


# each option's bad text: the message says what it expected, not argparse's "invalid <function> value"
@pytest.mark.parametrize("name, option, text, expected", [
    ("r1", "--r1-shape", "abc", "expected e.g. 1024x3072"),
    ("a1", "--a1-configs", "256", "expected block:grid pairs"),
    ("a1", "--a1-n", "lots", "expected e.g. 1048576"),
    ("a1", "--a1-naive-n", "many", "expected e.g. 1048576"),
    ("peers", "--peers-ref-size", "1XB", "expected e.g. 4MiB"),
    ("c1", "--c1-shapes", "4xq", "expected e.g. 1024x3072"),
    ("e4", "--e4-size", "big", "expected e.g. 4MiB"),
    ("e4", "--e4-pool", "big", "expected e.g. 4MiB"),
    ("e7", "--e7-size", "big", "expected e.g. 4MiB"),
    ("overhead", "--overhead-calls", "lots", "expected e.g. 1048576"),
    ("e2", "--min-sample-ms", "soon", "expected e.g. 0.5"),
])
def test_bad_values_say_what_was_expected(name, option, text, expected, tmp_path, capsys):
    assert _code([name, option, text, *FAST, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and expected in err, err
    assert "invalid" not in err, err


def test_grid_byte_sizes_take_units(tmp_path):
    """--grid-max-bytes / --grid-min-bytes take sizes as the other size options do (and plain bytes);
    --grid-min-bytes 0 keeps its meaning, every cell up to the largest, instead of becoming the default."""
    p = cli.build_parser()
    a = p.parse_args(["rmse_grid", "--grid-max-bytes", "4MiB", "--grid-min-bytes", "2^10"])
    assert (a.grid_max_bytes, a.grid_min_bytes) == (4 << 20, 1 << 10)
    assert p.parse_args(["rmse_grid", "--grid-max-bytes", "4194304"]).grid_max_bytes == 4 << 20
    args = p.parse_args(["rmse_grid", "--quick", "--grid-min-bytes", "0", "--grid-max-bytes", "1KiB"])
    ctx = runner.make_context(args, "cpu", dict(ewkern.device_info("cpu")), tmp_path, True, "rotate")
    cells = rmse_grid._cells(ctx, "float32")
    assert cells and all(2 * n * b * 4 <= 1024 for n, b in cells) and (1, 16) in cells


@pytest.mark.parametrize("argv, expected", [
    (["e5", "--e5-ops", "add,addd"], "--e5-ops: addd not known"),
    (["e9", "--e9-ops", "foo"], "--e9-ops: foo not known"),
    (["rmse_grid", "--grid-min-bytes", "8MiB", "--grid-max-bytes", "4MiB"], "larger than --grid-max-bytes"),
])
def test_gpu_experiments_checks_refuse_what_names_no_cell(argv, expected, tmp_path):
    """e5's and e9's checks refuse an unknown op, rmse_grid's a smallest size above the largest, before
    the device is asked anything (they run on a GPU; their checks are called here with the CPU's
    context): each had skipped every cell, or measured none, and passed."""
    from ewkern.bench.timing import BenchError
    args = cli.build_parser().parse_args(argv)
    ctx = runner.make_context(args, "cpu", dict(ewkern.device_info("cpu")), tmp_path, False, "rotate")
    with pytest.raises(BenchError, match=expected):
        registry.get(argv[0]).check(ctx)


@pytest.mark.parametrize("argv", [
    ["overhead", "--overhead-calls", "-5"],
    ["overhead", "--overhead-calls", "0", "--overhead-repeats", "1"],
    ["overhead", "--overhead-repeats", "0", "--overhead-calls", "10"],
    ["overhead", "--overhead-repeats", "-1", "--overhead-calls", "10"],
    ["overhead", "--overhead-n", "0", "--overhead-calls", "10", "--overhead-repeats", "1"],
    ["peers", "--peers-ref-size", "0", "--peers-sizes", "64KiB", "--peers-ops", "copy", "--peers-dtypes", "float32",
     "--peers-rmse-shapes", ""],
    ["peers", "--peers-rmse-shapes", "16x0", "--peers-sizes", "64KiB", "--peers-ops", "copy",
     "--peers-dtypes", "float32"],
    ["e2", "--min-sample-ms", "-1", "--e2-sizes", "64KiB"],
    ["r1", "--r1-shape", "16x0x4"],
    ["r1", "--r1-shape", "1024"],
    ["c1", "--c1-shapes", "4x0", "--c1-backend", "aot_eager"],
    ["c1", "--c1-shapes", "4", "--c1-backend", "aot_eager"],
    ["e3", "--e3-shapes", "16x0", "--e3-ops", "copy", "--e3-dtypes", "float32"],
    ["a1", "--a1-runs", "0", "--a1-n", "2^10", "--a1-naive-n", "2^8", "--a1-configs", "32:4"],
    ["a1", "--a1-configs", "256:0", "--a1-n", "2^10", "--a1-naive-n", "2^8"],
    ["e4", "--e4-iterations", "0"],
    ["e7", "--e7-block", "0"],
    ["rmse_grid", "--grid-max-bytes", "0"],
])
def test_meaningless_numbers_are_refused_at_argument_time(argv, tmp_path, capsys):
    """Zero or negative counts, sizes, shapes and times: exit 2 with the option named, nothing run
    (they printed negative times, became the defaults, or failed inside the run or its summary)."""
    out = tmp_path / "o"
    assert _code([*argv, *FAST, "--no-plots", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"argument {argv[1]}: " in err, err
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["peers", "--peers-ops", ""], ["peers", "--peers-dtypes", " , "], ["peers", "--peers-methods", ""],
    ["peers", "--peers-after-torch-ops", ""], ["e3", "--e3-ops", ","], ["e5", "--e5-ops", ""],
    ["rmse_grid", "--grid-layouts", ""], ["fused", "--fused-exprs", ""], ["train", "--train-ops", ","],
    ["train", "--train-methods", ""],
])
def test_an_empty_list_option_is_refused_not_taken_as_its_default(argv, tmp_path, capsys):
    """An option given no names exits 2 naming it: `--peers-ops ""` had timed every op (the
    default), as if the option were left out."""
    out = tmp_path / "o"
    assert _code([*argv, *FAST, "--no-plots", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"argument {argv[1]}: no name given" in err, err
    assert not out.exists()


def test_min_sample_ms_zero_means_the_fewest_launches(tmp_path):
    """--min-sample-ms 0 is a target (the fewest launches a sample can take), not the default."""
    args = cli.build_parser().parse_args(["e2", "--min-sample-ms", "0"])
    ctx = runner.make_context(args, "cpu", dict(ewkern.device_info("cpu")), tmp_path, False, "rotate")
    assert ctx.cfg.min_sample_s == 0.0
    assert "0: the fewest launches" in " ".join(cli.build_parser().format_help().split())


def _fake_run(folder, experiments=None):
    """A run folder holding a results.json of one device and the given experiments."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"device_name": "cpu", "experiments": experiments or {}}))
    return folder


def test_merge_into_a_file_names_it(tmp_path, capsys):
    run = _fake_run(tmp_path / "run")
    blocker = tmp_path / "hostname"
    blocker.write_text("not a folder")
    assert merge.main([str(blocker), str(run), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert str(blocker) in err and "not a folder" in err and "Traceback" not in err
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("name", ["run.log", "summary.md", "results.json"])
def test_merge_of_a_file_that_is_no_results_file_names_it(name, tmp_path, capsys):
    bad = tmp_path / name
    bad.write_text("# ewkern.bench: not JSON\n" if name != "results.json" else "[1, 2]")
    assert merge.main([str(tmp_path / "m"), str(bad), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not a results file" in err
    assert not (tmp_path / "m").exists()


def test_merge_combine_names_an_unknown_experiment(tmp_path, capsys):
    run = _fake_run(tmp_path / "run")
    assert merge.main([str(tmp_path / "m"), str(run), "--combine", "e3,nosuch", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "--combine: nosuch not an experiment" in err and "e1, e2, e3" in err and "rmse_grid" in err
    assert not (tmp_path / "m").exists()


def test_merge_combine_keeps_cells_that_differ_only_in_shape(tmp_path):
    """e3 at 256x1024 in one run and 1024x256 in another (the same n) stay two cells; the same shape
    measured again is still one cell, whatever lists of floats (samples, r1's first results) it holds."""
    p1, p2 = tmp_path / "p1", tmp_path / "p2"
    args = ["--no-plots", "--e3-ops", "copy", "--e3-dtypes", "float32"]
    assert _run(p1, "e3", *args, "--e3-shapes", "32x64") == 0
    assert _run(p2, "e3", *args, "--e3-shapes", "64x32") == 0
    assert merge.main([str(tmp_path / "m"), str(p1), str(p2), "--combine", "e3", "--no-plots"]) == 0
    ms = bench_results.load(tmp_path / "m")["experiments"]["e3"]["measurements"]
    assert sorted(m["shape"] for m in ms) == [[32, 64]] * 2 + [[64, 32]] * 2   # hot and rotate of each
    a, b = bench_results.load(p1), bench_results.load(p1)
    for m in b["experiments"]["e3"]["measurements"]:
        m["first"] = [0.25, 0.5]
    got = merge.merge([a, b], combine=["e3"])["experiments"]["e3"]["measurements"]
    assert got == b["experiments"]["e3"]["measurements"]


def test_reused_folder_holds_only_its_results_outputs(tmp_path, capsys, monkeypatch):
    """A run into a folder that holds an earlier run: the earlier run's CSVs and figures that the new
    results do not hold are removed (a failed re-run's too); files the harness did not write stay."""
    out = tmp_path / "o"
    e3 = ["--e3-shapes", "16x16", "--e3-ops", "copy", "--e3-dtypes", "float32"]
    assert _run(out, "e3", *e3) == 0
    first = json.loads((out / "results.json").read_text())["figures"]
    assert first and all((out / f).exists() for f in first) and (out / "e3.csv").exists()
    (out / "notes.txt").write_text("mine")
    (out / "e3_mine.csv").write_text("mine")        # named like an output, written by no run
    assert _run(out, "e2", "--e2-sizes", "64KiB") == 0
    res = json.loads((out / "results.json").read_text())
    assert list(res["experiments"]) == ["e2"] and res["figures"]
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".csv", ".png")) == \
        sorted(["e2.csv", "e3_mine.csv", *res["figures"]])
    assert (out / "notes.txt").read_text() == "mine"
    assert "removed" in capsys.readouterr().err
    # a run that makes no figures (--no-plots) leaves the earlier ones (a merge --no-plots into a
    # committed folder had removed every figure), its CSVs still the folder's
    kept = res["figures"]
    assert _run(out, "e3", "--no-plots", *e3) == 0
    assert all((out / f).exists() for f in kept) and not (out / "e2.csv").exists() and (out / "e3.csv").exists()
    # a re-run that measures nothing leaves no CSV of the run before
    from ewkern.bench import e2_copy_size

    def broken(ctx, xr):
        raise RuntimeError("no measurement")
    monkeypatch.setattr(e2_copy_size, "run", broken)
    assert _run(out, "e2", "--no-plots", "--e2-sizes", "64KiB") == 1
    assert not (out / "e2.csv").exists()
    assert json.loads((out / "results.json").read_text())["experiments"]["e2"]["status"] == "error"


def test_merge_into_a_used_folder_removes_its_earlier_outputs(tmp_path):
    p1, p2, m = tmp_path / "p1", tmp_path / "p2", tmp_path / "m"
    assert _run(p1, "e2", "--no-plots", "--e2-sizes", "64KiB") == 0
    assert _run(p2, "e3", "--no-plots", "--e3-shapes", "16x16", "--e3-ops", "copy", "--e3-dtypes", "float32") == 0
    assert merge.main([str(m), str(p1), "--no-plots"]) == 0
    assert (m / "e2.csv").exists()
    assert merge.main([str(m), str(p2), "--no-plots"]) == 0
    assert not (m / "e2.csv").exists() and (m / "e3.csv").exists()


def test_cpu_results_record_pdl_as_not_applying(tmp_path):
    """PDL is a CUDA launch attribute: a CPU run records it as not in use (it said true)."""
    out = tmp_path / "o"
    assert _run(out, "e2", "--no-plots", "--e2-sizes", "64KiB") == 0
    assert json.loads((out / "results.json").read_text())["pdl"] is False


def test_cpu_peers_summary_names_numpy_and_no_pdl_off_series(tmp_path):
    out = tmp_path / "o"
    assert _run(out, "peers", "--no-plots", "--peers-sizes", "64KiB", "--peers-ops", "copy",
                "--peers-dtypes", "float32", "--peers-rmse-shapes", "", "--peers-ref-size", "1MiB") == 0
    text = (out / "summary.md").read_text()
    assert "ewkern and numpy were timed one after another" in text
    assert "PDL-off" not in text and "back-to-back and single launch" not in text


def test_cpu_defaults_in_help_and_quick_banner():
    """--peers-ref-size's help names the CPU's default; the quick CPU banner says what runs, for the
    experiments named only."""
    text = " ".join(cli.build_parser().format_help().split())
    assert "D2D copy / dot size per buffer (default GPU 1GiB; CPU 64MiB, quick 16MiB)" in text
    note = runner.quick_cpu_note(["train"])
    assert "leaves out" not in note and "train: gelu, mul and rmse" in note
    assert "e2" not in note and "overhead" not in note
    note = runner.quick_cpu_note(["e3", "overhead"])
    assert "e3: ops" in note and "overhead: fewer" in note and "r1" not in note and "c1" not in note
    assert "python -m ewkern.bench --all --device cpu" in note
    assert peers.CPU_QUICK in runner.quick_cpu_note(["peers"])
