"""Quick mode's plan on the CPU stays small (not timed: the cells and samples it would run)."""

import ewkern
from ewkern.bench import cli, peers, runner


def _ctx(tmp_path, argv, device="cpu", info=None):
    args = cli.build_parser().parse_args(argv)
    info = info if info is not None else dict(ewkern.device_info("cpu"))
    return runner.make_context(args, device, info, tmp_path, args.quick, args.cache)


def test_quick_cpu_peers_plan_is_small(tmp_path):
    ctx = _ctx(tmp_path, ["--all", "--quick"])
    plan = peers.plan(ctx)
    # every op x 4 dtypes at one size, ewkern and NumPy, plus a few rmse shapes and 2 references
    assert plan["sizes"] == [4 << 20]
    assert plan["cells"] <= 200, plan
    assert plan["cells"] * plan["samples"] <= 200 * 7, plan
    full = peers.plan(_ctx(tmp_path, ["--all"]))
    assert full["cells"] > plan["cells"] and full["cells"] * full["samples"] > 2 * plan["cells"] * plan["samples"]


def test_quick_gpu_plan_unchanged(tmp_path):
    info = {"name": "fake GPU", "l2_bytes": 50 << 20, "total_memory_bytes": 80 << 30,
            "compute_capability": (9, 0)}
    ctx = _ctx(tmp_path, ["--all", "--quick"], device="cuda:0", info=info)
    plan = peers.plan(ctx)
    assert plan["sizes"] == [4 << 20, 64 << 20, 1 << 30]
    assert plan["ref_size"] == 1 << 30


def test_quick_cpu_note_says_what_is_left_out():
    text = runner.quick_cpu_note(["e2", "e3", "peers"])
    assert "64 MiB" in text and "e3" in text
    assert "python -m ewkern.bench --all --device cpu" in text
