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


@pytest.mark.parametrize("args, message", [
    (["--train-ops", "add,foo"], "--train-ops: unknown 'foo'; valid: copy, add, "),
    (["--train-methods", "foo"], "--train-methods: unknown 'foo'; valid: back-to-back, single, host"),
    (["--train-dtypes", "int8"], "--train-dtypes: unknown 'int8'; valid: float32, float16, bfloat16"),
    (["--train-ways", "foo"], "--train-ways: unknown 'foo'; valid: ewkern.torch, torch eager, torch.compile"),
    (["--train-sizes", "1XB"], "argument --train-sizes: not a byte size: '1XB'"),
])
def test_unknown_names_are_refused_before_running(tmp_path, capsys, args, message):
    code = _main(["train"] + FAST + ["--no-progress", "--out", str(tmp_path / "o"), "--train-ops", "add",
                                     "--train-sizes", "64KiB"] + args)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


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
    code = _main(["train"] + FAST + ["--no-progress", "--out", str(tmp_path / "o"), "--train-ops", "add",
                                     "--train-sizes", "64KiB"] + args)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_methods_help_says_the_cpu_default():
    text = cli.build_parser().format_help()
    text = " ".join(text[text.index("--train-methods"):].split())
    assert "CPU: back-to-back" in text and "host on a GPU only" in text
    assert "CPU: host clock" not in text
