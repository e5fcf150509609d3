"""Fit the few free efficiency parameters of a cluster preset to the FIT rows of the calibration file.

    python benchmarks/fit_calibration.py [--runs PATH] [--cluster dgx-a100]

What is fitted, and why: the step time of a dense transformer run is mostly
matmuls (their achievable fraction of the matrix peak) and memory-bound ops
(their achievable fraction of HBM bandwidth). Both curves follow one
physical law, a fixed per-kernel overhead t0 (launch, prologue, last wave)
beside a rate,

    time = t0 + size / (plateau * peak)   =>   efficiency(size) = plateau * size / (size + t0 * plateau * peak)

so they stay monotone in size and below their plateau <= 1, and carry over
to other sizes and, with the device's own peaks, to other hardware. Three
numbers are fitted: the matmul plateau, the memory plateau and the shared
t0. The collective curves and dp_overlap are left as they are: the fit rows
cannot tell them apart from the compute terms (every TP message here is
~1e8 bytes, on the flat part of the NVLink curve; DP reductions are few).

Rows: the FIT rows of `calibrate.split_rows` (alternate rows of each paper,
in file order); the HELD-OUT rows are only reported. The objective is the
sum of squared log errors of the step time (scipy least_squares, trf, from
a fixed start: deterministic). The curves are sampled at half-decades into
the points the preset stores, rounded as printed, and the errors printed
are computed from those rounded points: exactly what the preset gives.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate import DEFAULT_RUNS, Predictor, load_file, preset_for, runs_of, split_rows  # noqa: E402

from cost_models import Cluster, load_cluster  # noqa: E402
from cost_models.curves import EfficiencyCurve, overhead_law  # noqa: E402

MATMUL_SIZES = tuple(float(f"{10.0 ** (k / 2):.3g}") for k in range(14, 27))  # 1e7 .. 1e13 FLOPs, as stored
MEMORY_SIZES = tuple(float(f"{10.0 ** (k / 2):.3g}") for k in range(10, 21))  # 1e5 .. 1e10 bytes
NAMES = ("matmul plateau", "memory plateau", "kernel overhead t0 (s)")
START = np.array([0.85, 0.90, math.log10(5e-6)])
LOWER = np.array([0.30, 0.30, math.log10(1e-6)])
UPPER = np.array([1.00, 1.00, math.log10(3e-5)])


def sampled(sizes: tuple[float, ...], peak: float, plateau: float, t0: float, digits: int = 3) -> EfficiencyCurve:
    """The overhead law (`cost_models.curves.overhead_law`) at fixed `sizes`, rounded as the TOML stores it
    (never below 0.001)."""
    pts = tuple((s, max(10.0**-digits, round(overhead_law(s, peak, plateau, t0), digits))) for s in sizes)
    return EfficiencyCurve(points=pts)


def curves(x: np.ndarray, cluster: Cluster) -> tuple[EfficiencyCurve, EfficiencyCurve]:
    """(matmul, memory) curves of parameters x = (matmul plateau, memory plateau, log10 t0)."""
    e_max, m_max, t0 = float(x[0]), float(x[1]), 10.0 ** float(x[2])
    peak = max(v for _, v in cluster.device.peak_flops_per_s)
    dense = dict(cluster.device.peak_flops_per_s).get("bf16", peak)
    return (sampled(MATMUL_SIZES, dense, e_max, t0),
            sampled(MEMORY_SIZES, cluster.device.hbm_bytes_per_s, m_max, t0))


def with_params(cluster: Cluster, x: np.ndarray) -> Cluster:
    matmul, memory = curves(x, cluster)
    return dataclasses.replace(cluster, matmul_efficiency=matmul, memory_efficiency=memory)


def _size(s: float) -> str:
    mantissa, exponent = f"{s:.3g}".split("e") if "e" in f"{s:.3g}" else (f"{s:.3g}", "0")
    return f"{mantissa}e{int(exponent)}"


def toml_lines(cluster: Cluster, x: np.ndarray, per_line: int = 6) -> list[str]:
    """The `matmul = ...` and `memory = ...` lines of the preset's efficiency table."""
    lines = []
    for key, curve in zip(("matmul", "memory"), curves(x, cluster)):
        pts = [f"[{_size(s)}, {e:.3f}]" for s, e in curve.points]
        rows = [", ".join(pts[i:i + per_line]) for i in range(0, len(pts), per_line)]
        pad = " " * (len(key) + 4)
        lines.append(f"{key} = [" + (",\n" + pad).join(rows) + "]")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="the calibration file (published_runs.json)")
    ap.add_argument("--cluster", default="dgx-a100", help="the preset whose rows are fitted")
    args = ap.parse_args(argv)
    if not args.runs.is_file():
        print(f"no calibration file at {args.runs}; pass --runs PATH", file=sys.stderr)
        return 2
    start = time.perf_counter()
    data = load_file(args.runs)
    base = load_cluster(args.cluster)
    runs = [r for r in runs_of(data) if preset_for(r.hw) == args.cluster]
    groups = split_rows(runs_of(data))
    fit = [r for r in runs if groups[r.id] == "fit"]
    held = [r for r in runs if groups[r.id] == "held-out"]
    if not fit:
        print(f"no fit rows run on {args.cluster}", file=sys.stderr)
        return 2
    predictor = Predictor()

    def errors(x: np.ndarray, rows) -> np.ndarray:
        hw = with_params(base, x)
        preds = [predictor.predict(r, hw, groups[r.id]) for r in rows]
        return np.array([math.log(p.predicted_s / p.measured_s) for p in preds])

    calls = [0]

    def residuals(x: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return errors(x, fit)

    sol = least_squares(residuals, START, bounds=(LOWER, UPPER), method="trf", diff_step=1e-3, xtol=1e-6,
                        ftol=1e-8, max_nfev=200)
    x = sol.x
    print(f"fitted on {len(fit)} rows ({', '.join(r.id for r in fit)}) in {calls[0]} evaluations, "
          f"{time.perf_counter() - start:.0f} s")
    for name, value in zip(NAMES, x):
        print(f"  {name:<24} {10.0**value if 't0' in name else value:.4g}")
    hw = with_params(base, x)
    for label, rows in (("fit", fit), ("held-out", held)):
        errs = []
        for r in rows:
            p = predictor.predict(r, hw, groups[r.id])
            errs.append(abs(p.error))
            print(f"  {label:<9} {r.id:<26} measured {p.measured_s:8.3f} s  predicted {p.predicted_s:8.3f} s  "
                  f"{100 * p.error:+6.1f}%")
        if errs:
            print(f"  {label} mean |error| {100 * sum(errs) / len(errs):.2f}%, max {100 * max(errs):.2f}%")
    print(f"\n# [efficiency] of {args.cluster}:")
    for line in toml_lines(base, x):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
