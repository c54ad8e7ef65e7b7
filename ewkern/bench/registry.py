"""The experiments, in the order ``--all`` runs them: one module each.

An experiment module defines NAME, TITLE, DESCRIPTION (one line), PAPER, and
  run(ctx, xr)                   measure (ctx: runner.Context, xr: runner.ExperimentRun)
  figures(results, exp) -> [(name, matplotlib Figure)]   plots from a results dict
  summary(results, exp) -> str   a markdown section from a results dict
and optionally
  CPU = False, CPU_SKIP = "why"  the experiment needs a GPU
  GPU = False, GPU_SKIP = "why"  the experiment is for CPUs only (none so far)
  NEEDS_REFERENCE = False        it draws no bandwidth plot (no reference copy needed)
  ARGS = [(flags, argparse kwargs), ...]   its own command-line options
  check(ctx)                     raise timing.BenchError for sizes that cannot fit, before any run
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["MODULES", "Spec", "get", "names", "specs"]

MODULES = ("e1_peak", "e2_copy_size", "e3_elementwise", "e4_cache_busting", "e5_grid",
           "e6_vector", "e7_one_sm", "e8_sass", "e9_busted", "v1_f16x8", "r1_rmse", "a1_add",
           "peers", "rmse_grid", "overhead", "c1_compile", "t1_train", "f1_fused")


@dataclass
class Spec:
    name: str
    title: str
    description: str
    paper: str
    module: object
    cpu_ok: bool
    cpu_skip: str
    gpu_ok: bool
    gpu_skip: str
    needs_reference: bool
    args: list

    def runs_on(self, device: str) -> str | None:
        """None if the experiment runs on device, otherwise why it is skipped."""
        if device == "cpu" and not self.cpu_ok:
            return self.cpu_skip or "needs a CUDA device"
        if device != "cpu" and not self.gpu_ok:
            return self.gpu_skip or "CPU only"
        return None

    @property
    def run(self):
        return self.module.run

    @property
    def check(self):
        return getattr(self.module, "check", None)

    def figures(self, results, exp):
        f = getattr(self.module, "figures", None)
        return f(results, exp) if f else []

    def summary(self, results, exp):
        f = getattr(self.module, "summary", None)
        return f(results, exp) if f else ""


_SPECS: dict | None = None


def specs() -> dict:
    global _SPECS
    if _SPECS is None:
        out = {}
        for modname in MODULES:
            m = importlib.import_module(f"{__package__}.{modname}")
            out[m.NAME] = Spec(name=m.NAME, title=m.TITLE, description=m.DESCRIPTION,
                               paper=getattr(m, "PAPER", ""), module=m,
                               cpu_ok=getattr(m, "CPU", True), cpu_skip=getattr(m, "CPU_SKIP", ""),
                               gpu_ok=getattr(m, "GPU", True), gpu_skip=getattr(m, "GPU_SKIP", ""),
                               needs_reference=getattr(m, "NEEDS_REFERENCE", True),
                               args=list(getattr(m, "ARGS", [])))
        _SPECS = out
    return _SPECS


def names() -> list[str]:
    return list(specs())


def get(name: str) -> Spec:
    key = name.strip().lower()
    s = specs()
    if key not in s:
        raise KeyError(name)
    return s[key]
