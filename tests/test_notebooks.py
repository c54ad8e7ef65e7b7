"""The notebooks run top to bottom without a GPU, in both modes, and the committed ones are executed.

"run" mode measures on the CPU at the smallest sizes (EWKERN_NOTEBOOK_TINY=1); "results" mode shows
one folder per GPU under results/ (the committed GPU runs), or, where the checkout has none, a tiny
CPU run made once for this module. Two fake GPUs made from a committed run's JSON check that every
GPU found is shown, by name, in a stable order, its figures side by side and its claims in a column.
Each notebook runs in a fresh kernel on this interpreter (notebooks/execute.py), which nbclient and
ipykernel must be importable for.
"""

import base64
import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("nbformat", reason="nbformat is not installed (make build installs it)")
pytest.importorskip("nbclient", reason="nbclient is not installed (make build installs it)")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (make build installs it)")

import nbformat  # noqa: E402

from ewkern.bench import notebook  # noqa: E402
from ewkern.bench import results as bench_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"


def _executor():
    spec = importlib.util.spec_from_file_location("ewkern_notebooks_execute", NB_DIR / "execute.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EXECUTOR = _executor()
NAMES = EXECUTOR.NOTEBOOKS
ALL_EXPERIMENTS = list(dict.fromkeys(e for p in notebook.PAPERS.values() for e in p["experiments"]))
BASE_ENV = {"EWKERN_NOTEBOOK_DEVICE": "cpu", "EWKERN_NOTEBOOK_TINY": "1", "EWKERN_NOTEBOOK_QUICK": "1"}


def _tiny_run(out: Path) -> Path:
    from ewkern.bench import main
    argv = ALL_EXPERIMENTS + ["--device", "cpu", "--quick", "--out", str(out), "--no-plots", "--no-progress"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv + notebook._TINY)
    assert code == 0, f"the tiny CPU run for the results-mode tests exited {code}"
    return out


@pytest.fixture(scope="module")
def results_env(tmp_path_factory):
    """EWKERN_RESULTS_DIR for results mode: unset when results/ holds a run, else a tiny CPU run."""
    if notebook.find_runs(root=ROOT / "results"):
        return {"EWKERN_RESULTS_DIR": None}
    return {"EWKERN_RESULTS_DIR": str(_tiny_run(tmp_path_factory.mktemp("nb-results") / "cpu-tiny"))}


def _errors(nb):
    return [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def _paper(name):
    """The paper a notebook shows (its runs_for call)."""
    nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
    return re.search(r'runs_for\("(\w+)"', "\n".join(c.source for c in nb.cells)).group(1)


def _has_claims(name):
    """Whether a notebook's paper has claims (ewkern's own targets, issues 20/21, have none)."""
    return notebook.PAPERS[_paper(name)].get("claims", True)


def _pngs(nb):
    return [base64.b64decode(o["data"]["image/png"]) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "image/png" in (o.get("data") or {})]


def _text(nb):
    parts = []
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            parts.append(o.get("text", ""))
            parts += [v for k, v in (o.get("data") or {}).items() if k.startswith("text/") and isinstance(v, str)]
    return "\n".join(parts)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_run_mode_on_the_cpu(name, tmp_path):
    env = {**BASE_ENV, "EWKERN_NOTEBOOK_OUT": str(tmp_path / "out"), "EWKERN_RESULTS_DIR": None}
    nb = EXECUTOR.execute(NB_DIR / f"{name}.ipynb", mode="run", env=env, timeout=120)
    assert not _errors(nb)
    text = _text(nb)
    assert "showing: a run made by this notebook" in text
    if _has_claims(name):
        assert "| claim | verdict |" in text, "the notebook must end with its claims table"
    assert (tmp_path / "out" / "results.json").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_results_mode(name, results_env, tmp_path):
    env = {**BASE_ENV, "EWKERN_NOTEBOOK_OUT": str(tmp_path / "out"), **results_env}
    nb = EXECUTOR.execute(NB_DIR / f"{name}.ipynb", mode="results", env=env, timeout=120)
    assert not _errors(nb)
    text = _text(nb)
    assert "showing: results folder" in text
    if _has_claims(name):
        assert "| claim |" in text, "the notebook must end with its claims table"
    assert not (tmp_path / "out").exists(), "results mode must not run the experiments when a folder exists"
    found = notebook.find_runs(notebook.PAPERS[_paper(name)]["experiments"],
                               root=results_env["EWKERN_RESULTS_DIR"] or ROOT / "results")
    assert text.count("showing: results folder") == len(found), "one results folder per GPU under results/"


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    """A results folder with two GPU runs, 'Fake GPU B' written first, both a committed run's JSON
    (peers cut to copy, gelu and rmse: its heat maps of every op take the notebook most of its time)."""
    runs = notebook.find_runs(root=ROOT / "results")
    src = next(iter(runs.values()), None)
    data = {k: v for k, v in bench_results.load(src).items() if not k.startswith("_")} if src else {}
    if data.get("device", "cpu") == "cpu":
        pytest.skip("results/ holds no GPU run to copy")
    peers = data["experiments"].get("peers")
    if peers and peers.get("measurements"):
        peers["measurements"] = [m for m in peers["measurements"]
                                 if m.get("op") in ("copy", "gelu", "rmse") or m.get("reference")]
    root = tmp_path_factory.mktemp("two-gpus")
    for name in ("Fake GPU B", "Fake GPU A"):
        (root / name.replace(" ", "_")).mkdir()
        (root / name.replace(" ", "_") / "results.json").write_text(json.dumps(dict(data, device_name=name)))
    return root


@pytest.mark.parametrize("name", NAMES)
def test_notebook_shows_every_gpu_side_by_side(name, two_gpus, tmp_path):
    env = {**BASE_ENV, "EWKERN_NOTEBOOK_OUT": str(tmp_path / "out"), "EWKERN_RESULTS_DIR": str(two_gpus)}
    nb = EXECUTOR.execute(NB_DIR / f"{name}.ipynb", mode="results", env=env, timeout=120)
    assert not _errors(nb)
    text = _text(nb)
    assert ("2 GPUs, shown in this order (figures left to right, tables one after the other): "
            "Fake GPU A, Fake GPU B") in text
    assert text.count("showing: results folder") == 2
    if _has_claims(name):
        assert "| claim | Fake GPU A: verdict, evidence | Fake GPU B: verdict, evidence | source |" in text
    assert "**Fake GPU A**" in text and "**Fake GPU B**" in text   # the tables, one GPU after the other
    assert _pngs(nb), "no figure"
    if name == "elementwise_ops_on_gpus":
        assert "| op | Fake GPU A | Fake GPU B |" in text   # peers' worst cell per op, a column per GPU
        assert "| GPU | cells below 0.99 | by dtype |" in text
    if name == "batched_rmse":
        assert text.count("worst ewkern / dot there") == 2   # rmse_grid's table for each GPU


def _fake_runs(two_gpus):
    from ewkern.bench import load
    return [load(two_gpus / n) for n in ("Fake_GPU_A", "Fake_GPU_B")]


def test_each_figure_is_one_image_with_the_gpus_beside_or_below_each_other(two_gpus, monkeypatch):
    from PIL import Image
    from ewkern.bench import plots
    runs = _fake_runs(two_gpus)
    shown, texts = [], []
    monkeypatch.setattr(notebook, "_show_png", lambda data: shown.append(Image.open(io.BytesIO(data))))
    monkeypatch.setattr(notebook, "markdown", texts.append)
    for exp in ("e2", "e3"):
        figs = plots.figures(runs[0], exp)
        del shown[:]
        notebook.show_figures(runs, exp)
        assert len(shown) == len(figs), f"{exp}: one image per figure, not one per GPU"
        for im, (_, fig) in zip(shown, figs):
            w, h = fig.get_size_inches() * notebook.DPI
            if 2 * fig.get_size_inches()[0] <= notebook.ROW_INCHES:   # side by side
                assert im.width > 2 * w - 4 and abs(im.height - h) < 4, (exp, im.size, (w, h))
            else:                                                     # one above the other
                assert abs(im.width - w) < 4 and im.height > 2 * h - 4, (exp, im.size, (w, h))
    notebook.show(runs, "e2", figures=False)
    assert any("**Fake GPU A**" in t for t in texts) and any("**Fake GPU B**" in t for t in texts)


def test_claims_have_a_column_per_gpu(two_gpus, monkeypatch):
    runs = _fake_runs(two_gpus)
    texts = []
    monkeypatch.setattr(notebook, "markdown", texts.append)
    per_gpu = notebook.show_claims(runs, "f16x8", extra=notebook.v1_claims)
    assert list(per_gpu) == ["Fake GPU A", "Fake GPU B"]
    table = texts[-1].splitlines()
    assert table[0] == "| claim | Fake GPU A: verdict, evidence | Fake GPU B: verdict, evidence | source |"
    assert len(table) == 2 + len(per_gpu["Fake GPU A"])
    notebook.show_claims(runs[:1], "f16x8", extra=notebook.v1_claims)
    assert texts[-1].startswith("| claim | verdict | evidence (numbers from this run) | source |")


def test_run_mode_options_parse():
    from ewkern.bench.cli import build_parser
    for paper, spec in notebook.PAPERS.items():
        for device in ("cpu", "cuda:0"):
            build_parser().parse_args(spec["experiments"] + notebook.run_arguments(paper, device) + notebook._TINY)
            build_parser().parse_args(spec["experiments"] + notebook.run_arguments(paper, device))


def test_results_mode_without_a_folder_says_so_and_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EWKERN_RESULTS_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("EWKERN_NOTEBOOK_DEVICE", "cpu")
    monkeypatch.setenv("EWKERN_NOTEBOOK_OUT", str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    runs = notebook.runs_for("f16x8", mode="results", quick=True, tiny=True)
    out = capsys.readouterr().out
    assert len(runs) == 1
    res = runs[0]
    assert "no results folder" in out and "running" in out
    assert res["device"] == "cpu"
    assert notebook.status_line(res, "v1").startswith("v1: skipped on cpu")
    assert [r["status"] for r in notebook.v1_claims(res)] == ["not measured"] * 5


def _fake(folder: Path, device: str, started: str, experiments=("e2",), partial=False, name=None):
    folder.mkdir(parents=True)
    exps = {e: {"status": "ok", "measurements": []} for e in experiments}
    info = {"device_name": name} if name else {}
    (folder / "results.json").write_text(json.dumps({"device": device, "started": started, "partial": partial,
                                                     "experiments": exps, **info}))
    return folder


def test_find_runs_gives_one_run_per_gpu_by_name_and_cpu_runs_only_without_a_gpu(tmp_path):
    root = tmp_path / "results"
    assert notebook.find_runs(root=root) == {}
    cpu = _fake(root / "AMD_EPYC", "cpu", "2030-01-01T00:00:00+00:00", ("e2", "a1"), name="AMD EPYC 7R13")
    assert notebook.find_runs(["a1"], root=root) == {"AMD EPYC 7R13": cpu}
    # no device_name recorded: the folder below root names the GPU
    old = _fake(root / "NVIDIA_H100" / "20260101-000000", "cuda:0", "2026-01-01T00:00:00+00:00", ("e2", "a1"))
    assert notebook.find_runs(["a1"], root=root) == {"NVIDIA_H100": old}
    new = _fake(root / "NVIDIA_H100" / "20260102-000000", "cuda:0", "2026-01-02T00:00:00+00:00", ("e2", "a1"))
    _fake(root / "NVIDIA_H100" / "20260103-000000", "cuda:0", "2026-01-03T00:00:00+00:00", ("e2",))
    assert notebook.find_runs(["a1"], root=root) == {"NVIDIA_H100": new}   # more of the experiments, then newer
    # one GPU in two folders (device_name decides): the complete run before the newer partial one
    b200 = _fake(root / "b200-old", "cuda:0", "2026-01-04T00:00:00+00:00", ("e2", "a1"), name="NVIDIA B200")
    _fake(root / "b200-new", "cuda:0", "2026-01-05T00:00:00+00:00", ("e2", "a1"), partial=True, name="NVIDIA B200")
    h200 = _fake(root / "zz" / "h200", "cuda:0", "2026-01-01T00:00:00+00:00", ("e2",), name="NVIDIA H200")
    found = notebook.find_runs(["a1"], root=root)
    assert found == {"NVIDIA B200": b200, "NVIDIA H200": h200, "NVIDIA_H100": new}
    assert list(found) == sorted(found)
    assert list(notebook.find_runs(root=new).values()) == [new]   # a results folder itself


def test_the_committed_notebooks_are_executed_small_and_clean():
    total = 0
    for name in NAMES:
        path = NB_DIR / f"{name}.ipynb"
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), f"{path.name} is not executed (notebooks/execute.py)"
        assert not _errors(nb), f"{path.name} holds an error output"
        assert any("parameters" in c.metadata.get("tags", []) for c in code), f"{path.name}: no parameter cell"
        total += path.stat().st_size
    assert total < 3 * 2**20, f"the notebooks take {total / 2**20:.1f} MiB (keep them under 3 MiB)"
