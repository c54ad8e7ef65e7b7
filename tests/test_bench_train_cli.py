"""The `train` experiment's command line on the CPU: its options checked before anything runs, what
it measures following them, and its records labelled as measured. Tiny sizes, few samples."""

import csv

import pytest

from ewkern import bench
from ewkern.bench import cli

pytest.importorskip("torch")

FAST = ["--device", "cpu", "--quick", "--samples", "3", "--min-sample-ms", "0.05", "--cache-bytes", "1MiB",
        "--no-plots"]


def _main(argv):
    """bench.main's exit code; argparse's errors exit through SystemExit."""
    try:
        return bench.main(argv)
    except SystemExit as exc:
        return exc.code


def run(tmp_path, *extra, progress=False):
    out = tmp_path / "out"
    args = ["train"] + FAST + ["--out", str(out), "--train-sizes", "64KiB"] + list(extra)
    if not progress:
        args.append("--no-progress")
    return _main(args), out


def _refused(tmp_path, capsys, args, message):
    """A tiny train run with args exits 2 with message, before its output folder is made."""
    code = _main(["train"] + FAST + ["--no-progress", "--out", str(tmp_path / "o"), "--train-ops", "add",
                                     "--train-sizes", "64KiB"] + args)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, message", [
    (["--train-ops", "add,foo"], "--train-ops: unknown 'foo'; valid: copy, add, "),
    (["--train-methods", "foo"], "--train-methods: unknown 'foo'; valid: back-to-back, single, host"),
    (["--train-dtypes", "int8"], "--train-dtypes: unknown 'int8'; valid: float32, float16, bfloat16"),
    (["--train-ways", "foo"], "--train-ways: unknown 'foo'; valid: ewkern.torch, torch eager, torch.compile"),
    (["--train-sizes", "1XB"], "argument --train-sizes: not a byte size: '1XB'"),
])
def test_unknown_names_are_refused_before_running(tmp_path, capsys, args, message):
    _refused(tmp_path, capsys, args, message)


def test_sizes_are_parsed_with_the_arguments():
    args = cli.build_parser().parse_args(["train", "--train-sizes", "1MiB,64KiB", "--fused-sizes", "1MiB"])
    assert args.train_sizes == [1 << 20, 64 << 10]


@pytest.mark.parametrize("args, message", [
    (["--train-methods", "back-to-back,host"],
     "--train-methods: 'host' on a GPU only; on cpu: back-to-back, single"),
    (["--train-ways", "torch.compile"],
     "--train-ways: 'torch.compile' on a GPU only; on cpu: ewkern.torch, torch eager"),
])
def test_what_the_cpu_cannot_time_is_refused(tmp_path, capsys, args, message):
    """host (CUDA events) and torch.compile are GPU-only: refused, naming what the CPU can time,
    rather than a run that measures nothing and says ok."""
    _refused(tmp_path, capsys, args, message)


def test_methods_help_says_the_cpu_default():
    text = cli.build_parser().format_help()
    text = " ".join(text[text.index("--train-methods"):].split())
    assert "CPU: back-to-back" in text and "host on a GPU only" in text
    assert "CPU: host clock" not in text


def _measured(out):
    exp = bench.load(out)["experiments"]["train"]
    assert exp["status"] == "ok", exp.get("reason")
    return exp, exp["measurements"]


def test_mlp_follows_the_ops_dtypes_and_ways(tmp_path):
    """The MLP step is "mlp" among --train-ops, in the run's dtypes of float32 and bfloat16, by the
    run's ways: no bfloat16 step or torch eager way beside a run asked for float32 and ewkern.torch."""
    code, out = run(tmp_path, "--train-ops", "add,mlp", "--train-dtypes", "float32", "--train-ways", "ewkern.torch")
    assert code == 0
    exp, ms = _measured(out)
    assert {(m["op"], m["dtype"], m["series"]) for m in ms} == {("add", "float32", "ewkern.torch"),
                                                                ("mlp", "float32", "ewkern.torch")}
    assert exp["params"]["dtypes"] == ["float32"] and exp["params"]["mlp_dtypes"] == ["float32"]


def test_ops_without_mlp_run_no_mlp_step(tmp_path):
    code, out = run(tmp_path, "--train-ops", "add", "--train-ways", "ewkern.torch")
    assert code == 0
    assert {m["op"] for m in _measured(out)[1]} == {"add"}


def test_mlp_without_its_dtypes_is_refused(tmp_path, capsys):
    code = _main(["train"] + FAST + ["--no-progress", "--out", str(tmp_path / "o"), "--train-ops", "mlp",
                                     "--train-dtypes", "float16"])
    assert code == 2
    assert "--train-ops mlp: the MLP step runs in float32 or bfloat16" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_ops_help_names_mlp():
    text = cli.build_parser().format_help()
    assert "and mlp for the MLP step" in " ".join(text[text.index("--train-ops OPS"):].split())


def test_progress_counts_the_measurements(tmp_path, capsys):
    """One progress step a measurement, the count sized to them: no [train 3/2] past the end."""
    code, out = run(tmp_path, "--train-ops", "add,mlp", "--train-dtypes", "float32", progress=True)
    assert code == 0
    steps = [line.split("]")[0].split()[-1] for line in capsys.readouterr().err.splitlines()
             if line.lstrip().startswith("[train ")]
    # add and the MLP step, by ewkern.torch and torch eager
    assert steps == [f"{i}/4" for i in range(1, 5)]


@pytest.mark.parametrize("in_turns", [[], ["--no-train-in-turns"]])
def test_records_say_their_way_bytes_and_size(tmp_path, in_turns):
    """train.csv's impl is the record's way (ewkern.torch's rows said torch); a step's bytes are
    split into read and written (all of them were in bytes_read); the bfloat16 MLP step's size is
    its x's bytes at 2 bytes an element (it was counted at 4)."""
    code, out = run(tmp_path, "--train-ops", "mul,mlp", "--train-dtypes", "float32,bfloat16", *in_turns)
    assert code == 0
    with open(out / "train.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["op"], r["dtype"], r["series"], r["impl"]) for r in rows} == {
        (op, dt, way, way) for op in ("mul", "mlp") for dt in ("float32", "bfloat16")
        for way in ("ewkern.torch", "torch eager")}
    for r in rows:
        if r["op"] == "mul":
            n, s = int(r["n"]), {"float32": 4, "bfloat16": 2}[r["dtype"]]
            # forward reads a, b and writes y; backward reads g, a, b and writes both gradients
            assert (int(r["bytes_read"]), int(r["bytes_written"])) == (5 * n * s, 3 * n * s)
            assert int(r["bytes"]) == 8 * n * s
        else:
            assert int(r["n"]) == 256 * 128
            assert int(r["size_bytes"]) == 256 * 128 * {"float32": 4, "bfloat16": 2}[r["dtype"]]


def test_host_records_say_their_way_and_bytes(monkeypatch):
    """The host-visible method (GPU only: its timing faked here) records the way as impl, the bytes
    read and written, and steps the progress bar once a record."""
    from types import SimpleNamespace

    from ewkern.bench import t1_train
    monkeypatch.setattr(t1_train, "_host_visible", lambda torch, calls: [[1e-3, 2e-3, 3e-3] for _ in calls])
    recs, steps = [], []
    xr, bar = SimpleNamespace(add=recs.append), SimpleNamespace(step=steps.append)

    def build():
        return (lambda: (lambda: None)), 100, 30, 20
    entries = [(f"mul {way} host", build, dict(op="mul", series=way, impl_label=way))
               for way in ("ewkern.torch", "torch eager")]
    t1_train._measure_host(xr, bar, None, entries)
    assert [(r["impl"], r["series"]) for r in recs] == [("ewkern.torch", "ewkern.torch"),
                                                         ("torch eager", "torch eager")]
    for r in recs:
        assert (r["bytes_read"], r["bytes_written"], r["bytes"]) == (30, 20, 50) and "impl_label" not in r
        assert r["time_s"] == 2e-3 and r["gbs"] == pytest.approx(50 / 2e-3 / 1e9)
    assert len(steps) == 2


def test_cache_hot_is_honoured_and_flush_said(tmp_path):
    """--cache hot times back-to-back steps on the same inputs, labelled hot; --cache flush leaves
    them rotating (the single method is the flushed step) and says so. Both were ignored while the
    results' top level recorded the mode asked for."""
    code, out = run(tmp_path, "--train-ops", "add", "--cache", "hot")
    assert code == 0
    exp, ms = _measured(out)
    assert bench.load(out)["cache"] == "hot"
    assert [(m["cache"], m["sets"]) for m in ms] == [("hot", 1)] * 2
    assert exp["params"]["caches"] == {"back-to-back": "hot"}
    assert "the same inputs every step: hot" in (out / "summary.md").read_text()
    code, out = run(tmp_path / "flush", "--train-ops", "add", "--train-ways", "ewkern.torch", "--cache", "flush")
    assert code == 0
    exp, ms = _measured(out)
    assert [m["cache"] for m in ms] == ["rotate"]
    assert any(n.startswith("--cache flush: back-to-back steps rotate their inputs") for n in exp["notes"])
