"""Execute the notebooks with nbclient, in place (what gets committed) or into another folder.

    .venv/bin/python notebooks/execute.py                 # all four, "results" mode (every GPU under
                                                          # results/, side by side), outputs saved in place
    .venv/bin/python notebooks/execute.py --mode run      # measure here instead (quick sizes)
    .venv/bin/python notebooks/execute.py batched_rmse    # one notebook (name or path)

The kernel is this interpreter (sys.executable) running ipykernel, whatever kernelspecs are
installed, so the venv's ewkern, numpy and matplotlib are the ones used. The notebooks find
ewkern from the checkout themselves (they add the repository root to sys.path).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = ["elementwise_ops_on_gpus", "cuda_vectorization_f16x8", "batched_rmse", "add_kernel_experiments",
             "training_and_user_kernels"]


def _kernel_manager_class():
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager

    class ThisPythonKernel(KernelManager):
        """ipykernel on sys.executable, not whatever 'python3' resolves to among the kernelspecs."""

        @property
        def kernel_spec(self):
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                              display_name="Python 3 (ipykernel)", language="python")

    return ThisPythonKernel


def execute(path, *, mode="results", env=None, timeout=1800, write_to=None):
    """Run one notebook top to bottom; raises nbclient's CellExecutionError on a failing cell.

    env: environment variables for the kernel on top of this process's (a None value removes
    one). write_to: a path to save the executed notebook (None: not saved). Returns the notebook.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    kernel_env = {**os.environ, "EWKERN_NOTEBOOK_MODE": mode, **(env or {})}
    kernel_env = {k: v for k, v in kernel_env.items() if v is not None}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            record_timing=False, kernel_manager_class=_kernel_manager_class(),
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=kernel_env)
    if write_to is not None:
        nbformat.write(nb, write_to)
    return nb


def resolve(name) -> Path:
    p = Path(name)
    if p.suffix != ".ipynb":
        p = HERE / f"{p.name}.ipynb"
    if not p.exists():
        raise SystemExit(f"no notebook {name!r} (have: {', '.join(NOTEBOOKS)})")
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Execute ewkern's notebooks with nbclient and save the outputs.")
    ap.add_argument("notebooks", nargs="*", help=f"names or paths (default: {', '.join(NOTEBOOKS)})")
    ap.add_argument("--mode", choices=["results", "run"], default="results",
                    help="results: show each GPU's folder under results/ (default); run: measure here")
    ap.add_argument("--full", action="store_true", help="run mode: the full sizes (EWKERN_NOTEBOOK_QUICK=0)")
    ap.add_argument("--out-dir", type=Path, help="save the executed notebooks here instead of in place")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    args = ap.parse_args(argv)
    env = {"EWKERN_NOTEBOOK_QUICK": "0"} if args.full else {}
    code = 0
    for name in args.notebooks or NOTEBOOKS:
        path = resolve(name)
        dest = (args.out_dir / path.name) if args.out_dir else path
        if args.out_dir:
            args.out_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            execute(path, mode=args.mode, env=env, timeout=args.timeout, write_to=dest)
        except Exception as exc:   # report and go on with the others
            print(f"{path.name}: FAILED: {type(exc).__name__}: {str(exc)[-2000:]}", file=sys.stderr)
            code = 1
            continue
        print(f"{path.name}: {time.perf_counter() - t0:.1f} s, {dest.stat().st_size / 1024:.0f} KiB -> {dest}")
    return code


if __name__ == "__main__":
    sys.exit(main())
