"""The notebooks run top to bottom without a GPU, in both modes, and the committed ones are executed.

"run" mode measures on the CPU at the smallest sizes (EWKERN_NOTEBOOK_TINY=1); "results" mode shows
the newest folder under results/ (the committed GPU run), or, where the checkout has none, a tiny CPU
run made once for this module. Each notebook runs in a fresh kernel on this interpreter
(notebooks/execute.py), which nbclient and ipykernel must be importable for.
"""

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("nbformat", reason="nbformat is not installed (make build installs it)")
pytest.importorskip("nbclient", reason="nbclient is not installed (make build installs it)")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (make build installs it)")

import nbformat  # noqa: E402

from ewkern.bench import notebook  # noqa: E402

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
    if notebook.find_results(root=ROOT / "results") is not None:
        return {"EWKERN_RESULTS_DIR": None}
    return {"EWKERN_RESULTS_DIR": str(_tiny_run(tmp_path_factory.mktemp("nb-results") / "cpu-tiny"))}


def _errors(nb):
    return [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


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
    assert "| claim | verdict |" in text, "the notebook must end with its claims table"
    assert (tmp_path / "out" / "results.json").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_results_mode(name, results_env, tmp_path):
    env = {**BASE_ENV, "EWKERN_NOTEBOOK_OUT": str(tmp_path / "out"), **results_env}
    nb = EXECUTOR.execute(NB_DIR / f"{name}.ipynb", mode="results", env=env, timeout=120)
    assert not _errors(nb)
    text = _text(nb)
    assert "showing: results folder" in text
    assert "| claim | verdict |" in text
    assert not (tmp_path / "out").exists(), "results mode must not run the experiments when a folder exists"


def test_results_mode_without_a_folder_says_so_and_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EWKERN_RESULTS_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("EWKERN_NOTEBOOK_DEVICE", "cpu")
    monkeypatch.setenv("EWKERN_NOTEBOOK_OUT", str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    res = notebook.results_for("f16x8", mode="results", quick=True, tiny=True)
    out = capsys.readouterr().out
    assert "no results folder" in out and "running" in out
    assert res["device"] == "cpu"
    assert notebook.status_line(res, "v1").startswith("v1: skipped on cpu")
    assert [r["status"] for r in notebook.v1_claims(res)] == ["not measured"] * 5


def _fake(folder: Path, device: str, started: str, experiments=("e2",), partial=False):
    folder.mkdir(parents=True)
    exps = {e: {"status": "ok", "measurements": []} for e in experiments}
    (folder / "results.json").write_text(json.dumps({"device": device, "started": started, "partial": partial,
                                                     "experiments": exps}))
    return folder


def test_find_results_prefers_a_gpu_run_then_coverage_then_the_newest(tmp_path):
    root = tmp_path / "results"
    assert notebook.find_results(root=root) is None
    _fake(root / "AMD_EPYC", "cpu", "2030-01-01T00:00:00+00:00", ("e2", "a1"))
    old = _fake(root / "NVIDIA_H100" / "20260101-000000", "cuda:0", "2026-01-01T00:00:00+00:00", ("e2", "a1"))
    assert notebook.find_results(["a1"], root=root) == old
    new = _fake(root / "NVIDIA_H100" / "20260102-000000", "cuda:0", "2026-01-02T00:00:00+00:00", ("e2", "a1"))
    _fake(root / "NVIDIA_H100" / "20260103-000000", "cuda:0", "2026-01-03T00:00:00+00:00", ("e2",))
    assert notebook.find_results(["a1"], root=root) == new
    _fake(root / "NVIDIA_H200", "cuda:0", "2026-01-04T00:00:00+00:00", ("e2", "a1"), partial=True)
    assert notebook.find_results(["a1"], root=root) == new
    assert notebook.find_results(root=new) == new   # a results folder itself


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
