"""ewkern.bench: the benchmark harness that reproduces the four papers' experiments.

Run it:            python -m ewkern.bench list | python -m ewkern.bench --all --quick
Load a run:        res = ewkern.bench.load("bench-out/20250101-120000")
Plot it:           ewkern.bench.plots.figures(res, "e2")  ->  [(name, Figure)]
Check the claims:  ewkern.bench.claims.evaluate(res)      ->  [{claim, status, evidence, ...}]
Run from Python:   ewkern.bench.main(["e2", "--quick", "--device", "cpu", "--out", "out"])

Nothing here imports the compiled extension until a measurement is made, so loading, plotting
and evaluating committed results works without a build.
"""

from . import claims, plots, summary
from .cli import main
from .registry import names as experiments
from .results import load, measurements

__all__ = ["main", "load", "measurements", "experiments", "claims", "plots", "summary"]
