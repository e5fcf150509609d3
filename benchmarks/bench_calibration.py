"""The calibration table: per hardware and category, how many shipped runs, how many fitted, held-out error.

    python benchmarks/bench_calibration.py            # the table as Markdown (the README's)
    python benchmarks/bench_calibration.py --runs     # and every run's measured and predicted step time

Then the peak memory of the runs that measured one (the allocator's reserved peak), per stack.

Fitted runs are those each preset lists under `fitted_on` (benchmarks/fit_presets.py picks them by a rule
that does not look at errors); only held-out runs say how right the model is. Takes about a minute.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.api import calibrate  # noqa: E402
from planner.calibration.predict import summarise  # noqa: E402


def table(result) -> list[str]:
    groups = defaultdict(list)
    for p in result.predictions:
        groups[(p.cluster, p.run.category)].append(p)
    lines = ["| hardware | category | runs | fitted on | held-out mean | held-out max | worst held-out run |",
             "|---|---|---:|---:|---:|---:|---|"]
    for (hw, cat), preds in sorted(groups.items()):
        held = [p for p in preds if p.group == "held-out"]
        fitted = sum(p.fitted for p in preds)
        if held:
            s = summarise(held)
            worst = max(held, key=lambda p: abs(p.error))
            cells = f"{100 * s.mean:.1f}% | {100 * s.max:.1f}% | {worst.run.id} ({100 * worst.error:+.1f}%)"
        else:
            cells = "- | - | -"
        lines.append(f"| {hw} | {cat.replace('_training', '')} | {len(preds)} | {fitted} | {cells} |")
    return lines


def blind(result) -> list[str]:
    """The runs no fit may use (`Run.never_fitted`), each with its measured and estimated step, and their mean and
    largest |error| under them; [] without one."""
    runs = [p for p in result.predictions if p.run.never_fitted]
    if not runs:
        return []
    lines = ["| never-fitted run | hardware | measured | estimated | error |", "|---|---|---:|---:|---:|"]
    lines += [f"| {p.run.id} | {p.cluster} | {p.measured_s:.2f} s | {p.predicted_s:.2f} s | {100 * p.error:+.1f}% |"
              for p in runs]
    s = summarise(runs)
    return lines + ["", f"Never fitted on, {len(runs)} runs: mean |error| {100 * s.mean:.2f} %, max "
                        f"{100 * s.max:.1f} %."]


def unscored(predictions, noun: str = "run") -> str:
    """The sentence under a table on the `predictions` neither fitted nor held out (their publisher says a bug
    slowed them), each a `noun`, grouped by what the publisher said; "" without one."""
    said: dict[str, list] = {}
    for p in predictions:
        if p.group == "regression":
            said.setdefault(p.run.known_regression, []).append(p)
    if not said:
        return ""
    n = sum(len(group) for group in said.values())
    parts = [f"\"{text}\": " + "; ".join(f"{p.run.id} ({100 * p.error:+.1f}%)" for p in group)
             for text, group in said.items()]
    return f"Not scored, {n} {noun}{'' if n == 1 else 's'} its publisher says a bug slowed ({' / '.join(parts)})."


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--runs", action="store_true", help="also print every run")
    opts = args.parse_args(argv)
    t0 = time.perf_counter()
    result = calibrate()
    print("\n".join(table(result)))
    if said := unscored(result.predictions):
        print(f"\n{said}")
    if never := blind(result):
        print("\n" + "\n".join(never))
    if opts.runs:
        print()
        for p in result.predictions:
            print(f"{p.run.id:52s} {p.cluster:17s} {p.group:10s} "
                  f"{p.measured_s:9.3f} s  {p.predicted_s:9.3f} s  {100 * p.error:+6.1f}%")
    for s in result.memory_summary():
        print(f"peak memory (reserved), {s['stack']}, {s['group']}: {s['rows']} runs, mean {100 * s['mean_abs_error']:.1f}%"
              f", max {100 * s['max_abs_error']:.1f}% (allocator reserve {100 * s['allocator_reserve']:.1f}%)")
    unfit = [p.run.id for p in result.predictions if not p.estimate.fits]
    print(f"\n{len(result.predictions)} runs in {time.perf_counter() - t0:.0f} s; "
          f"predicted not to fit although they ran: {', '.join(unfit) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
