"""What the default stack's dispatcher does to a default-stack estimate of the published MoE layouts.

    python benchmarks/bench_default_dispatcher.py

Every shipped MoE run of the megatron-core stack (a publisher's regression aside) is estimated with its own settings
twice more, once with NCCL's all-to-all dispatcher and once with the flex one (DeepEP, HybridEP), whatever it ran:
the estimate a user gets for that layout from a megatron-core stack whose only MoE choice is the dispatcher. Prints
each run's error both ways (predicted / measured step time - 1) and the mean, median and max |error| of each, beside
the runs as they ran. Takes about three minutes (benchmarks/CALIBRATION.md: the default stack's dispatcher).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibration import read_runs  # noqa: E402
from planner.calibration.predict import Predictor  # noqa: E402
from planner.costing.execution import load_execution  # noqa: E402
from planner.costing.stack_choices import DISPATCHERS  # noqa: E402


def errors(predictor: Predictor, run) -> dict[str, float]:
    """The run's step-time error with each dispatcher (`DISPATCHERS`) in place of its own."""
    return {d: predictor.predict(dataclasses.replace(run, execution=dataclasses.replace(
        run.execution, moe_dispatcher=d))).error for d in DISPATCHERS}


def summary(values: list[float]) -> str:
    a = [abs(v) for v in values]
    return (f"mean {100 * statistics.mean(a):5.2f} %  median {100 * statistics.median(a):5.2f} %  "
            f"max {100 * max(a):5.1f} %")


def main() -> int:
    predictor = Predictor()
    runs = [r for r in read_runs() if r.category == "moe_training" and r.execution.origin == "megatron-core"
            and not r.known_regression]
    print(f"{len(runs)} MoE runs of the megatron-core stack; the stack's default dispatcher: "
          f"{load_execution('megatron-core').moe_dispatcher}")
    print(f"{'run':58s} {'ran':8s} {'alltoall':>9s} {'flex':>8s}")
    table = []
    for run in runs:
        e = errors(predictor, run)
        table.append((run, e))
        print(f"{run.id[:58]:58s} {run.execution.moe_dispatcher:8s} {100 * e['alltoall']:+8.1f}% "
              f"{100 * e['deepep']:+7.1f}%", flush=True)
    for name, pick in (("all-to-all", lambda r, e: e["alltoall"]), ("flex", lambda r, e: e["deepep"]),
                       ("as run", lambda r, e: e[r.execution.moe_dispatcher])):
        print(f"{name:10s} {summary([pick(r, e) for r, e in table])}")
    never = [(r, e) for r, e in table if r.never_fitted]
    for name, key in (("all-to-all", "alltoall"), ("flex", "deepep")):
        print(f"never fitted ({len(never)}), {name}: {summary([e[key] for _, e in never])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
