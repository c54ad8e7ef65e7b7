"""The bench's command line on the CPU, at tiny sizes: names and values that mean nothing are refused
before anything runs, with a message that says what the option takes."""

import pytest

from ewkern import bench

FAST = ["--device", "cpu", "--quick", "--samples", "3", "--min-sample-ms", "0.05", "--cache-bytes", "1MiB",
        "--no-progress"]


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
