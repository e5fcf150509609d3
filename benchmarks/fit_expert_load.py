"""Fit the expert-load spread of a learned router on forced-balance against dropless runs, and test it.

    python benchmarks/fit_expert_load.py          # fit on 16k and 64k tokens, test on 32k and 128k

The Megatron MoE ModelZoo ran Qwen3-235B-A22B on 256 H100s at four sequence
lengths (TP4, CP = seq / 16k, PP8 VPP4, EP8, DeepEP, BF16, global batch 256),
each twice: with the router forced to balance and with its own (dropless)
routing, and printed TFLOP/s per GPU for both (best_practice/qwen3/readme.md
at e865051, copied into tests/data/more_runs.json, rows
mz-qwen3-235b-256xh100-bf16-{16k-cp1,32k-cp2,64k-cp4,128k-cp8}, each a shipped
calibration run). Their ratio is what the learned
router's imbalance costs: 1.245 at 16k down to 1.090 at 128k, as attention
takes over the step. One number, the coefficient of variation of an expert's
load (`Execution.moe_expert_load_cv`, `cost_models.expert_load`), is fitted
on the 16k and 64k pairs (least squares of the log ratios); the 32k and 128k
pairs are held out. Prints the fit and each pair; takes about a minute.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calibration import read_runs  # noqa: E402
from planner.calibration.predict import Predictor  # noqa: E402

PREFIX = "mz-qwen3-235b-256xh100-bf16-"  # the ModelZoo Qwen3-235B H100 rows; the long-context ones print two figures
FIT_ON = (16384, 65536)


def long_context_rows() -> dict[int, dict]:
    """The long-context table's published rows by sequence length: those printing forced-balance and dropless
    TFLOP/s per GPU."""
    rows = json.loads((ROOT / "tests" / "data" / "more_runs.json").read_text(encoding="utf-8"))["runs"]
    return dict(sorted((int(r["seq"]), r) for r in rows
                       if r["id"].startswith(PREFIX) and isinstance(r["measured"].get("tflops_per_gpu"), dict)))


def measured_pairs() -> dict[int, tuple[float, float]]:
    """Per sequence length, (forced-balance, dropless) TFLOP/s per GPU as the ModelZoo table prints them."""
    return {seq: (float(r["measured"]["tflops_per_gpu"]["forced_balance"]),
                  float(r["measured"]["tflops_per_gpu"]["dropless"])) for seq, r in long_context_rows().items()}


def shipped_runs() -> dict:
    """Per sequence length, the calibration run that reads that row (its forced-balance step)."""
    runs = {r.id: r for r in read_runs()}
    return {seq: runs[row["id"]] for seq, row in long_context_rows().items()}


def step_s(predictor: Predictor, run, routing: str, cv: float = 0.0) -> float:
    """The run's step time under `routing` (a learned router with load spread `cv`)."""
    ex = dataclasses.replace(run.execution, moe_routing=routing, moe_expert_load_cv=cv)
    return predictor.estimate(dataclasses.replace(run, execution=ex), predictor.cluster(run), 1).step_time_s


def predicted_ratio(predictor: Predictor, run, cv: float) -> float:
    """Step time with a learned router of load spread `cv` over the step with a forced-balance one."""
    return step_s(predictor, run, "learned", cv) / step_s(predictor, run, "uniform")


def fit_cv(predictor: Predictor, runs: dict, pairs: dict, seqs=FIT_ON) -> float:
    """The spread whose predicted ratios best match the measured ones at `seqs` (log least squares)."""
    from scipy.optimize import minimize_scalar

    forced = {s: step_s(predictor, runs[s], "uniform") for s in seqs}

    def loss(cv: float) -> float:
        return sum(math.log(step_s(predictor, runs[s], "learned", cv) / forced[s] * pairs[s][1] / pairs[s][0]) ** 2
                   for s in seqs)

    return round(float(minimize_scalar(loss, bounds=(0.0, 4.0), method="bounded",
                                       options={"xatol": 2e-3}).x), 2)


def main() -> int:
    t0 = time.perf_counter()
    pairs = measured_pairs()
    runs = shipped_runs()
    predictor = Predictor()
    cv = fit_cv(predictor, runs, pairs)
    print(f"expert-load coefficient of variation fitted on {', '.join(f'{s // 1024}k' for s in FIT_ON)}: {cv:g}")
    print("| tokens | forced / dropless TFLOP/s | measured ratio | predicted | error | |")
    print("|---:|---:|---:|---:|---:|---|")
    for seq, (forced, dropless) in pairs.items():
        measured = forced / dropless
        ratio = predicted_ratio(predictor, runs[seq], cv)
        print(f"| {seq // 1024}k | {forced:g} / {dropless:g} | {measured:.3f} | {ratio:.3f} | "
              f"{100 * (ratio / measured - 1):+.1f}% | {'fitted' if seq in FIT_ON else 'held out'} |")
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
